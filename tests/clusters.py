"""Helpers for tests that run real clusters: processes, deadlines, log times."""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import sys
import time

import psutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, PYTHONUNBUFFERED="1")
LOG_TIME = re.compile(r"^I\d{4} (\d\d:\d\d:\d\d\.\d+) ")


def trainer_argv(ps_hosts, worker_hosts, job_name, task_index, *flags):
    return [sys.executable, "-m", "lowlevel.trainer", f"--ps_hosts={','.join(ps_hosts)}",
            f"--worker_hosts={','.join(worker_hosts)}", f"--job_name={job_name}",
            f"--task_index={task_index}", *flags]


def start(argv, log_path, env=None):
    """Starts a process with stdout+stderr to `log_path`; returns the Popen."""
    log = open(log_path, "w")
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                            env=dict(ENV, **(env or {})), stdin=subprocess.DEVNULL)


def wait_all(procs: dict, timeout_secs: float) -> dict:
    """Polls until every process exits or the deadline passes.

    Returns {name: (exit status or None, wall-clock exit time seen)}; processes
    still running at the deadline are killed (and reported with status None).
    """
    deadline = time.monotonic() + timeout_secs
    done = {}
    while len(done) < len(procs) and time.monotonic() < deadline:
        for name, proc in procs.items():
            if name not in done and proc.poll() is not None:
                done[name] = (proc.returncode, datetime.datetime.now())
        time.sleep(0.05)
    for name, proc in procs.items():
        if name not in done:
            proc.kill()
            proc.wait()
            done[name] = (None, datetime.datetime.now())
    return done


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


def log_time(log_path, needle) -> datetime.datetime:
    """The time of the first absl log line holding `needle` (today's date)."""
    with open(log_path) as f:
        for line in f:
            m = LOG_TIME.match(line)
            if m and needle in line:
                t = datetime.datetime.strptime(m.group(1), "%H:%M:%S.%f").time()
                return datetime.datetime.combine(datetime.date.today(), t)
    raise AssertionError(f"no {needle!r} line in {log_path}:\n{tail(log_path)}")


def last_step_time(log_path) -> datetime.datetime:
    """When a worker logged the end of its training loop."""
    return log_time(log_path, "last step done")


def final_metrics(output_dir) -> dict:
    with open(os.path.join(output_dir, "final_metrics.json")) as f:
        return json.load(f)


def tail(path, n=40) -> str:
    with open(path) as f:
        return "".join(f.readlines()[-n:])


def eval_metrics(output_dir, split_dir="eval") -> list:
    with open(os.path.join(output_dir, split_dir, "eval_metrics.json")) as f:
        return json.load(f)
