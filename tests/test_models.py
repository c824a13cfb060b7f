import numpy as np
import pytest
import tensorflow as tf

from lowlevel.data import images as data_lib
from lowlevel.models import catalogue as models
from lowlevel.runtime import evaluation

v1 = tf.compat.v1


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name,hidden", [("softmax", (8,)), ("mlp", (64, 32)), ("cnn", (32,))])
def test_each_model_learns_digits_and_evaluation_reuses_its_variables(name, hidden):
    ds = data_lib.load_digits()
    with tf.Graph().as_default():
        init_it, feed, (images, labels) = data_lib.train_input(ds, 64, 1, 0, seed=0)
        logits = models.build(name, images, 10, hidden)
        assert logits.shape.as_list() == [64, 10]
        loss, _ = models.loss_and_accuracy(logits, labels)
        train = v1.train.AdagradOptimizer(0.1).minimize(loss)
        n_vars = len(v1.global_variables())
        ev = evaluation.build(ds, ds.test,
                              lambda x: models.build(name, x, 10, hidden))
        assert len(v1.trainable_variables()) * 2 == n_vars  # no new weights, 1 slot each
        with v1.Session() as sess:
            sess.run([v1.global_variables_initializer(), init_it], feed)
            before = evaluation.evaluate(sess, ev)
            for _ in range(150):
                sess.run(train)
            after = evaluation.evaluate(sess, ev)
    assert before["num_examples"] == after["num_examples"] == 360
    assert after["loss"] < before["loss"]
    assert after["accuracy"] >= 0.85, after


def test_unknown_model_is_an_error():
    with tf.Graph().as_default():
        with pytest.raises(ValueError, match="unknown model 'resnet'"):
            models.build("resnet", tf.zeros([1, 8, 8, 1]), 10, (8,))


def test_dense_shapes():
    with tf.Graph().as_default():
        y = models.dense(tf.zeros([5, 7]), 3, "d", seed=0)
        assert y.shape.as_list() == [5, 3]
        assert np.prod(v1.trainable_variables()[0].shape) == 21
