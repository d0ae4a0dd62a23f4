"""tessera.keras.EmbeddingBag (combiners over multi-hot bags) and string ids, on real
shards: a mean bag trains as Keras's Embedding(mask_zero) + GlobalAveragePooling1D does
from the same initial rows; sum and sqrtn give numpy's; hashed string ids are the rows of
their Fingerprint64. Skipped where TensorFlow cannot be imported."""
from __future__ import annotations

import numpy as np
import pytest

import tessera
from conftest import tf_missing

_why = tf_missing()
pytestmark = pytest.mark.skipif(bool(_why), reason=_why or "-")

ASYNC = ('job = { mode = "async"; };\n'
         'optimizer = { name = "sgd"; learning_rate = 0.5; };\n'
         'model = { seed = 9; };\n')
VOCAB, DIM, BAG = 200, 8, 5


def _bags(n, seed=1):
    """n bags of 1 to BAG ids in [1, VOCAB), padded with 0; clicks from a hidden weight."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, VOCAB, (n, BAG)).astype(np.int64)
    sizes = rng.integers(1, BAG + 1, n)
    ids[np.arange(BAG)[None, :] >= sizes[:, None]] = 0
    w = rng.standard_normal(VOCAB)
    w[0] = 0
    y = ((w[ids].sum(1) / sizes) > 0).astype(np.float32)[:, None]
    return ids, y


def _dense(keras):
    return keras.layers.Dense(1, activation="sigmoid", name="out",
                              kernel_initializer=keras.initializers.GlorotUniform(seed=1))


def test_mean_bag_trains_as_keras(cluster):
    import keras
    import tessera.keras as tk
    x, y = _bags(640)
    cl = cluster(2, 1, ASYNC)
    with tessera.Client(str(cl.config), task=0) as c:
        bag = tk.EmbeddingBag(VOCAB, DIM, mask_zero=True, name="bag")
        m = keras.Sequential([keras.Input((BAG,), dtype="int64"), bag, _dense(keras)])
        assert bag.compute_output_shape((None, BAG)) == (None, DIM)
        m.compile(optimizer=tk.Optimizer(c), loss="binary_crossentropy")
        m.evaluate(x[:32], y[:32], verbose=0)                   # declares; reads only
        rows0 = c.pull_rows("bag", np.arange(VOCAB), read_only=True)
        dense0 = [w.copy() for w in m.get_layer("out").get_weights()]
        m.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
        rows1 = c.pull_rows("bag", np.arange(VOCAB), read_only=True)
        loss1 = m.evaluate(x, y, verbose=0)
    kemb = keras.layers.Embedding(VOCAB, DIM, mask_zero=True)
    km = keras.Sequential([keras.Input((BAG,), dtype="int64"), kemb,
                           keras.layers.GlobalAveragePooling1D(), _dense(keras)])
    kemb.embeddings.assign(rows0)
    km.get_layer("out").set_weights(dense0)
    km.compile(optimizer=keras.optimizers.SGD(0.5), loss="binary_crossentropy")
    km.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
    used = np.unique(x[x > 0])
    np.testing.assert_allclose(rows1[used], kemb.embeddings.numpy()[used], atol=1e-5)
    for a, b in zip(m.get_layer("out").get_weights(), km.get_layer("out").get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-5)
    assert abs(km.evaluate(x, y, verbose=0) - loss1) < 1e-4
    assert np.abs(rows1[used] - rows0[used]).max() > 1e-3          # it trained


def test_sum_sqrtn_and_string_ids(cluster):
    import keras
    import tensorflow as tf
    import tessera.keras as tk
    x, _ = _bags(64, seed=2)
    cl = cluster(1, 1, ASYNC)
    with tessera.Client(str(cl.config), task=0) as c:
        layers = {k: tk.EmbeddingBag(VOCAB, DIM, mask_zero=True, combiner=k, name=k)
                  for k in ("sum", "sqrtn")}
        inp = keras.Input((BAG,), dtype="int64")
        m = keras.Model(inp, [layers["sum"](inp), layers["sqrtn"](inp)])
        m.compile(optimizer=tk.Optimizer(c), loss="mse")
        got = m.predict(x, verbose=0)
        n = (x > 0).sum(1, keepdims=True)
        for k, out in zip(("sum", "sqrtn"), got):
            rows = c.pull_rows(k, np.arange(VOCAB), read_only=True)
            want = (rows[x] * (x > 0)[..., None]).sum(1)
            np.testing.assert_allclose(out, want if k == "sum" else want / np.sqrt(n),
                                       atol=1e-6)

    # String ids: an unbounded table keyed by their Fingerprint64 (a model of its own).
    cl = cluster(1, 1, ASYNC)
    with tessera.Client(str(cl.config), task=0) as c:
        words = tf.constant([["red", "car", ""], ["blue", "", ""], ["red", "bus", "car"]])
        labels = np.array([[1.0], [0.0], [1.0]], np.float32)
        emb = tk.EmbeddingBag(None, 4, mask_zero=True, combiner="sum", name="words")
        sm = keras.Sequential([keras.Input((3,), dtype="string"), emb])
        sm.compile(optimizer=tk.Optimizer(c), loss="mse")
        sm.fit(words, np.repeat(labels, 4, 1), batch_size=3, epochs=3, verbose=0)
        keys = tf.strings.to_hash_bucket_fast(["red", "car", "blue", "bus"],
                                              (1 << 63) - 1).numpy()
        rows = c.pull_rows("words", keys, read_only=True)
        np.testing.assert_allclose(sm.predict(words, verbose=0),
                                   np.stack([rows[0] + rows[1], rows[2],
                                             rows[0] + rows[3] + rows[1]]), atol=1e-6)
        assert sum(t["rows"] for st in c.status() for t in st.tables
                   if t["name"] == "words") == 4                # "" made no row
    assert tk.Embedding(None, 4, mask_zero=True).compute_mask(
        tf.constant([["a", ""]])).numpy().tolist() == [[True, False]]
    with pytest.raises(ValueError, match="string ids need an unbounded table"):
        tk.Embedding(10, 4)(tf.constant([["a"]]))
    with pytest.raises(ValueError, match="combiner 'max'"):
        tk.Embedding(10, 4, combiner="max")
    with pytest.raises(ValueError, match="EmbeddingBag: combiner must be"):
        tk.EmbeddingBag(10, 4, combiner=None)
    again = tk.EmbeddingBag.from_config(tk.EmbeddingBag(10, 4, combiner="sqrtn").get_config())
    assert isinstance(again, tk.EmbeddingBag) and again.combiner == "sqrtn"
