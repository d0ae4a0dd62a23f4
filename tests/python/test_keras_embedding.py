"""tessera.keras.Embedding: Keras embeddings whose rows live in tables on real shards.

The click model of embedding_worker.py (ids -> Embedding(100_000, 16) -> mean -> Dense(1,
sigmoid), Zipf ids, a hidden weight per id) trained with plain SGD, in sync mode: 1 worker x
batch 2B in this process, 2 worker processes x batch B, and plain Keras with
keras.layers.Embedding from the same initial values; the traffic the shards see; the refusal
of a stock keras.layers.Embedding. Skipped where TensorFlow cannot be imported.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tessera
from conftest import tf_missing

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import embedding_worker as ew  # noqa: E402


_why = tf_missing()
pytestmark = pytest.mark.skipif(bool(_why), reason=_why or "-")

B, STEPS = 64, 150          # per worker; 2 workers
SYNC_SGD = ('job = { mode = "sync"; partition_bytes = 64; };\n'
            f'optimizer = {{ name = "sgd"; learning_rate = {ew.LR}; }};\n'
            'model = { seed = 5; };\n')


@pytest.fixture(scope="module")
def tf_threads():
    import tensorflow as tf
    try:
        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(2)
    except RuntimeError:        # already initialised by an earlier test module
        pass


def _shard_rows(client, key):
    return sum(t[key] for st in client.status() for t in st.tables if t["name"] == "emb")


def test_sync_matches_plain_keras_and_two_workers_equal_one(cluster, tf_threads):
    """Sync SGD: 2 workers x B equal 1 worker x 2B (rows and Dense to 1e-5), which equals
    plain Keras with keras.layers.Embedding from the same initial values; the model learns
    (held-out accuracy far from chance); the shards see the rows the batches touched."""
    import keras
    import tessera.keras as tk
    n = 2 * B * STEPS
    ids, y, bayes = ew.make_data(n + 4000)
    x, yy, xt, yt = ids[:n], y[:n], ids[n:], y[n:]
    data_ids = np.unique(ids)

    # Two worker processes on their own job (started first: they import TensorFlow while
    # this process trains the others).
    cl2 = cluster(2, 2, SYNC_SGD)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    procs = [subprocess.Popen([sys.executable, str(HERE / "embedding_worker.py"),
                               str(cl2.config), str(t), "2", str(B), str(STEPS),
                               str(cl2.dir / f"w{t}.json")],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for t in range(2)]
    try:
        # 1 worker x 2B, graph mode (fit's tf.function).
        cl1 = cluster(2, 1, SYNC_SGD)
        with tessera.Client(str(cl1.config), task=0) as c:
            opt = tk.Optimizer(c)
            emb = tk.Embedding(ew.VOCAB, ew.DIM, name="emb")
            m = ew.model(keras, emb)
            m.compile(optimizer=opt, loss="binary_crossentropy", metrics=["accuracy"])
            assert c.tables == {} and emb.weights[0].shape == ()   # no [input_dim, dim]
            # evaluate before fit: the layer builds the optimizer, which declares the table.
            loss0, acc0 = m.evaluate(xt, yt, batch_size=1000, verbose=0)
            assert c.tables == {"emb": ew.DIM} and opt.tessera_names == ["clicks/out/kernel",
                                                                        "clicks/out/bias"]
            dense0 = [w.copy() for w in m.get_layer("out").get_weights()]
            rows0 = c.pull_rows("emb", data_ids, min_version=0)
            pulled0, pushed0 = _shard_rows(c, "pulled_rows"), _shard_rows(c, "pushed_rows")
            layer0 = emb.pulled_rows
            # In two halves with an evaluate in between (as validation data): its pulls
            # read what is there and must not move the version the next step waits for.
            half = 2 * B * (STEPS // 2)
            m.fit(x[:half], yy[:half], batch_size=2 * B, epochs=1, shuffle=False, verbose=0)
            before = emb.pulled_rows
            mid = m.evaluate(xt, yt, batch_size=1000, verbose=0)[0]
            evaluated = emb.pulled_rows - before
            m.fit(x[half:], yy[half:], batch_size=2 * B, epochs=1, shuffle=False, verbose=0)
            assert opt.tessera_steps == STEPS
            # Traffic: the shards saw the distinct ids of each batch, not input_dim rows.
            touched = sum(np.unique(x[k * 2 * B:(k + 1) * 2 * B]).size for k in range(STEPS))
            pulled = _shard_rows(c, "pulled_rows") - pulled0 - evaluated
            pushed = _shard_rows(c, "pushed_rows") - pushed0
            assert emb.pulled_rows - layer0 - evaluated == emb.pushed_rows == touched
            assert emb.stale_pushes == 0 and mid < loss0
            assert touched <= pulled <= 1.5 * touched, (pulled, touched)
            assert touched <= pushed <= 1.5 * touched, (pushed, touched)
            loss1, acc1 = m.evaluate(xt, yt, batch_size=1000, verbose=0)
            rows1 = c.pull_rows("emb", data_ids, min_version=0)
            dense1 = m.get_layer("out").get_weights()
        print(f"\n1x{2 * B}: loss {loss0:.4f} -> {loss1:.4f}, accuracy {acc0:.3f} -> "
              f"{acc1:.3f} (Bayes {bayes:.3f}); rows touched {touched / STEPS:.0f}/step, "
              f"shards pulled {pulled / STEPS:.0f}/step, pushed {pushed / STEPS:.0f}/step "
              f"({pulled * ew.DIM * 4 / STEPS / 1024:.1f} KiB/step; the table "
              f"{ew.VOCAB * ew.DIM * 4 / 1024:.0f} KiB)")
        assert acc1 > 0.72 and loss1 < 0.9 * loss0, (loss0, loss1, acc1)

        # Plain Keras, same initial rows (those the data uses) and Dense, same order.
        kemb = keras.layers.Embedding(ew.VOCAB, ew.DIM, name="emb")
        km = ew.model(keras, kemb)
        table = kemb.embeddings.numpy()
        table[data_ids] = rows0
        kemb.embeddings.assign(table)
        km.get_layer("out").set_weights(dense0)
        km.compile(optimizer=keras.optimizers.SGD(ew.LR), loss="binary_crossentropy",
                   metrics=["accuracy"])
        km.fit(x, yy, batch_size=2 * B, epochs=1, shuffle=False, verbose=0)
        kloss, kacc = km.evaluate(xt, yt, batch_size=1000, verbose=0)
        print(f"plain Keras: loss {kloss:.4f}, accuracy {kacc:.3f}; rows differ by "
              f"{np.abs(kemb.embeddings.numpy()[data_ids] - rows1).max():.2e}")
        assert abs(kloss - loss1) < 1e-3 and abs(kacc - acc1) < 0.005
        np.testing.assert_allclose(kemb.embeddings.numpy()[data_ids], rows1, atol=1e-4)
        for a, b in zip(km.get_layer("out").get_weights(), dense1):
            np.testing.assert_allclose(a, b, atol=1e-4)

        # 2 workers x B: the same rows and Dense as 1 x 2B.
        for p in procs:
            out, _ = p.communicate(timeout=240)
            assert p.returncode == 0, out.decode(errors="replace")[-3000:]
        res = [json.loads((cl2.dir / f"w{t}.json").read_text()) for t in range(2)]
        with tessera.Client(str(cl2.config), task=0) as c:     # a fresh evaluator
            opt = tk.Optimizer(c)
            m2 = ew.model(keras, tk.Embedding(ew.VOCAB, ew.DIM, name="emb"))
            m2.compile(optimizer=opt, loss="binary_crossentropy", metrics=["accuracy"])
            opt.build(m2.trainable_variables)
            assert c.values_source == "the shards"
            rows2 = c.pull_rows("emb", data_ids, min_version=0)
            loss2, acc2 = m2.evaluate(xt, yt, batch_size=1000, verbose=0)
            pulled2 = _shard_rows(c, "pulled_rows")
            dense2 = m2.get_layer("out").get_weights()
        touched2 = sum(sum(r["uniq"]) for r in res)
        diff = max(np.abs(rows2 - rows1).max(),
                   max(np.abs(a - b).max() for a, b in zip(dense2, dense1)))
        print(f"2x{B}: loss {loss2:.4f}, accuracy {acc2:.3f}; differs from 1x{2 * B} by "
              f"{diff:.2e}; workers' rows pulled {touched2 / STEPS:.0f}/step")
        assert all(r["steps"] == STEPS for r in res)
        assert all(r["pulled_rows"] == sum(r["uniq"]) for r in res)
        assert all(r["pushed_rows"] == sum(r["uniq"]) for r in res)
        # the shards' count includes the evaluator's pulls since
        assert pulled2 - 2 * data_ids.size <= 1.5 * touched2
        assert diff < 1e-5, diff
        assert abs(loss2 - loss1) < 1e-4
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_stock_embedding_is_refused(cluster, tf_threads):
    """A keras.layers.Embedding in a model trained with tessera.keras would push and pull
    its whole table every step: refused at the optimizer's build, naming the layer and the
    one-line change, before anything is declared."""
    import keras
    import tessera.keras as tk
    cl = cluster(1, 1, 'job = { mode = "async"; };\n')
    with tessera.Client(str(cl.config), task=0) as c:
        m = keras.Sequential([keras.Input((4,), dtype="int64"),
                              keras.layers.Embedding(1000, 8, name="words"),
                              keras.layers.GlobalAveragePooling1D(),
                              keras.layers.Dense(1)], name="stock")
        opt = tk.Optimizer(c)
        m.compile(optimizer=opt, loss="mse")
        x = np.zeros((8, 4), np.int64)
        with pytest.raises(ValueError, match=r"(?i)replace keras\.layers\.Embedding\(\.\.\.\) "
                                             r"with tessera\.keras\.Embedding\(\.\.\.\)") as e:
            m.fit(x, np.zeros((8, 1), np.float32), verbose=0)
        assert isinstance(e.value, tk.StockEmbeddingError)
        assert "'words'" in str(e.value) and "[1000, 8]" in str(e.value)
        assert c.tensors == [] and c.tables == {}
        with pytest.raises(tk.StockEmbeddingError, match="'words'"):
            tk.Optimizer(c, model=m).build(m.trainable_variables)
        # Asked for: the whole table as a dense tensor (a small vocabulary).
        opt = tk.Optimizer(c, dense_embeddings=True)
        m.compile(optimizer=opt, loss="mse")
        m.fit(x, np.zeros((8, 1), np.float32), verbose=0)
        assert opt.tessera_steps == 1 and "stock/words/embeddings" in c.tensors


def test_async_unbounded_ids_adagrad_mask_and_eager(cluster, tf_threads):
    """input_dim=None takes any int64 id (hashed, negative); the layer's row optimizer
    (Adagrad) runs on the shards; mask_zero gives Keras's mask; eager (run_eagerly) trains
    as the traced step does; the initializers map to the shards'; bad ones are refused."""
    import keras
    import tessera.keras as tk
    cl = cluster(2, 1, 'job = { mode = "async"; };\n'
                       'optimizer = { name = "sgd"; learning_rate = 0.5; };\n')
    rng = np.random.default_rng(3)
    vocab = rng.integers(-2**62, 2**62, 50)
    x = vocab[rng.integers(0, 50, (256, 4))]
    w = dict(zip(vocab.tolist(), rng.standard_normal(50)))
    y = (np.vectorize(w.get)(x).mean(1) > 0).astype(np.float32)[:, None]
    with tessera.Client(str(cl.config), task=0) as c:
        emb = tk.Embedding(None, 8, table="hashed", optimizer="adagrad", learning_rate=1.0,
                           embeddings_initializer="truncated_normal", name="e")
        m = ew.model(keras, emb)
        opt = tk.Optimizer(c)
        m.compile(optimizer=opt, loss="binary_crossentropy", metrics=["accuracy"],
                  run_eagerly=True)
        h = m.fit(x, y, batch_size=32, epochs=4, shuffle=False, verbose=0)
        assert c.tables == {"hashed": 8} and opt.tessera_steps == 32
        assert h.history["loss"][-1] < 0.85 * h.history["loss"][0], h.history["loss"]
        per_epoch = sum(np.unique(x[k * 32:(k + 1) * 32]).size for k in range(8))
        assert emb.calls == 32 and emb.pulled_rows == emb.pushed_rows == 4 * per_epoch
        assert sum(t["rows"] for st in c.status() for t in st.tables) == 50
    assert tk.Embedding(10, 4, embeddings_initializer="zeros").table_spec.init == "zeros"
    spec = tk.Embedding(10, 4, embeddings_initializer=keras.initializers.RandomUniform(
        -0.1, 0.1)).table_spec
    assert (spec.init, spec.init_scale) == ("uniform", pytest.approx(0.1))
    with pytest.raises(ValueError, match="embeddings_initializer 'orthogonal'"):
        tk.Embedding(10, 4, embeddings_initializer="orthogonal")
    with pytest.raises(ValueError, match="row optimizer 'rmsprop'"):
        tk.Embedding(10, 4, optimizer="rmsprop")
    masked = tk.Embedding(10, 4, mask_zero=True)
    ids = np.array([[0, 3, 0, 2]])
    np.testing.assert_array_equal(
        np.asarray(masked.compute_mask(ids)),
        np.asarray(keras.layers.Embedding(10, 4, mask_zero=True).compute_mask(ids)))
    assert tk.Embedding(10, 4).compute_mask(ids) is None
    # One call per train step, one table per layer: refused while tracing / at build.
    cl = cluster(1, 1, 'job = { mode = "async"; };\n')
    with tessera.Client(str(cl.config), task=0) as c:
        shared = tk.Embedding(None, 8, table="hashed", name="shared")
        inp = keras.Input((4,), dtype="int64")
        out = keras.layers.Dense(1)(keras.layers.Flatten()(
            keras.layers.Concatenate(axis=1)([shared(inp), shared(inp)])))
        m2 = keras.Model(inp, out)
        m2.compile(optimizer=tk.Optimizer(c), loss="mse")
        with pytest.raises(ValueError, match="'shared' is called twice in one train step"):
            m2.fit(x[:8], y[:8], verbose=0)
        twins = keras.Model(inp, keras.layers.Concatenate(axis=1)(
            [tk.Embedding(None, 8, table="t")(inp), tk.Embedding(None, 8, table="t")(inp)]))
        with pytest.raises(ValueError, match="two layers use table 't'"):
            tk.Optimizer(c, model=twins).build(twins.trainable_variables)
    # Keras's serialisation (model.save's config) rebuilds the same layer.
    again = tk.Embedding.from_config(emb.get_config())
    assert again.table_spec == emb.table_spec and again.table == "hashed"
