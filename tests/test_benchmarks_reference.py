"""The reference trainers of the throughput benchmark (`benchmarks/classic.py`,
`benchmarks/tf2_pss.py`) run as real localhost clusters and write their records.

Every process is started here and stopped here by its PID (never by name); each test
ends by checking with psutil that none of them, nor any child of theirs, is left.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import portpicker
import psutil
import pytest

import clusters

pytestmark = pytest.mark.cluster  # every test here starts trainer processes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, PYTHONUNBUFFERED="1")
SMALL = ["--hidden_units=64,64", "--train_steps=300", "--warmup_steps=50"]
DEADLINE_SECS = 150


class Procs:
    """Processes started by one test: by name, with their psutil handles."""

    def __init__(self, tmp_path):
        self.tmp_path = tmp_path
        self.popen, self.handles = {}, []

    def start(self, name, argv):
        log = open(self.tmp_path / f"{name}.log", "w")
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                env=ENV, stdin=subprocess.DEVNULL)
        log.close()
        self.popen[name] = proc
        self.handles.append(psutil.Process(proc.pid))
        return proc

    def log(self, name, lines=40):
        with open(self.tmp_path / f"{name}.log") as f:
            return "".join(f.readlines()[-lines:])

    def kill_all(self):
        """Kills, by PID, every started process and any child of theirs still running."""
        for handle in list(self.handles):
            try:
                self.handles.extend(c for c in handle.children(recursive=True)
                                    if c not in self.handles)
            except psutil.NoSuchProcess:
                pass
        for handle in self.handles:
            try:
                handle.kill()
            except psutil.NoSuchProcess:
                pass
        for proc in self.popen.values():
            proc.wait(timeout=30)
        psutil.wait_procs(self.handles, timeout=10)

    def left_running(self):
        return clusters.alive(self.handles)


@pytest.fixture
def procs(tmp_path):
    p = Procs(tmp_path)
    yield p
    p.kill_all()


def wait_for_record(procs, name, path, exit_too=True):
    """Polls until `name` wrote the JSON record at `path` (and, if `exit_too`, exited)."""
    deadline = time.monotonic() + DEADLINE_SECS
    proc = procs.popen[name]
    while time.monotonic() < deadline:
        if os.path.exists(path) and (not exit_too or proc.poll() is not None):
            with open(path) as f:
                return json.load(f)
        if proc.poll() not in (None, 0):
            pytest.fail(f"{name} exited {proc.returncode}:\n{procs.log(name)}")
        time.sleep(0.2)
    pytest.fail(f"{name}: no record in {path} (or no exit) after {DEADLINE_SECS} s:\n"
                f"{procs.log(name)}")


def check_record(rec, task, trainer):
    assert rec["task"] == task and rec["trainer"] == trainer
    assert rec["local_steps"] > 0
    assert rec["examples_per_sec"] > 0
    assert 0 < rec["step_ms_p50"] <= rec["step_ms_p90"]
    assert rec["first_step_unix"] <= rec["last_step_unix"]


def module(name):
    return [sys.executable, "-m", f"benchmarks.{name}"]


@pytest.mark.timeout(120)
def test_classic_in_process(procs, tmp_path):
    out = tmp_path / "local.json"
    procs.start("local", module("classic") + SMALL + [f"--out_json={out}"])
    rec = wait_for_record(procs, "local", out)
    assert procs.popen["local"].returncode == 0
    check_record(rec, "local", "classic")
    assert rec["local_steps"] == 250 and rec["num_ps"] == 0
    assert not procs.left_running()


@pytest.mark.timeout(240)
def test_classic_1ps_1worker_async(procs, tmp_path):
    ps, worker = (f"127.0.0.1:{portpicker.pick_unused_port()}" for _ in range(2))
    cluster = [f"--ps_hosts={ps}", f"--worker_hosts={worker}"]
    out = tmp_path / "worker0.json"
    procs.start("ps0", module("classic") + cluster + SMALL + ["--job_name=ps"])
    procs.start("worker0", module("classic") + cluster + SMALL +
                ["--job_name=worker", "--task_index=0", f"--out_json={out}"])
    rec = wait_for_record(procs, "worker0", out)
    assert procs.popen["worker0"].returncode == 0, procs.log("worker0")
    check_record(rec, "worker0", "classic")
    assert rec["num_ps"] == 1 and rec["num_workers"] == 1 and not rec["sync"]
    # The textbook ps blocks in server.join() forever: it is still serving.
    assert procs.popen["ps0"].poll() is None
    procs.kill_all()
    assert not procs.left_running()


@pytest.mark.timeout(240)
def test_tf2_pss_1ps_1worker(procs, tmp_path):
    ps, worker, chief = (f"127.0.0.1:{portpicker.pick_unused_port()}" for _ in range(3))
    cluster = [f"--ps_hosts={ps}", f"--worker_hosts={worker}", f"--chief_host={chief}"]
    out = tmp_path / "chief.json"
    procs.start("ps0", module("tf2_pss") + cluster + SMALL + ["--job_name=ps"])
    procs.start("worker0", module("tf2_pss") + cluster + SMALL + ["--job_name=worker"])
    procs.start("chief", module("tf2_pss") + cluster + SMALL +
                ["--job_name=chief", f"--out_json={out}"])
    rec = wait_for_record(procs, "chief", out)
    assert procs.popen["chief"].returncode == 0, procs.log("chief")
    check_record(rec, "chief", "tf2_pss")
    assert rec["local_steps"] == 250 and rec["num_workers"] == 1
    for name in ("ps0", "worker0"):  # tf.distribute.Server.join() never returns
        assert procs.popen[name].poll() is None, procs.log(name)
    procs.kill_all()
    assert not procs.left_running()
