"""model_fns and input_fns that break the Estimator contract, for tests/test_bad_input.py."""

import tensorflow as tf

from tests.user_models import digits

v1 = tf.compat.v1


def no_train_op(features, labels, mode, params):
    """A TRAIN EstimatorSpec without a train_op."""
    spec = digits.model_fn(features, labels, mode, params)
    return digits._spec(mode=mode, loss=spec.loss, predictions=spec.predictions)


def no_global_step(features, labels, mode, params):
    """A train_op that applies the gradients but never moves the global step."""
    spec = digits.model_fn(features, labels, "infer", params)
    logits = tf.math.log(spec.predictions["probabilities"] + 1e-9)
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits)
    train_op = v1.train.GradientDescentOptimizer(0.1).minimize(loss)
    return digits._spec(mode=mode, loss=loss, train_op=train_op,
                        predictions=spec.predictions)


def three_tuple(mode, params, config):
    """A Dataset of (features, labels, weights): not (features, labels)."""
    ds = digits.input_fn(mode, params, config)
    return ds.map(lambda f, y: (f, y, tf.ones_like(y)))
