#!/usr/bin/env python3
"""numpy_factorization: click prediction by matrix factorization, its embeddings on Tessera tables.

Users and items are int64 ids (spread over the whole id space, as hashed ids are); each has
an embedding row in a table on the shards ("users", "items"), made on first touch. The data
is synthetic and the same on every worker (the job's model.seed): a hidden low-rank model
gives each (user, item) pair a click probability, and clicks are drawn from it, so the best
AUC any model can reach is known (printed as best_auc). Worker T of W trains on its own
slice of the examples: per step it pulls the rows of its batch's users and items, computes
the logistic loss's gradients of the dot product in numpy, and pushes them; the shards
update only those rows with the tables' row optimizer (Adagrad here). The job's mode (sync,
async, ssp) decides how workers combine, as for ps-worker.

Start the shards of a job, then one process per worker:

    build/server/ps-server -c deploy/local/cluster.cfg --shard 0 &
    build/server/ps-server -c deploy/local/cluster.cfg --shard 1 &
    python3 examples/python/numpy_factorization.py -c deploy/local/cluster.cfg --task 0 &
    python3 examples/python/numpy_factorization.py -c deploy/local/cluster.cfg --task 1

Each worker ends with a line like ps-worker's:

    done: task=0 steps=1500 examples=384000 loss=0.55 auc=0.80 best_auc=0.84 rows=1500 ...

(loss: log loss on held-out examples; auc: their AUC with the shards' final rows, once every
worker finished; rows: the rows the tables hold over all shards.) The shards must not hold
another model: use fresh ones.
"""
from __future__ import annotations

import argparse
import logging
import sys
import time

import numpy as np

import tessera


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """The area under the ROC curve (the rank statistic; ties count half)."""
    order = np.argsort(scores, kind="mergesort")
    s, y = scores[order], labels[order]
    ranks = np.empty(len(s))
    i = 0
    while i < len(s):  # average ranks over ties
        j = i
        while j + 1 < len(s) and s[j + 1] == s[i]:
            j += 1
        ranks[i:j + 1] = (i + j) / 2 + 1
        i = j + 1
    pos = y.sum()
    neg = len(y) - pos
    return float((ranks[y == 1].sum() - pos * (pos + 1) / 2) / (pos * neg))


def make_data(seed: int, users: int, items: int, rank: int, examples: int):
    """Ids, the hidden model's click probabilities, and clicks drawn from them."""
    rng = np.random.default_rng(seed)
    u_true = rng.standard_normal((users, rank)) / np.sqrt(rank)
    v_true = rng.standard_normal((items, rank)) / np.sqrt(rank)
    u = rng.integers(0, users, examples)
    v = rng.integers(0, items, examples)
    logit = 5.0 * np.einsum("ij,ij->i", u_true[u], v_true[v])
    p = 1.0 / (1.0 + np.exp(-logit))
    y = (rng.random(examples) < p).astype(np.float32)
    # ids as a recommender has them: large, sparse, some negative
    uid = (u.astype(np.int64) * 1_000_003 - 500_000_000_000).astype(np.int64)
    iid = (v.astype(np.int64) * 7_919_137 + 12_345).astype(np.int64)
    return uid, iid, y, p


def wait_for_workers(c: tessera.Client, workers: int, timeout: float) -> bool:
    """Whether every one of the job's workers finished within timeout seconds, as shard 0
    sees them (polled): said it is done ("stopped"), or went silent past the job's heartbeat
    timeout ("dead")."""
    deadline = time.monotonic() + timeout
    while True:
        if sum(w.state != "alive" for w in c.status(0).workers) >= workers:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-c", "--config", required=True, help="the job file")
    ap.add_argument("--task", type=int, default=None, help="this worker's index")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a key of the job file (as ps-worker's --set)")
    ap.add_argument("--users", type=int, default=1000, help="users (1000)")
    ap.add_argument("--items", type=int, default=500, help="items (500)")
    ap.add_argument("--dim", type=int, default=8, help="embedding width (8)")
    ap.add_argument("--examples", type=int, default=200000, help="training examples (200000)")
    ap.add_argument("--steps", type=int, default=0,
                    help="steps (default: the job's train.max_steps, else 1500)")
    ap.add_argument("--batch", type=int, default=256, help="examples per worker step (256)")
    ap.add_argument("--lr", type=float, default=0.3, help="Adagrad's learning rate (0.3)")
    ap.add_argument("--timeout", type=float, default=60.0, help="request deadline (s)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(levelname)s: %(message)s")

    try:
        client = tessera.Client(args.config, task=args.task, overrides=args.set,
                                timeout=args.timeout)
    except tessera.TesseraError as e:
        print(f"numpy_factorization: {e}", file=sys.stderr)
        return 78 if isinstance(e, tessera.ConfigError) else 1
    with client as c:
        job = c.job
        task, workers = c.task, max(1, job.num_workers)
        test_n = 20000
        uid, iid, y, p = make_data(job.seed, args.users, args.items, 8,
                                   args.examples + test_n)
        tr = slice(0, args.examples)
        te = slice(args.examples, args.examples + test_n)
        mine = np.arange(args.examples)[task::workers]
        steps = args.steps or job.max_steps or 1500
        table = tessera.Table(args.dim, init="normal", init_scale=0.1, optimizer="adagrad",
                              learning_rate=args.lr)
        c.declare({}, tables={"users": table, "items": table})
        rng = np.random.default_rng(job.seed + 1 + task)
        B = args.batch
        t0 = time.monotonic()
        for k in range(steps):
            idx = mine[rng.integers(0, len(mine), B)]
            u, v, yb = uid[tr][idx], iid[tr][idx], y[tr][idx]
            ue = c.pull_rows("users", u)
            ve = c.pull_rows("items", v)
            logit = np.einsum("ij,ij->i", ue, ve)
            # d(log loss)/d(logit) of each example, summed (not averaged) over the batch, as
            # recommenders do for embeddings: a row's step then does not shrink with the
            # batch it shares (sync averages the workers' sums: one worker with W B equals
            # W workers with B).
            g = 1.0 / (1.0 + np.exp(-logit)) - yb
            c.push_rows("users", u, (g[:, None] * ve).astype(np.float32))
            c.push_rows("items", v, (g[:, None] * ue).astype(np.float32))
            if k % 100 == 0:
                c.set_progress(k, float(np.mean(np.logaddexp(0, logit) - yb * logit)))
        elapsed = time.monotonic() - t0
        c.set_progress(steps, 0.0, done=True)
        c.heartbeat()
        # Held-out evaluation with the shards' final rows: once every worker said it is done
        # (in async mode a worker that finished first would otherwise score rows the others
        # are still updating).
        if not wait_for_workers(c, workers, args.timeout):
            print(f"numpy_factorization: not every worker finished within {args.timeout} s; "
                  "scoring the rows as they are", file=sys.stderr)
        ue = c.pull_rows("users", uid[te], min_version=0)
        ve = c.pull_rows("items", iid[te], min_version=0)
        logit = np.einsum("ij,ij->i", ue, ve).astype(np.float64)
        loss = float(np.mean(np.logaddexp(0, logit) - y[te] * logit))
        rows = sum(t["rows"] for st in c.status() for t in st.tables)
        print(f"done: task={task} steps={steps} examples={steps * B} loss={loss:.4f} "
              f"auc={auc(logit, y[te]):.4f} best_auc={auc(p[te], y[te]):.4f} rows={rows} "
              f"examples_per_sec={steps * B / elapsed:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
