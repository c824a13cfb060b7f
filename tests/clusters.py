"""Helpers for tests that run real clusters: processes, deadlines, the tasks' events."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import prefork
import psutil

from lowlevel import events, output_layout

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, PYTHONUNBUFFERED="1")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (bound, read, released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def trainer_argv(ps_hosts, worker_hosts, job_name, task_index, *flags):
    return [sys.executable, "-m", "lowlevel.trainer", f"--ps_hosts={','.join(ps_hosts)}",
            f"--worker_hosts={','.join(worker_hosts)}", f"--job_name={job_name}",
            f"--task_index={task_index}", *flags]


def start(argv, log_path, env=None, append=False, cold=False):
    """Starts a process from the project root with stdout+stderr to `log_path` (appended to
    with `append`), forked from one TensorFlow import where it can be (`prefork`; never
    with `cold`); returns its Popen-like handle."""
    return prefork.start(argv, log_path, env=dict(ENV, **(env or {})), append=append,
                         cold=cold)


def start_on(hosts, host, argv, log_path, env=None):
    """`start` on `host` of `hosts` (a `netns.Hosts`): forked into its namespaces where it
    can be (else `ip netns exec`), and killed by `hosts.close()` if still running."""
    return hosts.track(prefork.start(argv, log_path, env=dict(ENV, **(env or {})),
                                     netns=hosts.namespaces[host]))


def run(argv, timeout, env=None, cwd=ROOT, cold=False) -> subprocess.CompletedProcess:
    """`subprocess.run(argv, capture_output=True, text=True, timeout=timeout)` from the
    project root, forked from one TensorFlow import where it can be (`prefork`; never
    with `cold`)."""
    return prefork.run(argv, env=dict(ENV, **(env or {})), cwd=cwd, timeout=timeout,
                       cold=cold)


def wait_all(procs: dict, timeout_secs: float) -> dict:
    """Polls until every process exits or the deadline passes.

    Returns {name: (exit status or None, Unix time the exit was seen)};
    processes still running at the deadline are killed (and reported with
    status None).
    """
    deadline = time.monotonic() + timeout_secs
    done = {}
    while len(done) < len(procs) and time.monotonic() < deadline:
        for name, proc in procs.items():
            if name not in done and proc.poll() is not None:
                done[name] = (proc.returncode, time.time())
        time.sleep(0.05)
    for name, proc in procs.items():
        if name not in done:
            proc.kill()
            proc.wait()
            done[name] = (None, time.time())
    return done


def argv_of(proc: psutil.Process) -> list[str]:
    """A process's command line as words, whether its title was set as one string in a
    longer argument area (a task forked by `prefork` or from a forked launcher) or not."""
    return " ".join(proc.cmdline()).split()


def leftovers(out) -> list:
    """The processes (psutil) still running with `out` in their command line."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(str(out) in arg for arg in p.info["cmdline"] or []):
                found.append(p)
        except psutil.Error:
            pass
    return found


def task_events(output_dir, task: str, event: str | None = None) -> list[dict]:
    """Task `task`'s event records (`lowlevel.events`), all or those named `event`."""
    records = events.read(output_layout.events_file(str(output_dir), task))
    return [r for r in records if event is None or r["event"] == event]


def event_time(output_dir, task: str, event: str) -> float:
    """Unix time of task `task`'s first `event` record; AssertionError naming what it has."""
    found = task_events(output_dir, task, event)
    if not found:
        seen = [r["event"] for r in task_events(output_dir, task)]
        raise AssertionError(f"no {event!r} event from {task} in {output_dir}; it has {seen}")
    return found[0]["unix_time"]


def last_step_time(output_dir, task: str) -> float:
    """When a worker's training loop ended at the last step (its `done` event)."""
    return event_time(output_dir, task, "done")


def final_metrics(output_dir) -> dict:
    with open(os.path.join(output_dir, "final_metrics.json")) as f:
        return json.load(f)


def tail(path, n=40) -> str:
    with open(path) as f:
        return "".join(f.readlines()[-n:])


def eval_metrics(output_dir, split_dir="eval") -> list:
    with open(os.path.join(output_dir, split_dir, "eval_metrics.json")) as f:
        return json.load(f)


def descendants(pid: int) -> list:
    """Every process whose ancestry includes `pid` (psutil.Process objects, by PID)."""
    out = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if any(p.pid == pid for p in proc.parents()):
                out.append(proc)
        except psutil.Error:
            pass
    return out


def alive(procs) -> list[int]:
    """PIDs of `procs` still running (a zombie has ended)."""
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except psutil.Error:
            pass
    return out


def run_watched(argv: list, stop=None) -> tuple[int, str, set, int]:
    """Runs `argv` from the project root to its end, noting every process it starts.

    `stop(proc)` ends it if the test is interrupted (default: SIGKILL).

    Returns (exit status, stdout and stderr, the psutil.Process of every descendant seen,
    the process's PID).
    """
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=ENV)
    seen: set = set()
    try:
        while proc.poll() is None:
            seen.update(descendants(proc.pid))
            try:
                proc.wait(0.5)
            except subprocess.TimeoutExpired:
                pass
        return proc.returncode, proc.stdout.read(), seen, proc.pid
    finally:
        if proc.poll() is None:
            (stop or (lambda p: p.kill()))(proc)
            proc.wait(30)
