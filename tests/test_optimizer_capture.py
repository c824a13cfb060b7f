"""A model_fn's optimizer inside `optimizer_capture.capture`: how its gradients are built.

Its `minimize` builds the gradients ungated (as `tf.gradients` does) when every variable is
a resource variable, and gated (its default, GATE_OP) otherwise; with `colocate_gradients`
each gradient op sits beside its forward op. The values are those of the uncaptured
optimizer, bitwise.
"""

import numpy as np
import one_process
import pytest
import tensorflow as tf

from lowlevel.modes import optimizer_capture

v1 = tf.compat.v1
PS, WORKER = "/job:ps/task:0", "/job:worker/task:0"


def _build(capture: bool, use_resource: bool = True, colocate: bool = False):
    """A two-layer model, its first layer on the ps (as a forward layer of
    `ps_products` is); (graph, train op, loss, the variables' values, the initializer)."""
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(1)
        global_step = v1.train.get_or_create_global_step()
        x = tf.constant(np.random.default_rng(0).normal(size=(8, 5)).astype(np.float32))
        with tf.device(PS):
            w0 = v1.get_variable("w0", [5, 4], use_resource=use_resource)
            h = tf.nn.relu(tf.matmul(x, w0))
        with tf.device(WORKER):
            w1 = v1.get_variable("w1", [4, 1], use_resource=use_resource)
            loss = tf.reduce_mean(tf.square(tf.matmul(h, w1)))

        def update(opt, grads_and_vars):  # what the runtime's does, less the counting
            with tf.control_dependencies([opt.apply_gradients(grads_and_vars)]):
                return global_step.assign_add(1)

        opt = v1.train.GradientDescentOptimizer(0.1)
        if capture:
            with optimizer_capture.capture(global_step, update, None, colocate) as cap:
                train = opt.minimize(loss, global_step=global_step)
            assert cap.applies == 1
        else:
            train = opt.minimize(loss, global_step=global_step)
        init = v1.global_variables_initializer()
        values = [tf.identity(v, name=f"{v.op.name}_value") for v in (w0, w1)]
    return graph, train, loss, values, init


def _gates(graph) -> list:
    """The identities GATE_OP adds: each op's gradients grouped by `tf.tuple`."""
    return [op.name for op in graph.get_operations()
            if op.name.startswith("gradients/") and "/tuple/" in op.name]


def test_a_captured_optimizer_on_resource_variables_computes_ungated_gradients():
    assert _gates(_build(capture=False)[0])  # minimize's own default: GATE_OP
    assert not _gates(_build(capture=True)[0])
    # reference variables keep the gate: an update may change one in place under a read
    assert _gates(_build(capture=True, use_resource=False)[0])


def test_colocated_gradients_stay_beside_their_forward_ops():
    def relu_grad(graph):
        return next(op for op in graph.get_operations() if op.type == "ReluGrad")
    assert relu_grad(_build(capture=True)[0]).device == ""  # the caller's device scope
    colocated = relu_grad(_build(capture=True, colocate=True)[0])
    assert colocated.colocation_groups() == [b"loc:@Relu"] and colocated.device == PS


@pytest.mark.parametrize("use_resource", [True, False])
def test_the_captured_step_computes_what_the_optimizer_alone_does(use_resource):
    results = []
    for capture in (False, True):
        graph, train, loss, values, init = _build(capture, use_resource, colocate=capture)
        with one_process.session_without_devices(graph) as sess:
            sess.run(init.name)
            losses = [sess.run([loss.name, train.name])[0] for _ in range(3)]
            results.append((losses, sess.run([v.name for v in values])))
    np.testing.assert_array_equal(results[0][0], results[1][0])
    for a, b in zip(results[0][1], results[1][1]):
        np.testing.assert_array_equal(a, b)
    assert results[0][0][2] < results[0][0][0]
