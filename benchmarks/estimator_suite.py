"""The estimator suite of `benchmarks.throughput` (`--suite=estimator`): a user's `model_fn`
trained by lowlevel's runtime against the textbook between-graph trainer.

Side by side in one run, on 1 ps + 1 worker and 1 ps + 2 workers, async, the benchmark's
MLP (`--hidden_units`, 784-512-512-10 by default; batch `--batch_size`, Adagrad
`--learning_rate`, the synthetic MNIST-shaped data of `benchmarks/_reference.py`):

  classic_<shape>            the textbook trainer, `benchmarks/classic.py`
                             (replica_device_setter + MonitoredTrainingSession + feed_dict)
  estimator_<shape>          `python -m lowlevel.launch --model=benchmarks.estimator_model:
                             model_fn --input_fn=benchmarks.estimator_model:input_fn
                             --params=...`: the same MLP as an Estimator model_fn that builds
                             its own train_op, fed by a tf.data input_fn
                             (the runtime's defaults: its small variables fused into one
                             transfer per ps, the dense layers' products on the ps)
  lowlevel_<shape> exact_noproducts
                             lowlevel's built-in `--model=mlp`, exact mode with
                             `--ps_products=false`: of what the exact mode adds to the
                             textbook step, only the fused transfer (and the input pipeline,
                             the runtime's loop) is left
  estimator_<shape> exact_noproducts
                             information: the model_fn with `--ps_products=false` (like for
                             like with the line above)
  lowlevel_<shape> exact     information: the built-in MLP in exact mode (fused transfer and
                             products on the ps; like for like with `estimator_<shape>`)

Each round runs every configuration once, one shape after the other, each shape's in the
chain classic - estimator - lowlevel exact_noproducts - estimator exact_noproducts -
lowlevel exact (the two sides of each target back to back), the whole round's order
reversed every other round, so no configuration always runs first or last; `--repeats`
rounds. A run's figures are `_runners`' (examples/s: the sum of
the workers' own rates over their measured windows from `tasks/<task>.json`, or the
classic's records); a ratio is the median of its within-round ratios. The one-minute load
average when each run starts is kept with it (`loadavg_1m`), and each round's ratios with
the mean load average of its runs (`by_round`).

Targets: `estimator_<shape>_over_classic_<shape>` >= 1.0 (a model_fn beats the textbook
trainer) and `estimator_<shape>_over_lowlevel_<shape>_noproducts` >= 0.97 (a model_fn, given
the fused transfer by `lowlevel.modes.fused_transfer` and, by default, the products on the ps
by `lowlevel.modes.ps_products`, trains as fast as the built-in MLP with the fused transfer
alone), both shapes. The other ratios are information; the like-for-like ones are
`estimator_<shape>_over_lowlevel_<shape>_exact` (both with the products) and
`estimator_<shape>_noproducts_over_lowlevel_<shape>_noproducts` (neither).
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Callable, Optional

from benchmarks import _configs, _report

SHAPES = ("1ps1w", "1ps2w")
# One shape's chain, in the order it runs (reversed every other round).
CHAIN = (("classic", "n/a"), ("estimator", "n/a"), ("lowlevel", _configs.EXACT_NO_PRODUCTS),
         ("estimator", _configs.EXACT_NO_PRODUCTS), ("lowlevel", "exact"))
ALL = [f"{trainer}_{shape}" + ("" if mode == "n/a" else f":{mode}")
       for shape in SHAPES for trainer, mode in CHAIN]


def _ratio_defs() -> dict:
    out = {}
    for s in SHAPES:
        est, classic = (f"estimator_{s}", "n/a"), (f"classic_{s}", "n/a")
        exact = (f"lowlevel_{s}", "exact")
        fused = (f"lowlevel_{s}", _configs.EXACT_NO_PRODUCTS)
        est_fused = (f"estimator_{s}", _configs.EXACT_NO_PRODUCTS)
        out[f"estimator_{s}_over_classic_{s}"] = (est, classic)
        out[f"estimator_{s}_over_lowlevel_{s}_exact"] = (est, exact)
        out[f"estimator_{s}_over_lowlevel_{s}_noproducts"] = (est, fused)
        out[f"estimator_{s}_noproducts_over_lowlevel_{s}_noproducts"] = (est_fused, fused)
        out[f"lowlevel_{s}_exact_over_classic_{s}"] = (exact, classic)
        out[f"lowlevel_{s}_noproducts_over_classic_{s}"] = (fused, classic)
    return out


# ratio name -> (numerator, denominator), each (config name, mode)
RATIOS = _ratio_defs()
# target name -> (op, bound): the issue's
TARGETS = {"estimator_1ps1w_over_classic_1ps1w": (">=", 1.0),
           "estimator_1ps2w_over_classic_1ps2w": (">=", 1.0),
           "estimator_1ps1w_over_lowlevel_1ps1w_noproducts": (">=", 0.97),
           "estimator_1ps2w_over_lowlevel_1ps2w_noproducts": (">=", 0.97)}


def configs(hidden: tuple, allowed: Optional[list] = None) -> list:
    """The suite's `_configs.Config`s (part "estimator"), in chain order, both shapes.

    `allowed`: names to keep, as `--estimator_configs` takes them (`classic_1ps1w`,
    `estimator_1ps2w`, `lowlevel_1ps1w` for both of its modes, `lowlevel_1ps1w:exact`);
    None: all of them.

    Raises:
      ValueError: an unknown name (the message lists the known ones).
    """
    bad = [a for a in allowed or [] if a not in ALL and a.split(":")[0] not in
           {n.split(":")[0] for n in ALL}]
    if bad:
        raise ValueError(f"--estimator_configs: unknown {bad}; expected some of {ALL}")
    out = []
    for shape in SHAPES:
        for trainer, mode in CHAIN:
            cfg = _configs.parse_config(f"{trainer}_{shape}", hidden, mode, part="estimator")
            if allowed is None or cfg.name in allowed or cfg.key in allowed:
                out.append(cfg)
    return out


def round_order(cfgs: list, rnd: int) -> list:
    """Round `rnd`'s order: the chain order of `configs`, reversed in odd rounds."""
    return list(cfgs) if rnd % 2 == 0 else list(reversed(cfgs))


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _eps(runs: list, rnd: int, key: tuple) -> Optional[float]:
    for r in runs:
        if r["round"] == rnd and (r["name"], r["mode"]) == key and r.get("ok"):
            return r.get("examples_per_sec")
    return None


