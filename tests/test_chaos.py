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
