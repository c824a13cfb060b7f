"""The estimator suite of `benchmarks.throughput` (`--suite=estimator`): its configurations,
order and arithmetic, the benchmark's model_fn (fast), and a tiny real run."""

from __future__ import annotations

import ast
import json
import os
import sys
import time

import numpy as np
import pytest

import clusters

from benchmarks import _configs, estimator_suite

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HIDDEN = (512, 512)


def test_configs_are_both_shapes_of_each_trainer_in_chain_order():
    cfgs = estimator_suite.configs(HIDDEN)
    assert [c.key for c in cfgs] == [
        "classic_1ps1w:n/a", "estimator_1ps1w:n/a", "lowlevel_1ps1w:exact_noproducts",
        "estimator_1ps1w:exact_noproducts", "lowlevel_1ps1w:exact",
        "classic_1ps2w:n/a", "estimator_1ps2w:n/a", "lowlevel_1ps2w:exact_noproducts",
        "estimator_1ps2w:exact_noproducts", "lowlevel_1ps2w:exact"]
    assert all(c.part == "estimator" and not c.sync and c.num_ps == 1 for c in cfgs)
    assert [c.num_workers for c in cfgs] == [1] * 5 + [2] * 5
    assert {c.trainer for c in cfgs} == {"classic", "estimator", "lowlevel"}
    picked = estimator_suite.configs(HIDDEN, ["classic_1ps2w", "lowlevel_1ps1w",
                                              "lowlevel_1ps2w:exact"])
    assert [c.key for c in picked] == ["lowlevel_1ps1w:exact_noproducts", "lowlevel_1ps1w:exact",
                                       "classic_1ps2w:n/a", "lowlevel_1ps2w:exact"]
    with pytest.raises(ValueError, match=r"--estimator_configs: unknown \['estimator_2ps2w'\]"):
        estimator_suite.configs(HIDDEN, ["estimator_2ps2w"])


def test_the_model_fn_moves_the_built_in_exact_modes_bytes_with_the_runtimes_defaults():
    by_key = {c.key: _configs.analytic_bytes(c, 16, 128) for c in estimator_suite.configs(HIDDEN)}
    for s in estimator_suite.SHAPES:  # its products on the ps by default, as the built-in's
        assert by_key[f"estimator_{s}:n/a"] == by_key[f"lowlevel_{s}:exact"] < 2.3e6
        assert by_key[f"estimator_{s}:exact_noproducts"] == \
            by_key[f"lowlevel_{s}:exact_noproducts"] == 8 * _configs.mlp_params(HIDDEN)


def test_rounds_alternate_and_keep_each_ratio_back_to_back():
    cfgs = estimator_suite.configs(HIDDEN)
    even, odd = estimator_suite.round_order(cfgs, 0), estimator_suite.round_order(cfgs, 1)
    assert odd == even[::-1] and estimator_suite.round_order(cfgs, 2) == even
    keys = [c.key for c in even]
    for s in estimator_suite.SHAPES:  # each target's two sides run one after the other
        est = keys.index(f"estimator_{s}:n/a")
        assert abs(keys.index(f"classic_{s}:n/a") - est) == 1
        assert abs(keys.index(f"lowlevel_{s}:exact_noproducts") - est) == 1
        # ... and those of the like-for-like ratio without the products
        assert abs(keys.index(f"lowlevel_{s}:exact_noproducts") -
                   keys.index(f"estimator_{s}:exact_noproducts")) == 1


class FakeRunners:
    """Records the command line `_configs.run_config` builds instead of running it."""

    def __init__(self):
        self.calls = []

    def run_lowlevel(self, num_ps, num_workers, flags, workdir, timeout, batch):
        self.calls.append(("lowlevel", num_ps, num_workers, list(flags)))
        return {"ok": True}

    def run_classic(self, num_ps, num_workers, flags, workdir, timeout, batch):
        self.calls.append(("classic", num_ps, num_workers, list(flags)))
        return {"ok": True}


def _flag(flags, name):
    return next(f.split("=", 1)[1] for f in flags if f.startswith(f"--{name}="))


