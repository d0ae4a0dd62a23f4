"""Keras 3 (TensorFlow backend) models trained on Tessera shards.

Change only the optimizer of a standard Keras training loop::

    import keras, tessera.keras
    model = keras.Sequential([...])
    model.compile(optimizer=tessera.keras.optimizer("job.cfg", task=0),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(x, y, batch_size=64, epochs=3, shuffle=False)

The optimizer declares the model's trainable variables on the job's shards under their
Keras paths (``variable.path``, e.g. ``conv2d/kernel``), in the model's order, and after
them the model's non-trainable float variables (BatchNormalization's moving mean and
variance, frozen layers' weights) as state tensors. The job starts from the model's own
values, as TensorFlow's chief initialises the variables: task 0 sends its variables' values
with the declaration (Keras's initialisers, loaded or pretrained weights, ``set_weights``
before ``fit``) and every other worker receives them before step 1; a job whose shards hold
the model already (restored from a checkpoint, or trained before) goes on from theirs.
Each step it pushes the gradients (and the state variables' values: the shards keep their
mean over the workers) and assigns the parameters pulled back: one round trip per bucket of variables, each bucket sent as soon
as backpropagation has produced its gradients (the last layers' first), while the earlier
layers' gradients are still being computed; the update itself runs on the shards with the
job's ``optimizer`` section, in the job's mode (sync: the shards average the workers'
gradients of a step and drop stale ones, as TensorFlow's SyncReplicasOptimizer; async:
each push is applied as it comes). The Keras-side optimizer does no arithmetic: its
learning rate, weight decay, gradient clipping, EMA and loss scaling are not used.

Saved models (``model.save``, ``keras.callbacks.ModelCheckpoint``) load anywhere with
``keras.models.load_model`` once ``tessera.keras`` is imported (the optimizer is registered
as ``tessera>Optimizer``; its config holds nothing of the job), with no shard reachable:
the loaded model predicts as the saving worker's did, and its optimizer is inert (it
warns, and refuses to train). Without the import, ``load_model(path, compile=False)``.

Embeddings: ``tessera.keras.Embedding(input_dim, output_dim, ...)`` replaces
``keras.layers.Embedding``: its rows live in a table on the shards (declared by the
optimizer with the model), each step pulls the rows of the batch's distinct ids and pushes
their summed gradients, and the shards update them with the table's row optimizer
(``tessera.keras_embedding``). A stock ``keras.layers.Embedding`` would push and pull its
whole table every step: the optimizer refuses it (``StockEmbeddingError``) unless given
``dense_embeddings=True``.

TensorFlow and Keras are imported when this module is, not by ``import tessera``.
"""
from __future__ import annotations

import functools
import os
import logging
import threading
import warnings
import weakref
from typing import Any, Dict, List, Optional, Sequence, Union

import numpy as np

from . import _mismatch
from . import client as _client_mod
from ._errors import ShapeError

try:  # lazily: tessera itself does not need TensorFlow
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    import tensorflow as tf  # noqa: E402
    import keras  # noqa: E402
except ImportError as _e:  # pragma: no cover - exercised where TF is missing
    raise ImportError(
        "tessera.keras needs TensorFlow 2.16+ with Keras 3 (TensorFlow backend): "
        "pip install tensorflow-cpu (or tensorflow); "
        f"importing it failed: {_e}") from _e

if not keras.__version__.startswith("3."):  # pragma: no cover
    raise ImportError(f"tessera.keras needs Keras 3, found keras {keras.__version__}")
if keras.backend.backend() != "tensorflow":  # pragma: no cover
    raise ImportError(f"tessera.keras needs the TensorFlow backend of Keras, not "
                      f"{keras.backend.backend()!r} (set KERAS_BACKEND=tensorflow)")

_log = logging.getLogger("tessera")

__all__ = ["Optimizer", "optimizer", "buckets", "ProgressCallback", "InertOptimizerWarning",
           "Embedding", "EmbeddingBag", "StockEmbeddingError"]

