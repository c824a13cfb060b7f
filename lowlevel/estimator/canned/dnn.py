"""DNNClassifier and DNNRegressor (tensorflow_estimator 2.15's v2 canned DNN estimators).

The model (2.15's `dnn.py`): the feature columns' dense input
(`input_layer`, its embedding tables under `input_layer_partitioner`, by
default at most one slice per ps and 64 MiB per slice), then one fully
connected layer per entry of `hidden_units` (`activation_fn`, then dropout at
rate `dropout` in training, then batch normalization when `batch_norm`), then
a linear `logits` layer of the head's `logits_dimension`. Variables are named
as 2.15's: `dnn/input_from_feature_columns/input_layer/<column>_embedding/embedding_weights`,
`dnn/hiddenlayer_<i>/{kernel,bias}`, `dnn/hiddenlayer_<i>/batchnorm_<i>/{gamma,
beta,moving_mean,moving_variance}`, `dnn/logits/{kernel,bias}`; the default
optimizer is Adagrad at 0.001 (Keras' default, as 2.15's v2; `canned.optimizers`: its slots
`training/Adagrad/<variable>/accumulator`).
"""

from __future__ import annotations

import tensorflow as tf
from tensorflow.python.feature_column import feature_column as fc_v1
from tensorflow.python.feature_column import feature_column_v2 as fc_v2

from lowlevel.estimator.canned import heads as heads_lib
from lowlevel.estimator.canned import optimizers
from lowlevel.estimator.estimator import Estimator
from lowlevel.models.spec import ModeKeys

v1 = tf.compat.v1
# 2.15's v2 DNN passes no learning rate for a name: Keras' default, 0.001 (measured: its
# checkpoints hold training/Adagrad/learning_rate = 0.001; 0.05, dnn._LEARNING_RATE, was v1's).
LEARNING_RATE = 0.001
BATCH_NORM_MOMENTUM, BATCH_NORM_EPSILON = 0.999, 0.001  # 2.15's DNN batch norm layers
INPUT_SLICE_BYTES = 64 << 20  # 2.15's min_slice_size of the input layer's partitioner


def input_partitioner(config, partitioner=None):
    """The input layer's partitioner: the one given, else at most one slice per ps
    task and at least 64 MiB per slice (2.15's default); None without ps tasks."""
    if partitioner is not None:
        return partitioner
    num_ps = getattr(config, "num_ps_replicas", 0) or 0
    if num_ps < 2:
        return None
    return v1.min_max_variable_partitioner(max_partitions=num_ps,
                                           min_slice_size=INPUT_SLICE_BYTES)


def check_dense_columns(feature_columns):
    """At model_fn time, as 2.15: ValueError for no columns or a column that is not dense
    (a categorical column not wrapped in an embedding or indicator column)."""
    if not feature_columns:
        raise ValueError("feature_columns must not be empty.")
    for column in feature_columns:
        if not isinstance(column, (fc_v2.DenseColumn, fc_v1._DenseColumn)):
            raise ValueError(
                f"Items of feature_columns must be a {fc_v2.DenseColumn}. You can wrap a "
                f"categorical column with an embedding_column or indicator_column. Given: "
                f"{column}")
    return tuple(feature_columns)


def _dense(net, units, activation=None):
    kernel = v1.get_variable("kernel", [net.shape[-1], units], tf.float32,
                             v1.glorot_uniform_initializer())
    bias = v1.get_variable("bias", [units], tf.float32, v1.zeros_initializer())
    out = tf.matmul(net, kernel) + bias
    return activation(out) if activation is not None else out


def _batch_norm(net, index, training):
    """Keras' BatchNormalization (momentum 0.999, epsilon 0.001) in TF1 ops; the
    moving averages' updates go into the UPDATE_OPS collection in training."""
    with v1.variable_scope(f"batchnorm_{index}"):
        size = [net.shape[-1]]
        gamma = v1.get_variable("gamma", size, initializer=v1.ones_initializer())
        beta = v1.get_variable("beta", size, initializer=v1.zeros_initializer())
        mean_var = v1.get_variable("moving_mean", size, initializer=v1.zeros_initializer(),
                                   trainable=False)
        var_var = v1.get_variable("moving_variance", size, initializer=v1.ones_initializer(),
                                  trainable=False)
    if not training:
        return tf.nn.batch_normalization(net, mean_var, var_var, beta, gamma,
                                         BATCH_NORM_EPSILON)
    mean, variance = tf.nn.moments(net, axes=[0])
    for moving, value in ((mean_var, mean), (var_var, variance)):
        v1.add_to_collection(v1.GraphKeys.UPDATE_OPS, moving.assign_sub(
            (moving - value) * (1.0 - BATCH_NORM_MOMENTUM)))
    return tf.nn.batch_normalization(net, mean, variance, beta, gamma, BATCH_NORM_EPSILON)


def check_features(features):
    """2.15's ValueError for features that are not a dict of tensors."""
    if not isinstance(features, dict):
        raise ValueError(f"features should be a dictionary of `Tensor`s. Given type: "
                         f"{type(features)}")
    return features


def activation(fn):
    """An activation function, or its name as Keras knows it ('relu', 'tanh', ...)."""
    if not isinstance(fn, str):
        return fn
    found = {"linear": tf.identity, "sigmoid": tf.sigmoid, "tanh": tf.tanh}.get(fn) or \
        getattr(tf.nn, fn, None)
    if found is None:
        raise ValueError(f"Unknown activation function: {fn}")
    return found


