"""The built-in models, as Estimator `model_fn`s built from `tf.compat.v1` primitives.

`model_fn(features, labels, mode, params)` is the built-in models' model_fn, of the
form a user's is (`lowlevel.models.spec`): softmax, mlp, cnn and wide_deep, named by
`params["model"]`. The runtime trains a built-in model through it as any model_fn, in
every mode (`runtime.step`), and evaluates it through its PREDICT-mode logits
(`logits_fn`); a user can run it as any model_fn
(`--model=lowlevel.models.catalogue:model_fn`).

`tf.compat.v1.layers` is gone under Keras 3, so layers here are a few lines
each. All variables live under the `model/` variable scope with
`AUTO_REUSE`, so building a model a second time (for evaluation) shares them.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import tensorflow as tf

from lowlevel.config import DEFAULT_LEARNING_RATES
from lowlevel.models import dynamic_embeddings, wide_deep
from lowlevel.models import spec as spec_lib

v1 = tf.compat.v1


def build(name: str, images, num_classes: int, hidden_units: Sequence[int], seed: int = 0,
          partitioner=None, sparse=None):
    """Returns logits float32 `[B, num_classes]` for images float32 `[B, H, W, C]`.

    "wide_deep" takes a dict of features instead (`lowlevel.data.ctr`) and
    `sparse` (a `wide_deep.Spec`), and returns one logit per example, `[B]`.

    Args:
      name: "softmax" (one linear layer), "mlp" (ReLU layers of `hidden_units`)
        "cnn" (two 5x5 conv + 2x2 max-pool blocks of 32 and 64 channels, then
        a ReLU layer of `hidden_units[0]`).
      partitioner: shards the variables (`placement.partitioner`); a sharded
        kernel is used as one tensor, its shards concatenated.
    Raises:
      ValueError: unknown name.
    """
    builders = {"softmax": _softmax, "mlp": _mlp, "cnn": _cnn, "wide_deep": None}
    if name not in builders:
        raise ValueError(f"unknown model {name!r}; expected one of {', '.join(builders)}")
    with v1.variable_scope("model", reuse=v1.AUTO_REUSE, partitioner=partitioner):
        if name == "wide_deep":
            return wide_deep.logits(images, sparse, tuple(hidden_units), seed, dense)
        return builders[name](images, num_classes, tuple(hidden_units), seed)


def model_fn(features, labels, mode, params):
    """The built-in models as an Estimator model_fn; returns an `EstimatorSpec`.

    Args:
      features: images float32 `[B, H, W, C]` (in [0, 1]), or wide_deep's feature dict.
      labels: int64 `[B]`, or None (PREDICT).
      params: "model" (softmax, mlp, cnn, wide_deep), "num_classes", "hidden_units",
        "seed" (default 0), "partitioner" and "sparse" (`wide_deep.Spec`) as `build`
        takes them; for TRAIN "optimizer" and "learning_rate" (`optimizers.make_optimizer`).

    Predictions: "logits", "classes" (int64 `[B]`), "probabilities" (softmax; a binary
    model's sigmoid, `[B]`); eval metric "accuracy"; TRAIN: the batch's accuracy as the
    summary "accuracy"; export output "serving_default".
    """
    logits = build(params["model"], features, params["num_classes"], params["hidden_units"],
                   params.get("seed", 0), params.get("partitioner"), params.get("sparse"))
    binary = logits.shape.rank == 1
    classes = (tf.cast(logits > 0, tf.int64) if binary else
               tf.argmax(logits, axis=1, output_type=tf.int64))
    probabilities = tf.sigmoid(logits) if binary else tf.nn.softmax(logits)
    predictions = {"logits": logits, "classes": classes, "probabilities": probabilities}
    if mode == spec_lib.ModeKeys.PREDICT:
        return spec_lib.EstimatorSpec(mode, predictions=predictions)
    loss, accuracy = loss_and_accuracy(logits, labels)
    if mode == spec_lib.ModeKeys.EVAL:
        return spec_lib.EstimatorSpec(
            mode, predictions=predictions, loss=loss,
            eval_metric_ops={"accuracy": v1.metrics.accuracy(labels, classes)})
    from lowlevel.models.optimizers import make_optimizer
    v1.summary.scalar("accuracy", accuracy)  # the batch's
    train_op = make_optimizer(params["optimizer"], params["learning_rate"]).minimize(
        loss, global_step=v1.train.get_global_step())
    return spec_lib.EstimatorSpec(mode, predictions=predictions, loss=loss, train_op=train_op)


def params_for(config, data, partitioner=None, ps_tasks: int = 0, local_shards: int = 0) -> dict:
    """`model_fn`'s params for `config`'s model (a `TrainConfig`) on `data` (its classes,
    its click-through fields for wide_deep; with --embedding=dynamic, dynamic tables of
    one shard per ps task, `ps_tasks`, 0 in one process; `local_shards` > 0: that many
    shards in this process, as `dynamic_embeddings.Options` says)."""
    options = dynamic_options(config, ps_tasks)
    if options is not None and local_shards:
        options = dataclasses.replace(options, local_shards=local_shards)
    sparse = (wide_deep.Spec.of(data, config.embedding_dim, config.embedding_l2, options)
              if config.model == "wide_deep" else None)
    return {"model": config.model, "num_classes": data.num_classes,
            "hidden_units": tuple(config.hidden_units), "seed": config.seed,
            "partitioner": partitioner, "sparse": sparse, "optimizer": config.optimizer,
            "learning_rate": config.lr}


def dynamic_options(config, ps_tasks: int = 0):
    """The `dynamic_embeddings.Options` of `config` (--embedding=dynamic), else None.

    The rows' optimizer is --optimizer's when it is adagrad or adam (lazy, per row),
    else Adagrad; its rate --dynamic_learning_rate, or --learning_rate when the
    optimizer is --optimizer's, else Adagrad's default (0.1).
    """
    if config.embedding != "dynamic":
        return None
    same = config.optimizer in dynamic_embeddings.SLOTS
    optimizer = config.optimizer if same else "adagrad"
    rate = config.dynamic_learning_rate or (
        config.lr if same else DEFAULT_LEARNING_RATES["adagrad"])
    return dynamic_embeddings.Options(ps_tasks, config.dynamic_capacity, config.admit_after,
                                      config.evict_after_steps, rate, optimizer)


def for_config(config, data, partitioner=None, ps_tasks: int = 0, local_shards: int = 0):
    """`inputs -> logits` of `config`'s model on `data`: `model_fn`'s PREDICT-mode logits
    (`params_for` says what `ps_tasks` and `local_shards` do)."""
    return logits_fn(params_for(config, data, partitioner, ps_tasks, local_shards))


def logits_fn(params: dict):
    """`inputs -> logits` of `model_fn` with `params` in PREDICT mode."""
    return lambda inputs: model_fn(inputs, None, spec_lib.ModeKeys.PREDICT,
                                   params).predictions["logits"]


def _flatten(x):
    return tf.reshape(x, [-1, x.shape[1:].num_elements()])


def _sliced(initializer):
    """`initializer`, made to give each shard of a sharded variable its slice of one draw.

    Called per shard with the same seed, a random initializer would give every
    shard the same values; this draws the full shape and slices, so a model's
    initial values do not depend on how many ps tasks hold it.
    """
    def init(shape, dtype=None, partition_info=None):
        if partition_info is None:
            return initializer(shape, dtype)
        full = initializer(partition_info.full_shape, dtype)
        return tf.slice(full, partition_info.var_offset, shape)
    return init


def dense(x, units: int, name: str, seed: int, activation=None):
    """x float32 `[B, n]` -> `[B, units]`; kernel Glorot-uniform, bias zeros."""
    with v1.variable_scope(name):
        kernel = v1.get_variable("kernel", [x.shape[-1], units], tf.float32,
                                 _sliced(v1.glorot_uniform_initializer(seed=seed)))
        bias = v1.get_variable("bias", [units], tf.float32, v1.zeros_initializer())
        y = tf.nn.bias_add(tf.matmul(x, kernel), bias)
        return activation(y) if activation else y


def conv2d(x, filters: int, size: int, name: str, seed: int):
    """x float32 `[B, H, W, C]` -> ReLU(conv) `[B, H, W, filters]` (SAME padding, stride 1)."""
    with v1.variable_scope(name):
        kernel = v1.get_variable("kernel", [size, size, x.shape[-1], filters], tf.float32,
                                 _sliced(v1.glorot_uniform_initializer(seed=seed)))
        bias = v1.get_variable("bias", [filters], tf.float32, v1.zeros_initializer())
        y = tf.nn.conv2d(x, kernel, strides=1, padding="SAME")
        return tf.nn.relu(tf.nn.bias_add(y, bias))


def _softmax(images, num_classes, hidden_units, seed):
    return dense(_flatten(images), num_classes, "logits", seed)


def _mlp(images, num_classes, hidden_units, seed):
    x = _flatten(images)
    for i, units in enumerate(hidden_units):
        x = dense(x, units, f"hidden{i}", seed + i, tf.nn.relu)
    return dense(x, num_classes, "logits", seed + len(hidden_units))


def _cnn(images, num_classes, hidden_units, seed):
    x = images
    for i, filters in enumerate((32, 64)):
        x = conv2d(x, filters, 5, f"conv{i}", seed + i)
        x = tf.nn.max_pool2d(x, ksize=2, strides=2, padding="SAME")
    x = dense(_flatten(x), hidden_units[0], "hidden0", seed + 2, tf.nn.relu)
    return dense(x, num_classes, "logits", seed + 3)


def loss_and_accuracy(logits, labels):
    """Mean cross-entropy and accuracy, float32 scalars, for labels int64 `[B]`.

    Logits `[B, num_classes]`: softmax cross-entropy; one logit per example
    `[B]` (wide_deep): sigmoid cross-entropy.
    """
    if logits.shape.rank == 1:
        return wide_deep.loss_and_accuracy(logits, labels)
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=labels, logits=logits))
    correct = tf.equal(tf.argmax(logits, axis=1), labels)
    return loss, tf.reduce_mean(tf.cast(correct, tf.float32))
