"""make_tf_configs: every line it prints starts a working task of a real localhost cluster."""

import json
import shlex
import subprocess
import sys

import pytest

import clusters
from lowlevel.cluster.spec import Cluster
from lowlevel.cluster.tf_config import from_tf_config
from lowlevel.tf_configs import make_tasks


def _make(*args):
    return subprocess.run([sys.executable, "scripts/make_tf_configs.py", *args],
                          cwd=clusters.ROOT, env=clusters.ENV, capture_output=True, text=True,
                          timeout=60)


def test_json_lists_every_task_with_a_tf_config_the_trainer_accepts():
    cluster = Cluster(("h:4",), ("h:2", "h:3"), ("h:1",))
    tasks = make_tasks(cluster, sync=True, evaluator=True, output_dir="/d", extra=["--seed=3"])
    assert [(t["job"], t["task_index"]) for t in tasks] == [
        ("chief", 0), ("worker", 0), ("worker", 1), ("ps", 0), ("evaluator", 0)]
    for t in tasks:
        parsed_cluster, task = from_tf_config(json.dumps(t["tf_config"]))
        assert parsed_cluster == cluster and (task.job_name, task.task_index) == (
            t["job"], t["task_index"])
        assert "--sync" in t["flags"] and "--output_dir=/d" in t["flags"]
    assert tasks[3]["flags"][0] == "--schedule=run_std_server"
    assert tasks[4]["flags"][0] == "--schedule=continuous_eval"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("args,needle", [
    (["--workers=127.0.0.1:1", "--ps=127.0.0.1:1"], "given twice"),
    (["--workers=127.0.0.1:1"], "--ps: a cluster needs at least one ps"),
    (["--ps=127.0.0.1:1"], "--workers: a cluster needs at least one worker"),
    (["--workers=127.0.0.1", "--ps=127.0.0.1:1"], "--workers: '127.0.0.1' is not host:port"),
    (["--workers=127.0.0.1:2", "--ps=127.0.0.1:1", "--evaluator"], "needs --output_dir"),
    (["--workers=127.0.0.1:2", "--ps=127.0.0.1:1", "--", "--job_name=ps"], "drop it"),
    (["--workers=127.0.0.1:2", "--ps=127.0.0.1:1", "--", "--no_such_flag=1"],
     "after --: Unknown command line flag 'no_such_flag'"),
    (["--workers=127.0.0.1:2", "--ps=127.0.0.1:1", "--",
      "--model=tests.user_models.digits:model_fn"], "needs --input_fn=package.module:function"),
])
def test_bad_input_is_one_line_and_exit_2(args, needle):
    result = _make(*args)
    assert result.returncode == 2, result
    assert needle in result.stderr and "Traceback" not in result.stderr


def _run_lines(lines, tmp_path, timeout_secs):
    procs, logs = {}, {}
    for line in lines:
        env_assignment, *argv = shlex.split(line)
        key, _, tf_config = env_assignment.partition("=")
        assert key == "TF_CONFIG" and argv[:3] == ["python", "-m", "lowlevel.trainer"]
        task = json.loads(tf_config)["task"]
        name = f"{task['type']}{task['index']}"
        logs[name] = str(tmp_path / f"{name}.log")
        procs[name] = clusters.start([sys.executable, *argv[1:]], logs[name],
                                     env={"TF_CONFIG": tf_config})
    return clusters.wait_all(procs, timeout_secs), logs


LAYOUTS = {
    # tensor2tensor's sync layout: a single chief; here with 2 workers, 1 ps and an evaluator.
    "sync_chief": (["--chief={0}", "--workers={1},{2}", "--ps={3}", "--sync", "--evaluator"], 4),
    # its async layout: several workers (worker 0 the chief) and several ps tasks.
    "async_workers": (["--workers={0},{1},{2}", "--ps={3},{4}"], 5),
}


@pytest.mark.cluster
@pytest.mark.timeout(300)
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_every_printed_line_starts_a_working_cluster(ports, tmp_path, layout):
    template, num_ports = LAYOUTS[layout]
    addresses = [f"127.0.0.1:{p}" for p in ports(num_ports)]
    out = tmp_path / "out"
    made = _make(*[a.format(*addresses) for a in template], f"--output_dir={out}", "--",
                 "--train_steps=600", "--save_checkpoint_steps=200", "--log_every_secs=1")
    assert made.returncode == 0, made.stderr
    lines = made.stdout.strip().splitlines()
    assert len(lines) == 5
    statuses, logs = _run_lines(lines, tmp_path, timeout_secs=240)
    for name, (code, _) in statuses.items():
        assert code == 0, f"{name} exited {code}:\n{clusters.tail(logs[name])}"
    metrics = clusters.final_metrics(out)
    assert metrics["accuracy"] >= 0.9, metrics
    if layout == "sync_chief":
        assert metrics["global_step"] == 600 and metrics["sync"]
        assert (metrics["num_workers"], metrics["num_ps"]) == (3, 1)
        assert clusters.task_events(out, "chief0", "session_ready")
        final = clusters.eval_metrics(out)[-1]  # the evaluator saw the final checkpoint
        assert final["global_step"] == 600 and final["accuracy"] >= 0.9, final
        last_line = open(logs["evaluator0"]).read().strip().splitlines()[-1]
        assert json.loads(last_line) == final
    else:
        assert metrics["global_step"] == 600 and not metrics["sync"]
        assert (metrics["num_workers"], metrics["num_ps"]) == (3, 2)


USER_MODEL = ["--model=tests.user_models.digits:model_fn",
              "--input_fn=tests.user_models.digits:input_fn", '--params={"hidden_units": [32]}']


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fmt", ["tfjob", "k8s"])
def test_a_users_model_fn_reaches_every_training_pod_of_the_manifests(fmt):
    """The Kubernetes generator runs a user's model_fn as it runs a built-in model: its flags
    go to every pod's trainer command, the evaluator's too (the image must hold the code)."""
    import yaml
    result = _make(f"--format={fmt}", "--name=mine", "--image=registry.example/mine:1",
                   "--output_dir=/output", "--pvc=shared", "--evaluator", "--", *USER_MODEL)
    assert result.returncode == 0, result.stderr[-2000:]
    commands = []
    for doc in yaml.safe_load_all(result.stdout):
        specs = ([r["template"]["spec"] for r in doc["spec"]["tfReplicaSpecs"].values()]
                 if doc["kind"] == "TFJob" else
                 [doc["spec"]["template"]["spec"]] if doc["kind"] == "Job" else [])
        commands += [c.get("command", []) + c.get("args", []) for s in specs
                     for c in s["containers"]]
    assert len(commands) >= 3  # the training replicas, ps, evaluator
    for argv in commands:
        assert all(flag in argv for flag in USER_MODEL), argv
