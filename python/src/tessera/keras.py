"""Keras 3 (TensorFlow backend) models trained on Tessera shards.

Change only the optimizer of a standard Keras training loop::

    import keras, tessera.keras
    model = keras.Sequential([...])
    model.compile(optimizer=tessera.keras.optimizer("job.cfg", task=0),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(x, y, batch_size=64, epochs=3, shuffle=False)

The optimizer declares the model's trainable variables on the job's shards under their
Keras paths (``variable.path``, e.g. ``conv2d/kernel``), in the model's order, and pulls
their initial values (initialised on the shards: glorot for rank >= 2, zeros for rank 1,
deterministic in the job's ``model.seed``) into the variables before step 1, so every
worker starts from the same parameters. Each step it pushes the gradients and assigns the
parameters pulled back: one round trip per bucket of variables, each bucket sent as soon
as backpropagation has produced its gradients (the last layers' first), while the earlier
layers' gradients are still being computed; the update itself runs on the shards with the
job's ``optimizer`` section, in the job's mode (sync: the shards average the workers'
gradients of a step and drop stale ones, as TensorFlow's SyncReplicasOptimizer; async:
each push is applied as it comes). The Keras-side optimizer does no arithmetic: its
learning rate, weight decay, gradient clipping, EMA and loss scaling are not used.

TensorFlow and Keras are imported when this module is, not by ``import tessera``.
"""
from __future__ import annotations

import functools
import os
import threading
from typing import Any, Dict, List, Optional, Sequence, Union

import numpy as np

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

__all__ = ["Optimizer", "optimizer", "buckets", "ProgressCallback"]


