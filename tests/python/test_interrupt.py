"""Ctrl-C (SIGINT) during a wait, on the main thread and on others (tessera.Request).

The sync jobs here have 2 workers and only task 0 runs, so a pull of the next version (or
a push_pull) waits for a barrier that never closes, and the signal comes while it does.
The bound checked is the one docs/python.md promises: KeyboardInterrupt within 0.5 s of
the signal.
"""
from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest

import tessera

SGD1 = 'optimizer = { name = "sgd"; learning_rate = 1.0; };\n'
SYNC = 'job = { mode = "sync"; sync_timeout_s = 60.0; };\n' + SGD1
BOUND_S = 0.5

main_only = pytest.mark.skipif(threading.current_thread() is not threading.main_thread(),
                               reason="signals reach the main thread only")


@pytest.fixture(autouse=True)
def _python_sigint():
    """Python's own SIGINT handler, also where pytest started with SIGINT ignored (a
    background job of a non-interactive shell)."""
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


def _waiting_client(cl) -> tuple:
    """Task 0 of cl, its model pulled and a gradient pushed: its next pull waits."""
    c = tessera.Client(str(cl.config), task=0, timeout=60)
    p = c.declare(MODEL)
    c.pull(p)
    c.push({n: np.ones(s, np.float32) for n, s in MODEL.items()})
    return c, p


MODEL = {"w": (64, 64), "b": (64,)}


