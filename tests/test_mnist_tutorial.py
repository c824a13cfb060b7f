"""`lowlevel.data.mnist_tutorial`: TF1's `tensorflow.examples.tutorials.mnist.input_data`
over LeCun's files on disk, and a TF1 script's import of it under the runner's namespace."""

import numpy as np
import pytest

import mnist_files
from lowlevel import tf1_namespace
from lowlevel.data import mnist_tutorial


def test_read_data_sets_splits_scales_and_one_hots_as_tf1_did(tmp_path):
    arrays = mnist_files.write_idx_set(tmp_path, n_train=30, n_test=7)
    data = mnist_tutorial.read_data_sets(str(tmp_path), one_hot=True, validation_size=10)
    assert (data.train.num_examples, data.validation.num_examples, data.test.num_examples) == \
        (20, 10, 7)
    assert data.train.images.shape == (20, 784) and data.train.images.dtype == np.float32
    assert 0.0 <= data.train.images.min() and data.train.images.max() <= 1.0
    np.testing.assert_allclose(data.validation.images,
                               arrays["train-images-idx3-ubyte"][:10].reshape(10, -1) / 255.0,
                               rtol=1e-6)  # the validation set: the first training images
    assert data.test.labels.shape == (7, 10)
    np.testing.assert_array_equal(data.test.labels.argmax(1), arrays["t10k-labels-idx1-ubyte"])
    raw = mnist_tutorial.read_data_sets(str(tmp_path), dtype=np.uint8, reshape=False,
                                        validation_size=0)
    assert raw.train.images.shape == (30, 28, 28, 1) and raw.train.images.dtype == np.uint8
    assert raw.train.labels.dtype == np.int64


def test_next_batch_covers_each_epoch_once_and_fills_across_its_end(tmp_path):
    mnist_files.write_idx_set(tmp_path, n_train=25, n_test=3, compress=False)
    train = mnist_tutorial.read_data_sets(str(tmp_path), validation_size=5, seed=3).train
    seen = [train.next_batch(8)[0] for _ in range(2)]  # 16 of the epoch's 20
    crossing, _ = train.next_batch(8)  # the last 4 of epoch 1, the first 4 of epoch 2
    assert crossing.shape == (8, 784) and train.epochs_completed == 1
    first_epoch = np.concatenate(seen + [crossing[:4]])
    assert sorted(map(bytes, first_epoch)) == sorted(map(bytes, train.images))  # each once


def test_missing_files_and_a_bad_validation_size_say_what_is_wrong(tmp_path):
    with pytest.raises(FileNotFoundError, match="not downloaded under lowlevel"):
        mnist_tutorial.read_data_sets(str(tmp_path))
    mnist_files.write_idx_set(tmp_path, n_train=30, n_test=7)
    with pytest.raises(ValueError, match="between 0 and 30"):
        mnist_tutorial.read_data_sets(str(tmp_path))  # TF1's default: 5,000


def test_a_tf1_scripts_import_of_input_data_gets_this_module(tmp_path):
    mnist_files.write_idx_set(tmp_path, n_train=12, n_test=2)
    script = ("import tensorflow as tf\n"
              "from tensorflow.examples.tutorials.mnist import input_data\n"
              "import tensorflow.examples.tutorials.mnist.input_data as again\n"
              "data = input_data.read_data_sets(DATA, validation_size=2)\n")
    scope = dict(tf1_namespace.script_globals(), DATA=str(tmp_path))
    exec(compile(script, "script.py", "exec"), scope)
    assert scope["input_data"] is mnist_tutorial and scope["again"] is mnist_tutorial
    assert scope["data"].train.num_examples == 10
    with pytest.raises(ImportError):
        exec("from tensorflow.examples.tutorials import speech_commands", scope)