#: Every live tessera Optimizer: an Embedding layer that runs before its model's optimizer
#: is built (evaluate before fit, run_eagerly) finds and builds it from here.
_OPTIMIZERS: "weakref.WeakSet[Any]" = weakref.WeakSet()


class InertOptimizerWarning(UserWarning):
    """An Optimizer was rebuilt from a saved config (load_model, clone_model): it has no
    job, so the model predicts and evaluates but cannot train."""


_INERT_WARNING = ("tessera.keras.Optimizer rebuilt from a saved config (load_model, "
                  "clone_model) is inert: no job, no connection to shards. The model can "
                  "predict and evaluate; to train on shards, compile with "
                  "tessera.keras.optimizer(JOBFILE, task=T)")
_INERT_ERROR = ("tessera.keras.Optimizer: this optimizer was rebuilt from a saved config "
                "(load_model, clone_model) and has no job, so it cannot train; compile the "
                "model with tessera.keras.optimizer(JOBFILE, task=T) to train on shards")


@keras.saving.register_keras_serializable(package="tessera")
class Optimizer(keras.optimizers.Optimizer):
    """A Keras optimizer whose update runs on Tessera shards.

    Parameters
    ----------
    client : tessera.Client, str, os.PathLike or None
        A connected ``tessera.Client`` (the optimizer does not close it), or a job file
        path (then ``task``, ``overrides`` and the other keyword arguments go to
        ``tessera.Client``, and the optimizer owns and closes the client: ``close()``), or
        None for an inert optimizer (below).
    task : int, optional
        This worker's task, with a job file.
    overrides : sequence of str, default ()
        ``"KEY=VALUE"`` overrides of the job file.
    bucket_bytes : int, optional
        The variables' gradients go in buckets of consecutive variables of at least this
        many bytes, one ``push_pull`` each (default: see ``buckets``).
    name : str, default "tessera"
        The optimizer's Keras name.
    model : keras.Model, optional
        The model it trains (default: found from its variables), whose non-trainable
        float variables (BatchNorm's moving statistics) are kept on the shards as state.
    state_every : int, optional
        Steps between pushes of the state (default: the job's train.state_every).
    dense_embeddings : bool, default False
        Accept ``keras.layers.Embedding`` layers, trained as dense tensors: each step
        pushes and pulls the whole ``[input_dim, output_dim]`` table (fine for a small
        vocabulary). By default such a model is refused (``StockEmbeddingError``, a
        ValueError): use ``tessera.keras.Embedding``, whose steps move only the rows a
        batch touches.
    **client_kwargs
        More ``tessera.Client`` arguments, with a job file.

    Raises
    ------
    ValueError
        ``bucket_bytes`` or ``state_every`` is not positive.
    StockEmbeddingError
        At ``build``: the model has a ``keras.layers.Embedding`` (see ``dense_embeddings``).
    TypeError
        Client arguments given with a Client or with None.

    Notes
    -----
    ``client=None`` makes an inert optimizer, what ``from_config`` (``load_model``,
    ``clone_model``) rebuilds: no client and no connection; ``build`` declares nothing,
    and training (``apply``), ``pull`` and ``finish`` raise RuntimeError. The saved config
    holds no job: training again needs a new ``optimizer(JOBFILE, task=T)``.

    On ``build`` (Keras calls it once, eagerly, before the first step of ``fit``) the
    model's trainable variables are declared on the shards under their paths and their
    values pulled from the shards. ``apply``/``apply_gradients`` push the gradients and
    assign the pulled parameters, through ``tf.numpy_function`` (numpy on the host), so
    the train step must not be XLA-compiled: ``compile(..., jit_compile=False)`` where
    Keras would choose XLA by itself (where a GPU is present); a step traced for XLA
    raises a RuntimeError saying so.
    """

    def __init__(self, client: Union["_client_mod.Client", str, os.PathLike, None], *,
                 task: Optional[int] = None, overrides: Sequence[str] = (),
                 bucket_bytes: Optional[int] = None, name: str = "tessera",
                 model: Optional["keras.Model"] = None, state_every: Optional[int] = None,
                 dense_embeddings: bool = False, **client_kwargs: Any):
        super().__init__(learning_rate=0.0, name=name)
        if state_every is not None and int(state_every) <= 0:
            raise ValueError(f"state_every must be positive, not {state_every}")
        self._state_every = None if state_every is None else int(state_every)
        self.dense_embeddings = bool(dense_embeddings)
        self._model = model
        self._state_vars: List[Any] = []
        self._n_train = 0
        if bucket_bytes is not None and int(bucket_bytes) <= 0:
            raise ValueError(f"bucket_bytes must be positive, not {bucket_bytes}")
        self.bucket_bytes = None if bucket_bytes is None else int(bucket_bytes)
        if client is None:                       # inert (from_config)
            if task is not None or overrides or client_kwargs:
                raise TypeError("task, overrides and client keyword arguments go with a job "
                                "file, not with client=None")
            self.client = None
            self._owns_client = False
        elif isinstance(client, _client_mod.Client):
            if task is not None or overrides or client_kwargs:
                raise TypeError("task, overrides and client keyword arguments go with a job "
                                "file, not with a Client")
            self.client = client
            self._owns_client = False
        else:
            self.client = _client_mod.Client(client, task=task, overrides=overrides,
                                             **client_kwargs)
            self._owns_client = True
        self._tessera_names: List[str] = []
        self._params: List[np.ndarray] = []
        self._grads: List[np.ndarray] = []
        self._buckets: List[List[int]] = []          # variable indices, backprop order
        self._bucket_args: List[tuple] = []          # (grads dict, into dict) per bucket
        self._versions: List[int] = []               # sync: version of each bucket's params
        self._inflight: List[Optional[_client_mod.Request]] = []
        self.tessera_steps = 0        #: steps pushed by this optimizer
        self.last_push = None         #: the PushResult of the last step
        _OPTIMIZERS.add(self)

    # -- Keras hooks ---------------------------------------------------------------------

    def build(self, variables):
        if self.built:
            return
        if self.client is None:                  # inert: nothing to declare
            return keras.optimizers.Optimizer.build(self, list(variables))
        variables = list(variables)
        found = self._model or _model_of(self)
        layers = _embedding_layers(found, variables, self.dense_embeddings)
        tables = _kemb.tables_of(layers)
        all_variables = variables
        variables = [v for v in variables if _kemb._anchor_layer(v) is None]
        if not variables and not tables:
            raise ValueError("tessera.keras.Optimizer: the model has no trainable variables "
                             "to train on the shards (build the model first, e.g. call it "
                             "on a batch or give it an Input)")
        names = [v.path for v in variables]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"tessera.keras.Optimizer: variables share the path(s) {dup}; "
                             f"give the layers distinct names")
        for v in variables:
            if v.dtype != "float32":
                raise ValueError(f"tessera.keras.Optimizer: variable {v.path} is {v.dtype}; "
                                 f"the shards hold float32 (no mixed-precision policy)")
        super().build(all_variables)
        state = _state_variables(found, all_variables)
        snames = [v.path for v in state]
        clash = sorted(set(names) & set(snames))
        if clash:
            raise ValueError(f"tessera.keras.Optimizer: variables share the path(s) {clash}; "
                             f"give the layers distinct names")
        model = {n: _client_mod.Tensor(tuple(int(d) for d in v.shape))
                 for n, v in zip(names, variables)}
        model.update({n: _client_mod.Tensor(tuple(int(d) for d in v.shape), kind="state")
                      for n, v in zip(snames, state)})
        every = list(variables) + state
        # Keras builds the optimizer while it traces the first train step (tf.function):
        # the values are read and assigned eagerly, before that step runs, not as ops of
        # the traced step.
        with tf.init_scope():
            own = {n: np.array(v.numpy(), np.float32) for n, v in zip(names + snames, every)}
            try:
                params = self.client.declare(model, values=own, tables=tables)
            except ShapeError as e:
                raise _model_mismatch(e, len(model)) from e
            _log.info("tessera.keras: the job starts from %s's values",
                      self.client.values_source)
            self._tessera_names = names + snames
            self._state_vars = state
            # (No list of the variables kept on self: Keras's tracker would take them for
            # the optimizer's own variables, and save them with it.)
            for layer in layers:
                layer._attach(self)
            self._n_train = len(names)
            self._params = [params[n] for n in self._tessera_names]
            self._grads = [np.zeros(p.shape, np.float32) for p in self._params]
            self._buckets = buckets([p.nbytes for p in self._params[:self._n_train]],
                                    self.bucket_bytes)
            if state:  # last, in a bucket of its own: values, not gradients
                self._buckets.append(list(range(self._n_train, len(self._params))))
            allnames = self._tessera_names
            self._bucket_args = [({allnames[i]: self._grads[i] for i in b},
                                  {allnames[i]: self._params[i] for i in b})
                                 for b in self._buckets]
            self._inflight = [None] * len(self._buckets)
            self._versions = [self.client.last_version] * len(self._buckets)
            for v, p in zip(every, self._params):
                v.assign(p)

    def _submit(self, b: int, *grads) -> np.int64:
        """Bucket b's gradients are computed: copy them out of TensorFlow's tensors and
        send them (push_pull, not waited for) while backpropagation goes on."""
        if self._inflight[b] is not None:        # left by a step that failed half-way
            r, self._inflight[b] = self._inflight[b], None
            try:
                r.wait()
            except Exception:                    # noqa: BLE001 - reported by that step
                pass
        for i, g in zip(self._buckets[b], grads):
            np.copyto(self._grads[i], np.asarray(g).reshape(self._grads[i].shape))
        if self._buckets[b][0] >= self._n_train and self.tessera_steps % self.state_every:
            # The state's values stay this worker's own until its next exchange.
            for i in self._buckets[b]:
                np.copyto(self._params[i], self._grads[i])
            return np.int64(b)
        g, into = self._bucket_args[b]
        if self.client.mode == "sync":
            # Tagged with the version these parameters came from; the pull waits for the
            # next one of the same tensors, whatever the other buckets' replies did.
            v = self._versions[b]
            self._inflight[b] = self.client.push_pull(g, into, wait=False, step=v,
                                                      min_version=v + 1)
        else:
            self._inflight[b] = self.client.push_pull(g, into, wait=False)
        return np.int64(b)

    def _collect(self, *_order) -> List[np.ndarray]:
        """Every bucket sent: wait for the pulled parameters and hand them to TensorFlow."""
        applied = accumulated = stale = duplicate = 0
        version = None
        for b, r in enumerate(self._inflight):
            if r is None:                        # state not exchanged this step
                continue
            self._inflight[b] = None
            res = r.wait()
            self._versions[b] = res.version
            applied += res.applied
            accumulated += res.accumulated
            stale += res.stale
            duplicate += res.duplicate
            version = res.version if version is None else min(version, res.version)
        self.last_push = _client_mod.PushResult(applied, accumulated, stale, duplicate,
                                                version or 0)
        self.tessera_steps += 1
        return [p.copy() for p in self._params]

    def _unchanged(self, *_order) -> List[np.ndarray]:
        """The step was stopped by Ctrl-C (see _stoppable): its requests failed; hand
        TensorFlow the parameters the variables have (those of the last step pulled; a
        pull reply cut off half-way leaves some of the next step's values in)."""
        self._inflight = [None] * len(self._buckets)
        return [p.copy() for p in self._params]

    def apply(self, grads, trainable_variables=None):
        if self.client is None:
            raise RuntimeError(_INERT_ERROR)
        if trainable_variables is None:
            trainable_variables = self._trainable_variables
        else:
            trainable_variables = list(trainable_variables)
        if not self.built:
            # Outside fit (a custom loop): build here, eagerly.
            self.build(trainable_variables)
            self.built = True
        _refuse_xla()
        # The Embedding layers' anchors (always 0, not on the shards): their gradients
        # come after the layers' row pushes, which the step then waits for.
        pushed = [g for g, v in zip(grads, trainable_variables)
                  if _kemb._anchor_layer(v) is not None]
        grads = [g for g, v in zip(grads, trainable_variables)
                 if _kemb._anchor_layer(v) is None]
        trainable_variables = [v for v in trainable_variables
                               if _kemb._anchor_layer(v) is None]
        if [v.path for v in trainable_variables] != self._tessera_names[:self._n_train]:
            raise ValueError("tessera.keras.Optimizer: the variables given are not the ones "
                             "declared on the shards (in the same order)")
        grads = list(grads)
        if any(g is None for g in grads):
            missing = [v.path for g, v in zip(grads, trainable_variables) if g is None]
            raise ValueError(f"tessera.keras.Optimizer: no gradient for {missing}")
        # One push_pull per bucket, sent as soon as backpropagation has produced its
        # gradients (buckets are in backprop order: the last layers' first). The calls
        # are stateful, so tf.function keeps them in this order, and each depends only
        # on its own gradients: TensorFlow runs it while the earlier layers' gradients
        # are still being computed.
        # The state variables' values after this step's forward pass (BatchNormalization
        # updated its moving statistics there): read after those updates, as TensorFlow
        # orders the operations on a variable as written.
        sent = grads + [tf.convert_to_tensor(v) for v in self._state_vars]
        order = [tf.numpy_function(_stoppable(functools.partial(self._submit, b),
                                              lambda *_g, b=b: np.int64(b)),
                                   [tf.convert_to_tensor(sent[i], tf.float32)
                                    for i in bucket],
                                   Tout=tf.int64, name=f"tessera_push_{b}")
                 for b, bucket in enumerate(self._buckets)]
        every = trainable_variables + self._state_vars
        order += [tf.convert_to_tensor(g, tf.float32) for g in pushed if g is not None]
        if not every:                            # tables only: count the step
            # (_collect returns no dense values: the step's one output is a 0)
            tf.numpy_function(_stoppable(lambda *o: (self._collect(*o), np.int64(0))[1],
                                         lambda *o: np.int64(0)),
                              order, Tout=tf.int64, name="tessera_pull")
            self.iterations.assign_add(1)
            return
        new = tf.numpy_function(_stoppable(self._collect, self._unchanged), order,
                                Tout=[tf.float32] * len(every),
                                name="tessera_pull")
        for v, p in zip(every, new):
            v.assign(tf.reshape(p, v.shape))
        self.iterations.assign_add(1)

    def apply_gradients(self, grads_and_vars):
        grads, variables = zip(*grads_and_vars)
        self.apply(list(grads), list(variables))
        return self.iterations

    def update_step(self, gradient, variable, learning_rate):  # pragma: no cover
        raise NotImplementedError("tessera.keras.Optimizer updates on the shards")

    def get_config(self):
        """Keras's optimizer config and ``bucket_bytes``; nothing of the job (its path,
        addresses, tokens are the saving host's), so a saved model loads anywhere."""
        cfg = super().get_config()
        cfg["bucket_bytes"] = self.bucket_bytes
        return cfg

    @classmethod
    def from_config(cls, config, custom_objects=None):
        """An inert optimizer (see the class): what ``load_model`` and ``clone_model`` give
        the model, with a warning (InertOptimizerWarning) that it cannot train."""
        warnings.warn(_INERT_WARNING, InertOptimizerWarning, stacklevel=2)
        return cls(None, name=config.get("name", "tessera"),
                   bucket_bytes=config.get("bucket_bytes"))

    @property
    def inert(self) -> bool:
        """True for an optimizer with no client (from a saved config): it cannot train."""
        return self.client is None

    # -- Tessera -------------------------------------------------------------------------

    @property
    def tessera_names(self) -> List[str]:
        """The names the variables are declared under on the shards: the trainable ones in
        model order, then the state (non-trainable) ones."""
        return list(self._tessera_names)

    @property
    def state_every(self) -> int:
        """Steps between this worker's pushes of the state tensors' values: the
        ``state_every`` argument, else the job's ``train.state_every`` (default 1)."""
        if self._state_every is not None:
            return self._state_every
        job = getattr(self.client, "job", None) if self.client is not None else None
        return int(getattr(job, "state_every", 1) or 1)

    @property
    def state_names(self) -> List[str]:
        """The model's non-trainable variables held on the shards as state tensors."""
        return list(self._tessera_names[self._n_train:])

    def pull(self) -> Dict[str, np.ndarray]:
        """The shards' current parameters and state (new arrays, by name), without
        changing the model's variables."""
        if self.client is None:
            raise RuntimeError(_INERT_ERROR)
        return self.client.pull({n: np.zeros(p.shape, np.float32)
                                 for n, p in zip(self._tessera_names, self._params)},
                                min_version=0)

    def sync_weights(self) -> List[str]:
        """Send the model's values that changed outside a train step (``set_weights``,
        ``load_weights``, EarlyStopping's ``restore_best_weights``) to the shards, which
        take them as the job's (an assign), so the next step goes on from them. Returns
        the names assigned ([] when nothing changed). ``ProgressCallback`` calls it at the
        start and end of ``fit`` and ``finish`` calls it; call it after changing weights
        by hand. In sync mode, do it between steps (after ``fit``) from one worker or
        from all with the same values.

        Returns
        -------
        list of str
            The tensors assigned ([] when nothing changed).
        """
        if not self.built:
            return []
        every = self._declared_variables()
        with tf.init_scope():
            changed = {}
            for n, v, p in zip(self._tessera_names, every, self._params):
                now = np.asarray(v.numpy(), np.float32).reshape(p.shape)
                if not np.array_equal(now, p):
                    changed[n] = np.ascontiguousarray(now)
            if changed:
                self.client.assign(changed)
                for n, p in zip(self._tessera_names, self._params):
                    if n in changed:
                        np.copyto(p, changed[n])
                _log.info("tessera.keras: %d variable(s) changed outside a train step were "
                          "assigned on the shards: %s", len(changed), sorted(changed)[:8])
        return sorted(changed)

    def _declared_variables(self) -> List[Any]:
        return [v for v in self._trainable_variables
                if _kemb._anchor_layer(v) is None] + list(self._state_vars)

    def finish(self, loss: float = 0.0, examples_per_sec: float = 0.0) -> None:
        """Tell the shards this worker is done (sync barriers go on without it), after
        sending weights changed since the last step (``sync_weights``)."""
        if self.client is None:
            raise RuntimeError(_INERT_ERROR)
        self.sync_weights()
        self.client.set_progress(self.tessera_steps, float(loss), float(examples_per_sec),
                                 1.0, done=True)

    def close(self) -> None:
        """Close the client if the optimizer opened it."""
        if self._owns_client:
            self.client.close()


