#!/usr/bin/env python3
"""Summary of bench/sparse_compare.sh's JSON lines (bench/RESULTS.md section 17).

usage: bench/sparse_summary.py FILE.jsonl

Per grid row (dim, batch, zipf, servers+workers) and system: the median (min-max) over the
rounds of rows/s and GB/s, Tessera's median over each ps-lite variant's (the issue's target:
>= 2 x ps-lite's rows/s), the shards' and the workers' CPU seconds per million rows, the CPUs
they kept busy, and RSS bytes per held row (medians), as Markdown tables; then the loads seen
and memcpy's GB/s.
"""
import json
import statistics
import sys

SYSTEMS = ("tessera", "pslite-stock", "pslite-jemalloc")


def med(v):
    return (statistics.median(v), min(v), max(v)) if v else None


def main():
    rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
    groups = {}
    for r in rows:
        key = (r["dim"], r["batch"], r["zipf"], r["shards"])
        groups.setdefault(key, {}).setdefault(r["system"], []).append(r)
    print("| dim | batch | zipf | S+W | " + " | ".join(f"{s} Mrows/s (GB/s)" for s in SYSTEMS) +
          " | T/stock | T/jemalloc | >= 2x |")
    print("|---" * (4 + len(SYSTEMS) + 3) + "|")
    for key, by in groups.items():
        d, b, s, n = key
        cells, m = [], {}
        for sysname in SYSTEMS:
            ok = [r for r in by.get(sysname, []) if not r.get("failed")]
            failed = len(by.get(sysname, [])) - len(ok)
            rs = med([r["rows_per_s"] / 1e6 for r in ok])
            gb = med([r["gbps"] for r in ok])
            if rs is None:
                cells.append("failed" if failed else "-")
                continue
            m[sysname] = rs[0]
            cells.append(f"{rs[0]:.2f} ({rs[1]:.2f}-{rs[2]:.2f}) ({gb[0]:.2f} GB/s)" +
                         (f" {failed} failed" if failed else ""))
        rat = [m["tessera"] / m[o] if "tessera" in m and m.get(o) else None
               for o in ("pslite-stock", "pslite-jemalloc")]
        verdict = "yes" if all(x is not None and x >= 2 for x in rat) else "no"
        print(f"| {d} | {b} | {s:.1f} | {n}+{n} | " + " | ".join(cells) + " | " +
              " | ".join("-" if x is None else f"{x:.2f}" for x in rat) + f" | {verdict} |")
    print()
    print("| dim | batch | zipf | S+W | " +
          " | ".join(f"{s} shard CPU s/M rows (user/sys)" for s in SYSTEMS) + " | " +
          " | ".join(f"{s} client CPU s/M rows" for s in SYSTEMS) + " | " +
          " | ".join(f"{s} cores" for s in SYSTEMS) + " | " +
          " | ".join(f"{s} RSS B/row" for s in SYSTEMS) + " | raw B/row | rows held |")
    print("|---" * (4 + 4 * len(SYSTEMS) + 2) + "|")
    for key, by in groups.items():
        d, b, s, n = key
        cpu, client, cores, rss = [], [], [], []
        for sysname in SYSTEMS:
            ok = [r for r in by.get(sysname, []) if not r.get("failed")]
            c = med([r["shard_cpu_s_per_mrows"] for r in ok])
            u = med([r["shard_user_s_per_mrows"] for r in ok])
            y = med([r["shard_sys_s_per_mrows"] for r in ok])
            cpu.append(f"{c[0]:.3f} ({u[0]:.3f}/{y[0]:.3f})" if c else "-")
            # the workers' CPU (ps-lite's peer reports it since 2026-12-04)
            withc = [r for r in ok if r.get("client_cpu_s_per_mrows") is not None]
            cl = med([r["client_cpu_s_per_mrows"] for r in withc])
            client.append(f"{cl[0]:.3f}" if cl else "-")
            # CPUs busy in the timed window: (shards' + workers' CPU per row) x rows/s
            busy = med([(r["shard_cpu_s_per_mrows"] + r["client_cpu_s_per_mrows"]) *
                        r["rows_per_s"] / 1e6 for r in withc])
            cores.append(f"{busy[0]:.2f}" if busy else "-")
            x = med([r["rss_bytes_per_row"] for r in ok if r.get("rss_bytes_per_row") is not None])
            rss.append(f"{x[0]:.0f}" if x else "-")
        held = med([r["rows_held"] for r in by.get("tessera", []) if not r.get("failed")])
        heldcell = f"{held[0]:.0f}" if held else "-"
        print(f"| {d} | {b} | {s:.1f} | {n}+{n} | " + " | ".join(cpu + client + cores + rss) +
              f" | {d * 4} | {heldcell} |")
    loads = sorted({r["load_before"] for r in rows})
    mc = med([r["memcpy_gbps"] for r in rows if r.get("memcpy_gbps")])
    print()
    print(f"load before each round: {', '.join(f'{x:.2f}' for x in loads)}; "
          f"load after the runs: median {statistics.median([r['loadavg'] for r in rows if 'loadavg' in r]):.2f}")
    if mc:
        print(f"memcpy (256 MiB buffers, every run): median {mc[0]:.2f} GB/s ({mc[1]:.2f}-{mc[2]:.2f})")


if __name__ == "__main__":
    main()
