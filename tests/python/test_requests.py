"""Requests against real shards: exact sums, sync averaging, errors, requests in flight."""
from __future__ import annotations

import array
import sys
import threading

import numpy as np
import pytest

import tessera

SGD1 = 'optimizer = { name = "sgd"; learning_rate = 1.0; };\n'
# 16-byte partitions: every tensor below spreads over both shards, in several partitions.
ASYNC = 'job = { mode = "async"; partition_bytes = 16; };\n' + SGD1
MODEL = {"dense/kernel": (5, 3), "dense/bias": (3,), "out/kernel": (3, 2)}


def grads_for(worker: int, k: int):
    """Small integers (and halves): every sum of them is exact in float32."""
    rng = np.random.default_rng(1000 * worker + k)
    return {n: (rng.integers(-8, 9, size=s) / 2).astype(np.float32) for n, s in MODEL.items()}


def test_config_file_and_declare(cluster):
    cl = cluster(2, 1, ASYNC)
    with tessera.Client(cl.config, timeout=10) as c:
        assert c.mode == "async" and c.num_shards == 2 and c.task == 0
        params = c.declare(MODEL, seed=7)
        assert list(params) == list(MODEL) and c.tensors == list(MODEL)
        assert all(params[n].shape == s and params[n].dtype == np.float32
                   for n, s in MODEL.items())
        assert len(c.plan()) > len(MODEL)          # split into several partitions
        c.pull(params)
        assert np.all(params["dense/bias"] == 0)   # rank 1: zeros
        k = params["dense/kernel"]
        assert np.any(k != 0) and np.all(np.abs(k) <= np.sqrt(6 / (5 + 3)) + 1e-6)
        # The same seed on another client: the same values (deterministic init).
        with tessera.Client(cluster=cl.addrs, timeout=10) as c2:
            again = c2.pull(c2.declare(MODEL, seed=7) and None)
            assert all(np.array_equal(again[n], params[n]) for n in MODEL)


def test_async_exact_sums_concurrent_clients(cluster):
    cl = cluster(2, 4, ASYNC)
    workers, steps = 4, 25
    with tessera.Client(cluster=cl.addrs, timeout=20) as c0:
        init = c0.pull(c0.declare(MODEL, init="ones"))
    errors = []

    def work(w: int) -> None:
        try:
            with tessera.Client(cluster=cl.addrs, task=w, timeout=20) as c:
                bufs = c.declare(MODEL, init="ones")
                for k in range(steps):
                    c.pull(bufs)
                    c.push(grads_for(w, k))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    total = {n: np.zeros(s, np.float32) for n, s in MODEL.items()}
    for w in range(workers):
        for k in range(steps):
            for n, g in grads_for(w, k).items():
                total[n] += g
    with tessera.Client(cluster=cl.addrs, timeout=20) as c:
        final = c.pull(c.declare(MODEL, init="ones"))
    for n in MODEL:
        np.testing.assert_array_equal(final[n], init[n] - total[n])
    assert all(np.all(init[n] == 1) for n in MODEL)


def test_sync_average_of_two_workers(cluster):
    cl = cluster(2, 2, 'job = { mode = "sync"; partition_bytes = 16; sync_timeout_s = 30.0; };\n'
                       'optimizer = { name = "sgd"; learning_rate = 0.5; };\n')
    steps = 3
    results = {}
    errors = []

    def work(w: int) -> None:
        try:
            with tessera.Client(cluster=cl.addrs, task=w, timeout=30) as c:
                bufs = c.declare(MODEL, init="ones")
                c.pull(bufs)
                results[(w, "init")] = {n: a.copy() for n, a in bufs.items()}
                for k in range(steps):
                    c.push(grads_for(w, k))
                    c.pull(bufs)                # sync: waits for the next version
                    results[(w, k)] = {n: a.copy() for n, a in bufs.items()}
                    assert c.last_version == k + 1
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    expect = {n: a.copy() for n, a in results[(0, "init")].items()}
    for k in range(steps):
        g0, g1 = grads_for(0, k), grads_for(1, k)
        for n in MODEL:
            expect[n] = (expect[n] - np.float32(0.5) * ((g0[n] + g1[n]) / np.float32(2))
                         ).astype(np.float32)
            for w in range(2):              # halves and quarters: exact in float32
                np.testing.assert_array_equal(results[(w, k)][n], expect[n])


