#!/usr/bin/env python3
"""keras_ctr: ps-worker's CTR model (worker/ts_ctr.h, docs/embeddings.md) written in Keras,
on Criteo TSV rows (bench/criteo_gen), for bench/keras_ctr.sh.

The model: one embedding table of width 8 over the 26 categorical fields (each field's
values its own ids, a missing value one id per field), the 26 vectors flattened and
concatenated with the 13 integer features as log(1 + x) (0 when missing) and their 13
missing indicators, then Dense 64 relu, Dense 32 relu and 2 logits under softmax
cross-entropy, as ps-worker's job deploy/local/ctr.cfg (with Adam 0.002).

    keras_ctr.py -c JOB --task T --train F --test F    tessera.keras: tessera.keras.Embedding
        (the rows on the shards, the job's row optimizer) and tessera.keras.Optimizer;
        worker T takes its rows of every global step as ps-worker does (step g: rows
        g*W*B .. (g+1)*W*B, worker T the T-th B of them), in file order
    keras_ctr.py --local --batch 2B ...                 one plain Keras process: Keras's
        Embedding and Adam, the global batch, the same rows in the same order

The ids are made dense (a field's distinct values over both files, in order) so that both
ways run the very same model. Prints one line when done:
    done: task=T steps=N examples=N examples_per_sec=R started_at=S finished_at=F auc=A
    logloss=L vocab=V
with the rate and the window of fit (tracing included; reading the files and TensorFlow's
start-up not), and the test rows' AUC and log loss.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

INTS, CATS, DIM = 13, 26, 8


def read_tsv(path: str) -> np.ndarray:
    with open(path) as f:
        rows = [line.rstrip("\n").split("\t") for line in f]
    return np.array(rows, dtype=object)


def features(train: np.ndarray, test: np.ndarray):
    """(ints [n, 26] float32, ids [n, 26] int64, labels [n] int32) of both files, the ids
    dense over both, and the vocabulary size."""
    both = np.concatenate([train, test])
    labels = both[:, 0].astype(np.int32)
    ints = np.zeros((len(both), 2 * INTS), np.float32)
    for j in range(INTS):
        col = both[:, 1 + j]
        missing = col == ""
        x = np.where(missing, "0", col).astype(np.int64)
        ints[:, j] = np.log1p(np.maximum(x, 0)).astype(np.float32)
        ints[:, INTS + j] = missing.astype(np.float32)
    ids = np.zeros((len(both), CATS), np.int64)
    vocab = 0
    for f in range(CATS):
        _, inverse = np.unique(both[:, 1 + INTS + f].astype(str), return_inverse=True)
        ids[:, f] = vocab + inverse.reshape(-1)
        vocab += int(inverse.max()) + 1
    n = len(train)
    return ((ints[:n], ids[:n], labels[:n]), (ints[n:], ids[n:], labels[n:]), vocab)


def auc(y: np.ndarray, p: np.ndarray) -> float:
    order = np.argsort(p, kind="mergesort")
    ranks = np.empty(len(p), np.float64)
    ranks[order] = np.arange(1, len(p) + 1)
    pos = y == 1
    npos, nneg = int(pos.sum()), int((~pos).sum())
    return float((ranks[pos].sum() - npos * (npos + 1) / 2) / max(1, npos * nneg))


def build(keras, embedding):
    ints = keras.Input((2 * INTS,), name="ints")
    ids = keras.Input((CATS,), dtype="int64", name="ids")
    vecs = keras.layers.Flatten()(embedding(ids))
    x = keras.layers.Concatenate()([ints, vecs])
    x = keras.layers.Dense(64, activation="relu")(x)
    x = keras.layers.Dense(32, activation="relu")(x)
    out = keras.layers.Dense(2, name="logits")(x)
    return keras.Model([ints, ids], out, name="ctr")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-c", "--config", help="the job file (tessera.keras)")
    ap.add_argument("--task", type=int, default=0)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--train", required=True)
    ap.add_argument("--test", required=True)
    ap.add_argument("--local", action="store_true", help="one plain Keras process")
    ap.add_argument("--batch", type=int, default=512, help="--local: the global batch")
    ap.add_argument("--epochs", type=int, default=2, help="--local: epochs")
    ap.add_argument("--lr", type=float, default=0.002, help="--local: Adam's learning rate")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    import keras
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    keras.utils.set_random_seed(42)

    (xi, xc, y), (ti, tc, ty), vocab = features(read_tsv(args.train), read_tsv(args.test))
    if args.local:
        W, T, B, E = 1, 0, args.batch, args.epochs
        opt = keras.optimizers.Adam(args.lr)
        emb = keras.layers.Embedding(vocab, DIM)
    else:
        import tessera.keras as tk
        opt = tk.Optimizer(args.config, task=args.task, overrides=args.set, timeout=120.0)
        job = opt.client.job
        W, T, B, E = max(1, job.num_workers), opt.client.task, job.batch_size, job.epochs
        emb = tk.Embedding(vocab, DIM, table="criteo")
    steps = len(y) // (W * B)
    # worker T's rows of steps 0..steps-1, in file order (ps-worker's read_batch)
    rows = np.arange(steps * W * B).reshape(steps, W, B)[:, T, :].reshape(-1)
    model = build(keras, emb)
    model.compile(optimizer=opt, jit_compile=False,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    started = time.time()
    model.fit([xi[rows], xc[rows]], y[rows], batch_size=B, epochs=E, shuffle=False, verbose=0)
    finished = time.time()
    logits = model.predict([ti, tc], batch_size=4096, verbose=0)
    z = logits[:, 1] - logits[:, 0]
    p = 1.0 / (1.0 + np.exp(-z.astype(np.float64)))
    eps = 1e-7
    ll = float(-np.mean(ty * np.log(p + eps) + (1 - ty) * np.log(1 - p + eps)))
    n = steps * B * E
    print(f"done: task={T} steps={steps * E} examples={n} "
          f"examples_per_sec={n / max(1e-9, finished - started):.1f} started_at={started:.3f} "
          f"finished_at={finished:.3f} auc={auc(ty, p):.6f} logloss={ll:.6f} vocab={vocab}",
          flush=True)
    if not args.local:
        opt.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
