"""The Keras model zoo of test_keras_zoo.py: every zoo model trained in sequence in one
process, either through tessera.keras (one job file per model, ``--job NAME=FILE``, as
worker ``--task T`` of the job's sync workers) or in plain Keras (``--reference``: one
process, Keras's own optimizer, the global batch of the tessera run). Prints one JSON line
per model.

Every model is built after ``keras.utils.set_random_seed(SEED)``, so every process (the
reference and each worker) starts from the same initial values: the model's own, drawn by
Keras's initialisers. The data are synthetic, deterministic (seeded numpy) and learnable;
the data order is Tessera's sync-exactness order: global step k covers examples
[k*W*B, (k+1)*W*B), worker T takes [k*W*B + T*B, k*W*B + (T+1)*B), and the reference
takes the whole global batch (batch W*B, shuffle=False).

The tessera worker records the values of the model's float variables (trainable and not)
after building the model, before compile and fit (``init``), and checks, on task 0, that
the first step trains from them: a probe at the start of the first train step (a host call
that reads every variable as the step reads it) compares the variables with ``init``
exactly, and compares what the shards hold then (``opt.pull()``: every tensor the
optimizer declared, by variable path) with ``init`` exactly. The mismatch counts are in the
JSON line.

The loss that is compared is the model's own loss on a held-out batch, evaluated eagerly:
for the Keras Applications models (MobileNetV2 with BatchNormalization momentum 0.999,
ResNet50 0.99) in training mode (batch statistics; the variables are restored afterwards),
since their moving statistics cannot converge in a run of a few steps; for the others in
inference mode (the functional CNN's and the subclassed model's BatchNormalization use
momentum 0.9, so their moving statistics do). Both values are in the JSON line.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

W = 2            # sync workers of the tessera run; the reference's batch is W x the worker's
SEED = 1234      # keras.utils.set_random_seed before building each model, in every process
NC = 4           # classes of every task (chance: ln 4 = 1.386)
HELD_OUT = 128   # examples of the held-out batch
VOCAB, SEQ = 40, 16

# name -> (steps, batch per worker, optimizer); the job file's `optimizer` section and the
# reference's Keras optimizer are made from the same tuple ("momentum": 0.9, TensorFlow's
# MomentumOptimizer on the shards, keras.optimizers.SGD(lr, momentum=0.9) in the
# reference: the same updates for a constant rate).
#
# No Adam for the models with an Embedding: Keras 3's Adam is not the shards' Adam for an
# Embedding's gradient, a tf.IndexedSlices with one slice per occurrence of a token in the
# batch: its second moment squares each slice before they are summed (keras.ops.square
# keeps the slices), where the shards, given the dense gradient, square the sum. Keras's
# Adam on the densified gradients gives the tessera run's numbers (measured: the
# Transformer of an earlier version of this zoo, 30 steps of Adam 0.005, reached a held-out
# loss of 0.1731 in tessera and in Keras with dense gradients, 0.0271 in plain Keras; the
# LSTM, 40 steps of Adam 0.01, 0.2330 and 0.2330, 0.1818 in plain Keras). SGD and momentum are
# linear in the gradient, so the slices' sum is all that counts.
#
# MobileNetV2 runs 16 examples per worker: at 32x32 its last BatchNormalization layers
# normalise 1x1 maps, over 8 examples their batch statistics are so noisy that the run
# is chaotic (plain Keras alone ends anywhere from loss 0.4 to 1.3 with 1 or 2 TensorFlow
# threads); at 16 a run of 40 steps ends at accuracy 0.99-1.0 either way.
PLAN = {
    "mobilenetv2": (40, 16, ("sgd", 0.05)),
    "resnet50": (8, 16, ("sgd", 0.01)),
    "cnn_bn": (30, 8, ("sgd", 0.05)),
    "transformer": (25, 8, ("sgd", 0.1)),
    "lstm": (40, 8, ("momentum", 0.2)),
    "subclassed": (30, 8, ("sgd", 0.1)),
}
ZOO = list(PLAN)
PARTITION_BYTES = {"resnet50": 1 << 20, "mobilenetv2": 65536}


def job_text(name: str) -> str:
    """The libconfig text (besides `cluster`) of model `name`'s job."""
    kind, lr = PLAN[name][2]
    opt = f'optimizer = {{ name = "{kind}"; learning_rate = {lr}; '
    if kind == "momentum":
        opt += "momentum = 0.9; "
    opt += "};\n"
    return (f'job = {{ mode = "sync"; sync_timeout_s = 60.0; heartbeat_timeout_s = 60.0; '
            f'partition_bytes = {PARTITION_BYTES.get(name, 4096)}; }};\n' + opt +
            'model = { seed = 1; };\n')


