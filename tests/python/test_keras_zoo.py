"""A model zoo through tessera.keras: Keras models as users bring them, each trained with 2
shards and 2 sync workers and compared with the same model in plain Keras (one process,
the same global batch, data order and steps, the same optimizer):

* MobileNetV2 (alpha 0.35) and ResNet50 from keras.applications, 32x32 inputs,
  weights=None (BatchNormalization everywhere);
* a functional CNN with BatchNormalization;
* a Transformer encoder block (Embedding, MultiHeadAttention, LayerNormalization) on a
  sequence task;
* an LSTM text classifier;
* a subclassed keras.Model (with BatchNormalization) and its own train_step.

For every model: the first step trains from the model's own initial values (the variables
as the first step reads them, and what the shards hold then, equal to the values Keras's
initialisers drew, exactly); the held-out loss drops by 30 % or more in plain Keras and in
tessera (a run that separates a working model from a dead one: a BatchNormalization whose
gamma is 0 stays at ln 4); and tessera's final held-out loss is within 10 % of plain
Keras's, or its accuracy within 0.03.

tests/python/zoo_worker.py trains every model in sequence in one process (one TensorFlow
start-up): as the reference (2 TensorFlow threads), then twice at once as the two tessera
workers (task 0 and 1, one TensorFlow thread each, a freshly started 2-shard cluster per
model). About 2 minutes on 2 quiet cores (100 to 135 s; 150 to 190 s of CPU, most of
it TensorFlow tracing the train steps; 3.7 minutes measured while other jobs loaded the
machine). Skipped where TensorFlow cannot be imported.
"""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import Cluster
from test_keras import _why

import zoo_worker

WORKER = Path(__file__).resolve().parent / "zoo_worker.py"
pytestmark = pytest.mark.skipif(bool(_why), reason=_why or "-")

DROP = 0.30          # the held-out loss must drop by this much from its initial value
LOSS_TOL = 0.10      # tessera's final loss within 10 % of plain Keras's ...
ACC_TOL = 0.03       # ... or its accuracy within 0.03


def _env(threads: int) -> dict:
    return dict(os.environ, OMP_NUM_THREADS=str(threads), TF_NUM_INTRAOP_THREADS=str(threads),
                TF_NUM_INTEROP_THREADS=str(threads), TF_CPP_MIN_LOG_LEVEL="2",
                KERAS_BACKEND="tensorflow")


def _lines(out: str) -> dict:
    res = {}
    for line in out.splitlines():
        if line.startswith("{"):
            d = json.loads(line)
            res[d["name"]] = d
    return res


def _start(args, out: Path, threads: int = 1) -> subprocess.Popen:
    """zoo_worker.py ARGS, stdout in OUT.out and stderr in OUT.err (files, not pipes: two
    processes run at once and neither may block on a full pipe)."""
    with open(f"{out}.out", "w") as o, open(f"{out}.err", "w") as e:
        return subprocess.Popen([sys.executable, str(WORKER), *args, "--threads", str(threads)],
                                stdin=subprocess.DEVNULL, stdout=o, stderr=e, text=True,
                                env=_env(threads))