class Optimizer(keras.optimizers.Optimizer):
    """A Keras optimizer whose update runs on Tessera shards.

    ``client``: a connected ``tessera.Client`` (the optimizer does not close it), or a job
    file path (then ``task``, ``overrides`` and the other keyword arguments go to
    ``tessera.Client``, and the optimizer owns and closes the client: ``close()``).

    ``bucket_bytes``: the variables' gradients go in buckets of consecutive variables of
    at least this many bytes, one ``push_pull`` each (default: see ``buckets``).

    On ``build`` (Keras calls it once, eagerly, before the first step of ``fit``) the
    model's trainable variables are declared on the shards under their paths and their
    values pulled from the shards. ``apply``/``apply_gradients`` push the gradients and
    assign the pulled parameters, through ``tf.numpy_function`` (numpy on the host), so
    the train step must not be XLA-compiled: ``compile(..., jit_compile=False)`` where
    Keras would choose XLA by itself (where a GPU is present); a step traced for XLA
    raises a RuntimeError saying so.
    """

    def __init__(self, client: Union["_client_mod.Client", str, os.PathLike], *,
                 task: Optional[int] = None, overrides: Sequence[str] = (),
                 bucket_bytes: Optional[int] = None, name: str = "tessera",
                 **client_kwargs: Any):
        super().__init__(learning_rate=0.0, name=name)
        if bucket_bytes is not None and int(bucket_bytes) <= 0:
            raise ValueError(f"bucket_bytes must be positive, not {bucket_bytes}")
        self.bucket_bytes = None if bucket_bytes is None else int(bucket_bytes)
        if isinstance(client, _client_mod.Client):
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

    # -- Keras hooks ---------------------------------------------------------------------

    def build(self, variables):
        if self.built:
            return
        variables = list(variables)
        if not variables:
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
        super().build(variables)
        model = {n: _client_mod.Tensor(tuple(int(d) for d in v.shape))
                 for n, v in zip(names, variables)}
        try:
            params = self.client.declare(model)
        except ShapeError as e:
            raise ShapeError(f"tessera.keras.Optimizer: the job's shards hold a tensor of "
                             f"this model under another shape (another model on the same "
                             f"shards?): {e}", e.code) from e
        self._tessera_names = names
        self._params = [params[n] for n in names]
        self._grads = [np.zeros(p.shape, np.float32) for p in self._params]
        self._buckets = buckets([p.nbytes for p in self._params], self.bucket_bytes)
        self._bucket_args = [({names[i]: self._grads[i] for i in b},
                              {names[i]: self._params[i] for i in b}) for b in self._buckets]
        self._inflight = [None] * len(self._buckets)
        # Keras builds the optimizer while it traces the first train step (tf.function):
        # the initial values are assigned eagerly, before that step runs, not as ops of
        # the traced step.
        with tf.init_scope():
            self.client.pull(self._params)      # the shards' initial values
            self._versions = [self.client.last_version] * len(self._buckets)
            for v, p in zip(variables, self._params):
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
        if trainable_variables is None:
            trainable_variables = self._trainable_variables
        else:
            trainable_variables = list(trainable_variables)
        if not self.built:
            # Outside fit (a custom loop): build here, eagerly.
            self.build(trainable_variables)
            self.built = True
        _refuse_xla()
        if [v.path for v in trainable_variables] != self._tessera_names:
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
        order = [tf.numpy_function(_stoppable(functools.partial(self._submit, b),
                                              lambda *_g, b=b: np.int64(b)),
                                   [tf.convert_to_tensor(grads[i], tf.float32)
                                    for i in bucket],
                                   Tout=tf.int64, name=f"tessera_push_{b}")
                 for b, bucket in enumerate(self._buckets)]
        new = tf.numpy_function(_stoppable(self._collect, self._unchanged), order,
                                Tout=[tf.float32] * len(grads),
                                name="tessera_pull")
        for v, p in zip(trainable_variables, new):
            v.assign(tf.reshape(p, v.shape))
        self.iterations.assign_add(1)

    def apply_gradients(self, grads_and_vars):
        grads, variables = zip(*grads_and_vars)
        self.apply(list(grads), list(variables))
        return self.iterations

    def update_step(self, gradient, variable, learning_rate):  # pragma: no cover
        raise NotImplementedError("tessera.keras.Optimizer updates on the shards")

    def get_config(self):
        cfg = super().get_config()
        cfg["job"] = getattr(self.client.job, "source", None) if self.client.job else None
        return cfg

    # -- Tessera -------------------------------------------------------------------------

    @property
    def tessera_names(self) -> List[str]:
        """The names the variables are declared under on the shards, in model order."""
        return list(self._tessera_names)

    def pull(self) -> Dict[str, np.ndarray]:
        """The shards' current parameters (new arrays, by name), without changing the
        model's variables."""
        return self.client.pull({n: np.zeros(p.shape, np.float32)
                                 for n, p in zip(self._tessera_names, self._params)},
                                min_version=0)

    def finish(self, loss: float = 0.0, examples_per_sec: float = 0.0) -> None:
        """Tell the shards this worker is done (sync barriers go on without it)."""
        self.client.set_progress(self.tessera_steps, float(loss), float(examples_per_sec),
                                 1.0, done=True)

    def close(self) -> None:
        """Close the client if the optimizer opened it."""
        if self._owns_client:
            self.client.close()


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
    """``Optimizer`` over a new ``tessera.Client(config, task=task, overrides=...)``."""
    return Optimizer(config, task=task, overrides=overrides, **client_kwargs)


class ProgressCallback(keras.callbacks.Callback):
    """Feeds the shards' status (``psctl status``) with the step, loss and examples/s, and
    marks the worker done at the end of ``fit``."""

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
        self._t0 = time.monotonic()

    def on_train_batch_end(self, batch, logs=None):
        import time
        if logs and "loss" in logs:
            self._loss = float(logs["loss"])
        k = self.opt.tessera_steps
        if k % self.every == 0:
            eps = k * self.batch_size / max(1e-9, time.monotonic() - self._t0)
            self.opt.client.set_progress(k, self._loss, eps, 0.0)
