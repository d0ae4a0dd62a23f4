"""Embedding tables on the shards: rows of ``dim`` float32 keyed by int64 ids.

A table is declared with the model (``Client.declare(model, tables={"emb": Table(64)})``).
Its rows are spread over the shards by a hash of the key, made on first touch from the
job's seed, the table's name and the key (so any shard count gives the same rows), and
updated row-wise by the table's own lazy optimizer: a step costs the rows a batch touched,
not the table. Keys travel as int64 arrays and rows as float32 arrays of shape
``(len(keys), dim)``, without copies; a key may repeat (its row comes back each time, and
its gradients are summed).

    import numpy as np, tessera
    with tessera.Client("job.cfg", task=0) as c:
        c.declare({}, tables={"items": tessera.Table(16, optimizer="adagrad")})
        ids = np.array([3, 17, 3, -5], dtype=np.int64)
        rows = c.pull_rows("items", ids)            # (4, 16) float32
        c.push_rows("items", ids, grads)            # grads: (4, 16) float32
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Tuple

import numpy as np

from . import _client

_ROW_INITS = {
    "zeros": _client.ROW_ZEROS,
    "uniform": _client.ROW_UNIFORM,
    "normal": _client.ROW_NORMAL,
    "truncated_normal": _client.ROW_TRUNCATED_NORMAL,
}
_ROW_OPTS = {
    None: _client.ROWOPT_DEFAULT,
    "sgd": _client.ROWOPT_SGD,
    "adagrad": _client.ROWOPT_ADAGRAD,
    "adam": _client.ROWOPT_ADAM,
    "ftrl": _client.ROWOPT_FTRL,
}


@dataclass(frozen=True)
class Table:
    """One embedding table to declare. Every number left 0 takes the shards' default.

    Parameters
    ----------
    dim : int
        The row width, 1 to 4096.
    init : str
        A new row's value: "uniform" (in [-init_scale, init_scale), as Keras's Embedding
        with scale 0.05), "normal" or "truncated_normal" (standard deviation init_scale),
        or "zeros".
    init_scale : float
    optimizer : str, optional
        The row optimizer: "sgd", "adagrad", "adam" (lazy: each row's own step corrects its
        bias) or "ftrl" (FTRL-proximal); None: the job's optimizer (sgd or adam).
    learning_rate : float
        0: the job's.
    beta1, beta2, epsilon, initial_accumulator, l1, l2, beta : float
        The optimizer's settings (0: Keras's defaults).
    admit_count : int
        A key becomes a row once pulled this many times (0, 1: at once); until then pulls
        read the initializer's row and its gradients are dropped (``rows_filtered``).
    admit_probability : float
        In (0, 1): only keys whose hash falls under it become rows (0: every key).
    steps_to_live : int
        Rows untouched for this many of the table's steps are evicted (0: never).
    max_rows : int
        Rows one shard may hold; past it a new row replaces the least recently used (0: no
        count limit; the shards' ``server.max_table_bytes`` always holds).
    """

    dim: int
    init: str = "uniform"
    init_scale: float = 0.05
    optimizer: Optional[str] = None
    learning_rate: float = 0.0
    beta1: float = 0.0
    beta2: float = 0.0
    epsilon: float = 0.0
    initial_accumulator: float = 0.0
    l1: float = 0.0
    l2: float = 0.0
    beta: float = 0.0
    admit_count: int = 0
    admit_probability: float = 0.0
    steps_to_live: int = 0
    max_rows: int = 0

    def wire(self, name: str) -> Tuple[Any, ...]:
        """The tuple the extension's declare takes."""
        if not 1 <= int(self.dim) <= 4096:
            raise ValueError(f"table {name!r}: dim {self.dim} is not in 1 to 4096")
        if self.init not in _ROW_INITS:
            raise ValueError(f"table {name!r}: unknown init {self.init!r}: one of "
                             f"{sorted(_ROW_INITS)}")
        if self.optimizer not in _ROW_OPTS:
            raise ValueError(f"table {name!r}: unknown optimizer {self.optimizer!r}: one of "
                             f"{sorted(k for k in _ROW_OPTS if k)}, or None for the job's")
        return (name, int(self.dim), _ROW_INITS[self.init], float(self.init_scale),
                _ROW_OPTS[self.optimizer], float(self.learning_rate), float(self.beta1),
                float(self.beta2), float(self.epsilon), float(self.initial_accumulator),
                float(self.l1), float(self.l2), float(self.beta), int(self.admit_count),
                float(self.admit_probability), int(self.steps_to_live), int(self.max_rows))


@dataclass(frozen=True)
class RowsPushResult:
    """The outcome of ``push_rows``: the shards' answers, and the rows dropped."""

    applied: int        #: shards that applied the rows at once (async, ssp)
    accumulated: int    #: shards that added them to an open sync step
    stale: int          #: shards that dropped them as stale (sync: an older step)
    duplicate: int      #: shards that had this push already (a retry), or this step's
    rows_filtered: int  #: rows whose keys are not admitted yet: their gradients dropped


def keys_array(keys: Any) -> np.ndarray:
    """keys as a C-contiguous int64 array, without a copy where it is one already."""
    k = np.asarray(keys)
    if k.dtype != np.int64:
        if k.size and not np.issubdtype(k.dtype, np.integer):
            raise ValueError(f"keys: need integers, not {k.dtype}")
        k = k.astype(np.int64)
    return np.ascontiguousarray(k.reshape(-1))


def rows_array(rows: Optional[np.ndarray], n: int, dim: int, role: str,
               writable: bool) -> np.ndarray:
    """A float32 (n, dim) C-contiguous array: rows itself when it is one, else a new one
    (a destination must be one already: it is written in place)."""
    if rows is None:
        return np.zeros((n, dim), dtype=np.float32)
    if writable:
        if not (isinstance(rows, np.ndarray) and rows.dtype == np.float32
                and rows.flags.c_contiguous and rows.flags.writeable):
            raise ValueError(f"{role}: need a writable C-contiguous float32 array")
        return rows
    return np.ascontiguousarray(rows, dtype=np.float32)


class TablesMixin:
    """The row requests of ``tessera.Client`` (its declared tables in ``_table_index`` and
    ``_table_dims``; requests through ``_live()`` and ``_make_request``)."""

    _table_index: "dict[str, int]"
    _table_dims: "list[int]"

    @property
    def tables(self) -> "dict[str, int]":
        """The declared tables and their row widths, in declared order."""
        return {n: self._table_dims[i] for n, i in self._table_index.items()}

    def table_keys(self, table: str) -> np.ndarray:
        """The ids of the table's rows on every shard: int64, ascending, each once.

        What evaluation and export need of a table with no bounded vocabulary (then
        ``pull_rows(table, ids, read_only=True)`` reads their rows). The shards list their
        rows a page at a time; a key present for the whole listing is in it exactly once,
        however much the table grows meanwhile. When rows are evicted or expire during the
        listing, a shard's walk starts again (three times at most; a table evicting all the
        time is then returned as it was walked, so a key evicted meanwhile may still be in
        it: pulling it read-only gives its initial row). Read-only: a worker's token is
        enough.

        Raises
        ------
        tessera.UnknownTable
            No table of that name was declared.
        tessera.TesseraError
            A shard is down, the model is not declared there, or the request failed.
        """
        t, _ = self._table(table)
        raw = self._live().table_keys(t)  # type: ignore[attr-defined]
        return np.frombuffer(raw, dtype="<i8").astype(np.int64, copy=True)

    def _table(self, table: str) -> Tuple[int, int]:
        try:
            i = self._table_index[table]
        except KeyError:
            from ._errors import UnknownTable
            raise UnknownTable(f"no table {table!r} was declared (declared: "
                               f"{sorted(self._table_index)})", _client.ENOTABLE) from None
        return i, self._table_dims[i]

    def pull_rows(self, table: str, keys: Any, into: Optional[np.ndarray] = None, *,
                  wait: bool = True, min_version: Optional[int] = None,
                  timeout: Optional[float] = None, read_only: bool = False) -> Any:
        """Read the rows of ``keys`` (int64, any order, repeats allowed).

        Sync mode waits for the table's next step on every shard (the step after the one
        last pulled); async and ssp take what is there. A key with no row yet gets one,
        made from (seed, table, key), or, when the table's admission has not admitted it,
        the initializer's row. ``read_only=True`` changes nothing on the shards (for
        evaluation and export): a key with no row reads the initializer's row and none is
        made, no admission sighting counted, no row's recency refreshed.

        Parameters
        ----------
        table : str
        keys : array-like of int64
        into : ndarray, optional
            A writable C-contiguous float32 array of shape (len(keys), dim); None: a new one.
        wait : bool, default True
            False: return at once with a Request whose ``wait()`` returns the rows.
        min_version : int, optional
            Wait until the table is at least this version on every shard.
        timeout : float, optional
            This request's deadline in seconds (default: the client's).
        read_only : bool, default False
            Read without making or refreshing rows.

        Returns
        -------
        ndarray or Request
            The rows, row i for keys[i].
        """
        t, dim = self._table(table)
        k = keys_array(keys)
        dst = rows_array(into, k.size, dim, "into", True)
        sync = self.mode == "sync"  # type: ignore[attr-defined]
        mv = (_client.VERSION_NEXT if sync else 0) if min_version is None else int(min_version)
        req = self._live().submit_rows(_client.SPARSE_PULL, t, k, None, dst, 0, mv,  # type: ignore[attr-defined]
                                       self._clock, self._timeout(timeout),  # type: ignore[attr-defined]
                                       _client.ROWS_READ_ONLY if read_only else 0)
        r = self._make_request(req, _client.SPARSE_PULL, dst)  # type: ignore[attr-defined]
        return r.wait() if wait else r

    def push_rows(self, table: str, keys: Any, grads: np.ndarray, *, wait: bool = True,
                  step: Optional[int] = None, timeout: Optional[float] = None) -> Any:
        """Send the gradients of the rows of ``keys``; a repeated key's gradients are summed.

        Sync mode tags each shard's push with the table's version last pulled from it, and
        every shard is sent one (with no rows where none of the keys are its), so each
        shard's step counts this worker; async and ssp apply them at once.

        Parameters
        ----------
        table : str
        keys : array-like of int64
        grads : ndarray
            float32 of shape (len(keys), dim), row i for keys[i].
        wait, step, timeout
            As for ``Client.push``.

        Returns
        -------
        RowsPushResult or Request
        """
        t, dim = self._table(table)
        k = keys_array(keys)
        g = rows_array(grads, k.size, dim, "grads", False)
        sync = self.mode == "sync"  # type: ignore[attr-defined]
        st = (_client.STEP_PULLED if sync else self._clock) if step is None else int(step)  # type: ignore[attr-defined]
        req = self._live().submit_rows(_client.SPARSE_PUSH, t, k, g, None, st, 0,  # type: ignore[attr-defined]
                                       self._clock, self._timeout(timeout))  # type: ignore[attr-defined]
        r = self._make_request(req, _client.SPARSE_PUSH, (k, g))  # type: ignore[attr-defined]
        return r.wait() if wait else r

    def push_pull_rows(self, table: str, keys: Any, grads: np.ndarray,
                       into: Optional[np.ndarray] = None, *, wait: bool = True,
                       step: Optional[int] = None, min_version: Optional[int] = None,
                       timeout: Optional[float] = None) -> Any:
        """``push_rows`` then ``pull_rows`` of the same keys in one round trip: each shard
        applies the push before it answers the pull (sync: the pull waits for the step the
        push takes part in).

        Parameters
        ----------
        table : str
        keys : array-like of int64
        grads : ndarray
            float32 of shape (len(keys), dim), as for ``push_rows``.
        into : ndarray, optional
            Where the rows go, as for ``pull_rows``; no memory shared with ``grads``.
        wait, step, min_version, timeout
            As for ``push_rows`` and ``pull_rows``.

        Returns
        -------
        ndarray or Request
            The rows after the push, row i for keys[i].
        """
        t, dim = self._table(table)
        k = keys_array(keys)
        g = rows_array(grads, k.size, dim, "grads", False)
        dst = rows_array(into, k.size, dim, "into", True)
        sync = self.mode == "sync"  # type: ignore[attr-defined]
        st = (_client.STEP_PULLED if sync else self._clock) if step is None else int(step)  # type: ignore[attr-defined]
        mv = (_client.VERSION_NEXT if sync else 0) if min_version is None else int(min_version)
        req = self._live().submit_rows(_client.SPARSE_PUSH_PULL, t, k, g, dst, st, mv,  # type: ignore[attr-defined]
                                       self._clock, self._timeout(timeout))  # type: ignore[attr-defined]
        r = self._make_request(req, _client.SPARSE_PUSH_PULL, (dst, g))  # type: ignore[attr-defined]
        return r.wait() if wait else r
