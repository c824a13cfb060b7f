"""Towers (`lowlevel.modes.towers`): a worker's step replicated over its devices.

On logical CPU devices of a real server (the stand-in for GPUs here): two towers of B
examples train step for step as one device on 2B; every parameter crosses from the
ps once a step and its gradient goes back once, whatever the towers; the tower devices
for real GPUs, checked as placement strings; and across a launcher's cluster (async and
sync), the run ends at the exact step and its checkpoints resume with one tower."""

import json
import sys

import numpy as np
import pytest
import tensorflow as tf

import clusters
from benchmarks import estimator_model
from lowlevel import errors
from lowlevel.models import input_fns
from lowlevel.models import spec as model_spec
from lowlevel.models.model_fn_model import ModelFnModel
from lowlevel.cluster.spec import ClusterFlags, from_flags
from lowlevel.config import TrainConfig
from lowlevel.data import images as data_lib
from lowlevel.runtime import graph as graph_lib
from lowlevel.runtime import placement
from lowlevel.runtime import server as server_lib
from lowlevel.runtime import trainables

v1 = tf.compat.v1



def _servers(towers: int):
    """(cluster, worker task, worker server, its session config): a real ps and worker
    server in this process, the worker with `towers` CPU devices."""
    ps, worker = f"127.0.0.1:{clusters.free_port()}", f"127.0.0.1:{clusters.free_port()}"
    cluster, task = from_flags(ClusterFlags(ps, worker, "worker", 0))
    spec = v1.train.ClusterSpec(cluster.as_dict())
    v1.train.Server(spec, "ps", 0, config=server_lib.session_config(
        cluster, cluster.task("ps", 0)), start=True)
    config = server_lib.session_config(cluster, task, cpu_devices=towers)
    return cluster, task, v1.train.Server(spec, "worker", 0, config=config, start=True), config


def _train(towers: int, batch_size: int, steps: int = 8):
    """(losses, {variable: value}, [(send task, recv task, tensor)] of one more step)."""
    cluster, task, server, session_config = _servers(towers)
    config = TrainConfig(hidden_units=(512, 64), batch_size=batch_size, towers=towers,
                         ps_products=False, train_steps=1000)
    g = graph_lib.build(config, trainables.Builtin(config, data_lib.load_digits()), cluster, task, 0)
    return _run_graph(g, server, session_config, steps)


def _run_graph(g, server, session_config, steps: int):
    """(losses, {variable: value}, the Recvs and tower MatMul devices of one more step)."""
    with g.graph.as_default(), v1.Session(server.target, config=session_config) as sess:
        sess.run(v1.global_variables_initializer())
        sess.run(g.scaffold.local_init_op, feed_dict=g.scaffold.local_init_feed_dict)
        for hook in g.hooks:  # a model_fn's input: its iterator's initializer
            if isinstance(hook, input_fns.DatasetInitializerHook):
                hook.begin()
                hook.after_create_session(sess, None)
        losses = [sess.run([g.train_op, g.loss])[1] for _ in range(steps)]
        metadata = v1.RunMetadata()
        sess.run(g.train_op, options=v1.RunOptions(output_partition_graphs=True),
                 run_metadata=metadata)
        values = {v.op.name: sess.run(v) for v in v1.trainable_variables()}
    recvs = [(n.attr["send_device"].s.decode(), n.attr["recv_device"].s.decode(),
              n.attr["tensor_name"].s.decode())
             for pg in metadata.partition_graphs for n in pg.node if n.op == "_Recv"]
    devices = {n.device.rsplit("/", 1)[1] for pg in metadata.partition_graphs
               for n in pg.node if "MatMul" in n.op}
    return losses, values, recvs, devices


def _model_fn_run(towers: int, model_fn, tmp_path, steps: int = 6):
    cluster, task, server, session_config = _servers(towers)
    params = {"hidden_units": [512, 64], "learning_rate": 0.1, "batch_size": 64}
    model = ModelFnModel(model_fn, params, None, str(tmp_path / f"m{towers}"),
                         input_fn=estimator_model.input_fn)
    # one device without the products on the ps, as towers are (a tower's product on the ps
    # would send its inputs there once per tower): the same crossings to compare
    config = TrainConfig(towers=towers, train_steps=1000, ps_products=False)
    g = graph_lib.build(config, trainables.ModelFn(model), cluster, task)
    return _run_graph(g, server, session_config, steps)


