#!/usr/bin/env python3
"""keras_pss_ctr: the CTR model of bench/keras_ctr.py trained with TensorFlow's own
ParameterServerStrategy, the issue's third system beside Tessera and one Keras process.

One process per task of a TensorFlow cluster on 127.0.0.1 (`ps` and `worker` tasks run a
tf.distribute.Server); the `chief` (the coordinator) builds the same model (Embedding of
width 8 over the 26 fields, the 13 integers and their missing indicators, Dense 64, Dense
32, 2 logits) under the strategy, its embedding split over the ps tasks, and runs
model.fit over a DatasetCreator. Each worker reads its rows from a file the chief writes
first (fixed-length binary records: 26 float32 features, 26 int64 ids, the label), so the
data never travels through the cluster. Keras 2 (tf-keras), as ParameterServerStrategy
needs; Adam 0.002; asynchronous, as the strategy is.

    python3 bench/keras_pss_ctr.py --role ps|worker|chief --index I --ps P0,P1 \
        --workers W0,W1 --chief C --train T.tsv --test T.tsv --batch 256 --epochs 2

The chief prints a line like ps-worker's (the training window is the timed fit's):

    done: task=chief steps=... examples=... examples_per_sec=... auc=... logloss=...
"""
from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import keras_ctr  # noqa: E402  (the data's features, the model, the AUC)
import keras_pss  # noqa: E402  (the cluster's tasks)

FEAT = 2 * keras_ctr.INTS
RECORD = FEAT * 4 + keras_ctr.CATS * 8 + 4


def write_records(path: str, ints: np.ndarray, ids: np.ndarray, y: np.ndarray) -> None:
    rec = np.zeros(len(y), dtype=[("f", "<f4", FEAT), ("i", "<i8", keras_ctr.CATS), ("y", "<i4")])
    rec["f"], rec["i"], rec["y"] = ints, ids, y
    rec.tofile(path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    keras_pss.cluster_args(ap)
    ap.add_argument("--train", help="chief: the training rows (Criteo TSV)")
    ap.add_argument("--test", help="chief: the test rows")
    ap.add_argument("--records", required=True, help="the binary rows the workers read")
    ap.add_argument("--batch", type=int, default=256, help="examples per worker step")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--lr", type=float, default=0.002)
    args = ap.parse_args(argv)

    spec = keras_pss.cluster_spec(args)
    tf, resolver = keras_pss.tf_task(args, spec)
    import tf_keras as keras
    keras.utils.set_random_seed(42)
    (xi, xc, y), (ti, tc, ty), vocab = keras_ctr.features(keras_ctr.read_tsv(args.train),
                                                           keras_ctr.read_tsv(args.test))
    write_records(args.records, xi, xc, y)
    workers = len(spec["worker"])
    steps = len(y) // (workers * args.batch) * workers * args.epochs  # all workers' steps
    # The embedding split over the ps tasks (as Tessera's shards split the table's rows).
    strategy = tf.distribute.ParameterServerStrategy(
        resolver, variable_partitioner=tf.distribute.experimental.partitioners.MinSizePartitioner(
            min_shard_bytes=64 << 10, max_shards=len(spec["ps"])))
    path, batch = args.records, args.batch

    def dataset_fn(input_context):
        ds = tf.data.FixedLengthRecordDataset(path, RECORD)
        ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)

        def parse(r):
            at = FEAT * 4 + keras_ctr.CATS * 8
            f = tf.io.decode_raw(tf.strings.substr(r, 0, FEAT * 4), tf.float32)
            i = tf.io.decode_raw(tf.strings.substr(r, FEAT * 4, keras_ctr.CATS * 8), tf.int64)
            lab = tf.io.decode_raw(tf.strings.substr(r, at, 4), tf.int32)
            return (tf.reshape(f, [FEAT]), tf.reshape(i, [keras_ctr.CATS])), tf.reshape(lab, [])

        return ds.map(parse).repeat().batch(batch).prefetch(2)

    with strategy.scope():
        model = keras_ctr.build(keras, keras.layers.Embedding(vocab, keras_ctr.DIM))
        model.compile(optimizer=keras.optimizers.Adam(args.lr),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    creator = keras.utils.experimental.DatasetCreator(dataset_fn)
    warm = 4 * workers  # traces the step on every worker
    model.fit(creator, epochs=1, steps_per_epoch=warm, verbose=0)
    started = time.time()
    model.fit(creator, epochs=1, steps_per_epoch=steps, verbose=0)
    finished = time.time()
    plain = keras_ctr.build(keras, keras.layers.Embedding(vocab, keras_ctr.DIM))
    # A variable split over the ps tasks (the embedding, once it passes min_shard_bytes) is
    # one ShardedVariable of parts: the plain model's weight is the parts stacked.
    for mine, theirs in zip(plain.layers, model.layers):
        if isinstance(theirs, keras.layers.Embedding):
            parts = getattr(theirs.embeddings, "variables", [theirs.embeddings])
            mine.set_weights([np.concatenate([p.numpy() for p in parts], axis=0)])
        elif theirs.weights:
            mine.set_weights(theirs.get_weights())
    logits = plain.predict([ti, tc], batch_size=4096, verbose=0)
    z = logits[:, 1] - logits[:, 0]
    p = 1.0 / (1.0 + np.exp(-z.astype(np.float64)))
    eps = 1e-7
    ll = float(-np.mean(ty * np.log(p + eps) + (1 - ty) * np.log(1 - p + eps)))
    n = steps * batch
    print(f"done: task=chief steps={steps} examples={n} "
          f"examples_per_sec={n / max(1e-9, finished - started):.1f} started_at={started:.3f} "
          f"finished_at={finished:.3f} auc={keras_ctr.auc(ty, p):.6f} logloss={ll:.6f}",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
