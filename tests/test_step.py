"""The one training step of every model (`lowlevel.runtime.step`) in the communication-reduced
mode, built for a cluster and run in one process: a model_fn's own gradients (transformed
as it likes) drive the local steps, and a variable the mode cannot copy is refused."""

import numpy as np
import one_process
import pytest
import tensorflow as tf

from lowlevel import errors
from lowlevel.cluster.spec import ClusterFlags, from_flags
from lowlevel.config import TrainConfig
from lowlevel.models.model_fn_model import ModelFnModel
from lowlevel.models.spec import EstimatorSpec
from lowlevel.runtime import step as step_lib

v1 = tf.compat.v1
WORKER = "/job:worker/task:0/device:CPU:0"
CLIP = 1e-3


def _model_fn(features, labels, mode, params):
    """w [2] from 0 towards 3 (loss sum((w - 3)^2)), gradients clipped to norm `CLIP`;
    params["tf_variable"]: w made by tf.compat.v1.Variable instead of get_variable."""
    if params.get("tf_variable"):
        w = v1.Variable([0.0, 0.0], name="w")
    else:
        w = v1.get_variable("w", initializer=tf.constant([0.0, 0.0]))
    loss = tf.reduce_sum(tf.square(w - 3.0)) + 0.0 * tf.reduce_sum(features)
    if params.get("second_optimizer"):  # v by an optimizer without the global step
        v = v1.get_variable("v", initializer=tf.constant(1.0))
        loss += tf.square(v)
        other = v1.train.AdagradOptimizer(0.1).minimize(loss, var_list=[v])
    opt = v1.train.GradientDescentOptimizer(1.0)
    grads, variables = zip(*opt.compute_gradients(loss))
    clipped, _ = tf.clip_by_global_norm(grads, CLIP)
    train_op = opt.apply_gradients(zip(clipped, variables),
                                   global_step=v1.train.get_global_step())
    if params.get("second_optimizer"):
        train_op = tf.group(train_op, other)
    return EstimatorSpec(mode, loss=loss, train_op=train_op)


def _build(params):
    cluster, _ = from_flags(ClusterFlags("127.0.0.1:1000", "127.0.0.1:2000", "worker", 0))
    config = TrainConfig(communication_period=8, train_steps=100)
    model = ModelFnModel(_model_fn, params, run_config=None, model_dir="")
    graph = tf.Graph()
    with graph.as_default():
        with v1.device(v1.train.replica_device_setter(ps_tasks=1, worker_device=WORKER)):
            global_step = v1.train.get_or_create_global_step()
            made = step_lib.build(config, model, tf.zeros([4, 1]), tf.zeros([4]), global_step,
                                  WORKER, [WORKER], cluster)
        init = [v1.global_variables_initializer(), v1.local_variables_initializer()]
    return graph, made, init


def test_a_local_step_applies_the_model_fns_own_clipped_gradients():
    graph, made, init = _build({})
    ops = made.local_ops
    assert ops is not None and made.value is None  # the local ops run, not a step value
    with graph.as_default():
        copy, = [v.read_value() for v in v1.local_variables() if v.op.name == "w/local"]
    with one_process.session_without_devices(graph) as sess:
        sess.run(init[0].name)
        sess.run(init[1].name)
        for _ in range(3):
            sess.run(ops.local_step.name)
        w = sess.run(copy.name)
    # the raw gradient, -6 per coordinate at w = 0, would have put w at 3 in one step
    np.testing.assert_allclose(w, np.full(2, 3 * CLIP / np.sqrt(2)), rtol=1e-5)


def test_a_variable_without_get_variable_is_refused():
    with pytest.raises(errors.ModelFnError, match=r"--communication_period > 1: model_fn "
                       r".*_model_fn has variables without a local copy: w: make them with "
                       r"tf.compat.v1.get_variable"):
        _build({"tf_variable": True})


def test_a_second_optimizer_without_the_global_step_is_refused():
    """Exact, its apply runs in the model's train_op; local steps never run that op, so the
    variables it trains would stay as they are: refused, not trained wrong."""
    with pytest.raises(errors.ModelFnError, match=r"did not apply its gradients once .* "
                       r"\(and no other apply: its variables would not be trained\)"):
        _build({"second_optimizer": True})
