"""The communication-reduced async mode's start barrier (`lowlevel.runtime.start`), on real clusters.

Without it the chief trains alone until the other workers' sessions are ready;
the digits MLP's 1,500 steps take it about a second, so a worker started two
seconds late would find the run nearly over.
"""

import json
import os
import time

import pytest

import clusters

pytestmark = pytest.mark.cluster

FLAGS = ["--train_steps=1500", "--batch_size=64", "--log_every_secs=1",
         "--communication_period=16", "--save_checkpoint_secs=100000"]
LATE_SECS = 2.0


def _wait_for_line(path, text, timeout_secs):
    deadline = time.monotonic() + timeout_secs
    while time.monotonic() < deadline:
        if os.path.exists(path) and text in open(path).read():
            return
        time.sleep(0.1)
    raise AssertionError(f"no {text!r} in {path} within {timeout_secs} s:\n{clusters.tail(path)}")


def _run(ports, tmp_path, *flags, late_worker=True):
    """Runs ps0, the chief and (unless `late_worker` is False, never) worker 1, started
    `LATE_SECS` after the chief waits for it; asserts every task exited 0.

    Returns (output_dir, worker_hosts, the chief's log path).
    """
    p = ports(3)
    ps_hosts, worker_hosts = [f"127.0.0.1:{p[0]}"], [f"127.0.0.1:{p[1]}", f"127.0.0.1:{p[2]}"]
    out = str(tmp_path / "out")

    def argv(job, index):
        return clusters.trainer_argv(ps_hosts, worker_hosts, job, index,
                                     f"--output_dir={out}", *FLAGS, *flags)
    logs = {n: str(tmp_path / f"{n}.log") for n in ("ps0", "worker0", "worker1")}
    procs = {}
    try:
        procs["ps0"] = clusters.start(argv("ps", 0), logs["ps0"])
        procs["worker0"] = clusters.start(argv("worker", 0), logs["worker0"])
        if late_worker:
            _wait_for_line(logs["worker0"], "so that all start together", 120)
            time.sleep(LATE_SECS)  # the chief is ready and waiting; worker1 is not even started
            procs["worker1"] = clusters.start(argv("worker", 1), logs["worker1"])
        statuses = clusters.wait_all(procs, 150)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for name, (code, _) in statuses.items():
        assert code == 0, f"{name} exited {code}:\n{clusters.tail(logs[name])}"
    return out, worker_hosts, logs["worker0"]


@pytest.mark.timeout(180)
def test_the_chief_waits_for_a_late_worker_and_both_train(ports, tmp_path):
    out, _, _ = _run(ports, tmp_path)
    barrier, = clusters.task_events(out, "worker0", "start_barrier")
    assert barrier["missing"] == [] and barrier["waited_secs"] >= LATE_SECS, barrier
    # Each took a share of the steps: the chief did not run the whole 1,500 alone.
    steps = [json.load(open(os.path.join(out, "tasks", f"worker{i}.json")))["local_steps"]
             for i in (0, 1)]
    assert sum(steps) == 1500 and min(steps) >= 300, steps
    assert clusters.final_metrics(out)["accuracy"] >= 0.9


@pytest.mark.timeout(180)
def test_a_worker_that_never_comes_is_waited_for_start_wait_secs_then_named(ports, tmp_path):
    out, worker_hosts, chief_log = _run(ports, tmp_path, "--start_wait_secs=2",
                                        late_worker=False)
    barrier, = clusters.task_events(out, "worker0", "start_barrier")
    assert barrier["missing"] == [f"worker1 at {worker_hosts[1]}"], barrier
    assert 2.0 <= barrier["waited_secs"] <= 5.0, barrier
    assert f"worker1 at {worker_hosts[1]} not ready after 2 s" in open(chief_log).read()
    assert clusters.final_metrics(out)["global_step"] == 1500
