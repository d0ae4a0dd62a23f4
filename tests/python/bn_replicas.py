"""The reference of test_keras_cnn.py's BatchNorm sync-exactness test, in a process of its
own (one TensorFlow thread, set before TensorFlow starts): TensorFlow's data parallelism
without SyncBatchNorm, computed by hand for 2 replicas with plain SGD, against what the
job's shards hold after the same steps of keras_fashion_mnist.py --model bn-cnn.

usage: bn_replicas.py JOBFILE BATCH STEPS LEARNING_RATE EXAMPLES
prints one JSON line: variable path -> largest difference over the variable's largest value
"""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
DATA = Path("/usr/share/datasets/fashion-mnist")


def main(argv) -> int:
    cfg, B, steps, lr, examples = argv[0], int(argv[1]), int(argv[2]), float(argv[3]), \
        int(argv[4])
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import keras
    import tessera
    import tessera.keras as tk
    spec = importlib.util.spec_from_file_location(
        "keras_fashion_mnist", ROOT / "examples" / "python" / "keras_fashion_mnist.py")
    ex = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ex)
    job = tessera.load_job(cfg)
    keras.utils.set_random_seed(job.seed)
    ref = ex.build_model(keras, "bn-cnn")
    # The shards' values, read through the optimizer of a model like the workers'.
    keras.utils.set_random_seed(job.seed)
    probe = ex.build_model(keras, "bn-cnn")
    with tessera.Client(cfg, task=0) as c:
        opt = tk.Optimizer(c, model=probe)
        opt.build(probe.trainable_variables)
        if c.values_source != "the shards":
            raise SystemExit(f"values from {c.values_source}, not the shards")
        shard = opt.pull()
    state = [v for v in ref.non_trainable_variables if v.dtype == "float32"]
    if sorted(opt.state_names) != sorted(v.path for v in state):
        raise SystemExit(f"state tensors {opt.state_names}, model {[v.path for v in state]}")

    xtr = ex.read_idx(str(DATA / "train-images-idx3-ubyte.gz"))[:examples]
    ytr = ex.read_idx(str(DATA / "train-labels-idx1-ubyte.gz"))[:examples]

    def prep(a):
        return ((a.astype(np.float32) * np.float32(1.0 / 255.0) - np.float32(0.2860))
                * np.float32(1.0 / 0.3530))[..., None]
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    idx = [ex.worker_indices(job.seed, 0, examples, 2, t, B, steps).reshape(steps, B)
           for t in range(2)]
    for k in range(steps):
        start = [v.numpy().copy() for v in state]
        grads, after = [], []
        for t in range(2):  # each replica from the step's moving statistics
            for v, s in zip(state, start):
                v.assign(s)
            x, y = prep(xtr[idx[t][k]]), ytr[idx[t][k]].astype(np.int32)
            with tf.GradientTape() as tape:
                loss = loss_fn(y, ref(x, training=True))
            grads.append([g.numpy() for g in tape.gradient(loss, ref.trainable_variables)])
            after.append([v.numpy().copy() for v in state])
        for v, g0, g1 in zip(ref.trainable_variables, *grads):
            v.assign(v.numpy() - np.float32(lr) * (g0 + g1) / np.float32(2))
        for i, v in enumerate(state):
            v.assign((after[0][i] + after[1][i]) / np.float32(2))
    rel = {}
    for v in ref.trainable_variables + state:
        a, b = shard[v.path].astype(np.float64), v.numpy().astype(np.float64)
        rel[v.path] = float(np.max(np.abs(a - b)) / max(1e-30, float(np.max(np.abs(b)))))
    print(json.dumps(rel))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
