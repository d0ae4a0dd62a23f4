"""``tessera.keras.Embedding``: a Keras embedding layer whose table lives on the shards.

A drop-in for ``keras.layers.Embedding`` backed by a Tessera table (``tessera.Table``):
the layer holds no ``[input_dim, output_dim]`` variable. Each forward pass gathers the rows
of the batch's distinct ids from the shards (``np.unique`` + ``Client.pull_rows`` in a
``tf.numpy_function``); its backward pass (``tf.custom_gradient``) sums the gradient per
distinct id (``tf.math.unsorted_segment_sum``) and pushes those rows (``push_rows``), and
the shards update them with the table's row optimizer. Nothing of size
``[input_dim, output_dim]`` exists anywhere: a step costs the rows the batch touched.

The table is declared by the model's ``tessera.keras.Optimizer`` (at its ``build``, with
the model's variables), which also hands the layer its client. The layer has one trainable
scalar, ``tessera_anchor`` (always 0, not on the shards): it makes Keras's gradient tape
run the layer's backward pass, which would otherwise never be asked for (the rows are not
Keras variables).

Imported by ``tessera.keras`` (TensorFlow and Keras already imported there).
"""
from __future__ import annotations

import threading
import warnings
import weakref
from typing import Any, Dict, Optional

import numpy as np
import tensorflow as tf
import keras

from .tables import Table

# Keras's initializer names (and classes) -> (Table init, init_scale).
_INITS = {
    "uniform": ("uniform", 0.05),
    "random_uniform": ("uniform", 0.05),
    "normal": ("normal", 0.05),
    "random_normal": ("normal", 0.05),
    "truncated_normal": ("truncated_normal", 0.05),
    "zeros": ("zeros", 0.0),
}
_ROW_OPTIMIZERS = (None, "sgd", "adagrad", "adam", "ftrl")
_COMBINERS = (None, "sum", "mean", "sqrtn")
# String ids hash into [0, 2^63 - 1): FarmHash's Fingerprint64 (tf.strings.
# to_hash_bucket_fast), the same in every process and on every platform.
_STRING_BUCKETS = (1 << 63) - 1


def _table_init(init: Any) -> tuple:
    """A Keras embeddings_initializer (name, config dict or instance) as (Table init,
    init_scale), or ValueError for one the shards cannot make."""
    if isinstance(init, str):
        key = init.lower()
        if key in _INITS:
            return _INITS[key]
    elif isinstance(init, keras.initializers.RandomUniform):
        lo, hi = float(init.minval), float(init.maxval)
        if lo == -hi and hi > 0:
            return ("uniform", hi)
    elif isinstance(init, keras.initializers.TruncatedNormal):
        if float(init.mean) == 0.0:
            return ("truncated_normal", float(init.stddev))
    elif isinstance(init, keras.initializers.RandomNormal):
        if float(init.mean) == 0.0:
            return ("normal", float(init.stddev))
    elif isinstance(init, keras.initializers.Zeros):
        return ("zeros", 0.0)
    raise ValueError(
        f"tessera.keras.Embedding: embeddings_initializer {init!r} cannot be made on the "
        f"shards: use 'uniform' (Keras's default, [-0.05, 0.05)), 'normal', "
        f"'truncated_normal' (stddev 0.05), 'zeros', or keras.initializers.RandomUniform("
        f"-s, s), RandomNormal(0, s), TruncatedNormal(0, s)")


