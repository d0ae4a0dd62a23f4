"""tessera.keras: Keras 3 models trained on real shards.

Skipped (with the reason printed by run.sh's -rs) where TensorFlow cannot be imported.
The example CNN's runs are in test_keras_cnn.py.
"""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import tessera



def _tf_importable() -> str:
    try:
        import tensorflow  # noqa: F401
        import keras
        if not keras.__version__.startswith("3."):
            return f"Keras 3 needed, found {keras.__version__}"
    except Exception as e:  # noqa: BLE001
        return f"TensorFlow cannot be imported: {e}"
    return ""


_why = _tf_importable()
pytestmark = pytest.mark.skipif(bool(_why), reason=_why or "-")

# --- the package without TensorFlow ------------------------------------------------------

def test_import_tessera_does_not_import_tensorflow():
    code = ("import sys, tessera; assert 'tensorflow' not in sys.modules; "
            "sys.modules['tensorflow'] = None\n"
            "try:\n import tessera.keras\nexcept ImportError as e:\n print('ERR', e)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60, cwd="/")
    assert p.returncode == 0, p.stderr
    assert "ERR tessera.keras needs TensorFlow" in p.stdout and "pip install" in p.stdout


# --- the optimizer's contract -------------------------------------------------------------

def _mlp(keras, hidden=8, name="mlp"):
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(hidden, name="h"),
                             keras.layers.Dense(2, name="out")], name=name)


def test_optimizer_declares_pulls_and_trains(cluster):
    import keras
    import tessera.keras as tk
    cl = cluster(2, 1, 'job = { mode = "sync"; partition_bytes = 32; };\n'
                       'optimizer = { name = "sgd"; learning_rate = 0.1; };\n'
                       'model = { seed = 7; };\n')
    with tessera.Client(str(cl.config), task=0) as c:
        opt = tk.Optimizer(c)
        model = _mlp(keras)
        model.compile(optimizer=opt, loss="mse")
        x = np.random.default_rng(0).standard_normal((64, 4)).astype(np.float32)
        y = np.stack([x[:, 0] - x[:, 1], x[:, 2]], 1).astype(np.float32)
        assert model.jit_compile is False
        l0 = float(model.evaluate(x, y, verbose=0))
        model.fit(x, y, batch_size=16, epochs=20, shuffle=False, verbose=0)
        assert opt.tessera_names == [f"mlp/{n}" for n in ("h/kernel", "h/bias", "out/kernel", "out/bias")]
        assert c.tensors == opt.tessera_names
        assert opt.tessera_steps == 80 and int(opt.iterations.numpy()) == 80
        assert float(model.evaluate(x, y, verbose=0)) < 0.05 * l0
        # The model's variables are the shards' values of the last step.
        shard = opt.pull()
        for v in model.trainable_variables:
            np.testing.assert_array_equal(v.numpy(), shard[v.path])
        opt.finish()

    # Another worker (new client, new model) starts from the shards' current values, and
    # a fresh job starts from the shards' deterministic initial values (glorot, zeros).
    with tessera.Client(str(cl.config), task=0) as c:
        model2 = _mlp(keras)
        model2.compile(optimizer=tk.Optimizer(c), loss="mse")
        model2.optimizer.build(model2.trainable_variables)
        for v, w in zip(model2.trainable_variables, model.trainable_variables):
            np.testing.assert_array_equal(v.numpy(), w.numpy())


def test_xla_compiled_step_is_refused_with_a_clear_error(cluster):
    import keras
    import tessera.keras as tk
    cl = cluster(1, 1, 'job = { mode = "async"; };\n'
                       'optimizer = { name = "sgd"; learning_rate = 0.1; };\n')
    with tessera.Client(str(cl.config), task=0) as c:
        model = _mlp(keras)
        model.compile(optimizer=tk.Optimizer(c), loss="mse", jit_compile=True)
        x = np.zeros((16, 4), np.float32)
        with pytest.raises(RuntimeError, match=r"jit_compile=False"):
            model.fit(x, x[:, :2], batch_size=16, epochs=1, verbose=0)
        assert model.jit_compile is True           # the user's setting, untouched
        model.compile(optimizer=tk.Optimizer(c), loss="mse", jit_compile=False)
        model.fit(x, x[:, :2], batch_size=16, epochs=1, verbose=0)
        assert model.optimizer.tessera_steps == 1


def test_initial_values_from_the_shards(cluster):
    import keras
    import tessera.keras as tk
    cl = cluster(2, 1, 'job = { mode = "async"; };\nmodel = { seed = 3; };\n')
    with tessera.Client(str(cl.config), task=0) as c:
        m = _mlp(keras)
        before = [v.numpy().copy() for v in m.trainable_variables]
        opt = tk.Optimizer(c)
        opt.build(m.trainable_variables)
        after = {v.path: v.numpy() for v in m.trainable_variables}
    assert not np.array_equal(before[0], after["mlp/h/kernel"])     # pulled, not Keras's own
    assert np.all(after["mlp/h/bias"] == 0) and np.all(after["mlp/out/bias"] == 0)
    lim = np.sqrt(6.0 / (4 + 8))                                # glorot uniform
    assert 0 < np.abs(after["mlp/h/kernel"]).max() <= lim


