"""What the TensorFlow peers of bench/peers/ share: free loopback ports, the process's peak
RSS, and the first n Fashion-MNIST training examples from the Debian package's IDX files."""
import gzip
import os
import resource
import socket
import struct

DATA = "/usr/share/datasets/fashion-mnist"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def peak_rss_kib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def load_idx(n):
    """(image bytes, label bytes, pixels per image) of the first n training examples."""
    with gzip.open(os.path.join(DATA, "train-images-idx3-ubyte.gz")) as f:
        _, _, rows, cols = struct.unpack(">IIII", f.read(16))
        x = f.read(n * rows * cols)
    with gzip.open(os.path.join(DATA, "train-labels-idx1-ubyte.gz")) as f:
        f.read(8)
        y = f.read(n)
    return x, y, rows * cols
