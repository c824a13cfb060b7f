"""DNNLinearCombinedClassifier and ...Regressor: wide & deep (Cheng et al., "Wide & Deep
Learning for Recommender Systems", DLRS 2016), as tensorflow_estimator 2.15's v2.

The logits are the sum of a linear model's (`canned.linear`, scope
`linear/`) and a DNN's (`canned.dnn`, scope `dnn/`). Each part trains with its
own optimizer, in one step that adds 1 to the global step: by default FTRL at
min(0.005, 1/sqrt(linear columns)) for the linear part and Adagrad at 0.001
for the DNN (2.15's `_LINEAR_LEARNING_RATE`, `_DNN_LEARNING_RATE`). As in 2.15
the linear optimizer counts its own steps in `training/<Name>/iter` (int64).
"""

from __future__ import annotations

import tensorflow as tf

from lowlevel.estimator.canned import dnn as dnn_lib
from lowlevel.estimator.canned import heads as heads_lib
from lowlevel.estimator.canned import linear as linear_lib
from lowlevel.estimator.canned import optimizers
from lowlevel.estimator.estimator import Estimator
from lowlevel.models.spec import ModeKeys

v1 = tf.compat.v1
DNN_LEARNING_RATE, LINEAR_LEARNING_RATE = 0.001, 0.005


def _logits(features, mode, head, config, linear, dnn):
    """(logits, linear variables, dnn variables)."""
    total, owned = [], {}
    values = tuple(dnn_lib.check_features(features).values())
    for part, columns in (("linear", linear["columns"]), ("dnn", dnn["columns"])):
        if not columns:
            continue
        scope_args = dict(values=values, use_resource=True)
        if part == "linear":
            scope_args["partitioner"] = dnn_lib.input_partitioner(config)
        with v1.variable_scope(part, **scope_args) as scope:
            if part == "linear":
                total.append(linear_lib.linear_logits(features, columns, head.logits_dimension,
                                                      linear["sparse_combiner"]))
                dnn_lib.layer_summary(total[-1], "linear")  # 2.15's `_add_layer_summary`
            else:
                if not dnn["hidden_units"]:  # 2.15 checks this when the model is built
                    raise ValueError("dnn_hidden_units must be defined when "
                                     "dnn_feature_columns is specified.")
                total.append(dnn_lib.dnn_logits(
                    features, dnn_lib.check_dense_columns(columns), dnn["hidden_units"], head.logits_dimension,
                    dnn["activation_fn"], dnn["dropout"], dnn["batch_norm"],
                    mode == ModeKeys.TRAIN,
                    dnn_lib.input_partitioner(config, dnn["input_layer_partitioner"])))
        owned[part] = v1.get_collection(v1.GraphKeys.TRAINABLE_VARIABLES, scope.name + "/")
    return tf.add_n(total), owned


def _optimizer(linear, dnn, owned):
    parts = []
    if "linear" in owned:
        rate = linear_lib.learning_rate(len(linear["columns"]), LINEAR_LEARNING_RATE)
        parts.append((optimizers.get_optimizer_instance(linear["optimizer"], rate),
                      owned["linear"]))
    if "dnn" in owned:
        parts.append((optimizers.get_optimizer_instance(dnn["optimizer"], DNN_LEARNING_RATE),
                      owned["dnn"]))
    return optimizers.Combined(parts, counted=parts[0][0] if "linear" in owned else None)


def combined_model_fn(features, labels, mode, head, linear, dnn, config):
    """2.15's `_dnn_linear_combined_model_fn_v2` through `head`; `linear` and `dnn` are
    dicts of each part's arguments."""
    logits, owned = _logits(features, mode, head, config, linear, dnn)
    opt = _optimizer(linear, dnn, owned) if mode == ModeKeys.TRAIN else None
    return head.create_estimator_spec(
        features=features, mode=mode, labels=labels, logits=logits, optimizer=opt,
        update_ops=v1.get_collection(v1.GraphKeys.UPDATE_OPS),
        regularization_losses=v1.get_collection(v1.GraphKeys.REGULARIZATION_LOSSES))


