"""Your own TF1 program on lowlevel's runtime: the Distributed TensorFlow guide's skeleton
trainer, unmodified, under `python -m lowlevel` (and written for `lowlevel.train`, under plain
`python`), as 1 ps + 2 workers on localhost. Stock TensorFlow 2.21 runs the same script with
a ps that never exits and a non-chief that sleeps 30 s between looks for the chief's model
(so it may never run a step in a short run: docs/tf1-programs.md).
"""

import datetime
import json
import os
import re
import signal
import sys
import time

import pytest

import clusters
from lowlevel.outputs import checkpoints

pytestmark = pytest.mark.cluster

SCRIPTS = os.path.join(os.path.dirname(__file__), "tf1_scripts")
SKELETON = os.path.join(SCRIPTS, "skeleton_trainer.py")
LAST_STEP = 600


def _start(tmp_path, ports, command, last_step=LAST_STEP, extra=(), step_flag="last_step",
           env=None, from_tf_config=False):
    """Starts ps0, worker1 and, once worker1 waits for the chief's model, worker0 (the chief)
    of `command`; returns {name: process}. (Started together, the chief may have the model
    ready before the non-chief first looks, and stock TensorFlow's 30 s wait never shows.)
    `from_tf_config`: each task gets its cluster as TF_CONFIG, which the runner turns into
    the guide's flags (`python -m lowlevel --cluster_flags_from_tf_config`, as in a TFJob's
    pods); else the flags themselves."""
    ps, w0, w1 = (f"127.0.0.1:{p}" for p in ports(3))
    common = [f"--{step_flag}={last_step}", f"--checkpoint_dir={tmp_path / 'ckpt'}", *extra]

    def start(job, index):
        if from_tf_config:
            tf_config = {"cluster": {"ps": [ps], "worker": [w0, w1]},
                         "task": {"type": job, "index": index}}
            return clusters.start([*command[:-1], "--cluster_flags_from_tf_config",
                                   command[-1], *common], tmp_path / f"{job}{index}.log",
                                  env={**(env or {}), "TF_CONFIG": json.dumps(tf_config)})
        return clusters.start([*command, *common, f"--ps_hosts={ps}", f"--worker_hosts={w0},{w1}",
                               f"--job_name={job}", f"--task_index={index}"],
                              tmp_path / f"{job}{index}.log", env=env)
    procs = {"ps0": start("ps", 0), "worker1": start("worker", 1)}
    deadline = time.monotonic() + 60
    while "Waiting for model to be ready" not in (tmp_path / "worker1.log").read_text():
        assert time.monotonic() < deadline and procs["worker1"].poll() is None, \
            clusters.tail(tmp_path / "worker1.log")
        time.sleep(0.2)
    procs["worker0"] = start("worker", 0)
    return procs


def _ready_time(log) -> float:
    """Seconds since midnight of the task's "session ready" line (absl's prefix: I1127
    08:54:51.264046)."""
    for line in log.read_text().splitlines():
        if ": session ready at global step " in line:
            clock = re.match(r"I\d{4} (\d\d):(\d\d):(\d\d\.\d+) ", line).groups()
            return datetime.timedelta(hours=int(clock[0]), minutes=int(clock[1]),
                                      seconds=float(clock[2])).total_seconds()
    raise AssertionError(f"no session ready line in {log}:\n{clusters.tail(log)}")


def _assert_ran_to_the_end(tmp_path, procs):
    """Every task exited 0 by itself; the non-chief began within seconds of the chief; the
    final checkpoint holds exactly the last step (stock, async: up to one past it)."""
    done = clusters.wait_all(procs, 180)
    assert {n: c for n, (c, _) in done.items()} == {n: 0 for n in procs}, \
        {n: clusters.tail(tmp_path / f"{n}.log") for n, (c, _) in done.items() if c != 0}
    ps_log = (tmp_path / "ps0.log").read_text()
    assert "the chief signalled the end of training" in ps_log, clusters.tail(tmp_path / "ps0.log")
    lag = _ready_time(tmp_path / "worker1.log") - _ready_time(tmp_path / "worker0.log")
    # (negative: the chief saves its first checkpoint before its line; the model was ready)
    assert lag < 5.0, lag  # stock: up to 30 s (SessionManager's recovery_wait_secs)
    path, step = checkpoints.newest_readable(str(tmp_path / "ckpt"))
    assert step == LAST_STEP, path
    assert done["ps0"][1] - done["worker0"][1] < 10, done  # the ps ended with the chief
    for name in ("worker0", "worker1"):  # progress lines and events, as the trainer's
        assert re.search(rf"{name}: step \d+/{LAST_STEP}", (tmp_path / f"{name}.log").read_text())
        kinds = {r["event"] for r in clusters.task_events(tmp_path / "ckpt", name)}
        assert {"session_ready", "progress"} <= kinds, kinds


