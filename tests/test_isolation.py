"""The launcher's cluster is confined to a private network namespace (lowlevel/ops/isolation.py).

While a default `python -m lowlevel.launch` run trains, a connection from this
test's namespace (the host's) to ps0's port on loopback is refused; the same connection made from inside the
launcher's namespace (`nsenter`) succeeds, so the port is really served; and
the run ends with every task exiting 0 at exactly --train_steps.
"""

import os
import re
import shutil
import socket
import subprocess
import sys
import time

import psutil
import pytest

import clusters
from lowlevel.ops import isolation

pytestmark = pytest.mark.cluster

STEPS = 3000
CONNECT = ("import socket, sys\n"
           "socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=5).close()\n")


def _connects(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=3).close()
        return True
    except OSError:
        return False


def _ps_port(launcher: psutil.Process):
    for child in launcher.children():
        try:
            cmdline = clusters.argv_of(child)
        except psutil.Error:
            continue
        if "--job_name=ps" in cmdline:
            hosts = next(a for a in cmdline if a.startswith("--ps_hosts="))
            return child.pid, int(re.search(r":(\d+)", hosts).group(1))
    return None


@pytest.mark.timeout(400)
def test_default_launch_cannot_be_reached_from_outside_and_trains(tmp_path):
    if os.geteuid() != 0 and shutil.which("nsenter") is None:
        pytest.skip("needs root and nsenter to look inside the launcher's namespace")
    out, log = tmp_path / "run", tmp_path / "launch.log"
    proc = clusters.start([sys.executable, "-m", "lowlevel.launch", f"--output_dir={out}",
                           f"--train_steps={STEPS}", "--save_checkpoint_steps=500"], log)
    try:
        deadline = time.monotonic() + 240
        while not clusters.task_events(out, "worker1", "session_ready"):
            assert proc.poll() is None, clusters.tail(log)
            assert time.monotonic() < deadline, "no session in 240 s:\n" + clusters.tail(log)
            time.sleep(0.2)
        first = open(log).readline()
        if "warning: no private network namespace" in first:
            pytest.skip(first.strip())
        assert "in a private network namespace" in first and "--no_isolation" in first, first
        found = _ps_port(psutil.Process(proc.pid))
        assert found, "no ps0 among the launcher's children"
        ps_pid, port = found
        assert isolation.namespace_id(ps_pid) != isolation.namespace_id()
        assert isolation.namespace_id(ps_pid) == isolation.namespace_id(proc.pid)
        assert not _connects(port), f"ps0's port {port} answered from the host's namespace"
        inside = subprocess.run(["nsenter", f"--net=/proc/{ps_pid}/ns/net", sys.executable,
                                 "-c", CONNECT, str(port)], capture_output=True, text=True,
                                timeout=60)
        assert inside.returncode == 0, f"not served inside the namespace: {inside.stderr}"
        assert proc.wait(300) == 0, clusters.tail(log)
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    assert "launch: all 3 tasks exited 0" in open(log).read()
    assert clusters.final_metrics(out)["global_step"] == STEPS


@pytest.mark.timeout(300)
def test_no_isolation_runs_on_the_hosts_network(tmp_path):
    out = tmp_path / "run"
    run = clusters.run([sys.executable, "-m", "lowlevel.launch", f"--output_dir={out}",
                        "--train_steps=200", "--no_isolation", "--num_workers=1"], timeout=240)
    assert run.returncode == 0, run.stdout[-3000:]
    first = run.stdout.splitlines()[0]
    assert "on localhost; output in" in first and "namespace" not in first, first
