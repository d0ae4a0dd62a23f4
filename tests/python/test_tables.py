"""Embedding tables through tessera.Client against real shards: rows in the caller's order,
duplicate keys, exact sums, sync averaging over workers, and the errors a user meets."""
from __future__ import annotations

import threading

import numpy as np
import pytest

import tessera

ASYNC = 'job = { mode = "async"; };\noptimizer = { name = "sgd"; learning_rate = 1.0; };\n'
SYNC = 'job = { mode = "sync"; };\noptimizer = { name = "sgd"; learning_rate = 1.0; };\n'


def test_rows_in_callers_order_and_exact_sums(cluster):
    cl = cluster(2, 1, ASYNC)
    with tessera.Client(cl.config, timeout=10) as c:
        c.declare({}, tables={"users": tessera.Table(4, init="zeros", optimizer="sgd",
                                                     learning_rate=1.0)})
        assert c.tables == {"users": 4}
        keys = np.array([7, -3, 7, 2**40, 0], dtype=np.int64)
        rows = c.pull_rows("users", keys)
        assert rows.shape == (5, 4) and rows.dtype == np.float32 and not rows.any()
        grads = (np.arange(20, dtype=np.float32).reshape(5, 4) / 4)
        res = c.push_rows("users", keys, grads)
        assert isinstance(res, tessera.RowsPushResult) and res.rows_filtered == 0
        assert res.applied >= 1 and res.stale == 0
        after = c.pull_rows("users", [7, -3, 2**40, 0, 7])
        np.testing.assert_array_equal(after[0], -(grads[0] + grads[2]))   # duplicates summed
        np.testing.assert_array_equal(after[4], after[0])
        np.testing.assert_array_equal(after[1], -grads[1])
        np.testing.assert_array_equal(after[2], -grads[3])
        # push_pull_rows: one round trip, the rows after the push.
        out = np.empty((1, 4), dtype=np.float32)
        got = c.push_pull_rows("users", [0], np.ones((1, 4), np.float32), into=out)
        assert got is out
        np.testing.assert_array_equal(out[0], -grads[4] - 1)


def test_same_rows_on_any_shard_count(cluster):
    keys = np.arange(-50, 50, dtype=np.int64) * 104729
    got = []
    for shards in (1, 3):
        cl = cluster(shards, 1, ASYNC)
        with tessera.Client(cl.config, timeout=10) as c:
            c.declare({}, seed=5, tables={"emb": tessera.Table(8, init="normal", init_scale=0.1)})
            got.append(c.pull_rows("emb", keys))
    np.testing.assert_array_equal(got[0], got[1])
    assert 0.05 < float(got[0].std()) < 0.2


def test_table_keys(cluster):
    """Client.table_keys: the ids of the rows over every shard, ascending, each once;
    read-only pulls add none; a table growing between two listings lists the new ids too;
    an unknown table is refused."""
    cl = cluster(2, 1, ASYNC)
    with tessera.Client(cl.config, timeout=10) as c:
        c.declare({}, tables={"emb": tessera.Table(4), "other": tessera.Table(2)})
        empty = c.table_keys("emb")
        assert empty.dtype == np.int64 and empty.shape == (0,)
        ids = np.array([2**62, -7, 3, 3, 0, -2**63 + 5, 11], dtype=np.int64)
        c.pull_rows("emb", ids)
        c.pull_rows("emb", [99, 100], read_only=True)   # makes no row
        got = c.table_keys("emb")
        np.testing.assert_array_equal(got, np.unique(ids))
        assert c.table_keys("other").size == 0
        more = np.arange(5000, dtype=np.int64) * 7919 + 1
        c.pull_rows("emb", more)
        np.testing.assert_array_equal(c.table_keys("emb"), np.union1d(ids, more))
        with pytest.raises(tessera.UnknownTable):
            c.table_keys("nope")


