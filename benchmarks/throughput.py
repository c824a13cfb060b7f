"""Throughput benchmark: lowlevel against in-process training and the reference trainers.

    python -m benchmarks.throughput --quick --out /tmp/bench-quick    # 5-5.5 min, 2 loaded cores
    python -m benchmarks.throughput                                    # the full run, < 30 min
    python -m benchmarks.throughput --configs=local,lowlevel_1ps1w --sweep_widths= \\
        --noaccuracy --repeats=1                                       # a subset

Everything runs on this machine, one configuration at a time, on the same data, model and
batch: MLP 784-512-512-10 (0.67 M parameters), batch 128 per worker step, the synthetic
MNIST-shaped data of `lowlevel.data.images.synthetic()` (= `benchmarks/_reference.py`), Adagrad
with learning rate 0.1.

Configurations (`--configs`; a name may end in `:exact` or `:comm_reduced`):
  local              lowlevel in one process (`python -m lowlevel.trainer`, no cluster)
  classic_1ps1w, classic_1ps2w            the textbook TF1 trainer (benchmarks/classic.py),
                                          async
  lowlevel_1ps1w, lowlevel_1ps2w, lowlevel_2ps2w   lowlevel async (`python -m lowlevel.launch`)
  lowlevel_1ps2w_sync                     lowlevel sync
  tf2_pss_1ps1w, tf2_pss_1ps2w            TF2 ParameterServerStrategy (benchmarks/tf2_pss.py)
Every lowlevel configuration runs in each of `--modes`: `exact` (every step exchanges with
the ps) and `comm_reduced` (`--communication_period=K` passed to the trainer). If the
trainer does not know that flag, the comm_reduced runs are skipped with one line; if it
rejects it for one configuration (e.g. with --sync), that configuration is skipped with the
trainer's line.

Rounds: every configuration runs once per round, in a shuffled order, `--repeats` rounds;
a record's figures are the medians over rounds and a ratio is the median of its
within-round ratios, so a drift of the shared machine does not favour one configuration.
Each run measures about `--measure_secs` seconds per worker after about `--warmup_secs`
of warm-up steps (step counts come from the rate measured for the configuration so far, or
a prior).
Then a model-size sweep (`--sweep_widths`, both hidden layers) of local, classic_1ps1w and
lowlevel_1ps1w, and an accuracy check on `digits` (`--accuracy`): lowlevel 1 ps + 2 workers
async, exact against comm_reduced, the same number of global steps.

How each figure is measured (units): see benchmarks/_runners.py and _measure.py and the
"Throughput harness" section of benchmarks/NOTES.md. examples/s: sum of the workers' own
rates after warm-up; step p50/p90: milliseconds; bytes per step: bytes moved between one
worker and the ps tasks per local step, from the kernel's TCP counters (`ss`), with the
analytic 2 x 4 x parameters / period beside it (lowlevel exact with 1 ps: less, its dense
layers' products on the ps, `lowlevel.modes.ps_products.mlp_step_floats`); peak RSS: VmHWM per
task, MiB; startup:
seconds from the first process start to the first step of the last worker; shutdown:
seconds from the last step to every process gone (null for the references, whose ps
never exits).

The estimator suite (`--suite=estimator`, benchmarks/estimator_suite.py): a user's
Estimator model_fn (benchmarks/estimator_model.py, the same MLP building its own train_op)
trained by lowlevel's runtime against the textbook trainer, 1 ps + 1 and 1 ps + 2 workers,
with lowlevel's built-in MLP in exact mode (with and without --ps_products) and the model_fn
with --ps_products=false beside them, `--repeats` rounds; targets: the model_fn at >= 1.0x
the textbook trainer and >= 0.97x the built-in exact mode without products, on both shapes.
Not part of the default suites or of --quick. Alone, its defaults are 5 rounds of 8 s
windows after 3 s of warm-up (`ESTIMATOR`; ~25 min on 2 loaded cores).

Bandwidth-limited links (`--link=1gbit`, a sweep `--link=10gbit,1gbit,100mbit`): the
configurations with a ps run with every task on its own host (a network namespace) whose
link has that rate; see benchmarks/_linkbench.py. Needs root.

Output in `--out`: results.json ({meta, records, runs, ratios, targets, accuracy,
placement, notes}), results.md (the tables) and throughput.png (examples/s against model
size), plus runs/ with every process's log. The table and the ratios with their targets
(PASS/FAIL/SKIP) are printed at the end.
"""