def _finish(p: subprocess.Popen, out: Path, what: str, deadline: float) -> dict:
    try:
        p.wait(max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    stdout = Path(f"{out}.out").read_text(errors="replace")
    stderr = Path(f"{out}.err").read_text(errors="replace")
    assert p.returncode == 0, f"{what}: rc {p.returncode}\n{stdout}\n{stderr[-6000:]}"
    return _lines(stdout)


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    """Runs the whole zoo once: {"reference": {...}, "tessera": [task 0's, task 1's],
    "wall": {...}}."""
    t0 = time.monotonic()
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    tmp = tmp_path_factory.mktemp("zoo")
    clusters = []
    procs = []
    try:
        for name in zoo_worker.ZOO:
            clusters.append(Cluster(2, zoo_worker.W, zoo_worker.job_text(name)))
        jobs = [f"--job={name}={c.config}" for name, c in zip(zoo_worker.ZOO, clusters)]
        # The reference first (2 TensorFlow threads), then the two workers at once (1 each).
        # Most of the time is TensorFlow tracing the train steps (about 15 s for each
        # Applications model), on one core: a reference running beside the workers made
        # the whole slower, not faster.
        deadline = time.monotonic() + 480
        procs = [_start(["--reference"], tmp / "reference", threads=2)]
        ref = _finish(procs[0], tmp / "reference", "reference", deadline)
        t_ref = time.monotonic() - t0
        outs = [tmp / f"task{t}" for t in range(zoo_worker.W)]
        procs = [_start(["--task", str(t), *jobs], o) for t, o in enumerate(outs)]
        tess = [_finish(p, o, f"tessera worker {t}", deadline)
                for t, (p, o) in enumerate(zip(procs, outs))]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        logs = {n: [c.log(i)[-2000:] for i in range(c.num_shards)]
                for n, c in zip(zoo_worker.ZOO, clusters)}
        for c in clusters:
            c.stop()
    total = time.monotonic() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    wall = {"reference": t_ref, "tessera": total - t_ref, "total": total, "cpu": cpu}
    print(f"\nkeras zoo: reference {wall['reference']:.0f} s, tessera {wall['tessera']:.0f} s, "
          f"total {wall['total']:.0f} s wall, {cpu:.0f} s CPU (workers, reference, shards)")
    for name in zoo_worker.ZOO:
        r, t = ref.get(name, {}), tess[0].get(name, {})
        print(f"  {name:12s} ref {r.get('initial_loss', float('nan')):.3f} -> "
              f"{r.get('loss', float('nan')):.3f} acc {r.get('accuracy', float('nan')):.3f} "
              f"({r.get('seconds', 0):.0f} s) | tessera "
              f"{t.get('initial_loss', float('nan')):.3f} -> {t.get('loss', float('nan')):.3f} "
              f"acc {t.get('accuracy', float('nan')):.3f} ({t.get('seconds', 0):.0f} s) "
              f"mismatches var {t.get('var_mismatches')} shard {t.get('shard_mismatches')}")
    res = {"reference": ref, "tessera": tess, "wall": wall, "logs": logs}
    if os.environ.get("TESSERA_ZOO_JSON"):      # every number, for a report
        Path(os.environ["TESSERA_ZOO_JSON"]).write_text(json.dumps(res, indent=1))
    return res


@pytest.mark.parametrize("name", zoo_worker.ZOO)
def test_keras_zoo_model(zoo, name):
    ref = zoo["reference"].get(name)
    tess = [w.get(name) for w in zoo["tessera"]]
    assert ref is not None and all(tess), (name, ref, tess)
    t0 = tess[0]
    steps = zoo_worker.PLAN[name][0]
    # Every process started from the same initial values (Keras's, from the same seed).
    assert len({ref["init_digest"]} | {t["init_digest"] for t in tess}) == 1, (ref, tess)
    assert all(t["tessera_steps"] == steps for t in tess), tess
    # The first step's parameters are the model's own initial values, exactly: the
    # variables as the step read them, and every tensor the shards held then.
    assert t0["shards_error"] is None, t0
    assert t0["var_mismatches"] == 0, t0
    # Every float variable is on the shards: the trainable ones and the state
    # (BatchNormalization's moving statistics).
    assert t0["shard_compared"] == t0["trainable_tensors"] + t0["state_tensors"], t0
    assert t0["shard_mismatches"] == 0 and t0["shard_unknown"] == 0, t0
    # A working model: the held-out loss drops clearly, in plain Keras and in tessera.
    assert ref["loss"] <= (1 - DROP) * ref["initial_loss"], ref
    assert t0["loss"] <= (1 - DROP) * t0["initial_loss"], (t0, ref)
    # The same training: final loss within 10 % of plain Keras's, or accuracy within 0.03.
    close_loss = abs(t0["loss"] - ref["loss"]) <= LOSS_TOL * ref["loss"]
    close_acc = abs(t0["accuracy"] - ref["accuracy"]) <= ACC_TOL
    assert close_loss or close_acc, (
        f"{name}: tessera loss {t0['loss']:.4f} acc {t0['accuracy']:.3f}, plain Keras "
        f"loss {ref['loss']:.4f} acc {ref['accuracy']:.3f}", t0, ref)