@pytest.mark.timeout(120)
def test_a_model_fn_in_two_towers_trains_as_one_device_with_one_crossing_each(tmp_path):
    one = _model_fn_run(1, estimator_model.model_fn, tmp_path)
    two = _model_fn_run(2, estimator_model.model_fn, tmp_path)
    np.testing.assert_allclose(two[0], one[0], rtol=1e-5)
    assert one[0][-1] < one[0][0]
    assert one[1].keys() == two[1].keys()  # the same checkpoint names
    for name in one[1]:
        np.testing.assert_allclose(two[1][name], one[1][name], rtol=1e-4, atol=1e-6)
    assert {"device:CPU:0", "device:CPU:1"} <= two[3]
    # two large kernels and one fused read of the rest, the step; back: 2 + 1
    assert len(_between(two[2], "ps", "worker")) == len(_between(one[2], "ps", "worker")) == 4
    assert len(_between(two[2], "worker", "ps")) == len(_between(one[2], "worker", "ps")) == 3


def _keras_model_fn(features, labels, mode, params):
    """Its variables are tf.Variables: a second tower would train a second model."""
    w = v1.Variable(tf.zeros([784, 10]), name="w")
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=labels, logits=tf.matmul(features["images"], w)))
    train_op = v1.train.GradientDescentOptimizer(0.1).minimize(
        loss, global_step=v1.train.get_global_step())
    return model_spec.EstimatorSpec(mode, loss=loss, train_op=train_op)


def test_a_model_fn_whose_towers_would_not_share_variables_is_refused(tmp_path):
    with pytest.raises(errors.ModelFnError, match=r"--towers=2: model_fn .*_keras_model_fn "
                       r"made new variables for its other towers \(tower_1/w\)"):
        _model_fn_run(2, _keras_model_fn, tmp_path)


def _between(recvs, src: str, dst: str) -> list:
    return [r for r in recvs if f"/job:{src}/" in r[0] and f"/job:{dst}/" in r[1]]


@pytest.mark.timeout(120)
def test_two_towers_train_as_one_device_on_the_whole_batch_with_one_crossing_each():
    one = _train(towers=1, batch_size=64)
    two = _train(towers=2, batch_size=32)
    np.testing.assert_allclose(two[0], one[0], rtol=1e-5)
    assert one[0][-1] < one[0][0]  # it trains
    assert one[1].keys() == two[1].keys()
    for name in one[1]:
        np.testing.assert_allclose(two[1][name], one[1][name], rtol=1e-4, atol=1e-6)
    # the towers compute on both logical devices...
    assert {"device:CPU:0", "device:CPU:1"} <= two[3]
    # ...and cross to the ps no more than one device does: the two 32,768-float kernels,
    # one fused read of the small variables, the step's number; back: the kernels' summed
    # gradients and the small ones' in one tensor
    assert len(_between(two[2], "ps", "worker")) == len(_between(one[2], "ps", "worker")) == 4
    assert len(_between(two[2], "worker", "ps")) == len(_between(one[2], "worker", "ps")) == 3


def test_tower_devices_for_gpus_and_cpus():
    assert placement.tower_devices(1, 4, 2) == (
        "/job:worker/task:1/device:CPU:0",
        ["/job:worker/task:1/device:GPU:2", "/job:worker/task:1/device:GPU:3"])
    assert placement.tower_devices(0, 2, 2, "chief")[1] == [
        "/job:chief/task:0/device:GPU:0", "/job:chief/task:0/device:GPU:1"]
    assert placement.tower_devices(3, 2, 1) == ("/job:worker/task:3/device:GPU:1",
                                                ["/job:worker/task:3/device:GPU:1"])
    assert placement.tower_devices(0, 0, 3)[1] == [f"/job:worker/task:0/device:CPU:{i}"
                                                   for i in range(3)]
    # the default (0): a machine's GPUs shared among its training tasks; 1 on a CPU
    assert [placement.towers(0, 4, n) for n in (1, 2, 4, 8)] == [4, 2, 1, 1]
    assert placement.towers(0, 0, 1) == 1 and placement.towers(3, 0, 1) == 3


