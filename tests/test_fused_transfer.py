"""The fused transfer for a model_fn (`lowlevel.modes.fused_transfer`): a graph rewired to
read its small variables in one tensor per ps and push their gradients in one computes
what the classic graph computes, step after step, with fewer tensors crossing tasks; reads
that must stay (inside a `tf.cond`) stay; the benchmark's model_fn built for a 2-ps
cluster moves one read and one gradient tensor per ps for its small variables."""

import numpy as np
import one_process
import pytest
import tensorflow as tf

from lowlevel.cluster.spec import Cluster, Task
from lowlevel.config import TrainConfig
from lowlevel.models.model_fn_model import ModelFnModel
from lowlevel.modes import exact, fused_transfer
from lowlevel.runtime import graph as graph_lib
from lowlevel.runtime import trainables

v1 = tf.compat.v1
PS = ("/job:ps/task:0/device:CPU:0", "/job:ps/task:1/device:CPU:0")
WORKER = "/job:worker/task:0/device:CPU:0"


FUNCTIONS = ("If", "StatelessIf", "While", "StatelessWhile", "PartitionedCall",
             "StatefulPartitionedCall")


def _task_of(op):
    """(job, task) an op runs on: a resource's for an op taking one (TF's placer puts it
    there; not a function call's), else its own device's; None if it names none."""
    if op.type not in FUNCTIONS:
        for t in op.inputs:
            if t.dtype == tf.resource:
                return _task_of(t.op)
    if not op.device:
        return None
    spec = tf.DeviceSpec.from_string(op.device)
    return spec.job, spec.task


def crossings(graph) -> int:
    """Distinct tensors consumed on another task than the one that produced them (each is
    one RecvTensor per step when its consumer runs)."""
    out = set()
    for op in graph.get_operations():
        for t in op.inputs:
            a, b = _task_of(t.op), _task_of(op)
            if a and b and a != b:
                out.add(t.name)
    return len(out)


def _model(x, y):
    """Two small dense layers on two ps (get_variable and tf.Variable), and a read inside
    a tf.cond, which must keep its classic read."""
    with tf.device(PS[0]):
        w0 = v1.get_variable("w0", [6, 8], initializer=v1.glorot_uniform_initializer(seed=1))
        b0 = v1.Variable(tf.fill([8], 0.1), name="b0")
        scale = v1.get_variable("scale", [], initializer=v1.ones_initializer())
    with tf.device(PS[1]):
        w1 = v1.get_variable("w1", [8, 3], initializer=v1.glorot_uniform_initializer(seed=2))
        b1 = v1.get_variable("b1", [3], initializer=v1.zeros_initializer())
    with tf.device(WORKER):
        h = tf.nn.relu(tf.matmul(x, w0) + b0)
        h = tf.cond(tf.reduce_sum(x) > 0, lambda: h * scale.read_value(), lambda: h)
        logits = tf.matmul(h, w1) + b1
        return tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))


def _graph(fused: bool):
    graph = tf.Graph()
    rng = np.random.default_rng(0)
    with graph.as_default():
        x = tf.constant(rng.normal(size=(16, 6)).astype(np.float32))
        y = tf.constant(rng.integers(0, 3, 16))
        loss = tf.identity(_model(x, y), name="loss")
        opt = v1.train.AdagradOptimizer(0.5)
        with tf.device(WORKER):
            grads = opt.compute_gradients(loss)
            if fused:
                grads = fused_transfer.fuse_gradients(grads, WORKER)
        train = opt.apply_gradients(grads, name="train")
        moved = (fused_transfer.fuse_reads(graph, v1.global_variables(), WORKER)
                 if fused else [])
        init = v1.global_variables_initializer()
    return graph, train, init, sorted(v.op.name for v in moved)


def _run(graph, train, init, steps=4):
    """Losses and final variables of `steps` steps, the graph's devices cleared (one
    process): the rewired graph as it is, minus where it runs."""
    with one_process.session_without_devices(graph) as sess:
        sess.run(init.name)
        losses = [sess.run(["loss:0", train.name])[0] for _ in range(steps)]
        values = sess.run([f"{n}/Read/ReadVariableOp:0" for n in ("w0", "b0", "w1", "b1")])
    return losses, values


@pytest.mark.timeout(60)
def test_a_rewired_graph_trains_as_the_classic_one_with_fewer_crossings():
    classic, fused = _graph(False), _graph(True)
    assert fused[3] == ["b0", "b1", "w0", "w1"]  # scale: read only inside the tf.cond
    losses_a, values_a = _run(*classic[:3])
    losses_b, values_b = _run(*fused[:3])
    np.testing.assert_allclose(losses_b, losses_a, rtol=1e-6)
    assert losses_a[-1] < losses_a[0]  # it trains: the comparison is of real updates
    for a, b in zip(values_a, values_b):
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-7)
    # classic: 5 reads (one of them twice: forward and backward use the same read) and 4
    # gradients, plus the cond's read; fused: one read and one gradient tensor per ps
    assert crossings(fused[0]) <= crossings(classic[0]) - 4, (
        crossings(fused[0]), crossings(classic[0]))


def _crossing_names(graph, source: str, sink: str) -> set:
    """Names of the tensors made on a `source` job's task and consumed on a `sink` job's."""
    out = set()
    for op in graph.get_operations():
        for t in op.inputs:
            a, b = _task_of(t.op), _task_of(op)
            if a and b and a[0] == source and b[0] == sink:
                out.add(t.name)
    return out


def _benchmark_model(tmp_path) -> ModelFnModel:
    from benchmarks import estimator_model
    params = {"hidden_units": [512, 512], "learning_rate": 0.1, "batch_size": 32}
    return ModelFnModel(estimator_model.model_fn, params, None, str(tmp_path),
                        input_fn=estimator_model.input_fn)


@pytest.mark.timeout(120)
def test_a_model_fn_on_two_ps_moves_one_small_read_and_one_gradient_per_ps(tmp_path):
    cluster = Cluster(("ps0:1", "ps1:1"), ("w0:1", "w1:1"))
    config = TrainConfig(train_steps=10, output_dir=str(tmp_path))
    train = graph_lib.build(config, trainables.ModelFn(_benchmark_model(tmp_path)), cluster,
                            Task("worker", 0))
    graph = train.graph
    small = {v.op.name: v for v in graph.get_collection(v1.GraphKeys.TRAINABLE_VARIABLES)
             if v.shape.num_elements() * 4 < exact.SMALL_BYTES}
    assert len(small) >= 4, small  # the biases and the last kernel
    for name, v in small.items():
        reads = [op for op in graph.get_operations()
                 if op.type == "ReadVariableOp" and op.inputs[0].op is v.handle.op]
        remote = [c for r in reads for c in r.outputs[0].consumers()
                  if _task_of(c) != _task_of(r)]
        assert not remote, (name, remote)  # only the fused read on its ps reads it
    worker_to_ps, ps_to_worker = _crossing_names(graph, "worker", "ps"), \
        _crossing_names(graph, "ps", "worker")
    large = len(graph.get_collection(v1.GraphKeys.TRAINABLE_VARIABLES)) - len(small)
    num_ps = 2
    # reads: the large kernels one each, the small ones one per ps, the step's number
    assert len(ps_to_worker) <= large + num_ps + 1, sorted(ps_to_worker)
    assert len(worker_to_ps) <= large + num_ps + 2, sorted(worker_to_ps)
