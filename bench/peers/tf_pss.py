#!/usr/bin/env python3
"""TensorFlow's ParameterServerStrategy on the job of bench/train.sh (the peer a user would
pick instead of Tessera): the MLP given by --layers, Adam 0.002, batch 64 per worker, 2 ps
tasks + 2 worker tasks, each its own process on 127.0.0.1 (gRPC), plus this process as the
coordinator. TF2's ParameterServerStrategy trains asynchronously only, so it compares with
Tessera's async mode.

Prints one line like bench/train.sh:
  what=tf_pss model=... mode=async steps=S examples_per_sec=X rss_kib=[ps0:.. ps1:.. w0:.. w1:.. coordinator:..]

Every task process stops by itself: it exits when the coordinator writes DIR/stop, or after
--deadline seconds, and writes its peak RSS first.

usage: $(python/venv.sh)/bin/python bench/peers/tf_pss.py --layers 784,128,10 --steps 300
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

from peer_common import free_port, load_idx, peak_rss_kib  # bench/peers/peer_common.py


def task_main(args):
    """A ps or worker task: a gRPC server until DIR/stop appears or the deadline passes."""
    spec = json.loads(args.cluster)
    stop = os.path.join(args.dir, "stop")

    def watchdog():
        end = time.time() + args.deadline
        while not os.path.exists(stop) and time.time() < end:
            time.sleep(0.2)
        with open(os.path.join(args.dir, "%s%d.rss" % (args.role, args.index)), "w") as f:
            f.write(str(peak_rss_kib()))
        os._exit(0)

    threading.Thread(target=watchdog, daemon=True).start()
    import tensorflow as tf
    server = tf.distribute.Server(tf.train.ClusterSpec(spec), job_name=args.role,
                                  task_index=args.index, protocol="grpc", start=True)
    server.join()


def coordinator_main(args):
    layers = [int(v) for v in args.layers.split(",")]
    d = tempfile.mkdtemp(prefix="tessera-tfpss-")
    spec = {"ps": ["127.0.0.1:%d" % free_port() for _ in range(args.ps)],
            "worker": ["127.0.0.1:%d" % free_port() for _ in range(args.workers)]}
    procs = []
    ok = False
    for role in ("ps", "worker"):
        for i in range(len(spec[role])):
            procs.append(subprocess.Popen(
                [sys.executable, __file__, "--role", role, "--index", str(i), "--dir", d,
                 "--cluster", json.dumps(spec), "--deadline", str(args.deadline)],
                stdout=subprocess.DEVNULL, stderr=open(os.path.join(d, "%s%d.log" % (role, i)), "w")))
    try:
        import numpy as np
        import tensorflow as tf
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(spec), rpc_layer="grpc")
        # Variables are placed round-robin over the ps tasks (Keras 3 cannot train sharded
        # variables, so no variable_partitioner): fc1/weights on ps0, fc1/biases on ps1, ...
        strategy = tf.distribute.ParameterServerStrategy(resolver)
        coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)

        raw_x, raw_y, dim = load_idx(args.examples)
        xs = np.frombuffer(raw_x, dtype=np.uint8).reshape(-1, dim)
        ys = np.frombuffer(raw_y, dtype=np.uint8).astype(np.int32)

        def dataset_fn():
            ds = tf.data.Dataset.from_tensor_slices((xs, ys)).shuffle(10000, seed=42).repeat()
            ds = ds.map(lambda x, y: (tf.cast(x, tf.float32) / 255.0, y))
            return ds.batch(args.batch, drop_remainder=True).prefetch(2)

        # The model and Adam written out with tf.Variables (what Keras does; Keras 3's
        # optimizers do not run under ParameterServerStrategy's coordinator here): Adam's
        # slots live beside each variable on its ps task, as with TF1's PS training.
        with strategy.scope():
            rng = np.random.default_rng(42)
            params, slots = [], []
            for a, b in zip(layers[:-1], layers[1:]):
                lim = np.sqrt(6.0 / (a + b))
                for init in (rng.uniform(-lim, lim, (a, b)).astype(np.float32),
                             np.zeros(b, np.float32)):
                    params.append(tf.Variable(init))
                    slots.append((tf.Variable(tf.zeros_like(init)), tf.Variable(tf.zeros_like(init))))
            t_var = tf.Variable(0.0)

        def forward(x):
            h = x
            for i in range(0, len(params), 2):
                h = tf.matmul(h, params[i]) + params[i + 1]
                if i + 2 < len(params):
                    h = tf.nn.relu(h)
            return h

        @tf.function
        def step(it):
            def replica_fn(x, y):
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean(
                        tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=forward(x)))
                grads = tape.gradient(loss, params)
                t = t_var.assign_add(1.0)
                lr = 0.002 * tf.sqrt(1.0 - 0.999 ** t) / (1.0 - 0.9 ** t)
                for p, g, (m, v) in zip(params, grads, slots):
                    m.assign(0.9 * m + 0.1 * g)
                    v.assign(0.999 * v + 0.001 * g * g)
                    p.assign_sub(lr * m / (tf.sqrt(v) + 1e-8))
                return loss
            x, y = next(it)
            return strategy.run(replica_fn, args=(x, y))

        per_worker = coordinator.create_per_worker_dataset(dataset_fn)
        it = iter(per_worker)
        for _ in range(args.warmup):
            coordinator.schedule(step, args=(it,))
        coordinator.join()
        t0 = time.time()
        for _ in range(args.steps):
            coordinator.schedule(step, args=(it,))
        coordinator.join()
        secs = time.time() - t0
        eps = args.steps * args.batch / secs
        ok = True
    finally:
        open(os.path.join(d, "stop"), "w").close()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        if not ok:
            subprocess.run(["rm", "-rf", d])
    rss = []
    for role, short in (("ps", "ps"), ("worker", "w")):
        for i in range(len(spec[role])):
            try:
                rss.append("%s%d:%s" % (short, i, open(os.path.join(d, "%s%d.rss" % (role, i))).read()))
            except OSError:
                rss.append("%s%d:?" % (short, i))
    rss.append("coordinator:%d" % peak_rss_kib())
    model_name = {(784, 128, 10): "small", (784, 2048, 2048, 10): "large"}.get(tuple(layers), args.layers)
    subprocess.run(["rm", "-rf", d])
    print("what=tf_pss model=%s mode=async steps=%d examples_per_sec=%.1f rss_kib=[%s] load=%.2f"
          % (model_name, args.steps, eps, " ".join(rss), os.getloadavg()[0]), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", default="784,128,10")
    ap.add_argument("--steps", type=int, default=300, help="steps in all (over the workers)")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--ps", type=int, default=2)
    ap.add_argument("--examples", type=int, default=20000)
    ap.add_argument("--deadline", type=float, default=600)
    ap.add_argument("--role", default="coordinator")
    ap.add_argument("--index", type=int, default=0)
    ap.add_argument("--dir", default="")
    ap.add_argument("--cluster", default="")
    args = ap.parse_args()
    if args.role == "coordinator":
        coordinator_main(args)
    else:
        task_main(args)


if __name__ == "__main__":
    main()
