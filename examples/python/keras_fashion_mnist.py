#!/usr/bin/env python3
"""keras_fashion_mnist: a Keras CNN trained on Fashion-MNIST through Tessera shards.

A standard Keras 3 (TensorFlow backend) model, compile and fit; only the optimizer is
Tessera's (tessera.keras.Optimizer): the shards hold the parameters and run the job's
optimizer, in the job's mode (sync: averaged, stale gradients dropped; async).

Data order as ps-worker's: one permutation of the training set per epoch from the job's
model.seed (the same on every worker); global step k of an epoch covers the next W x B
examples of it and worker T takes the T-th B of them, so W workers x batch B in sync mode
see exactly what 1 worker x batch W*B sees.

    build/server/ps-server -c deploy/local/keras.cfg --shard 0 &   # and --shard 1
    python3 examples/python/keras_fashion_mnist.py -c deploy/local/keras.cfg --task 0 &
    python3 examples/python/keras_fashion_mnist.py -c deploy/local/keras.cfg --task 1
    # done: task=1 steps=... examples=... loss=... test_accuracy=0.9... examples_per_sec=...

The job file's train.batch_size (per worker), train.epochs, train.max_steps and
model.seed apply; --set KEY=VALUE overrides a key; TF_CONFIG applies as for ps-worker.
Needs TensorFlow (pip install tensorflow-cpu) and Debian's dataset-fashion-mnist.
"""
from __future__ import annotations

import argparse
import gzip
import logging
import os
import sys
import time

import numpy as np

DATA = "/usr/share/datasets/fashion-mnist"


