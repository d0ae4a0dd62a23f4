"""The click model of test_keras_embedding.py: ids -> Embedding(100_000, 16) -> mean over
the sequence -> Dense(1, sigmoid), on synthetic clicks with a learnable signal.

Imported by the test (data, models) and run as a worker process of a job:

    python embedding_worker.py JOBFILE TASK WORKERS BATCH STEPS OUT.json [VOCAB DIM]

Worker TASK of WORKERS trains with ``tessera.keras`` on its own BATCH of each global step
of WORKERS x BATCH examples (the examples in order, as ps-worker splits them), then writes
what it saw (loss per step, rows its layer pulled, the distinct ids per step) to OUT.json.
"""
from __future__ import annotations

import json
import os
import sys

import numpy as np

VOCAB = 100_000
DIM = 16
SEQ = 8
LR = 0.5          # SGD on the shards (job) and in plain Keras
SEED = 11


def make_data(n: int, seed: int = SEED, vocab: int = VOCAB):
    """ids (n, SEQ) int64, Zipf-distributed over vocab (ranked by a random permutation), and
    clicks drawn from a hidden per-id weight: P(click) = sigmoid(4 * sqrt(SEQ) *
    mean(w[ids])). Returns ids, labels (n, 1) float32, and the Bayes accuracy; the first k
    examples of any n >= k are the same."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(vocab)
    ranks = np.arange(1, vocab + 1, dtype=np.float64)
    p = ranks ** -1.1
    p /= p.sum()
    perm = rng.permutation(vocab)
    ids = perm[rng.choice(vocab, size=(n, SEQ), p=p)].astype(np.int64)
    logit = 4.0 * np.sqrt(SEQ) * w[ids].mean(axis=1)
    prob = 1.0 / (1.0 + np.exp(-logit))
    # Labels from a stream of their own: make_data(n) is a prefix of make_data(n + m).
    y = (np.random.default_rng(seed + 1).random(n) < prob).astype(np.float32)[:, None]
    bayes = float(np.mean((prob > 0.5) == (y[:, 0] > 0.5)))
    return ids, y, bayes


def model(keras, emb_layer):
    """The model around an embedding layer (tessera's or Keras's), seeded Dense init."""
    return keras.Sequential([
        keras.Input((SEQ,), dtype="int64"),
        emb_layer,
        keras.layers.GlobalAveragePooling1D(name="mean"),
        keras.layers.Dense(1, activation="sigmoid", name="out",
                           kernel_initializer=keras.initializers.GlorotUniform(seed=1)),
    ], name="clicks")


def worker_slice(ids, y, task: int, workers: int, batch: int, steps: int):
    """Worker task's examples of global steps 0..steps-1 (each of workers x batch)."""
    idx = np.concatenate([np.arange(k * workers * batch + task * batch,
                                    k * workers * batch + (task + 1) * batch)
                          for k in range(steps)])
    return ids[idx], y[idx]


def main(argv) -> int:
    cfg, task, workers, batch, steps, out = argv[1], int(argv[2]), int(argv[3]), \
        int(argv[4]), int(argv[5]), argv[6]
    vocab, dim = (int(argv[7]), int(argv[8])) if len(argv) > 8 else (VOCAB, DIM)
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    import keras
    import tessera.keras as tk

    ids, y, _ = make_data(workers * batch * steps, vocab=vocab)
    x, yy = worker_slice(ids, y, task, workers, batch, steps)
    opt = tk.optimizer(cfg, task=task)
    emb = tk.Embedding(vocab, dim, name="emb")
    m = model(keras, emb)
    m.compile(optimizer=opt, loss="binary_crossentropy", metrics=["accuracy"])
    versions = []

    class Versions(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            versions.append(emb._version)

    h = m.fit(x, yy, batch_size=batch, epochs=1, shuffle=False, verbose=0,
              callbacks=[tk.ProgressCallback(opt, batch), Versions()])
    opt.finish()
    uniq = [int(np.unique(x[k * batch:(k + 1) * batch]).size) for k in range(steps)]
    with open(out, "w") as f:
        json.dump({"loss": h.history["loss"], "steps": opt.tessera_steps,
                   "pulled_rows": emb.pulled_rows, "pushed_rows": emb.pushed_rows,
                   "calls": emb.calls, "uniq": uniq, "stale_pushes": emb.stale_pushes,
                   "versions": versions}, f)
    opt.close()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.exit(main(sys.argv))
