"""Fault tolerance, proven with real processes: a task of a running localhost cluster is
killed (SIGKILL) or preempted (SIGTERM, exit status 143: retryable), the launcher restarts
it, and the run must still end with every task exiting 0, the global step at exactly --train_steps,
no step lost below the last checkpoint, and test accuracy >= 0.9."""

import re
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

import clusters
from lowlevel import checkpoints

TRAIN_STEPS = 3000
CHECKPOINT_EVERY = 500
FAULT_AT = 1200  # the global step after which the fault is injected
PROGRESS = re.compile(r"^\[(\w+)\] .*step (\d+)/\d+ \|")


class Launch:
    """A `lowlevel.launch` run whose output lines are collected, with their arrival times."""

    def __init__(self, out, *flags):
        self.out = out
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "lowlevel.launch", f"--output_dir={out}", "--max_restarts=1",
             "--log_every_secs=0.25", f"--train_steps={TRAIN_STEPS}",
             f"--save_checkpoint_steps={CHECKPOINT_EVERY}", *flags],
            cwd=clusters.ROOT, env=clusters.ENV, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True)
        self.lines: list[tuple[float, str]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def text(self, since: float = 0.0, until: float = float("inf")) -> str:
        return "\n".join(line for t, line in list(self.lines) if since <= t < until)

    def wait_for(self, predicate, timeout_secs: float, what: str):
        """Polls the output until `predicate(line)` holds for a line; returns that line."""
        deadline = time.monotonic() + timeout_secs
        seen = 0
        while time.monotonic() < deadline:
            lines = list(self.lines)
            for _, line in lines[seen:]:
                if predicate(line):
                    return line
            seen = len(lines)
            if self.proc.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.05)
        pytest.fail(f"no line with {what} within {timeout_secs} s:\n{self.text()[-4000:]}")

    def task(self, name: str) -> psutil.Process:
        job, index = re.match(r"(\D+)(\d+)$", name).groups()
        for child in psutil.Process(self.proc.pid).children():
            cmdline = child.cmdline()
            if f"--job_name={job}" in cmdline and f"--task_index={index}" in cmdline:
                return child
        raise AssertionError(f"no live {name} among the launcher's children")

    def finish(self, timeout_secs: float) -> int:
        try:
            code = self.proc.wait(timeout_secs)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"the launcher did not exit within {timeout_secs} s:\n"
                        f"{self.text()[-4000:]}")
        self._reader.join(10)
        return code

    def kill(self):
        if self.proc.poll() is None:
            children = psutil.Process(self.proc.pid).children()
            self.proc.kill()
            for child in children:
                try:
                    child.kill()
                except psutil.NoSuchProcess:
                    pass
            self.proc.wait()


def _progress_steps(text):
    return [int(m.group(2)) for m in map(PROGRESS.match, text.splitlines()) if m]


def _inject(tmp_path, target, signum, *flags, fault_at=FAULT_AT):
    """Runs a cluster, sends `signum` to `target` after global step `fault_at`, lets it finish.

    Returns (launch, time of the fault, step of the newest checkpoint at the fault).
    """
    out = tmp_path / "run"
    launch = Launch(out, *flags)
    try:
        launch.wait_for(lambda l: (m := PROGRESS.match(l)) and int(m.group(2)) >= fault_at,
                        150, f"global step {fault_at}")
        found = checkpoints.newest_readable(str(out))
        checkpoint_step = found[1] if found else 0
        fault_time = time.monotonic()
        launch.task(target).send_signal(signum)
        code = launch.finish(240)
    finally:
        launch.kill()
    assert code == 0, launch.text()[-5000:]
    assert not clusters.leftovers(out)
    return launch, fault_time, checkpoint_step


def _assert_recovered(launch, fault_time, checkpoint_step, out):
    """The checks every fault shares: the end, the step after recovery, the accuracy."""
    metrics = clusters.final_metrics(out)
    assert metrics["global_step"] == TRAIN_STEPS, metrics
    assert metrics["accuracy"] >= 0.9, metrics
    after = _progress_steps(launch.text(since=fault_time))
    assert after, launch.text()[-3000:]
    # Lines already in flight at the fault may still show the old step; every step seen
    # from then on is at least the last checkpoint's.
    assert min(after) >= checkpoint_step, (checkpoint_step, after[:10])
    final = checkpoints.newest_readable(str(out))
    assert final[1] == TRAIN_STEPS


