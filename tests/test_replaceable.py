"""Training input without tf.data's autotune thread (`lowlevel.data.replaceable`).

With autotuning on, a worker session replaced after a ps failure waited up to 60 s for the
old iterator's model thread (51.9 s alone after 150 s of reading at a training pace; 25.5 s
for the default trainer's ps0 kill after 180 s: benchmarks/NOTES.md). Waiting minutes for
that thread to sleep long is too slow for the suite, so these check what the runtime's
graphs hold: the `OptionsDataset` of each training input, as its iterator will run it.
"""

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import dataset_options_pb2

from lowlevel.data import ctr, images, replaceable
from lowlevel.models.model_fn_model import ModelFnModel
from lowlevel.runtime import trainables

pytestmark = pytest.mark.timeout(60)


def _autotune(graph) -> list:
    """`autotune.enabled` of each `OptionsDataset` in `graph` (None where it is unset)."""
    found = []
    for op in graph.get_operations():
        if op.type == "OptionsDataset":
            options = dataset_options_pb2.Options()
            options.ParseFromString(op.get_attr("serialized_options"))
            found.append(options.autotune_options.enabled
                         if options.autotune_options.HasField("enabled") else None)
    return found


def test_the_builtin_training_inputs_have_no_autotune_thread():
    data = images.synthetic()
    with tf.Graph().as_default() as g:
        images.train_iterator(data, 32, 2, 0, 0)
    assert _autotune(g) == [False]
    clicks = ctr.synthetic_ctr(1000, 1000, num_train=256, num_test=64)
    with tf.Graph().as_default() as g:
        ctr.train_iterator(clicks, 32, 2, 1, 0)
    assert _autotune(g) == [False]


def _input_fn(explicit):
    def input_fn():
        ds = tf.data.Dataset.from_tensor_slices(
            ({"x": np.ones([8, 2], np.float32)}, np.zeros([8], np.int64))).batch(4).repeat()
        if explicit is not None:  # the user's own choice, kept
            options = tf.data.Options()
            options.autotune.enabled = explicit
            ds = ds.with_options(options)
        return ds
    return input_fn


@pytest.mark.parametrize("explicit, expected", [(None, [False]), (True, [True])])
def test_a_model_fns_training_dataset_has_autotuning_off_unless_it_says_so(explicit, expected):
    model = ModelFnModel(model_fn=lambda features, labels: None, params={}, run_config=None,
                         model_dir="unused", input_fn=_input_fn(explicit))
    with tf.Graph().as_default() as g:
        features, labels, hooks = trainables.ModelFn(model).call_input_fn()
    assert features["x"].shape.as_list() == [None, 2] and len(hooks) == 1
    assert _autotune(g) == expected


def test_what_is_not_a_dataset_passes_unchanged():
    with tf.Graph().as_default():
        pair = ({"x": tf.zeros([2])}, tf.zeros([2]))
        assert replaceable.without_autotune(pair) is pair