def by_round(runs: list) -> list:
    """Per round: {round, loadavg_1m (mean over its runs), ratios {name: value or None}}."""
    out = []
    for rnd in sorted({r["round"] for r in runs}):
        values = {}
        for key, (num, den) in RATIOS.items():
            a, b = _eps(runs, rnd, num), _eps(runs, rnd, den)
            values[key] = round(a / b, 3) if a and b else None
        loads = [r["loadavg_1m"] for r in runs if r["round"] == rnd and
                 r.get("loadavg_1m") is not None]
        out.append({"round": rnd, "loadavg_1m": round(sum(loads) / len(loads), 2)
                    if loads else None, "ratios": values})
    return out


def ratios(runs: list) -> dict:
    """{ratio: median over rounds of the within-round ratio (3 decimals), or None}."""
    rounds = by_round(runs)
    out = {}
    for key in RATIOS:
        v = _median([r["ratios"][key] for r in rounds])
        out[key] = round(v, 3) if v is not None else None
    return out


def targets(ratio: dict) -> dict:
    """{name: {value, op, bound, status PASS|FAIL|SKIP}} of `TARGETS` (`_report.judge`)."""
    return _report.judge(ratio, TARGETS)


def run_suite(cfgs: list, repeats: int, run: Callable, log=print,
              on_run: Optional[Callable] = None) -> dict:
    """Runs `cfgs` for `repeats` rounds with `run(cfg, round, total) -> run dict`
    (`benchmarks.throughput.Bench.run`), in `round_order`; after each run calls
    `on_run(section so far)` if given. Returns results.json's "estimator" section:
    {configs, repeats, runs, records, by_round, ratios, targets, wall_secs}; each run
    with `loadavg_1m`, the one-minute load average when it started."""
    started = time.time()
    total, runs = len(cfgs) * repeats, []
    log(f"estimator: {len(cfgs)} configurations x {repeats} round(s): "
        f"{', '.join(c.key for c in cfgs)}")
    for rnd in range(repeats):
        for cfg in round_order(cfgs, rnd):
            load = _loadavg()
            result = run(cfg, rnd, total)
            result["loadavg_1m"] = load
            runs.append(result)
            if on_run is not None:
                on_run(summary(cfgs, repeats, runs, time.time() - started))
    return summary(cfgs, repeats, runs, time.time() - started)


def summary(cfgs: list, repeats: int, runs: list, wall_secs: float) -> dict:
    """The suite's results.json section from its runs (see `run_suite`)."""
    ratio = ratios(runs)
    return {"configs": [c.key for c in cfgs], "repeats": repeats, "runs": list(runs),
            "records": _report.aggregate(runs), "by_round": by_round(runs), "ratios": ratio,
            "targets": targets(ratio), "wall_secs": round(wall_secs, 1)}


def _loadavg() -> Optional[float]:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def _f(v, fmt):
    return "-" if v is None else format(v, fmt)


def markdown(est: dict) -> str:
    """The "Estimator" section of results.md: the table, the rounds, the targets."""
    lines = ["## Estimator\n",
             "A user's Estimator model_fn (`benchmarks/estimator_model.py`: the MLP from "
             "tf.compat.v1 ops, its own `AdagradOptimizer.minimize(loss, global_step)`, a "
             "tf.data input_fn) trained by lowlevel's runtime (`estimator_*`), against the "
             "textbook between-graph trainer (`classic_*`: replica_device_setter + "
             "MonitoredTrainingSession + feed_dict), and lowlevel's built-in MLP in exact mode "
             "with and without the products on the ps (`lowlevel_*`); the model_fn without "
             "them too (`estimator_* exact_noproducts`, information), async, "
             f"{est['repeats']} round(s), {est['wall_secs']:.0f} s.\n",
             _report.table(est["records"]), "",
             "Ratios of examples/s within each round (load: the mean of the one-minute load "
             "average at the start of the round's runs); the targets' value is the median:\n"]
    rounds = est["by_round"]
    lines.append("| ratio | " + " | ".join(
        f"round {r['round']} (load {_f(r['loadavg_1m'], '.1f')})" for r in rounds) +
        " | median |")
    lines.append("|---|" + "---|" * (len(rounds) + 1))
    for k in RATIOS:
        lines.append(f"| {k} | " + " | ".join(_f(r["ratios"][k], ".3f") for r in rounds) +
                     f" | {_f(est['ratios'][k], '.3f')} |")
    lines += ["", _report.targets_table(est["targets"])]
    return "\n".join(lines) + "\n"
