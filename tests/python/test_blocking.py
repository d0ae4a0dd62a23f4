"""Blocking calls: deadlines, Ctrl-C, and memory (no copies)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import tessera

SGD1 = 'optimizer = { name = "sgd"; learning_rate = 1.0; };\n'


def test_stopped_shard_raises_unavailable_after_the_timeout(cluster):
    cl = cluster(2, 1, 'job = { mode = "async"; partition_bytes = 16; };\n' + SGD1)
    with tessera.Client(cluster=cl.addrs, timeout=1.0) as c:
        p = c.declare({"w": (8, 8)})
        c.pull(p)
        cl.signal(1, signal.SIGSTOP)
        t0 = time.monotonic()
        with pytest.raises(tessera.Unavailable) as ei:
            c.pull(p)
        took = time.monotonic() - t0
        assert isinstance(ei.value, tessera.DeadlineExceeded) and ei.value.code < 0
        assert "shard(s) 1" in str(ei.value)
        assert 0.8 <= took < 5.0, took
        with pytest.raises(tessera.Unavailable):
            c.push({"w": np.zeros((8, 8), np.float32)}, timeout=0.3)
        cl.signal(1, signal.SIGCONT)


@pytest.fixture(autouse=True)
def _python_sigint():
    """Python's own SIGINT handler during these tests, also where pytest started with
    SIGINT ignored (as a background job of a non-interactive shell is: Python then leaves
    it ignored, and no Ctrl-C could reach a call)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


def _sigint_in(delay: float, sent: list) -> threading.Timer:
    def fire() -> None:
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)
    t = threading.Timer(delay, fire)
    t.start()
    return t


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(),
                    reason="signals reach the main thread only")
def test_ctrl_c_interrupts_a_blocking_pull(cluster):
    # Two workers, one present: the sync pull of the next version waits for a barrier that
    # never closes (sync_timeout_s is long), and for the client's 60 s deadline.
    cl = cluster(1, 2, 'job = { mode = "sync"; sync_timeout_s = 600.0; };\n' + SGD1)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with tessera.Client(cluster=cl.addrs, timeout=60) as c:
        p = c.declare({"w": (256, 256)})
        c.pull(p)
        c.push({"w": np.ones((256, 256), np.float32)})
        sent: list = []
        timer = _sigint_in(0.3, sent)
        with pytest.raises(KeyboardInterrupt):
            c.pull(p)
        took = time.monotonic() - sent[0]
        timer.join()
        assert took < 0.5, f"KeyboardInterrupt {took:.3f} s after SIGINT"
        # The client was interrupted with it: nothing in flight writes into p["w"] any more
        # (test_interrupt.py has the rest).
        assert c.in_flight() == 0
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # untouched


def test_ctrl_c_interrupts_a_blocking_declare(cluster):
    cl = cluster(2, 1, 'job = { mode = "async"; };\n' + SGD1)
    with tessera.Client(cluster=cl.addrs, timeout=60) as c:
        cl.signal(1, signal.SIGSTOP)
        sent: list = []
        timer = _sigint_in(0.3, sent)
        with pytest.raises(KeyboardInterrupt):
            c.declare({"w": (4, 4)}, init="zeros")
        took = time.monotonic() - sent[0]
        timer.join()
        assert took < 0.5, took
        with pytest.raises(tessera.Busy):       # the declare still runs in the background
            c.declare({"w": (4, 4)}, init="zeros")
        cl.signal(1, signal.SIGCONT)
        for _ in range(200):                   # it finishes once the shard answers
            try:
                c.declare({"w": (4, 4)}, init="zeros")
                break
            except tessera.Busy:
                time.sleep(0.05)
        c.push({"w": np.ones((4, 4), np.float32)})
        np.testing.assert_array_equal(c.pull()["w"], -1)


NO_COPY = r"""
import json, resource, sys
import numpy as np
import tessera
n = 100 * 1024 * 1024                          # 400 MiB of float32
a = np.full(n, 0.5, np.float32)                # allocated and touched first
with tessera.Client(cluster=sys.argv[1:], timeout=120) as c:
    c.declare({"big": (n,)}, init="zeros")
    peak = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    before = peak()
    c.push({"big": a})
    after_push = peak()
    c.pull({"big": a})
    after_pull = peak()
    ok = bool(a[0] == -0.5 and a[-1] == -0.5)
print(json.dumps({"before": before, "after_push": after_push, "after_pull": after_pull,
                  "ok": ok}))
"""


def test_400mib_push_and_pull_do_not_copy(cluster):
    cl = cluster(2, 1, 'job = { mode = "async"; };\n' + SGD1)
    out = subprocess.run([sys.executable, "-c", NO_COPY, *cl.addrs], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["ok"]
    assert r["before"] > 400 * 1024                # KiB: the array is in the peak
    assert r["after_push"] <= r["before"] * 1.10, r
    assert r["after_pull"] <= r["before"] * 1.10, r


def test_ctrl_c_interrupts_opening(cluster):
    cl = cluster(2, 1, 'job = { mode = "async"; };\n' + SGD1)
    cl.signal(1, signal.SIGSTOP)              # accepts (the kernel does), never handshakes
    sent: list = []
    timer = _sigint_in(0.3, sent)
    with pytest.raises(KeyboardInterrupt):
        tessera.Client(cluster=cl.addrs, connect_timeout=30)
    took = time.monotonic() - sent[0]
    timer.join()
    assert took < 0.5, took
    cl.signal(1, signal.SIGCONT)
    with tessera.Client(cluster=cl.addrs, timeout=10) as c:   # the shards are fine
        c.declare({"w": 2})
