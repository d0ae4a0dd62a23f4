"""LeNet-5 as deploy/local/lenet5.cfg describes it, trained by TensorFlow/Keras in one
process, for bench/lenet.sh: the same layers, Glorot-uniform kernels and zero biases, Adam
on the same cosine decay, the same batch, Fashion-MNIST scaled to [0, 1].

usage: keras_lenet.py --batch B --steps N --threads T [--lr 0.005] [--epochs E]
Prints one line: done: steps=N examples=E examples_per_sec=X test_accuracy=A
(examples/s of fit alone, after one warm-up epoch of 20 steps that traces the graph).
"""
import argparse
import gzip
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

DATA = "/usr/share/datasets/fashion-mnist/"


def idx(name, offset):
    with gzip.open(DATA + name) as f:
        return np.frombuffer(f.read(), np.uint8, offset=offset)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--lr", type=float, default=0.005)
    ap.add_argument("--epochs", type=int, default=0, help="train whole epochs instead of --steps")
    a = ap.parse_args()
    tf.config.threading.set_intra_op_parallelism_threads(a.threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    x = idx("train-images-idx3-ubyte.gz", 16).reshape(-1, 28, 28, 1).astype("float32") / 255
    y = idx("train-labels-idx1-ubyte.gz", 8).astype("int32")
    xt = idx("t10k-images-idx3-ubyte.gz", 16).reshape(-1, 28, 28, 1).astype("float32") / 255
    yt = idx("t10k-labels-idx1-ubyte.gz", 8).astype("int32")
    steps = a.epochs * (len(x) // a.batch) if a.epochs else a.steps
    L = tf.keras.layers
    model = tf.keras.Sequential([
        tf.keras.Input((28, 28, 1)),
        L.Conv2D(6, 5, padding="same", activation="relu", name="conv1"),
        L.MaxPooling2D(2, name="pool1"),
        L.Conv2D(16, 5, activation="relu", name="conv2"),
        L.MaxPooling2D(2, name="pool2"),
        L.Flatten(name="flatten1"),
        L.Dense(120, activation="relu", name="fc1"),
        L.Dense(84, activation="relu", name="fc2"),
        L.Dense(10, name="fc3"),
    ])
    rate = tf.keras.optimizers.schedules.CosineDecay(a.lr, steps + 20)
    model.compile(tf.keras.optimizers.Adam(rate, epsilon=1e-8),
                  tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    n = steps * a.batch
    order = np.random.default_rng(42).permutation(len(x))
    reps = -(-(n + 20 * a.batch) // len(x))
    order = np.concatenate([order] * reps)
    model.fit(x[order[:20 * a.batch]], y[order[:20 * a.batch]], batch_size=a.batch, epochs=1,
              verbose=0, shuffle=False)
    xs, ys = x[order[20 * a.batch:20 * a.batch + n]], y[order[20 * a.batch:20 * a.batch + n]]
    t0 = time.perf_counter()
    model.fit(xs, ys, batch_size=a.batch, epochs=1, verbose=0, shuffle=False)
    secs = time.perf_counter() - t0
    acc = model.evaluate(xt, yt, batch_size=1000, verbose=0)[1]
    print(f"done: steps={steps} examples={n} examples_per_sec={n / secs:.1f} "
          f"test_accuracy={acc:.4f}", flush=True)


if __name__ == "__main__":
    main()
