#!/usr/bin/env python3
"""keras_steps: examples/python/keras_fashion_mnist.py as a worker, timing where each step
of tessera.keras goes (for bench/keras.sh and bench/RESULTS.md section 10).

Same arguments as the example. At exit it prints to stderr the median over the steps after
the first 20 (tracing and warm-up left out) of:

    steps=N buckets=K fwd_bwd_ms=...  (step start to the first bucket's send: the forward
                                       pass and the backward pass of the last layers)
    overlap_ms=...                    (first bucket's send to the last one's: the backward
                                       pass of the earlier layers, while the first bucket's
                                       push_pull is on the wire and on the shards)
    send_ms=...                       (copying out and submitting every bucket)
    wait_ms=...                       (waiting for the last replies after the backward pass)
    step_ms=...                       (the whole step as the Keras callback sees it)

TESSERA_BUCKET_BYTES=N sets tessera.keras.Optimizer's bucket_bytes (e.g. a huge value:
one bucket, no overlap), to compare.
"""
from __future__ import annotations

import atexit
import importlib.util
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> int:
    import tessera.keras as tk
    import keras

    log: list = []
    submit, collect = tk.Optimizer._submit, tk.Optimizer._collect

    def timed_submit(self, b, *g):
        t = time.perf_counter()
        r = submit(self, b, *g)
        log.append(("s", b, t, time.perf_counter()))
        return r

    def timed_collect(self, *order):
        t = time.perf_counter()
        r = collect(self, *order)
        log.append(("c", 0, t, time.perf_counter()))
        return r

    tk.Optimizer._submit, tk.Optimizer._collect = timed_submit, timed_collect
    bb = os.environ.get("TESSERA_BUCKET_BYTES")
    if bb:
        init = tk.Optimizer.__init__

        def init_with_buckets(self, *a, **kw):
            kw.setdefault("bucket_bytes", int(bb))
            init(self, *a, **kw)
        tk.Optimizer.__init__ = init_with_buckets

    def batch_begin(self, batch, logs=None):
        log.append(("b", 0, time.perf_counter(), 0.0))
    tk.ProgressCallback.on_train_batch_begin = batch_begin

    def report() -> None:
        steps, cur = [], None
        for kind, b, t, e in log:
            if kind == "b":
                cur = {"b": t, "s": []}
            elif cur is not None and kind == "s":
                cur["s"].append((t, e))
            elif cur is not None and kind == "c":
                cur["c"] = (t, e)
                steps.append(cur)
                cur = None
        steps = [s for s in steps[20:] if s["s"]]
        if not steps:
            return

        def med(f) -> float:
            return statistics.median(f(s) for s in steps) * 1e3
        print("steps=%d buckets=%d fwd_bwd_ms=%.2f overlap_ms=%.2f send_ms=%.2f wait_ms=%.2f "
              "step_ms=%.2f" % (
                  len(steps), len(steps[0]["s"]),
                  med(lambda s: s["s"][0][0] - s["b"]),
                  med(lambda s: s["s"][-1][0] - s["s"][0][0]),
                  med(lambda s: sum(e - t for t, e in s["s"])),
                  med(lambda s: s["c"][1] - s["s"][-1][1]),
                  med(lambda s: s["c"][1] - s["b"])), file=sys.stderr, flush=True)
    atexit.register(report)

    path = os.path.join(HERE, "..", "examples", "python", "keras_fashion_mnist.py")
    spec = importlib.util.spec_from_file_location("keras_fashion_mnist", path)
    ex = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ex)
    del keras
    return ex.main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
