"""psctl export and tessera.load_weights: LeNet-5 trained by ps-worker on real shards,
exported as safetensors and as .npz, loaded into the equivalent Keras model, which then
scores the test accuracy the worker reported for the final parameters (to 1e-4: the same
10,000 predictions but at most one). Then what is refused, and how: load_weights' missing,
extra and mis-shaped names, and psctl export's usage errors, an unwritable file and shards
that are down.

The Keras tests skip (with the reason printed by run_pytest.sh's -rs) where TensorFlow cannot
be imported, the LeNet-5 ones where Debian's dataset-fashion-mnist is missing. About 40 s on
2 cores, most of it importing TensorFlow.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

import tessera
from conftest import BUILD, ROOT
from test_keras import _why

needs_tf = pytest.mark.skipif(bool(_why), reason=_why or "-")

DATA = Path("/usr/share/datasets/fashion-mnist")
PSCTL = BUILD / "psctl" / "psctl"
PS_WORKER = BUILD / "worker" / "ps-worker"
STEPS = 60

needs_data = pytest.mark.skipif(not (DATA / "t10k-labels-idx1-ubyte.gz").exists(),
                                reason=f"{DATA} missing (Debian's dataset-fashion-mnist)")


def _lenet5_job() -> str:
    """deploy/local/lenet5.cfg without its cluster (the fixture's) and a short run."""
    text = (ROOT / "deploy" / "local" / "lenet5.cfg").read_text()
    text = re.sub(r"^cluster = \{.*?^\};\n", "", text, flags=re.S | re.M)
    text, n = re.subn(r"max_steps = 0;", f"max_steps = {STEPS};", text)
    assert n == 1 and "cluster = {" not in text
    return text


def _keras_lenet5(keras, fc3_units: int = 10, fc1_name: str = "fc1"):
    """LeNet-5 as the job file describes it, its layers named as ps-worker names them."""
    return keras.Sequential([
        keras.Input((28, 28, 1)),
        keras.layers.Conv2D(6, 5, padding="same", activation="relu", name="conv1"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Conv2D(16, 5, activation="relu", name="conv2"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Flatten(),
        keras.layers.Dense(120, activation="relu", name=fc1_name),
        keras.layers.Dense(84, activation="relu", name="fc2"),
        keras.layers.Dense(fc3_units, name="fc3"),
    ], name="lenet5")


def _test_set():
    from test_keras_cnn import _example
    ex = _example()
    x = ex.read_idx(str(DATA / "t10k-images-idx3-ubyte.gz")).astype(np.float32) / 255.0
    y = ex.read_idx(str(DATA / "t10k-labels-idx1-ubyte.gz"))
    return x.reshape(-1, 28, 28, 1), y


def _psctl(config, *args):
    return subprocess.run([str(PSCTL), "-c", str(config), *args], capture_output=True,
                          text=True, timeout=120)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A LeNet-5 job trained for STEPS steps by one ps-worker on 2 shards, still up:
    (cluster, the worker's final test accuracy)."""
    from conftest import Cluster
    if not (DATA / "t10k-labels-idx1-ubyte.gz").exists():
        pytest.skip(f"{DATA} missing (Debian's dataset-fashion-mnist)")
    c = Cluster(num_shards=2, num_workers=1, extra=_lenet5_job())
    try:
        w = subprocess.run([str(PS_WORKER), "-c", str(c.config), "--task", "0"],
                           capture_output=True, text=True, timeout=600)
        assert w.returncode == 0, w.stderr[-3000:]
        done = [line for line in w.stdout.splitlines() if line.startswith("done:")]
        assert done, w.stdout
        m = re.search(r"final_test_accuracy=([0-9.]+)", done[0])
        assert m, done[0]
        assert f"steps={STEPS}" in done[0]
        yield c, float(m.group(1))
    finally:
        c.stop()


@needs_tf
@needs_data
@pytest.mark.parametrize("fmt", ["safetensors", "npz"])
def test_round_trip_lenet5(trained, tmp_path, fmt):
    import keras
    c, worker_acc = trained
    out = tmp_path / f"lenet5.{fmt}"
    r = _psctl(c.config, "export", "--format", fmt, "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert f"exported 10 tensor(s), 0 table(s)" in r.stdout and f"at step {STEPS}" in r.stdout
    arrays, meta = tessera.read_weights(out)
    assert arrays["conv1/kernel"].shape == (5, 5, 1, 6)
    assert arrays["fc1/kernel"].shape == (400, 120)
    assert all(a.dtype == np.float32 for a in arrays.values())
    assert meta["format"] == "tessera" and meta["tessera.step"] == str(STEPS)
    job = json.loads(meta["tessera.job"])
    assert job["optimizer.name"] == '"adam"' and "conv1=conv2d(6,5x5" in job["model.layers"]
    assert json.loads(meta["tessera.state_tensors"]) == []

    model = _keras_lenet5(keras)
    loaded = tessera.load_weights(out, model)
    assert sorted(loaded) == sorted(arrays)
    x, y = _test_set()
    logits = model.predict(x, batch_size=1000, verbose=0)
    acc = float(np.mean(np.argmax(logits, axis=1) == y))
    print(f"{fmt}: Keras {acc:.4f}, ps-worker {worker_acc:.6f}")
    assert abs(acc - worker_acc) <= 1e-4 + 1e-9, (acc, worker_acc)


@needs_tf
@needs_data
def test_load_weights_refuses_what_does_not_match(trained, tmp_path):
    import keras
    c, _ = trained
    out = tmp_path / "m.safetensors"
    assert _psctl(c.config, "export", "--format", "safetensors", "-o", str(out)).returncode == 0
    # a shape that differs: nothing is assigned
    model = _keras_lenet5(keras, fc3_units=12)
    before = model.get_layer("conv1").kernel.numpy().copy()
    with pytest.raises(ValueError, match=r"fc3/kernel: the file's shape is \[84, 10\], the "
                                         r"model's \[84, 12\]"):
        tessera.load_weights(out, model)
    assert np.array_equal(model.get_layer("conv1").kernel.numpy(), before)
    # a layer named otherwise: missing from the file, extra in it
    model = _keras_lenet5(keras, fc1_name="dense")
    with pytest.raises(ValueError, match=r"\['lenet5/dense/kernel', 'lenet5/dense/bias'\] are "
                                         r"not in .* holds \['fc1/bias', 'fc1/kernel'\]"):
        tessera.load_weights(out, model)
    # strict=False: the rest is loaded
    loaded = tessera.load_weights(out, model, strict=False)
    assert "fc1/kernel" not in loaded and len(loaded) == 8
    assert np.array_equal(model.get_layer("conv1").kernel.numpy(),
                          tessera.read_weights(out)[0]["conv1/kernel"])
    # not an export at all
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\xff" * 64)
    with pytest.raises(ValueError, match="not a safetensors file"):
        tessera.read_weights(junk)


def test_export_errors(trained, tmp_path):
    c, _ = trained
    r = _psctl(c.config, "export", "--format", "onnx", "-o", str(tmp_path / "m"))
    assert r.returncode == 2 and "--format takes safetensors or npz, not 'onnx'" in r.stderr
    r = _psctl(c.config, "export", "--format", "npz")
    assert r.returncode == 2 and "export needs -o FILE" in r.stderr
    r = _psctl(c.config, "status", "--format", "npz")
    assert r.returncode == 2 and "status has no --format" in r.stderr
    r = _psctl(c.config, "export", "--format", "npz", "--vocab", "emb=0", "-o",
               str(tmp_path / "m"))
    assert r.returncode == 2 and "--vocab takes TABLE=N" in r.stderr
    r = _psctl(c.config, "export", "--format", "npz", "--vocab", "emb=10", "-o",
               str(tmp_path / "m"))
    assert r.returncode == 2 and "no table of that name" in r.stderr
    r = _psctl(c.config, "export", "--format", "npz", "--shard", "0", "-o", str(tmp_path / "m"))
    assert r.returncode == 2 and "export reads every shard" in r.stderr
    r = _psctl(c.config, "export", "--format", "npz", "-w", "-o", str(tmp_path / "m"))
    assert r.returncode == 2 and "export has no --watch" in r.stderr
    # an unwritable file: nothing left behind
    r = _psctl(c.config, "export", "--format", "npz", "-o", str(tmp_path / "no" / "m.npz"))
    assert r.returncode == 1 and "cannot write" in r.stderr and "No such file" in r.stderr
    assert not (tmp_path / "no").exists()
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o500)
    try:
        r = _psctl(c.config, "export", "--format", "safetensors", "-o", str(d / "m.safetensors"))
        if os.geteuid() != 0:  # root writes anywhere
            assert r.returncode == 1 and "cannot write" in r.stderr
    finally:
        d.chmod(0o700)


def test_export_without_shards(cluster, tmp_path):
    c = cluster(num_shards=2)
    c.signal(1, 15)
    c.procs[1].wait(10)
    r = _psctl(c.config, "export", "--format", "npz", "-o", str(tmp_path / "m.npz"))
    assert r.returncode == 1 and "shard 1" in r.stderr and "is down" in r.stderr, r.stderr
    assert not (tmp_path / "m.npz").exists()
    # the shard that is up holds no model: said so
    c2 = cluster(num_shards=1)
    r = _psctl(c2.config, "export", "--format", "npz", "-o", str(tmp_path / "m.npz"))
    assert r.returncode == 1 and "holds no model" in r.stderr, r.stderr


def test_export_tables_and_state(cluster, tmp_path):
    """A model of a dense tensor, a state tensor and a table, trained a little through the
    Python client: the export holds exactly what the shards hold, the table as a dense
    matrix of ids 0..N-1 (--vocab) or, without --vocab, as emb/ids (the ids its rows have)
    and emb/rows, and names the state tensor in its metadata."""
    c = cluster(2, 1, 'job = { mode = "async"; partition_bytes = 64; };\n'
                      'optimizer = { name = "sgd"; learning_rate = 1.0; };\n')
    with tessera.Client(c.config, timeout=10) as cl:
        params = cl.declare({"w": (3, 7), "bn/moving_mean": tessera.Tensor((5,), "zeros",
                                                                            kind="state")},
                            tables={"emb": tessera.Table(4, init="uniform", init_scale=0.5,
                                                         optimizer="sgd", learning_rate=1.0)})
        cl.push({"w": np.arange(21, dtype=np.float32).reshape(3, 7) / 8})
        cl.push_rows("emb", [0, 3, 5], np.ones((3, 4), np.float32))
        cl.pull(params)
        rows = cl.pull_rows("emb", np.arange(6))
    for fmt in ("safetensors", "npz"):
        out = tmp_path / f"ids.{fmt}"
        r = _psctl(c.config, "export", "--format", fmt, "-o", str(out))
        assert r.returncode == 0, r.stderr
        arrays, _ = tessera.read_weights(out)
        assert sorted(arrays) == ["bn/moving_mean", "emb/ids", "emb/rows", "w"]
        ids = arrays["emb/ids"]
        assert ids.dtype == np.int64 and set([0, 3, 5]) <= set(ids.tolist()) <= set(range(6))
        assert list(ids) == sorted(ids)
        np.testing.assert_array_equal(arrays["emb/rows"], rows[ids])
    for fmt in ("safetensors", "npz"):
        out = tmp_path / f"m.{fmt}"
        r = _psctl(c.config, "export", "--format", fmt, "--vocab", "emb=6", "-o", str(out))
        assert r.returncode == 0, r.stderr
        assert "exported 2 tensor(s), 1 table(s)" in r.stdout
        arrays, meta = tessera.read_weights(out)
        assert sorted(arrays) == ["bn/moving_mean", "emb", "w"]
        np.testing.assert_array_equal(arrays["w"], params["w"])
        np.testing.assert_array_equal(arrays["bn/moving_mean"], np.zeros(5, np.float32))
        np.testing.assert_array_equal(arrays["emb"], rows)
        assert json.loads(meta["tessera.state_tensors"]) == ["bn/moving_mean"]


@needs_tf
def test_export_ids_into_keras_embedding(cluster, tmp_path):
    """A table exported as ids + rows (no --vocab) loads into a bounded Keras Embedding of
    the table's name: the listed ids' rows set, the others kept; ids past its vocabulary
    are refused; an unbounded table's arrays are extra unless strict=False."""
    import keras
    c = cluster(2, 1, 'job = { mode = "async"; };\n'
                      'optimizer = { name = "sgd"; learning_rate = 1.0; };\n')
    with tessera.Client(c.config, timeout=10) as cl:
        cl.declare({}, tables={"lookup/embeddings": tessera.Table(4, init="uniform",
                                                                  init_scale=0.5)})
        cl.push_rows("lookup/embeddings", [1, 4], np.ones((2, 4), np.float32))
        rows = cl.pull_rows("lookup/embeddings", [1, 4], read_only=True)
    out = tmp_path / "t.safetensors"
    r = _psctl(c.config, "export", "--format", "safetensors", "-o", str(out))
    assert r.returncode == 0, r.stderr
    model = keras.Sequential([keras.Input((1,)),
                              keras.layers.Embedding(6, 4, name="lookup",
                                                     embeddings_initializer="zeros")])
    assert tessera.load_weights(out, model) == ["lookup/embeddings"]
    got = model.get_layer("lookup").embeddings.numpy()
    np.testing.assert_array_equal(got[[1, 4]], rows)
    assert not got[[0, 2, 3, 5]].any()
    small = keras.Sequential([keras.Input((1,)),
                              keras.layers.Embedding(3, 4, name="lookup")])
    with pytest.raises(ValueError, match="outside the model's vocabulary 0..2"):
        tessera.load_weights(out, small)
    other = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, name="d")])
    with pytest.raises(ValueError, match="strict=False to skip them"):
        tessera.load_weights(out, other)
    assert tessera.load_weights(out, other, strict=False) == []
