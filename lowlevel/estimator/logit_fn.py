"""`tf.estimator.experimental.call_logit_fn` (2.15's model_fn.call_logit_fn), and
tf.compat.v1.estimator.experimental's `dnn_logit_fn_builder` and `linear_logit_fn_builder`:
2.15's v1 builders of a canned estimator's logits (canned/dnn.py, canned/linear.py), each
returning a `logit_fn` that builds the same variables as `DNNClassifier`'s /
`LinearClassifier`'s model in the current variable scope (`canned.dnn.dnn_logits`,
`canned.linear.linear_logits`), for a user's model_fn."""

from __future__ import annotations

import tensorflow as tf

from lowlevel.estimator.canned import dnn, linear
from lowlevel.models.spec import ModeKeys, named_kwargs


def call_logit_fn(logit_fn, features, mode, params, config):
    """Calls `logit_fn(features=features, ...)` with the subset of mode, params, config it names.

    Returns what logit_fn returns: a Tensor (logits, e.g. float32 [batch,
    n_classes]) or a dict str -> Tensor. Raises ValueError "logit_fn should
    return a Tensor or a dictionary mapping strings to Tensors.  logit_fn
    returned: <result>" for anything else (a Variable, a list, a dict with a
    non-str key or non-Tensor value). As tensorflow_estimator 2.15's
    model_fn.call_logit_fn (arguments by `fn_args`: a functools.partial's
    bound arguments are not passed again).
    """
    result = logit_fn(features=features,
                      **named_kwargs(logit_fn, mode=mode, params=params, config=config))
    valid_dict = isinstance(result, dict) and all(
        isinstance(k, str) and isinstance(v, tf.Tensor) for k, v in result.items())
    if not (valid_dict or isinstance(result, tf.Tensor)):
        raise ValueError("logit_fn should return a Tensor or a dictionary mapping strings to "
                         f"Tensors.  logit_fn returned: {result}")
    return result


def dnn_logit_fn_builder(units, hidden_units, feature_columns, activation_fn, dropout,
                         input_layer_partitioner, batch_norm):
    """`dnn_logit_fn(features, mode)` -> float32 logits `[batch, units]` (2.15's v1 builder).

    Args:
      units: int, the logits' width; hidden_units: the hidden layers' widths;
      feature_columns: the input's columns; activation_fn: each hidden layer's
      activation; dropout: None or the probability of dropping a unit (TRAIN only);
      input_layer_partitioner: partitioner of the input layer, or None;
      batch_norm: bool, batch normalisation after each hidden layer.

    Raises:
      ValueError: `units` is not an int ("units must be an int.  Given type: ...").
    """
    if not isinstance(units, int):
        raise ValueError(f"units must be an int.  Given type: {type(units)}")

    def dnn_logit_fn(features, mode):
        return dnn.dnn_logits(features, dnn.check_dense_columns(feature_columns), hidden_units,
                              units, activation_fn, dropout, batch_norm,
                              mode == ModeKeys.TRAIN, input_layer_partitioner)
    return dnn_logit_fn


def linear_logit_fn_builder(units, feature_columns, sparse_combiner="sum"):
    """`linear_logit_fn(features)` -> float32 logits `[batch, units]` (2.15's v1 builder);
    `sparse_combiner`: "sum", "mean" or "sqrtn" for multivalent categorical columns."""
    def linear_logit_fn(features):
        return linear.linear_logits(features, feature_columns, units, sparse_combiner)
    return linear_logit_fn