# --- data ---------------------------------------------------------------------------------

_COLOURS = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, -1]], np.float32)


def images(n: int, seed: int, hw: int = 32):
    """Noise images; class c brightens quadrant c of the image in colour c."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, NC, n)
    x = (0.5 * rng.standard_normal((n, hw, hw, 3))).astype(np.float32)
    h = hw // 2
    for i, c in enumerate(y):
        qy, qx = divmod(int(c), 2)
        x[i, qy * h:(qy + 1) * h, qx * h:(qx + 1) * h, :] += _COLOURS[c]
    return x, y.astype(np.int32)


def sequences(n: int, seed: int):
    """Token sequences of filler tokens (NC+1 .. VOCAB-1); class c holds marker token 1+c at
    4 to 8 random positions."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, NC, n)
    x = rng.integers(NC + 1, VOCAB, (n, SEQ))
    for i, c in enumerate(y):
        pos = rng.choice(SEQ, size=int(rng.integers(4, 9)), replace=False)
        x[i, pos] = 1 + c
    return x.astype(np.int32), y.astype(np.int32)


def vectors(n: int, seed: int, dim: int = 16):
    """Points of 4 Gaussian clusters (fixed centres) in 16 dimensions."""
    centres = np.random.default_rng(99).standard_normal((NC, dim)).astype(np.float32)
    rng = np.random.default_rng(seed)
    y = rng.integers(0, NC, n)
    x = centres[y] + 1.5 * rng.standard_normal((n, dim)).astype(np.float32)
    return x.astype(np.float32), y.astype(np.int32)


DATA = {"mobilenetv2": images, "resnet50": images, "cnn_bn": images,
        "transformer": sequences, "lstm": sequences, "subclassed": vectors}
# Evaluated in training mode (batch statistics): the Applications models.
TRAINING_MODE_EVAL = {"mobilenetv2", "resnet50"}


# --- models -------------------------------------------------------------------------------

def build(name: str):
    """Model `name`, built (variables created), from the model's own initialisers; and
    its loss (a Keras loss object)."""
    import keras
    from keras import layers
    keras.utils.set_random_seed(SEED)
    logits = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    if name == "mobilenetv2":
        m = keras.applications.MobileNetV2(input_shape=(32, 32, 3), alpha=0.35, weights=None,
                                           classes=NC)
        return m, keras.losses.SparseCategoricalCrossentropy()
    if name == "resnet50":
        m = keras.applications.ResNet50(input_shape=(32, 32, 3), weights=None, classes=NC)
        return m, keras.losses.SparseCategoricalCrossentropy()
    if name == "cnn_bn":
        inp = keras.Input((32, 32, 3))
        x = inp
        for i, f in enumerate((16, 32)):
            x = layers.Conv2D(f, 3, strides=2, padding="same", use_bias=False,
                              name=f"conv{i}")(x)
            x = layers.BatchNormalization(momentum=0.9, name=f"bn{i}")(x)
            x = layers.ReLU()(x)
        x = layers.GlobalAveragePooling2D()(x)
        out = layers.Dense(NC, name="head")(x)
        return keras.Model(inp, out, name="cnn_bn"), logits
    if name == "transformer":
        return _transformer(keras), logits
    if name == "lstm":
        m = keras.Sequential([keras.Input((SEQ,), dtype="int32"),
                              layers.Embedding(VOCAB, 16, name="emb"),
                              layers.LSTM(32, name="lstm"),
                              layers.Dense(NC, name="head")], name="lstm_text")
        return m, logits
    if name == "subclassed":
        m = _subclassed(keras)()
        m(np.zeros((1, 16), np.float32))       # create the variables
        return m, logits
    raise KeyError(name)


def _transformer(keras):
    from keras import layers

    class PositionEmbedding(layers.Layer):
        def build(self, input_shape):
            self.pos = self.add_weight(shape=(input_shape[1], input_shape[2]),
                                       initializer="random_normal", name="pos")

        def call(self, x):
            return x + self.pos

    d = 32
    inp = keras.Input((SEQ,), dtype="int32")
    x = layers.Embedding(VOCAB, d, name="tok")(inp)
    x = PositionEmbedding(name="pos")(x)
    a = layers.MultiHeadAttention(num_heads=2, key_dim=16, name="mha")(x, x)
    x = layers.LayerNormalization(name="ln1")(x + a)
    f = layers.Dense(2 * d, activation="relu", name="ff1")(x)
    f = layers.Dense(d, name="ff2")(f)
    x = layers.LayerNormalization(name="ln2")(x + f)
    x = layers.GlobalAveragePooling1D()(x)
    return keras.Model(inp, layers.Dense(NC, name="head")(x), name="transformer")


