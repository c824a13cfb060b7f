"""Small MNIST files in LeCun's IDX layout, written by the tests (no download here)."""

import gzip
import os

import numpy as np


def idx_bytes(array, magic_type=0x08):
    header = bytes([0, 0, magic_type, array.ndim])
    header += b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    return header + array.astype(np.uint8).tobytes()


def write_idx_set(directory, n_train=20, n_test=7, compress=True):
    rng = np.random.default_rng(0)
    arrays = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28)),
        "train-labels-idx1-ubyte": rng.integers(0, 10, n_train),
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28)),
        "t10k-labels-idx1-ubyte": rng.integers(0, 10, n_test),
    }
    for name, array in arrays.items():
        if compress:
            with gzip.open(os.path.join(directory, name + ".gz"), "wb") as f:
                f.write(idx_bytes(array))
        else:
            with open(os.path.join(directory, name), "wb") as f:
                f.write(idx_bytes(array))
    return arrays
