"""Dense layers' products on the ps (`lowlevel.modes.ps_products`): the cost model, where the
exact graph puts each product (the built-in MLP's and a model_fn's), and a real 1 ps + 1
worker cluster training the same model (built-in, then model_fn) with them as without them. (The bytes they save are measured on the wire by
tests/test_throughput.py against `mlp_step_floats`.)"""

import os
import sys

import clusters
import numpy as np
import pytest
import tensorflow as tf

from lowlevel.data import catalogue
from lowlevel.runtime import graph as graph_lib
from lowlevel.models import catalogue as models
from lowlevel.modes import ps_products
from lowlevel.cluster.spec import Cluster, ClusterFlags, Task, from_flags
from lowlevel.config import TrainConfig
from lowlevel.models.model_fn_model import ModelFnModel
from lowlevel.runtime import trainables

v1 = tf.compat.v1
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PS = "/job:ps/task:0/device:CPU:0"


def test_cost_model_picks_the_fewest_floats():
    # 784 x 512 first layer, batch 128: forward (x there, y back, dy there) beats the
    # kernel's read and push (2 n m) and the weight gradient alone (n m + B (n + m))
    assert ps_products.choose(128, 784, 512, input_needs_gradient=False) == (
        ps_products.FORWARD, 128 * (784 + 2 * 512))
    # a hidden layer cannot compute forward on the ps (the worker needs W for dy @ W^T)
    assert ps_products.choose(128, 512, 512, True) == (
        ps_products.WEIGHT_GRADIENT, 512 * 512 + 128 * 1024)
    # ... and its input may be there already (a forward layer's output)
    assert ps_products.choose(128, 512, 512, True, input_on_ps=True)[1] == 512 * 512 + 128 * 512
    # narrow kernels and large batches stay classic
    assert ps_products.choose(128, 784, 10, False) == (ps_products.CLASSIC, 2 * 784 * 10)
    assert ps_products.choose(4096, 512, 512, True)[0] == ps_products.CLASSIC
    # the benchmark's MLP: 5.36 MB a step classic, 2.29 MB with the products on the ps
    classic = 2 * (784 * 512 + 512 * 512 + 512 * 10 + 512 + 512 + 10)
    floats = ps_products.mlp_step_floats([784, 512, 512, 10], 128, small_floats=16384)
    # (the first layer's bias stays on the ps; the others travel both ways)
    assert floats == 128 * (784 + 2 * 512) + 512 * 512 + 128 * 512 + 2 * 512 * 10 + 2 * 522
    assert floats * 4 == pytest.approx(2.281e6, rel=1e-3) and floats < 0.45 * classic


def _exact_graph(ps_products_on: bool, worker_gpu: int = 0, hidden=(512, 512), batch=128):
    cluster, task = from_flags(ClusterFlags("127.0.0.1:1000", "127.0.0.1:2000", "worker", 0))
    config = TrainConfig(model="mlp", dataset="synthetic", hidden_units=hidden,
                         batch_size=batch, ps_products=ps_products_on)
    data = catalogue.load_for(config)
    return graph_lib.build(config, trainables.Builtin(config, data), cluster, task,
                           worker_gpu).graph


def test_a_small_forward_layer_reads_its_kernel_and_bias_where_they_live():
    # 784 x 8 (25 KB, which the fused transfer would fuse): forward at batch 4 (B (n + 2m)
    # = 3.2 K floats < 2 n m = 12.5 K), so its kernel and bias are read on the ps, not fused
    # (a fused kernel would not be read where it lives, and the layer not be forward at all)
    forward = _exact_graph(True, hidden=(8,), batch=4)
    for name, variable in (("MatMul", "kernel"), ("BiasAdd", "bias")):
        op = _op(forward, f"model/hidden0/{name}")
        read = op.inputs[1].op
        assert op.device == PS and read.type == "ReadVariableOp", (name, read.type)
        assert read.inputs[0].op.name == f"model/hidden0/{variable}"
    # classic at batch 128 (B (n + 2m) = 102 K floats): on the worker, its variables fused
    classic = _exact_graph(True, hidden=(8,), batch=128)
    op = _op(classic, "model/hidden0/MatMul")
    assert op.device.startswith("/job:worker/task:0") and op.inputs[1].op.type != "ReadVariableOp"


def _op(graph, name):
    return graph.get_operation_by_name(name)