from __future__ import annotations

import datetime
import json
import os
import random
import shutil
import subprocess
import sys
import time
from typing import Optional

from absl import app, flags

from benchmarks import _configs, _linkbench, _report, _runners, estimator_suite, sparse
from lowlevel.outputs import files as lowlevel_files
from lowlevel import cli

FLAGS = flags.FLAGS
flags.DEFINE_boolean("quick", False, "Short runs of the configurations the targets need, 1 "
                     "round (3 of the narrowest targets' pairs), no sweep, 2 accuracy seeds, the "
                     "sparse suite on 1 M rows (5-5.5 min on 2 loaded cores; the aim is < 5). "
                     "Explicitly given flags still win.")
flags.DEFINE_string("out", os.path.join("benchmarks", "results", "latest"),
                    "Output directory (results.json, results.md, throughput.png, runs/).")
flags.DEFINE_list("configs", None, "Configurations to run (default: all; quick: local, "
                  "lowlevel_1ps1w, lowlevel_1ps2w, lowlevel_1ps2w_sync, tf2_pss_1ps2w; see the "
                  "module doc). A name may end in "
                  ":exact or :comm_reduced.")
flags.DEFINE_list("modes", ["exact", "comm_reduced"], "Modes of the lowlevel configurations.")
flags.DEFINE_integer("communication_period", 16, "comm_reduced mode: local steps between "
                     "exchanges with the ps (passed as the trainer's --communication_period).")
flags.DEFINE_integer("repeats", 3, "Rounds of the main configurations (quick: 1).")
flags.DEFINE_integer("headline_repeats", None, "Rounds of the --headline configurations, "
                     "if more than --repeats (quick: 3). A run-to-run spread of 10-20 % was "
                     "seen here between identical runs minutes apart.")
flags.DEFINE_list("headline", ["local:n/a", "lowlevel_1ps1w:exact", "lowlevel_1ps1w:comm_reduced",
                               "lowlevel_1ps2w:exact", "lowlevel_1ps2w:comm_reduced",
                               "tf2_pss_1ps2w:n/a"],
                  "The configurations (name:mode) behind the narrow throughput targets, "
                  "run --headline_repeats rounds (quick: the pairs of lowlevel_1ps1w_over_local, "
                  "its _exact, lowlevel_over_tf2_pss_exact and sync_over_async_exact).")
flags.DEFINE_list("hidden_units", ["512", "512"], "MLP hidden widths of the main "
                  "configurations.")
flags.DEFINE_integer("batch_size", 128, "Examples per worker step.")
flags.DEFINE_float("learning_rate", 0.1, "Adagrad learning rate.")
flags.DEFINE_float("measure_secs", 5.0, "Target measured seconds per run, after warm-up "
                   "(quick: 2.5).")
flags.DEFINE_float("warmup_secs", 1.0, "Target warm-up seconds per worker: each worker's "
                   "first local steps, not measured (they also cover the other workers' "
                   "start).")
flags.DEFINE_integer("warmup_steps", 100, "Most warm-up steps per worker.")
flags.DEFINE_integer("min_steps", 200, "Fewest measured local steps per worker (quick: 50).")
flags.DEFINE_list("sweep_widths", ["128", "256", "1024", "2048"], "Hidden widths (both "
                  "layers) of the model-size sweep, besides --hidden_units (quick: 2048; "
                  "empty: no sweep).")
flags.DEFINE_integer("sweep_repeats", 1, "Rounds of the sweep.")
flags.DEFINE_boolean("accuracy", True, "Run the digits accuracy check (exact vs "
                     "comm_reduced, lowlevel 1 ps + 2 workers async).")
flags.DEFINE_integer("accuracy_steps", 2000, "Global steps of each accuracy run (the "
                     "trainer's default --train_steps).")
flags.DEFINE_list("accuracy_seeds", ["0", "1", "2"], "Seeds of the accuracy runs; each mode "
                  "is run with each, and the mean is compared (quick: 0,1).")