@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode", ["async", "sync"])
def test_the_guides_skeleton_under_the_runner_ends_every_task_with_0(tmp_path, ports, mode):
    """Async and with `SyncReplicasOptimizer` (stock sync: the chief's queue runner blocks
    in the ps's accumulators after the last step until its session is closed). The sync
    run's tasks get their cluster as a TFJob's pods do: TF_CONFIG, which the runner gives
    the script as the guide's flags (`--cluster_flags_from_tf_config`)."""
    procs = _start(tmp_path, ports, [sys.executable, "-m", "lowlevel", SKELETON],
                   extra=[f"--sync_replicas={mode == 'sync'}"], from_tf_config=mode == "sync")
    _assert_ran_to_the_end(tmp_path, procs)


@pytest.mark.timeout(240)
def test_a_script_written_for_lowlevel_train_runs_the_same_under_plain_python(tmp_path, ports):
    procs = _start(tmp_path, ports, [sys.executable, os.path.join(SCRIPTS, "library_trainer.py")])
    _assert_ran_to_the_end(tmp_path, procs)


@pytest.mark.timeout(120)
def test_the_runner_passes_on_a_scripts_failure_and_refuses_a_missing_script(tmp_path):
    failing = tmp_path / "failing.py"
    failing.write_text("import tensorflow.compat.v1 as tf\n"
                       "raise ValueError('the model is wrong')\n")
    done = clusters.run([sys.executable, "-m", "lowlevel", str(failing)], timeout=60)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "Traceback" in done.stderr and "ValueError: the model is wrong" in done.stderr
    missing = clusters.run([sys.executable, "-m", "lowlevel", str(tmp_path / "nope.py")],
                           timeout=60)
    assert missing.returncode == 2 and "no such script" in missing.stderr, missing.stderr
    usage = clusters.run([sys.executable, "-m", "lowlevel", "--help"], timeout=60)
    assert usage.returncode == 0 and "usage: python -m lowlevel [--cluster_flags_from_tf_config] "\
        "SCRIPT.py" in usage.stdout and "--cluster_flags_from_tf_config  give" in usage.stdout
    bad = clusters.run([sys.executable, "-m", "lowlevel", str(failing)], timeout=60,
                       env={"LOWLEVEL_FAULT_TIMEOUT_SECS": "soon"})
    assert bad.returncode == 2, bad.stderr[-2000:]
    assert bad.stderr.strip().splitlines()[-1] == (
        "lowlevel: LOWLEVEL_FAULT_TIMEOUT_SECS='soon': expected a positive number of seconds "
        "(the trainer's --fault_timeout_secs; default 90)")
    assert "the model is wrong" not in bad.stderr  # refused before the script ran


@pytest.mark.timeout(240)
def test_sigterm_stops_the_scripts_chief_at_a_safe_point_with_143(tmp_path, ports):
    """The chief of the skeleton under the runner, SIGTERMed in training: it stops after its
    current step, its session's close saves a checkpoint of that step, and it exits 143
    (stopped, retryable) within 5 s. Stock TensorFlow: killed by the signal, no checkpoint."""
    procs = _start(tmp_path, ports, [sys.executable, "-m", "lowlevel", SKELETON],
                   last_step=10_000_000)
    try:
        _wait_for_line(tmp_path / "worker0.log", "global_step/sec")  # 100 steps in
        procs["worker0"].send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        code = procs["worker0"].wait(30)
        took = time.monotonic() - signalled
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
    log = tmp_path / "worker0.log"
    assert code == 143 and took < 5.0, (code, took, clusters.tail(log))
    assert "preempted by SIGTERM; stopping at the end of the current step" in log.read_text()
    path, step = checkpoints.newest_readable(str(tmp_path / "ckpt"))
    assert step >= 100, path  # saved at the stop, past the first 100 steps
    assert "told 1 ps task(s) to exit" not in log.read_text()  # the run is not over


def _wait_for_line(log, text, timeout_secs=120):
    deadline = time.monotonic() + timeout_secs
    while text not in log.read_text():
        assert time.monotonic() < deadline, clusters.tail(log)
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_a_frozen_ps_ends_the_scripts_workers_with_200_naming_it_at_the_default_limits(
        tmp_path, ports):
    """Two scripts under the runner side by side, no limits set (a script has no flags for
    them): the skeleton (`MonitoredTrainingSession`) and the Supervisor script (its own
    loop over `prepare_or_wait_for_session`'s session, as mnist_replica.py). Each one's ps0
    frozen (SIGSTOP) in steady training: each worker's run passes its 60 s deadline, is
    reported and run again, and 90 s into the outage the worker exits 200, its last line
    naming ps0 (`lowlevel.train`'s defaults, the trainer's). Stock TensorFlow: the workers
    wait on the frozen ps for good (the shared notes: no line, no error after 150 s)."""
    scripts = {"skeleton": (SKELETON, "last_step"),
               "supervisor": (os.path.join(SCRIPTS, "supervisor_trainer.py"), "train_steps")}
    runs = {}
    for name, (script, flag) in scripts.items():
        (tmp_path / name).mkdir()
        runs[name] = _start(tmp_path / name, ports, [sys.executable, "-m", "lowlevel", script],
                            last_step=10_000_000, step_flag=flag)
    _wait_for_line(tmp_path / "skeleton" / "worker0.log", "global_step/sec")  # 100 steps in
    for worker in ("worker0", "worker1"):
        _wait_for_line(tmp_path / "supervisor" / f"{worker}.log", "session ready")
    time.sleep(3)  # steady training, past every first run
    for procs in runs.values():
        os.kill(procs["ps0"].pid, signal.SIGSTOP)
    struck = time.monotonic()
    try:
        done = clusters.wait_all({f"{run}/{n}": p for run, procs in runs.items()
                                  for n, p in procs.items() if n != "ps0"}, 60 + 90 + 60)
    finally:
        for procs in runs.values():
            os.kill(procs["ps0"].pid, signal.SIGCONT)
            procs["ps0"].kill()
    assert len(done) == 4
    for name, (code, _) in done.items():
        log = tmp_path / f"{name}.log"
        assert code == 200, (name, code, clusters.tail(log))
        lines = [line for line in log.read_text().splitlines() if line.strip()]
        assert "not answering: ps0 at 127.0.0.1:" in lines[-1], lines[-1]
        assert "did not complete within 60 s" in log.read_text(), clusters.tail(log)
    assert time.monotonic() - struck >= 90  # not before the limit