def test_each_configuration_runs_its_trainer_with_the_same_model_and_steps():
    runners = FakeRunners()
    for cfg in estimator_suite.configs((64, 32)):
        _configs.run_config(cfg, 20, 300, "/nonexistent", 128, 0.1, 16, 60.0,
                            ("--intra_op_threads=1",), runners=runners)
    assert len(runners.calls) == 10
    for i, (kind, _, workers, flags) in enumerate(runners.calls):
        assert _flag(flags, "train_steps") == str(320 * workers)  # global steps: async
        # products off: the built-in's and the model_fn's exact_noproducts runs only
        assert ("--ps_products=false" in flags) == (i % 5 in (2, 3))
        if i % 5 in (1, 3):  # the model_fn
            assert kind == "lowlevel"
            assert _flag(flags, "model") == "benchmarks.estimator_model:model_fn"
            assert _flag(flags, "input_fn") == "benchmarks.estimator_model:input_fn"
            assert json.loads(_flag(flags, "params")) == {
                "hidden_units": [64, 32], "learning_rate": 0.1, "batch_size": 128}
            assert _flag(flags, "warmup_steps") == "20"
            assert "--intra_op_threads=1" in flags  # --lowlevel_flags reach it
            assert not any(f.startswith(("--dataset", "--hidden_units")) for f in flags)
        elif i % 5 == 0:
            assert kind == "classic" and _flag(flags, "hidden_units") == "64,32"
            assert "--intra_op_threads=1" not in flags
        else:
            assert _flag(flags, "model") == "mlp" and _flag(flags, "hidden_units") == "64,32"


def _run(name, mode, rnd, eps, load=2.0, ok=True):
    shape = name.rsplit("_", 1)[1]
    return {"part": "estimator", "name": name, "trainer": name.split("_")[0], "mode": mode,
            "num_ps": 1, "num_workers": int(shape[3]), "sync": False, "hidden_units": [512, 512],
            "params": 669_706, "batch_size": 128, "dataset": "synthetic",
            "bytes_per_step_analytic": 5_357_648, "round": rnd, "ok": ok,
            "examples_per_sec": eps if ok else None, "loadavg_1m": load}


def test_ratios_are_medians_of_within_round_ratios_and_targets_judge_them():
    runs = [_run("classic_1ps1w", "n/a", 0, 100), _run("estimator_1ps1w", "n/a", 0, 120, 3.0),
            _run("lowlevel_1ps1w", "exact", 0, 240),
            _run("classic_1ps1w", "n/a", 1, 200), _run("estimator_1ps1w", "n/a", 1, 180, 5.0),
            _run("lowlevel_1ps1w", "exact", 1, 300),
            _run("classic_1ps1w", "n/a", 2, 100), _run("estimator_1ps1w", "n/a", 2, 105),
            _run("classic_1ps2w", "n/a", 0, 100), _run("estimator_1ps2w", "n/a", 0, 90),
            _run("classic_1ps2w", "n/a", 1, 100), _run("estimator_1ps2w", "n/a", 1, 0, ok=False)]
    rounds = estimator_suite.by_round(runs)
    assert [r["round"] for r in rounds] == [0, 1, 2]
    assert rounds[0]["ratios"]["estimator_1ps1w_over_classic_1ps1w"] == 1.2
    assert rounds[1]["ratios"]["estimator_1ps2w_over_classic_1ps2w"] is None  # failed run
    assert rounds[0]["loadavg_1m"] == round((2 + 3 + 2 + 2 + 2) / 5, 2)
    got = estimator_suite.ratios(runs)
    assert got["estimator_1ps1w_over_classic_1ps1w"] == 1.05  # 1.2, 0.9, 1.05
    assert got["estimator_1ps2w_over_classic_1ps2w"] == 0.9  # one round had both
    assert got["estimator_1ps1w_over_lowlevel_1ps1w_exact"] == 0.55  # 0.5, 0.6
    assert got["lowlevel_1ps1w_exact_over_classic_1ps1w"] == 1.95  # 2.4, 1.5
    assert got["estimator_1ps1w_over_lowlevel_1ps1w_noproducts"] is None  # never ran
    status = {k: t["status"] for k, t in estimator_suite.targets(got).items()}
    assert status == {"estimator_1ps1w_over_classic_1ps1w": "PASS",
                      "estimator_1ps2w_over_classic_1ps2w": "FAIL",
                      "estimator_1ps1w_over_lowlevel_1ps1w_noproducts": "SKIP",
                      "estimator_1ps2w_over_lowlevel_1ps2w_noproducts": "SKIP"}
    assert estimator_suite.targets({"estimator_1ps2w_over_lowlevel_1ps2w_noproducts": 0.969})[
        "estimator_1ps2w_over_lowlevel_1ps2w_noproducts"]["status"] == "FAIL"
    assert estimator_suite.targets({})["estimator_1ps1w_over_classic_1ps1w"]["status"] == "SKIP"
    assert estimator_suite.targets(
        {"estimator_1ps1w_over_classic_1ps1w": 1.0})[
            "estimator_1ps1w_over_classic_1ps1w"]["status"] == "PASS"  # >= 1.0 holds at 1.0