flags.DEFINE_boolean("placement", True, "Compute lowlevel's ps byte balance for the MLP and "
                     "the CNN on 2 ps (a short TensorFlow process).")
flags.DEFINE_float("run_timeout_secs", 300.0, "A run still going after this is stopped and "
                   "recorded as failed.")
flags.DEFINE_list("lowlevel_flags", None, "Extra trainer flags for the lowlevel and local "
                  "runs only, e.g. --lowlevel_flags=--intra_op_threads=2 (an experiment: "
                  "recorded in meta.settings).")
flags.DEFINE_list("link", None, "Link rates as tc writes them (10gbit, 1gbit, 100mbit): "
                  "instead of the usual runs, local, classic, lowlevel exact and comm_reduced "
                  "and TF2 PSS (1 ps + 1 worker), each task on its own namespace host whose "
                  "link has that rate both ways; a list is a sweep (--link=10gbit,1gbit,"
                  "100mbit: ~10 min, 2 rounds). Root only. See benchmarks/_linkbench.py.")
flags.DEFINE_integer("seed", 0, "Seed of the shuffled order within rounds.")
flags.DEFINE_list("suite", ["dense", "sparse"], "What to run: dense (the MLP configurations, "
                  "sweep, accuracy, placement) and/or sparse (wide & deep on a 10 M-row table, "
                  "benchmarks/sparse.py; short in --quick) and/or estimator (a user's model_fn "
                  "through lowlevel against the textbook trainer, benchmarks/estimator_suite.py; "
                  "only when named). Default: dense and sparse, or dense only when --configs is "
                  "given (a subset of the dense configurations).")
flags.DEFINE_list("estimator_configs", None, "The estimator suite's configurations (default: "
                  "all: classic_, estimator_ (default flags and exact_noproducts), lowlevel_ "
                  "(exact and exact_noproducts) on 1ps1w and 1ps2w); a lowlevel one may end in "
                  ":exact or :exact_noproducts, an estimator one in :n/a (default flags) or "
                  ":exact_noproducts.")
sparse.define_flags(flags)

# Quick: one round of each configuration a target needs (local, lowlevel_1ps1w,
# lowlevel_1ps2w, lowlevel_1ps2w_sync, tf2_pss_1ps2w; not the classic ones, lowlevel_2ps2w
# or the model-size sweep, which feed no target), 2.5 s measured per run (1.5 s left
# run-to-run noise of +-10-15 % here), three rounds of the pairs behind the narrowest
# targets (lowlevel_1ps1w comm_reduced over local: 0.61-0.86 in single rounds; sync over
# async, exact: 0.66-0.97), the accuracy check at the trainer's default length with two
# seeds (one seed moved the comm_reduced drop between 0.1 and 0.8 points). Every run
# starts its processes afresh, and TensorFlow's import costs each ~3.5 s of CPU here
# (without Keras, lowlevel/tf_import.py; ~7 s with it): ~60 process starts are most of the run.
QUICK = {"repeats": 1, "headline_repeats": 3, "measure_secs": 2.5, "min_steps": 50,
         "sweep_widths": [], "accuracy_steps": 2000, "accuracy_seeds": ["0", "1"],
         "configs": ["local", "lowlevel_1ps1w", "lowlevel_1ps2w", "lowlevel_1ps2w_sync",
                     "tf2_pss_1ps2w"],
         "headline": ["local:n/a", "lowlevel_1ps1w:exact", "lowlevel_1ps1w:comm_reduced",
                      "lowlevel_1ps2w:exact", "lowlevel_1ps2w_sync:exact", "tf2_pss_1ps2w:n/a"]}


# --suite=estimator alone (flags given explicitly win): more rounds, longer windows and a
# warm-up that covers the skew of the workers' starts. At load 8-10 on this 2-core machine
# single rounds of the 1 ps + 2 workers ratio spread over 0.86-1.13 with 5 s windows and
# ~1 s of warm-up, and a worker started up to 2.3 s before the other, training alone in
# part of its window (2026-11-25).
ESTIMATOR = {"repeats": 5, "measure_secs": 8.0, "warmup_secs": 3.0, "warmup_steps": 300}