def test_read_only_pull_changes_nothing(cluster):
    """read_only=True (evaluation, export): keys without a row read the initializer's row
    and no row is made; an admission by count sees no sighting; existing rows read as
    they are."""
    cl = cluster(2, 1, ASYNC)
    with tessera.Client(cl.config, timeout=10) as c:
        c.declare({}, seed=3, tables={"emb": tessera.Table(4, init="uniform", init_scale=0.5),
                                      "gated": tessera.Table(4, admit_count=2)})
        rows = lambda name: sum(t["rows"] for st in c.status() for t in st.tables  # noqa: E731
                                if t["name"] == name)
        keys = np.arange(1000, dtype=np.int64) * 7919
        peeked = c.pull_rows("emb", keys, read_only=True)
        assert rows("emb") == 0 and 0.2 < float(np.abs(peeked).max()) <= 0.5
        made = c.pull_rows("emb", keys[:10])
        np.testing.assert_array_equal(made, peeked[:10])     # the row it would have been
        assert rows("emb") == 10
        c.push_rows("emb", keys[:1], np.ones((1, 4), np.float32))
        again = c.pull_rows("emb", keys[:20], read_only=True)
        np.testing.assert_array_equal(again[0], peeked[0] - 1)
        np.testing.assert_array_equal(again[1:], peeked[1:20])
        assert rows("emb") == 10
        # Two read-only pulls are no sightings: the key is still not admitted.
        for _ in range(2):
            c.pull_rows("gated", [5], read_only=True)
        assert rows("gated") == 0
        c.pull_rows("gated", [5])
        c.pull_rows("gated", [5])
        assert rows("gated") == 1


def test_sync_two_workers_average(cluster):
    """2 workers with batch B give the rows one worker with batch 2B gives (SGD: the mean
    of the step's gradients)."""
    cl = cluster(2, 2, SYNC)
    keys = [np.array([1, 2, 2, 9], np.int64), np.array([2, 5, 9, 9], np.int64)]
    grads = [np.full((4, 3), w + 1, np.float32) for w in range(2)]
    errors = []

    def work(w: int) -> None:
        try:
            with tessera.Client(cl.config, task=w, timeout=20) as c:
                c.declare({}, tables={"t": tessera.Table(3, init="zeros")})
                c.pull_rows("t", keys[w])
                r = c.push_rows("t", keys[w], grads[w])
                assert r.accumulated + r.applied == 2 and r.stale == 0
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    with tessera.Client(cl.config, task=0, timeout=20) as c:
        c.declare({}, tables={"t": tessera.Table(3, init="zeros")})
        rows = c.pull_rows("t", [1, 2, 5, 9], min_version=1)
    # Sum over both workers' occurrences, divided by the 2 gradients of the step, lr 1.
    want = {1: 1 * 1, 2: 2 * 1 + 1 * 2, 5: 1 * 2, 9: 1 * 1 + 2 * 2}
    for i, k in enumerate([1, 2, 5, 9]):
        np.testing.assert_array_equal(rows[i], np.full(3, -want[k] / 2, np.float32))


def test_errors(cluster):
    cl = cluster(2, 1, ASYNC)
    with tessera.Client(cl.config, timeout=10) as c:
        c.declare({}, tables={"t": 2})
        with pytest.raises(tessera.UnknownTable, match="no table 'nope'"):
            c.pull_rows("nope", [1])
        with pytest.raises(tessera.ShapeError):
            c.push_rows("t", [1, 2], np.zeros((2, 3), np.float32))
        with pytest.raises(ValueError, match="integers"):
            c.pull_rows("t", [1.5])
        with pytest.raises(ValueError, match="writable"):
            c.pull_rows("t", [1], into=np.zeros((1, 2), np.float64))
        with pytest.raises(ValueError, match="dim"):
            tessera.Table(0).wire("x")
        # A redeclare with another width is the shards' ShapeError.
        with tessera.Client(cl.config, timeout=10) as c2:
            with pytest.raises(tessera.ShapeError):
                c2.declare({}, tables={"t": 3})