def _subclassed(keras):
    import tensorflow as tf
    from keras import layers

    class ZooSubclassed(keras.Model):
        """A subclassed model with its own train_step, written the usual Keras 3 way
        (https://keras.io/guides/custom_train_step_in_tensorflow/)."""

        def __init__(self):
            super().__init__(name="zoo_subclassed")
            self.hidden = layers.Dense(32, use_bias=False, name="hidden")
            self.bn = layers.BatchNormalization(momentum=0.9, name="bn")
            self.out = layers.Dense(NC, name="out")

        def call(self, x, training=False):
            return self.out(tf.nn.relu(self.bn(self.hidden(x), training=training)))

        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = self.compute_loss(y=y, y_pred=y_pred)
            grads = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply(grads, self.trainable_variables)
            for metric in self.metrics:
                if metric.name == "loss":
                    metric.update_state(loss)
                else:
                    metric.update_state(y, y_pred)
            return {m.name: m.result() for m in self.metrics}

    return ZooSubclassed


# --- the harness --------------------------------------------------------------------------

def float_vars(model):
    """The model's float variables, trainable and not, in model order."""
    return [v for v in model.variables if "float" in str(v.dtype)]


def digest(values) -> str:
    h = hashlib.sha256()
    for a in values:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


def evaluate(model, loss_fn, x, y, training: bool):
    """(loss, accuracy) on (x, y), eagerly; every variable restored afterwards (a training
    mode call moves BatchNormalization's moving statistics)."""
    vs = float_vars(model)
    keep = [v.numpy().copy() for v in vs]
    try:
        pred = model(x, training=training)
        loss = float(loss_fn(y, pred))
        acc = float(np.mean(np.argmax(np.asarray(pred), axis=-1) == y))
    finally:
        for v, a in zip(vs, keep):
            v.assign(a)
    return loss, acc


class FirstStepProbe:
    """Records, at the start of the first train step (as a host call inside the step, so
    after the optimizer was built, whenever Keras builds it), the values every float
    variable has as the step reads it, and on a tessera run what the shards hold then.

    Installed by wrapping the model's train_step (before fit): the first execution runs a
    tf.numpy_function that gets every variable's value; later steps skip it (tf.cond on a
    counter)."""

    def __init__(self, model, opt=None):
        import tensorflow as tf
        self.tf = tf
        self.vars = float_vars(model)
        self.opt = opt
        self.values = None
        self.shards = None
        self.shards_error = None
        self.count = tf.Variable(0, dtype=tf.int64, trainable=False)
        orig = model.train_step

        def train_step(data):
            first = tf.equal(self.count, 0)
            probe = tf.cond(first, self._probe_op, lambda: tf.constant(0, tf.int64))
            with tf.control_dependencies([probe]):
                self.count.assign_add(1)
                return orig(data)

        model.train_step = train_step

    def _probe_op(self):
        tf = self.tf
        return tf.numpy_function(self._record, [tf.convert_to_tensor(v.value)
                                                for v in self.vars],
                                 Tout=tf.int64, stateful=True, name="zoo_first_step_probe")

    def _record(self, *values):
        self.values = [np.array(a, copy=True) for a in values]
        if self.opt is not None:
            try:
                self.shards = self.opt.pull()
            except Exception as e:  # noqa: BLE001 - reported in the JSON line
                self.shards_error = f"{type(e).__name__}: {e}"
        return np.int64(0)


def _step_clock():
    import keras

    class StepClock(keras.callbacks.Callback):
        """When the first and the last batch ended (time.monotonic)."""
        first = last = 0.0

        def on_train_batch_end(self, batch, logs=None):
            self.last = time.monotonic()
            if batch == 0:
                self.first = self.last

    return StepClock()


def compare_with_init(init, probe: FirstStepProbe):
    """Mismatch counts of the first step's parameters against the model's initial values."""
    out = {"var_mismatches": 0, "vars_compared": 0, "shard_mismatches": 0,
           "shard_compared": 0, "shard_unknown": 0, "mismatched": []}
    if probe.values is None:
        out["var_mismatches"] = -1                 # the probe never ran
        return out
    for v, a in zip(probe.vars, probe.values):
        out["vars_compared"] += 1
        if not np.array_equal(a, init[v.path]):
            out["var_mismatches"] += 1
            out["mismatched"].append("var:" + v.path)
    if probe.shards is not None:
        for n, a in probe.shards.items():
            if n not in init:
                out["shard_unknown"] += 1
                out["mismatched"].append("unknown:" + n)
                continue
            out["shard_compared"] += 1
            if not np.array_equal(np.asarray(a).reshape(init[n].shape), init[n]):
                out["shard_mismatches"] += 1
                out["mismatched"].append("shard:" + n)
    out["mismatched"] = out["mismatched"][:8]
    return out