class Bench:
    def __init__(self, out: str, prefix: str = ""):
        self.out = out
        self.prefix = prefix  # of every run's directory under runs/ (one per suite)
        self.runs: list = []
        self.rates: dict = {}
        self.notes: list = []
        self.comm_reduced_skip: Optional[str] = None
        self.count = 0

    def rate(self, cfg: _configs.Config) -> float:
        """Local steps/s per worker expected: measured before, scaled from another width of
        the same configuration (as parameters^-0.8), or the prior."""
        rate = self.rates.get((cfg.trainer, cfg.mode, cfg.num_ps, cfg.num_workers, cfg.sync,
                               cfg.hidden))
        if rate is not None:
            return rate
        near = [(abs(h[0] - cfg.hidden[0]), r, h) for (t, m, p, w, s, h), r in
                self.rates.items() if (t, m, p, w, s) == (cfg.trainer, cfg.mode,
                                                          cfg.num_ps, cfg.num_workers, cfg.sync)]
        if near:
            _, r, h = min(near)
            return r * (_configs.mlp_params(h) / cfg.params) ** 0.8
        prior = _configs.PRIOR_STEPS_PER_SEC["comm_reduced" if cfg.mode == "comm_reduced"
                                    else cfg.trainer]
        return prior * (0.6 if cfg.num_workers > 1 else 1.0) * min(
            1.0, (_configs.REF_PARAMS / cfg.params) ** 0.8)

    def steps(self, cfg: _configs.Config) -> tuple[int, int]:
        """(warm-up, measured) local steps per worker: about --warmup_secs and --measure_secs
        at the expected rate, within [20, --warmup_steps] and [--min_steps, 50,000]."""
        rate = self.rate(cfg)
        warmup = int(min(FLAGS.warmup_steps, max(20, rate * FLAGS.warmup_secs)))
        return warmup, int(min(50_000, max(FLAGS.min_steps, rate * FLAGS.measure_secs)))

    def run(self, cfg: _configs.Config, rnd: int, total: int) -> dict:
        base = dict(part=cfg.part, name=cfg.name, trainer=cfg.trainer, mode=cfg.mode,
                    num_ps=cfg.num_ps, num_workers=cfg.num_workers, sync=cfg.sync,
                    hidden_units=list(cfg.hidden), params=cfg.params,
                    batch_size=FLAGS.batch_size, dataset=cfg.dataset, round=rnd,
                    bytes_per_step_analytic=_configs.analytic_bytes(
                        cfg, FLAGS.communication_period, FLAGS.batch_size))
        if cfg.mode == "comm_reduced" and self.comm_reduced_skip:
            run = dict(base, ok=False, skipped=self.comm_reduced_skip)
            self.runs.append(run)
            return run
        self.count += 1
        warmup, measured = self.steps(cfg)
        workdir = os.path.join(self.out, "runs",
                               f"{self.prefix}{self.count:03d}-{cfg.name}-{cfg.mode}")
        shutil.rmtree(workdir, ignore_errors=True)
        os.makedirs(workdir)
        started = time.monotonic()
        result = _configs.run_config(cfg, warmup, measured, workdir, FLAGS.batch_size,
                                     FLAGS.learning_rate, FLAGS.communication_period,
                                     FLAGS.run_timeout_secs, FLAGS.lowlevel_flags or ())
        _tidy(workdir)
        run = dict(base, **result, warmup_steps=warmup, measured_steps_per_worker=measured)
        if result.get("skipped") and "Unknown command line flag" in result["skipped"]:
            self.comm_reduced_skip = result["skipped"]  # the probe missed it: skip the rest
        elif result.get("ok") and result.get("tasks"):
            steps = sum(t["measured_steps"] for t in result["tasks"])
            window = max(t["measured_steps"] * FLAGS.batch_size / t["examples_per_sec"]
                         for t in result["tasks"] if t.get("examples_per_sec"))
            self.rates[(cfg.trainer, cfg.mode, cfg.num_ps, cfg.num_workers, cfg.sync,
                        cfg.hidden)] = steps / cfg.num_workers / window
        self.runs.append(run)
        print(describe(run, self.count, total, time.monotonic() - started), flush=True)
        return run


