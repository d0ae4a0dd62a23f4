"""tessera.Client: a worker's connections to every shard of a job, over numpy arrays.

Every request reads gradients from, and writes parameters into, the caller's own numpy
float32 arrays (C-contiguous, of the declared tensor's element count): the C request points
straight at their memory, nothing is copied. The arrays are referenced until the request
is done, so they cannot be freed or resized under the client thread; the caller must not
change a gradient, nor read a destination, before then.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import (Any, Dict, List, Literal, Mapping, Optional, Sequence, Tuple, TypeVar,
                    Union, overload)

import numpy as np

from . import _client
from ._errors import Busy, DeadlineExceeded, ShapeError, TesseraError, UnknownTensor
from ._job import Job, load_job
from ._results import (PushResult, Request, ShardStatus, WorkerStatus,  # noqa: F401
                       _sigint_unhandled)
from .tables import Table, TablesMixin

__all__ = ["Client", "PushResult", "Request", "ShardStatus", "Tensor", "WorkerStatus"]

logger = logging.getLogger("tessera")

_INITS = {
    "zeros": _client.INIT_ZEROS,
    "glorot": _client.INIT_GLOROT_UNIFORM,
    "glorot_uniform": _client.INIT_GLOROT_UNIFORM,
    "ones": _client.INIT_ONES,
}

# syslog levels of the library -> logging's
_LEVELS = {
    _client.LOG_ERR: logging.ERROR,
    _client.LOG_WARN: logging.WARNING,
    _client.LOG_NOTICE: logging.INFO,
    _client.LOG_INFO: logging.INFO,
    _client.LOG_DEBUG: logging.DEBUG,
}

Shape = Tuple[int, ...]
Arrays = Union[Mapping[str, np.ndarray], Sequence[np.ndarray]]
#: the type of a destination, which a pull returns filled
A = TypeVar("A", bound=Arrays)


@dataclass(frozen=True)
class Tensor:
    """One tensor of a model to declare: its shape and how the shards initialise it.

    init: "glorot" (Glorot/Xavier uniform), "zeros" or "ones"; None = "glorot" for rank >= 2,
    "zeros" otherwise (biases). The values are deterministic in the declare's seed and the
    tensor's name, identical on every shard and every worker (unless the declare brings the
    model's own values: ``declare(..., values=...)``).

    kind: "trainable" (updated by the job's optimizer from the gradients pushed) or "state"
    (a non-trainable variable such as BatchNormalization's moving mean: a push carries its
    values and the shards keep their mean over the workers).
    """

    shape: Shape
    init: Optional[str] = None
    kind: str = "trainable"

    def kind_code(self) -> int:
        try:
            return {"trainable": _client.TRAINABLE, "state": _client.STATE}[self.kind]
        except KeyError:
            raise ValueError(f"unknown kind {self.kind!r}: 'trainable' or 'state'") from None

    def init_code(self) -> int:
        init = self.init or ("glorot" if len(self.shape) >= 2 else "zeros")
        try:
            return _INITS[init]
        except KeyError:
            raise ValueError(f"unknown init {init!r}: one of {sorted(_INITS)}") from None


class Client(TablesMixin):
    """Connections to every shard of a Tessera job, and the declared model (its tensors
    and its embedding tables: ``pull_rows``, ``push_rows``, ``push_pull_rows``).

    The library's diagnostics go to the ``logging`` logger "tessera". Use the client as a
    context manager, or call ``close()``.

    Parameters
    ----------
    config : str or os.PathLike, optional
        A job file (libconfig, docs/configuration.md). Its ``cluster.ps`` names the shards;
        ``auth.token_file``, ``job.busy_poll_us``, ``job.heartbeat_*`` and ``model.seed``
        apply unless given here. TF_CONFIG, when set, applies on top of it as it does for
        ps-worker.
    cluster : sequence of str, optional
        The shards' "host:port" addresses, in shard order (instead of a file). With
        neither, the cluster comes from TF_CONFIG (the ``ps`` list; ``task.index`` of a
        ``worker`` task gives ``task``).
    task : int, optional
        This worker's index (default: TF_CONFIG's, else 0).
    token_file : str, optional
        The shared token (default: the job's ``auth.token_file``, or
        ``auth.admin_token_file`` for an admin client).
    admin : bool, default False
        Connect in the admin role (status of every worker, checkpoint, shutdown).
    timeout : float, default 60.0
        Default deadline of every request, in seconds: a request that a shard does not
        answer in time raises DeadlineExceeded (an Unavailable).
    connect_timeout : float, optional
        How long opening waits for the shards (default min(timeout, 30)).
    overrides : sequence of str, default ()
        ``"KEY=VALUE"`` overrides of the job file, as ps-worker's ``--set``.
    require_all : bool, default True
        Fail unless every shard answers the handshake.
    busy_poll_us, heartbeat_interval, heartbeat_timeout : optional
        The job's by default.
    identity : str, optional
        Free text for the shards' logs (default "python task T pid P@host").
    tls : (str, str, str), optional
        TLS 1.3 to the shards: the CA file, this client's certificate and its key (PEM).
        Default: the job's ``auth.tls_ca_file``, ``auth.tls_cert_file`` and
        ``auth.tls_key_file`` when its ``auth.tls`` is true, else plaintext.

    Raises
    ------
    ConfigError
        The job file, an override or TF_CONFIG is invalid, or the shards run another job.
    Unavailable, AuthError
        The shards do not answer within ``connect_timeout``, or refuse the token.
    """

    def __init__(self, config: Optional[Union[str, os.PathLike]] = None, *,
                 cluster: Optional[Sequence[str]] = None, task: Optional[int] = None,
                 token_file: Optional[str] = None, admin: bool = False,
                 timeout: float = 60.0, connect_timeout: Optional[float] = None,
                 overrides: Sequence[str] = (), require_all: bool = True,
                 busy_poll_us: Optional[int] = None,
                 heartbeat_interval: Optional[float] = None,
                 heartbeat_timeout: Optional[float] = None,
                 identity: Optional[str] = None,
                 tls: Optional[Tuple[str, str, str]] = None):
        self._c: Any = None
        self.job: Optional[Job] = None
        if config is not None:
            self.job = load_job(config, overrides)
        elif cluster is None:
            tf = os.environ.get("TF_CONFIG", "")
            if not tf.strip():
                raise ValueError("no cluster: give config=JOBFILE, cluster=[\"host:port\", ...] "
                                 "or set TF_CONFIG")
            self.job = load_job(None, overrides, tf)
        elif overrides:
            raise ValueError("overrides apply to a job file: give config= as well")
        job = self.job
        if cluster is not None:
            addrs = [str(a) for a in cluster]
        else:
            assert job is not None  # a job file or TF_CONFIG gave the cluster
            addrs = list(job.ps)
        if task is None:
            task = job.task_index if job and job.task_index >= 0 and job.task_role != "ps" else 0
        if token_file is None and job is not None:
            token_file = (job.admin_token_file if admin else job.token_file) or None
        if busy_poll_us is None:
            busy_poll_us = job.busy_poll_us if job else 0
        if heartbeat_interval is None:
            heartbeat_interval = job.heartbeat_interval_s if job else 0.0
        if heartbeat_timeout is None:
            heartbeat_timeout = job.heartbeat_timeout_s if job else 5.0
        if connect_timeout is None:
            connect_timeout = min(float(timeout), 30.0)
        if tls is None and job is not None and job.tls:
            tls = (job.tls_ca_file, job.tls_cert_file, job.tls_key_file)
        if identity is None:
            identity = f"python task {task} pid {os.getpid()}@{socket.gethostname()}"
        self.task: int = int(task)
        self.timeout: float = float(timeout)
        self.last_version: int = 0
        self._lock = threading.Lock()
        self._names: List[str] = []
        self._table_index: Dict[str, int] = {}
        self._table_dims: List[int] = []
        self._index: Dict[str, int] = {}
        self._shapes: List[Shape] = []
        self._elems: List[int] = []
        self._clock = 0
        self._pushed: set = set()
        self._mode = ""
        self._c = _client.Client(
            addrs, task=self.task, admin=admin, token_file=token_file, identity=identity,
            connect_timeout=float(connect_timeout), request_timeout=float(timeout),
            heartbeat_interval=float(heartbeat_interval),
            heartbeat_timeout=float(heartbeat_timeout), require_all=require_all,
            busy_poll_us=int(busy_poll_us), log=_log, tls=tls,
            log_level=_client.LOG_DEBUG if logger.isEnabledFor(logging.DEBUG)
            else _client.LOG_INFO,
            # A worker with a job file is checked against the shards' at the handshake (mode,
            # worker count, optimizer, model, ...), as ps-worker is: a mismatch raises
            # ConfigError naming the key and both values. (TF_CONFIG alone names the
            # cluster, not the job: nothing to compare then.)
            job=None if admin or config is None or job is None else list(job.job_settings))

    # --- lifetime ------------------------------------------------------------------------

    def close(self) -> None:
        """Fail every request still in flight (Interrupted), close the connections and stop
        the client thread. Idempotent."""
        if self._c is not None:
            self._c.close()

    def interrupt(self) -> None:
        """Make every request in flight, and every later one, fail at once with Interrupted
        (irreversible; for a worker told to stop)."""
        self._live().interrupt()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _live(self) -> Any:
        if self._c is None:
            raise TesseraError("the client is not open", _client.ESHUTDOWN)
        return self._c

    # --- the job -------------------------------------------------------------------------

    @property
    def mode(self) -> str:
        """The job's mode as the shards announced it: "sync", "async" or "ssp"."""
        if not self._mode or self._mode == "unspecified":
            self._mode = self._live().info()["mode"]
        return self._mode

    @property
    def num_shards(self) -> int:
        return self._live().info()["num_shards"]

    @property
    def num_workers(self) -> int:
        """The job's worker count, as the shards announced it."""
        return self._live().info()["job_workers"]

    @property
    def tensors(self) -> List[str]:
        """The declared tensors' names, in declaration order."""
        return list(self._names)

    @property
    def shapes(self) -> Dict[str, Shape]:
        return dict(zip(self._names, self._shapes))

    @property
    def clock(self) -> int:
        """This worker's step count: pushes are tagged with it (async, ssp) and pulls carry
        it (ssp's staleness bound). It advances once every declared tensor was pushed since
        the last advance (one whole-model push, or one push per tensor)."""
        return self._clock

    @clock.setter
    def clock(self, value: int) -> None:
        with self._lock:
            self._clock = int(value)
            self._pushed.clear()

    def info(self) -> Dict[str, Any]:
        """The job and plan: num_shards, mode, job_workers, partition_bytes, restarts,
        num_tensors, num_parts."""
        return self._live().info()

    def plan(self) -> List[Tuple[int, int, int, int, int]]:
        """The partition plan: (tensor, part, shard, offset, count) per partition."""
        return self._live().parts()

    def shard_up(self, shard: int) -> Tuple[bool, str]:
        """Whether shard has a ready connection, and else the last error seen."""
        return self._live().shard_up(shard)

    def set_timeout(self, seconds: float) -> None:
        """Set the default deadline of later requests."""
        self._live().set_timeout(float(seconds))
        self.timeout = float(seconds)

    # --- the model -----------------------------------------------------------------------

    def declare(self, model: Mapping[str, Union[np.ndarray, Sequence[int], int, Tensor]], *,
                seed: Optional[int] = None,
                init: Union[None, str, Mapping[str, str]] = None,
                values: Optional[Mapping[str, np.ndarray]] = None,
                chief: Optional[bool] = None,
                wait: Optional[float] = None,
                tables: Optional[Mapping[str, Union[Table, int]]] = None
                ) -> Dict[str, np.ndarray]:
        """Declare the model: the same tensors, in the same (dict) order, on every worker.

        When the shards hold the model already (trained before, or restored from a
        checkpoint) its values stay: ``values_source`` says which won ("this worker", "the
        chief", "the shards"), and the returned arrays hold them.

        Parameters
        ----------
        model : dict of str to ndarray, shape, int or Tensor
            Each tensor: an array (its shape is taken), a shape, or a Tensor(shape, init,
            kind).
        seed : int, optional
            Seed of the shards' initialisation (default: the job's model.seed, 0 without a
            job file).
        init : str or dict of str to str, optional
            The initialisation of every tensor ("glorot", "zeros", "ones") or, as a dict, of
            some; by default glorot for rank >= 2 and zeros for rank 1.
        values : dict of str to ndarray, optional
            The model's own initial values (every tensor), as TensorFlow's chief
            initialises the variables. The chief sends them when the shards' model is new;
            every other worker waits until it has, and all then start from them.
        chief : bool, optional
            Whether this worker sends ``values`` (default: task 0 does).
        wait : float, optional
            How long a worker other than the chief waits for the chief's values, in seconds
            (default: the client's timeout).
        tables : dict of str to Table or int, optional
            The model's embedding tables (an int: a Table of that width), in the same order
            on every worker; ``model`` may then be empty.

        Returns
        -------
        dict of str to ndarray
            float32 arrays to pull into: the given array itself where it is a writable
            C-contiguous float32 ndarray, else a new one (zeros, or with ``values`` the
            job's initial values).

        Raises
        ------
        ShapeError
            The job already holds a tensor of that name with another shape, or a value has
            the wrong size.
        UnknownTensor
            ``init`` or ``values`` names a tensor that is not in the model, or ``values``
            misses one.
        DeadlineExceeded
            The chief's values did not come within ``wait``.
        """
        specs: List[Tuple[str, Tensor]] = []
        if isinstance(init, Mapping) and set(init) - set(model):
            raise UnknownTensor(f"init names tensors not in the model: "
                                f"{sorted(set(init) - set(model))}", _client.ENOTENSOR)
        for name, v in model.items():
            if isinstance(v, Tensor):
                spec = v
            elif isinstance(v, np.ndarray):
                spec = Tensor(tuple(int(d) for d in v.shape))
            elif isinstance(v, (int, np.integer)):
                spec = Tensor((int(v),))
            else:
                spec = Tensor(tuple(int(d) for d in v))
            if isinstance(init, str):
                spec = Tensor(spec.shape, init, spec.kind)
            elif init is not None and name in init:
                spec = Tensor(spec.shape, init[name], spec.kind)
            if any(d <= 0 for d in spec.shape) or not spec.shape:
                raise ShapeError(f"tensor {name!r}: shape {spec.shape} must have dimensions > 0")
            specs.append((str(name), spec))
        if seed is None:
            seed = self.job.seed if self.job is not None else 0
        if values is not None:
            missing = [n for n, _ in specs if n not in values]
            if missing:
                raise UnknownTensor(f"values: no value for {missing}", _client.ENOTENSOR)
            for n, s in specs:
                v = values[n]
                if not isinstance(v, np.ndarray) or v.size != int(np.prod(s.shape)):
                    raise ShapeError(f"values of {n!r}: need an array of shape {s.shape}",
                                     _client.ESHAPE)
        decl = [(n, s.shape, s.init_code(), s.kind_code()) for n, s in specs]
        tspecs = [(str(n), t if isinstance(t, Table) else Table(int(t)))
                  for n, t in (tables or {}).items()]
        wire = [t.wire(n) for n, t in tspecs] if tspecs else None
        awaiting = self._live().declare(decl, int(seed), values is not None, wire)
        with self._lock:
            self._names = [n for n, _ in specs]
            self._index = {n: i for i, n in enumerate(self._names)}
            self._shapes = [s.shape for _, s in specs]
            self._elems = [int(np.prod(s.shape)) for _, s in specs]
            self._pushed.clear()
            self._table_index = {n: i for i, (n, _) in enumerate(tspecs)}
            self._table_dims = [int(t.dim) for _, t in tspecs]
        self._mode = self._c.info()["mode"]
        out: Dict[str, np.ndarray] = {}
        for name, spec in specs:
            v = model[name]
            if (isinstance(v, np.ndarray) and v.dtype == np.float32 and v.flags.c_contiguous
                    and v.flags.writeable):
                out[name] = v
            else:
                out[name] = np.zeros(spec.shape, dtype=np.float32)
        self.values_source = "the shards"
        if values is not None and out:  # a model of tables only has no values to give
            self._initial_values(decl, int(seed), values, out, awaiting, chief, wait, wire)
        return out

    def _initial_values(self, decl, seed: int, values: Mapping[str, np.ndarray],
                        out: Dict[str, np.ndarray], awaiting: bool, chief: Optional[bool],
                        wait: Optional[float], tables: Any = None) -> None:
        """declare(values=...): the chief sends the model's values where the shards wait
        for them; the others wait until it has. Then every worker pulls them."""
        chief = (self.task == 0) if chief is None else bool(chief)
        if awaiting and chief:
            vals = {n: np.ascontiguousarray(values[n], np.float32).reshape(out[n].shape)
                    for n in out}
            self.assign(vals, initial=True)
            self.values_source = "this worker"
        elif awaiting:
            deadline = time.monotonic() + (self.timeout if wait is None else float(wait))
            pause = 0.01
            logged = False
            while awaiting:
                if time.monotonic() >= deadline:
                    raise DeadlineExceeded(
                        f"task {self.task}: the model's initial values did not come within "
                        f"{self.timeout if wait is None else wait:g} s: they come from the "
                        f"job's chief (task 0) when it declares the model; is it running?",
                        _client.ETIMEDOUT)
                if not logged and pause >= 0.1:
                    logger.info("task %d: waiting for the chief (task 0) to send the "
                                "model's initial values", self.task)
                    logged = True
                time.sleep(pause)
                pause = min(0.2, pause * 2)
                # The same declaration again, tables included (else it is another model).
                awaiting = self._live().declare(decl, seed, True, tables)
            self.values_source = "the chief"
        else:
            logger.info("task %d: the shards hold this model already (trained, or restored "
                        "from a checkpoint): the job goes on from their values, not this "
                        "worker's", self.task)
        self.pull(out, min_version=0)

    def assign(self, values: Arrays, *, initial: bool = False,
               timeout: Optional[float] = None) -> "PushResult":
        """Replace the shards' values of the given tensors with these.

        For restore-best-weights, set_weights, loading weights to fine-tune. The optimizer
        state and the versions stay. Assign between steps (e.g. from one worker after fit).

        Parameters
        ----------
        values : dict of str to ndarray, or sequence of ndarray
            The values: a dict name -> array, or one array per declared tensor.
        initial : bool, default False
            Only where the shards still wait for the model's initial values (declare's
            ``values``).
        timeout : float, optional
            This request's deadline in seconds (default: the client's).

        Returns
        -------
        PushResult
            How many partitions took the values.

        Raises
        ------
        Busy
            Sync mode: a partition whose step is open (some worker has pushed its gradient
            for it) refused; the partitions that took the values are changed.
        """
        idx, arrs = self._select(values, "value", False)
        kind = _client.ASSIGN_INITIAL if initial else _client.ASSIGN
        req = self._live().submit(kind, idx, arrs, None, 0, 0, self._clock,
                                  self._timeout(timeout))
        res = Request(req, kind, None, self).wait()
        if res.stale and not initial:
            raise Busy(f"assign: {res.stale} partition(s) refused the values because their "
                       f"sync step is open (a worker has pushed for it); {res.applied} took "
                       f"them. Assign between steps.", _client.EBUSY)
        return res

    def zeros(self) -> Dict[str, np.ndarray]:
        """New zero-filled float32 arrays of the declared shapes (name -> array)."""
        return {n: np.zeros(s, dtype=np.float32) for n, s in zip(self._names, self._shapes)}

    # --- requests ------------------------------------------------------------------------

    def _select(self, arrays: Arrays, role: str, writable: bool) -> Tuple[List[int], List[np.ndarray]]:
        if not self._names:
            raise TesseraError("no model declared: call declare() first", _client.ENOTDECLARED)
        if isinstance(arrays, Mapping):
            idx = []
            for name in arrays:
                if name not in self._index:
                    raise UnknownTensor(f"unknown tensor {name!r}: declared are {self._names}",
                                        _client.ENOTENSOR)
                idx.append(self._index[name])
            pairs = sorted(zip(idx, arrays.values()), key=lambda p: p[0])
            idx = [i for i, _ in pairs]
            arrs = [a for _, a in pairs]
        else:
            arrs = list(arrays)
            if len(arrs) != len(self._names):
                raise ShapeError(f"{len(arrs)} {role} array(s) for {len(self._names)} declared "
                                 f"tensor(s); pass a dict for a subset", _client.ESHAPE)
            idx = list(range(len(arrs)))
        for i, a in zip(idx, arrs):
            name = self._names[i]
            if not isinstance(a, np.ndarray):
                raise ValueError(f"{role} of {name!r}: need a numpy float32 array, not "
                                 f"{type(a).__name__}")
            if a.dtype != np.float32:
                raise ValueError(f"{role} of {name!r}: need dtype float32, not {a.dtype} "
                                 f"(convert once with np.asarray(a, np.float32))")
            if not a.flags.c_contiguous:
                raise ValueError(f"{role} of {name!r}: need a C-contiguous array (the request "
                                 f"reads its memory directly; use np.ascontiguousarray)")
            if writable and not a.flags.writeable:
                raise ValueError(f"{role} of {name!r}: the array is read-only")
            if a.size != self._elems[i]:
                raise ShapeError(f"{role} of {name!r}: shape {a.shape} ({a.size} elements), "
                                 f"declared {self._shapes[i]} ({self._elems[i]} elements)",
                                 _client.ESHAPE)
        return idx, arrs

    def _advance(self, idx: List[int]) -> None:
        # under self._lock
        self._pushed.update(idx)
        if len(self._pushed) >= len(self._names):
            self._clock += 1
            self._pushed.clear()

    def _timeout(self, timeout: Optional[float]) -> float:
        return 0.0 if timeout is None else float(timeout)

    @overload
    def pull(self, into: None = None, *, wait: Literal[True] = True,
             min_version: Optional[int] = None,
             timeout: Optional[float] = None) -> Dict[str, np.ndarray]: ...

    @overload
    def pull(self, into: A, *, wait: Literal[True] = True, min_version: Optional[int] = None,
             timeout: Optional[float] = None) -> A: ...

    @overload
    def pull(self, into: Optional[Arrays] = None, *, wait: Literal[False],
             min_version: Optional[int] = None, timeout: Optional[float] = None) -> Request: ...

    def pull(self, into: Optional[Arrays] = None, *, wait: bool = True,
             min_version: Optional[int] = None, timeout: Optional[float] = None) -> Any:
        """Read the parameters into the caller's arrays.

        Sync mode waits for the next version of each shard (the step after the one last
        pulled); async and ssp take what is there.

        Parameters
        ----------
        into : dict of str to ndarray, or sequence of ndarray, optional
            The destination: a dict name -> array (those tensors), or one array per
            declared tensor in order; each float32, C-contiguous and writable, of the
            tensor's element count. None: new arrays of every tensor.
        wait : bool, default True
            False: return at once with a Request whose ``wait()`` returns the result.
        min_version : int, optional
            Wait until every partition pulled is at least this version (overrides the
            mode's rule; 0 = take what is there).
        timeout : float, optional
            This request's deadline in seconds (default: the client's).

        Returns
        -------
        dict of str to ndarray, or sequence of ndarray, or Request
            ``into`` filled (a new dict when ``into`` was None), or the Request.

        Raises
        ------
        ShapeError, UnknownTensor
            An array of the wrong size or dtype, or a name not declared.
        DeadlineExceeded
            A shard did not answer within the deadline.
        """
        if into is None:
            into = self.zeros()
        idx, arrs = self._select(into, "destination", True)
        sync = self.mode == "sync"
        mv = (_client.VERSION_NEXT if sync else 0) if min_version is None else int(min_version)
        req = self._live().submit(_client.PULL, idx, None, arrs, 0, mv, self._clock,
                                  self._timeout(timeout))
        r = Request(req, _client.PULL, into, self)
        return r.wait() if wait else r

    @overload
    def push(self, grads: Arrays, *, wait: Literal[True] = True, step: Optional[int] = None,
             timeout: Optional[float] = None) -> PushResult: ...

    @overload
    def push(self, grads: Arrays, *, wait: Literal[False], step: Optional[int] = None,
             timeout: Optional[float] = None) -> Request: ...

    def push(self, grads: Arrays, *, wait: bool = True, step: Optional[int] = None,
             timeout: Optional[float] = None) -> Any:
        """Send gradients to the shards.

        Sync mode tags each shard's push with the version last pulled from it (the barrier
        of that step counts it); async and ssp tag it with ``clock``. Several pushes in
        flight (one per tensor, as backpropagation produces them) are applied in
        submission order on every shard.

        Parameters
        ----------
        grads : dict of str to ndarray, or sequence of ndarray
            The gradients: a dict name -> array, or one array per declared tensor; float32,
            C-contiguous. Do not change them until the push is done.
        wait : bool, default True
            False: return at once with a Request.
        step : int, optional
            The step to tag the push with instead of the mode's rule.
        timeout : float, optional
            This request's deadline in seconds (default: the client's).

        Returns
        -------
        PushResult or Request
            What the shards did with each partition, or the Request.

        Raises
        ------
        ShapeError, UnknownTensor
            An array of the wrong size or dtype, or a name not declared.
        NonFiniteGradient
            A gradient held NaN or Inf (the shards refused it).
        """
        idx, arrs = self._select(grads, "gradient", False)
        with self._lock:
            st = (_client.STEP_PULLED if self.mode == "sync" else self._clock) \
                if step is None else int(step)
            req = self._live().submit(_client.PUSH, idx, arrs, None, st, 0, self._clock,
                                      self._timeout(timeout))
            self._advance(idx)
        r = Request(req, _client.PUSH, None, self)
        return r.wait() if wait else r

    @overload
    def push_pull(self, grads: Arrays, into: Arrays, *, wait: Literal[True] = True,
                  step: Optional[int] = None, min_version: Optional[int] = None,
                  timeout: Optional[float] = None) -> PushResult: ...

    @overload
    def push_pull(self, grads: Arrays, into: Arrays, *, wait: Literal[False],
                  step: Optional[int] = None, min_version: Optional[int] = None,
                  timeout: Optional[float] = None) -> Request: ...

    def push_pull(self, grads: Arrays, into: Arrays, *, wait: bool = True,
                  step: Optional[int] = None, min_version: Optional[int] = None,
                  timeout: Optional[float] = None) -> Any:
        """Push gradients and pull the next parameters in one round trip.

        Each shard applies the push before it answers the pull; in sync mode the pull
        waits for the version the push takes part in. By default sync mode tags the push
        with the version last pulled from each shard and waits for the next one; a caller
        with several push_pulls of one step in flight (one per bucket of tensors) passes
        both itself (``step=v, min_version=v + 1``, ``v`` the version its parameters of
        those tensors came from), since an earlier bucket's reply may move what was last
        pulled before a later bucket is sent.

        Parameters
        ----------
        grads : dict of str to ndarray, or sequence of ndarray
            The gradients, as for ``push``.
        into : dict of str to ndarray, or sequence of ndarray
            The destination, as for ``pull``: the same tensors as ``grads``, and no memory
            shared with them.
        wait : bool, default True
            False: return at once with a Request.
        step, min_version : int, optional
            As in ``push`` and ``pull``.
        timeout : float, optional
            This request's deadline in seconds (default: the client's).

        Returns
        -------
        PushResult or Request
            The push's outcome (its ``version`` is the one pulled), or the Request.

        Raises
        ------
        ValueError
            ``grads`` and ``into`` name different tensors.
        ShapeError, UnknownTensor, NonFiniteGradient, DeadlineExceeded
            As for ``push`` and ``pull``.
        """
        gidx, garrs = self._select(grads, "gradient", False)
        didx, darrs = self._select(into, "destination", True)
        if gidx != didx:
            raise ValueError("push_pull: grads and into must name the same tensors")
        sync = self.mode == "sync"
        with self._lock:
            st = (_client.STEP_PULLED if sync else self._clock) if step is None else int(step)
            mv = (_client.VERSION_NEXT if sync else 0) if min_version is None \
                else int(min_version)
            req = self._live().submit(_client.PUSH_PULL, gidx, garrs, darrs, st,
                                      mv, self._clock + 1,
                                      self._timeout(timeout))
            self._advance(gidx)
        r = Request(req, _client.PUSH_PULL, into, self)
        return r.wait() if wait else r

    def _make_request(self, req: Any, kind: int, value: Any) -> Request:
        return Request(req, kind, value, self)

    def in_flight(self) -> int:
        """Requests submitted whose completion was not yet seen."""
        return self._live().inflight()

    # --- progress, status, admin ---------------------------------------------------------

    def set_progress(self, step: int, loss: float = 0.0, examples_per_sec: float = 0.0,
                     epoch_progress: float = 0.0, done: bool = False) -> None:
        """Progress carried by the next heartbeats (psctl status shows it); ``done=True``
        makes the worker leave the job's sync barriers."""
        self._live().set_progress(int(step), float(loss), float(examples_per_sec),
                                  float(epoch_progress), bool(done))

    def heartbeat(self) -> None:
        """Send a heartbeat to every ready shard now and wait for the replies."""
        self._live().heartbeat()

    def status(self, shard: Optional[int] = None) -> Union[ShardStatus, List[ShardStatus]]:
        """One shard's status, or (shard None) every shard's, in shard order."""
        c = self._live()
        if shard is not None:
            return ShardStatus._from_dict(c.status(int(shard)))
        return [ShardStatus._from_dict(c.status(i)) for i in range(c.info()["num_shards"])]

    def checkpoint(self, shard: int) -> Tuple[str, int]:
        """Admin: have shard write a checkpoint now; returns (path, step)."""
        return self._live().checkpoint(int(shard))

    def shutdown(self, shard: int, checkpoint: bool = True) -> str:
        """Admin: stop shard (after a final checkpoint when asked and the job keeps them);
        returns the final checkpoint's path ("" when none)."""
        return self._live().shutdown(int(shard), bool(checkpoint))

    def __repr__(self) -> str:
        state = "closed" if self._c is None else f"{len(self._names)} tensor(s)"
        return f"<tessera.Client task={self.task} {state}>"


def _log(level: int, msg: str) -> None:
    logger.log(_LEVELS.get(level, logging.INFO), "%s", msg)
