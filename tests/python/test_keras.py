"""tessera.keras: Keras 3 models trained on real shards.

Skipped (with the reason printed by run_pytest.sh's -rs) where TensorFlow cannot be imported.
The example CNN's runs are in test_keras_cnn.py.
"""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import tessera
from conftest import tf_missing



_why = tf_missing()
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


def test_initial_values_are_the_models_own(cluster):
    """The job starts from task 0's values (Keras's initialisers, a bias_initializer of
    ones, weights set by hand), not from the shards' own initialisation; another worker
    receives them; a later worker of the same job goes on from the shards' values."""
    import keras
    import tessera.keras as tk
    cl = cluster(2, 2, 'job = { mode = "async"; };\nmodel = { seed = 3; };\n')
    m = keras.Sequential([keras.Input((4,)),
                          keras.layers.Dense(8, name="h", bias_initializer="ones"),
                          keras.layers.Dense(2, name="out")], name="mlp")
    m.get_layer("out").set_weights([np.full((8, 2), 0.25, np.float32),
                                    np.array([1.5, -2.0], np.float32)])
    own = {v.path: v.numpy().copy() for v in m.trainable_variables}
    with tessera.Client(str(cl.config), task=0) as c:
        opt = tk.Optimizer(c)
        opt.build(m.trainable_variables)
        assert c.values_source == "this worker"
        shard = opt.pull()
        for n, v in own.items():
            np.testing.assert_array_equal(shard[n], v)             # exactly the model's own
            np.testing.assert_array_equal(
                {w.path: w for w in m.trainable_variables}[n].numpy(), v)
        # task 1: another process's model (other random values) receives task 0's.
        with tessera.Client(str(cl.config), task=1) as c1:
            m1 = _mlp(keras)
            tk.Optimizer(c1).build(m1.trainable_variables)
            assert c1.values_source in ("the chief", "the shards")   # set before it came
            for v in m1.trainable_variables:
                np.testing.assert_array_equal(v.numpy(), own[v.path])
    # A new task 0 on shards that hold the model: theirs win, not its own.
    with tessera.Client(str(cl.config), task=0) as c:
        m2 = _mlp(keras)
        tk.Optimizer(c).build(m2.trainable_variables)
        assert c.values_source == "the shards"
        for v in m2.trainable_variables:
            np.testing.assert_array_equal(v.numpy(), own[v.path])


def test_batchnorm_state_on_the_shards(cluster):
    """BatchNormalization: gamma starts at Keras's ones (not zeros), the moving statistics
    are state tensors on the shards, updated from the workers' values."""
    import keras
    import tessera.keras as tk
    cl = cluster(2, 1, 'job = { mode = "sync"; partition_bytes = 64; };\n'
                       'optimizer = { name = "sgd"; learning_rate = 0.1; };\n')
    m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, name="h"),
                          keras.layers.BatchNormalization(name="bn"),
                          keras.layers.Dense(2, name="out")], name="bnm")
    with tessera.Client(str(cl.config), task=0) as c:
        opt = tk.Optimizer(c)
        m.compile(optimizer=opt, loss="mse")
        x = np.random.default_rng(1).standard_normal((32, 4)).astype(np.float32) + 3.0
        m.fit(x, x[:, :2], batch_size=16, epochs=1, shuffle=False, verbose=0)
        assert opt.state_names == ["bnm/bn/moving_mean", "bnm/bn/moving_variance"]
        assert opt.tessera_steps == 2
        shard = opt.pull()
        bn = m.get_layer("bn")
        np.testing.assert_array_equal(shard["bnm/bn/moving_mean"], bn.moving_mean.numpy())
        np.testing.assert_array_equal(shard["bnm/bn/moving_variance"],
                                      bn.moving_variance.numpy())
        assert np.abs(shard["bnm/bn/moving_mean"]).max() > 0       # moved from zeros
        assert np.abs(shard["bnm/bn/gamma"] - 1).max() < 0.5        # from ones
        assert c.status(0).tensors + c.status(1).tensors >= 2
        assert opt.state_every == 1
    # train.state_every: the state is exchanged every N steps, kept local in between.
    opt3 = tk.optimizer(str(cl.config), task=0, overrides=["train.state_every=3"])
    try:
        assert opt3.state_every == 3
        m3 = keras.models.clone_model(m)
        m3.compile(optimizer=opt3, loss="mse")
        m3.fit(x, x[:, :2], batch_size=16, epochs=2, shuffle=False, verbose=0)
        assert opt3.tessera_steps == 4
        # Pushed at steps 0 and 3 (the 1st and 4th): the shards hold step 3's mean, the
        # model its own later values equal to them after that step.
        shard = opt3.pull()
        np.testing.assert_array_equal(shard["bnm/bn/moving_mean"],
                                      m3.get_layer("bn").moving_mean.numpy())
    finally:
        opt3.close()


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
    # The chief (task 0) declares the model and sends its values first.
    with tessera.Client(str(cl.config), task=0) as c0:
        tk.Optimizer(c0).build(_mlp(keras).trainable_variables)
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


def test_fine_tuning_and_restore_best_weights_reach_the_shards(cluster):
    """Weights loaded before fit are the shards' values at step 0 (exactly); after
    EarlyStopping(restore_best_weights=True) the model and the shards hold the same
    values (exactly), so the next fit goes on from the restored weights."""
    import keras
    import tessera.keras as tk
    cl = cluster(2, 1, 'job = { mode = "sync"; partition_bytes = 64; };\n'
                       'optimizer = { name = "sgd"; learning_rate = 0.05; };\n')
    x = np.random.default_rng(2).standard_normal((64, 4)).astype(np.float32)
    y = np.stack([x[:, 0] - x[:, 1], x[:, 2]], 1).astype(np.float32)
    src = _mlp(keras)
    for v in src.trainable_variables:       # "pretrained" weights, saved and loaded
        v.assign(np.random.default_rng(5).uniform(-1, 1, v.shape).astype(np.float32))
    path = str(cl.dir / "pre.weights.h5")
    src.save_weights(path)
    m = _mlp(keras)
    m.load_weights(path)
    loaded = {v.path: v.numpy().copy() for v in m.trainable_variables}

    class AtStart(keras.callbacks.Callback):
        seen = None

        def on_train_batch_begin(self, batch, logs=None):
            if batch == 0 and AtStart.seen is None:
                AtStart.seen = opt.pull()

    with tessera.Client(str(cl.config), task=0) as c:
        opt = tk.Optimizer(c)
        m.compile(optimizer=opt, loss="mse")
        es = keras.callbacks.EarlyStopping(monitor="loss", mode="max", patience=1,
                                           restore_best_weights=True)
        m.fit(x, y, batch_size=16, epochs=6, shuffle=False, verbose=0,
              callbacks=[AtStart(), es, tk.ProgressCallback(opt, 16)])
        for n, v in loaded.items():
            np.testing.assert_array_equal(AtStart.seen[n], v)
        assert es.stopped_epoch > 0 and opt.tessera_steps == 4 * (es.stopped_epoch + 1)
        shard = opt.pull()
        for v in m.trainable_variables:
            np.testing.assert_array_equal(shard[v.path], v.numpy())
        # The best epoch (the first: mode="max" on a falling loss) is what both hold.
        assert float(m.evaluate(x, y, verbose=0)) > 0.0
        # set_weights by hand, then finish(): the shards take them too.
        m.set_weights([w * 0.5 for w in m.get_weights()])
        opt.finish()
        shard = opt.pull()
        for v in m.trainable_variables:
            np.testing.assert_array_equal(shard[v.path], v.numpy())