def _tidy(workdir: str) -> None:
    """Drops checkpoints and event files (tens of MB for the big models); keeps logs and JSON."""
    for root, _, files in os.walk(workdir):
        for f in files:
            if f.startswith(("model.ckpt", "events.out", "graph.pbtxt")):
                os.remove(os.path.join(root, f))


def describe(run: dict, i: int, total: int, secs: float) -> str:
    head = f"[{i}/{total}] {run['name']} {run['mode']}"
    if run.get("skipped"):
        return f"{head}: skipped ({run['skipped']})"
    if not run.get("ok"):
        return f"{head}: FAILED: {run.get('error', '').strip()}"
    b = run.get("bytes_per_step")
    return (f"{head}: {run['examples_per_sec']:,.0f} examples/s, step p50 "
            f"{run['step_ms_p50']:.1f} ms, {'-' if b is None else f'{b / 1e6:.2f}'} MB/step, "
            f"startup {run['startup_secs']} s, shutdown {run.get('shutdown_secs')} s "
            f"({secs:.0f} s)")


def accuracy_check(bench: Bench, modes: list) -> dict:
    """lowlevel 1 ps + 2 workers async on digits: each mode, the same global steps, each seed.

    The comparison is of the means over `--accuracy_seeds` (360 test images: one
    image is 0.28 points, and seeds differ by up to a point in either mode).
    """
    steps = FLAGS.accuracy_steps
    seeds = [int(s) for s in FLAGS.accuracy_seeds]
    out = {"config": "1 ps + 2 workers", "dataset": "digits", "hidden_units": [128, 128],
           "batch_size": 64, "train_steps": steps, "examples": steps * 64,
           "communication_period": FLAGS.communication_period, "seeds": seeds}
    for mode in modes:
        cfg = _configs.Config("lowlevel_1ps2w_digits", "lowlevel", mode, 1, 2, False, (128, 128),
                              "accuracy", "digits")
        if mode == "comm_reduced" and bench.comm_reduced_skip:
            out[f"{mode}_note"] = f"skipped ({bench.comm_reduced_skip})"
            continue
        found = []
        for seed in seeds:
            res = _accuracy_run(bench, cfg, mode, steps, seed)
            if not res.get("ok"):
                note = res.get("skipped") or res.get("error", "").strip()
                out[f"{mode}_note"] = ("skipped: " if res.get("skipped") else "failed: ") + note
                print(f"[accuracy] {mode}: {out[f'{mode}_note']}", flush=True)
                break
            found.append(res.get("accuracy"))
        else:
            out[mode] = round(sum(found) / len(found), 4)
            out[f"{mode}_by_seed"] = found
    if out.get("exact") is not None and out.get("comm_reduced") is not None:
        out["drop"] = round(out["exact"] - out["comm_reduced"], 4)
    return out


def _accuracy_run(bench: Bench, cfg, mode: str, steps: int, seed: int) -> dict:
    bench.count += 1
    workdir = os.path.join(bench.out, "runs", f"{bench.count:03d}-accuracy-{mode}-seed{seed}")
    shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(workdir)
    flags_ = ["--dataset=digits", "--model=mlp", "--hidden_units=128,128",
              "--batch_size=64", "--optimizer=adagrad", "--learning_rate=0.1",
              f"--train_steps={steps}", f"--seed={seed}", "--save_checkpoint_secs=100000",
              "--log_every_secs=5"]
    if mode == "comm_reduced":
        flags_.append(f"--communication_period={FLAGS.communication_period}")
    t0 = time.monotonic()
    res = _runners.run_lowlevel(1, 2, flags_, workdir, FLAGS.run_timeout_secs, 64)
    _tidy(workdir)
    bench.runs.append(dict(part="accuracy", name=cfg.name, trainer="lowlevel", mode=mode,
                           num_ps=1, num_workers=2, sync=False, hidden_units=[128, 128],
                           params=0, batch_size=64, dataset="digits", round=0, seed=seed,
                           bytes_per_step_analytic=None, **res))
    if res.get("ok"):
        print(f"[accuracy] {mode}, seed {seed}: test accuracy {res.get('accuracy'):.4f} at "
              f"global step {res.get('global_step')} ({time.monotonic() - t0:.0f} s)",
              flush=True)
    return res