def test_gpu_towers_place_each_replica_on_its_gpu_and_variables_on_the_ps():
    cluster, task = from_flags(ClusterFlags("127.0.0.1:1000", "127.0.0.1:2000", "worker", 0))
    config = TrainConfig(hidden_units=(32,), towers=0)
    g = graph_lib.build(config, trainables.Builtin(config, data_lib.load_digits()),
                        cluster, task, 2)  # one worker on its machine, 2 GPUs: 2 towers
    matmuls = {op.device for op in g.graph.get_operations() if op.type == "MatMul"}
    assert {"/job:worker/task:0/device:GPU:0", "/job:worker/task:0/device:GPU:1"} <= matmuls
    assert {op.device for op in g.graph.get_operations() if op.type == "VarHandleOp"} == {
        "/job:ps/task:0/device:CPU:0"}


def test_a_model_fn_gets_towers_on_gpus_only_when_asked(tmp_path):
    """The default gives a model_fn one device (GPU task mod worker_gpu), whatever the GPUs:
    a model_fn that cannot share its variables must still run; --towers=2 splits it."""
    cluster, task = from_flags(ClusterFlags("127.0.0.1:1000", "127.0.0.1:2000", "worker", 0))
    params = {"hidden_units": [32], "batch_size": 64}
    devices = {}
    for towers in (0, 2):
        model = ModelFnModel(estimator_model.model_fn, params, None, str(tmp_path),
                             input_fn=estimator_model.input_fn)
        g = graph_lib.build(TrainConfig(towers=towers), trainables.ModelFn(model), cluster, task,
                            worker_gpu=2)
        devices[towers] = {op.device for op in g.graph.get_operations() if op.type == "MatMul"}
    assert devices[0] == {"/job:worker/task:0/device:GPU:0"}
    assert devices[2] == {"/job:worker/task:0/device:GPU:0", "/job:worker/task:0/device:GPU:1"}


LAUNCH = [sys.executable, "-m", "lowlevel.launch", "--num_ps=1", "--num_workers=2",
          "--no_isolation", "--hidden_units=64"]


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_towers_on_a_cluster_sync_then_resumed_async_with_one_tower_and_a_model_fn(tmp_path):
    out = tmp_path / "out"
    result = clusters.run(LAUNCH + ["--towers=2", "--sync", "--train_steps=120",
                                    f"--output_dir={out}"], timeout=150)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "2 towers on /job:worker/task:1/device:CPU:0, /job:worker/task:1/device:CPU:1" \
        in result.stdout + result.stderr
    metrics = json.loads((out / "final_metrics.json").read_text())
    assert metrics["global_step"] == 120 and metrics["accuracy"] > 0.8, metrics
    # the checkpoint is the same model: one tower per worker (the default) resumes it
    result = clusters.run(LAUNCH + ["--train_steps=200", f"--output_dir={out}"], timeout=150)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    metrics = json.loads((out / "final_metrics.json").read_text())
    assert metrics["global_step"] == 200 and metrics["start_global_step"] == 120, metrics
    assert "towers on" not in result.stdout + result.stderr
    assert not clusters.leftovers(out)
    # a model_fn, sync: its input_fn's batch split between two towers
    params = json.dumps({"hidden_units": [64], "batch_size": 64})
    out = tmp_path / "model_fn"
    result = clusters.run(LAUNCH[:-1] + [
        "--towers=2", "--sync", "--train_steps=60", f"--output_dir={out}",
        f"--model={estimator_model.__name__}:model_fn",
        f"--input_fn={estimator_model.__name__}:input_fn", f"--params={params}"], timeout=150)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "the batch split among them" in result.stdout + result.stderr
    assert json.loads((out / "final_metrics.json").read_text())["global_step"] == 60
    assert not clusters.leftovers(out)


def test_towers_with_the_communication_reduced_mode_is_a_usage_error(tmp_path):
    result = clusters.run(LAUNCH + ["--towers=2", "--communication_period=4",
                                    f"--output_dir={tmp_path}"], timeout=60)
    assert result.returncode == 2 and "--towers=2 --communication_period=4" in result.stderr
    assert "Traceback" not in result.stderr
