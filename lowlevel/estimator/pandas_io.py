"""`pandas_input_fn` (tf.compat.v1.estimator.inputs): tensorflow_estimator 2.15's pandas_io.

`pandas_input_fn(x, y=None, batch_size=128, num_epochs=1, shuffle=None,
queue_capacity=1000, num_threads=1, target_column='target')` returns an
input_fn giving `features` (dict column name -> Tensor [batch], x's column
order) or `(features, target)`: target a Tensor [batch] when y is a Series
(its column named `target_column` while batching), a dict of y's columns when
y is a DataFrame. Rows are read epoch after epoch and cut into batches across
epoch boundaries, as `numpy_input_fn` (`lowlevel.estimator.inputs`): with
`num_epochs` set the last batch may be partial (batch dimension None) and the
input then ends (OutOfRangeError); with `num_epochs=None` it repeats in full
batches of static size `batch_size`; `num_threads` > 1 feeds
`num_epochs * num_threads` epochs, as 2.15
(tests/fixtures/canned215/helpers.json).

Checked at once, with 2.15's messages: shuffle not a bool (ValueError),
target_column not a string (TypeError), target_column already a column of x
or x's and y's indexes differ (ValueError). A column's dtype is
`tf.as_dtype` of its numpy dtype.

What differs (as `numpy_input_fn`): a tf.data generator instead of 2.15's
queue and feeding threads, so no queue runner and no queue summary;
`shuffle=True` permutes each epoch (2.15 started at a random row of a
RandomShuffleQueue: a different random order); `queue_capacity` is unused. A
string column (object or pandas 3's `str` dtype) is fed as tf.string; 2.15
raised TypeError for it ("Cannot convert the argument `type_value`: ... to a
TensorFlow DType.", at the input_fn call).
pandas is a dependency of the base install (through mlxtend); without it
pandas_input_fn raises 2.15's TypeError.
"""

from __future__ import annotations

import collections
import uuid

import numpy as np
import tensorflow as tf

from lowlevel.models.input_fns import index_batches

try:
    import pandas as pd
    HAS_PANDAS = True
except ImportError:  # pragma: no cover (pandas comes with mlxtend)
    HAS_PANDAS = False


def _unique_target_key(frame, name):
    if name in frame:
        name += "_" + str(uuid.uuid4())
    return name


def _with_targets(x, y, target_column):
    """(x copied with y's columns added, the target column name or list of names, y's keys)."""
    x = x.copy()
    if y is None:
        return x, target_column, None
    if target_column in x:
        raise ValueError("Cannot use name %s for target column: DataFrame already has a "
                         "column with that name: %s" % (target_column, x.columns))
    if not np.array_equal(x.index, y.index):
        raise ValueError("Index for x and y are mismatched.\nIndex for x: %s\n"
                         "Index for y: %s\n" % (x.index, y.index))
    if isinstance(y, pd.DataFrame):
        pairs = [(column, _unique_target_key(x, column)) for column in list(y)]
        target_column = [v for _, v in pairs]
        x[target_column] = y
        return x, target_column, [k for k, _ in pairs]
    x[target_column] = y
    return x, target_column, None


def _column_arrays(frame):
    data = collections.OrderedDict()
    for name in frame.columns:
        values = frame[name].to_numpy()
        if values.dtype.kind not in "biufcSUO":  # pandas extension dtypes (str, ...)
            values = values.astype(object)
        data[name] = values
    return data


def _batch_tensors(data, batch_size, num_epochs, shuffle, num_threads):
    """One Tensor [batch] per column, read by a one-shot iterator of a generator Dataset."""
    arrays = list(data.values())
    epochs = None if num_epochs is None else num_epochs * max(1, num_threads)
    signature = tuple(tf.TensorSpec([None], tf.string if a.dtype.kind in "SUO"
                                    else tf.as_dtype(a.dtype)) for a in arrays)

    def generate():
        for index in index_batches(len(arrays[0]), batch_size, epochs, shuffle):
            yield tuple(a[index] for a in arrays)
    dataset = tf.data.Dataset.from_generator(generate, output_signature=signature)
    with tf.name_scope("enqueue_input"):
        batch = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
    if num_epochs is None:
        for tensor in batch:
            tensor.set_shape([batch_size])
    return list(batch)


def pandas_input_fn(x, y=None, batch_size=128, num_epochs=1, shuffle=None,
                    queue_capacity=1000, num_threads=1, target_column="target"):
    """An input_fn feeding a pandas DataFrame (see the module docstring).

    x: DataFrame; y: None, a Series or a DataFrame with x's index. Returns
    input_fn() -> features (dict column -> Tensor [batch]) or (features,
    target). Raises at once: TypeError without pandas or for a non-string
    target_column, ValueError for shuffle not a bool, a target_column already
    in x, or mismatched indexes (2.15's messages).
    """
    del queue_capacity
    if not HAS_PANDAS:
        raise TypeError("pandas_input_fn should not be called without pandas installed")
    if not isinstance(shuffle, bool):
        raise ValueError("shuffle must be provided and explicitly set as boolean (it is "
                         "recommended to set it as True for training); got {}".format(shuffle))
    if not isinstance(target_column, str):
        raise TypeError("target_column must be a string type")
    frame, target_column, y_keys = _with_targets(x, y, target_column)

    def input_fn():
        data = _column_arrays(frame)
        batch = _batch_tensors(data, batch_size, num_epochs, shuffle, num_threads)
        features = dict(zip(list(frame.columns), batch))
        if y is None:
            return features
        if isinstance(target_column, list):
            return features, {k: features.pop(c) for k, c in zip(y_keys, target_column)}
        return features, features.pop(target_column)
    return input_fn
