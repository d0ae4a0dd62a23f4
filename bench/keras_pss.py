#!/usr/bin/env python3
"""keras_pss: the Keras CNN of examples/python/keras_fashion_mnist.py trained with
TensorFlow's own ParameterServerStrategy, the peer that bench/keras.sh measures Tessera
against.

One process per task of a TensorFlow cluster on 127.0.0.1: `ps` and `worker` tasks run a
tf.distribute.Server; the `chief` (the coordinator) builds the model under the strategy,
model.compile, model.fit over a DatasetCreator (each worker reads its own pipeline, as
TensorFlow's parameter-server tutorial does), and prints a line like the example's:

    done: task=chief steps=... examples=... loss=... test_accuracy=... examples_per_sec=...

ParameterServerStrategy is not supported by Keras 3 (keras-team/keras#18624: "stick to
tf.keras"), so this runs Keras 2 (tf-keras, TF_USE_LEGACY_KERAS=1): the same layers, the
same Adam, the same data and preprocessing. The strategy is asynchronous (each worker's
step updates the variables on the ps tasks as it comes), so compare it with Tessera's
async mode.

    python3 bench/keras_pss.py --role ps|worker|chief --index I --ps P0,P1 --workers W0,W1 \
        --chief C --batch 32 --steps 900 [--threads 1] [--steps-per-execution 1]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples", "python"))
import keras_fashion_mnist as example  # noqa: E402  (data reading, order, preprocessing)


def cluster_spec(args) -> dict:
    hosts = lambda s: [f"127.0.0.1:{p}" for p in s.split(",") if p]  # noqa: E731
    return {"chief": hosts(args.chief), "worker": hosts(args.workers), "ps": hosts(args.ps)}


def cluster_args(ap: argparse.ArgumentParser) -> None:
    """The task and the cluster's ports, as every ParameterServerStrategy benchmark takes
    them (cluster_spec, tf_task)."""
    ap.add_argument("--role", choices=["ps", "worker", "chief"], required=True)
    ap.add_argument("--index", type=int, default=0)
    ap.add_argument("--ps", required=True, help="ps ports, comma-separated")
    ap.add_argument("--workers", required=True, help="worker ports, comma-separated")
    ap.add_argument("--chief", required=True, help="the chief's port")
    ap.add_argument("--threads", type=int, default=1, help="TensorFlow threads per task")


def tf_task(args, spec: dict):
    """Start this process's task of the cluster spec (args.role, args.index), TensorFlow on
    args.threads threads: a ps or worker task serves until it is killed and never returns;
    the chief gets (tensorflow, its cluster resolver)."""
    os.environ["TF_CONFIG"] = json.dumps(
        {"cluster": spec, "task": {"type": args.role, "index": args.index}})
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if args.role != "chief":
        server = tf.distribute.Server(resolver.cluster_spec(), job_name=args.role,
                                      task_index=args.index, protocol="grpc", start=True)
        server.join()
        sys.exit(0)
    return tf, resolver


def build_model(keras):
    # The example's CNN, layer for layer (tf.keras spells them the same way).
    return example.build_model(keras)


def prep(a: np.ndarray) -> np.ndarray:
    return ((a.astype(np.float32) * np.float32(1.0 / 255.0) - np.float32(0.2860))
            * np.float32(1.0 / 0.3530))[..., None]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cluster_args(ap)
    ap.add_argument("--batch", type=int, default=32, help="examples per worker step")
    ap.add_argument("--steps", type=int, default=900, help="steps of all workers together")
    ap.add_argument("--steps-per-execution", type=int, default=1)
    ap.add_argument("--lr", type=float, default=0.001)
    args = ap.parse_args(argv)

    spec = cluster_spec(args)
    tf, resolver = tf_task(args, spec)
    import tf_keras as keras
    xtr, ytr, xte, yte = example.load(argparse.Namespace())
    x, y = prep(xtr), ytr.astype(np.int32)
    strategy = tf.distribute.ParameterServerStrategy(resolver)

    def dataset_fn(input_context):
        ds = tf.data.Dataset.from_tensor_slices((x, y))
        ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        return ds.shuffle(10000, seed=1).repeat().batch(args.batch).prefetch(2)

    with strategy.scope():
        model = build_model(keras)
        model.compile(optimizer=keras.optimizers.Adam(args.lr),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"], steps_per_execution=args.steps_per_execution)
    # One epoch of `steps` worker steps (scheduled by the coordinator to whichever worker
    # is free), after one short warm-up fit that traces the step on every worker.
    warm = 4 * args.steps_per_execution * len(spec["worker"])
    creator = keras.utils.experimental.DatasetCreator(dataset_fn)
    model.fit(creator, epochs=1, steps_per_epoch=warm, verbose=0)
    t0 = time.monotonic()
    h = model.fit(creator, epochs=1, steps_per_epoch=args.steps, verbose=0)
    took = max(1e-9, time.monotonic() - t0)
    loss = float(h.history["loss"][-1])
    plain = build_model(keras)
    plain.set_weights(model.get_weights())
    plain.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    _, acc = plain.evaluate(prep(xte), yte.astype(np.int32), batch_size=1000, verbose=0)
    n = (args.steps + warm) * args.batch
    print(f"done: task=chief steps={args.steps + warm} examples={n} loss={loss:.4f} "
          f"test_accuracy={acc:.4f} examples_per_sec={args.steps * args.batch / took:.1f}",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
