"""What requests give back: the Request in flight and its results, and a shard's status.

Re-exported by tessera (and tessera.client): ``tessera.Request``, ``tessera.PushResult``,
``tessera.ShardStatus``, ``tessera.WorkerStatus``.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from . import _client
from .tables import RowsPushResult

if TYPE_CHECKING:  # pragma: no cover
    from .client import Client


@dataclass(frozen=True)
class PushResult:
    """The outcome of a push (or push_pull): partitions summed over the shards."""

    applied: int      #: applied to the parameters at once (async, ssp; sync: the last one)
    accumulated: int  #: added to an open sync barrier
    stale: int        #: dropped as too stale (ssp, sync)
    duplicate: int    #: recognised as a retry already counted (sync)
    version: int = 0  #: push_pull: the lowest version pulled


@dataclass(frozen=True)
class WorkerStatus:
    task: int
    step: int
    loss: float
    examples_per_sec: float
    last_seen_s: float
    alive: bool
    done: bool
    epoch_progress: float
    identity: str
    clock: int
    stale_dropped: int
    device: Optional[str] = None  # the device it trains on; None until it reported one
    state: str = "alive"          # "alive", "stopped" (it said it finished or left), "dead"
    reported: bool = False        # loss, examples_per_sec, epoch_progress were reported
    step_known: bool = False      # step was reported or taken from an accepted push
    auc: Optional[float] = None   # a CTR model's AUC over its last log interval's batches
    test_auc: Optional[float] = None      # and on the test rows, once it evaluated them,
    test_logloss: Optional[float] = None  # with their log loss (ps-worker's CTR model)


@dataclass(frozen=True)
class ShardStatus:
    """One shard's view of itself and of the workers it has seen (ts_client_status)."""

    shard: int
    num_shards: int
    mode: str
    step: int
    partitions: int
    bytes: int
    version: int
    tensors: int
    workers: List[WorkerStatus]
    pushes: int
    pulls: int
    stale_dropped: int
    rejected_frames: int
    errors: int
    uptime_s: float
    num_workers: int
    barrier_waiting_for: List[int]
    connections: int
    auth_failures: int
    nonfinite_refused: int
    incarnation: int
    last_checkpoint: str
    last_checkpoint_age_s: float
    checkpoints_written: int
    restored_step: int
    #: checkpoint attempts failed in a row (0: the last worked, or none was tried) and the
    #: last failure's reason ("" when none): psctl's "last checkpoint: failed 3x (...)"
    checkpoint_failures: int = 0
    checkpoint_error: str = ""
    job_id: str = ""          # the job's identity, 16 hex digits ("" before a declare)
    workers_joined: int = 0   # workers that joined since the model was declared: took part
    final_test_accuracy: Optional[float] = None  # the job's, once its reporting worker sent it
    final_reporter: Optional[int] = None         # the task that evaluated the final parameters
    #: the declared embedding tables on this shard, each a dict: name, dim, rows, bytes,
    #: version, created, evicted, filtered, pulled_rows, pushed_rows, hot_keys, hot_share
    tables: List[Dict[str, Any]] = field(default_factory=list)

    @classmethod
    def _from_dict(cls, d: Dict[str, Any]) -> "ShardStatus":
        d = dict(d)
        d["workers"] = [WorkerStatus(**w) for w in d["workers"]]
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


class Request:
    """A request in flight (``pull``/``push``/``push_pull`` with ``wait=False``).

    The arrays it reads or writes stay referenced until it is done. ``wait()`` blocks (GIL
    released) and returns what the blocking call would have returned, or raises its error.

    Ctrl-C: a wait looks for signals every 50 ms. On the main thread it runs Python's
    handlers (PyErr_CheckSignals) and raises what they raise, ``KeyboardInterrupt`` by
    default. On another thread (the thread TensorFlow runs a ``tf.numpy_function`` on) it
    raises ``KeyboardInterrupt`` when a SIGINT arrived that the main thread does not handle
    within 0.1 s (it is not running Python: it waits in C, as in a TensorFlow step) and
    Python's handler of SIGINT is the default one; a SIGINT the main thread handles is its
    own, and waits on other threads go on, as Python's rules have it. An interrupted wait
    interrupts its client (``Client.interrupt()``): every request in flight on it fails, so
    that none reads or writes its arrays after the exception; the client then refuses
    requests with ``Interrupted`` (close it, open a new one).
    """

    __slots__ = ("_req", "_kind", "_value", "_client", "__weakref__")

    def __init__(self, req: Any, kind: int, value: Any, client: "Client"):
        self._req = req
        self._kind = kind
        self._value = value
        self._client = client

    @property
    def done(self) -> bool:
        """Whether the request is done (succeeded or failed); never blocks."""
        return bool(self._req.done)

    def wait(self, timeout: Optional[float] = None) -> Any:
        """Wait until the request is done and return its result: the destination (dict or
        list, as given) for a pull, a PushResult for a push or push_pull. Raises its error
        (a TesseraError), or TimeoutError when ``timeout`` seconds pass first (the request
        then stays in flight)."""
        if not self._req.wait(-1.0 if timeout is None else max(0.0, float(timeout))):
            raise TimeoutError(f"request not done within {timeout} s")
        self._req.check()
        r = self._req.result()
        if self._kind in (_client.SPARSE_PULL, _client.SPARSE_PUSH_PULL):
            return self._value if self._kind == _client.SPARSE_PULL else self._value[0]
        if self._kind == _client.SPARSE_PUSH:
            return RowsPushResult(r["applied"], r["accumulated"], r["stale"], r["duplicate"],
                                  r["rows_filtered"])
        if self._kind == _client.PULL:
            self._client.last_version = r["version"]
            return self._value
        if self._kind == _client.PUSH_PULL:
            self._client.last_version = r["version"]
        return PushResult(r["applied"], r["accumulated"], r["stale"], r["duplicate"],
                          r["version"])

    result = wait

    def __repr__(self) -> str:
        kind = {_client.PULL: "pull", _client.PUSH: "push", _client.PUSH_PULL: "push_pull",
                _client.ASSIGN: "assign", _client.ASSIGN_INITIAL: "assign",
                _client.SPARSE_PULL: "pull_rows", _client.SPARSE_PUSH: "push_rows",
                _client.SPARSE_PUSH_PULL: "push_pull_rows"}
        return f"<tessera.Request {kind[self._kind]} {'done' if self.done else 'in flight'}>"


def _sigint_unhandled() -> bool:
    """Whether a SIGINT arrived that the main thread has not handled yet: it has not run
    Python code since (it waits in C, e.g. for the thread calling this inside a TensorFlow
    step); Python's handler runs there as soon as it does."""
    return bool(_client.Request.sigint_unhandled())
