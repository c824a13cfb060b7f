"""`numpy_input_fn` (tf.estimator.inputs / tf.compat.v1.estimator.inputs) and the input_fn rules.

`numpy_input_fn(x, y=None, batch_size=128, num_epochs=1, shuffle=None,
queue_capacity=1000, num_threads=1)` returns an input_fn with tensorflow_estimator
2.15's observable results (tests/fixtures/estimator215/numpy_input_fn.json):

- x: a dict of arrays (keys sorted) or one array (features = one Tensor);
  y: None (the input_fn returns only features), an array (returns
  (features, labels)) or a dict of arrays; 2.15's errors (shuffle not a
  bool, empty dict, lengths differ, duplicate keys, x of another type);
- rows are streamed epoch after epoch and cut into batches ACROSS epoch
  boundaries (rows 8, 9 of epoch 1 then 0, 1 of epoch 2 in one batch);
  with `num_epochs` set the last batch may be partial and the input then
  ends (OutOfRangeError), batch dimension None; with `num_epochs=None` it
  repeats forever in full batches of static size `batch_size`;
- `num_threads` > 1 makes each thread feed every epoch, so 2.15 yields
  `num_epochs * num_threads` epochs: reproduced.

What differs: 2.15 feeds a FIFOQueue/RandomShuffleQueue from Python threads
(queue runners in the QUEUE_RUNNERS collection, a queue-fullness summary);
here the rows come from a `tf.data.Dataset.from_generator` read by a
one-shot iterator, so no queue runner is needed and no queue summary is
written, and `shuffle=True` permutes each epoch with numpy (seeded per
input_fn call by `np.random.default_rng()`): a different random order than
2.15's (which is unseeded too). `queue_capacity` is accepted and unused.

`features_and_labels`, `call_input_fn`: how an Estimator reads an input_fn
(`lowlevel.models.input_fns`).
"""

from __future__ import annotations

import collections

import numpy as np
import tensorflow as tf

from lowlevel.estimator.pandas_io import pandas_input_fn  # noqa: F401 (v1's inputs)
from lowlevel.models.input_fns import (  # noqa: F401
    call_input_fn,
    features_and_labels,
    index_batches,
)

_DIRECT_KEY = "__direct_np_input__"
_TARGET_KEY = "__target_key__"


def _ordered_features(x):
    if isinstance(x, dict):
        if not x:
            raise ValueError("x cannot be an empty dict")
        return collections.OrderedDict(sorted(x.items(), key=lambda t: t[0]))
    if isinstance(x, np.ndarray):
        if x.size == 0:
            raise ValueError("x cannot be an empty array")
        return collections.OrderedDict({_DIRECT_KEY: x})
    raise TypeError(f"x must be a dict or array; got {type(x).__name__}")


def _target_key(data):
    key = _TARGET_KEY
    while key in data:
        key += "_n"
    return key


def _add_targets(data, y, feature_keys):
    if y is None:
        return None
    if isinstance(y, dict):
        if not y:
            raise ValueError("y cannot be empty dict, use None instead.")
        ordered = collections.OrderedDict(sorted(y.items(), key=lambda t: t[0]))
        duplicates = set(feature_keys).intersection(ordered)
        if duplicates:
            raise ValueError(f"{len(duplicates)} duplicate keys are found in both x and y: "
                             f"{duplicates}")
        data.update(ordered)
        return list(ordered)
    key = _target_key(data)
    data[key] = y
    return key


def _check_lengths(data, feature_keys, target_keys, y):
    if len({v.shape[0] for v in data.values()}) == 1:
        return
    shapes_x = {k: data[k].shape for k in feature_keys}
    if target_keys is None:
        shape_y = None
    elif isinstance(target_keys, str):
        shape_y = y.shape
    else:
        shape_y = {k: data[k].shape for k in target_keys}
    raise ValueError("Length of tensors in x and y is mismatched. All elements in x and y must "
                     "have the same length.\nShapes in x: {}\nShapes in y: {}\n".format(
                         shapes_x, shape_y))


def _dtype(array):
    return tf.string if array.dtype.kind in "SUO" else tf.as_dtype(array.dtype)


def _dataset(data, batch_size, epochs, shuffle):
    arrays = [np.asarray(v) for v in data.values()]
    rows = arrays[0].shape[0]
    signature = tuple(tf.TensorSpec([None] + list(a.shape[1:]), _dtype(a)) for a in arrays)

    def generate():
        for index in index_batches(rows, batch_size, epochs, shuffle):
            yield tuple(a[index] for a in arrays)
    return tf.data.Dataset.from_generator(generate, output_signature=signature)


def _batch_tensors(data, batch_size, num_epochs, shuffle, num_threads):
    epochs = None if num_epochs is None else num_epochs * max(1, num_threads)
    dataset = _dataset(data, batch_size, epochs, shuffle)
    with tf.name_scope("enqueue_input"):
        batch = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
    if num_epochs is None:
        for tensor in batch:
            tensor.set_shape([batch_size] + tensor.shape.as_list()[1:])
    return list(batch)


def numpy_input_fn(x, y=None, batch_size=128, num_epochs=1, shuffle=None, queue_capacity=1000,
                   num_threads=1):
    """An input_fn feeding dicts of numpy arrays (see the module docstring).

    Returns input_fn() -> features (dict name -> Tensor [batch, ...], or one
    Tensor when x is an array) or (features, labels). Raises ValueError
    "shuffle must be provided and explicitly set as boolean ..." at once;
    the data errors when input_fn is called (as 2.15).
    """
    del queue_capacity
    if not isinstance(shuffle, bool):
        raise ValueError("shuffle must be provided and explicitly set as boolean (it is "
                         "recommended to set it as True for training); got {}".format(shuffle))

    def input_fn():
        data = _ordered_features(x)
        feature_keys = list(data)
        target_keys = _add_targets(data, y, feature_keys)
        _check_lengths(data, feature_keys, target_keys, y)
        batch = _batch_tensors(data, batch_size, num_epochs, shuffle, num_threads)
        if isinstance(x, np.ndarray):
            features = batch[0]
        else:
            features = dict(zip(feature_keys, batch[:len(feature_keys)]))
        if target_keys is None:
            return features
        if isinstance(target_keys, str):
            return features, batch[-1]
        return features, dict(zip(target_keys, batch[-len(target_keys):]))
    return input_fn