def layer_summary(net, scope):
    """2.15's tags `<scope>/fraction_of_zero_values` and `<scope>/activation` (`scope`: the
    layer's full variable scope name, "dnn/hiddenlayer_0"), whatever name scope is open."""
    with v1.name_scope(None):
        v1.summary.scalar(f"{scope}/fraction_of_zero_values", tf.math.zero_fraction(net))
        v1.summary.histogram(f"{scope}/activation", net)


def dnn_logits(features, feature_columns, hidden_units, units, activation_fn=tf.nn.relu,
               dropout=None, batch_norm=False, training=False, input_layer_partitioner=None):
    """The DNN's logits, float32 `[batch, units]`, built in the current variable scope."""
    with v1.variable_scope("input_from_feature_columns", partitioner=input_layer_partitioner):
        net = v1.feature_column.input_layer(features, list(feature_columns))
    for i, width in enumerate(hidden_units):
        with v1.variable_scope(f"hiddenlayer_{i}") as scope:
            net = _dense(net, int(width), activation(activation_fn))
            if dropout is not None and training:
                net = tf.nn.dropout(net, rate=dropout)
            if batch_norm:
                net = _batch_norm(net, i, training)
        layer_summary(net, scope.name)
    with v1.variable_scope("logits") as scope:
        logits = _dense(net, units)
    layer_summary(logits, scope.name)
    return logits


def dnn_model_fn(features, labels, mode, head, hidden_units, feature_columns,
                 optimizer="Adagrad", activation_fn=tf.nn.relu, dropout=None, config=None,
                 batch_norm=False, input_layer_partitioner=None):
    """2.15's `_dnn_model_fn_v2`: the DNN's EstimatorSpec for `mode` through `head`."""
    training = mode == ModeKeys.TRAIN
    feature_columns = check_dense_columns(feature_columns)
    with v1.variable_scope("dnn", values=tuple(check_features(features).values()),
                           use_resource=True):
        logits = dnn_logits(features, feature_columns, hidden_units, head.logits_dimension,
                            activation_fn, dropout, batch_norm, training,
                            input_partitioner(config, input_layer_partitioner))
    opt = optimizers.get_optimizer_instance(optimizer, LEARNING_RATE) if training else None
    return head.create_estimator_spec(
        features=features, mode=mode, labels=labels, logits=logits, optimizer=opt,
        update_ops=v1.get_collection(v1.GraphKeys.UPDATE_OPS),
        regularization_losses=v1.get_collection(v1.GraphKeys.REGULARIZATION_LOSSES))


class DNNEstimator(Estimator):
    """tf.estimator.DNNEstimator (2.15, v2): a DNN through any head (the classifier and
    regressor below choose theirs). `input_layer_partitioner` (2.15's v1 argument) is
    honoured as an extra last argument."""

    def __init__(self, head, hidden_units, feature_columns, model_dir=None,
                 optimizer="Adagrad", activation_fn=tf.nn.relu, dropout=None, config=None,
                 warm_start_from=None, batch_norm=False, input_layer_partitioner=None):
        # As 2.15, the arguments are checked when the model is built (train, evaluate, ...).
        def _model_fn(features, labels, mode, config):
            return dnn_model_fn(features, labels, mode, head, hidden_units, feature_columns,
                                optimizer, activation_fn, dropout, config, batch_norm,
                                input_layer_partitioner)
        super().__init__(model_fn=_model_fn, model_dir=model_dir, config=config,
                         warm_start_from=warm_start_from)


class DNNClassifier(DNNEstimator):
    """tf.estimator.DNNClassifier (2.15, v2): n_classes 2 -> BinaryClassHead, more ->
    MultiClassHead; the arguments and defaults of 2.15's constructor."""

    def __init__(self, hidden_units, feature_columns, model_dir=None, n_classes=2,
                 weight_column=None, label_vocabulary=None, optimizer="Adagrad",
                 activation_fn=tf.nn.relu, dropout=None, config=None, warm_start_from=None,
                 loss_reduction=heads_lib.SUM_OVER_BATCH_SIZE, batch_norm=False,
                 input_layer_partitioner=None):
        head = heads_lib.binary_or_multi_class_head(n_classes, weight_column,
                                                    label_vocabulary, loss_reduction)
        super().__init__(head, hidden_units, feature_columns, model_dir=model_dir,
                         optimizer=optimizer, activation_fn=activation_fn, dropout=dropout,
                         config=config, warm_start_from=warm_start_from,
                         batch_norm=batch_norm,
                         input_layer_partitioner=input_layer_partitioner)


class DNNRegressor(DNNEstimator):
    """tf.estimator.DNNRegressor (2.15, v2): RegressionHead(label_dimension)."""

    def __init__(self, hidden_units, feature_columns, model_dir=None, label_dimension=1,
                 weight_column=None, optimizer="Adagrad", activation_fn=tf.nn.relu,
                 dropout=None, config=None, warm_start_from=None,
                 loss_reduction=heads_lib.SUM_OVER_BATCH_SIZE, batch_norm=False,
                 input_layer_partitioner=None):
        head = heads_lib.RegressionHead(label_dimension, weight_column,
                                        loss_reduction=loss_reduction)
        super().__init__(head, hidden_units, feature_columns, model_dir=model_dir,
                         optimizer=optimizer, activation_fn=activation_fn, dropout=dropout,
                         config=config, warm_start_from=warm_start_from,
                         batch_norm=batch_norm,
                         input_layer_partitioner=input_layer_partitioner)