def meta(argv, started: float) -> dict:
    cpu_model = None
    try:
        with open("/proc/cpuinfo") as f:
            cpu_model = next((line.split(":", 1)[1].strip() for line in f
                              if line.startswith("model name")), None)
    except OSError:
        pass
    try:
        from importlib.metadata import version
        tf_version = version("tensorflow")
    except Exception:  # noqa: BLE001
        tf_version = None
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=_runners.ROOT,
                            capture_output=True, text=True).stdout.strip() or None
    return {"command": "python -m benchmarks.throughput " + " ".join(argv[1:]),
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "started_unix": started, "cpu_count": os.cpu_count(), "cpu_model": cpu_model,
            "python": sys.version.split()[0], "tensorflow": tf_version, "git_commit": commit,
            "loadavg_start": round(os.getloadavg()[0], 2),
            "settings": {k: FLAGS[k].value for k in (
                "quick", "configs", "repeats", "headline_repeats", "headline", "measure_secs", "warmup_secs", "warmup_steps", "min_steps",
                "sweep_widths", "sweep_repeats", "communication_period", "modes",
                "hidden_units", "batch_size", "learning_rate", "accuracy_steps", "lowlevel_flags",
                "suite", "estimator_configs")}}


def write(bench: Bench, result: dict, final: bool) -> None:
    records = _report.aggregate(bench.runs)
    ratios = _report.ratios(bench.runs, records, result.get("placement"))
    result.update(records=records, runs=bench.runs, ratios=ratios,
        targets=_report.targets(ratios, records, result.get("accuracy")), notes=bench.notes)
    if final:
        result["meta"].update(loadavg_end=round(os.getloadavg()[0], 2),
                              wall_secs=round(time.time() - result["meta"]["started_unix"], 1))
    if "dense" not in FLAGS.suite:
        result["targets"] = {}
    if result.get("sparse"):
        result["targets"].update(result["sparse"]["targets"])
    if result.get("estimator"):
        result["targets"].update(result["estimator"]["targets"])
    lowlevel_files.write_json(os.path.join(bench.out, "results.json"), result, indent=1)
    if final:
        with open(os.path.join(bench.out, "results.md"), "w") as f:
            if records or not (result.get("sparse") or result.get("estimator")):
                f.write(_report.markdown(result))
            else:  # --suite=sparse or estimator alone: no dense table, ratio or plot to show
                meta_ = result["meta"]
                f.write(f"# Throughput benchmark\n\n`{meta_['command']}` — {meta_['date']}, "
                        f"{meta_['cpu_count']} cores ({meta_.get('cpu_model', '?')}), "
                        f"TensorFlow {meta_.get('tensorflow', '?')}, commit "
                        f"{meta_.get('git_commit')}, load average {meta_.get('loadavg_start')} "
                        f"at start, {meta_.get('loadavg_end')} at the end, "
                        f"{meta_['wall_secs']:.0f} s.\n")
            if result.get("sparse"):
                f.write("\n" + sparse.markdown(result["sparse"]))
            if result.get("estimator"):
                f.write("\n" + estimator_suite.markdown(result["estimator"]))
        if records:
            _report.plot(records, os.path.join(bench.out, "throughput.png"))


