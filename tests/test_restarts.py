"""lowlevel.runtime.restarts: the restart budget that turns a crash loop into a permanent exit.

In-process, the record's arithmetic as a table of starts and ends; then real trainer
processes restarted the way the training operator restarts a `restartPolicy: ExitCode`
replica (a new pod for every exit of 128 or more, without end): a task that always
exits 200 ends with status 1 after `--max_restarts`, and a preemption does not count."""

import json
import signal
import time

import pytest

import clusters
from lowlevel import errors as exit_codes
from lowlevel.runtime import restarts


def budget(tmp_path, max_restarts, run="run-1"):
    return restarts.Budget(str(tmp_path), "ps0", max_restarts, {restarts.RUN_ID_ENV: run})


def test_retryable_exits_count_and_the_last_one_becomes_permanent(tmp_path):
    codes = []
    for _ in range(3):
        b = budget(tmp_path, max_restarts=2)
        b.start()
        codes.append(b.end(200))
    assert codes == [200, 200, exit_codes.FAILURE]
    record = json.loads((tmp_path / "restarts" / "ps0.json").read_text())
    assert record == {"run": "run-1", "starts": 3, "restarts": 2, "last_end": 1}


def test_a_killed_start_counts_and_a_start_past_the_budget_fails_at_once(tmp_path):
    budget(tmp_path, 1).start()  # killed: no end recorded
    budget(tmp_path, 1).start()  # restart 1 of 1, killed again
    with pytest.raises(restarts.RestartsSpent, match=r"ps0: restarted 2 times in this run "
                       r"\(--max_restarts=1; .*ps0.json\) and its last start was killed"):
        budget(tmp_path, 1).start()


def test_preemptions_and_successes_do_not_count(tmp_path):
    for _ in range(4):  # drained four times: a preemption says nothing about the task
        b = budget(tmp_path, max_restarts=0)
        b.start()
        b.preempted("preempted")
        assert b.end(143) == 143
    b = budget(tmp_path, max_restarts=0)
    b.start()
    assert b.restarts == 0 and b.end(0) == 0
    b = budget(tmp_path, max_restarts=0)
    b.start()  # a start after a success is no restart
    assert b.restarts == 0 and b.end(200) == exit_codes.FAILURE  # no restart left


def test_another_run_starts_afresh_and_no_output_dir_counts_nothing(tmp_path):
    for _ in range(2):
        b = budget(tmp_path, max_restarts=5, run="first")
        b.start()
        b.end(200)
    assert budget(tmp_path, 5, run="first")._read()["restarts"] == 1
    b = budget(tmp_path, 5, run="second")
    b.start()
    assert b.restarts == 0
    none = restarts.Budget(None, "ps0", 0, {})  # no output_dir
    none.start()
    assert none.end(200) == 200


def test_without_a_bound_nothing_is_counted_or_written(tmp_path):
    for _ in range(5):
        b = budget(tmp_path, max_restarts=None)
        b.start()
        assert b.end(200) == 200
    assert b.restarts == 0 and not (tmp_path / "restarts").exists()


def _start_task(argv, log, env):
    return clusters.start(argv, log, env=env, append=True)


def _operator_loop(argv, log, env, starts_cap, on_start=None):
    """Restarts the task on every exit >= 128, as the training operator does with
    `restartPolicy: ExitCode` (and with no working backoffLimit); stops at an exit < 128
    or after `starts_cap` starts. Returns the exit statuses."""
    statuses = []
    for i in range(starts_cap):
        proc = _start_task(argv, log, env)
        try:
            if on_start:
                on_start(i, proc)
            proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        statuses.append(proc.returncode)
        if proc.returncode < 128 and proc.returncode >= 0:
            break
    return statuses


def _worker_argv(ports, out, max_restarts):
    """A worker whose ps never answers: exit 200 after --startup_timeout_secs, each time."""
    p = ports(2)
    return clusters.trainer_argv([f"127.0.0.1:{p[0]}"], [f"127.0.0.1:{p[1]}"], "worker", 0,
                                 f"--output_dir={out}", "--startup_timeout_secs=0.5",
                                 f"--max_restarts={max_restarts}")


@pytest.mark.cluster  # starts trainer processes
@pytest.mark.timeout(300)
def test_a_task_that_always_exits_200_ends_permanent_after_max_restarts(ports, tmp_path):
    out, log = tmp_path / "out", tmp_path / "worker0.log"
    statuses = _operator_loop(_worker_argv(ports, out, 2), log,
                              {restarts.RUN_ID_ENV: "job-uid-1"}, starts_cap=6)
    text = log.read_text()
    assert statuses == [200, 200, 1], text[-3000:]
    assert text.count("did not answer within 0.5 s") == 3
    last = text.strip().splitlines()[-1]
    assert last.startswith("lowlevel.trainer: error: worker0: restarted 2 times in this run "
                           "(--max_restarts=2;") and "giving up (permanent" in last, last
    record = json.loads((out / "restarts" / "worker0.json").read_text())
    assert record == {"run": "job-uid-1", "starts": 3, "restarts": 2, "last_end": 1}
    # The same task in a new run (a new Job, a new launch) has its budget again.
    statuses = _operator_loop(_worker_argv(ports, out, 0), log,
                              {restarts.RUN_ID_ENV: "job-uid-2"}, starts_cap=3)
    assert statuses == [1]  # 200 with no restart left: permanent at once


@pytest.mark.cluster  # starts trainer processes
@pytest.mark.timeout(300)
def test_a_preempted_task_is_not_counted_but_a_killed_one_is(ports, tmp_path):
    """SIGTERM (a drain) before the end: 143 and no restart counted; SIGKILL: counted."""
    out, log = tmp_path / "out", tmp_path / "worker0.log"
    p = ports(2)
    argv = clusters.trainer_argv([f"127.0.0.1:{p[0]}"], [f"127.0.0.1:{p[1]}"], "worker", 0,
                                 f"--output_dir={out}", "--startup_timeout_secs=60",
                                 "--max_restarts=1")
    record_file = out / "restarts" / "worker0.json"

    def stop(i, proc):
        deadline = time.monotonic() + 60
        while log.read_text().count("waiting for ps0") <= i:  # this start is recorded by then
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM if i < 2 else signal.SIGKILL)

    env = {restarts.RUN_ID_ENV: "run"}
    statuses = _operator_loop(argv, log, env, starts_cap=4, on_start=stop)
    # Two preemptions (not counted), then two kills: the second start after a kill is the
    # first restart (allowed), the one after the second kill would be the second: refused.
    assert statuses == [143, 143, -9, -9], statuses
    assert json.loads(record_file.read_text())["restarts"] == 1
    refused = _start_task(argv, log, env)
    assert refused.wait(timeout=60) == 1  # before TensorFlow's import: fast
    assert "its last start was killed" in log.read_text().strip().splitlines()[-1]