def _weight_gradient(graph, layer):
    """The MatMul that computes `layer`'s kernel gradient (its input's transpose times dy)."""
    ops = [op for op in graph.get_operations() if op.type == "MatMul" and
           op.name.startswith(f"gradients/model/{layer}/MatMul_grad/") and
           op.get_attr("transpose_a")]
    assert len(ops) == 1, [op.name for op in ops]
    return ops[0]


def test_the_exact_graph_computes_the_chosen_products_on_the_ps():
    graph = _exact_graph(True)
    # the first layer: forward, its bias and activation follow; its weight gradient too
    for name in ("model/hidden0/MatMul", "model/hidden0/BiasAdd", "model/hidden0/Relu"):
        assert _op(graph, name).device == PS, name
    assert _weight_gradient(graph, "hidden0").device == PS
    # nothing on the worker reads the first kernel in the step
    reads = [op for op in graph.get_operations() if op.type == "ReadVariableOp" and
             op.inputs[0].op.name == "model/hidden0/kernel"]
    users = [c for r in reads for c in r.outputs[0].consumers()
             if c.name.startswith("model/") or c.name.startswith("gradients/")]
    assert users and all(c.device == PS for c in users), [(c.name, c.device) for c in users]
    # ... nor its bias: not fused with the small variables, read and updated on the ps
    bias = _op(graph, "model/hidden0/BiasAdd").inputs[1].op
    assert bias.type == "ReadVariableOp" and bias.inputs[0].op.name == "model/hidden0/bias"
    assert _op(off := _exact_graph(False), "model/hidden0/BiasAdd").inputs[1].op.type != \
        "ReadVariableOp"  # without the products it travels fused, split on the worker
    # the second layer: forward on the worker, weight gradient on the ps
    assert _op(graph, "model/hidden1/MatMul").device.startswith("/job:worker/task:0")
    assert _weight_gradient(graph, "hidden1").device == PS
    # the last kernel (512 x 10, 20 KB) travels fused with the biases: classic
    assert _weight_gradient(graph, "logits").device.startswith("/job:worker/task:0")

    # --ps_products=false, or a GPU worker (a ps CPU would compute far slower): all on it
    for off, device in ((off, "/job:worker/task:0/device:CPU:0"),
                        (_exact_graph(True, worker_gpu=1), "/job:worker/task:0/device:GPU:0")):
        for layer in ("hidden0", "hidden1", "logits"):
            assert _op(off, f"model/{layer}/MatMul").device == device
            assert _weight_gradient(off, layer).device == device


