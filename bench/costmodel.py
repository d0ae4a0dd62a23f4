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
(the caches stop holding the buffers). A message lives in three phases:

  push   the client's send copy  c_copy = a_c/2 + b_c x       overlapping the shard's
         receive copy             s_copy = a_s/2 + (1-u) b_s x  (the shard reads a push in
         CHUNK pieces as they land)
  apply  on the shard only        s_apply = u b_s 2x (+ beta, sync), u the user-space share of
         the shard's CPU (the NaN/Inf check and the optimizer: psbench's shard_user_s_per_gb,
         else APPLY_SHARE); applied piece by piece (whole partitions, one staging buffer), so
         only the last piece's apply follows the push
  pull   the shard's send copy s_copy overlapping the client's receive copy c_copy

Stages that overlap form a pipeline: pipe = the slowest stage's total + one chunk of each
other stage; a message of one chunk pays the sum. Per step, with the busiest shard (x its
bytes per worker) and the client's copies of all its S messages (C = sum of c_copy):

  push  = pipe(C, N (s_copy + s_apply) - apply of the last piece, M/L, N x/L) + that apply
  pull  = pipe(N s_copy, C, M/L, N x/L)
  T_cluster = c + l0 + push + pull          (async: at least the shard's N messages)

On one host the "link" is the kernel's copy, whose CPU is already in b_c and b_s (system
time): no link terms, and all the N + S processes share the host's HOST_CORES cores with the
other engineers' load, bg = HOST_CORES (HOST_CORES / C_probe - 1) threads of it (C_probe: the
cores a spin of HOST_CORES threads got beside the runs):

  T_host = max(T_cluster, CPU per step / C_got, T_share)
  C_got  = HOST_CORES n / (n + bg), n = N + S
  T_share (N >= 2) = the time the N workers' and the shards' CPU of one step take when every
           runnable thread gets the same share of the cores (egalitarian processor sharing):
           the busiest shard gets no more of the cores than each worker while they compute,
           and works off the rest of its step alone while they wait for it

The CPU per step is N u_w + U_s measured in real runs of the scaling job (polling included),
or for psbench N (D_client + the shards' messages); a worker's own share in T_share is u_1,
the slope of the workers' CPU over N in those runs (or c + its client's CPU). beta is the
sync barrier's extra shard CPU per worker-step; l0 the 4 KiB round trip not spent in CPU.
The scaling job runs Adam on the shards (deploy/local/cluster.cfg): what Adam costs beyond
psbench's SGD (train_local, or ADAM_EXTRA) is added to the apply once per step. Where a
bench/scaling.sh run's figure is its workers' "done:" line (too few progress lines), it
includes the training's start, which costmodel.sh's run pairs measure (train_s) and the
check adds, spread over the run's steps.

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
CHUNK = 256 << 10      # the shard reads, and checks, a push in chunks of this many bytes
STAGE_MIN = 1 << 20    # a push is applied in pieces of whole partitions, a staging buffer each:
                       # the largest partition, at least this (server/ts_push_rx.c)
# The user-space share of the shard's CPU (check + optimizer) when the measurements lack
# psbench's shard_user_s_per_gb: RESULTS section 12.1's perf profile of the shard at 40 and
# 400 MiB, 1+1 and 2+2, after: 1 - "kernel in all" = 29, 28, 27, 28 % (ts_optim_apply +
# ts_optim_all_finite 26-27 %).
APPLY_SHARE = 0.28
# What Adam costs beyond SGD per step and parameter byte, when the measurements lack
# train_local rows with Adam: RESULTS section 13, train_local [784,32,10] (101,800 parameter
# bytes), batch 32, 300 steps: 0.065 ms per step with Adam, 0.054 with SGD (by hand).
ADAM_EXTRA = 0.011e-3 / 101800


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


def user_share(p, msg):
    """The share of the shard's per-byte CPU spent in user space (the NaN/Inf check and the
    optimizer) for a message of `msg` bytes: measured (psbench's shard_user_s_per_gb) or
    APPLY_SHARE."""
    return p["u_small"] if msg <= BIG else p["u_big"]


