"""Fixtures of the Python tests: real ps-server shards on free loopback ports.

The shards are the C build's (TESSERA_BUILD_DIR, set by tests/python/run_pytest.sh; default
build/ in the checkout). Each cluster writes its job file into a fresh temporary directory,
starts one ps-server per shard (stderr in DIR/ps-N.log; each dies with the test process
through PR_SET_PDEATHSIG) and waits until every shard accepts connections. The `cluster`
fixture stops every cluster it started (SIGCONT, SIGTERM, SIGKILL after 5 s), whatever the
test did to them.
"""
from __future__ import annotations

import ctypes
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable, List, Optional

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("TESSERA_BUILD_DIR", ROOT / "build"))
PS_SERVER = BUILD / "server" / "ps-server"

_used_ports: set = set()


def tf_missing() -> str:
    """Why the Keras tests cannot run here ("" when TensorFlow with Keras 3 imports)."""
    try:
        import tensorflow  # noqa: F401
        import keras
        if not keras.__version__.startswith("3."):
            return f"Keras 3 needed, found {keras.__version__}"
    except Exception as e:  # noqa: BLE001
        return f"TensorFlow cannot be imported: {e}"
    return ""


def free_port() -> int:
    """A port free on 127.0.0.1 now, outside the kernel's ephemeral range (where clients'
    outgoing connections take theirs), never handed out twice in this process."""
    rnd = random.Random(os.getpid() ^ time.monotonic_ns())
    for _ in range(1000):
        port = rnd.randrange(15000, 30000)
        if port in _used_ports:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _used_ports.add(port)
        return port
    raise RuntimeError("no free port")


def _pdeathsig() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Cluster:
    """num_shards ps-server processes of one job."""

    def __init__(self, num_shards: int = 2, num_workers: int = 1, extra: str = ""):
        self.dir = Path(tempfile.mkdtemp(prefix="tessera-pytest-"))
        self.config = self.dir / "job.cfg"
        self.num_shards = num_shards
        self.ports = [free_port() for _ in range(num_shards)]
        self.addrs = [f"127.0.0.1:{p}" for p in self.ports]
        self.http_ports = [free_port() for _ in range(num_shards)]
        http = [f'"127.0.0.1:{p}"' for p in self.http_ports]
        workers = [f'"127.0.0.1:{free_port()}"' for _ in range(num_workers)]
        self.config.write_text(
            "cluster = {\n"
            f"  ps = [{', '.join(chr(34) + a + chr(34) for a in self.addrs)}];\n"
            f"  ps_http = [{', '.join(http)}];\n"
            f"  workers = [{', '.join(workers)}];\n"
            "};\n" + extra + "\n")
        self.procs: List[Optional[subprocess.Popen]] = [None] * num_shards
        try:
            for i in range(num_shards):
                self.start_shard(i)
        except Exception:
            self.stop()
            raise

    def start_shard(self, i: int) -> None:
        if not PS_SERVER.exists():
            raise RuntimeError(f"{PS_SERVER} missing: build first, or set TESSERA_BUILD_DIR")
        log = open(self.dir / f"ps-{i}.log", "ab")
        p = subprocess.Popen([str(PS_SERVER), "-c", str(self.config), "--shard", str(i)],
                             stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                             preexec_fn=_pdeathsig)
        log.close()
        self.procs[i] = p
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if p.poll() is not None:
                raise RuntimeError(f"ps-server {i} exited ({p.returncode}):\n{self.log(i)}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.ports[i])) == 0:
                    return
            time.sleep(0.01)
        raise RuntimeError(f"ps-server {i} did not listen within 10 s:\n{self.log(i)}")

    def log(self, i: int) -> str:
        try:
            return (self.dir / f"ps-{i}.log").read_text(errors="replace")
        except OSError:
            return ""

    def signal(self, i: int, sig: int) -> None:
        p = self.procs[i]
        if p is not None and p.poll() is None:
            p.send_signal(sig)

    def stop(self) -> None:
        for p in self.procs:
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.terminate()
        for p in self.procs:
            if p is None:
                continue
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = [None] * self.num_shards
        shutil.rmtree(self.dir, ignore_errors=True)


ASYNC_SGD1 = ('job = { mode = "async"; partition_bytes = 64; };\n'
              'optimizer = { name = "sgd"; learning_rate = 1.0; };\n')


@pytest.fixture
def cluster() -> Callable[..., Cluster]:
    """cluster(num_shards=2, num_workers=1, extra="libconfig text") -> a started Cluster;
    every one is stopped at the end of the test."""
    started: List[Cluster] = []

    def make(num_shards: int = 2, num_workers: int = 1, extra: str = ASYNC_SGD1) -> Cluster:
        c = Cluster(num_shards, num_workers, extra)
        started.append(c)
        return c

    yield make
    for c in started:
        c.stop()
