"""LinearClassifier and LinearRegressor (tensorflow_estimator 2.15's v2 canned linear
estimators).

The model: `tf.compat.v1.feature_column.linear_model` (one weight row per
numeric value or category, a bias), logits of the head's `logits_dimension`,
`sparse_combiner` ('sum', 'mean' or 'sqrtn') over a multi-valued categorical
column. Variables as 2.15's: `linear/linear_model/<column>/weights`
(`[size, logits_dimension]`) and `linear/linear_model/bias_weights`; a large
column's weights are split into at most one slice per ps task of at least 64
MiB (2.15's partitioner). Default optimizer FTRL at 0.2 (2.15's v2 gives a name its
`_LEARNING_RATE`), slots `training/Ftrl/<variable>/{accumulator,linear}`.
"""

from __future__ import annotations

import math

import tensorflow as tf

from lowlevel.estimator.canned import heads as heads_lib
from lowlevel.estimator.canned import optimizers, sdca
from lowlevel.estimator.canned.dnn import check_features, input_partitioner
from lowlevel.estimator.estimator import Estimator
from lowlevel.models.spec import ModeKeys

v1 = tf.compat.v1
LEARNING_RATE = 0.2  # 2.15's linear._LEARNING_RATE


def learning_rate(num_columns: int, cap: float) -> float:
    """2.15's default FTRL learning rate of wide & deep's linear part: min(cap, 1 /
    sqrt(num_columns)). (Its LinearClassifier's is always 0.2: given the name 'Ftrl', its
    v2 code never applies this rule; measured in tests/fixtures/canned215.)"""
    return min(cap, 1.0 / math.sqrt(num_columns))


def linear_logits(features, feature_columns, units, sparse_combiner="sum"):
    """The linear model's logits, float32 `[batch, units]`, in the current scope."""
    if not feature_columns:
        raise ValueError("feature_columns must not be empty.")
    logits = v1.feature_column.linear_model(features, list(feature_columns), units=units,
                                            sparse_combiner=sparse_combiner)
    variables = v1.get_collection(v1.GraphKeys.GLOBAL_VARIABLES,
                                  v1.get_variable_scope().name + "/")
    bias = [v for v in variables if v.op.name.endswith("linear_model/bias_weights")][:1]
    with v1.name_scope(None):  # 2.15's root tags "bias" and "fraction_of_zero_weights"
        for b in bias:
            if units > 1:
                v1.summary.histogram("bias", b)
            else:
                v1.summary.scalar("bias", b[0])
        v1.summary.scalar("fraction_of_zero_weights", fraction_of_zero(variables))
    return logits


def fraction_of_zero(variables) -> tf.Tensor:
    """float32 scalar: the fraction of the elements of `variables` that are 0 (2.15's
    `linear._compute_fraction_of_zero`, its `fraction_of_zero_weights` summary)."""
    with v1.name_scope("zero_fraction"):
        sizes = [tf.cast(tf.size(v, out_type=tf.int64), tf.float32) for v in variables]
        zeros = [tf.math.zero_fraction(v) * size for v, size in zip(variables, sizes)]
        return tf.math.divide_no_nan(tf.add_n(zeros), tf.add_n(sizes))


def linear_model_fn(features, labels, mode, head, feature_columns, optimizer, config,
                    sparse_combiner="sum"):
    """2.15's `_linear_model_fn_v2`: the linear model's EstimatorSpec through `head` (a
    `LinearSDCA` optimizer: 2.15's `_sdca_model_fn`, `canned.sdca`)."""
    if isinstance(optimizer, sdca.LinearSDCA):
        return sdca.sdca_model_fn(check_features(features), labels, mode, head,
                                  feature_columns, optimizer)
    with v1.variable_scope("linear", values=tuple(check_features(features).values()),
                           use_resource=True,
                           partitioner=input_partitioner(config)):
        logits = linear_logits(features, feature_columns, head.logits_dimension,
                               sparse_combiner)
    training = mode == ModeKeys.TRAIN
    opt = optimizers.get_optimizer_instance(optimizer, LEARNING_RATE) if training else None
    return head.create_estimator_spec(
        features=features, mode=mode, labels=labels, logits=logits, optimizer=opt,
        regularization_losses=v1.get_collection(v1.GraphKeys.REGULARIZATION_LOSSES))


class LinearEstimator(Estimator):
    """tf.estimator.LinearEstimator (2.15, v2): a linear model through any head."""

    def __init__(self, head, feature_columns, model_dir=None, optimizer="Ftrl", config=None,
                 sparse_combiner="sum", warm_start_from=None):
        feature_columns = tuple(feature_columns or ())  # checked at model_fn time (2.15)

        def _model_fn(features, labels, mode, config):
            return linear_model_fn(features, labels, mode, head, feature_columns, optimizer,
                                   config, sparse_combiner)
        super().__init__(model_fn=_model_fn, model_dir=model_dir, config=config,
                         warm_start_from=warm_start_from)


class LinearClassifier(LinearEstimator):
    """tf.estimator.LinearClassifier (2.15, v2): n_classes 2 -> BinaryClassHead, more
    -> MultiClassHead."""

    def __init__(self, feature_columns, model_dir=None, n_classes=2, weight_column=None,
                 label_vocabulary=None, optimizer="Ftrl", config=None, warm_start_from=None,
                 loss_reduction=heads_lib.SUM_OVER_BATCH_SIZE, sparse_combiner="sum"):
        sdca.check_estimator(optimizer, feature_columns, sparse_combiner, n_classes=n_classes)
        head = heads_lib.binary_or_multi_class_head(n_classes, weight_column,
                                                    label_vocabulary, loss_reduction)
        super().__init__(head, feature_columns, model_dir=model_dir, optimizer=optimizer,
                         config=config, sparse_combiner=sparse_combiner,
                         warm_start_from=warm_start_from)


class LinearRegressor(LinearEstimator):
    """tf.estimator.LinearRegressor (2.15, v2): RegressionHead(label_dimension)."""

    def __init__(self, feature_columns, model_dir=None, label_dimension=1,
                 weight_column=None, optimizer="Ftrl", config=None, warm_start_from=None,
                 loss_reduction=heads_lib.SUM_OVER_BATCH_SIZE, sparse_combiner="sum"):
        sdca.check_estimator(optimizer, feature_columns, sparse_combiner,
                             label_dimension=label_dimension)
        head = heads_lib.RegressionHead(label_dimension, weight_column,
                                        loss_reduction=loss_reduction)
        super().__init__(head, feature_columns, model_dir=model_dir, optimizer=optimizer,
                         config=config, sparse_combiner=sparse_combiner,
                         warm_start_from=warm_start_from)
