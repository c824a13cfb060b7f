"""benchmarks/_report.py: the ratio and target arithmetic, on hand-made runs (no processes)."""

import pytest

from benchmarks import _report


def _run(name, mode, rnd, eps, part="main", ok=True):
    return {"part": part, "name": name, "mode": mode, "round": rnd, "ok": ok,
            "examples_per_sec": eps}


def test_a_ratio_is_the_median_of_within_round_ratios_not_a_ratio_of_medians():
    pairs = [(40.0, 50.0), (100.0, 60.0), (50.0, 100.0)]  # per round: 0.8, 1.667, 0.5
    runs = [r for rnd, (a, b) in enumerate(pairs) for r in (
        _run("lowlevel_1ps1w", "comm_reduced", rnd, a), _run("local", "n/a", rnd, b))]
    ratios = _report.ratios(runs, [], None)
    assert ratios["lowlevel_1ps1w_over_local"] == pytest.approx(0.8)  # not 50 / 60 = 0.833
    assert ratios["lowlevel_1ps1w_over_local_exact"] is None  # no exact run


def test_a_ratio_pairs_only_runs_of_the_same_round_and_skips_failed_ones():
    runs = [_run("lowlevel_1ps2w", "exact", 0, 50.0), _run("tf2_pss_1ps2w", "n/a", 1, 25.0),
            _run("lowlevel_1ps2w", "exact", 1, 60.0),
            _run("tf2_pss_1ps2w", "n/a", 0, 10.0, ok=False)]
    ratios = _report.ratios(runs, [], None)
    assert ratios["lowlevel_over_tf2_pss_exact"] == pytest.approx(2.4)  # round 1 only
    assert ratios["lowlevel_1ps1w_over_local"] is None  # neither side ran


def test_sync_over_async_falls_back_to_exact_sync_when_comm_reduced_sync_did_not_run():
    runs = [_run("lowlevel_1ps2w_sync", "exact", 0, 45.0),
            _run("lowlevel_1ps2w", "comm_reduced", 0, 50.0)]
    assert _report.ratios(runs, [], None)["sync_over_async"] == pytest.approx(0.9)
    runs.append(_run("lowlevel_1ps2w_sync", "comm_reduced", 0, 55.0))
    assert _report.ratios(runs, [], None)["sync_over_async"] == pytest.approx(1.1)


def test_imbalance_is_the_largest_share_over_the_mean():
    assert _report.imbalance({"ps0": 0.5, "ps1": 0.5}) == 1.0
    assert _report.imbalance({"ps0": 0.6, "ps1": 0.4}) == pytest.approx(1.2)
    assert _report.imbalance(None) is None


def test_targets_pass_fail_and_skip_at_their_bounds():
    ratio = {"lowlevel_1ps1w_over_local": 0.8, "lowlevel_over_tf2_pss": 1.99,
             "ps_byte_imbalance_mlp": 1.1, "ps_byte_imbalance_cnn": 1.2}
    records = [{"part": "main", "name": "lowlevel_1ps2w", "mode": "exact",
                "startup_secs": 15.0, "shutdown_secs": 5.01}]
    out = _report.targets(ratio, records, {"drop": 0.004})
    assert out["lowlevel_1ps1w_over_local"]["status"] == "PASS"  # >= bound, at the bound
    assert out["lowlevel_over_tf2_pss"]["status"] == "FAIL"
    assert out["ps_byte_imbalance_mlp"]["status"] == "PASS"  # <= bound, at the bound
    assert out["ps_byte_imbalance_cnn"]["status"] == "FAIL"
    assert out["startup_secs_lowlevel_1ps2w_exact"]["status"] == "PASS"
    assert out["shutdown_secs_lowlevel_1ps2w_exact"]["status"] == "FAIL"
    assert out["startup_secs_lowlevel_1ps2w"]["status"] == "SKIP"  # comm_reduced not run
    assert out["accuracy_drop_comm_reduced"] == {"value": 0.004, "op": "<=", "bound": 0.01,
                                                 "status": "PASS"}
    assert set(out) == set(_report.TARGETS)


def test_the_sides_of_each_ratio_run_back_to_back_in_either_order():
    import random

    from benchmarks import _configs, throughput

    cfgs = _configs.selected(_configs.MAIN, list(_configs.MODES), (512, 512),
                             throughput.QUICK["configs"], "main")
    headline = [c for c in cfgs if c.key in throughput.QUICK["headline"]]
    pairs = [("lowlevel_1ps1w:comm_reduced", "local:n/a"), ("lowlevel_1ps1w:exact", "local:n/a"),
             ("lowlevel_1ps2w_sync:exact", "lowlevel_1ps2w:exact"),
             ("lowlevel_1ps2w_sync:comm_reduced", "lowlevel_1ps2w:comm_reduced"),
             ("lowlevel_1ps2w:comm_reduced", "tf2_pss_1ps2w:n/a"),
             ("lowlevel_1ps2w:exact", "tf2_pss_1ps2w:n/a")]
    seen_first, orders = set(), set()
    for seed in range(40):
        for round_cfgs in (cfgs, headline):  # round 0, and a headline round
            order = [c.key for c in _configs.paired_order(round_cfgs, random.Random(seed))]
            assert sorted(order) == sorted(c.key for c in round_cfgs)  # each once, none lost
            for a, b in pairs:
                if a in order and b in order:
                    assert abs(order.index(a) - order.index(b)) == 1, (a, b, order)
                    seen_first.add(a if order.index(a) < order.index(b) else b)
            orders.add(tuple(order))
    assert seen_first == {k for pair in pairs for k in pair}  # either side first
    assert len(orders) > 10  # still shuffled
