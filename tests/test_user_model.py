"""A user's model_fn on the command line (`--model=package.module:function`), run by lowlevel's
runtime as a built-in model is: in one process, on a launcher's cluster with an evaluator,
with `--sync`, and with the model_fn's own `SyncReplicasOptimizer`. The model is
tests/user_models/digits.py, written as TF1 Estimator code."""

import json
import sys

import pytest
import tensorflow as tf

import clusters

pytestmark = pytest.mark.cluster
MODEL = ["--model=tests.user_models.digits:model_fn",
         "--input_fn=tests.user_models.digits:input_fn"]


def _run(module, out, *flags, timeout=240):
    result = clusters.run([sys.executable, "-m", module, f"--output_dir={out}", *MODEL, *flags],
                           timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def _final(out) -> dict:
    with open(out / "final_metrics.json") as f:
        return json.load(f)


@pytest.mark.timeout(180)
def test_in_process_the_model_fn_trains_and_the_chief_evaluates_it(tmp_path):
    out = tmp_path / "out"
    result = _run("lowlevel.trainer", out, "--train_steps=400", '--params={"hidden_units": [32]}')
    metrics = json.loads(result.stdout.strip().splitlines()[-1])
    assert metrics == _final(out)
    assert metrics["global_step"] == 400 and metrics["model"] == MODEL[0].split("=")[1]
    assert metrics["accuracy"] > 0.9  # its own eval_metric_ops, on its eval input
    assert tf.train.load_checkpoint(str(out)).get_tensor("hidden0/kernel").shape == (64, 32)
    # its batch from the input's static leading dimension (drop_remainder), as the built-ins'
    assert metrics["batch_size"] == 64 and metrics["train_examples_per_sec"] > 0


@pytest.mark.timeout(300)
def test_on_a_cluster_async_it_ends_at_exactly_the_last_step_and_the_evaluator_follows(tmp_path):
    out = tmp_path / "out"
    _run("lowlevel.launch", out, "--train_steps=1500", "--save_checkpoint_steps=500",
         "--evaluator")
    assert _final(out)["global_step"] == 1500
    assert tf.train.load_checkpoint(str(out)).get_tensor("global_step") == 1500  # no overshoot
    with open(out / "eval" / "eval_metrics.json") as f:
        records = json.load(f)
    assert records[-1]["global_step"] == 1500 and records[-1]["accuracy"] > 0.9
    assert clusters.leftovers(out) == []


@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", ["--sync", "own"])
def test_sync_training_of_a_model_fn_ends_at_the_last_step(tmp_path, how):
    """`--sync` wraps the model's optimizer; "own": the model_fn wraps it in
    SyncReplicasOptimizer itself and returns its hook, which the runtime replaces with one
    that stops at the last step (TF's hangs there, tensorflow/tensorflow#7970)."""
    out = tmp_path / "out"
    flags = (["--sync"] if how == "--sync" else
             ['--params={"sync": true, "workers": 2}'])
    _run("lowlevel.launch", out, "--train_steps=600", *flags)
    metrics = _final(out)
    assert metrics["global_step"] == 600
    assert metrics["sync"] is (how == "--sync")
    assert metrics["accuracy"] > 0.85


@pytest.mark.timeout(300)
@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
def test_a_model_fn_trains_in_the_communication_reduced_mode(tmp_path, sync):
    """`--communication_period=8`: the model_fn built with worker-local copies, its
    optimizer's steps taken locally and exchanged every 8 (async local SGD, or with
    `--sync` model averaging), ending at exactly the last step."""
    out = tmp_path / "out"
    result = _run("lowlevel.launch", out, "--train_steps=1600", "--communication_period=8",
                  *(["--sync"] if sync else []))
    metrics = _final(out)
    assert metrics["global_step"] == 1600 and metrics["sync"] is sync
    assert metrics["accuracy"] > 0.9, metrics
    assert tf.train.load_checkpoint(str(out)).get_tensor("global_step") == 1600
    # local steps, not exact ones: the chief took a share of them, counted as local
    assert "local steps" in result.stdout + result.stderr
    assert clusters.leftovers(out) == []


@pytest.mark.timeout(180)
def test_the_communication_reduced_mode_refuses_a_model_fn_with_its_own_sync_optimizer(
        tmp_path):
    out = tmp_path / "out"
    result = clusters.run([sys.executable, "-m", "lowlevel.launch", f"--output_dir={out}",
                           *MODEL, "--train_steps=100", "--communication_period=8",
                           '--params={"sync": true, "workers": 2}'], timeout=150)
    text = result.stdout + result.stderr
    assert result.returncode == 1, text[-3000:]
    assert ("--communication_period > 1: model_fn tests.user_models.digits:model_fn did not "
            "apply its gradients once") in text and "--communication_period=1" in text
    assert clusters.leftovers(out) == []
