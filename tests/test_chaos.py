"""benchmarks/chaos.py: a short soak injects real faults and every one is survived."""

import json
import subprocess
import sys

import psutil
import pytest

import clusters

pytestmark = pytest.mark.cluster  # every test here starts trainer processes


@pytest.mark.timeout(240)
def test_a_short_chaos_soak_survives_its_faults(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.chaos", "--duration_secs=25", "--segment_steps=4000",
         "--mean_fault_interval_secs=3", "--seed=1", f"--out={tmp_path}"],
        cwd=clusters.ROOT, env=clusters.ENV, capture_output=True, text=True, timeout=220)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    report = json.loads((tmp_path / "chaos.json").read_text())
    assert report["faults"] and all(f["survived"] for f in report["faults"])
    assert all(f["recovery_secs"] is not None for f in report["faults"])
    assert report["final_accuracy"] >= 0.9
    assert "| fault | injected | survived |" in result.stdout
    leftovers = [p for p in psutil.process_iter(["cmdline"])
                 if any(str(tmp_path) in a for a in (p.info["cmdline"] or []))]
    assert not leftovers


@pytest.mark.timeout(300)
def test_a_short_network_chaos_soak_survives_its_freezes_and_cuts(tmp_path):
    """--network with short limits (3 s deadline, 10 s outage): freezes and link cuts
    shorter and longer than them, each task on its own namespace host; every task the
    faults stop exits 200 and is restarted, and the run ends exact with no process left."""
    from lowlevel.testing import netns
    if netns.unavailable():
        pytest.skip(netns.unavailable())
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.chaos", "--network", "--duration_secs=40",
         "--step_timeout_secs=3", "--fault_timeout_secs=10", "--mean_fault_interval_secs=3",
         "--long_fault_fraction=0.5", "--segment_steps=4000", "--seed=1", f"--out={tmp_path}"],
        cwd=clusters.ROOT, env=clusters.ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    try:
        stdout, stderr = proc.communicate(timeout=280)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stdout[-4000:] + stderr[-2000:]
    report = json.loads((tmp_path / "chaos.json").read_text())
    assert report["faults"] and all(f["survived"] for f in report["faults"])
    # every task a fault stopped exited 200 (or 0: its part done), none another status
    assert all(f["documented"] for f in report["faults"])
    assert all(e["status"] in (0, 200) for f in report["faults"] for e in f["exits"])
    assert any(f["long"] for f in report["faults"])  # one outlasted the limits at least
    assert all(s["ok"] for s in report["segments"])
    assert report["leftover_processes"] == []
    assert "| task exits (200) |" in stdout
    # its namespaces are named after its pid (netns.Hosts); all of them removed
    assert not [n for n in netns.leftovers() if n.startswith(f"{netns.PREFIX}{proc.pid % 10000}")]
    leftovers = [p for p in psutil.process_iter(["cmdline"])
                 if any(str(tmp_path) in a for a in (p.info["cmdline"] or []))]
    assert not leftovers
