"""The Distributed TensorFlow guide's skeleton trainer, stock TensorFlow against `python -m lowlevel`.

    python -m benchmarks.tf1_skeleton [--last_step=1000] [--runs=1] [--sync_replicas]

Runs tests/tf1_scripts/skeleton_trainer.py (the guide's text, an MLP on digits) as 1 ps + 2
workers on localhost, first with plain `python` (stock TensorFlow 2.21), then under
`python -m lowlevel`, in the same order each time: ps0 and worker1 first, worker0 (the
chief) once worker1 waits for the model (tasks of a real cluster start in any order).
For each it prints, as a markdown table: each task's exit status and when it exited
(seconds after the chief; "running" if still up `--linger_secs` after the chief, then it
is killed), how long after the chief the non-chief began (TensorFlow's "Done running
local_init_op" lines), how long the chief ran (start to exit, seconds) and the global
step of the final checkpoint. `--sync_replicas`:
the script's `SyncReplicasOptimizer` over both workers, with its hook.

    python -m benchmarks.tf1_skeleton --freeze_ps_after_secs=15 [--freeze_wait_secs=200]

instead freezes ps0 (SIGSTOP) 15 s after the chief started, with no last step in reach,
and reports how each worker ended: its exit status and when (seconds after the freeze;
"running (killed)" if it still ran `--freeze_wait_secs` after it), and its last line.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

import portpicker

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tests", "tf1_scripts", "skeleton_trainer.py")
RUNNERS = {"stock": [sys.executable], "lowlevel": [sys.executable, "-m", "lowlevel"]}


_ABSL_LINE = re.compile(r"I\d{4} (\d\d):(\d\d):(\d\d\.\d+) ")  # I1127 08:54:51.264046


def _began(log: str) -> float | None:
    """Seconds since midnight of the task's first "Done running local_init_op" line (its
    session is ready: it trains from here), from absl's prefix; None if it has none."""
    for line in open(log, errors="replace"):
        m = _ABSL_LINE.match(line)
        if m and "Done running local_init_op" in line:
            h, mins, s = m.groups()
            return datetime.timedelta(hours=int(h), minutes=int(mins),
                                      seconds=float(s)).total_seconds()
    return None


def _start_cluster(runner: str, common: list, out: str) -> tuple[dict, dict, float]:
    """Starts ps0, worker1 and, once worker1 waits for the model (at most 120 s), worker0;
    returns ({name: Popen}, {name: log path}, when the chief started (monotonic s))."""
    procs, logs = {}, {}

    def start(job, index):
        name = f"{job}{index}"
        logs[name] = os.path.join(out, f"{name}.log")
        with open(logs[name], "w") as log:
            procs[name] = subprocess.Popen(
                [*RUNNERS[runner], SCRIPT, *common, f"--job_name={job}",
                 f"--task_index={index}"], stdout=log, stderr=subprocess.STDOUT)
    start("ps", 0)
    start("worker", 1)
    deadline = time.monotonic() + 120
    while "Waiting for model to be ready" not in open(logs["worker1"], errors="replace").read():
        if time.monotonic() > deadline or procs["worker1"].poll() is not None:
            break
        time.sleep(0.1)
    start("worker", 0)
    return procs, logs, time.monotonic()


def _common(last_step: int, out: str, sync: bool) -> list:
    ps, w0, w1 = (f"127.0.0.1:{portpicker.pick_unused_port()}" for _ in range(3))
    return [f"--ps_hosts={ps}", f"--worker_hosts={w0},{w1}", f"--last_step={last_step}",
            f"--checkpoint_dir={os.path.join(out, 'ckpt')}", f"--sync_replicas={sync}"]


def _end(procs: dict) -> None:
    for proc in procs.values():
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)  # a frozen ps, killed below
            proc.kill()
            proc.wait()