def test_run_suite_runs_every_round_in_order_and_reports_each_run():
    cfgs = estimator_suite.configs(HIDDEN, ["classic_1ps1w", "estimator_1ps1w:n/a"])
    order, sections = [], []

    def run(cfg, rnd, total):
        assert total == 4
        order.append((rnd, cfg.name))
        eps = {"classic_1ps1w": 100.0, "estimator_1ps1w": 110.0 + rnd}[cfg.name]
        return dict(_run(cfg.name, cfg.mode, rnd, eps), loadavg_1m=None)

    est = estimator_suite.run_suite(cfgs, 2, run, log=lambda line: None,
                                    on_run=sections.append)
    assert order == [(0, "classic_1ps1w"), (0, "estimator_1ps1w"), (1, "estimator_1ps1w"),
                     (1, "classic_1ps1w")]
    assert len(sections) == 4 and len(sections[0]["runs"]) == 1
    assert all(isinstance(r["loadavg_1m"], float) for r in est["runs"])  # taken at the start
    assert est["ratios"]["estimator_1ps1w_over_classic_1ps1w"] == 1.105  # 1.10, 1.11
    assert est["targets"]["estimator_1ps1w_over_classic_1ps1w"]["status"] == "PASS"
    assert {r["name"]: r["examples_per_sec"] for r in est["records"]} == {
        "classic_1ps1w": 100.0, "estimator_1ps1w": 110.5}
    md = estimator_suite.markdown(est)
    assert "| estimator_1ps1w | n/a | 1 | 1 | no |" in md
    assert "| estimator_1ps1w_over_classic_1ps1w | 1.100 | 1.110 | 1.105 |" in md
    assert "| estimator_1ps1w_over_classic_1ps1w | 1.105 | >= 1 | PASS |" in md
    assert "| estimator_1ps2w_over_classic_1ps2w | - | >= 1 | SKIP |" in md


@pytest.fixture
def graph():
    import tensorflow as tf
    g = tf.Graph()
    with g.as_default():
        yield g


def test_model_fn_is_the_classic_mlp_with_its_own_train_op(graph):
    """The same variables, initial values and loss as benchmarks/classic.py's MLP; its
    train_op moves the global step (Adagrad)."""
    import tensorflow as tf

    from benchmarks import _reference, estimator_model
    v1 = tf.compat.v1
    params = {"hidden_units": [16, 8], "learning_rate": 0.1, "batch_size": 32}
    global_step = v1.train.get_or_create_global_step()
    features, labels = v1.data.make_one_shot_iterator(estimator_model.input_fn(
        "train", params, _RunConfig(0, 1))).get_next()
    assert features["images"].shape.as_list() == [32, 784] and labels.shape.as_list() == [32]
    spec = estimator_model.model_fn(features, labels, "train", params)
    names = sorted(v.op.name for v in v1.trainable_variables())
    assert names == ["hid0_b", "hid0_w", "hid1_b", "hid1_w", "sm_b", "sm_w"]
    with tf.Graph().as_default():
        with v1.variable_scope("c"):
            _classic_mlp(tf, _reference)(v1.placeholder(tf.float32, [None, 784]), [16, 8])
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            want = {v.op.name[2:]: sess.run(v) for v in v1.trainable_variables()}
    with v1.Session() as sess:
        sess.run(v1.global_variables_initializer())
        got = {v.op.name: sess.run(v) for v in v1.trainable_variables()}
        for name, value in want.items():
            np.testing.assert_array_equal(got[name], value, err_msg=name)
        sess.run(spec.train_op)
        assert sess.run(global_step) == 1
        assert 2.0 < sess.run(spec.loss) < 2.6  # ~ln 10 at the start


