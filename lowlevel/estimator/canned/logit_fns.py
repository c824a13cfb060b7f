"""tf.compat.v1.estimator.experimental's `dnn_logit_fn_builder` and `linear_logit_fn_builder`.

2.15's v1 builders of a canned estimator's logits (canned/dnn.py, canned/linear.py): each
returns a `logit_fn` that builds the same variables as `DNNClassifier`'s /
`LinearClassifier`'s model in the current variable scope (`dnn.dnn_logits`,
`linear.linear_logits`), for a user's model_fn (`experimental.call_logit_fn` calls one).
"""

from __future__ import annotations

from lowlevel.estimator.canned import dnn, linear
from lowlevel.models.spec import ModeKeys


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
