"""The optimizers, in one process: lazy Adam's sparse rows against the formula, its dense
path and checkpoint names against TF1's Adam."""

import numpy as np
import pytest
import tensorflow as tf

from lowlevel.models.optimizers import LazyAdamOptimizer, make_optimizer

v1 = tf.compat.v1
LR, BETA1, BETA2, EPS = 0.01, 0.9, 0.999, 1e-8


def _adam_rows(value, grads):
    """numpy reference: lazy Adam over steps of {row: gradient row}; returns the table."""
    value = value.copy()
    m, v = np.zeros_like(value), np.zeros_like(value)
    for t, step in enumerate(grads, start=1):
        lr = LR * np.sqrt(1 - BETA2 ** t) / (1 - BETA1 ** t)
        for i, g in step.items():
            m[i] = BETA1 * m[i] + (1 - BETA1) * g
            v[i] = BETA2 * v[i] + (1 - BETA2) * g * g
            value[i] -= lr * m[i] / (np.sqrt(v[i]) + EPS)
    return value


@pytest.mark.parametrize("resource", [True, False])
def test_lazy_adam_moves_only_the_rows_of_the_batch_by_adams_formula(resource):
    rng = np.random.default_rng(0)
    start = rng.normal(size=(6, 3)).astype(np.float32)
    # step 1 touches rows 1 and 4, step 2 rows 4 (twice: summed) and 0
    g1 = rng.normal(size=(2, 3)).astype(np.float32)
    g2 = rng.normal(size=(3, 3)).astype(np.float32)
    with tf.Graph().as_default():
        table = v1.get_variable("table", initializer=start, use_resource=resource)
        opt = LazyAdamOptimizer(LR)
        updates = [opt.apply_gradients([(tf.IndexedSlices(tf.constant(g), tf.constant(i)),
                                         table)])
                   for g, i in ((g1, [1, 4]), (g2, [4, 0, 4]))]
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            for update in updates:
                sess.run(update)
            got = sess.run(table)
    want = _adam_rows(start, [{1: g1[0], 4: g1[1]}, {4: g2[0] + g2[2], 0: g2[1]}])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got[[2, 3, 5]], start[[2, 3, 5]])  # untouched rows stay


def test_lazy_adam_is_adam_on_dense_gradients_and_saves_adams_names():
    rng = np.random.default_rng(1)
    start = rng.normal(size=(4, 2)).astype(np.float32)
    grads = [rng.normal(size=(4, 2)).astype(np.float32) for _ in range(3)]
    results, names = [], []
    for make in (LazyAdamOptimizer, v1.train.AdamOptimizer):
        with tf.Graph().as_default():
            w = v1.get_variable("w", initializer=start)
            g = v1.placeholder(tf.float32, [4, 2])
            update = make(LR).apply_gradients([(g, w)])
            with v1.Session() as sess:
                sess.run(v1.global_variables_initializer())
                for grad in grads:
                    sess.run(update, {g: grad})
                results.append(sess.run(w))
            names.append(sorted(v.op.name for v in v1.global_variables()))
    np.testing.assert_allclose(results[0], results[1], rtol=1e-6)
    assert names[0] == names[1] and "w/Adam_1" in names[0] and "beta2_power" in names[0]


def test_make_optimizer_names_each_choice():
    assert isinstance(make_optimizer("adam", LR), LazyAdamOptimizer)
    assert isinstance(make_optimizer("adagrad", LR), v1.train.AdagradOptimizer)
    with pytest.raises(ValueError, match="adamw"):
        make_optimizer("adamw", LR)