def _train(out, *flags):
    argv = [sys.executable, "-m", "lowlevel.launch", "--num_ps=1", "--num_workers=1",
            "--no_isolation", "--model=mlp", "--dataset=synthetic", "--hidden_units=512,512",
            "--batch_size=128", "--train_steps=300", "--seed=3", "--save_checkpoint_steps=100",
            # One intra-op thread on the ps and the worker alike. By default the worker gets the
            # cores (2 here) and the ps 1, and Eigen's matmul (TensorFlow's CPU kernel without
            # oneDNN, e.g. on a CPU without AVX-512) rounds differently with 1 and 2 threads;
            # training amplifies that 1-ulp difference at step 1 to ~0.05 by step 300, with or
            # without the products on the ps (--ps_products=false alone, 1 vs 2 threads).
            "--intra_op_threads=1",
            f"--output_dir={out}", *flags]
    done = clusters.run(argv, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


@pytest.mark.cluster
def test_a_real_cluster_trains_the_same_model_with_the_products_on_the_ps(tmp_path):
    on_log = _train(tmp_path / "on")
    _train(tmp_path / "off", "--ps_products=false")
    assert "model/hidden0/MatMul: forward on /job:ps/task:0" in on_log
    assert "model/hidden1/MatMul: weight_gradient on /job:ps/task:0" in on_log
    _assert_the_same_checkpoints(tmp_path, 300, (
        "model/hidden0/kernel", "model/hidden1/kernel", "model/logits/kernel",
        "model/hidden0/bias"))


def _assert_the_same_checkpoints(tmp_path, steps: int, trained) -> None:
    """The final checkpoints in `on/` and `off/` hold the same variables, bitwise, at global
    step `steps`; each of `trained` moved by > 1e-3 since step 100."""
    on, off = (tf.train.load_checkpoint(str(tmp_path / d)) for d in ("on", "off"))
    assert on.get_tensor("global_step") == off.get_tensor("global_step") == steps
    first = tf.train.load_checkpoint(str(tmp_path / "on" / "model.ckpt-100"))
    names = on.get_variable_to_shape_map()
    assert set(names) == set(off.get_variable_to_shape_map())
    # the same ops on the same batches with the same thread count; only their device
    # differs: every variable (the Adagrad accumulators too) bitwise equal. A product
    # computed with stale or half-updated weights would not be.
    for name in sorted(names):
        np.testing.assert_array_equal(on.get_tensor(name), off.get_tensor(name), err_msg=name)
    for name in trained:  # ... and the steps between did train it
        assert np.abs(on.get_tensor(name) - first.get_tensor(name)).max() > 1e-3, name


def _model_fn_graph(tmp_path, ps_products_on: bool):
    """The benchmark's MLP as a model_fn (`benchmarks/estimator_model.py`), built by the
    model_fn path for worker 0 of 1 ps + 1 worker."""
    from benchmarks import estimator_model
    model = ModelFnModel(estimator_model.model_fn, {"hidden_units": [512, 512],
                                                    "batch_size": 128},
                         None, str(tmp_path), input_fn=estimator_model.input_fn)
    cluster = Cluster(("127.0.0.1:1000",), ("127.0.0.1:2000",))
    config = TrainConfig(train_steps=10, ps_products=ps_products_on)
    return graph_lib.build(config, trainables.ModelFn(model), cluster, Task("worker", 0)).graph


def _model_fn_weight_gradient(graph, matmul: str):
    ops = [op for op in graph.get_operations() if op.type == "MatMul" and
           op.name.startswith(f"gradients/{matmul}_grad/") and op.get_attr("transpose_a")]
    assert len(ops) == 1, [op.name for op in ops]
    return ops[0]


def test_a_model_fn_gets_the_products_on_the_ps_as_the_built_in_models_do(tmp_path):
    graph = _model_fn_graph(tmp_path, True)
    worker = "/job:worker/task:0/device:CPU:0"
    # the first layer (hid0, 784 x 512 at batch 128): forward, its bias and ReLU follow
    for name in ("MatMul", "BiasAdd", "Relu"):
        assert _op(graph, name).device == PS, name
    assert _model_fn_weight_gradient(graph, "MatMul").device == PS
    # nothing on the worker reads the first kernel: the model_fn's step never moves it
    reads = [op for op in graph.get_operations() if op.type == "ReadVariableOp" and
             op.inputs[0].op.name == "hid0_w"]
    users = [c for r in reads for c in r.outputs[0].consumers()]
    assert users and all(c.device == PS for c in users), [(c.name, c.device) for c in users]
    # the second layer: forward on the worker, weight gradient on the ps; the last classic
    assert _op(graph, "MatMul_1").device == worker
    assert _model_fn_weight_gradient(graph, "MatMul_1").device == PS
    assert _model_fn_weight_gradient(graph, "MatMul_2").device == worker
    # --ps_products=false: every product on the worker
    off = _model_fn_graph(tmp_path, False)
    for matmul in ("MatMul", "MatMul_1", "MatMul_2"):
        assert _op(off, matmul).device == worker
        assert _model_fn_weight_gradient(off, matmul).device == worker


def _train_model_fn(out, *flags):
    argv = [sys.executable, "-m", "lowlevel.launch", "--num_ps=1", "--num_workers=1",
            "--no_isolation", "--model=benchmarks.estimator_model:model_fn",
            "--input_fn=benchmarks.estimator_model:input_fn",
            '--params={"hidden_units": [512, 512], "batch_size": 128}', "--train_steps=200",
            "--save_checkpoint_steps=100", "--intra_op_threads=1",  # as `_train`'s
            f"--output_dir={out}", *flags]
    done = clusters.run(argv, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout + done.stderr


@pytest.mark.cluster
def test_a_real_cluster_trains_the_same_model_fn_with_the_products_on_the_ps(tmp_path):
    on_log = _train_model_fn(tmp_path / "on")
    off_log = _train_model_fn(tmp_path / "off", "--ps_products=false")
    assert "MatMul: forward on /job:ps/task:0" in on_log
    assert "MatMul_1: weight_gradient on /job:ps/task:0" in on_log
    assert "forward on" not in off_log and "weight_gradient on" not in off_log
    # the model_fn's own ops on the same batches; only their devices differ
    _assert_the_same_checkpoints(tmp_path, 200, ("hid0_w", "hid0_b", "hid1_w", "sm_w"))