def test_no_trainable_variables_raises(cluster):
    import keras
    import tessera.keras as tk
    cl = cluster(1, 1, 'job = { mode = "async"; };\n')
    with tessera.Client(str(cl.config), task=0) as c:
        opt = tk.Optimizer(c)
        with pytest.raises(ValueError, match="no trainable variables"):
            opt.build([])
        m = _mlp(keras)
        for layer in m.layers:
            layer.trainable = False
        opt = tk.Optimizer(c)
        m.compile(optimizer=opt, loss="mse")
        with pytest.raises(ValueError, match="no trainable variables"):
            opt.apply([], [])
        # Keras's fit never calls the optimizer of such a model (it warns); the progress
        # callback refuses it.
        x = np.zeros((8, 4), np.float32)
        with pytest.raises(ValueError, match="no trainable variables"):
            m.fit(x, np.zeros((8, 2), np.float32), verbose=0,
                  callbacks=[tk.ProgressCallback(opt, 8)])


def test_mismatched_redeclare_raises(cluster):
    """Another model on the same shards: the error says what differs, the code once."""
    import keras
    import tessera.keras as tk
    cl = cluster(2, 1, 'job = { mode = "async"; };\n')
    with tessera.Client(str(cl.config), task=0) as c:
        tk.Optimizer(c).build(_mlp(keras, hidden=8).trainable_variables)

    def extra(where):           # _mlp with one more Dense layer "x" before or after "out"
        layers = [keras.layers.Dense(8, name="h"), keras.layers.Dense(2, name="out")]
        layers.insert(where, keras.layers.Dense(3, name="x"))
        return keras.Sequential([keras.Input((4,))] + layers, name="mlp")

    short = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, name="h")], name="mlp")
    cases = [
        (_mlp(keras, hidden=16),
         r"'mlp/h/kernel' is \(4, 8\) on the shards, \(4, 16\) in this model \[ESHAPE\]$"),
        (extra(1), r"'mlp/x/kernel' of this model is not part of the model the shards hold "
                   r"\(4 tensors on the shards, 6 in this model\)"),
        (extra(2), r"'mlp/x/kernel' of this model is not part of the model the shards hold"),
        (short, r"the shards' model has tensors this one lacks: 'mlp/out/kernel' and 1 more "
                r"\(4 tensors on the shards, 2 in this model\)"),
    ]
    for model, want in cases:
        with tessera.Client(str(cl.config), task=0) as c:
            with pytest.raises(tessera.ShapeError, match=want) as e:
                tk.Optimizer(c).build(model.trainable_variables)
        text = str(e.value)
        assert text.startswith("tessera.keras.Optimizer: this model is not the one the job's "
                               "shards hold"), text
        assert text.count("ESHAPE") == 1 and e.value.name == "ESHAPE", text


@pytest.mark.parametrize("detail,want", [
    ("shard 1 (127.0.0.1:9): tensor 'a/k' is already declared with shape [3,4], not [4,4]",
     "'a/k' is (3, 4) on the shards, (4, 4) in this model"),
    ("tensor 'b' is already declared with shape [7], not [8] (and another initializer)",
     "'b' is (7,) on the shards, (8,) in this model, and another initializer"),
    ("tensor 'n/kernel' is not part of the declared model (2 tensors)",
     "'n/kernel' of this model is not part of the model the shards hold (2 tensors on the "
     "shards, 3 in this model)"),
    ("model already declared with 4 tensors, not 3 (tensor 'o/bias' is missing)",
     "the shards' model has tensors this one lacks: 'o/bias' (4 tensors on the shards, 3 in "
     "this model)"),
    ("tensor 'h/bias' is declared at position 3, not 1",
     "'h/bias' is tensor 3 of the shards' model, 1 of this one (counting from 0: layers in "
     "another order?)"),
    ("tensor 'h/bias' is already declared with initializer zeros, not ones",
     "'h/bias' is initialised zeros on the shards, ones in this model"),
    ("model already declared with seed 7, not 8",
     "the shards' model was declared with seed 7, this one with 8 (model.seed)"),
    ("something else entirely", None),
])
def test_mismatch_texts(detail, want):
    """Each ESHAPE detail of server/ts_store.c's same_model, said of the declared model."""
    from tessera import _mismatch
    assert _mismatch.describe(detail, 3) == want


def test_optimizer_from_job_file_and_bad_arguments(cluster):
    import keras
    import tessera.keras as tk
    cl = cluster(1, 1, 'job = { mode = "async"; };\n')
    opt = tk.optimizer(str(cl.config), task=0)
    try:
        assert opt.client.task == 0 and opt.client.mode == "async"
        m = _mlp(keras)
        m.compile(optimizer=opt, loss="mse")
        m.fit(np.ones((4, 4), np.float32), np.ones((4, 2), np.float32), verbose=0)
        assert opt.tessera_steps == 1
    finally:
        opt.close()
    with tessera.Client(str(cl.config), task=0) as c:
        with pytest.raises(TypeError):
            tk.Optimizer(c, task=1)


def test_worker_identity_from_tf_config(cluster, monkeypatch):
    """No task given: the optimizer's client takes the worker index (and the cluster) from
    TF_CONFIG, as TensorFlow's distributed training reads it."""
    import json
    import keras
    import tessera.keras as tk
    cl = cluster(2, 2, 'job = { mode = "async"; };\n')
    tf_config = {"cluster": {"ps": cl.addrs, "worker": ["127.0.0.1:1", "127.0.0.1:2"]},
                 "task": {"type": "worker", "index": 1}}
    monkeypatch.setenv("TF_CONFIG", json.dumps(tf_config))
    opt = tk.optimizer(str(cl.config))
    try:
        assert opt.client.task == 1 and opt.client.num_workers == 2
        m = _mlp(keras)
        m.compile(optimizer=opt, loss="mse")
        m.fit(np.ones((4, 4), np.float32), np.ones((4, 2), np.float32), verbose=0)
        assert opt.tessera_steps == 1
        st = opt.client.status(0)
        assert any(w.task == 1 for w in st.workers), st.workers
    finally:
        opt.close()
