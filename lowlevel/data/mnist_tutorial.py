"""`tensorflow.examples.tutorials.mnist.input_data` for TF1 scripts: `read_data_sets` over
LeCun's MNIST files in a directory. Gone from TensorFlow 2; TF1 scripts such as
TensorFlow's own `tools/dist_test/python/mnist_replica.py` import it, and under
`python -m lowlevel` that import gives this module (`lowlevel.tf1_namespace`).

What a script sees is what TensorFlow 1.x's version gave it (its documented behaviour, in
`tensorflow/contrib/learn/python/learn/datasets/mnist.py`): `read_data_sets(train_dir,
one_hot=False, dtype=float32, reshape=True, validation_size=5000, seed=None)` returns
`Datasets(train, validation, test)`; the validation set is the first `validation_size`
training images; each `DataSet` has `images` (float32 in [0, 1] — uint8 in 0-255 with
`dtype=uint8` — shape [N, 784] with `reshape`, else [N, 28, 28, 1]), `labels` (int64 [N],
or float [N, 10] one-hot with `one_hot`), `num_examples`, `epochs_completed` and
`next_batch(batch_size, shuffle=True)`, which shuffles at the start of each epoch and fills
the batch that crosses an epoch's end from the next one.

One difference: nothing is downloaded. The four files (`FILES`, gzipped or not) must be in
`train_dir`; a missing one raises `FileNotFoundError` naming it.
"""

from __future__ import annotations

import collections
import gzip
import os

import numpy as np

FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
         "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
NUM_CLASSES = 10

Datasets = collections.namedtuple("Datasets", ["train", "validation", "test"])


def read_idx(path: str) -> np.ndarray:
    """The array of a LeCun IDX file (`path` or `path` + ".gz"): uint8, the file's shape.

    Raises:
      FileNotFoundError: neither file exists.
      ValueError: not an IDX file of unsigned bytes.
    """
    for name, opener in ((path + ".gz", gzip.open), (path, open)):
        if os.path.exists(name):
            with opener(name, "rb") as f:
                data = f.read()
            break
    else:
        raise FileNotFoundError(f"no {os.path.basename(path)}(.gz) in {os.path.dirname(path)}: "
                                "MNIST is not downloaded under lowlevel; put LeCun's four "
                                f"files there ({', '.join(FILES)})")
    if data[:3] != b"\x00\x00\x08":
        raise ValueError(f"{path}: not an IDX file of unsigned bytes")
    ndim = data[3]
    shape = [int.from_bytes(data[4 + 4 * k:8 + 4 * k], "big") for k in range(ndim)]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * ndim).reshape(shape)


class DataSet:
    """One split: images and labels (module doc), and batches of them in epochs."""

    def __init__(self, images, labels, dtype=np.float32, reshape=True, seed=None):
        images = images.reshape(len(images), -1) if reshape else images[..., np.newaxis]
        if np.dtype(dtype) == np.float32:
            images = images.astype(np.float32) / 255.0
        self._images, self._labels = images, labels
        self._rng = np.random.default_rng(seed)
        self._index_in_epoch = 0
        self._epochs_completed = 0

    images = property(lambda self: self._images)
    labels = property(lambda self: self._labels)
    num_examples = property(lambda self: len(self._images))
    epochs_completed = property(lambda self: self._epochs_completed)

    def _shuffle(self):
        order = self._rng.permutation(self.num_examples)
        self._images, self._labels = self._images[order], self._labels[order]

    def next_batch(self, batch_size: int, fake_data: bool = False, shuffle: bool = True):
        """The next `batch_size` (images, labels); `shuffle`: a new order every epoch."""
        start = self._index_in_epoch
        if shuffle and start == 0 and self._epochs_completed == 0:
            self._shuffle()
        if start + batch_size <= self.num_examples:
            self._index_in_epoch = start + batch_size
            return self._images[start:start + batch_size], self._labels[start:start + batch_size]
        rest = (self._images[start:], self._labels[start:])
        self._epochs_completed += 1
        if shuffle:
            self._shuffle()
        self._index_in_epoch = batch_size - len(rest[0])
        end = self._index_in_epoch
        return (np.concatenate([rest[0], self._images[:end]]),
                np.concatenate([rest[1], self._labels[:end]]))


def read_data_sets(train_dir, fake_data=False, one_hot=False, dtype=np.float32, reshape=True,
                   validation_size=5000, seed=None, source_url=None) -> Datasets:
    """Datasets(train, validation, test) from the four files in `train_dir` (module doc).

    `dtype`: float32 (scaled to [0, 1]) or uint8, a NumPy or a TensorFlow dtype.

    Raises:
      FileNotFoundError: a file is missing (nothing is downloaded).
      ValueError: `validation_size` is not within [0, the number of training images].
    """
    dtype = getattr(dtype, "as_numpy_dtype", dtype)
    arrays = [read_idx(os.path.join(train_dir, name)) for name in FILES]
    labels = [a.astype(np.int64) for a in arrays[1::2]]
    if one_hot:
        labels = [np.eye(NUM_CLASSES, dtype=np.float64)[a] for a in labels]
    train_images, test_images = arrays[0], arrays[2]
    if not 0 <= validation_size <= len(train_images):
        raise ValueError(f"Validation size should be between 0 and {len(train_images)}. "
                         f"Received: {validation_size}.")
    make = dict(dtype=dtype, reshape=reshape, seed=seed)
    return Datasets(DataSet(train_images[validation_size:], labels[0][validation_size:], **make),
                    DataSet(train_images[:validation_size], labels[0][:validation_size], **make),
                    DataSet(test_images, labels[1], **make))