def run_once(runner: str, last_step: int, linger_secs: float, out: str,
             sync: bool = False) -> dict:
    """One cluster of `runner`; returns its row (see the module doc)."""
    procs, logs, chief_started = _start_cluster(runner, _common(last_step, out, sync), out)
    exited = {}
    deadline = time.monotonic() + 600
    while len(exited) < 3 and time.monotonic() < deadline:
        for name, proc in procs.items():
            if name not in exited and proc.poll() is not None:
                exited[name] = time.monotonic()
        if "worker0" in exited and time.monotonic() - exited["worker0"] > linger_secs:
            break
        time.sleep(0.1)
    _end(procs)
    chief = exited.get("worker0")
    began = [_began(logs[n]) for n in ("worker0", "worker1")]
    step = _final_step(os.path.join(out, "ckpt"))
    row = {"runner": runner, "final_step": step,
           "chief_ran_s": round(chief - chief_started, 1) if chief else None,
           "nonchief_began_after_chief_s": (round(began[1] - began[0], 1)
                                            if None not in began else None)}
    for name in ("ps0", "worker0", "worker1"):
        code = procs[name].returncode if name in exited else None
        row[name] = ("running (killed)" if name not in exited else
                     f"exit {code}" + ("" if name == "worker0" or chief is None else
                                       f", {exited[name] - chief:+.1f} s"))
    return row


def run_frozen(runner: str, freeze_after_secs: float, wait_secs: float, out: str,
               sync: bool = False) -> dict:
    """One cluster of `runner` with no last step in reach, ps0 frozen (SIGSTOP)
    `freeze_after_secs` after the chief started; returns each worker's exit status and
    seconds after the freeze ("running (killed)" if it still ran `wait_secs` after it) and
    its last line."""
    procs, logs, chief_started = _start_cluster(runner, _common(10**9, out, sync), out)
    time.sleep(max(0.0, chief_started + freeze_after_secs - time.monotonic()))
    os.kill(procs["ps0"].pid, signal.SIGSTOP)
    frozen, exited = time.monotonic(), {}
    while len(exited) < 2 and time.monotonic() < frozen + wait_secs:
        for name in ("worker0", "worker1"):
            if name not in exited and procs[name].poll() is not None:
                exited[name] = time.monotonic() - frozen
        time.sleep(0.1)
    _end(procs)
    row = {"runner": runner, "frozen_after_s": freeze_after_secs}
    for name in ("worker0", "worker1"):
        lines = [line.strip() for line in open(logs[name], errors="replace") if line.strip()]
        row[name] = (f"exit {procs[name].returncode} at {exited[name]:.1f} s"
                     if name in exited else "running (killed)")
        row[f"{name}_last_line"] = lines[-1][:160] if lines else ""
    return row


def _final_step(checkpoint_dir: str) -> int | None:
    """The global step of the newest checkpoint in `checkpoint_dir` ("model.ckpt-<step>")."""
    names = os.listdir(checkpoint_dir) if os.path.isdir(checkpoint_dir) else []
    steps = [int(m.group(1)) for m in map(re.compile(r"model\.ckpt-(\d+)\.index$").match, names)
             if m]
    return max(steps, default=None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--last_step", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=1, help="clusters per runner")
    parser.add_argument("--linger_secs", type=float, default=20.0,
                        help="how long a task may run on after the chief exits")
    parser.add_argument("--sync_replicas", action="store_true",
                        help="the script's SyncReplicasOptimizer over both workers")
    parser.add_argument("--freeze_ps_after_secs", type=float, default=None,
                        help="instead: freeze ps0 (SIGSTOP) this long after the chief starts, "
                             "no last step in reach, and report how the workers end")
    parser.add_argument("--freeze_wait_secs", type=float, default=200.0,
                        help="with --freeze_ps_after_secs: how long to wait for the workers")
    flags = parser.parse_args()
    rows = []
    for k in range(flags.runs):
        for runner in RUNNERS:
            out = tempfile.mkdtemp(prefix=f"tf1_skeleton_{runner}_")
            rows.append(run_once(runner, flags.last_step, flags.linger_secs, out,
                                 flags.sync_replicas)
                        if flags.freeze_ps_after_secs is None else
                        run_frozen(runner, flags.freeze_ps_after_secs, flags.freeze_wait_secs,
                                   out, flags.sync_replicas))
            print(rows[-1], flush=True)
    keys = (["runner", "ps0", "worker0", "worker1", "nonchief_began_after_chief_s",
             "chief_ran_s", "final_step"] if flags.freeze_ps_after_secs is None else
            ["runner", "frozen_after_s", "worker0", "worker1", "worker1_last_line"])
    print("\n| " + " | ".join(keys) + " |\n|" + "---|" * len(keys))
    for row in rows:
        print("| " + " | ".join(str(row[k]) for k in keys) + " |")


if __name__ == "__main__":
    main()
