#!/usr/bin/env python3
"""numpy_linear: a least-squares fit in plain numpy, data-parallel over Tessera shards.

Every worker makes the same synthetic problem (X: examples x dim, y = X w* + noise, from
the job's model.seed), takes its own slice of the examples (worker T of W: rows T, T+W,
...), and per step computes the gradient of the mean of (Xw + b - y)^2 over a batch of
its slice, pushes it and pulls the parameters of the next step in one round trip. The
shards apply the job's optimizer; the job's mode (sync, async, ssp) decides how the
workers' gradients combine, exactly as for ps-worker.

Start the shards of a job, then one process per worker:

    build/server/ps-server -c deploy/local/cluster.cfg --shard 0 &
    build/server/ps-server -c deploy/local/cluster.cfg --shard 1 &
    python3 examples/python/numpy_linear.py -c deploy/local/cluster.cfg --task 0 &
    python3 examples/python/numpy_linear.py -c deploy/local/cluster.cfg --task 1

Each worker ends with a line like ps-worker's:

    done: task=0 steps=2000 examples=128000 loss=0.0007 w_error=0.0250 examples_per_sec=...

(2000 steps unless --steps or the job's train.max_steps say otherwise; loss: the mean
squared error over the worker's whole slice with the final parameters, the noise's being
0.0001; w_error: the largest difference from the true weights.) The shards must not hold another
model: use fresh ones (the demo's MLP job would refuse the redeclaration).
"""
from __future__ import annotations

import argparse
import logging
import sys
import time

import numpy as np

import tessera


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-c", "--config", required=True, help="the job file")
    ap.add_argument("--task", type=int, default=None, help="this worker's index")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a key of the job file (as ps-worker's --set)")
    ap.add_argument("--dim", type=int, default=16, help="features (default 16)")
    ap.add_argument("--examples", type=int, default=8192, help="examples in all (8192)")
    ap.add_argument("--steps", type=int, default=0,
                    help="steps (default: the job's train.max_steps, else 2000)")
    ap.add_argument("--timeout", type=float, default=60.0, help="request deadline (s)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(levelname)s: %(message)s")

    try:
        client = tessera.Client(args.config, task=args.task, overrides=args.set,
                                timeout=args.timeout)
    except tessera.TesseraError as e:
        print(f"numpy_linear: {e}", file=sys.stderr)
        return 78 if isinstance(e, tessera.ConfigError) else 1
    with client as c:
        job = c.job
        task, workers = c.task, max(1, job.num_workers)
        # The problem: the same on every worker (the job's seed), each worker its own rows.
        rng = np.random.default_rng(job.seed)
        X = rng.standard_normal((args.examples, args.dim)).astype(np.float32)
        w_true = rng.standard_normal(args.dim).astype(np.float32)
        y = (X @ w_true + np.float32(0.5) + 0.01 * rng.standard_normal(args.examples)
             ).astype(np.float32)
        Xs, ys = X[task::workers], y[task::workers]
        B = min(job.batch_size, len(ys))
        per_epoch = max(1, len(ys) // B)
        steps = args.steps or job.max_steps or 2000

        params = c.declare({"linear/w": tessera.Tensor((args.dim,), "zeros"),
                            "linear/b": tessera.Tensor((1,), "zeros")})
        grads = c.zeros()
        w, b = params["linear/w"], params["linear/b"]
        c.pull(params)
        t0 = time.monotonic()
        loss = 0.0
        for k in range(steps):
            i = (k % per_epoch) * B
            xb, yb = Xs[i:i + B], ys[i:i + B]
            err = xb @ w + b[0] - yb
            loss = float(np.mean(err * err))
            np.matmul(xb.T, err, out=grads["linear/w"])
            grads["linear/w"] *= np.float32(2.0 / len(yb))
            grads["linear/b"][0] = 2.0 * float(np.mean(err))
            # Push this step's gradients, pull the next step's parameters (sync: after the
            # barrier averaged every worker's).
            c.push_pull(grads, params)
            if k % 50 == 0:
                c.set_progress(k + 1, loss, (k + 1) * B / max(1e-9, time.monotonic() - t0),
                               (k + 1) / steps)
        took = max(1e-9, time.monotonic() - t0)
        c.set_progress(steps, loss, steps * B / took, 1.0, done=True)
        err = Xs @ w + b[0] - ys
        loss = float(np.mean(err * err))
        w_error = float(np.max(np.abs(w - w_true)))
        print(f"done: task={task} steps={steps} examples={steps * B} loss={loss:.4f} "
              f"w_error={w_error:.4f} examples_per_sec={steps * B / took:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