def _model_of(opt: "Optimizer") -> Optional["keras.Model"]:
    """The model compiled with opt (``model.optimizer is opt``), found among the objects
    that refer to the optimizer; None when there is none (a custom loop without compile:
    pass ``model=`` to the optimizer to have its state tracked)."""
    import gc
    for ref in gc.get_referrers(opt):
        if isinstance(ref, dict):
            for owner in gc.get_referrers(ref):
                if isinstance(owner, keras.Model) and getattr(owner, "optimizer", None) is opt:
                    return owner
        elif isinstance(ref, keras.Model) and getattr(ref, "optimizer", None) is opt:
            return ref
    return None


def _embedding_layers(model: Optional["keras.Model"], variables: Sequence[Any],
                      dense_ok: bool = False) -> List[Any]:
    """The tessera Embedding layers of the model (and of the variables' anchors, for a
    custom loop without a model); a stock keras.layers.Embedding is refused: trained as a
    dense tensor, each step would push and pull its whole table."""
    layers: List[Any] = []
    if model is not None:
        found = _kemb.embedding_layers(model)
        if found["keras"] and not dense_ok:
            raise _kemb.stock_embedding_error(found["keras"])
        layers = list(found["tessera"])
    for v in variables:
        layer = _kemb._anchor_layer(v)
        if layer is not None and not any(layer is l for l in layers):
            layers.append(layer)
    return layers