def read_idx(path: str) -> np.ndarray:
    """An IDX file (gzip or not) as a numpy array of its shape (uint8 data only)."""
    op = gzip.open if path.endswith(".gz") else open
    with op(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise ValueError(f"{path}: not an IDX file of unsigned bytes")
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    data = np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        raise ValueError(f"{path}: {data.size} bytes of data for dimensions {dims}")
    return data.reshape(dims)


def load(job) -> tuple:
    def path(key: str, default: str) -> str:
        return getattr(job, key, "") or os.path.join(DATA, default)
    xtr = read_idx(path("train_images", "train-images-idx3-ubyte.gz"))
    ytr = read_idx(path("train_labels", "train-labels-idx1-ubyte.gz"))
    xte = read_idx(path("test_images", "t10k-images-idx3-ubyte.gz"))
    yte = read_idx(path("test_labels", "t10k-labels-idx1-ubyte.gz"))
    return xtr, ytr, xte, yte


def epoch_order(seed: int, epoch: int, n: int) -> np.ndarray:
    """The permutation of epoch `epoch`: the same on every worker (seed and epoch only)."""
    return np.random.default_rng([int(seed) & 0xFFFFFFFF, 0x5EED, int(epoch)]).permutation(n)


def worker_indices(seed: int, epoch: int, n: int, workers: int, task: int, batch: int,
                   steps: int) -> np.ndarray:
    """Worker `task`'s examples of the first `steps` steps of epoch `epoch`, in order."""
    perm = epoch_order(seed, epoch, n)
    group = perm[:steps * workers * batch].reshape(steps, workers, batch)
    return group[:, task, :].reshape(-1)


def build_bn_model(keras):
    """A functional CNN with BatchNormalization (Conv2D, BatchNormalization, ReLU, max
    pooling, twice, then Dense 10): its gammas start at ones and its moving statistics are
    state on the shards."""
    x = inp = keras.Input((28, 28, 1))
    for i, f in enumerate((16, 32), 1):
        x = keras.layers.Conv2D(f, 3, padding="same", use_bias=False, name=f"conv{i}")(x)
        x = keras.layers.BatchNormalization(name=f"bn{i}")(x)
        x = keras.layers.ReLU(name=f"relu{i}")(x)
        x = keras.layers.MaxPooling2D(2, name=f"pool{i}")(x)
    x = keras.layers.Flatten()(x)
    return keras.Model(inp, keras.layers.Dense(10, name="logits")(x), name="fashion_bn_cnn")


def build_model(keras, kind: str = "cnn"):
    if kind == "bn-cnn":
        return build_bn_model(keras)
    return keras.Sequential([
        keras.Input((28, 28, 1)),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu", name="conv1"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Conv2D(64, 3, padding="same", activation="relu", name="conv2"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Flatten(),
        keras.layers.Dense(128, activation="relu", name="fc1"),
        keras.layers.Dense(10, name="logits"),
    ], name="fashion_cnn")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-c", "--config", required=True, help="the job file")
    ap.add_argument("--task", type=int, default=None, help="this worker's index")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a key of the job file (as ps-worker's --set)")
    ap.add_argument("--threads", type=int, default=0,
                    help="TensorFlow intra-op threads (default: TensorFlow's choice)")
    ap.add_argument("--deterministic", action="store_true",
                    help="TensorFlow op determinism (tf.config.experimental."
                         "enable_op_determinism)")
    ap.add_argument("--local", action="store_true",
                    help="no shards: one process, Keras's own Adam with the job's "
                         "optimizer settings, train.batch_size per step (bench baseline)")
    ap.add_argument("--model", choices=("cnn", "bn-cnn"), default="cnn",
                    help="cnn: the Sequential CNN; bn-cnn: a functional CNN with "
                         "BatchNormalization")
    ap.add_argument("--train-examples", type=int, default=0,
                    help="train on the first N examples of the training set (0 = all)")
    ap.add_argument("--evaluate", action="store_true",
                    help="no training: build the model, take the job's parameters and "
                         "state from the shards, print the test accuracy (an evaluator)")
    ap.add_argument("--verbose", type=int, default=0, help="Keras fit verbosity (0, 1, 2)")
    ap.add_argument("--timeout", type=float, default=120.0, help="request deadline (s)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(levelname)s: %(message)s")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    import tessera
    try:
        job = tessera.load_job(args.config, overrides=args.set)
    except tessera.TesseraError as e:
        print(f"keras_fashion_mnist: {e}", file=sys.stderr)
        return 78
    try:
        import tessera.keras as tk
    except ImportError as e:
        print(f"keras_fashion_mnist: {e}", file=sys.stderr)
        return 69
    import tensorflow as tf
    import keras
    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    if args.deterministic:
        keras.utils.set_random_seed(job.seed)
        tf.config.experimental.enable_op_determinism()

    xtr, ytr, xte, yte = load(job)
    if args.train_examples > 0:
        xtr, ytr = xtr[:args.train_examples], ytr[:args.train_examples]
    n = len(ytr)
    if args.local:
        opt = keras.optimizers.Adam(job.learning_rate, beta_1=job.beta1, beta_2=job.beta2,
                                    epsilon=job.epsilon)
        task, W, B = 0, 1, job.batch_size
    else:
        try:
            opt = tk.Optimizer(args.config, task=args.task, overrides=args.set,
                               timeout=args.timeout)
        except tessera.TesseraError as e:
            print(f"keras_fashion_mnist: {e}", file=sys.stderr)
            return 78 if isinstance(e, tessera.ConfigError) else 1
        job = opt.client.job
        task, W, B = opt.client.task, max(1, job.num_workers), job.batch_size
    per_epoch = n // (W * B)
    if per_epoch == 0:
        print(f"keras_fashion_mnist: train.batch_size {B} x {W} workers is more than the {n} "
              f"training examples", file=sys.stderr)
        return 78
    total = per_epoch * job.epochs
    if job.max_steps > 0:
        total = min(total, job.max_steps)

    model = build_model(keras, args.model)
    model.compile(optimizer=opt, jit_compile=False,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    # Standardised pixels (Fashion-MNIST mean 0.2860, std 0.3530 of x/255).
    def prep(a):
        return ((a.astype(np.float32) * np.float32(1.0 / 255.0) - np.float32(0.2860))
                * np.float32(1.0 / 0.3530))[..., None]
    if args.evaluate:
        if args.local:
            print("keras_fashion_mnist: --evaluate needs the job's shards", file=sys.stderr)
            return 2
        opt.build(model.trainable_variables)    # the shards' parameters and state
        _, acc = model.evaluate(prep(xte), yte.astype(np.int32), batch_size=1000, verbose=0)
        print(f"evaluated: test_accuracy={acc:.4f} values={opt.client.values_source!r}",
              flush=True)
        opt.close()
        return 0
    t0 = time.monotonic()
    done, loss, epoch = 0, float("nan"), 0
    callbacks = [] if args.local else [tk.ProgressCallback(opt, B)]
    while done < total:
        steps = min(per_epoch, total - done)
        idx = worker_indices(job.seed, epoch, n, W, task, B, steps)
        x = prep(xtr[idx])
        h = model.fit(x, ytr[idx].astype(np.int32), batch_size=B, epochs=1, shuffle=False,
                      verbose=args.verbose, callbacks=callbacks)
        loss = float(h.history["loss"][-1])
        done += steps
        epoch += 1
    took = max(1e-9, time.monotonic() - t0)
    eps = done * B / took
    if not args.local:
        opt.finish(loss, eps)
    _, acc = model.evaluate(prep(xte), yte.astype(np.int32),
                            batch_size=1000, verbose=0)
    print(f"done: task={task} steps={done} examples={done * B} loss={loss:.4f} "
          f"test_accuracy={acc:.4f} examples_per_sec={eps:.1f}", flush=True)
    if not args.local:
        opt.close()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