def _classic_mlp(tf, reference):
    """benchmarks/classic.py's `mlp`, compiled from its source: importing the module would
    define its absl flags, which clash with benchmarks.throughput's in one process."""
    with open(os.path.join(ROOT, "benchmarks", "classic.py")) as f:
        tree = ast.parse(f.read())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "mlp")
    namespace = {"tf": tf, "v1": tf.compat.v1, "ref": reference}
    exec(compile(ast.Module([fn], type_ignores=[]), "benchmarks/classic.py", "exec"), namespace)
    return namespace["mlp"]


class _RunConfig:
    def __init__(self, index, replicas):
        self.global_id_in_cluster, self.num_worker_replicas = index, replicas


def test_input_fn_shards_by_worker_and_scales_pixels(graph):
    """Two workers' shards are disjoint halves of the training split, in [0, 1]."""
    import tensorflow as tf

    from benchmarks import _reference, estimator_model
    v1 = tf.compat.v1
    params = {"batch_size": 128}
    nexts = [v1.data.make_one_shot_iterator(estimator_model.input_fn(
        "train", params, _RunConfig(i, 2))).get_next() for i in (0, 1)]
    images, _ = _reference.synthetic_train()
    rows = {bytes(r): i for i, r in enumerate(images)}
    seen = [set(), set()]
    with v1.Session() as sess:
        for _ in range(8):
            for w, (features, labels) in enumerate(nexts):
                x, _ = sess.run([features["images"], labels])
                assert x.shape == (128, 784) and 0.0 <= x.min() and x.max() <= 1.0
                seen[w].update(rows[bytes(np.rint(r * 255).astype(np.uint8))] for r in x)
    assert all(i % 2 == 0 for i in seen[0]) and all(i % 2 == 1 for i in seen[1])
    assert len(seen[0]) == len(seen[1]) == 8 * 128  # an epoch's batches repeat no example


@pytest.mark.cluster
@pytest.mark.timeout(120)
def test_tiny_estimator_suite(tmp_path):
    """Both sides of the 1 ps + 1 worker target on a small MLP, one round: each has its
    numbers, the ratio and target are reported, and no process is left behind."""
    out = tmp_path / "bench"
    argv = [sys.executable, "-m", "benchmarks.throughput", "--suite=estimator", f"--out={out}",
            "--estimator_configs=classic_1ps1w,estimator_1ps1w:n/a", "--hidden_units=32,32",
            "--repeats=1", "--measure_secs=1", "--min_steps=300", "--warmup_steps=20",
            "--run_timeout_secs=50"]
    started = time.monotonic()
    returncode, output, seen, _ = clusters.run_watched(argv)  # every process it starts
    assert returncode == 0, output[-5000:]
    result = json.loads((out / "results.json").read_text())
    est = result["estimator"]
    records = {r["name"]: r for r in est["records"]}
    assert set(records) == {"classic_1ps1w", "estimator_1ps1w"}
    for name, rec in records.items():
        assert rec["runs"] == 1, (name, rec.get("error"))
        assert rec["examples_per_sec"] > 0 and rec["params"] == 784 * 32 + 32 + 32 * 32 + 32 + 330
        assert 0 < rec["step_ms_p50"] <= rec["step_ms_p90"]
        assert set(rec["peak_rss_mb_by_task"]) == {"ps0", "worker0"}
    run = next(r for r in est["runs"] if r["name"] == "estimator_1ps1w")
    # the run ended at exactly its last global step (the counted update)
    assert run["global_step"] == run["warmup_steps"] + run["measured_steps_per_worker"]
    assert run["tasks"][0]["measured_steps"] == run["measured_steps_per_worker"]
    ratio = est["ratios"]["estimator_1ps1w_over_classic_1ps1w"]
    assert ratio == round(records["estimator_1ps1w"]["examples_per_sec"] /
                          records["classic_1ps1w"]["examples_per_sec"], 3)
    assert result["targets"]["estimator_1ps1w_over_classic_1ps1w"]["status"] in ("PASS", "FAIL")
    assert result["targets"]["estimator_1ps2w_over_classic_1ps2w"]["status"] == "SKIP"
    assert not result["records"]  # the dense suite did not run
    md = (out / "results.md").read_text()
    assert "## Estimator" in md and "| estimator_1ps1w | n/a |" in md
    assert "estimator_1ps1w_over_classic_1ps1w" in output
    assert time.monotonic() - started < 110
    left = clusters.alive(seen)
    assert not left, f"processes left running: {left}"
