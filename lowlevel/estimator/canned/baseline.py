"""BaselineClassifier and BaselineRegressor (tensorflow_estimator 2.15's v2): a model
that ignores the features.

Its logits are one bias per logits dimension (`baseline/bias`, float32
`[logits_dimension]`) for every example, so it learns the label's prior (the
class frequencies' log-odds, the label mean): the score a real model must beat.
Default optimizer FTRL at 0.3 (2.15's `baseline._LEARNING_RATE`).
"""

from __future__ import annotations

import tensorflow as tf

from lowlevel.estimator.canned import heads as heads_lib
from lowlevel.estimator.canned import optimizers
from lowlevel.estimator.estimator import Estimator
from lowlevel.models.spec import ModeKeys

v1 = tf.compat.v1
LEARNING_RATE = 0.3


def _batch_size(features, weight_column):
    """The batch size: from the weight column, else the first feature (2.15's rule)."""
    key = getattr(weight_column, "key", weight_column)
    if key:
        return tf.shape(features[key])[0]
    if not features:
        raise ValueError("The features dict of a baseline estimator must not be empty: the "
                         "batch size is read from it.")
    first = features[sorted(features)[0]]
    if isinstance(first, tf.SparseTensor):
        return tf.cast(first.dense_shape[0], tf.int32)
    return tf.shape(first)[0]


def baseline_model_fn(features, labels, mode, head, optimizer, weight_column=None):
    """2.15's `_baseline_model_fn_v2` through `head`."""
    with v1.variable_scope("baseline", use_resource=True):
        bias = v1.get_variable("bias", [head.logits_dimension], tf.float32,
                               v1.zeros_initializer())
        logits = tf.tile(bias[None, :], [_batch_size(features, weight_column), 1])
    opt = optimizers.get_optimizer_instance(optimizer, LEARNING_RATE) \
        if mode == ModeKeys.TRAIN else None
    return head.create_estimator_spec(features=features, mode=mode, labels=labels,
                                      logits=logits, optimizer=opt)


class BaselineEstimator(Estimator):
    """tf.estimator.BaselineEstimator (2.15, v2): a baseline through any head."""

    def __init__(self, head, model_dir=None, optimizer="Ftrl", config=None):
        def _model_fn(features, labels, mode):
            return baseline_model_fn(features, labels, mode, head, optimizer,
                                     getattr(head, "weight_column", None))
        super().__init__(model_fn=_model_fn, model_dir=model_dir, config=config)


class BaselineClassifier(BaselineEstimator):
    """tf.estimator.BaselineClassifier (2.15, v2)."""

    def __init__(self, model_dir=None, n_classes=2, weight_column=None,
                 label_vocabulary=None, optimizer="Ftrl", config=None,
                 loss_reduction=heads_lib.SUM_OVER_BATCH_SIZE):
        head = heads_lib.binary_or_multi_class_head(n_classes, weight_column,
                                                    label_vocabulary, loss_reduction)
        super().__init__(head, model_dir, optimizer, config)


class BaselineRegressor(BaselineEstimator):
    """tf.estimator.BaselineRegressor (2.15, v2)."""

    def __init__(self, model_dir=None, label_dimension=1, weight_column=None,
                 optimizer="Ftrl", config=None, loss_reduction=heads_lib.SUM_OVER_BATCH_SIZE):
        head = heads_lib.RegressionHead(label_dimension, weight_column,
                                        loss_reduction=loss_reduction)
        super().__init__(head, model_dir, optimizer, config)