@keras.saving.register_keras_serializable(package="tessera")
class Embedding(keras.layers.Layer):
    """An embedding layer whose rows live in a table on the Tessera shards.

    A drop-in for ``keras.layers.Embedding``: integer ids of any shape in, float32
    ``ids.shape + (output_dim,)`` out. Each step moves only the rows of the batch's
    distinct ids (a pull in the forward pass, a push of their summed gradients in the
    backward pass); the shards update them with the table's row optimizer.

    Parameters
    ----------
    input_dim : int or None
        The vocabulary size: ids must be in ``[0, input_dim)`` (ValueError otherwise, as
        Keras's layer fails on CPU). None: any int64 id (hashed ids, no bound), or string
        ids, hashed to int64 with FarmHash's Fingerprint64 (``tf.strings.
        to_hash_bucket_fast`` into 2^63 - 1 buckets).
    output_dim : int
        The row width (1 to 4096).
    table : str, optional
        The table's name on the shards (default: the layer's name), one per layer.
    embeddings_initializer : str or keras.initializers.Initializer, default "uniform"
        A new row's value, made on the shards: "uniform" (Keras's default,
        RandomUniform(-0.05, 0.05)), "normal", "truncated_normal" (stddev 0.05), "zeros",
        or RandomUniform(-s, s), RandomNormal(0, s), TruncatedNormal(0, s). Others raise
        ValueError.
    mask_zero : bool, default False
        As Keras's: id 0 (or the empty string) is padding, and the layer's mask is
        ``ids != 0``.
    combiner : str, optional
        Multi-hot: "sum", "mean" or "sqrtn" (sum / sqrt(count)) of the rows of the last
        axis's ids, so ``ids.shape[:-1] + (output_dim,)`` comes out (with ``mask_zero``
        padding ids take no part; a bag of padding only gives zeros). None: one row per id.
    optimizer : str, optional
        The table's row optimizer: "sgd", "adagrad", "adam" (lazy: each row's own step),
        "ftrl"; None: the job's (``optimizer.name``, sgd or adam).
    learning_rate : float, default 0.0
        The row optimizer's learning rate (0: the job's).
    admit_count, steps_to_live, max_rows : int, default 0
        As ``tessera.Table``: admission after that many sightings, eviction of rows
        untouched for that many steps, rows per shard (0: none).
    name : str, optional
        The layer's name (and the table's, by default).
    **kwargs
        More ``tessera.Table`` settings (``beta1``, ``beta2``, ``epsilon``,
        ``initial_accumulator``, ``l1``, ``l2``, ``beta``, ``admit_probability``), then
        Keras layer arguments (``trainable``, ``dtype``).

    Raises
    ------
    ValueError
        An initializer or row optimizer the shards do not have, a bad width.

    Notes
    -----
    The model must be trained with ``tessera.keras.Optimizer``: its ``build`` declares
    the table and hands the layer its client (the layer finds that optimizer itself when
    it runs first, e.g. ``evaluate`` before ``fit``). In sync mode a training step's pull
    waits for the table's next version and the push is tagged with the version pulled;
    ``training=False`` (``evaluate``, ``predict``) reads what is there without making
    rows (an id never trained reads its initial row). Call the layer once per train step
    (no shared use within one step). Not in an XLA-compiled step.

    ``model.save`` writes the trained rows of a bounded vocabulary (``input_dim``), read
    from the shards (``export_rows``); ``keras.saving.load_model`` gives a model whose layer
    holds them and predicts without shards. An unbounded table (``input_dim=None``) is not
    written into the file (the model would need the ids' lookup to predict from them):
    ``export_table()`` returns its ids (listed on the shards) and rows, and ``psctl
    export`` writes them as ``TABLE/ids`` and ``TABLE/rows``.
    """

    _TABLE_KEYS = ("beta1", "beta2", "epsilon", "initial_accumulator", "l1", "l2", "beta",
                   "admit_probability")

    def __init__(self, input_dim: Optional[int], output_dim: int, *,
                 table: Optional[str] = None,
                 embeddings_initializer: Any = "uniform", mask_zero: bool = False,
                 combiner: Optional[str] = None, optimizer: Optional[str] = None, learning_rate: float = 0.0,
                 admit_count: int = 0, steps_to_live: int = 0, max_rows: int = 0,
                 name: Optional[str] = None, **kwargs: Any):
        table_kw = {k: kwargs.pop(k) for k in self._TABLE_KEYS if k in kwargs}
        kwargs.pop("input_length", None)             # Keras 2's, ignored as Keras 3 does
        super().__init__(name=name, **kwargs)
        if input_dim is not None and int(input_dim) <= 0:
            raise ValueError(f"tessera.keras.Embedding: input_dim must be positive or None, "
                             f"not {input_dim}")
        if not 1 <= int(output_dim) <= 4096:
            raise ValueError(f"tessera.keras.Embedding: output_dim {output_dim} is not in "
                             f"1 to 4096")
        if combiner is not None:
            combiner = str(combiner).lower()
        if combiner not in _COMBINERS:
            raise ValueError(f"tessera.keras.Embedding: combiner {combiner!r} is not one of "
                             f"'sum', 'mean', 'sqrtn' (None: one row per id)")
        self.combiner = combiner
        if optimizer is not None:
            optimizer = str(optimizer).lower()
        if optimizer not in _ROW_OPTIMIZERS:
            raise ValueError(f"tessera.keras.Embedding: row optimizer {optimizer!r} is not "
                             f"one of 'sgd', 'adagrad', 'adam', 'ftrl' (None: the job's)")
        self.input_dim = None if input_dim is None else int(input_dim)
        self.output_dim = int(output_dim)
        self.table = str(table) if table else self.name
        self.embeddings_initializer = embeddings_initializer
        init, scale = _table_init(embeddings_initializer)
        self.mask_zero = bool(mask_zero)
        self.supports_masking = self.mask_zero
        self.row_optimizer = optimizer
        self.learning_rate = float(learning_rate)
        self.admit_count = int(admit_count)
        self.steps_to_live = int(steps_to_live)
        self.max_rows = int(max_rows)
        self._table_kw = dict(table_kw)
        self._spec = Table(self.output_dim, init=init, init_scale=scale, optimizer=optimizer,
                           learning_rate=self.learning_rate, admit_count=self.admit_count,
                           steps_to_live=self.steps_to_live, max_rows=self.max_rows,
                           **{k: float(v) for k, v in table_kw.items()})
        self._spec.wire(self.table)                  # checks now, not at the first step
        self._opt_ref: Optional[weakref.ref] = None  # the tessera.keras.Optimizer
        self._traced: "weakref.WeakSet[Any]" = weakref.WeakSet()  # graphs traced for training
        self._rows_lock = threading.Lock()
        self._version: Optional[int] = None          # sync: the table's version last trained on
        self.pulled_rows = 0    #: rows pulled (distinct ids per call), for traffic checks
        self.pushed_rows = 0    #: rows pushed
        self.calls = 0          #: forward passes that pulled
        self.last_push = None   #: the RowsPushResult of the last push
        self.stale_pushes = 0   #: pushes some shard found stale or duplicate (sync)
        self._loaded: Optional[np.ndarray] = None    # rows read from a saved model

    # -- Keras -------------------------------------------------------------------------

    def build(self, input_shape=None):
        # The one variable: a trainable 0 through which Keras's tape reaches the layer's
        # backward pass. The rows are not Keras variables.
        self._anchor = self.add_weight(shape=(), initializer="zeros", trainable=True,
                                       name="tessera_anchor", dtype="float32")
        self._anchor._tessera_embedding = weakref.ref(self)
        self.built = True

    @property
    def table_spec(self) -> Table:
        """The ``tessera.Table`` this layer declares."""
        return self._spec

    def compute_output_shape(self, input_shape):
        if self.combiner:
            return tuple(input_shape)[:-1] + (self.output_dim,)
        return tuple(input_shape) + (self.output_dim,)

    def compute_mask(self, inputs, mask=None):
        if not self.mask_zero or self.combiner:
            return None
        return self._pad_mask(inputs)

    @staticmethod
    def _pad_mask(inputs):
        """ids != padding (0, or the empty string); symbolic inputs (a functional model's
        KerasTensor) too."""
        if keras.backend.standardize_dtype(inputs.dtype) == "string":
            return keras.ops.not_equal(inputs, "")
        return keras.ops.not_equal(inputs, 0)

    def _ids(self, inputs):
        """The int64 ids of the input (string ids hashed)."""
        ids = tf.convert_to_tensor(inputs)
        if ids.dtype == tf.string:
            if self.input_dim is not None:
                raise ValueError(f"tessera.keras.Embedding {self.name!r}: string ids need an "
                                 f"unbounded table (input_dim=None), not input_dim "
                                 f"{self.input_dim}")
            hashed = tf.strings.to_hash_bucket_fast(ids, _STRING_BUCKETS)
            # With mask_zero the empty string is padding: id 0, as for integer ids.
            return tf.where(tf.equal(ids, ""), tf.zeros_like(hashed), hashed) \
                if self.mask_zero else hashed
        return ids if ids.dtype == tf.int64 else tf.cast(ids, tf.int64)  # as Keras casts

    def _combine(self, inputs, rows):
        """The combiner over the last axis of ids (rows: ids.shape + (dim,))."""
        if self.mask_zero:
            keep = tf.cast(self._pad_mask(tf.convert_to_tensor(inputs)), rows.dtype)
        else:
            keep = tf.ones(tf.shape(rows)[:-1], rows.dtype)
        total = tf.reduce_sum(rows * keep[..., None], axis=-2)
        if self.combiner == "sum":
            return total
        count = tf.reduce_sum(keep, axis=-1, keepdims=True)
        div = count if self.combiner == "mean" else tf.sqrt(count)
        return tf.math.divide_no_nan(total, div)

    def call(self, inputs, training=None):
        ids = self._ids(inputs)
        if training is True and not tf.executing_eagerly():
            # A second training call in one traced step would pull the next version
            # again: in sync mode it would wait for a step that never comes.
            graph = tf.compat.v1.get_default_graph()
            if any(g is graph for g in self._traced):
                raise ValueError(
                    f"tessera.keras.Embedding {self.name!r} is called twice in one train "
                    f"step: call it once (concatenate the ids of its inputs), or give each "
                    f"use a layer and table of its own")
            self._traced.add(graph)
        self._find_optimizer()
        train = bool(training) if isinstance(training, (bool, type(None))) else training
        rows = self._lookup(ids, tf.convert_to_tensor(train if train is not None else False,
                                                      tf.bool), self._anchor.value)
        return self._combine(inputs, rows) if self.combiner else rows

    def get_config(self):
        cfg = super().get_config()
        init = self.embeddings_initializer
        if not isinstance(init, str):
            init = keras.initializers.serialize(init)
        cfg.update(input_dim=self.input_dim, output_dim=self.output_dim, table=self.table,
                   embeddings_initializer=init, mask_zero=self.mask_zero,
                   combiner=self.combiner, optimizer=self.row_optimizer, learning_rate=self.learning_rate,
                   admit_count=self.admit_count, steps_to_live=self.steps_to_live,
                   max_rows=self.max_rows, **self._table_kw)
        return cfg

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        init = config.get("embeddings_initializer")
        if isinstance(init, dict):
            config["embeddings_initializer"] = keras.initializers.deserialize(init)
        return cls(**config)

    # -- saving ------------------------------------------------------------------------

    def save_own_variables(self, store):
        super().save_own_variables(store)
        if self._loaded is not None and not self._attached():
            store["rows"] = self._loaded
        elif self.input_dim is not None and self._attached():
            store["rows"] = self.export_rows()
        elif self._attached():
            warnings.warn(
                f"tessera.keras.Embedding {self.name!r}: the rows of its unbounded table "
                f"{self.table!r} are not saved with the model: export them with "
                f"layer.export_table() (ids and rows) or `psctl export`", stacklevel=2)

    def load_own_variables(self, store):
        rows = store["rows"] if "rows" in store else None
        anchor = {k: store[k] for k in store.keys() if k != "rows"}
        super().load_own_variables(anchor)
        if rows is not None:
            rows = np.asarray(rows, dtype=np.float32)
            if rows.shape != (self.input_dim, self.output_dim):
                raise ValueError(f"tessera.keras.Embedding {self.name!r}: the saved rows are "
                                 f"{rows.shape}, the layer's table is "
                                 f"({self.input_dim}, {self.output_dim})")
            self._loaded = rows

    @property
    def loaded_rows(self) -> Optional[np.ndarray]:
        """The rows read from a saved model (``load_model``), or None."""
        return self._loaded

    def use_shard_rows(self) -> None:
        """Forget the rows loaded from a saved model: the layer reads the shards' table
        again (to train on a job whose table holds the rows, e.g. the same live job)."""
        self._loaded = None

    def export_rows(self, ids: Any = None, *, chunk: int = 1 << 18) -> np.ndarray:
        """The rows of ``ids`` (default: every id of a bounded vocabulary,
        ``[0, input_dim)``), read from the shards without changing them: an id never
        trained reads its initial row. Raises ValueError for an unbounded table without
        ids: :meth:`export_table` lists its ids on the shards."""
        if ids is None:
            if self.input_dim is None:
                raise ValueError(f"tessera.keras.Embedding {self.name!r}: an unbounded table "
                                 f"has no id list: pass the ids to export, or call "
                                 f"layer.export_table() for the ids the shards hold")
            ids = np.arange(self.input_dim, dtype=np.int64)
        ids = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
        if self._loaded is not None and not self._attached():
            return self._loaded[ids]
        c = self._client()
        out = np.empty((ids.size, self.output_dim), np.float32)
        step = max(1, min(chunk, (32 << 20) // (4 * self.output_dim)))
        for i in range(0, ids.size, step):
            c.pull_rows(self.table, ids[i:i + step], into=out[i:i + step], min_version=0,
                        read_only=True)
        return out

    def export_table(self, *, chunk: int = 1 << 18) -> "tuple[np.ndarray, np.ndarray]":
        """The ids the table's rows have on the shards (int64, ascending, each once:
        ``Client.table_keys``) and their rows (float32, ``[n, output_dim]``), read without
        changing the shards; for a bounded vocabulary too (then only the ids with a row).
        Needs the layer attached to a live job (compiled with a tessera optimizer and
        built)."""
        if self._loaded is not None and not self._attached():
            ids = np.arange(self._loaded.shape[0], dtype=np.int64)
            return ids, self._loaded
        ids = self._client().table_keys(self.table)
        return ids, self.export_rows(ids, chunk=chunk)

    # -- the shards --------------------------------------------------------------------

    def _attached(self) -> bool:
        opt = self._opt_ref() if self._opt_ref is not None else None
        return opt is not None and opt.client is not None

    def _attach(self, opt: Any) -> None:
        """Called by the Optimizer's build once the table is declared."""
        if self._loaded is not None:
            raise ValueError(
                f"tessera.keras.Embedding {self.name!r} holds rows loaded from a saved model; "
                f"the shards do not take rows from a file, so training it would use the "
                f"table {self.table!r} as the job holds it and drop them silently. Predict "
                f"with the loaded model without an optimizer, or call "
                f"layer.use_shard_rows() to train on the job's table")
        self._opt_ref = weakref.ref(opt)
        self._version = None

    def _client(self):
        opt = self._opt_ref() if self._opt_ref is not None else None
        if opt is None or opt.client is None:
            raise RuntimeError(
                f"tessera.keras.Embedding {self.name!r}: no tessera.keras.Optimizer has "
                f"declared its table {self.table!r}: compile the model with "
                f"tessera.keras.Optimizer(...) (or optimizer(JOBFILE, task=T)) and train or "
                f"evaluate it, or call opt.build(model.trainable_variables) first")
        return opt.client

    def _find_optimizer(self) -> None:
        """Not attached yet (the layer runs before Keras builds the optimizer: evaluate
        before fit, run_eagerly): build the tessera Optimizer of a model holding this
        layer, which declares the table and attaches the layer. Runs while tracing (or
        eagerly), never inside the step's host calls."""
        if self._opt_ref is not None and self._opt_ref() is not None:
            return
        from . import keras as _tk
        for opt in list(_tk._OPTIMIZERS):
            if opt.client is None or opt.built:
                continue
            model = opt._model or _tk._model_of(opt)
            if model is None or not any(l is self for l in model._flatten_layers()):
                continue
            with tf.init_scope():
                opt.build(model.trainable_variables)
            return

    def _pull(self, ids: np.ndarray, training: np.ndarray):
        """Host side of the forward pass: the distinct ids' rows, and each id's index."""
        flat = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
        if self.input_dim is not None and flat.size and (
                flat.min() < 0 or flat.max() >= self.input_dim):
            bad = flat[(flat < 0) | (flat >= self.input_dim)][0]
            raise ValueError(f"tessera.keras.Embedding {self.name!r}: id {bad} is not in "
                             f"[0, {self.input_dim})")
        uniq, inv = np.unique(flat, return_inverse=True)
        if self._loaded is not None and not self._attached():
            if bool(training):
                raise RuntimeError(
                    f"tessera.keras.Embedding {self.name!r} holds rows loaded from a saved "
                    f"model and has no tessera.keras.Optimizer: it predicts and evaluates; to "
                    f"train, compile with tessera.keras.Optimizer (see use_shard_rows)")
            return (uniq, inv.reshape(-1).astype(np.int64), self._loaded[uniq],
                    np.int64(0))
        c = self._client()
        sync = c.mode == "sync"
        with self._rows_lock:
            if bool(training) and sync:
                # The table's next version (the step after the one this layer trained on);
                # explicit rather than the client's VERSION_NEXT, so that pulls of
                # evaluate/predict in between (which take what is there) do not move it.
                mv = 0 if self._version is None else self._version + 1
            else:
                mv = 0
            pad = self._pad_at(uniq)
            keys = uniq if pad < 0 else np.delete(uniq, pad)
            req = c.pull_rows(self.table, keys, wait=False, min_version=mv,
                              read_only=not bool(training))
            rows = req.wait()
            version = int(req._req.result()["version"])
            if bool(training):
                self._version = version
            self.pulled_rows += int(keys.size)
            self.calls += 1
        if pad >= 0:
            rows = np.insert(rows, pad, 0.0, axis=0)
        return uniq, inv.reshape(-1).astype(np.int64), rows, np.int64(version)

    def _pad_at(self, uniq: np.ndarray) -> int:
        """Where padding (id 0) is among the sorted distinct ids when the combiner leaves it
        out (mask_zero with a combiner: it is neither pulled nor pushed), else -1."""
        if not (self.mask_zero and self.combiner):
            return -1
        i = int(np.searchsorted(uniq, 0))
        return i if i < uniq.size and uniq[i] == 0 else -1

    def _push(self, uniq: np.ndarray, grads: np.ndarray, version: np.ndarray) -> np.float32:
        """Host side of the backward pass: push the distinct ids' summed gradients."""
        c = self._client()
        g = np.ascontiguousarray(grads, dtype=np.float32).reshape(uniq.size, self.output_dim)
        pad = self._pad_at(uniq)
        if pad >= 0:
            uniq, g = np.delete(uniq, pad), np.delete(g, pad, axis=0)
        step = int(version) if c.mode == "sync" else None
        res = c.push_rows(self.table, np.ascontiguousarray(uniq, np.int64), g, step=step)
        with self._rows_lock:
            self.pushed_rows += int(uniq.size)
            self.last_push = res
            self.stale_pushes += int(res.stale > 0 or res.duplicate > 0)
        return np.float32(0.0)

    def _unpulled(self, ids: np.ndarray, training: np.ndarray):
        """The forward pass's host side once Ctrl-C stopped the step (tessera.keras's
        _stoppable): zero rows, nothing asked of the shards."""
        uniq, inv = np.unique(np.asarray(ids, np.int64).reshape(-1), return_inverse=True)
        return (uniq, inv.reshape(-1).astype(np.int64),
                np.zeros((uniq.size, self.output_dim), np.float32),
                np.int64(self._version or 0))

    def _lookup(self, ids, training, anchor):
        from .keras import _stoppable
        dim = self.output_dim
        pull = _stoppable(self._pull, self._unpulled)
        push = _stoppable(self._push, lambda *_a: np.float32(0.0))

        @tf.custom_gradient
        def lookup(anchor_in):
            uniq, inv, rows, version = tf.numpy_function(
                pull, [ids, training], [tf.int64, tf.int64, tf.float32, tf.int64],
                stateful=True, name="tessera_pull_rows")
            uniq.set_shape([None])
            inv.set_shape([None])
            rows.set_shape([None, dim])
            out = tf.reshape(tf.gather(rows, inv),
                             tf.concat([tf.shape(ids, out_type=tf.int32), [dim]], 0))
            out = tf.ensure_shape(out, ids.shape.concatenate([dim]))

            def grad(dy):
                g = tf.math.unsorted_segment_sum(tf.reshape(dy, [-1, dim]),
                                                 tf.cast(inv, tf.int32),
                                                 tf.shape(uniq, out_type=tf.int32)[0])
                done = tf.numpy_function(push, [uniq, g, version], tf.float32,
                                         stateful=True, name="tessera_push_rows")
                # The anchor's gradient: 0, but after the push (the optimizer's step
                # waits for it).
                return tf.zeros_like(anchor_in) + done

            return out, grad

        return lookup(anchor)


@keras.saving.register_keras_serializable(package="tessera")
class EmbeddingBag(Embedding):
    """``tessera.keras.Embedding`` for multi-hot features: each example's bag of ids (the
    last axis; pad with 0 and ``mask_zero=True`` for bags of different sizes) gives one
    row, their ``combiner`` ("mean" by default, "sum", "sqrtn"), as TensorFlow's
    ``embedding_lookup_sparse`` and PyTorch's ``nn.EmbeddingBag``. Same arguments
    otherwise."""

    def __init__(self, input_dim: Optional[int], output_dim: int, *,
                 combiner: str = "mean", **kwargs: Any):
        if combiner is None:
            raise ValueError("tessera.keras.EmbeddingBag: combiner must be 'sum', 'mean' or "
                             "'sqrtn' (tessera.keras.Embedding gives one row per id)")
        super().__init__(input_dim, output_dim, combiner=combiner, **kwargs)


def embedding_layers(model: "keras.Model") -> Dict[str, Any]:
    """The model's layers that are tessera Embeddings, and the stock Keras Embeddings."""
    ours, stock = [], []
    for layer in model._flatten_layers(include_self=False):
        if isinstance(layer, Embedding):
            ours.append(layer)
        elif isinstance(layer, keras.layers.Embedding):
            stock.append(layer)
    return {"tessera": ours, "keras": stock}


class StockEmbeddingError(ValueError):
    """A model trained with tessera.keras holds a keras.layers.Embedding: each step would
    push and pull its whole table (a dense [input_dim, dim] gradient)."""


def stock_embedding_error(layers) -> StockEmbeddingError:
    names = ", ".join(repr(l.name) for l in layers)
    l0 = layers[0]
    return StockEmbeddingError(
        f"tessera.keras.Optimizer: the model has keras.layers.Embedding layer(s) {names}: "
        f"trained on the shards as a dense tensor each step would push and pull the whole "
        f"[{l0.input_dim}, {l0.output_dim}] table. Replace keras.layers.Embedding(...) with "
        f"tessera.keras.Embedding(...) (same arguments; its rows live in a table on the "
        f"shards and a step moves only the rows its batch touches), or pass "
        f"dense_embeddings=True to the optimizer to train the whole table each step")


def _anchor_layer(variable: Any) -> Optional[Embedding]:
    ref = getattr(variable, "_tessera_embedding", None)
    return ref() if ref is not None else None


def tables_of(layers) -> Dict[str, Table]:
    """The tables to declare for these layers, one each: two layers pushing to one table
    in a step would be two pushes of one worker for one sync step (the second dropped as
    a duplicate)."""
    out: Dict[str, Table] = {}
    for layer in layers:
        if layer.table in out:
            raise ValueError(f"tessera.keras.Embedding: two layers use table "
                             f"{layer.table!r}: give each layer a table of its own (table=)")
        out[layer.table] = layer.table_spec
    return out


__all__ = ["Embedding", "EmbeddingBag", "StockEmbeddingError"]