def apply_flags() -> None:
    """Settles and checks the flags before anything runs: fills in the --quick values of
    flags not given, narrows --suite to dense when --configs is given alone, empties the
    dense suite's flags when it does not run, and raises `app.UsageError` (absl prints the
    help, then the one-line message; exit status 1) for an unexpected --suite, --modes or
    --configs value. Returns None; it changes FLAGS in place."""
    if FLAGS.quick:
        for name, value in QUICK.items():
            if not FLAGS[name].present:
                FLAGS[name].value = value
    elif FLAGS.suite == ["estimator"]:
        for name, value in ESTIMATOR.items():
            if not FLAGS[name].present:
                FLAGS[name].value = value
    if FLAGS["configs"].present and not FLAGS["suite"].present:
        FLAGS.suite = ["dense"]  # --configs picks dense configurations: run just those
    if set(FLAGS.suite) - {"dense", "sparse", "estimator"} or not FLAGS.suite:
        raise app.UsageError(f"--suite={','.join(FLAGS.suite)}: expected some of dense, "
                             "sparse, estimator")
    try:
        estimator_suite.configs((), FLAGS.estimator_configs)
    except ValueError as e:
        raise app.UsageError(str(e)) from None
    if "dense" not in FLAGS.suite:  # nothing of the dense suite runs
        FLAGS.configs, FLAGS.sweep_widths, FLAGS.accuracy, FLAGS.placement = [], [], False, False
        FLAGS.modes = ["exact"]  # no probe of the comm_reduced mode
    bad = [m for m in FLAGS.modes if m not in _configs.MODES]
    if bad:
        raise app.UsageError(f"--modes: unknown {bad}; expected {list(_configs.MODES)}")
    known = set(_configs.MAIN) | {f"{n}:{m}" for n in _configs.MAIN for m in _configs.MODES}
    bad = [c for c in FLAGS.configs or [] if c not in known]
    if bad:
        raise app.UsageError(f"--configs: unknown {bad}; expected some of {_configs.MAIN}")


def probe_comm_reduced(bench: Bench, modes: list) -> None:
    """If `modes` (mode names) includes comm_reduced, asks the trainer whether it takes
    --communication_period; if not, sets `bench.comm_reduced_skip` to its reason and
    prints that line and adds it to `bench.notes`. Returns None."""
    if "comm_reduced" in modes:
        bench.comm_reduced_skip = _runners.probe_comm_reduced(FLAGS.communication_period)
        if bench.comm_reduced_skip:
            line = (f"comm_reduced: skipped: the trainer rejects --communication_period="
                    f"{FLAGS.communication_period} ({bench.comm_reduced_skip})")
            print(line, flush=True)
            bench.notes.append(line)


def count_runs(bench: Bench, main_cfgs: list, sweep_cfgs: list, modes: list) -> int:
    """The number of runs this benchmark will start (the N of "[i/N]"), from the main and
    sweep `_configs.Config`s and the mode names: the rounds of each configuration (more
    for the --headline ones), the sweep's rounds and the accuracy runs (a mode per seed),
    none of a comm_reduced mode that `bench.comm_reduced_skip` rules out."""
    runnable = (lambda cs: [c for c in cs if not (c.mode == "comm_reduced" and
                                                 bench.comm_reduced_skip)])
    return (len(runnable(main_cfgs)) * FLAGS.repeats +
            len([c for c in runnable(main_cfgs) if c.key in FLAGS.headline]) *
            max(0, (FLAGS.headline_repeats or 0) - FLAGS.repeats) +
            len(runnable(sweep_cfgs)) * FLAGS.sweep_repeats +
            (len(runnable([_configs.Config("a", "lowlevel", m, 1, 2, False, ()) for m in modes]))
             * len(FLAGS.accuracy_seeds) if FLAGS.accuracy else 0))