def _shards_still_train(cl, model=MODEL) -> None:
    """Both workers, as new clients, close a sync step together."""
    out: dict = {}

    def worker(task: int) -> None:
        with tessera.Client(str(cl.config), task=task, timeout=20) as c:
            p = c.declare(model)
            c.pull(p)
            v = c.last_version
            r = c.push_pull({n: np.ones(s, np.float32) for n, s in model.items()}, p)
            out[task] = (v, r.version)

    ts = [threading.Thread(target=worker, args=(t,)) for t in (0, 1)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    assert set(out) == {0, 1}, out
    for v, after in out.values():
        assert after > v, out


# --- (a) the main thread ----------------------------------------------------------------

@main_only
def test_sigint_interrupts_a_sync_pull_on_the_main_thread(cluster):
    cl = cluster(2, 2, SYNC)
    c, p = _waiting_client(cl)
    with c:
        sent: list = []
        timer = _sigint_in(0.33, sent)
        with pytest.raises(KeyboardInterrupt):
            c.pull(p)
        took = time.monotonic() - sent[0]
        timer.join()
        print(f"main thread: KeyboardInterrupt {took * 1000:.0f} ms after SIGINT")
        assert took < BOUND_S, f"KeyboardInterrupt {took:.3f} s after SIGINT"
        # The client was interrupted: nothing is in flight (nothing writes into p any
        # more), and it says so on every later request.
        assert c.in_flight() == 0
        with pytest.raises(tessera.Interrupted, match="open a new Client"):
            c.pull(p)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    _shards_still_train(cl)


# --- (b) a wait on another thread ---------------------------------------------------------

def _blocked_main(worker: threading.Thread, blocked: threading.Event = None) -> None:
    """Join worker with SIGINT blocked on this (the main) thread, so that the thread stays
    in C until worker ends, as the main thread does in a TensorFlow step that runs a
    tf.numpy_function on another thread. Python's handler runs once it is back."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    if blocked is not None:
        blocked.set()
    try:
        worker.join(30)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _pull_in_thread(c, p, got: dict, before=None) -> threading.Thread:
    def run() -> None:
        if before:
            before()
        try:
            c.pull(p)
            got["result"] = "done"
        except BaseException as e:  # noqa: BLE001 - the test looks at it
            got["at"] = time.monotonic()
            got["result"] = e
    t = threading.Thread(target=run, name="tessera-test-waiter")
    t.start()
    return t


@main_only
def test_sigint_interrupts_a_wait_on_another_thread_while_main_waits_in_c(cluster):
    cl = cluster(2, 2, SYNC)
    c, p = _waiting_client(cl)
    with c:
        got: dict = {}
        t = _pull_in_thread(c, p, got)
        sent: list = []
        timer = _sigint_in(0.33, sent)
        with pytest.raises(KeyboardInterrupt):   # Python's, once main runs Python again
            _blocked_main(t)
            time.sleep(1)                        # (it is raised here at the latest)
        timer.join()
        assert isinstance(got.get("result"), KeyboardInterrupt), got
        took = got["at"] - sent[0]
        print(f"other thread, main in C: KeyboardInterrupt {took * 1000:.0f} ms after SIGINT")
        assert took < BOUND_S, f"KeyboardInterrupt {took:.3f} s after SIGINT"
        assert c.in_flight() == 0
    _shards_still_train(cl)


@main_only
def test_sigint_before_the_wait_starts_still_interrupts_it(cluster):
    """The signal comes while the thread computes (between two waits) and the main thread
    cannot handle it: the next wait takes it."""
    cl = cluster(2, 2, SYNC)
    c, p = _waiting_client(cl)
    with c:
        got: dict = {}
        sent: list = []
        blocked = threading.Event()

        def compute() -> None:
            blocked.wait(10)
            sent.append(time.monotonic())
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)

        t = _pull_in_thread(c, p, got, before=compute)
        with pytest.raises(KeyboardInterrupt):
            _blocked_main(t, blocked)
            time.sleep(1)
        assert isinstance(got.get("result"), KeyboardInterrupt), got
        took = got["at"] - sent[0] - 0.2
        print(f"other thread, SIGINT before the wait: KeyboardInterrupt {took * 1000:.0f} ms "
              f"after the wait started")
        assert took < BOUND_S, f"KeyboardInterrupt {took:.3f} s after the wait started"


@main_only
def test_sigint_stops_the_waits_of_every_thread(cluster):
    """The main thread runs Python (it joins, interruptibly): it gets Python's own
    KeyboardInterrupt, and the wait on the other thread gets one too, so no thread is left
    waiting for a barrier that will not close (nor an exit waiting for that thread)."""
    cl = cluster(2, 2, SYNC)
    c, p = _waiting_client(cl)
    with c:
        got: dict = {}
        t = _pull_in_thread(c, p, got)
        sent: list = []
        timer = _sigint_in(0.33, sent)
        with pytest.raises(KeyboardInterrupt):
            t.join(30)
        timer.join()
        for _ in range(100):
            if "result" in got:
                break
            time.sleep(0.01)
        assert isinstance(got.get("result"), KeyboardInterrupt), got
        took = got["at"] - sent[0]
        print(f"other thread, main in Python: KeyboardInterrupt {took * 1000:.0f} ms after "
              f"SIGINT")
        assert took < BOUND_S, f"KeyboardInterrupt {took:.3f} s after SIGINT"


@main_only
def test_a_handler_of_the_users_own_is_respected(cluster):
    """With a Python handler of the user's, a wait on another thread is not interrupted:
    the handler runs on the main thread, when Python gets to run it."""
    cl = cluster(2, 2, SYNC)
    c, p = _waiting_client(cl)
    calls: list = []
    old = signal.signal(signal.SIGINT, lambda s, f: calls.append(time.monotonic()))
    try:
        got: dict = {}
        t = _pull_in_thread(c, p, got)
        timer = _sigint_in(0.33, [])
        stopper = threading.Timer(1.5, c.close)   # ends the wait (Interrupted)
        stopper.start()
        _blocked_main(t)
        timer.join()
        stopper.join()
        assert isinstance(got.get("result"), tessera.Interrupted), got
        time.sleep(0.05)
        assert len(calls) == 1, calls              # the user's handler ran, once
    finally:
        signal.signal(signal.SIGINT, old)
        c.close()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
