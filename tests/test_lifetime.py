"""How tasks end when their supervisor or their peers do: the launcher killed with SIGKILL
takes its tasks with it, and a chief blocked on a dead sync worker still saves a checkpoint
when it is preempted. Real processes; the tasks' events say what happened."""

import glob
import os
import signal
import sys
import time

import psutil
import pytest
import tensorflow as tf

import clusters
from lowlevel.outputs import checkpoints
from lowlevel.runtime.preemption import exit_status

pytestmark = pytest.mark.cluster


def _poll(predicate, timeout_secs, what, context=lambda: ""):
    deadline = time.monotonic() + timeout_secs
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    pytest.fail(f"no {what} within {timeout_secs} s\n{context()}")


@pytest.mark.timeout(180)
def test_sigkill_of_the_launcher_ends_every_task(tmp_path):
    out = tmp_path / "run"
    launcher = clusters.start(
        [sys.executable, "-m", "lowlevel.launch", f"--output_dir={out}", "--train_steps=1000000",
         "--log_every_secs=0.5"], os.devnull)
    try:
        _poll(lambda: clusters.task_events(out, "worker1", "progress"), 120, "progress")
        children = psutil.Process(launcher.pid).children()
        assert len(children) == 3, children
        launcher.kill()
        launcher.wait()
        gone, alive = psutil.wait_procs(children, timeout=20)
        assert not alive, f"still running 20 s after the launcher's SIGKILL: {alive}"
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        for p in clusters.leftovers(out):
            p.kill()
    assert not clusters.leftovers(out)
    # They got SIGTERM (PR_SET_PDEATHSIG), which a task not training takes at once. (The
    # chief's final save races with the ps exiting at the same moment: not checked here.)
    assert clusters.task_events(out, "ps0", "preempted"), clusters.task_events(out, "ps0")


@pytest.mark.timeout(240)
def test_a_blocked_chief_saves_when_preempted_and_checkpoint_flags_hold(tmp_path, ports):
    """Sync without backups: with worker1 dead the chief blocks in its step; SIGTERM then
    saves from the signal thread (preemption.GRACE_SECS later). Before that, checkpoints
    come every --save_checkpoint_secs and only --keep_checkpoint_max stay."""
    out = tmp_path / "run"
    p = ports(3)
    ps_hosts, worker_hosts = [f"127.0.0.1:{p[0]}"], [f"127.0.0.1:{p[1]}", f"127.0.0.1:{p[2]}"]
    flags = [f"--output_dir={out}", "--sync", "--train_steps=1000000", "--log_every_secs=0.25",
             "--save_checkpoint_secs=1", "--keep_checkpoint_max=2", "--sync_timeout_secs=1",
             "--optimizer=momentum"]
    procs = {name: clusters.start(clusters.trainer_argv(ps_hosts, worker_hosts, job, i, *flags),
                                  tmp_path / f"{name}.log")
             for name, job, i in (("ps0", "ps", 0), ("worker0", "worker", 0),
                                  ("worker1", "worker", 1))}

    def saves():
        return [r for r in clusters.task_events(out, "worker0", "checkpoint_saved")
                if not r["emergency"]]

    try:
        _poll(lambda: len(saves()) >= 4, 150, "4 checkpoints",
              lambda: clusters.tail(tmp_path / "worker0.log"))
        procs["worker1"].kill()
        killed = time.time()
        _poll(lambda: [r for r in clusters.task_events(out, "worker0", "fault_noticed")
                       if r["unix_time"] > killed and r.get("missing")], 60,
              "report of the blocked sync step")
        procs["worker0"].send_signal(signal.SIGTERM)
        code = procs["worker0"].wait(30)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert code == exit_status(signal.SIGTERM), clusters.tail(tmp_path / "worker0.log")
    emergency = [r for r in clusters.task_events(out, "worker0", "checkpoint_saved")
                 if r["emergency"]]
    assert len(emergency) == 1, clusters.tail(tmp_path / "worker0.log")
    preempted = clusters.task_events(out, "worker0", "preempted")
    assert preempted and preempted[-1].get("stuck") and preempted[-1]["safe"], preempted
    assert checkpoints.newest_readable(str(out))[1] == emergency[0]["global_step"]
    # --save_checkpoint_secs=1: every timed save at least ~1 s after the one before.
    times = [r["unix_time"] for r in saves()[1:]]  # the first is the start state
    assert all(b - a >= 0.9 for a, b in zip(times, times[1:])), times
    # --keep_checkpoint_max=2: older ones are deleted, the emergency save included.
    kept = tf.train.get_checkpoint_state(str(out)).all_model_checkpoint_paths
    assert len(kept) == 2 and len(glob.glob(os.path.join(out, "model.ckpt-*.index"))) == 2
    names = {v for v, _ in tf.train.list_variables(str(out))}
    assert any(n.endswith("/Momentum") for n in names), sorted(names)[:20]
    assert not clusters.leftovers(out)
