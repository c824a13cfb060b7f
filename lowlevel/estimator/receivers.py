"""Input receivers for TRAIN/EVAL exports: tensorflow_estimator 2.15's `export/export.py` rest.

- `build_raw_supervised_input_receiver_fn(features, labels, default_batch_size=None)`
  (`tf.estimator.experimental.`, v1 and v2, as 2.15): a receiver fn making one
  placeholder per feature and label tensor (dtype and shape[1:] of the given
  tensor, batch dimension `default_batch_size`, the graph tensor's op name);
  returns a `SupervisedInputReceiver` whose receiver tensors are the features'
  and labels' placeholders together (a single features tensor under "input", a
  single labels tensor under "label"). ValueError at once when features and
  labels share a key.
- `build_supervised_input_receiver_fn_from_input_fn(input_fn, **input_fn_args)`
  (2.15's export_lib, not in its public API): calls `input_fn` in a scratch
  graph to read its features and labels (a Dataset's element, or a
  (features, labels) tuple), then builds the raw supervised receiver fn of them.
- `UnsupervisedInputReceiver(features, receiver_tensors)` (2.15's export_lib, not
  public): a `ServingInputReceiver` without alternatives.
- `SupervisedInputReceiver` is `lowlevel.outputs.serving`'s (checked as 2.15).
"""

from __future__ import annotations

import tensorflow as tf

from lowlevel.models.input_fns import features_and_labels
from lowlevel.outputs.serving import (
                                      SINGLE_LABEL_DEFAULT_NAME,
                                      SINGLE_RECEIVER_DEFAULT_NAME,
                                      ServingInputReceiver,
                                      SupervisedInputReceiver,
)

v1 = tf.compat.v1


class UnsupervisedInputReceiver(ServingInputReceiver):
    """Features and receiver tensors of a TRAIN/EVAL receiver fn without labels (as 2.15).

    A `ServingInputReceiver` with `receiver_tensors_alternatives` None: features
    a Tensor (becomes {"feature": t}) or a dict (str/int keys) of Tensor,
    SparseTensor or RaggedTensor; receiver_tensors a Tensor ({"input": t}) or
    dict. ValueError with 2.15's messages (`ServingInputReceiver`'s checks).
    """

    def __new__(cls, features, receiver_tensors):
        return super().__new__(cls, features=features, receiver_tensors=receiver_tensors,
                               receiver_tensors_alternatives=None)


def _placeholder_from_tensor(t, default_batch_size=None):
    shape = tf.TensorShape([default_batch_size]).concatenate(t.get_shape()[1:])
    try:
        name = t.op.name
    except AttributeError:  # an eager tensor: TensorFlow's default placeholder name
        name = None
    return v1.placeholder(dtype=t.dtype, shape=shape, name=name)


def _placeholders(tensors, default_name, default_batch_size):
    """(what the model_fn gets, the receiver tensors dict) for a tensor or dict of them."""
    if not isinstance(tensors, dict):
        placeholder = _placeholder_from_tensor(tensors, default_batch_size)
        return placeholder, {default_name: placeholder}
    placeholders = {name: _placeholder_from_tensor(t, default_batch_size)
                    for name, t in tensors.items()}
    return placeholders, placeholders


def _keys(tensors, default_name):
    return tensors.keys() if hasattr(tensors, "keys") else [default_name]


def build_raw_supervised_input_receiver_fn(features, labels, default_batch_size=None):
    """A receiver fn () -> SupervisedInputReceiver of placeholders like `features` and `labels`.

    features, labels: a Tensor or a dict str -> Tensor (graph or eager); each
    placeholder has the tensor's dtype, shape [default_batch_size] + shape[1:]
    and (graph tensors) its op name. Raises ValueError "Features and labels
    must have distinct keys. Found overlapping keys: {...}" at once. As
    tensorflow_estimator 2.15's export.build_raw_supervised_input_receiver_fn.
    """
    overlap = (set(_keys(features, SINGLE_RECEIVER_DEFAULT_NAME)) &
               set(_keys(labels, SINGLE_LABEL_DEFAULT_NAME)))
    if overlap:
        raise ValueError("Features and labels must have distinct keys. "
                         f"Found overlapping keys: {overlap}")

    def supervised_input_receiver_fn():
        features_in, receiver_features = _placeholders(
            features, SINGLE_RECEIVER_DEFAULT_NAME, default_batch_size)
        labels_in, receiver_labels = _placeholders(
            labels, SINGLE_LABEL_DEFAULT_NAME, default_batch_size)
        receiver_tensors = dict(receiver_features)
        receiver_tensors.update(receiver_labels)
        return SupervisedInputReceiver(features_in, labels_in, receiver_tensors)
    return supervised_input_receiver_fn


def build_supervised_input_receiver_fn_from_input_fn(input_fn, **input_fn_args):
    """The raw supervised receiver fn of the features and labels `input_fn` returns.

    `input_fn(**input_fn_args)` is called once, now, in a scratch graph; it
    returns a Dataset of (features, labels) or a (features, labels) tuple.
    The receiver fn's placeholders are made later in the caller's default
    graph. The input_fn's errors propagate; ValueError for a tuple of another
    length. As tensorflow_estimator 2.15's export_lib.
    """
    with tf.Graph().as_default():
        result = input_fn(**input_fn_args)
        features, labels, _ = features_and_labels(result)
    return build_raw_supervised_input_receiver_fn(features, labels)


__all__ = ["UnsupervisedInputReceiver", "SupervisedInputReceiver",
           "build_raw_supervised_input_receiver_fn",
           "build_supervised_input_receiver_fn_from_input_fn"]
