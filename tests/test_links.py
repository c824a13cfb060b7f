"""The link benchmark (`python -m benchmarks.throughput --link=...`): rates, token-bucket
settings, the link counters' arithmetic, the ratios and targets (fast, pure), and one tiny
real run behind a 20 Mbit/s link that must not carry more than that and must leave no
namespace and no process behind.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import psutil
import pytest

import clusters
from benchmarks import _configs, _linkbench, _links
from lowlevel.testing import netns

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("text,bits", [("1gbit", 10**9), ("10gbit", 10**10),
                                       ("100mbit", 10**8), ("100Mbit", 10**8),
                                       ("2.5gbit", 2_500_000_000), ("500kbit", 500_000)])
def test_rates_are_read_as_tc_writes_them(text, bits):
    assert _links.parse_rate(text) == bits


@pytest.mark.parametrize("text", ["1gbps", "1g", "gbit", "-1gbit", "", "50kbit"])
def test_a_bad_rate_is_one_line_naming_it_and_what_is_expected(text):
    with pytest.raises(ValueError) as e:
        _links.parse_rate(text)
    assert repr(text) in str(e.value) and "\n" not in str(e.value)


def test_rates_are_written_in_the_largest_whole_unit():
    assert [_links.format_rate(b) for b in (10**10, 10**9, 10**8, 2_500_000_000, 1500)] == \
        ["10gbit", "1gbit", "100mbit", "2500mbit", "1500bit"]


def test_token_bucket_holds_a_gso_segment_or_1_ms_and_queues_20_ms():
    slow, fast = _links.tbf_settings(10**8), _links.tbf_settings(10**10)
    assert slow["burst"] == 64 * 1024  # 1 ms at 100 Mbit/s is only 12.5 kB
    assert fast["burst"] == 1_250_000  # 1 ms at 10 Gbit/s
    assert slow["limit"] == 250_000 + 64 * 1024 and fast["limit"] == 25_000_000 + 1_250_000


def test_link_rates_mean_and_busiest_second():
    # 2 s of samples every 0.5 s: 1 MB/s out, except 2 MB between t=1.0 and t=1.5
    sent = [0, 500_000, 1_000_000, 3_000_000, 3_500_000]
    samples = [(100 + 0.5 * i, {"ps0": (s, 10 * i)}) for i, s in enumerate(sent)]
    rates = _links.link_rates(samples, "ps0", 100.0, 102.0)
    assert rates["sent_bits_per_sec"] == 3_500_000 * 8 / 2
    assert rates["received_bits_per_sec"] == 40 * 8 / 2
    assert rates["peak_bits_per_sec"] == 2_500_000 * 8  # t=0.5..1.5 and t=1.0..2.0
    assert _links.link_rates(samples, "ps0", 101.9, 103) is None  # one sample inside
    assert _links.link_rates(samples, "worker0", 100, 102) is None


def _run(rnd, link, name, mode, eps, ok=True):
    return {"round": rnd, "link": link, "name": name, "mode": mode, "ok": ok,
            "examples_per_sec": eps}


def test_ratios_pair_runs_of_one_round_and_local_at_every_rate():
    runs = [_run(0, "none", "local", "n/a", 10_000),
            _run(0, "1gbit", "lowlevel_1ps1w", "comm_reduced", 9_000),
            _run(0, "1gbit", "tf2_pss_1ps1w", "n/a", 2_000),
            _run(0, "100mbit", "lowlevel_1ps1w", "exact", 300),
            _run(0, "100mbit", "classic_1ps1w", "n/a", 310),
            _run(1, "none", "local", "n/a", 5_000),  # a slow round: its own pairs
            _run(1, "1gbit", "lowlevel_1ps1w", "comm_reduced", 4_000),
            _run(1, "1gbit", "tf2_pss_1ps1w", "n/a", 1_000, ok=False),
            _run(2, "1gbit", "lowlevel_1ps1w", "comm_reduced", 1)]  # no local in round 2
    r = _linkbench.ratios(runs)
    assert r["comm_reduced_over_local@1gbit"] == pytest.approx((0.9 + 0.8) / 2)
    assert r["comm_reduced_over_tf2_pss@1gbit"] == 4.5  # round 1's tf2_pss failed
    assert r["exact_over_classic@100mbit"] == pytest.approx(300 / 310, abs=1e-3)
    assert "exact_over_classic@1gbit" not in r
    t = _linkbench.targets(r)
    assert t["comm_reduced_over_local@1gbit"]["status"] == "PASS"
    assert t["comm_reduced_over_tf2_pss@1gbit"]["status"] == "PASS"
    assert t["exact_over_classic@100mbit"]["status"] == "PASS"  # 0.968: a tie
    assert t["exact_over_classic@10gbit"]["status"] == "SKIP"


def test_targets_at_their_bounds_and_rates_written_otherwise():
    t = _linkbench.targets({"exact_over_classic@10000mbit": 1.19,
                            "exact_over_classic@100mbit": 0.95,
                            "comm_reduced_over_local@1000mbit": 0.8})
    assert t["exact_over_classic@10gbit"]["status"] == "FAIL"
    assert t["exact_over_classic@100mbit"]["status"] == "PASS"
    assert t["comm_reduced_over_local@1gbit"]["status"] == "PASS"


def test_steps_follow_the_link_cap_when_it_is_lower_than_the_prior():
    exact = _configs.parse_config("lowlevel_1ps1w", (512, 512), "exact")
    reduced = _configs.parse_config("lowlevel_1ps1w", (512, 512), "comm_reduced")
    # both ways, one after the other; exact with 1 ps: the dense layers' products on the ps
    wire = _configs.analytic_bytes(exact, 1, 128) * _linkbench.OVERHEAD
    assert wire < 8 * _configs.REF_PARAMS * _linkbench.OVERHEAD / 2
    assert _linkbench.expected_steps_per_sec(exact, 10**8, 16, 128) == pytest.approx(
        10**8 / 8 / wire)
    assert _linkbench.expected_steps_per_sec(exact, 10**10, 16, 128) == \
        _configs.PRIOR_STEPS_PER_SEC["lowlevel"]
    assert _linkbench.expected_steps_per_sec(reduced, 10**9, 16, 128) == \
        _configs.PRIOR_STEPS_PER_SEC["comm_reduced"]
    assert _linkbench.plan(2.0, 1.0, 5.0, 100) == (10, 20)  # at least 10 and 20 steps
    assert _linkbench.plan(300.0, 1.0, 5.0, 100) == (100, 1500)


def _hosts_of(pid: int) -> list:
    """Namespaces and links left by the `netns.Hosts` of process `pid` (tag: pid, 2 digits)."""
    mine = re.compile(rf"^{netns.PREFIX}{pid % 10000}\d\d(h\d+[io]?|br)$")
    return [n for n in netns.leftovers() if mine.match(n)]


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_a_tiny_run_behind_a_20mbit_link_stays_under_it_and_leaves_nothing(tmp_path):
    reason = netns.unavailable()
    if reason:
        pytest.skip(reason)
    out = tmp_path / "links"
    argv = [sys.executable, "-m", "benchmarks.throughput", "--link=20mbit", f"--out={out}",
            "--configs=lowlevel_1ps1w:exact", "--hidden_units=64,64", "--repeats=1",
            "--measure_secs=4", "--warmup_secs=1", "--run_timeout_secs=200"]
    # SIGTERM if interrupted: the harness removes its namespaces on the way out
    returncode, output, seen, pid = clusters.run_watched(argv, stop=lambda p: p.terminate())
    assert returncode == 0, output[-3000:]
    assert not _hosts_of(pid)
    assert seen and not clusters.alive(seen)
    result = json.loads((out / "results.json").read_text())
    (run,) = result["runs"]
    assert run["ok"] and run["link"] == "20mbit", run.get("error")
    hosts = run["link_stats"]["hosts"]
    assert set(hosts) == {"ps0", "worker0"}
    rate = 20_000_000
    for host, r in hosts.items():
        # tbf let through no more than the rate each way (10 % for the sampling)
        assert r["sent_bits_per_sec"] <= rate * 1.1 and r["received_bits_per_sec"] <= \
            rate * 1.1, (host, r)
        assert r["peak_bits_per_sec"] <= rate * 1.15, (host, r)
    # ... and the link was what limited the run: it was busy most of the time (each step
    # sends 0.22 MB each way, one after the other: at most half of the time per way)
    assert run["link_stats"]["utilisation"] >= 0.25, run["link_stats"]
    assert run["bytes_per_step"] >= 8 * _configs.mlp_params((64, 64))
    assert (out / "results.md").read_text().count("20mbit") >= 1
    assert (out / "links.png").stat().st_size > 0


def _cmdline(proc) -> str:
    try:
        return " ".join(proc.cmdline())
    except psutil.Error:
        return ""


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_sigterm_mid_run_removes_the_namespaces_and_ends_every_task(tmp_path):
    reason = netns.unavailable()
    if reason:
        pytest.skip(reason)
    argv = [sys.executable, "-m", "benchmarks.throughput", "--link=100mbit",
            f"--out={tmp_path / 'links'}", "--configs=classic_1ps1w", "--hidden_units=64,64",
            "--repeats=1", "--run_timeout_secs=200"]
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    seen = set()
    try:
        deadline = time.monotonic() + 120
        # until the tasks run on their hosts (both the ps and the worker started)
        while time.monotonic() < deadline and proc.poll() is None and not (
                len([p for p in clusters.descendants(proc.pid) if "benchmarks.classic" in
                     _cmdline(p)]) >= 2 and _hosts_of(proc.pid)):
            seen.update(clusters.descendants(proc.pid))
            time.sleep(0.2)
        seen.update(clusters.descendants(proc.pid))
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        proc.terminate()
        output = proc.communicate(timeout=60)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, output[-3000:]
    assert "interrupted (SIGTERM)" in output
    assert not _hosts_of(proc.pid)
    assert len(seen) >= 2 and not clusters.alive(seen)


def test_a_link_that_cannot_be_limited_fails_the_run_in_one_line_and_leaves_nothing():
    reason = netns.unavailable()
    if reason:
        pytest.skip(reason)
    from benchmarks import _link_runners
    run = _link_runners.OnHosts(0).run_classic(1, 1, [], "/nonexistent", 10, 128)
    assert run["ok"] is False
    assert run["error"].startswith("cannot limit the links: tc ") and "\n" not in run["error"]
    assert not _hosts_of(os.getpid())
