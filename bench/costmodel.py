#!/usr/bin/env python3
"""Step-time cost model of a Tessera job (bench/RESULTS.md section 13). Plain python3.

Parameters come from bench/costmodel.sh (JSON lines) of the first PARAMS/SCALING pair; every
pair's measurements (bench/scaling.sh's step times, psbench's 4/40/400 MiB rows) are check
points, each with the cores probed beside it. Then a prediction for 1,000 workers on
100 Gb/s links. With --plot, gnuplot draws measured against model and the prediction.

Notation: N workers, S shards, M gradient bytes per worker per step (= parameter bytes),
L link bytes/s per direction (full duplex), c compute per step, P partition bytes. The plan is
Tessera's (proto/ts_plan.c): tensors cut into partitions of at most P bytes, largest first to
the least loaded shard; a worker sends each shard one push+pull message of its partitions.
A message of x bytes each way costs a + b(x) 2x CPU seconds, on the shard (a_s, b_s) and on
the worker's client thread (a_c, b_c); b(x) has one value up to BIG bytes, another above
(the caches stop holding the buffers). Per step:

  D_client = sum over shards of a_c + b_c 2x_s      the worker's client thread
  D_shard  = N (a_s + b_s 2x + beta)                 the busiest shard's event loop (x = its bytes)
  D_wlink  = M / L, D_slink = N x / L                a worker's and that shard's link, per direction
  stages   = the CPU of the client and of the shard, and the link time 2m/L, of the largest
             partition m
  T_cluster = c + l0 + max(D_client, D_shard, D_wlink, D_slink) + sum(stages) - max(stages)

(the stages pipeline over the partitions of a step: the busiest resource sets the pace and one
partition's trip through the others is paid once; one partition pays the sum). On one host the
"link" is the kernel's copy, whose CPU is already in b_c and b_s (system time): no link terms,
and all the N + S processes share the host's HOST_CORES cores with the other engineers' load:

  T_host = max(T_cluster, CPU per step / C_got),  C_got = HOST_CORES n / (n + bg), n = N + S

where bg = HOST_CORES (HOST_CORES / C_probe - 1) is the other load in threads, from the cores
C_probe a spin of HOST_CORES threads got beside the runs (the scheduler's fair share), and the
CPU per step is N u_w + U_s measured in real runs of the scaling job (polling included), or for
psbench N (D_client + sum of the shards' messages). beta is the sync barrier's extra shard CPU
per worker-step; l0 the 4 KiB round trip not spent in CPU.

usage: costmodel.py PARAMS.jsonl SCALING.txt [PARAMS2.jsonl SCALING2.txt ...] [--plot PNG] [--data-dir DIR]
"""
import json
import os
import statistics
import subprocess
import sys

MiB = 1 << 20
HOST_CORES = 2   # this machine's vCPUs (nproc), the cores of the one-host case
BIG = 8 * MiB    # messages above this cost more per byte (RESULTS section 13: 0.19 -> 0.33 s/GB)


