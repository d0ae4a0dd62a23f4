"""Saving and loading Keras models trained with tessera.keras.Optimizer.

A worker process trains a tiny CNN on real shards and saves it (ModelCheckpoint every
epoch, model.save at the end); after the shards are gone, a fresh process loads every file
and predicts exactly what the worker's model predicted. Worker and loader are both
subprocesses with the same TensorFlow threading, so nothing of tessera (a client, a
connection, a registered class) leaks from the test process into the loader and the two
run the same kernels. Skipped where TensorFlow cannot be imported.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
import zipfile

import numpy as np
import pytest

from test_keras import _mlp, _why

pytestmark = pytest.mark.skipif(bool(_why), reason=_why or "-")

JOB = ('job = { mode = "async"; partition_bytes = 256; };\n'
       'optimizer = { name = "sgd"; learning_rate = 0.05; };\n'
       'model = { seed = 5; };\n')
EPOCHS, N, BATCH = 3, 96, 16

# Both processes: one TensorFlow thread each, so they run the same kernels the same way.
_PRELUDE = """
import json, sys, warnings
from pathlib import Path
import numpy as np
import tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
import keras
out = Path(sys.argv[1])
"""

_WORKER = _PRELUDE + f"""
import tessera.keras as tk
model = keras.Sequential([keras.Input((8, 8, 1)),
                          keras.layers.Conv2D(4, 3, activation="relu", name="conv"),
                          keras.layers.MaxPooling2D(name="pool"),
                          keras.layers.Flatten(name="flat"),
                          keras.layers.Dense(3, name="out")], name="tiny")
opt = tk.optimizer(sys.argv[2], task=0)
model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy"])
rng = np.random.default_rng(0)
x = rng.standard_normal(({N}, 8, 8, 1)).astype(np.float32)
y = rng.integers(0, 3, {N})
np.save(out / "x.npy", x)