@pytest.mark.timeout(300)
@pytest.mark.parametrize("target", ["worker1", "ps0", "worker0"])
def test_sigkill_of_a_task_is_survived(tmp_path, target):
    launch, fault_time, ckpt_step = _inject(tmp_path, target, signal.SIGKILL)
    after = launch.text(since=fault_time)
    assert f"launch: {target} was killed by SIGKILL; restarting it (restart 1 of 1)" in after
    _assert_recovered(launch, fault_time, ckpt_step, tmp_path / "run")
    if target == "ps0":  # the chief restores the newest checkpoint once the ps is back
        m = re.search(r"new session after a failure; restored from checkpoint "
                      r"model\.ckpt-\d+, at global step (\d+)", after)
        assert m, after[-3000:]
        restored = int(m.group(1))
        assert restored >= ckpt_step
        lost = max(_progress_steps(launch.text(until=fault_time))) - restored
        assert lost <= CHECKPOINT_EVERY, (lost, restored)  # at most one checkpoint interval
    else:  # the restarted worker rejoins the running model; the chief adopts it
        m = re.search(rf"\[{target}\] .*session ready at global step (\d+)", after)
        assert m and int(m.group(1)) >= FAULT_AT, after[-3000:]
        if target == "worker0":
            assert "the ps tasks still held the model: continuing from it" in after


@pytest.mark.timeout(300)
@pytest.mark.parametrize("target", ["worker0", "worker1", "ps0"])
def test_sigterm_ends_a_task_within_5_s_with_status_143(tmp_path, target):
    launch, fault_time, ckpt_step = _inject(tmp_path, target, signal.SIGTERM)
    lines = [(t, l) for t, l in launch.lines if t >= fault_time]
    ended = [t for t, l in lines if f"launch: {target} exited with status 143 (stopped by "
             "SIGTERM); restarting it (restart 1 of 1)" in l]
    assert ended, launch.text()[-3000:]
    assert ended[0] - fault_time <= 5.0
    _assert_recovered(launch, fault_time, ckpt_step, tmp_path / "run")
    if target == "worker0":  # the chief saved a checkpoint of the step it stopped at
        m = re.search(r"preempted at global step (\d+); saved model\.ckpt-(\d+)",
                      launch.text(since=fault_time))
        assert m, launch.text()[-3000:]
        assert int(m.group(2)) >= FAULT_AT and int(m.group(1)) >= int(m.group(2)) - 5


@pytest.mark.timeout(300)
def test_sync_with_a_backup_worker_survives_a_dead_worker(tmp_path):
    launch, fault_time, ckpt_step = _inject(tmp_path, "worker1", signal.SIGKILL, "--sync",
                                            "--replicas_to_aggregate=1")
    _assert_recovered(launch, fault_time, ckpt_step, tmp_path / "run")
    # No pause: the chief's own steps go on while worker1 is down.
    restarted = next(t for t, l in launch.lines if "[worker1]" in l and "session ready" in l
                     and t > fault_time)
    chief_steps = [int(PROGRESS.match(l).group(2)) for t, l in launch.lines
                   if fault_time + 0.5 < t < restarted and l.startswith("[worker0]")
                   and PROGRESS.match(l)]
    assert len(chief_steps) >= 2 and chief_steps[-1] > chief_steps[0], chief_steps
    assert clusters.final_metrics(tmp_path / "run")["sync"]


@pytest.mark.timeout(300)
def test_sync_without_backups_reports_the_missing_worker_and_resumes(tmp_path):
    launch, fault_time, ckpt_step = _inject(tmp_path, "worker1", signal.SIGKILL, "--sync",
                                            "--sync_timeout_secs=1")
    after = launch.text(since=fault_time)
    assert re.search(r"still waiting for gradients after \d+ s \(--sync_timeout_secs\); "
                     r"not answering: worker1 at 127\.0\.0\.1:\d+", after), after[-3000:]
    assert "complete again" in after
    _assert_recovered(launch, fault_time, ckpt_step, tmp_path / "run")


@pytest.mark.timeout(200)
def test_without_restarts_a_preempted_task_fails_the_run(tmp_path):
    out = tmp_path / "run"
    launch = Launch(out, "--max_restarts=0")
    try:
        launch.wait_for(lambda l: (m := PROGRESS.match(l)) and int(m.group(2)) >= 300, 150,
                        "training progress")
        launch.task("worker1").send_signal(signal.SIGTERM)
        code = launch.finish(120)
    finally:
        launch.kill()
    assert code == 1
    assert ("launch: worker1 exited with status 143 (stopped by SIGTERM); stopping the other "
            "tasks") in launch.text()
    assert not clusters.leftovers(out)


@pytest.mark.timeout(200)
def test_a_truncated_newest_checkpoint_falls_back_to_the_one_before(tmp_path):
    out = tmp_path / "run"

    def train(steps):
        return subprocess.run([sys.executable, "-m", "lowlevel.trainer", f"--output_dir={out}",
                               f"--train_steps={steps}", "--save_checkpoint_steps=200"],
                              cwd=clusters.ROOT, env=clusters.ENV, capture_output=True,
                              text=True, timeout=120)

    assert train(600).returncode == 0
    data = next(out.glob("model.ckpt-600.data-*"))
    data.write_bytes(data.read_bytes()[:1000])
    second = train(1000)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "checkpoint model.ckpt-600 is unreadable" in second.stderr
    assert "restored from checkpoint model.ckpt-400, at global step 400" in second.stderr
    assert clusters.final_metrics(out)["global_step"] == 1000
    assert clusters.final_metrics(out)["start_global_step"] == 400