def _state_variables(model: Optional["keras.Model"], trainable: Sequence[Any]) -> List[Any]:
    """The model's non-trainable float32 variables (BatchNormalization's moving statistics,
    frozen layers' weights, a Normalization layer's adapted mean), in model order: held on
    the shards as state tensors. Integer variables (seed generators' state) stay local."""
    if model is None:
        return []
    ids = {id(v) for v in trainable}
    out, seen = [], set()
    for v in model.non_trainable_variables:
        if id(v) in ids or id(v) in seen or v.dtype != "float32":
            continue
        seen.add(id(v))
        out.append(v)
    return out


def _model_mismatch(e: ShapeError, num_tensors: int) -> ShapeError:
    """The declare's ShapeError, saying what differs between this model (of num_tensors
    tensors) and the one the shards hold, with the code once."""
    if not e.code:                  # the Python layer's own (a dimension of 0)
        return ShapeError(f"tessera.keras.Optimizer: {e.message}", e.code)
    what = _mismatch.describe(e.message, num_tensors) or e.message
    return ShapeError(f"tessera.keras.Optimizer: this model is not the one the job's shards "
                      f"hold (another model on the same shards?): {what}", e.code)


def _stoppable(fn, stopped):
    """A tf.numpy_function callback that, once Ctrl-C stopped the step, returns
    ``stopped(*args)`` instead of raising.

    In a train step traced by tf.function (``fit``, a custom loop's step) the callbacks run
    on a TensorFlow thread while the main thread waits in TensorFlow's C++ for the step:
    Python cannot run its SIGINT handler there, so a wait of the client on this thread
    raises KeyboardInterrupt itself (tessera.Request) and interrupts the client, and the
    other callbacks of the step then fail with Interrupted. Raising any of that into
    TensorFlow would fail the step while Python's own KeyboardInterrupt is still pending
    for the main thread: it would go off while TensorFlow builds its error, which pybind11
    turns into a RuntimeError. So the step ends normally (nothing pushed or pulled any
    more), and the main thread raises the KeyboardInterrupt as soon as it is back in
    Python, right after the step. On the main thread (an eager step) the exception is
    Python's own and goes through as it is."""
    def run(*args):
        try:
            return fn(*args)
        except BaseException:
            if (threading.current_thread() is threading.main_thread()
                    or not _client_mod._sigint_unhandled()):
                raise
            return stopped(*args)
    return run