def run_model(name: str, args) -> dict:
    import keras
    t0 = time.monotonic()
    steps, B, (kind, lr) = PLAN[name]
    model, loss_fn = build(name)
    vs = float_vars(model)
    init = {v.path: v.numpy().copy() for v in vs}
    res = {"name": name, "mode": "reference" if args.reference else "tessera",
           "task": None if args.reference else args.task, "steps": steps, "batch": B,
           "optimizer": f"{kind} {lr}",
           "params": int(sum(int(np.prod(v.shape)) for v in model.trainable_variables)),
           "trainable_tensors": len(model.trainable_variables),
           "state_tensors": len(vs) - len(model.trainable_variables),
           "init_digest": digest(init[v.path] for v in vs),
           "eval": "training" if name in TRAINING_MODE_EVAL else "inference"}
    gen = DATA[name]
    x, y = gen(steps * W * B, seed=1)
    xh, yh = gen(HELD_OUT, seed=2)
    if args.reference:
        batch = W * B
        opt = keras.optimizers.SGD(lr, momentum=0.9 if kind == "momentum" else 0.0)
        xs, ys = x, y
    else:
        import tessera.keras as tk
        batch = B
        first = [k * W * B + args.task * B for k in range(steps)]
        idx = np.concatenate([np.arange(f, f + B) for f in first])
        xs, ys = x[idx], y[idx]
        # The zoo's Embeddings are small (VOCAB rows) and compared with Keras's own
        # initial values: trained as dense tensors, as the shards' Adam/SGD see them.
        opt = tk.optimizer(args.job[name], task=args.task, dense_embeddings=True)
    training = name in TRAINING_MODE_EVAL
    model.compile(optimizer=opt, loss=loss_fn, metrics=["accuracy"], jit_compile=False)
    probe = FirstStepProbe(model, None if args.reference or args.task != 0 else opt)
    clock = _step_clock()
    callbacks = [clock]
    if not args.reference:
        callbacks.append(tk.ProgressCallback(opt, batch))
    t1 = time.monotonic()
    hist = model.fit(xs, ys, batch_size=batch, epochs=1, shuffle=False, verbose=0,
                     callbacks=callbacks)
    t2 = time.monotonic()
    res["fit_s"] = round(t2 - t1, 2)
    res["first_step_s"] = round(clock.first - t1, 2)      # mostly tracing the step
    res["step_s"] = round((clock.last - clock.first) / max(1, steps - 1), 3)
    res["fit_loss_last"] = float(hist.history["loss"][-1])
    if not args.reference:
        res["tessera_steps"] = int(opt.tessera_steps)
        opt.finish()
    if args.reference or args.task == 0:
        res.update(compare_with_init(init, probe))
        res["shards_error"] = probe.shards_error
        final = [v.numpy().copy() for v in vs]
        # The first step's parameters (as the probe read them) give the initial loss.
        if probe.values is not None:
            for v, a in zip(vs, probe.values):
                v.assign(a)
            res["initial_loss"], res["initial_accuracy"] = evaluate(model, loss_fn, xh, yh,
                                                                    training)
            if not training:
                res["initial_loss_training_mode"] = evaluate(model, loss_fn, xh, yh, True)[0]
            for v, a in zip(vs, final):
                v.assign(a)
        res["loss"], res["accuracy"] = evaluate(model, loss_fn, xh, yh, training)
        if not training:      # (the Applications models' inference mode is meaningless here)
            res["loss_training_mode"] = evaluate(model, loss_fn, xh, yh, True)[0]
    if not args.reference:
        opt.close()
    res["seconds"] = round(time.monotonic() - t0, 2)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reference", action="store_true", help="plain Keras, one process")
    ap.add_argument("--task", type=int, default=0)
    ap.add_argument("--job", action="append", default=[], metavar="NAME=FILE",
                    help="the job file of model NAME (tessera run)")
    ap.add_argument("--models", default=",".join(ZOO))
    ap.add_argument("--threads", type=int, default=1, help="TensorFlow intra/inter-op threads")
    args = ap.parse_args()
    t0 = time.monotonic()
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    import keras  # noqa: F401
    args.job = dict(j.split("=", 1) for j in args.job)
    models = [m for m in args.models.split(",") if m]
    if not args.reference:
        missing = [m for m in models if m not in args.job]
        if missing:
            ap.error(f"no --job for {missing}")
    print(json.dumps({"name": "_start", "import_s": round(time.monotonic() - t0, 2)}),
          flush=True)
    for name in models:
        print(json.dumps(run_model(name, args)), flush=True)
    print(json.dumps({"name": "_total", "seconds": round(time.monotonic() - t0, 2)}),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
