"""tessera.keras.Embedding in saved models, and at a vocabulary of ten million.

- model.save writes the trained rows of a bounded vocabulary, read from the shards without
  changing them; keras.saving.load_model gives a model that predicts as the trained one
  did, with no shards; training the loaded layer on shards is refused unless asked for;
  an unbounded table warns that its rows are not in the file.
- Embedding(10_000_000, 32) on 2 shards + 2 worker processes: the shards' traffic is the
  rows the batches touched (within 1.5 x) and their memory grows with the rows touched,
  not with input_dim.
Skipped where TensorFlow cannot be imported.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
import warnings
from pathlib import Path

import numpy as np
import pytest

import tessera
from conftest import tf_missing

HERE = Path(__file__).resolve().parent
_why = tf_missing()
pytestmark = pytest.mark.skipif(bool(_why), reason=_why or "-")

ASYNC = ('job = { mode = "async"; };\n'
         'optimizer = { name = "sgd"; learning_rate = 0.5; };\n'
         'model = { seed = 4; };\n')


def _model(keras, tk, vocab, name="emb"):
    return keras.Sequential([
        keras.Input((4,), dtype="int64"),
        tk.Embedding(vocab, 8, name=name),
        keras.layers.GlobalAveragePooling1D(name="mean"),
        keras.layers.Dense(1, activation="sigmoid", name="out",
                           kernel_initializer=keras.initializers.GlorotUniform(seed=1)),
    ], name="saved")


def _rows(c, name, key="rows"):
    return sum(t[key] for st in c.status() for t in st.tables if t["name"] == name)


def test_save_and_load_model_with_trained_rows(cluster, tmp_path):
    import keras
    import tessera.keras as tk
    rng = np.random.default_rng(5)
    x = rng.integers(0, 300, (512, 4)).astype(np.int64)       # ids 300..999 never seen
    y = (x.mean(1) > 150).astype(np.float32)[:, None]
    cl = cluster(2, 1, ASYNC)
    with tessera.Client(str(cl.config), task=0) as c:
        m = _model(keras, tk, 1000)
        m.compile(optimizer=tk.Optimizer(c), loss="binary_crossentropy")
        m.fit(x, y, batch_size=64, epochs=3, verbose=0)
        trained = _rows(c, "emb")
        assert 0 < trained <= 300
        probe = np.concatenate([x[:64], rng.integers(300, 1000, (16, 4))])
        want = m.predict(probe, verbose=0)
        path = tmp_path / "model.keras"
        m.save(path)
        assert _rows(c, "emb") == trained        # saving made no rows (read-only)
        table = c.pull_rows("emb", np.arange(1000), min_version=0, read_only=True)
    # No shards now: the loaded model predicts from the rows in the file.
    loaded = keras.saving.load_model(path)
    layer = loaded.get_layer("emb")
    assert isinstance(layer, tk.Embedding) and layer.loaded_rows.shape == (1000, 8)
    np.testing.assert_array_equal(layer.loaded_rows, table)
    np.testing.assert_allclose(loaded.predict(probe, verbose=0), want, atol=1e-6)
    again = tmp_path / "again.keras"                          # saved again, still the rows
    loaded.save(again)
    np.testing.assert_array_equal(
        keras.saving.load_model(again).get_layer("emb").loaded_rows, table)
    # Trained on shards, the loaded rows would be dropped: refused unless asked for.
    cl2 = cluster(1, 1, ASYNC)
    with tessera.Client(str(cl2.config), task=0) as c:
        loaded.compile(optimizer=tk.Optimizer(c), loss="binary_crossentropy")
        with pytest.raises(ValueError, match=r"loaded from a saved model.*use_shard_rows"):
            loaded.fit(x, y, batch_size=64, epochs=1, verbose=0)
        layer.use_shard_rows()
        loaded.compile(optimizer=tk.Optimizer(c), loss="binary_crossentropy")
        loaded.fit(x, y, batch_size=64, epochs=1, verbose=0)
        assert layer.loaded_rows is None and _rows(c, "emb") > 0
    # An unbounded table: the file holds no rows, and saving says so.
    cl3 = cluster(1, 1, ASYNC)
    with tessera.Client(str(cl3.config), task=0) as c:
        m = _model(keras, tk, None, name="hashed")
        m.compile(optimizer=tk.Optimizer(c), loss="binary_crossentropy")
        m.fit(x, y, batch_size=64, epochs=1, verbose=0)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            m.save(tmp_path / "unbounded.keras")
        assert any("export_table()" in str(w.message) for w in caught)
        np.testing.assert_array_equal(m.get_layer("hashed").export_rows([3, 7]),
                                      c.pull_rows("hashed", [3, 7], read_only=True))
        # export_table: the ids the shards hold (listed by them) and exactly their rows
        ids, rows = m.get_layer("hashed").export_table()
        assert ids.dtype == np.int64 and ids.size == _rows(c, "hashed") > 0
        np.testing.assert_array_equal(ids, np.unique(ids))
        np.testing.assert_array_equal(rows, c.pull_rows("hashed", ids, read_only=True))


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _wire_bytes(cl):
    """Bytes the shards received and sent, from their /metrics."""
    got = [0.0, 0.0]
    for port in cl.http_ports:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            for line in r.read().decode().splitlines():
                for i, name in enumerate(("tessera_ps_received_bytes_total ",
                                          "tessera_ps_sent_bytes_total ")):
                    if line.startswith(name):
                        got[i] += float(line.split()[1])
    return got


def test_ten_million_ids_cost_the_rows_touched(cluster):
    """Embedding(10_000_000, 32): a dense table would be 1.2 GiB per copy; the shards hold
    and move only the rows the batches touched."""
    vocab, dim, batch, steps = 10_000_000, 32, 256, 40
    cl = cluster(2, 2, 'job = { mode = "sync"; };\n'
                       'optimizer = { name = "sgd"; learning_rate = 0.5; };\n')
    rss0 = sum(_rss_kib(p.pid) for p in cl.procs)
    in0, out0 = _wire_bytes(cl)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    procs = [subprocess.Popen([sys.executable, str(HERE / "embedding_worker.py"),
                               str(cl.config), str(t), "2", str(batch), str(steps),
                               str(cl.dir / f"w{t}.json"), str(vocab), str(dim)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for t in range(2)]
    try:
        for p in procs:
            out, _ = p.communicate(timeout=600)
            assert p.returncode == 0, out.decode(errors="replace")[-3000:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    res = [json.loads((cl.dir / f"w{t}.json").read_text()) for t in range(2)]
    rx, tx = (b - b0 for b, b0 in zip(_wire_bytes(cl), (in0, out0)))
    touched = sum(sum(r["uniq"]) for r in res)           # rows each worker's steps touched
    with tessera.Client(str(cl.config), task=0) as c:
        pulled, pushed = _rows(c, "emb", "pulled_rows"), _rows(c, "emb", "pushed_rows")
        held = _rows(c, "emb")
        table_bytes = _rows(c, "emb", "bytes")
    rss = sum(_rss_kib(p.pid) for p in cl.procs) - rss0
    row = dim * 4
    print(f"\n10M x {dim}: {touched / steps:.0f} rows touched per step (2 workers), shards "
          f"pulled {pulled / steps:.0f} and pushed {pushed / steps:.0f} per step "
          f"({pulled * row / steps / 1024:.0f} KiB/step; the table would be "
          f"{vocab * row / 2**30:.2f} GiB); {held} rows held, {table_bytes / 2**20:.1f} MiB "
          f"in tables, shards' RSS +{rss / 1024:.1f} MiB; the shards received "
          f"{rx / touched / row:.3f} x and sent {tx / touched / row:.3f} x the touched rows' "
          f"bytes")
    assert all(r["steps"] == steps for r in res)
    # Rows: each worker pulls its batch's distinct ids; the shards apply each row once a
    # step (the workers' gradients of a row summed first).
    assert touched == pulled and pushed <= touched
    # Bytes on the wire, all frames counted (keys, rows, gradients, heartbeats, replies).
    assert touched * row <= rx <= 1.5 * touched * row, (rx, touched * row)
    assert touched * row <= tx <= 1.5 * touched * row, (tx, touched * row)
    # Memory: the rows made (distinct ids seen), never the vocabulary.
    assert held <= touched
    assert table_bytes <= 4 * held * (row + 64) + (16 << 20)
    assert rss * 1024 < 0.1 * vocab * row, rss
