"""The sparse suite of `benchmarks.throughput`: its arithmetic (fast) and a tiny real run."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import clusters
from benchmarks import sparse

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_unique_per_batch_counts_distinct_ids_of_each_column():
    ids = np.stack([np.zeros(64, np.int64),  # one id: 1 per batch
                    np.arange(64, dtype=np.int64),  # all distinct: batch size
                    np.arange(64, dtype=np.int64) % 4], axis=1)  # 4 ids, 16 of each
    got = sparse.unique_per_batch(ids, batch_size=16, num_batches=40)
    assert got[0] == 1 and got[1] == 16
    assert 2.0 < got[2] <= 4.0  # 16 draws of 4 values: almost always all 4
    with pytest.raises(ValueError, match="fewer than one batch"):
        sparse.unique_per_batch(ids[:8], batch_size=16)


def test_dense_params_of_the_wide_deep_model():
    # wide unit 13 + 1; MLP (13 + 26 x 16) -> 128 -> 128 -> 1
    assert sparse.dense_params(13, 26, 16, (128, 128)) == 14 + 429 * 128 + 128 + \
        128 * 128 + 128 + 128 + 1


def test_limit_counts_each_unique_row_both_ways_and_the_dense_part_once():
    lim = sparse.limit_bytes([10, 2], [5], embedding_dim=16, dense=1000)
    # 12 field ids x (16 deep + 1 wide) floats + 5 cross floats, x 4 bytes x 2 ways
    assert lim["sparse"] == (12 * 17 + 5) * 8
    assert lim["dense"] == 8000
    assert lim["total"] == lim["sparse"] + lim["dense"]


def test_limit_of_synthetic_ctr_does_not_grow_with_the_table():
    """The limit follows the unique rows a batch touches, not the table size (the issue's point)."""
    small = sparse.limit(sparse.Settings(vocab_size=1_000_000))
    big = sparse.limit(sparse.Settings(vocab_size=10_000_000))
    assert big["table_bytes"] == 10 * small["table_bytes"]
    assert 0.9 < big["total"] / small["total"] < 1.25
    assert big["unique_ids_per_batch"] < big["ids_per_batch"]  # Zipf: repeated ids


def test_imbalance_is_max_over_mean():
    assert sparse.imbalance({"ps0": 300, "ps1": 100}) == 1.5
    assert sparse.imbalance({"ps0": 5, "ps1": 5}) == 1.0
    assert sparse.imbalance({}) is None and sparse.imbalance(None) is None
    assert sparse.imbalance({"ps0": 0, "ps1": 0}) is None


def _run(trainer, rnd, eps, bytes_per_step=None, imbalance=None):
    return {"trainer": trainer, "round": rnd, "ok": True, "examples_per_sec": eps,
            "bytes_per_step": bytes_per_step, "imbalance": imbalance}


def test_ratios_are_medians_of_within_round_ratios_and_targets_judge_them():
    runs = [_run("lowlevel", 0, 400, 1100, 1.05), _run("classic", 0, 100), _run("tf2_pss", 0, 300),
            _run("lowlevel", 1, 200, 1300, 1.2), _run("classic", 1, 100), _run("tf2_pss", 1, 50),
            _run("lowlevel", 2, 300, 1000, 1.0), _run("classic", 2, 200)]
    got = sparse.ratios(runs, {"total": 1000})
    assert got["sparse_lowlevel_over_classic"] == 2.0  # 4, 2, 1.5
    assert got["sparse_lowlevel_over_tf2_pss"] == 2.667  # 1.33, 4: two rounds had tf2_pss
    assert got["sparse_bytes_over_limit"] == 1.1
    assert got["sparse_ps_byte_imbalance"] == 1.05
    assert got["sparse_ps_rss_over_budget"] is None  # no run measured a ps's state
    status = {k: t["status"] for k, t in sparse.targets(got).items()}
    assert status == {"sparse_bytes_over_limit": "PASS", "sparse_lowlevel_over_classic": "PASS",
                      "sparse_lowlevel_over_tf2_pss": "PASS", "sparse_ps_byte_imbalance": "PASS",
                      "sparse_ps_rss_over_budget": "SKIP",
                      # no dynamic run: its two targets are not judged
                      "sparse_dynamic_over_static": "SKIP", "sparse_dynamic_auc_gap": "SKIP"}
    failed = sparse.targets(dict(got, sparse_bytes_over_limit=1.3,
                                 sparse_lowlevel_over_classic=None))
    assert failed["sparse_bytes_over_limit"]["status"] == "FAIL"
    assert failed["sparse_lowlevel_over_classic"]["status"] == "SKIP"


def test_dynamic_tables_are_judged_by_examples_per_sec_and_test_auc_against_static_ones():
    runs = [dict(_run("lowlevel", 0, 400), auc=0.800), dict(_run("lowlevel_dynamic", 0, 300), auc=0.803),
            dict(_run("lowlevel", 1, 200), auc=0.790), dict(_run("lowlevel_dynamic", 1, 180), auc=0.799)]
    got = sparse.ratios(runs, {"total": 1000})
    assert got["sparse_dynamic_over_static"] == 0.825  # 0.75, 0.9
    assert got["sparse_dynamic_auc_gap"] == 0.006  # 0.003, 0.009
    judged = sparse.targets(got)
    assert judged["sparse_dynamic_over_static"]["status"] == "PASS"
    assert judged["sparse_dynamic_auc_gap"]["status"] == "FAIL"
    assert sparse._trainers(["lowlevel_dynamic", "lowlevel"]) == ("lowlevel_dynamic", "lowlevel")
    with pytest.raises(ValueError, match="unknown dynamic; choose from lowlevel, "):
        sparse._trainers(["lowlevel", "dynamic"])


def test_ps_memory_target_is_peak_rss_over_half_a_gib_plus_1_25_times_the_state():
    mib = 2**20
    state = {"ps0": 648 * mib, "ps1": 600 * mib}
    # ps0's budget: 512 + 1.25 x 648 = 1322 MiB; the worst ps counts
    assert sparse.rss_over_budget({"ps0": 1322.0, "ps1": 100.0, "worker0": 9000.0},
                                  state) == 1.0
    assert sparse.rss_over_budget({"ps0": 2371.0, "ps1": 1000.0}, state) == 1.793
    assert sparse.rss_over_state({"ps0": 1296.0, "ps1": 600.0}, state) == 2.0
    assert sparse.rss_over_budget({"ps0": 1000.0}, {}) is None
    runs = [dict(_run("lowlevel", 0, 400, 1100, 1.05), peak_rss_mb={"ps0": 1400.0, "ps1": 900.0},
                 ps_state_bytes=state)]
    got = sparse.ratios(runs, {"total": 1000})
    assert got["sparse_ps_rss_over_budget"] == 1.059
    assert sparse.targets(got)["sparse_ps_rss_over_budget"]["status"] == "FAIL"
    record = sparse.aggregate(runs)[0]
    assert record["ps_state_bytes"] == state and record["ps_rss_over_state"] == 2.16


def test_ps_state_bytes_counts_the_variables_placed_on_each_ps(tmp_path):
    node = ('\nnode {{\n  name: "{name}"\n  op: "{op}"\n  device: "{device}"\n  attr {{\n'
            '    key: "dtype"\n    value {{\n      type: {dtype}\n    }}\n  }}\n  attr {{\n'
            '    key: "shape"\n    value {{\n      shape {{\n{dims}      }}\n    }}\n  }}\n}}')

    def var(name, device, dims, dtype="DT_FLOAT", op="VarHandleOp"):
        sizes = "".join(f"        dim {{\n          size: {d}\n        }}\n" for d in dims)
        return node.format(name=name, op=op, device=device, dtype=dtype, dims=sizes)
    graph = tmp_path / "graph.pbtxt"
    graph.write_text("".join([
        var("t/part_0", "/job:ps/task:0/device:CPU:0", [1000, 16]),
        var("t/part_0/Adagrad", "/job:ps/task:0/device:CPU:0", [1000, 16]),
        var("t/part_1", "/job:ps/task:1/device:CPU:0", [500, 16]),
        var("global_step", "/job:ps/task:1/device:CPU:0", [], dtype="DT_INT64"),
        var("local", "/job:worker/task:0/device:CPU:0", [10**6]),
        var("x", "/job:ps/task:0/device:CPU:0", [3], op="Identity")]))
    assert sparse.ps_state_bytes(str(graph)) == {"ps0": 2 * 1000 * 16 * 4,
                                                 "ps1": 500 * 16 * 4 + 8}
    assert sparse.ps_state_bytes(str(tmp_path / "missing.pbtxt")) == {}


def test_a_timed_out_trainer_is_reported_as_a_timeout():
    runs = [_run("lowlevel", 0, 400, 1100, 1.05),
            {"trainer": "classic", "round": 0, "ok": False, "timeout": True,
             "error": "workers still running after 420 s"}]
    records = {r["trainer"]: r for r in sparse.aggregate(runs)}
    assert records["classic"]["timeout"] and not records["classic"]["ok"]
    assert records["tf2_pss"]["runs"] == 0
    lim = {"total": 1000, "sparse": 400, "dense": 600, "unique_ids_per_batch": 10,
           "ids_per_batch": 20, "table_bytes": 2**20}
    text = sparse.markdown({"settings": dataclasses.asdict(sparse.Settings()), "limit": lim, "records": list(records.values()), "wall_secs": 1.0,
                            "targets": sparse.targets(sparse.ratios(runs, lim))})
    assert "| classic | timeout: workers still running after 420 s" in text
    assert "| sparse_lowlevel_over_classic | - | >= 2 | SKIP |" in text


@pytest.mark.cluster
@pytest.mark.timeout(900)
def test_tiny_sparse_suite(tmp_path):
    """The three trainers on a small table, a few steps each: every figure is in the report."""
    out = tmp_path / "bench"
    argv = [sys.executable, "-m", "benchmarks.throughput", "--suite=sparse", f"--out={out}",
            # 100 steps: the byte counters are sampled every 0.1 s, and 20 steps of
            # the fastest trainer (~0.15 s) once held fewer than two samples.
            "--sparse_vocab_size=20000", "--sparse_steps=100", "--sparse_warmup_steps=5",
            "--sparse_timeout_secs=240",
            # rows per shard for 20,000 ids + 10,000 buckets, not the default million
            "--sparse_dynamic_capacity=40000"]
    returncode, output, seen, _ = clusters.run_watched(argv)  # every process it starts
    assert returncode == 0, output[-5000:]
    result = json.loads((out / "results.json").read_text())
    sp = result["sparse"]
    assert sp["settings"]["vocab_size"] == 20000 and sp["settings"]["num_ps"] == 2
    assert 0 < sp["limit"]["sparse"] < sp["limit"]["total"]
    records = {r["trainer"]: r for r in sp["records"]}
    assert set(records) == {"lowlevel", "lowlevel_dynamic", "classic", "tf2_pss"}
    for name, rec in records.items():
        assert rec["ok"] == 1, (name, rec.get("error"))
        assert rec["examples_per_sec"] > 0
        assert rec["bytes_per_step"] > sp["limit"]["dense"]  # at least the dense part moves
        assert set(rec["bytes_by_ps"]) == {"ps0", "ps1"}
        assert rec["imbalance"] >= 1.0
        tasks = {"ps0", "ps1", "worker0", "worker1"} | ({"chief"} if name == "tf2_pss" else set())
        assert set(rec["peak_rss_mb"]) == tasks
        assert all(50 < mb < 8000 for mb in rec["peak_rss_mb"].values())
        memory = rec["memory"]  # each run in a cgroup of its own, 85 % of the machine
        assert memory["limit_bytes"] > 0 and memory["oom_kills"] == 0, (name, memory)
        assert 0 < memory["peak_bytes"] <= memory["limit_bytes"], (name, memory)
    rows = records["lowlevel_dynamic"]["dynamic_rows"]  # live rows per shard, from its metrics
    assert len(rows) == 4 and all(n > 0 for n in rows.values()), rows
    assert set(records["lowlevel"]["ps_state_bytes"]) == {"ps0", "ps1"}
    assert all(b > 0 for b in records["lowlevel"]["ps_state_bytes"].values())
    assert result["targets"]["sparse_ps_rss_over_budget"]["value"] is not None
    assert set(sparse.TARGETS) <= set(result["targets"])
    assert not any(k.startswith("lowlevel_1ps1w") for k in result["targets"])  # dense: not run
    assert sp["ratios"]["sparse_dynamic_over_static"] > 0
    md = (out / "results.md").read_text()
    assert "## Sparse" in md and "| lowlevel |" in md and "sparse_ps_byte_imbalance" in md
    assert "| lowlevel_dynamic |" in md and "run's memory limit" in md
    left = clusters.alive(seen)
    assert not left, f"processes left running: {left}"


@pytest.mark.timeout(120)
def test_a_run_that_does_not_fit_is_killed_in_its_cgroup_and_said_so():
    """`_memory.limited`: a child allocating past the run's limit is killed there (not
    the suite), the box says so with the peak, and this process and cgroup are back."""
    from benchmarks import _memory
    from lowlevel.ops import memory_limits, resources
    if resources.own_cgroup("memory") is None:
        pytest.skip("no memory cgroup hierarchy here")
    before = open("/proc/self/cgroup").read()
    grow = "x = []\nwhile True:\n    x.append(bytearray(16 << 20))"
    try:
        with _memory.limited(200 << 20) as box:
            # a bystander that would wait forever (a textbook worker whose ps died) ...
            waiter = subprocess.Popen(_memory.join_argv(["sleep", "600"]))
            argv = _memory.join_argv([sys.executable, "-c", grow])
            proc = subprocess.run(argv, timeout=60, check=False)
            # ... ends within a poll of the kill, not at the run's timeout
            assert waiter.wait(timeout=10) == -9
    except memory_limits.MemoryLimitError as e:
        pytest.skip(str(e))
    assert proc.returncode == -9  # SIGKILL: the kernel's, within the run's cgroup
    assert box.oom_kills >= 1 and box.peak_bytes >= 150 << 20, box
    assert box.words().startswith("did not fit in 200 MiB: out of memory"), box.words()
    assert open("/proc/self/cgroup").read() == before  # this process never moved
    assert _memory.join_argv(["x"]) == ["x"]  # outside a block: unchanged
    assert box.cgroup.startswith(resources.own_cgroup("memory")[0])
    assert not os.path.exists(box.cgroup)  # removed
    with _memory.limited(0) as free:  # no limit: nothing made, nothing said
        pass
    assert free.words() == "" and free.limit_bytes is None