def plan(tensor_bytes, shards, partition_bytes):
    """Bytes and partitions per shard, and the largest partition, as proto/ts_plan.c."""
    parts = []
    max_elems = max(1, partition_bytes // 4)
    for t, nbytes in enumerate(tensor_bytes):
        elems = nbytes // 4
        n = -(-elems // max_elems)
        base, extra = divmod(elems, n)
        parts += [((base + (1 if p < extra else 0)) * 4, t, p) for p in range(n)]
    parts.sort(key=lambda x: (-x[0], x[1], x[2]))
    load, count = [0] * shards, [0] * shards
    for nbytes, _, _ in parts:
        s = min(range(shards), key=lambda i: (load[i], i))
        load[s] += nbytes
        count[s] += 1
    return load, count, parts[0][0]


def b_of(p, role, msg):
    """CPU seconds per byte of a message of `msg` bytes pushed (and as many pulled): one
    figure for messages up to BIG (the caches hold them), another above."""
    return p["b_" + role] if msg <= BIG else p["B_" + role]


def msg_cpu(p, role, msg):
    """CPU seconds of one push+pull message of `msg` bytes each way, role "c" or "s"."""
    return p["a_" + role] + b_of(p, role, msg) * 2 * msg


def step_time(p, n, s, tensors, partition_bytes, c, link=None, cores=None, sync=True,
              host_cpu=None):
    """Predicted step time (s) and its terms. link=None: one host of `cores` cores, where
    host_cpu(n), when given, is the measured CPU seconds all processes need per step."""
    load, count, m = plan(tensors, s, partition_bytes)
    M = sum(tensors)
    ms = max(load)
    beta = p["beta"] if sync else 0.0
    d_client = sum(msg_cpu(p, "c", x) for x in load if x)
    shard_msgs = [msg_cpu(p, "s", x) + beta for x in load if x]
    d_shard = n * max(shard_msgs)
    # one partition (the largest) of a request to the busiest shard, through every stage
    stages = [p["a_c"] + b_of(p, "c", ms) * 2 * m, p["a_s"] + b_of(p, "s", ms) * 2 * m + beta]
    res = {"client": d_client, "shard": d_shard}
    if link:
        res["worker_link"] = M / link
        res["shard_link"] = n * ms / link
        stages.append(2 * ms / link)
    top = max(res, key=res.get)
    t = c + p["l0"] + res[top] + sum(stages) - max(stages)
    terms = dict(res, compute=c, path=t, bottleneck=top)
    if link is None:
        # One host shared with other engineers' processes: `cores` is what a spin of
        # HOST_CORES threads got (the probe), so the others weigh like
        # bg = HOST_CORES (HOST_CORES / cores - 1) such threads; n threads of ours then get
        # HOST_CORES n / (n + bg) cores (the scheduler's fair share). The path is not slowed:
        # a thread that wakes after a sleep runs at once (CFS's credit to sleepers).
        bg = HOST_CORES * (HOST_CORES / cores - 1)
        threads = n + s
        got = min(HOST_CORES, HOST_CORES * threads / (threads + bg))
        if host_cpu is None:
            cpu = n * (c + d_client + sum(shard_msgs))
        else:
            cpu = host_cpu(n)
        terms.update(host_cpu=cpu / got, cores_got=got, path=t)
        if cpu / got > t:
            t, terms["bottleneck"] = cpu / got, "host_cpu"
    return t, terms


def wfit(rows):
    """y = a x1 + b x2, least squares on relative error; rows: (x1, x2, y)."""
    s11 = s12 = s22 = r1 = r2 = 0.0
    for x1, x2, y in rows:
        w = 1.0 / (y * y)
        s11 += w * x1 * x1
        s12 += w * x1 * x2
        s22 += w * x2 * x2
        r1 += w * x1 * y
        r2 += w * x2 * y
    det = s11 * s22 - s12 * s12
    return (r1 * s22 - r2 * s12) / det, (r2 * s11 - r1 * s12) / det


def load_params(path):
    rows, segment = [], 0
    for l in open(path):
        if l.startswith("# bench/costmodel.sh"):
            segment += 1
            share_only = 'parts="share"' in l
        elif l.strip() and not l.startswith("#"):
            r = json.loads(l)
            r["segment"], r["share_only"] = segment, share_only
            rows.append(r)
    rows = [r for r in rows if not r.get("error")]
    psb = [r for r in rows if r["kind"] == "psbench"]
    asy = [r for r in psb if r["mode"] == "async"]
    syn = [r for r in psb if r["mode"] == "sync"]
    if not asy:
        sys.exit("costmodel.py: %s has no async psbench rows" % path)
    p = {}
    # Per worker-iteration CPU (all shards together; all of one worker's client) against the
    # messages (one per shard) and the bytes pushed plus pulled.
    def cpu_rows(rs, key):
        return [(r["shards"], 2.0 * r["size"], r[key] * 2.0 * r["size"] / 1e9) for r in rs
                if r.get(key)]
    for role, key in (("s", "cpu_s_per_gb"), ("c", "client_cpu_s_per_gb")):
        small = [x for x in cpu_rows(asy, key) if x[1] / 2 / x[0] <= BIG]
        big = [x for x in cpu_rows(asy, key) if x[1] / 2 / x[0] > BIG]
        if len(small) < 2:
            sys.exit("costmodel.py: %s needs async psbench rows of two sizes up to %d bytes per shard"
                     % (path, BIG))
        a, b = wfit(small)
        p["a_" + role], p["b_" + role] = a, b
        # above BIG: the same per-message cost, its own per-byte cost (relative least squares)
        p["B_" + role] = (sum((y - x1 * a) * x2 / y ** 2 for x1, x2, y in big) /
                          sum(x2 * x2 / y ** 2 for x1, x2, y in big)) if big else b
    extra = [(y - msg_cpu(p, "s", x2 / 2 / x1) * x1) / x1 for x1, x2, y in cpu_rows(syn, "cpu_s_per_gb")]
    p["beta"] = max(0.0, statistics.median(extra)) if extra else 0.0
    p["link_lo"] = statistics.median(r["iperf3_gbps"] for r in asy if r.get("iperf3_gbps")) * 1e9
    small = [r for r in asy if r["workers"] == 1 and r["shards"] == 1 and r["size"] <= 4096]
    if small:
        r = small[0]
        cpu = msg_cpu(p, "s", r["size"]) + msg_cpu(p, "c", r["size"])
        p["l0"] = max(0.0, r["p50_us"] * 1e-6 - cpu)
    else:
        p["l0"] = 0.0
    tl = [r for r in rows if r["kind"] == "train_local" and r.get("examples_per_sec")]
    one = [r for r in tl if r.get("openblas_threads") == 1]
    p["compute"] = statistics.median(r["batch"] / r["examples_per_sec"] for r in one or tl) if tl else 0.0
    p["compute_all"] = [r["batch"] / r["examples_per_sec"] for r in tl]
    # The cores the job got: probes of the full runs (psbench, the real runs) and the
    # share-only invocations that bracket bench/scaling.sh.
    p["shares"] = [r["cores"] for r in rows if r["kind"] == "share" and not r["share_only"]]
    p["shares_scaling"] = [r["cores"] for r in rows if r["kind"] == "share" and r["share_only"]]
    p["cores"] = statistics.median(p["shares"]) if p["shares"] else 2.0
    p["cores_scaling"] = statistics.median(p["shares_scaling"]) if p["shares_scaling"] else p["cores"]
    # Real runs: CPU per step over the extra steps of each short/long pair, all processes
    # (total) and the workers; then CPU per step = N u_w + U_s fitted over N.
    runs, pend = {}, {}
    for r in (r for r in rows if r["kind"] == "run"):
        n, a = r["workers"], pend.pop(r["workers"], None)
        if a is None or r["steps"] <= a["steps"]:
            pend[n] = r
            continue
        d = r["steps"] - a["steps"]
        runs.setdefault(n, []).append(((r["total_cpu_s"] - a["total_cpu_s"]) / d,
                                       (r["worker_cpu_s"] - a["worker_cpu_s"]) / d,
                                       (r["wall_s"] - a["wall_s"]) / d))
    p["runs"] = {n: tuple(statistics.median(x[i] for x in v) for i in range(3))
                 for n, v in runs.items()}
    if len(p["runs"]) >= 2:
        ns = sorted(p["runs"])
        mean_n = statistics.mean(ns)
        mean_y = statistics.mean(p["runs"][n][0] for n in ns)
        p["u_w"] = (sum((n - mean_n) * (p["runs"][n][0] - mean_y) for n in ns) /
                    sum((n - mean_n) ** 2 for n in ns))
        p["U_s"] = max(0.0, mean_y - p["u_w"] * mean_n)
    p["psbench"] = asy
    p["psbench_sync"] = syn
    return p


def load_scaling(path):
    """{workers: [(median step ms of a run, load)]} from bench/scaling.sh's run lines."""
    out = {}
    for l in open(path):
        f = l.split()
        if not f or l.startswith("#") or "FAILED" in l:
            continue
        out.setdefault(int(f[0]), []).append((float(f[2]), float(f[6])))
    return out


SCALING_TENSORS = [784 * 32 * 4, 32 * 4, 32 * 10 * 4, 10 * 4]   # [784,32,10]: w1 b1 w2 b2
SCALING_PARTITION = 131072                                        # deploy/local/cluster.cfg
PSBENCH_PARTITION = 4 * MiB
LINK_100G = 100e9 / 8
JOBS = [  # name, parameters, compute s per step (assumed; see RESULTS section 13)
    ("ResNet-50", 25_557_032, 0.180),
    ("VGG-16", 138_357_544, 0.250),
]


def fmt_t(s):
    return "%.3f ms" % (s * 1e3) if s < 1 else "%.3f s" % s


def read_set(params_path, scaling_path):
    try:
        p = load_params(params_path)
        scaling = load_scaling(scaling_path)
    except (OSError, ValueError, KeyError, IndexError, ZeroDivisionError) as e:
        sys.exit("costmodel.py: cannot read %s / %s: %s: %s"
                 % (params_path, scaling_path, type(e).__name__, e))
    if not scaling:
        sys.exit("costmodel.py: %s has no run lines of bench/scaling.sh" % scaling_path)
    return p, scaling


def check_points(p, q, scaling, tag, host_cpu):
    """(label, measured s, measured min, max, predicted s, bottleneck, workers or None) for
    the measurements of set q (its cores) with the parameters p."""
    out = []
    for n in sorted(scaling):
        runs = [x[0] / 1e3 for x in scaling[n]]
        t, terms = step_time(p, n, 2, SCALING_TENSORS, SCALING_PARTITION, p["compute"],
                             cores=q["cores_scaling"], host_cpu=host_cpu)
        out.append(("%s scaling %d workers" % (tag, n), statistics.median(runs), min(runs),
                    max(runs), t, terms["bottleneck"], n))
    for r in sorted(q["psbench"], key=lambda r: (r["workers"], r["size"])):
        if r["size"] < 4 * MiB:
            continue
        per = lambda g: r["workers"] * 2.0 * r["size"] / (g * 1e9)
        t, terms = step_time(p, r["workers"], r["shards"], [r["size"]], PSBENCH_PARTITION, 0.0,
                             cores=q["cores"], sync=False)
        out.append(("%s psbench %d+%d %d MiB" % (tag, r["shards"], r["workers"], r["size"] // MiB),
                    per(r["gbps"]), per(r["gbps_max"]), per(r["gbps_min"]), t, terms["bottleneck"],
                    None))
    return out


def main(argv):
    args, opts, it = [], {}, iter(argv[1:])
    for a in it:
        if a in ("--plot", "--data-dir"):
            opts[a] = next(it, None)
            if opts[a] is None:
                sys.exit("costmodel.py: %s needs a value" % a)
        elif a.startswith("--"):
            sys.exit("costmodel.py: unknown option %s" % a)
        else:
            args.append(a)
    if len(args) < 2 or len(args) % 2:
        sys.exit("usage: " + __doc__.strip().splitlines()[-1].split(": ", 1)[1])
    sets = [read_set(args[i], args[i + 1]) for i in range(0, len(args), 2)]
    p, _ = sets[0]
    out_png = opts.get("--plot")
    ddir = opts.get("--data-dir") or os.path.dirname(os.path.abspath(out_png or args[0]))

    print("# parameters (from %s)" % args[0])
    for role, name in (("s", "shard "), ("c", "client")):
        print("%s a_%s = %.1f us per message; b_%s = %.3f s/GB pushed+pulled up to %d MiB per message, %.3f above"
              % (name, role, p["a_" + role] * 1e6, role, p["b_" + role] * 1e9, BIG // MiB, p["B_" + role] * 1e9))
    print("sync barrier beta = %.1f us shard CPU per worker-step" % (p["beta"] * 1e6))
    print("latency l0 = %.1f us; loopback iperf3 L = %.2f GB/s (reference only on one host)" % (p["l0"] * 1e6, p["link_lo"] / 1e9))
    print("compute c (train_local, [784,32,10], batch 32, 1 OpenBLAS thread) = %.3f ms (every run: %s)"
          % (p["compute"] * 1e3, ", ".join("%.3f" % (x * 1e3) for x in p["compute_all"])))
    for n, (tot, wrk, wall) in sorted(p["runs"].items()):
        print("real run, %d worker(s): CPU per step %.3f ms (workers %.3f, shards %.3f), wall per step %.3f ms"
              % (n, tot * 1e3, wrk * 1e3, (tot - wrk) * 1e3, wall * 1e3))
    host_cpu = None
    if "u_w" in p:
        print("host CPU per step = N u_w + U_s: u_w = %.3f ms, U_s = %.3f ms" % (p["u_w"] * 1e3, p["U_s"] * 1e3))
        host_cpu = lambda n: n * p["u_w"] + p["U_s"]

    checks = []
    for i, ((q, scaling), path) in enumerate(zip(sets, args[::2])):
        tag = "ABCDEFGH"[i % 8]
        print("set %s (%s): cores C (spin probe) %.2f beside psbench (%s), %.2f beside scaling.sh (%s)"
              % (tag, path, q["cores"], ", ".join("%.2f" % x for x in q["shares"]), q["cores_scaling"],
                 ", ".join("%.2f" % x for x in q["shares_scaling"])))
        checks += check_points(p, q, scaling, tag, host_cpu)

    print("\n# check: predicted against measured step time (one host)")
    print("| point | measured (min-max) | model | error | in min-max | bottleneck |")
    print("|---|---|---|---|---|---|")
    errs, inside = [], 0
    for label, meas, lo, hi, t, top, _ in checks:
        e = (t - meas) / meas
        errs.append(abs(e))
        ok = lo * 0.999 <= t <= hi * 1.001
        inside += ok
        print("| %s | %s (%s-%s) | %s | %+.0f %% | %s | %s |"
              % (label, fmt_t(meas), fmt_t(lo), fmt_t(hi), fmt_t(t), e * 100, "yes" if ok else "no", top))
    print("median |error| %.1f %%, max %.1f %% over %d points (target <= 15 %%); %d within 15 %%;"
          " model inside the measured min-max at %d"
          % (statistics.median(errs) * 100, max(errs) * 100, len(errs),
             sum(1 for e in errs if e <= 0.15), inside))
    by = {}
    for label, meas, *_ in checks:
        by.setdefault(label[2:], []).append(meas)
    spread = [max(v) / min(v) - 1 for v in by.values() if len(v) > 1]
    if spread:
        print("the same point measured in two sets differs by %.0f %% at the median, %.0f %% at most"
              % (statistics.median(spread) * 100, max(spread) * 100))

    print("\n# prediction: sync, one process per host, 100 Gb/s links, S = N or N/8 shards, P = M/S")
    print("| job | M | c | workers | shards | step | communication T - c | efficiency c/T | bottleneck |")
    print("|---|---|---|---|---|---|---|---|---|")
    curves = {}
    for name, params, c in JOBS:
        M = params * 4
        for n in [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000]:
            for label, s in (("S=N", n), ("S=N/8", max(1, n // 8))):
                part = max(4096, 4 * -(-M // (4 * s)))   # every shard one partition
                t, terms = step_time(p, n, s, [M], part, c, link=LINK_100G)
                curves.setdefault((name, label), []).append((n, t, c / t))
                if n in (256, 1000):
                    print("| %s | %.0f MB | %s | %d | %d | %s | %s | %.2f | %s |"
                          % (name, M / 1e6, fmt_t(c), n, s, fmt_t(t), fmt_t(t - c), c / t,
                             terms["bottleneck"]))
    if out_png:
        plot(ddir, out_png, checks, curves)
    return 0


def plot(ddir, png, checks, curves):
    os.makedirs(ddir, exist_ok=True)
    tags = sorted({c[0][0] for c in checks})
    for tag in tags:
        with open(os.path.join(ddir, "costmodel-scaling-%s.dat" % tag), "w") as f:
            for label, meas, lo, hi, t, _, n in checks:
                if n is not None and label[0] == tag:
                    f.write("%d %f %f %f %f\n" % (n, meas * 1e3, lo * 1e3, hi * 1e3, t * 1e3))
    with open(os.path.join(ddir, "costmodel-psbench.dat"), "w") as f:
        for label, meas, lo, hi, t, _, n in checks:
            if n is None:
                f.write("\"%s\" %f %f %f %f\n" % (label.replace(" psbench", ""), meas * 1e3, lo * 1e3,
                                                  hi * 1e3, t * 1e3))
    names = []
    for (name, label), pts in sorted(curves.items()):
        fn = "costmodel-%s-%s.dat" % (name, label.replace("/", "_").replace("=", ""))
        with open(os.path.join(ddir, fn), "w") as f:
            for n, t, eff in pts:
                f.write("%d %f %f\n" % (n, t * 1e3, eff))
        names.append((fn, "%s, %s" % (name, label)))
    d = ddir
    scal = ", ".join(
        '"%s/costmodel-scaling-%s.dat" using 1:2:3:4 with yerrorlines pt 7 lw 2 title "measured, set %s '
        '(median, min-max of runs)", "" using 1:5 with linespoints pt 6 dt 2 lw 2 title "model, set %s"'
        % (d, tag, tag, tag) for tag in tags)
    gp = """set terminal png size 1500,520
set output "%s"
set multiplot layout 1,3
set grid
set key at graph 0.03, 0.98 left top Left reverse font ",10"
set logscale xy
set xlabel "worker processes (scaling.sh: sync, 2 shards, one 2-vCPU host)"
set ylabel "step time, ms"
set xtics (1, 2, 4, 8, 16, 32)
plot %s
unset logscale x
set xtics rotate by -45
set xlabel "psbench point (set, shards+workers, tensor)"
set style data histogram
set style histogram errorbars gap 1 lw 1
set style fill solid 0.6
plot "%s/costmodel-psbench.dat" using 2:3:4:xtic(1) title "measured (min-max of runs)", \\
     "" using 5:5:5 title "model"
set style data linespoints
set logscale x
set xtics norotate auto
set xlabel "workers (one per host, 100 Gb/s, sync)"
set ylabel "predicted scaling efficiency c / T"
unset logscale y
set yrange [0:1.45]
set key at graph 0.03, 0.98 left top Left reverse font ",10"
plot %s, "-" using 1:2 with points pt 9 ps 2 title "BytePS README: BERT-large, 256 GPUs, ~0.9"
256 0.9
e
unset multiplot
""" % (png, scal, d, ", ".join('"%s/%s" using 1:3 lw 2 title "%s"' % (d, fn, t) for fn, t in names))
    subprocess.run(["gnuplot"], input=gp.encode(), check=True)
    print("\nwrote %s" % png)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