def test_push_pull_sync(cluster):
    cl = cluster(1, 1, 'job = { mode = "sync"; };\n' + SGD1)
    with tessera.Client(cluster=cl.addrs, timeout=10) as c:
        p = c.declare({"w": (2, 2)}, init="zeros")
        c.pull(p)
        g = {"w": np.ones((2, 2), np.float32)}
        for k in range(3):
            r = c.push_pull(g, p)
            assert r.version == k + 1
            np.testing.assert_array_equal(p["w"], -(k + 1))
        with pytest.raises(ValueError, match="same tensors"):
            c.push_pull(g, {})


def test_several_requests_in_flight(cluster):
    cl = cluster(2, 1, ASYNC)
    with tessera.Client(cluster=cl.addrs, timeout=10) as c:
        p = c.declare(MODEL, init="zeros")
        rounds = 5
        reqs = []
        for k in range(rounds):
            g = grads_for(0, k)
            # one push per tensor, last layer first, as backpropagation produces them
            for n in reversed(list(MODEL)):
                reqs.append((c.push({n: g[n]}, wait=False), g[n]))
        assert c.in_flight() >= 1
        assert c.clock == rounds       # every tensor pushed once per round
        for r, _ in reqs:
            res = r.wait()
            assert r.done and res.applied >= 1
        assert c.in_flight() == 0
        pulls = [c.pull({n: np.empty(s, np.float32)}, wait=False) for n, s in MODEL.items()]
        got = {}
        for r in pulls:
            got.update(r.wait())
        for n in MODEL:
            expect = -sum(grads_for(0, k)[n] for k in range(rounds))
            np.testing.assert_array_equal(got[n], expect)
            np.testing.assert_array_equal(c.pull()[n], expect)


def test_arrays_referenced_while_in_flight(cluster):
    import signal
    cl = cluster(1, 1, ASYNC)
    with tessera.Client(cluster=cl.addrs, timeout=10) as c:
        p = c.declare({"w": (1000,)}, init="zeros")
        g = np.ones(1000, np.float32)
        before = sys.getrefcount(g)
        cl.signal(0, signal.SIGSTOP)          # the push stays in flight
        r = c.push({"w": g}, wait=False)
        assert not r.done and sys.getrefcount(g) > before
        with pytest.raises(TimeoutError):
            r.wait(timeout=0.2)
        del r                                 # the client keeps it, and g, until done
        assert c.in_flight() == 1 and sys.getrefcount(g) > before
        del g                                 # ... so its memory is still there
        cl.signal(0, signal.SIGCONT)
        np.testing.assert_array_equal(c.pull(p)["w"], -1)   # in order after the push
        assert c.in_flight() == 0


