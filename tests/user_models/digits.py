"""An Estimator model_fn and input_fn of a user's, in TF1 style: an MLP on scikit-learn's digits.

    .venv/bin/python -m lowlevel.trainer --model=tests.user_models.digits:model_fn \
        --input_fn=tests.user_models.digits:input_fn --params='{"hidden_units": [64]}'

`params`: hidden_units (list of int), learning_rate (float, Adagrad), batch_size (int),
sync (bool: wrap the optimizer in SyncReplicasOptimizer, with its hook), workers (int, with
sync).
"""

import numpy as np
import tensorflow as tf

v1 = tf.compat.v1


def _digits(train: bool):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    bunch = load_digits()
    x = (bunch.images.reshape(-1, 64) / 16.0).astype(np.float32)
    y = bunch.target.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=360, random_state=0, stratify=y)
    return (x_tr, y_tr) if train else (x_te, y_te)


def input_fn(mode, params, config):
    """A Dataset of ({"pixels": float32 [B, 64]}, labels int64 [B]): the training split,
    shuffled and repeated, sharded by worker; the test split once for evaluation."""
    train = mode == tf.estimator.ModeKeys.TRAIN if hasattr(tf, "estimator") else mode == "train"
    x, y = _digits(train)
    ds = tf.data.Dataset.from_tensor_slices(({"pixels": x}, y))
    if train:
        shards = max(getattr(config, "num_worker_replicas", 1), 1)
        index = getattr(config, "global_id_in_cluster", 0) or 0
        ds = ds.shard(shards, min(index, shards - 1)).shuffle(2048, seed=index).repeat()
        return ds.batch(params.get("batch_size", 64), drop_remainder=True)
    return ds.batch(1000)


def model_fn(features, labels, mode, params, config=None):
    """An MLP of `params["hidden_units"]` from tf.compat.v1 variables, Adagrad, accuracy.

    With `params["sync"]` its optimizer is wrapped in `SyncReplicasOptimizer` for
    `params["workers"]` workers, its hook made for `config.is_chief` (as TF1 code does)."""
    x = features["pixels"]
    for i, units in enumerate(params.get("hidden_units", [64])):
        w = v1.get_variable(f"hidden{i}/kernel", [x.shape[-1], units],
                            initializer=v1.glorot_uniform_initializer(seed=i))
        b = v1.get_variable(f"hidden{i}/bias", [units], initializer=v1.zeros_initializer())
        x = tf.nn.relu(tf.matmul(x, w) + b)
    w = v1.get_variable("logits/kernel", [x.shape[-1], 10],
                        initializer=v1.glorot_uniform_initializer(seed=99))
    b = v1.get_variable("logits/bias", [10], initializer=v1.zeros_initializer())
    logits = tf.matmul(x, w) + b
    classes = tf.argmax(logits, axis=1)
    predictions = {"classes": classes, "probabilities": tf.nn.softmax(logits)}
    if mode == "infer":
        return _spec(mode=mode, predictions=predictions)
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits)
    accuracy = v1.metrics.accuracy(labels, classes)
    opt = v1.train.AdagradOptimizer(params.get("learning_rate", 0.1))
    hooks = []
    if params.get("sync"):
        opt = v1.train.SyncReplicasOptimizer(opt, replicas_to_aggregate=params["workers"],
                                             total_num_replicas=params["workers"])
        hooks.append(opt.make_session_run_hook(getattr(config, "is_chief", True)))
    train_op = opt.minimize(loss, global_step=v1.train.get_global_step())
    return _spec(mode=mode, loss=loss, train_op=train_op, predictions=predictions,
                 eval_metric_ops={"accuracy": accuracy}, training_hooks=hooks)


def _spec(**kwargs):
    """An EstimatorSpec: tf.estimator's when it exists (TF <= 2.15, or aliased), else lowlevel's."""
    if hasattr(tf, "estimator"):
        return tf.estimator.EstimatorSpec(**kwargs)
    from lowlevel.models.spec import EstimatorSpec
    return EstimatorSpec(**kwargs)