def pipe(stages):
    """Time of a stream of units (chunks of messages) through `stages`, (total, one unit's
    time) each, that work at once on different units: the slowest stage's total, plus one
    unit's time in each of the others (filling and draining the pipeline). A message of one
    chunk through two stages: the sum."""
    top = max(range(len(stages)), key=lambda i: stages[i][0])
    return stages[top][0] + sum(u for i, (_, u) in enumerate(stages) if i != top), top


def ps_share(demands, cores, bg):
    """Time for threads with these CPU demands (s) to finish on `cores` cores beside `bg`
    threads of other load that never finish, every runnable thread getting an equal share
    (at most one core): the scheduler's fair share (egalitarian processor sharing)."""
    left, t, done = sorted(d for d in demands if d > 0), 0.0, 0.0
    while left:
        rate = min(1.0, cores / (len(left) + bg))
        t += (left[0] - done) / rate
        done = left.pop(0)
    return t


def message(p, x, piece, sync):
    """One worker's push+pull message of x bytes each way to a shard, split into the three
    phases (RESULTS section 13): the push, the client's send copy overlapping the shard's
    receive copy; the apply, on the shard only (the NaN/Inf check and the optimizer: the
    user-space share of the shard's per-byte CPU, plus the sync barrier's beta); the pull, the
    shard's send copy overlapping the client's receive copy. The per-message cost a is split
    evenly between the two copies. `piece`: the bytes of the last piece of the push (whole
    partitions up to a staging buffer), whose apply nothing overlaps."""
    u = user_share(p, x)
    b_s = b_of(p, "s", x)
    beta = p["beta"] if sync else 0.0
    return {"c_copy": p["a_c"] / 2 + b_of(p, "c", x) * x,
            "s_copy": p["a_s"] / 2 + (1 - u) * b_s * x,
            "s_apply": u * b_s * 2 * x + beta,
            "apply_last": u * b_s * 2 * min(x, piece),
            "chunks": max(1, -(-x // CHUNK))}


def step_time(p, n, s, tensors, partition_bytes, c, link=None, cores=None, sync=True,
              host_cpu=None, worker_cpu=None, optim_extra=0.0):
    """Predicted step time (s) and its terms. link=None: one host of `cores` cores, where
    host_cpu(n), when given, is the measured CPU seconds all processes need per step and
    worker_cpu(n) one worker's. optim_extra: CPU seconds per parameter byte and step that
    the job's optimizer costs a shard beyond SGD (psbench's), once per step."""
    load, count, m = plan(tensors, s, partition_bytes)
    M = sum(tensors)
    ms = max(load)
    piece = max(STAGE_MIN, m)
    msgs = [message(p, x, piece, sync) for x in load if x]
    big = message(p, ms, piece, sync)            # to the busiest shard
    c_copy = sum(g["c_copy"] for g in msgs)      # the client's send (or receive) copies, all shards
    shard_msg = 2 * big["s_copy"] + big["s_apply"]
    d_shard = n * shard_msg + optim_extra * ms
    tail = big["apply_last"] + optim_extra * ms   # the update nothing overlaps
    res = {"client": 2 * c_copy, "shard": d_shard}
    if link:
        res["worker_link"] = M / link
        res["shard_link"] = n * ms / link
    # Stages as (total, one chunk's time): the client's copies of every shard's message, the
    # busiest shard, the links (a worker's M bytes, the shard's N x bytes each way).
    k = big["chunks"]
    client = (c_copy, big["c_copy"] / k)
    unit_link = min(ms, CHUNK) / link if link else 0.0
    links = [(M / link, unit_link), (n * ms / link, unit_link)] if link else []
    # The step's pushes all go through the shard (sync: the barrier holds every pull reply
    # until the last push is in; async: a worker's own message), then its replies go out.
    w = n if sync else 1
    one_push = big["s_copy"] + big["s_apply"] - big["apply_last"]
    push, top_push = pipe([client, (one_push + (w - 1) * (big["s_copy"] + big["s_apply"]), one_push / k)]
                          + links)
    pull, top_pull = pipe([client, (w * big["s_copy"], big["s_copy"] / k)] + links)
    names = ["client", "shard", "worker_link", "shard_link"]
    top = "%s, %s" % (names[top_push], names[top_pull])   # the pace of the push, of the pull
    # async: the shard's turns through every worker's messages may be longer than one's trip
    comm = push + tail + pull
    if not sync and d_shard > comm:
        comm, top = d_shard, "shard"
    t = c + p["l0"] + comm
    terms = dict(res, compute=c, path=t, bottleneck=top)
    if link is None:
        # One host shared with other engineers' processes: `cores` is what a spin of
        # HOST_CORES threads got (the probe), so the others weigh like
        # bg = HOST_CORES (HOST_CORES / cores - 1) such threads. (1) n threads of ours get
        # HOST_CORES n / (n + bg) cores. (2) With two or more workers, the workers and the
        # shards with work are runnable at once and the scheduler gives each the same share:
        # while the workers spend their CPU of the step, the busiest shard gets as much of
        # its own; the rest of it (its backlog) it works off when the workers wait for it.
        # The path is not slowed: a thread that wakes after a sleep runs at once.
        bg = HOST_CORES * (HOST_CORES / cores - 1)
        threads = n + s
        got = min(HOST_CORES, HOST_CORES * threads / (threads + bg))
        shard_cpu = [n * (2 * g["s_copy"] + g["s_apply"]) + optim_extra * x
                     for g, x in zip(msgs, [x for x in load if x])]
        if host_cpu is None:
            cpu = n * (c + 2 * c_copy) + sum(shard_cpu)
        else:
            cpu = host_cpu(n)
        own = worker_cpu(n) if worker_cpu else c + 2 * c_copy
        terms.update(host_cpu=cpu / got, cores_got=got, path=t)
        if cpu / got > t:
            t, terms["bottleneck"] = cpu / got, "host_cpu"
        if n > 1:
            share = ps_share([own] * n + shard_cpu, HOST_CORES, bg)
            terms["fair_share"] = share
            if share > t:
                t, terms["bottleneck"] = share, "fair_share"
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
    # The user-space share of the shard's CPU, per regime, from the rows of at least 1 MiB
    # per shard (below, the busy-poll's user time is most of it); else APPLY_SHARE.
    for key, lo, hi in (("u_small", MiB, BIG), ("u_big", BIG + 1, float("inf"))):
        us = [r["shard_user_s_per_gb"] / r["cpu_s_per_gb"] for r in asy
              if r.get("shard_user_s_per_gb") is not None and r.get("cpu_s_per_gb")
              and lo <= r["size"] / r["shards"] <= hi]
        p[key] = statistics.median(us) if us else None
        p[key + "_measured"] = bool(us)
    for key, other in (("u_small", "u_big"), ("u_big", "u_small")):
        if p[key] is None:
            p[key] = p[other] if p[other] is not None else APPLY_SHARE
    extra = [(y - msg_cpu(p, "s", x2 / 2 / x1) * x1) / x1 for x1, x2, y in cpu_rows(syn, "cpu_s_per_gb")]
    p["beta"] = max(0.0, statistics.median(extra)) if extra else 0.0
    p["link_lo"] = statistics.median(r["iperf3_gbps"] for r in asy if r.get("iperf3_gbps")) * 1e9
    small = [r for r in asy if r["workers"] == 1 and r["shards"] == 1 and r["size"] <= 4096]
    if small:
        r = small[0]
        p["l0"] = 0.0
        p["l0"] = max(0.0, r["p50_us"] * 1e-6 - step_time(p, 1, 1, [r["size"]], PSBENCH_PARTITION,
                                                         0.0, link=float("inf"), sync=False)[0])
    else:
        p["l0"] = 0.0
    tl = [r for r in rows if r["kind"] == "train_local" and r.get("examples_per_sec")]
    adam = [r for r in tl if r.get("optimizer") == "adam"]
    tl = [r for r in tl if r.get("optimizer", "sgd") == "sgd"]
    one = [r for r in tl if r.get("openblas_threads") == 1]
    p["compute"] = statistics.median(r["batch"] / r["examples_per_sec"] for r in one or tl) if tl else 0.0
    p["compute_all"] = [r["batch"] / r["examples_per_sec"] for r in tl]
    # Adam beyond SGD, per parameter byte and step: train_local with Adam over as many steps
    # as bench/scaling.sh's runs (Adam's step grows over thousands, RESULTS section 13)
    adam = [r for r in adam if r.get("steps", 0) <= 1000 and r.get("openblas_threads") == 1]
    p["adam_measured"] = bool(adam and tl)
    p["adam_extra"] = (max(0.0, statistics.median(r["batch"] / r["examples_per_sec"] for r in adam)
                           - p["compute"]) / (4 * sum(a * b + b for a, b in zip(adam[0]["layers"], adam[0]["layers"][1:])))
                       if p["adam_measured"] else ADAM_EXTRA)
    # The cores the job got: probes of the full runs (psbench, the real runs) and the
    # share-only invocations that bracket bench/scaling.sh.
    p["shares"] = [r["cores"] for r in rows if r["kind"] == "share" and not r["share_only"]]
    p["shares_scaling"] = [r["cores"] for r in rows if r["kind"] == "share" and r["share_only"]]
    p["cores"] = statistics.median(p["shares"]) if p["shares"] else 2.0
    p["cores_scaling"] = statistics.median(p["shares_scaling"]) if p["shares_scaling"] else p["cores"]
    # Real runs: CPU per step over the extra steps of each short/long pair, all processes
    # (total) and the workers; then CPU per step = N u_w + U_s fitted over N.
    runs, pend, starts = {}, {}, {}
    for r in (r for r in rows if r["kind"] == "run"):
        n, a = r["workers"], pend.pop(r["workers"], None)
        if a is None or r["steps"] <= a["steps"]:
            pend[n] = r
            continue
        d = r["steps"] - a["steps"]
        runs.setdefault(n, []).append(((r["total_cpu_s"] - a["total_cpu_s"]) / d,
                                       (r["worker_cpu_s"] - a["worker_cpu_s"]) / d,
                                       (r["wall_s"] - a["wall_s"]) / d))
        if r.get("train_s") is not None and a.get("train_s") is not None:
            # the workers' training time ("done:" lines) is start-up + steps x step time
            slope = (r["train_s"] - a["train_s"]) / d
            starts.setdefault(n, []).append((a["steps"], a["train_s"] - a["steps"] * slope))
    p["runs"] = {n: tuple(statistics.median(x[i] for x in v) for i in range(3))
                 for n, v in runs.items()}
    p["startup"] = {n: statistics.median(x[1] for x in v) for n, v in starts.items()}
    if len(p["runs"]) >= 2:
        ns = sorted(p["runs"])
        mean_n = statistics.mean(ns)
        mean_y = statistics.mean(p["runs"][n][0] for n in ns)
        p["u_w"] = (sum((n - mean_n) * (p["runs"][n][0] - mean_y) for n in ns) /
                    sum((n - mean_n) ** 2 for n in ns))
        p["U_s"] = max(0.0, mean_y - p["u_w"] * mean_n)
        # one worker's own CPU per step (its process: compute, client, polling), the slope of
        # the workers' CPU over N: what each worker asks of the cores in the fair-share term
        mean_w = statistics.mean(p["runs"][n][1] for n in ns)
        p["u_1"] = (sum((n - mean_n) * (p["runs"][n][1] - mean_w) for n in ns) /
                    sum((n - mean_n) ** 2 for n in ns))
    p["psbench"] = asy
    p["psbench_sync"] = syn
    return p


def load_scaling(path):
    """{workers: [(median step ms of a run, load, the figure is the "done:" line's)]} and the
    steps of a run, from bench/scaling.sh's output. A run whose workers printed fewer than two
    progress lines (short runs: 300 steps of a quarter millisecond) has its done-line figure
    (batch / examples_per_sec) as its step time, which counts the training's start as well."""
    out, steps = {}, None
    for l in open(path):
        f = l.split()
        if l.startswith("# sync,") and "max_steps" in f:
            steps = int(f[f.index("max_steps") + 1].rstrip(","))
        if not f or l.startswith("#") or "FAILED" in l:
            continue
        out.setdefault(int(f[0]), []).append((float(f[2]), float(f[6]), f[2] == f[5]))
    return out, steps


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
        scaling, p["scaling_steps"] = load_scaling(scaling_path)
    except (OSError, ValueError, KeyError, IndexError, ZeroDivisionError) as e:
        sys.exit("costmodel.py: cannot read %s / %s: %s: %s"
                 % (params_path, scaling_path, type(e).__name__, e))
    if not scaling:
        sys.exit("costmodel.py: %s has no run lines of bench/scaling.sh" % scaling_path)
    return p, scaling


def check_points(p, q, scaling, tag, host_cpu, worker_cpu):
    """(label, measured s, measured min, max, predicted s, bottleneck, workers or None) for
    the measurements of set q (its cores) with the parameters p."""
    out = []
    for n in sorted(scaling):
        runs = [x[0] / 1e3 for x in scaling[n]]
        # done-line figures count the start: add it, measured in costmodel.sh's run pairs
        # (the nearest worker count), spread over the run's steps
        done = all(x[2] for x in scaling[n])
        start = (p["startup"][min(p["startup"], key=lambda k: (abs(k - n), k))] / q["scaling_steps"]
                 if done and p["startup"] and q["scaling_steps"] else 0.0)
        t, terms = step_time(p, n, 2, SCALING_TENSORS, SCALING_PARTITION, p["compute"],
                             cores=q["cores_scaling"], host_cpu=host_cpu, worker_cpu=worker_cpu,
                             optim_extra=p["adam_extra"])   # deploy/local/cluster.cfg: Adam
        top = terms["bottleneck"] + (" (+ start-up)" if start else " (done line)" if done else "")
        out.append(("%s scaling %d workers" % (tag, n), statistics.median(runs), min(runs),
                    max(runs), t + start, top, n))
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
    print("shard user-space share (check + optimizer, the apply phase): %.2f up to %d MiB per message (%s), %.2f above (%s)"
          % (p["u_small"], BIG // MiB, "measured" if p["u_small_measured"] else "not measured: RESULTS 12.1's perf share",
             p["u_big"], "measured" if p["u_big_measured"] else "not measured: RESULTS 12.1's perf share"))
    print("Adam beyond SGD on the shards (the scaling job's optimizer): %.3f ms per step per MB of parameters (%s)"
          % (p["adam_extra"] * 1e9, "train_local" if p["adam_measured"] else "not measured: RESULTS 13's train_local by hand"))
    print("sync barrier beta = %.1f us shard CPU per worker-step" % (p["beta"] * 1e6))
    print("latency l0 = %.1f us; loopback iperf3 L = %.2f GB/s (reference only on one host)" % (p["l0"] * 1e6, p["link_lo"] / 1e9))
    print("compute c (train_local, [784,32,10], batch 32, 1 OpenBLAS thread) = %.3f ms (every run: %s)"
          % (p["compute"] * 1e3, ", ".join("%.3f" % (x * 1e3) for x in p["compute_all"])))
    for n, (tot, wrk, wall) in sorted(p["runs"].items()):
        print("real run, %d worker(s): CPU per step %.3f ms (workers %.3f, shards %.3f), wall per step %.3f ms"
              % (n, tot * 1e3, wrk * 1e3, (tot - wrk) * 1e3, wall * 1e3))
    host_cpu = worker_cpu = None
    if "u_w" in p:
        print("host CPU per step = N u_w + U_s: u_w = %.3f ms, U_s = %.3f ms; one worker's own u_1 = %.3f ms"
              % (p["u_w"] * 1e3, p["U_s"] * 1e3, p["u_1"] * 1e3))
        host_cpu = lambda n: n * p["u_w"] + p["U_s"]
        worker_cpu = lambda n: p["u_1"]

    checks = []
    for i, ((q, scaling), path) in enumerate(zip(sets, args[::2])):
        tag = "ABCDEFGH"[i % 8]
        print("set %s (%s): cores C (spin probe) %.2f beside psbench (%s), %.2f beside scaling.sh (%s)"
              % (tag, path, q["cores"], ", ".join("%.2f" % x for x in q["shares"]), q["cores_scaling"],
                 ", ".join("%.2f" % x for x in q["shares_scaling"])))
        checks += check_points(p, q, scaling, tag, host_cpu, worker_cpu)

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
    if p["runs"]:
        # The same job in costmodel.sh's run pairs (SGD, no Adam term): the wall time per
        # step of the extra steps, start-up left out, against the model.
        print("steady state of the scaling job (costmodel.sh's run pairs, SGD, wall per extra step): %s"
              % "; ".join("%d worker(s) %.3f ms, model %.3f ms (%+.0f %%)" % (
                  n, wall * 1e3, t * 1e3, (t - wall) / wall * 100) for n, (_, _, wall) in sorted(p["runs"].items())
                  for t in [step_time(p, n, 2, SCALING_TENSORS, SCALING_PARTITION, p["compute"],
                                      cores=p["cores"], host_cpu=host_cpu, worker_cpu=worker_cpu)[0]]))
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