def _refuse_xla() -> None:
    """The step calls the client through tf.numpy_function, which XLA cannot compile; a
    step traced for XLA (``jit_compile=True``, which Keras picks by itself where a GPU is
    present) would fail at its first run with a long conversion error. Say so while
    tracing instead; the optimizer does not change the model's settings behind the
    user's back."""
    from tensorflow.python.framework import ops
    from tensorflow.python.ops import control_flow_util
    if control_flow_util.GraphOrParentsInXlaContext(ops.get_default_graph()):
        raise RuntimeError("tessera.keras.Optimizer cannot run in an XLA-compiled train step "
                           "(its push and pull are host calls): compile the model with "
                           "model.compile(..., jit_compile=False)")


def buckets(sizes: Sequence[int], bucket_bytes: Optional[int] = None) -> List[List[int]]:
    """Group variables (their sizes in bytes, in model order) into buckets of consecutive
    variables in backpropagation order (the last variable first), each closed once it
    holds at least ``bucket_bytes``: one push_pull each per step. Default: a quarter of the
    model, at least 64 KiB and at most 32 MiB (few requests for a small model, transfers
    of the last layers overlapping the backpropagation of the first for a large one)."""
    total = sum(int(s) for s in sizes)
    cap = bucket_bytes if bucket_bytes is not None else \
        min(32 << 20, max(64 << 10, total // 4))
    out: List[List[int]] = []
    cur: List[int] = []
    held = 0
    for i in reversed(range(len(sizes))):
        cur.append(i)
        held += int(sizes[i])
        if held >= cap:
            out.append(cur)
            cur, held = [], 0
    if cur:
        out.append(cur)
    return out


def optimizer(config: Union[str, os.PathLike], task: Optional[int] = None, *,
              overrides: Sequence[str] = (), **client_kwargs: Any) -> Optimizer:
    """An ``Optimizer`` over a new ``tessera.Client(config, task=task, overrides=...)``.

    Parameters
    ----------
    config : str or os.PathLike
        The job file.
    task : int, optional
        This worker's task (default: TF_CONFIG's, else 0).
    overrides : sequence of str, default ()
        ``"KEY=VALUE"`` overrides of the job file.
    **client_kwargs
        More ``tessera.Client`` arguments, and the Optimizer's own (``bucket_bytes``,
        ``state_every``, ``dense_embeddings``, ``model``).

    Returns
    -------
    Optimizer
        It owns its client (``close()``).
    """
    return Optimizer(config, task=task, overrides=overrides, **client_kwargs)


class ProgressCallback(keras.callbacks.Callback):
    """Feeds the shards' status (``psctl status``) with the step, loss and examples/s, and
    marks the worker done at the end of ``fit``.

    Parameters
    ----------
    opt : Optimizer
        The model's Tessera optimizer.
    batch_size : int
        Examples per step, for examples/s.
    every : int, default 50
        Steps between two progress reports.
    """

    def __init__(self, opt: Optimizer, batch_size: int, every: int = 50):
        super().__init__()
        self.opt, self.batch_size, self.every = opt, int(batch_size), int(every)
        self._t0 = 0.0
        self._loss = 0.0

    def on_train_begin(self, logs=None):
        import time
        if self.model is not None and not self.model.trainable_variables:
            # Keras never calls the optimizer of a model without trainable variables.
            raise ValueError("tessera.keras: the model has no trainable variables to train "
                             "on the shards")
        if not self.opt.built and self.model is not None:
            # Declared now (Keras would at its first step): the shards hold the job's
            # values from the first batch on, for callbacks that look at them.
            self.opt.build(self.model.trainable_variables)
        self.opt.sync_weights()
        self._t0 = time.monotonic()

    def on_train_end(self, logs=None):
        # After EarlyStopping(restore_best_weights=True) when listed after it; finish()
        # checks again.
        self.opt.sync_weights()

    def on_train_batch_end(self, batch, logs=None):
        import time
        if logs and "loss" in logs:
            self._loss = float(logs["loss"])
        k = self.opt.tessera_steps
        if k % self.every == 0:
            eps = k * self.batch_size / max(1e-9, time.monotonic() - self._t0)
            self.opt.client.set_progress(k, self._loss, eps, 0.0)


from . import keras_embedding as _kemb  # noqa: E402  (needs keras, imported above)
from .keras_embedding import Embedding, EmbeddingBag, StockEmbeddingError  # noqa: E402,F401