def _parts(linear_feature_columns, linear_optimizer, linear_sparse_combiner,
           dnn_feature_columns, dnn_optimizer, dnn_hidden_units, dnn_activation_fn,
           dnn_dropout, batch_norm, input_layer_partitioner):
    if not linear_feature_columns and not dnn_feature_columns:
        raise ValueError("Either linear_feature_columns or dnn_feature_columns must be "
                         "defined.")
    linear = dict(columns=tuple(linear_feature_columns or ()), optimizer=linear_optimizer,
                  sparse_combiner=linear_sparse_combiner)
    dnn = dict(columns=tuple(dnn_feature_columns or ()), optimizer=dnn_optimizer,
               hidden_units=tuple(dnn_hidden_units or ()), activation_fn=dnn_activation_fn,
               dropout=dnn_dropout, batch_norm=batch_norm,
               input_layer_partitioner=input_layer_partitioner)
    return linear, dnn


class DNNLinearCombinedEstimator(Estimator):
    """tf.estimator.DNNLinearCombinedEstimator (2.15, v2): wide & deep through any head
    (2.15's has no `warm_start_from`; `input_layer_partitioner` is an extra last argument)."""

    def __init__(self, head, model_dir=None, linear_feature_columns=None,
                 linear_optimizer="Ftrl", dnn_feature_columns=None, dnn_optimizer="Adagrad",
                 dnn_hidden_units=None, dnn_activation_fn=tf.nn.relu, dnn_dropout=None,
                 config=None, batch_norm=False, linear_sparse_combiner="sum",
                 input_layer_partitioner=None, warm_start_from=None):
        linear, dnn = _parts(linear_feature_columns, linear_optimizer, linear_sparse_combiner,
                             dnn_feature_columns, dnn_optimizer, dnn_hidden_units,
                             dnn_activation_fn, dnn_dropout, batch_norm,
                             input_layer_partitioner)

        def _model_fn(features, labels, mode, config):
            return combined_model_fn(features, labels, mode, head, linear, dnn, config)
        super().__init__(model_fn=_model_fn, model_dir=model_dir, config=config,
                         warm_start_from=warm_start_from)


class DNNLinearCombinedClassifier(DNNLinearCombinedEstimator):
    """tf.estimator.DNNLinearCombinedClassifier (2.15, v2)."""

    def __init__(self, model_dir=None, linear_feature_columns=None, linear_optimizer="Ftrl",
                 dnn_feature_columns=None, dnn_optimizer="Adagrad", dnn_hidden_units=None,
                 dnn_activation_fn=tf.nn.relu, dnn_dropout=None, n_classes=2,
                 weight_column=None, label_vocabulary=None, config=None,
                 warm_start_from=None, loss_reduction=heads_lib.SUM_OVER_BATCH_SIZE,
                 batch_norm=False, linear_sparse_combiner="sum",
                 input_layer_partitioner=None):
        head = heads_lib.binary_or_multi_class_head(n_classes, weight_column,
                                                    label_vocabulary, loss_reduction)
        super().__init__(head, model_dir, linear_feature_columns, linear_optimizer,
                         dnn_feature_columns, dnn_optimizer, dnn_hidden_units,
                         dnn_activation_fn, dnn_dropout, config, batch_norm,
                         linear_sparse_combiner, input_layer_partitioner,
                         warm_start_from=warm_start_from)


class DNNLinearCombinedRegressor(DNNLinearCombinedEstimator):
    """tf.estimator.DNNLinearCombinedRegressor (2.15, v2)."""

    def __init__(self, model_dir=None, linear_feature_columns=None, linear_optimizer="Ftrl",
                 dnn_feature_columns=None, dnn_optimizer="Adagrad", dnn_hidden_units=None,
                 dnn_activation_fn=tf.nn.relu, dnn_dropout=None, label_dimension=1,
                 weight_column=None, config=None, warm_start_from=None,
                 loss_reduction=heads_lib.SUM_OVER_BATCH_SIZE, batch_norm=False,
                 linear_sparse_combiner="sum", input_layer_partitioner=None):
        head = heads_lib.RegressionHead(label_dimension, weight_column,
                                        loss_reduction=loss_reduction)
        super().__init__(head, model_dir, linear_feature_columns, linear_optimizer,
                         dnn_feature_columns, dnn_optimizer, dnn_hidden_units,
                         dnn_activation_fn, dnn_dropout, config, batch_norm,
                         linear_sparse_combiner, input_layer_partitioner,
                         warm_start_from=warm_start_from)
