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
parameters pulled back (one round trip); the update itself runs on the shards with the
job's ``optimizer`` section, in the job's mode (sync: the shards average the workers'
gradients of a step and drop stale ones, as TensorFlow's SyncReplicasOptimizer; async:
each push is applied as it comes). The Keras-side optimizer does no arithmetic: its
learning rate, weight decay, gradient clipping, EMA and loss scaling are not used.

TensorFlow and Keras are imported when this module is, not by ``import tessera``.
"""
from __future__ import annotations

import os
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

__all__ = ["Optimizer", "optimizer", "ProgressCallback"]


class Optimizer(keras.optimizers.Optimizer):
    """A Keras optimizer whose update runs on Tessera shards.

    ``client``: a connected ``tessera.Client`` (the optimizer does not close it), or a job
    file path (then ``task``, ``overrides`` and the other keyword arguments go to
    ``tessera.Client``, and the optimizer owns and closes the client: ``close()``).

    On ``build`` (Keras calls it once, eagerly, before the first step of ``fit``) the
    model's trainable variables are declared on the shards under their paths and their
    values pulled from the shards. ``apply``/``apply_gradients`` push the gradients and
    assign the pulled parameters, through ``tf.py_function`` (numpy on the host), so the
    train step must not be XLA-compiled: ``compile(jit_compile=False)`` where Keras would
    choose XLA (on a GPU); the optimizer raises a clear error otherwise.
    """

    def __init__(self, client: Union["_client_mod.Client", str, os.PathLike], *,
                 task: Optional[int] = None, overrides: Sequence[str] = (),
                 name: str = "tessera", **client_kwargs: Any):
        super().__init__(learning_rate=0.0, name=name)
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
        _no_xla(self)
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
        # Keras builds the optimizer while it traces the first train step (tf.function):
        # the initial values are assigned eagerly, before that step runs, not as ops of
        # the traced step.
        with tf.init_scope():
            self.client.pull(self._params)      # the shards' initial values
            for v, p in zip(variables, self._params):
                v.assign(p)

    def _tessera_step(self, *grads):
        for g, buf in zip(grads, self._grads):
            np.copyto(buf, np.asarray(g).reshape(buf.shape))
        self.last_push = self.client.push_pull(self._grads, self._params)
        self.tessera_steps += 1
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
        _no_xla(self)
        if [v.path for v in trainable_variables] != self._tessera_names:
            raise ValueError("tessera.keras.Optimizer: the variables given are not the ones "
                             "declared on the shards (in the same order)")
        grads = list(grads)
        if any(g is None for g in grads):
            missing = [v.path for g, v in zip(grads, trainable_variables) if g is None]
            raise ValueError(f"tessera.keras.Optimizer: no gradient for {missing}")
        try:
            new = tf.py_function(self._tessera_step,
                                 [tf.convert_to_tensor(g, tf.float32) for g in grads],
                                 Tout=[tf.float32] * len(grads), name="tessera_push_pull")
        except Exception as e:  # XLA cannot compile py_function
            if "XLA" in str(e) or "jit" in str(e).lower():
                raise RuntimeError("tessera.keras.Optimizer cannot run inside an XLA-"
                                   "compiled step: model.compile(..., jit_compile=False)") from e
            raise
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


def _no_xla(opt: Optimizer) -> None:
    """The step calls numpy through tf.py_function, which XLA cannot compile: turn off
    jit_compile on the model that owns this optimizer (Keras picks XLA by itself where a
    GPU is present). Found from the caller's frames (Keras's fit and train step), as Keras
    gives the optimizer no reference to its model."""
    import sys
    f = sys._getframe(1)
    while f is not None:
        m = f.f_locals.get("self")
        if isinstance(m, keras.Model) and getattr(m, "optimizer", None) is opt:
            if getattr(m, "_jit_compile", False) or getattr(m, "jit_compile", False) is True:
                m.jit_compile = False
            return
        f = f.f_back


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
