"""The throughput benchmark's MLP as a user's Estimator `model_fn` and `input_fn` (TF1 style).

What `benchmarks.throughput --suite=estimator` trains through lowlevel's runtime, against
the textbook between-graph trainer (`benchmarks/classic.py`) on the same model and data:

    python -m lowlevel.launch --num_ps=1 --num_workers=2 \\
        --model=benchmarks.estimator_model:model_fn \\
        --input_fn=benchmarks.estimator_model:input_fn \\
        --params='{"hidden_units": [512, 512], "learning_rate": 0.1, "batch_size": 128}' \\
        --train_steps=2000

Written as a user would, with nothing of lowlevel's in it but the `EstimatorSpec` (TF 2.16+
has no `tf.estimator`; with it, its own is used): `tf.compat.v1.get_variable` + `tf.matmul`,
no Keras, and the train_op the model builds itself, `AdagradOptimizer(lr).minimize(loss,
global_step=tf.compat.v1.train.get_global_step())`.

The model is `benchmarks/classic.py`'s `mlp` exactly: variables `hid<i>_w`/`hid<i>_b` and
`sm_w`/`sm_b`, Glorot-uniform kernels seeded with the layer's index, zero biases, ReLU,
softmax cross-entropy (mean over the batch), Adagrad (`learning_rate`, 0.1).

`params` (all optional): hidden_units (list of int, [512, 512]), learning_rate (0.1),
batch_size (128), shuffle_seed (0: each worker's shuffle is seeded with its id in the
cluster plus this).

The data: `benchmarks/_reference.synthetic_train()` (16,384 MNIST-shaped uint8 images,
labels from a fixed linear teacher), pixels / 255 as float32, as the classic trainer feeds
them; evaluation (the chief's, at the end) on the matching test split of
`lowlevel.data.images.synthetic()` (2,048 images).
"""

from __future__ import annotations

import tensorflow as tf

from benchmarks import _reference

v1 = tf.compat.v1

HIDDEN_UNITS = (512, 512)
LEARNING_RATE = 0.1
BATCH_SIZE = 128


def _train_split():
    return _reference.synthetic_train()


def _test_split():
    from lowlevel.data import images  # the matching held-out split (same seed and teacher)
    test = images.synthetic().test
    return test.images.reshape(len(test.labels), -1), test.labels


def _is_training(mode) -> bool:
    train = tf.estimator.ModeKeys.TRAIN if hasattr(tf, "estimator") else "train"
    return mode == train


def input_fn(mode, params, config):
    """A `tf.data.Dataset` of ({"images": float32 [B, 784]}, labels int64 [B]).

    Training: this worker's shard of the training split (`config.global_id_in_cluster` of
    `config.num_worker_replicas`), reshuffled every epoch, repeated, batches of
    `params["batch_size"]` with drop_remainder (a static batch size), prefetched.
    Evaluation: the test split once, in batches of 1,024.
    """
    params = params or {}
    if not _is_training(mode):
        images, labels = _test_split()
        ds = tf.data.Dataset.from_tensor_slices((images, labels)).batch(1024)
        return ds.map(_scale)
    images, labels = _train_split()  # uint8 in the graph: 12.8 MB, not 51 MB of floats
    shards = max(int(getattr(config, "num_worker_replicas", 1) or 1), 1)
    index = min(int(getattr(config, "global_id_in_cluster", 0) or 0), shards - 1)
    seed = index + int(params.get("shuffle_seed", 0))
    ds = tf.data.Dataset.from_tensor_slices((images, labels)).shard(shards, index)
    ds = ds.shuffle(len(labels) // shards, seed=seed, reshuffle_each_iteration=True).repeat()
    ds = ds.batch(int(params.get("batch_size", BATCH_SIZE)), drop_remainder=True)
    return ds.map(_scale).prefetch(2)  # scaled a batch at a time (one op, not 128)


def _scale(images, labels):
    return {"images": tf.cast(images, tf.float32) / 255.0}, labels


def mlp(images, hidden_units):
    """images float32 `[B, 784]` -> logits `[B, 10]`: `benchmarks.classic.mlp`'s layers."""
    x = images
    widths = list(hidden_units) + [_reference.NUM_CLASSES]
    for i, units in enumerate(widths):
        name = f"hid{i}" if i < len(hidden_units) else "sm"
        w = v1.get_variable(f"{name}_w", [x.shape[-1], units], tf.float32,
                            v1.glorot_uniform_initializer(seed=i))
        b = v1.get_variable(f"{name}_b", [units], tf.float32, v1.zeros_initializer())
        x = tf.nn.bias_add(tf.matmul(x, w), b)
        if i < len(hidden_units):
            x = tf.nn.relu(x)
    return x


def model_fn(features, labels, mode, params):
    """The MLP; TRAIN builds its own train_op (Adagrad minimize with the global step)."""
    params = params or {}
    logits = mlp(features["images"], [int(h) for h in params.get("hidden_units", HIDDEN_UNITS)])
    classes = tf.argmax(logits, axis=1)
    predictions = {"classes": classes, "probabilities": tf.nn.softmax(logits)}
    if mode == "infer":
        return _spec(mode=mode, predictions=predictions)
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=labels, logits=logits))
    if not _is_training(mode):
        return _spec(mode=mode, loss=loss, predictions=predictions,
                     eval_metric_ops={"accuracy": v1.metrics.accuracy(labels, classes)})
    opt = v1.train.AdagradOptimizer(float(params.get("learning_rate", LEARNING_RATE)))
    train_op = opt.minimize(loss, global_step=v1.train.get_global_step())
    return _spec(mode=mode, loss=loss, train_op=train_op, predictions=predictions)


def _spec(**kwargs):
    """An EstimatorSpec: tf.estimator's where it exists (TF <= 2.15), else lowlevel's."""
    if hasattr(tf, "estimator"):
        return tf.estimator.EstimatorSpec(**kwargs)
    from lowlevel.models.spec import EstimatorSpec
    return EstimatorSpec(**kwargs)


def params_json(hidden_units=HIDDEN_UNITS, learning_rate=LEARNING_RATE,
                batch_size=BATCH_SIZE) -> dict:
    """The `--params` object of a run (for `json.dumps`)."""
    return {"hidden_units": [int(h) for h in hidden_units], "learning_rate": float(learning_rate),
            "batch_size": int(batch_size)}

