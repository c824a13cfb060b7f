"""`python -m benchmarks.throughput` end to end on a tiny model: records, ratios, files, no
process left behind.

The harness runs as a real process; every process it starts (and their children) must
be gone when it exits, which the test checks with psutil by PID.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import psutil
import pytest

import clusters

pytestmark = pytest.mark.cluster  # every test here starts trainer processes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REQUIRED = ("name", "mode", "num_ps", "num_workers", "sync", "params", "batch_size",
            "examples_per_sec", "step_ms_p50", "step_ms_p90", "bytes_per_step",
            "bytes_per_step_analytic", "peak_rss_mb", "startup_secs", "shutdown_secs")
RATIOS = ("lowlevel_1ps1w_over_local", "lowlevel_1ps1w_over_local_exact",
          "lowlevel_over_tf2_pss", "lowlevel_over_tf2_pss_exact", "sync_over_async",
          "ps_byte_imbalance")


@pytest.mark.timeout(240)
def test_tiny_run(tmp_path):
    out = tmp_path / "bench"
    argv = [sys.executable, "-m", "benchmarks.throughput", f"--out={out}",
            "--configs=local,lowlevel_1ps1w", "--hidden_units=32,32", "--repeats=1",
            # 1,000 steps: at ~700 steps/s a window of ~1.4 s, several of the byte
            # watcher's 0.25 s samples (100 steps, ~0.15 s, at times held none)
            "--measure_secs=1", "--min_steps=1000", "--warmup_steps=20", "--sweep_widths=",
            "--noaccuracy", "--noplacement", "--run_timeout_secs=120"]
    returncode, output, seen, _ = clusters.run_watched(argv)  # every process it starts
    assert returncode == 0, output

    result = json.loads((out / "results.json").read_text())
    assert {"meta", "records", "runs", "ratios", "targets"} <= set(result)
    ran = [r for r in result["records"] if r["runs"]]
    assert {(r["name"], r["mode"]) for r in ran} >= {("local", "n/a"),
                                                     ("lowlevel_1ps1w", "exact")}
    for rec in result["records"]:
        assert set(REQUIRED) <= set(rec), rec
    for rec in ran:
        assert rec["batch_size"] == 128 and rec["params"] == 784 * 32 + 32 + 32 * 32 + 32 + 330
        assert rec["examples_per_sec"] > 0
        assert 0 < rec["step_ms_p50"] <= rec["step_ms_p90"]
        assert 50 < rec["peak_rss_mb"] < 8000
        assert 0 < rec["startup_secs"] < 120
        assert 0 <= rec["shutdown_secs"] < 60
    dist = next(r for r in ran if r["name"] == "lowlevel_1ps1w")
    assert dist["num_ps"] == 1 and dist["num_workers"] == 1 and not dist["sync"]
    # Measured bytes: at least the analytic 2 x 4 bytes x parameters, and not wildly more.
    assert 0.9 * dist["bytes_per_step_analytic"] < dist["bytes_per_step"] < \
        3 * dist["bytes_per_step_analytic"]
    assert set(dist["peak_rss_mb_by_task"]) == {"ps0", "worker0"}
    assert set(RATIOS) <= set(result["ratios"])
    assert result["ratios"]["lowlevel_1ps1w_over_local_exact"] > 0
    assert all(t["status"] in ("PASS", "FAIL", "SKIP") for t in result["targets"].values())
    comm = [r for r in result["records"] if r["mode"] == "comm_reduced"]
    if any(r["skipped"] for r in comm):  # the runtime has no --communication_period yet
        assert "comm_reduced: skipped" in output
    assert (out / "results.md").read_text().count("| lowlevel_1ps1w |") >= 1
    png = (out / "throughput.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    assert "PASS" in output or "FAIL" in output

    left = clusters.alive(seen)
    assert not left, f"processes left running: {left}"


@pytest.mark.timeout(60)
def test_bad_config_is_one_line():
    proc = subprocess.run([sys.executable, "-m", "benchmarks.throughput", "--configs=nope"],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode != 0
    assert "--configs: unknown ['nope']" in proc.stderr



@pytest.mark.timeout(240)
def test_a_killed_benchmark_takes_its_processes_with_it(tmp_path):
    """SIGKILL leaves the harness no chance to stop anything: the processes it started must
    end by themselves (PR_SET_PDEATHSIG, `lowlevel/ops/lifetime.py`). The textbook trainer's ps
    never exits on its own, so it is the case that matters."""
    argv = [sys.executable, "-m", "benchmarks.throughput", f"--out={tmp_path / 'bench'}",
            "--configs=classic_1ps1w", "--hidden_units=32,32", "--repeats=1",
            "--measure_secs=60", "--min_steps=20000", "--sweep_widths=", "--noaccuracy",
            "--noplacement", "--run_timeout_secs=200"]
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    seen = set()
    try:
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and proc.poll() is None:
            seen.update(clusters.descendants(proc.pid))
            started = [p for p in seen if p.is_running() and
                       "benchmarks.classic" in " ".join(_cmdline(p))]
            if len(started) >= 2:  # its ps and its worker
                break
            time.sleep(0.2)
        else:
            pytest.fail("the classic trainer's ps and worker never both ran")
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 30
        while clusters.alive(seen) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = clusters.alive(seen)
        assert not left, f"processes outlived the killed harness: {left}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for p in seen:
            try:
                p.kill()
            except psutil.Error:
                pass


def _cmdline(p) -> list:
    try:
        return p.cmdline()
    except psutil.Error:
        return []
