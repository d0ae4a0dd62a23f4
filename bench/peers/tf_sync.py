#!/usr/bin/env python3
"""TensorFlow 1's synchronous parameter-server training on the job of bench/train.sh, the
peer of Tessera's sync mode (the book chapter's SyncReplicasOptimizer): the MLP given by
--layers, Adam 0.002, batch 64 per worker, 2 ps tasks + 2 worker tasks, each its own
process on 127.0.0.1 (gRPC), variables placed by replica_device_setter (round-robin over
the ps tasks), tf.compat.v1.train.SyncReplicasOptimizer(replicas_to_aggregate = total =
workers), a MonitoredTrainingSession per worker, the input from tf.data on each worker.

Examples/s is over the cluster's training window (never a sum of each worker's own rate):
after --warmup global steps, the examples of both workers' steps that ended inside the
window where both were stepping, over that window (bench/lib.sh window_eps takes Tessera's
window wider: earliest start to latest end).

Prints one line like bench/train.sh:
  what=tf_sync model=... mode=sync steps=S examples_per_sec=X rss_kib=[ps0:.. ps1:.. w0:.. w1:..] load=L

Every task process stops by itself: a ps task when DIR/stop appears or after --deadline
seconds; a worker after its last step, or when DIR/stop appears (the launcher writes it 5 s
after the first worker left: the other may be waiting for its partner's gradients), keeping
what it measured; neither closes its session (that would wait for such gradients too).

usage: $(python/venv.sh)/bin/python bench/peers/tf_sync.py --layers 784,128,10 --steps 600
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


def write(path, text):
    with open(path, "w") as f:
        f.write(text)


def ps_main(args, spec):
    """A ps task: a gRPC server until DIR/stop appears or the deadline passes."""
    stop = os.path.join(args.dir, "stop")

    def watchdog():
        end = time.time() + args.deadline
        while not os.path.exists(stop) and time.time() < end:
            time.sleep(0.2)
        write(os.path.join(args.dir, "ps%d.rss" % args.index), str(peak_rss_kib()))
        os._exit(0)

    threading.Thread(target=watchdog, daemon=True).start()
    import tensorflow as tf
    server = tf.distribute.Server(tf.train.ClusterSpec(spec), job_name="ps",
                                  task_index=args.index, protocol="grpc", start=True)
    server.join()


def worker_main(args, spec):
    """A worker task: the TF1 graph with SyncReplicasOptimizer, trained to --steps global
    steps; writes DIR/wI.json with its window and peak RSS."""
    import numpy as np
    import tensorflow as tf
    tf1 = tf.compat.v1
    tf1.disable_eager_execution()
    layers = [int(v) for v in args.layers.split(",")]
    cluster = tf.train.ClusterSpec(spec)
    server = tf.distribute.Server(cluster, job_name="worker", task_index=args.index,
                                  protocol="grpc", start=True)
    chief = args.index == 0
    raw_x, raw_y, dim = load_idx(args.examples)
    xs = np.frombuffer(raw_x, dtype=np.uint8).reshape(-1, dim)
    ys = np.frombuffer(raw_y, dtype=np.uint8).astype(np.int32)
    workers = len(spec["worker"])
    with tf1.device(tf1.train.replica_device_setter(
            worker_device="/job:worker/task:%d" % args.index, cluster=cluster)):
        ds = tf.data.Dataset.from_tensor_slices((xs, ys)).shuffle(10000, seed=42 + args.index)
        ds = ds.repeat().map(lambda x, y: (tf.cast(x, tf.float32) / 255.0, y))
        ds = ds.batch(args.batch, drop_remainder=True).prefetch(2)
        x, y = tf1.data.make_one_shot_iterator(ds).get_next()
        rng = np.random.default_rng(42)
        h = x
        for i, (a, b) in enumerate(zip(layers[:-1], layers[1:])):
            lim = np.sqrt(6.0 / (a + b))
            w = tf1.Variable(rng.uniform(-lim, lim, (a, b)).astype(np.float32), name="w%d" % i)
            bias = tf1.Variable(np.zeros(b, np.float32), name="b%d" % i)
            h = tf.matmul(h, w) + bias
            if i + 2 < len(layers):
                h = tf.nn.relu(h)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=h))
        global_step = tf1.train.get_or_create_global_step()
        opt = tf1.train.SyncReplicasOptimizer(tf1.train.AdamOptimizer(0.002),
                                              replicas_to_aggregate=workers,
                                              total_num_replicas=workers)
        train_op = opt.minimize(loss, global_step=global_step)
    state = {"times": []}
    done = threading.Lock()

    def leave():
        with done:
            state["rss"] = peak_rss_kib()
            write(os.path.join(args.dir, "w%d.json" % args.index), json.dumps(state))
            os._exit(0)

    def watchdog():
        # A worker whose partner has left waits in its next step for gradients that will
        # not come: the launcher then writes DIR/stop, and what was measured is kept.
        while not os.path.exists(os.path.join(args.dir, "stop")):
            time.sleep(0.1)
        leave()

    threading.Thread(target=watchdog, daemon=True).start()
    hooks = [opt.make_session_run_hook(is_chief=chief)]
    config = tf1.ConfigProto(device_filters=["/job:ps", "/job:worker/task:%d" % args.index],
                             intra_op_parallelism_threads=args.threads,
                             inter_op_parallelism_threads=args.threads)
    if chief:
        creator = tf1.train.ChiefSessionCreator(master=server.target, config=config)
    else:
        # TensorFlow's worker polls every 30 s for the chief to have initialised the
        # variables (SessionManager's recovery_wait_secs); meanwhile the chief would run
        # the job alone. Poll every 0.2 s.
        class Creator(tf1.train.WorkerSessionCreator):
            def _get_session_manager(self):
                from tensorflow.python.training import session_manager as sm
                if not self._session_manager:
                    self._scaffold.finalize()
                    self._session_manager = sm.SessionManager(
                        local_init_op=self._scaffold.local_init_op,
                        local_init_feed_dict=self._scaffold.local_init_feed_dict,
                        ready_op=self._scaffold.ready_op,
                        ready_for_local_init_op=self._scaffold.ready_for_local_init_op,
                        graph=tf1.get_default_graph(), recovery_wait_secs=0.2)
                return self._session_manager
        creator = Creator(master=server.target, config=config)
    sess = tf1.train.MonitoredSession(session_creator=creator, hooks=hooks)
    while True:
        _, step = sess.run([train_op, global_step])
        if step > args.warmup:
            state["times"].append(time.time())
        if step >= args.steps + args.warmup:
            break
    leave()


def launcher_main(args):
    d = tempfile.mkdtemp(prefix="tessera-tfsync-")
    spec = {"ps": ["127.0.0.1:%d" % free_port() for _ in range(args.ps)],
            "worker": ["127.0.0.1:%d" % free_port() for _ in range(args.workers)]}
    procs, workers = [], []
    try:
        for role in ("ps", "worker"):
            for i in range(len(spec[role])):
                p = subprocess.Popen(
                    [sys.executable, __file__, "--role", role, "--index", str(i), "--dir", d,
                     "--cluster", json.dumps(spec)] + args.passthrough,
                    stdout=subprocess.DEVNULL,
                    stderr=open(os.path.join(d, "%s%d.log" % (role, i)), "w"))
                procs.append(p)
                if role == "worker":
                    workers.append(p)
        # The first worker to finish ends the measurement; the other may be waiting in a
        # step its partner will not join: it is told to leave (DIR/stop) after 5 s.
        end = time.time() + args.deadline
        while all(p.poll() is None for p in workers):
            if time.time() > end:
                raise subprocess.TimeoutExpired("workers", args.deadline)
            time.sleep(0.1)
        for p in workers:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        write(os.path.join(d, "stop"), "")
        for p in workers:
            p.wait(timeout=30)
        results = [json.load(open(os.path.join(d, "w%d.json" % i))) for i in range(args.workers)]
    except (OSError, ValueError, subprocess.TimeoutExpired) as e:
        for i in range(args.workers):
            sys.stderr.write(open(os.path.join(d, "worker%d.log" % i)).read()[-2000:])
        print("what=tf_sync model=%s mode=sync steps=%d examples_per_sec=FAILED (%s)"
              % (args.layers, args.steps, e), flush=True)
        results = None
    finally:
        write(os.path.join(d, "stop"), "")
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
    if results is not None:
        # Both workers' steps inside the window where both were training.
        lo = max(r["times"][0] for r in results)
        hi = min(r["times"][-1] for r in results)
        steps = sum(1 for r in results for t in r["times"] if lo < t <= hi)
        eps = steps * args.batch / (hi - lo)
        rss = []
        for i in range(args.ps):
            try:
                rss.append("ps%d:%s" % (i, open(os.path.join(d, "ps%d.rss" % i)).read()))
            except OSError:
                rss.append("ps%d:?" % i)
        rss += ["w%d:%d" % (i, r["rss"]) for i, r in enumerate(results)]
        model_name = {"784,128,10": "small", "784,2048,2048,10": "large"}.get(args.layers, args.layers)
        print("what=tf_sync model=%s mode=sync steps=%d examples_per_sec=%.1f rss_kib=[%s] "
              "load=%.2f" % (model_name, args.steps, eps, " ".join(rss), os.getloadavg()[0]),
              flush=True)
    subprocess.run(["rm", "-rf", d])
    return 0 if results is not None else 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", default="784,128,10")
    ap.add_argument("--steps", type=int, default=300, help="global steps measured")
    ap.add_argument("--warmup", type=int, default=20, help="global steps left out first")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--ps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="TensorFlow threads per worker")
    ap.add_argument("--examples", type=int, default=20000)
    ap.add_argument("--deadline", type=float, default=600)
    ap.add_argument("--role", default="launcher")
    ap.add_argument("--index", type=int, default=0)
    ap.add_argument("--dir", default="")
    ap.add_argument("--cluster", default="")
    args = ap.parse_args()
    if args.role == "launcher":
        args.passthrough = ["--layers", args.layers, "--steps", str(args.steps),
                            "--warmup", str(args.warmup), "--batch", str(args.batch),
                            "--threads", str(args.threads), "--examples", str(args.examples),
                            "--deadline", str(args.deadline)]
        sys.exit(launcher_main(args))
    spec = json.loads(args.cluster)
    if args.role == "ps":
        ps_main(args, spec)
    else:
        worker_main(args, spec)


if __name__ == "__main__":
    main()