def run_rounds(bench: Bench, result: dict, main_cfgs: list, sweep_cfgs: list,
               total: int) -> None:
    """Runs the rounds: each round the main `_configs.Config`s due in it (all of them for
    --repeats rounds, the --headline ones up to --headline_repeats) in paired shuffled
    order, then the sweep's (for --sweep_repeats rounds) shuffled, seeded by --seed;
    `total` is the run count printed as "[i/total]". Rewrites results.json (`write`)
    after every run not skipped. Returns None; the runs are in `bench.runs`."""
    rng = random.Random(FLAGS.seed)
    headline_repeats = max(FLAGS.headline_repeats or 0, FLAGS.repeats)
    for rnd in range(max(headline_repeats, FLAGS.sweep_repeats)):
        todo = [c for c in main_cfgs if rnd < FLAGS.repeats or
                (rnd < headline_repeats and c.key in FLAGS.headline)]
        todo = _configs.paired_order(todo, rng)
        sweep = list(sweep_cfgs) if rnd < FLAGS.sweep_repeats else []
        rng.shuffle(sweep)
        for cfg in todo + sweep:
            run = bench.run(cfg, rnd, total)
            if not run.get("skipped"):
                write(bench, result, final=False)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected argument {argv[1]!r}")
    apply_flags()
    started = time.time()
    if FLAGS.link:  # bandwidth-limited links: benchmarks/_linkbench.py
        return _linkbench.main(meta(sys.argv, started), describe)
    out = os.path.abspath(FLAGS.out)
    os.makedirs(out, exist_ok=True)
    shutil.rmtree(os.path.join(out, "runs"), ignore_errors=True)
    bench = Bench(out)
    result = {"meta": meta(sys.argv, started)}
    hidden = tuple(int(h) for h in FLAGS.hidden_units)
    modes = list(FLAGS.modes)
    probe_comm_reduced(bench, modes)
    main_cfgs = _configs.selected(_configs.MAIN, modes, hidden, FLAGS.configs, "main")
    sweep_cfgs = [c for w in FLAGS.sweep_widths if int(w) != hidden[0]
                  for c in _configs.selected(_configs.SWEEP, modes, (int(w), int(w)),
                                             FLAGS.configs, "sweep")]
    total = count_runs(bench, main_cfgs, sweep_cfgs, modes)
    if "dense" in FLAGS.suite:
        print(f"throughput: {len(main_cfgs)} configurations x {FLAGS.repeats} round(s) "
              f"(headline ones x {max(FLAGS.headline_repeats or 0, FLAGS.repeats)}), "
              f"{len(sweep_cfgs)} sweep run(s) x {FLAGS.sweep_repeats}, accuracy "
              f"{'on' if FLAGS.accuracy else 'off'}; output in {out}", flush=True)
    if FLAGS.placement:
        result["placement"] = _runners.placement_balance(hidden)
    run_rounds(bench, result, main_cfgs, sweep_cfgs, total)
    if FLAGS.accuracy:
        result["accuracy"] = accuracy_check(bench, modes)
    if "sparse" in FLAGS.suite:
        result["sparse"] = sparse.run_suite(sparse.settings_from_flags(FLAGS, FLAGS.quick), out,
                                            FLAGS.seed, log=lambda line: print(line, flush=True))
    if "estimator" in FLAGS.suite:
        result["estimator"] = run_estimator(result, hidden, bench)
    write(bench, result, final=True)
    print_summary(result, out)
    return 0


def run_estimator(result: dict, hidden: tuple, dense: Bench) -> dict:
    """The estimator suite (`estimator_suite`) with its own `Bench` (its runs in
    runs/estimator-*), results.json rewritten after each run; returns its section."""
    bench = Bench(dense.out, prefix="estimator-")

    def progress(section: dict) -> None:
        result["estimator"] = section
        write(dense, result, final=False)

    return estimator_suite.run_suite(estimator_suite.configs(hidden, FLAGS.estimator_configs),
                                     FLAGS.repeats, bench.run,
                                     log=lambda line: print(line, flush=True), on_run=progress)


def print_summary(result: dict, out: str) -> None:
    if result["records"]:
        print("\n" + _report.table([r for r in result["records"] if r["part"] != "accuracy"]))
    if result.get("accuracy"):
        print("\n" + _report.accuracy_text(result["accuracy"]))
    if result.get("sparse"):
        print("\n" + sparse.markdown(result["sparse"]))
    if result.get("estimator"):
        print("\n" + estimator_suite.markdown(result["estimator"]))
    print("\n" + _report.targets_table(result["targets"]))
    if result["records"]:
        extra = {k: v for k, v in result["ratios"].items() if k not in result["targets"]}
        print("other ratios: " + json.dumps(extra))
    runs = result["runs"] + (result.get("estimator") or {}).get("runs", [])
    ran = [r for r in runs if r.get("ok")]
    skipped = [r for r in runs if r.get("skipped")]
    failed = len(runs) - len(ran) - len(skipped)
    print(f"\nthroughput: {len(ran)} runs ({failed} failed, {len(skipped)} skipped) in "
          f"{result['meta']['wall_secs']:.0f} s; {out}/results.json, results.md"
          f"{', throughput.png' if result['records'] else ''}", flush=True)


if __name__ == "__main__":
    app.run(main, flags_parser=cli.flags_parser("benchmarks.throughput"))