def test_shape_errors_and_unknown_tensors(cluster):
    cl = cluster(2, 1, ASYNC)
    with tessera.Client(cluster=cl.addrs, timeout=10) as c:
        p = c.declare({"w": (4, 3), "b": (3,)})
        with pytest.raises(tessera.ShapeError, match="'w'.*12 elements"):
            c.push({"w": np.ones((4, 4), np.float32)})
        with pytest.raises(tessera.ShapeError):
            c.pull([p["w"]])                          # a list must cover every tensor
        with pytest.raises(tessera.UnknownTensor, match="nope"):
            c.push({"nope": np.ones(3, np.float32)})
        with pytest.raises(tessera.UnknownTensor, match="nope"):
            c.declare({"w": (4, 3), "b": (3,)}, init={"nope": "zeros"})
        with pytest.raises(ValueError, match="float32"):
            c.push({"b": np.ones(3, np.float64)})
        with pytest.raises(ValueError, match="C-contiguous"):
            c.pull({"w": np.ones((3, 4), np.float32).T})
        with pytest.raises(ValueError, match="read-only"):
            ro = np.ones(3, np.float32)
            ro.flags.writeable = False
            c.pull({"b": ro})
        p["w"].shape = (12,)                           # any shape of the right size
        c.pull({"w": p["w"]})
        # The C layer checks too (a buffer that is not an ndarray).
        with pytest.raises(tessera.ShapeError, match="12"):
            c._c.submit(tessera._client.PUSH, [0], [array.array("f", [0.0] * 4)], None,
                        0, 0, 0, 0.0)
        with pytest.raises(ValueError, match="float32"):
            c._c.submit(tessera._client.PUSH, [0], [bytearray(48)], None, 0, 0, 0, 0.0)
        # The job holds w as 4x3: another client declaring 4x4 is refused by the shards.
        with tessera.Client(cluster=cl.addrs, timeout=10) as c2:
            with pytest.raises(tessera.ShapeError) as ei:
                c2.declare({"w": (4, 4), "b": (3,)})
            assert ei.value.code == tessera._client.ESHAPE and ei.value.name == "ESHAPE"
    with pytest.raises(tessera.Interrupted):
        c.pull(p)                                      # closed
    with tessera.Client(cluster=cl.addrs, timeout=10) as c3:
        with pytest.raises(tessera.TesseraError, match="declare"):
            c3.pull([])


def test_library_logs_go_to_the_tessera_logger(cluster, caplog):
    import signal
    cl = cluster(1, 1, ASYNC)
    caplog.set_level("DEBUG", logger="tessera")
    with tessera.Client(cluster=cl.addrs, timeout=10) as c:
        p = c.declare({"w": 4})
        cl.signal(0, signal.SIGKILL)
        cl.procs[0].wait()
        with pytest.raises(tessera.Unavailable):
            c.pull(p, timeout=0.5)
        cl.start_shard(0)
        for _ in range(100):
            try:
                c.pull(p, timeout=1)
                break
            except tessera.Unavailable:
                pass
    recs = [r for r in caplog.records if r.name == "tessera"]
    assert recs, "no library log line reached logging"
    assert any(r.levelname in ("WARNING", "INFO", "ERROR") for r in recs)


def test_ssp_clock_and_status(cluster):
    cl = cluster(2, 2, 'job = { mode = "ssp"; staleness = 2; partition_bytes = 16; };\n' + SGD1)
    with tessera.Client(cluster=cl.addrs, timeout=10) as c:
        p = c.declare(MODEL, init="zeros")
        assert c.mode == "ssp"
        g = grads_for(0, 0)
        for k in range(2):                    # within the staleness bound of the idle worker
            c.pull(p)
            for n in MODEL:                   # one push per tensor: the clock moves once
                c.push({n: g[n]})
            assert c.clock == k + 1
        c.pull(p)
        for n in MODEL:
            np.testing.assert_array_equal(p[n], -2 * g[n])
        st = c.status()
        assert len(st) == 2 and all(s.mode == "ssp" for s in st)
        assert st[0].workers[0].clock >= 1
        # What this client never reported is None, as psctl's JSON null; no final accuracy yet.
        w0 = st[0].workers[0]
        assert w0.device is None and w0.reported is False and w0.state == "alive"
        assert st[0].final_test_accuracy is None and st[0].final_reporter is None
        c.set_progress(3, 0.5, 100.0, 0.25, False)
        c.heartbeat()
        w0 = c.status(0).workers[0]
        assert w0.reported is True and w0.loss == 0.5 and w0.step_known is True


def test_admin_checkpoint(cluster, tmp_path):
    cl = cluster(1, 1, 'job = { mode = "async"; };\n' + SGD1 +
                 f'checkpoint = {{ dir = "{tmp_path}"; interval_s = 3600; }};\n')
    with tessera.Client(cluster=cl.addrs, timeout=10) as w:
        w.declare({"w": 4})
        w.push({"w": np.ones(4, np.float32)})
        with pytest.raises(tessera.PermissionDenied):
            w.checkpoint(0)
    with tessera.Client(cluster=cl.addrs, admin=True, timeout=10) as a:
        path, step = a.checkpoint(0)
        assert path.startswith(str(tmp_path)) and step == 1