@pytest.mark.timeout(240)
def test_limits_from_the_environment_end_a_supervisor_loop_on_a_frozen_ps_sooner(
        tmp_path, ports):
    """The Supervisor script (its own loop) with `LOWLEVEL_STEP_TIMEOUT_SECS=2` and
    `LOWLEVEL_FAULT_TIMEOUT_SECS=8` (a script has no flags for them): ps0 frozen, each
    worker's runs pass their 2 s deadline, and 8 s into the outage it exits 200 naming
    ps0, the limit in its last line."""
    command = [sys.executable, "-m", "lowlevel", os.path.join(SCRIPTS, "supervisor_trainer.py")]
    procs = _start(tmp_path, ports, command, last_step=10_000_000, step_flag="train_steps",
                   env={"LOWLEVEL_STEP_TIMEOUT_SECS": "2", "LOWLEVEL_FAULT_TIMEOUT_SECS": "8"})
    for worker in ("worker0", "worker1"):
        _wait_for_line(tmp_path / f"{worker}.log", "session ready")
    time.sleep(2)  # training
    os.kill(procs["ps0"].pid, signal.SIGSTOP)
    struck = time.monotonic()
    try:
        done = clusters.wait_all({n: p for n, p in procs.items() if n != "ps0"}, 60)
    finally:
        os.kill(procs["ps0"].pid, signal.SIGCONT)
        procs["ps0"].kill()
    took = time.monotonic() - struck
    for name, (code, _) in done.items():
        log = tmp_path / f"{name}.log"
        assert code == 200, (name, code, clusters.tail(log))
        lines = [line for line in log.read_text().splitlines() if line.strip()]
        assert "(--fault_timeout_secs=8); not answering: ps0 at 127.0.0.1:" in lines[-1], \
            lines[-1]
    assert 8 <= took < 40, took  # not before the limit; long before the default 90 s


@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode", ["async", "sync"])
def test_a_supervisor_scripts_own_loop_ends_with_every_task_exiting_0(tmp_path, ports, mode):
    """A script in mnist_replica.py's shape (`tf.train.Supervisor`, its own loop until the
    global step it reads reaches `--train_steps`, no hooks) under the runner: after the
    loop, the non-chief reports its end and the chief tells the ps to exit
    (`lowlevel.train.end_of_script`). Stock: the ps never exits. The runner is told the
    last step (`LOWLEVEL_LAST_STEP`: the script's loop has no hook to say it): async, each
    worker's last run sees exactly 300; sync, the chief's own queue runner (the script
    starts it) stops at 300 and leaves each worker a token for its last run
    (`script_steps.CountedChiefQueueRunner`): each worker sees exactly 300 (stock: up to
    one step per worker past it)."""
    command = [sys.executable, "-m", "lowlevel", os.path.join(SCRIPTS, "supervisor_trainer.py")]
    procs = _start(tmp_path, ports, command, last_step=300, step_flag="train_steps",
                   extra=["--sync_replicas"] if mode == "sync" else [],
                   env={"LOWLEVEL_LAST_STEP": "300"})
    done = clusters.wait_all(procs, 180)
    assert {n: c for n, (c, _) in done.items()} == {n: 0 for n in procs}, \
        {n: clusters.tail(tmp_path / f"{n}.log") for n, (c, _) in done.items() if c != 0}
    assert "the chief signalled the end of training" in (tmp_path / "ps0.log").read_text()
    assert "chief: told 1 ps task(s) to exit" in (tmp_path / "worker0.log").read_text()
    for name in ("worker0", "worker1"):
        log = tmp_path / f"{name}.log"
        ended = re.search(r"training ended at global step (\d+)", log.read_text())
        assert ended, clusters.tail(log)
        assert int(ended.group(1)) == 300, clusters.tail(log)
    assert done["ps0"][1] - done["worker0"][1] < 10, done  # the ps ended with the chief
