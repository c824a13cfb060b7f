"""Real clusters on free loopback ports: ps tasks through pytest-xprocess, workers as
subprocesses. Every process must exit 0 by itself."""

import json
import os
import sys

import pytest
from xprocess import ProcessStarter

import clusters

pytestmark = pytest.mark.cluster  # every test here starts trainer processes

TRAIN_FLAGS = ["--train_steps=1500", "--batch_size=64", "--log_every_secs=1"]


def _start_ps(xprocess, name, argv, output_dir, task="ps0"):
    class Starter(ProcessStarter):
        args = argv

        def startup_check(self):  # the ps waits for the chief's stop signal
            return bool(clusters.task_events(output_dir, task, "serving"))

        timeout = 120
        env = clusters.ENV
        popen_kwargs = {"cwd": clusters.ROOT}
        terminate_on_interrupt = True

    xprocess.ensure(name, Starter, restart=True)
    return xprocess.resources[-1].popen, xprocess.getinfo(name).logpath


def run_cluster(xprocess, ports, tmp_path, *flags, num_workers=2, timeout_secs=240):
    """Runs 1 ps + num_workers workers to the end; returns (statuses, logs, output_dir)."""
    p = ports(1 + num_workers)
    ps_hosts = [f"127.0.0.1:{p[0]}"]
    worker_hosts = [f"127.0.0.1:{port}" for port in p[1:]]
    out = str(tmp_path / "out")
    common = [f"--output_dir={out}", *TRAIN_FLAGS, *flags]
    procs, logs = {}, {}
    procs["ps0"], logs["ps0"] = _start_ps(
        xprocess, f"ps-{p[0]}", clusters.trainer_argv(ps_hosts, worker_hosts, "ps", 0, *common),
        out)
    for i in range(num_workers):
        logs[f"worker{i}"] = str(tmp_path / f"worker{i}.log")
        procs[f"worker{i}"] = clusters.start(
            clusters.trainer_argv(ps_hosts, worker_hosts, "worker", i, *common),
            logs[f"worker{i}"])
    statuses = clusters.wait_all(procs, timeout_secs)
    return statuses, logs, out


def _summary_tags(output_dir):
    import glob

    import tensorflow as tf
    tags = set()
    for path in glob.glob(os.path.join(output_dir, "events.out.tfevents*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            tags.update(v.tag for v in event.summary.value)
    return tags


def _assert_clean_end(statuses, logs, out):
    for name, (code, _) in statuses.items():
        assert code == 0, f"{name} exited {code}:\n{clusters.tail(logs[name])}"
    last_step = min(clusters.last_step_time(out, n) for n in logs if n.startswith("worker"))
    for name, (_, exited) in statuses.items():
        lag = exited - last_step
        assert lag <= 10, f"{name} exited {lag:.1f} s after the last step"


MODES = {"async": [], "sync": ["--sync"], "local_sgd": ["--communication_period=8"],
         "model_averaging": ["--sync", "--communication_period=8"]}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", sorted(MODES))
def test_cluster_trains_digits_and_every_process_exits(xprocess, ports, tmp_path, mode):
    flags = MODES[mode]
    statuses, logs, out = run_cluster(xprocess, ports, tmp_path, *flags)
    _assert_clean_end(statuses, logs, out)
    metrics = clusters.final_metrics(out)
    assert metrics["accuracy"] >= 0.9, metrics
    assert metrics["sync"] == ("--sync" in flags)
    assert (metrics["num_ps"], metrics["num_workers"]) == (1, 2)
    assert metrics["train_examples_per_sec"] > 0
    # Every mode stops at exactly the last step: sync through the chief's sync loop,
    # async because each step reserves its number first (exact.counted_update), and
    # local SGD because each exchange claims the next block of steps.
    assert metrics["global_step"] == 1500
    records = [json.load(open(os.path.join(out, "tasks", f"worker{i}.json"))) for i in (0, 1)]
    assert all(r["measured_steps"] > 0 and 0 < r["step_ms_p50"] <= r["step_ms_p90"]
               for r in records), records
    if "--sync" not in flags:  # every global step is one worker's step, and only one's
        assert sum(r["local_steps"] for r in records) == 1500, records
    elif mode == "model_averaging":  # a round of K steps on every worker moves it by K
        assert [r["local_steps"] for r in records] == [1500, 1500], records
    # The chief's last stdout line is the metrics JSON.
    last = [l for l in open(logs["worker0"]).read().splitlines() if l.strip()][-1]
    assert json.loads(last) == metrics
    assert clusters.task_events(out, "ps0", "stopped"), clusters.task_events(out, "ps0")
    assert _summary_tags(out) >= {"loss", "accuracy", "examples_per_sec"}
    import tensorflow as tf
    final_checkpoint = tf.train.latest_checkpoint(out)
    assert final_checkpoint and int(final_checkpoint.rsplit("-", 1)[1]) >= 1500
    # The non-chief starts within 2 s of the chief having the model ready (the
    # stock session manager would sleep 30 s). The chief logs "session ready"
    # after its hooks' set-up, so this measures from a little after "ready".
    lag = (clusters.event_time(out, "worker1", "session_ready")
           - clusters.event_time(out, "worker0", "session_ready"))
    assert lag <= 2.0, f"worker1 ready {lag:.2f} s after the chief"


@pytest.mark.timeout(120)
def test_in_process_training_reaches_accuracy(tmp_path):
    out = tmp_path / "local"
    result = clusters.run([sys.executable, "-m", "lowlevel.trainer", f"--output_dir={out}",
                           "--train_steps=600"], timeout=110)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads(result.stdout.strip().splitlines()[-1])
    assert metrics["accuracy"] >= 0.9 and metrics["num_ps"] == 0
    assert metrics["global_step"] == 600
    assert os.path.exists(out / "checkpoint") and os.path.exists(out / "final_metrics.json")
    # C++ start-up noise is off by default.
    assert "oneDNN" not in result.stderr and "cpu_feature_guard" not in result.stderr