class Record(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        np.save(out / f"pred-{{epoch + 1:02d}}.npy", self.model.predict(x, verbose=0))

model.fit(x, y, batch_size={BATCH}, epochs={EPOCHS}, shuffle=False, verbose=0,
          callbacks=[keras.callbacks.ModelCheckpoint(str(out / "ckpt-{{epoch:02d}}.keras")),
                     Record()])
model.save(out / "final.keras")
np.save(out / "pred-final.npy", model.predict(x, verbose=0))
print(json.dumps({{"steps": opt.tessera_steps}}))
opt.close()
"""

_LOADER = _PRELUDE + """
import tessera.keras as tk
x = np.load(out / "x.npy")
res = {}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for f in sorted(out.glob("*.keras")):
        m = keras.models.load_model(f)
        want = np.load(out / ("pred-" + f.stem.split("-")[-1] + ".npy"))
        res[f.name] = {"equal": bool(np.array_equal(m.predict(x, verbose=0), want)),
                       "inert": m.optimizer.inert,
                       "iterations": int(m.optimizer.iterations.numpy())}
    m = keras.models.load_model(out / "final.keras")
    clone = keras.models.clone_model(m)
    res["clone_inert"] = clone.optimizer.inert
    other = keras.models.clone_model(m)
    other.compile(optimizer=m.optimizer, loss="mse")
    res["other_predicts"] = other.predict(x, verbose=0).shape == (len(x), 3)
    try:
        m.fit(x, np.zeros(len(x), np.int64), batch_size=16, epochs=1, verbose=0)
        res["fit"] = "trained"
    except RuntimeError as e:
        res["fit"] = str(e)
res["warnings"] = sorted({str(w.message) for w in caught
                          if issubclass(w.category, tk.InertOptimizerWarning)})
print(json.dumps(res))
"""

# Recent Keras 3 (3.15 here) imports classes only from Keras's own packages when it
# loads a file, so a process that has not imported tessera.keras cannot rebuild the
# optimizer; compile=False skips it and the model predicts all the same.
_LOADER_NO_TESSERA = _PRELUDE + """
x = np.load(out / "x.npy")
m = keras.models.load_model(out / "final.keras", compile=False)
res = {"equal": bool(np.array_equal(m.predict(x, verbose=0), np.load(out / "pred-final.npy")))}
try:
    keras.models.load_model(out / "final.keras")
    res["compiled"] = "loaded"
except Exception as e:  # noqa: BLE001
    res["compiled"] = f"{type(e).__name__}: {e}"
res["tessera_imported"] = "tessera" in sys.modules
print(json.dumps(res))
"""


def _python(code: str, *args: str, timeout: float = 300) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="2")
    p = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                       timeout=timeout, env=env, cwd="/")
    assert p.returncode == 0, p.stderr[-4000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_saved_models_load_and_predict_without_shards(cluster, tmp_path):
    cl = cluster(2, 1, JOB)
    out = _python(_WORKER, str(tmp_path), str(cl.config))
    steps_per_epoch = N // BATCH
    assert out["steps"] == EPOCHS * steps_per_epoch
    cl.stop()                                   # nothing left to connect to
    files = sorted(p.name for p in tmp_path.glob("*.keras"))
    assert files == [f"ckpt-{e:02d}.keras" for e in range(1, EPOCHS + 1)] + ["final.keras"]

    res = _python(_LOADER, str(tmp_path))
    for e in range(1, EPOCHS + 1):
        assert res[f"ckpt-{e:02d}.keras"] == {"equal": True, "inert": True,
                                              "iterations": e * steps_per_epoch}, res
    assert res["final.keras"] == {"equal": True, "inert": True,
                                  "iterations": EPOCHS * steps_per_epoch}, res
    assert res["clone_inert"] is True and res["other_predicts"] is True
    assert "cannot train" in res["fit"] and "tessera.keras.optimizer(JOBFILE" in res["fit"], res
    assert len(res["warnings"]) == 1 and "tessera.keras.optimizer(JOBFILE, task=T)" in \
        res["warnings"][0], res["warnings"]

    res = _python(_LOADER_NO_TESSERA, str(tmp_path))
    assert res["equal"] is True and res["tessera_imported"] is False, res
    # Either a later Keras rebuilds it, or its error names what to import.
    assert res["compiled"] == "loaded" or "tessera>Optimizer" in res["compiled"], res


def _strings(obj):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield k
            yield from _strings(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _strings(v)
    elif isinstance(obj, str):
        yield obj


def test_saved_config_holds_no_job_path(cluster, tmp_path):
    import keras
    import tessera.keras as tk
    cl = cluster(1, 1, JOB)
    opt = tk.optimizer(str(cl.config), task=0)
    try:
        m = _mlp(keras)
        m.compile(optimizer=opt, loss="mse")
        m.fit(np.ones((4, 4), np.float32), np.ones((4, 2), np.float32), verbose=0)
        m.save(tmp_path / "m.keras")
    finally:
        opt.close()
    text = zipfile.ZipFile(tmp_path / "m.keras").read("config.json").decode()
    assert str(cl.config) not in text and str(cl.dir) not in text
    assert cl.config.name not in text
    cfg = json.loads(text)
    absolute = [s for s in _strings(cfg) if os.path.isabs(s)]
    assert not absolute, absolute
    o = cfg["compile_config"]["optimizer"]
    assert o["registered_name"] == "tessera>Optimizer" and o["module"] == "tessera.keras"
    assert "job" not in o["config"], o


def test_clone_of_a_training_model_gets_an_inert_optimizer(cluster):
    import keras
    import tessera.keras as tk
    cl = cluster(1, 1, JOB)
    opt = tk.optimizer(str(cl.config), task=0)
    try:
        m = _mlp(keras)
        m.compile(optimizer=opt, loss="mse")
        x, y = np.ones((4, 4), np.float32), np.ones((4, 2), np.float32)
        with pytest.warns(tk.InertOptimizerWarning, match="inert"):
            clone = keras.models.clone_model(m)
        assert clone.optimizer.inert and clone.optimizer is not opt and not opt.inert
        with pytest.raises(RuntimeError, match="cannot train"):
            clone.fit(x, y, verbose=0)
        with pytest.raises(RuntimeError, match="cannot train"):
            clone.optimizer.pull()
        m.fit(x, y, verbose=0)                   # the original trains on
        assert opt.tessera_steps == 1
    finally:
        opt.close()


def test_from_config_of_an_older_file_ignores_its_job_path():
    import tessera.keras as tk
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tk.InertOptimizerWarning)
        opt = tk.Optimizer.from_config({"name": "tessera", "learning_rate": 0.0,
                                        "job": "/home/someone/job.cfg"})
    assert opt.inert and opt.client is None and opt.name == "tessera"
    assert "job" not in opt.get_config()
    opt.close()                                  # nothing to close
    with pytest.raises(TypeError):
        tk.Optimizer(None, task=0)
