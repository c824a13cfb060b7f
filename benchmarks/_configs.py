"""The configurations of `benchmarks.throughput`: names, shapes, and the trainer flags.

A configuration is a trainer (local | lowlevel | classic | tf2_pss), a shape (ps tasks,
workers, sync or async), a mode (exact | comm_reduced for lowlevel, n/a otherwise) and the
MLP's hidden widths. Names: `local`, `<trainer>_<P>ps<W>w`, `lowlevel_1ps2w_sync`; sweep
configurations get `_h<width>` appended.
"""

from __future__ import annotations

import dataclasses
import json
import random
from typing import Optional

from benchmarks import _report, _runners
from lowlevel.modes import ps_products

MAIN = ["local", "classic_1ps1w", "classic_1ps2w", "lowlevel_1ps1w", "lowlevel_1ps2w",
        "lowlevel_2ps2w", "lowlevel_1ps2w_sync", "tf2_pss_1ps1w", "tf2_pss_1ps2w"]
SWEEP = ["local", "classic_1ps1w", "lowlevel_1ps1w"]
MODES = ("exact", "comm_reduced")
REF_PARAMS = 669_706  # MLP 784-512-512-10
# Local steps per second per worker for the 0.67 M MLP on 2 cores: the first guess of a
# run's length, replaced by what the configuration measures. From the quick runs of
# 2026-11-24 (batch 128): local 135-160, lowlevel exact 72 (1 worker) and 40 (2 x 0.6),
# comm_reduced 118-132 (1 worker) and 66-78 (2). A guess above the truth lengthens the
# run: 250 made the first communication-reduced runs 2x the 2.5 s --quick window.
# estimator (lowlevel training benchmarks/estimator_model.py's model_fn): 55 on 1 ps + 1
# worker, load 2-5, 2026-11-25.
PRIOR_STEPS_PER_SEC = {"local": 160.0, "classic": 90.0, "lowlevel": 75.0, "tf2_pss": 45.0,
                       "comm_reduced": 135.0, "estimator": 60.0}
# The estimator suite's built-in exact mode without the dense layers' products on the ps
# (`--ps_products=false`): only the fused transfer of the small variables is left of what
# exact mode does beyond the textbook step.
EXACT_NO_PRODUCTS = "exact_noproducts"
MODEL_FN = "benchmarks.estimator_model:model_fn"
INPUT_FN = "benchmarks.estimator_model:input_fn"


@dataclasses.dataclass(frozen=True)
class Config:
    name: str
    trainer: str  # local | lowlevel | classic | tf2_pss | estimator (lowlevel on a model_fn)
    mode: str  # exact | comm_reduced | exact_noproducts for lowlevel; n/a or exact_noproducts
    #            for estimator; n/a for the others
    num_ps: int
    num_workers: int
    sync: bool
    hidden: tuple
    part: str = "main"  # main | sweep | accuracy | estimator
    dataset: str = "synthetic"

    @property
    def params(self) -> int:
        return mlp_params(self.hidden)

    @property
    def key(self) -> str:
        return f"{self.name}:{self.mode}"


def mlp_params(hidden) -> int:
    widths = [784, *hidden, 10]
    return sum(a * b + b for a, b in zip(widths[:-1], widths[1:]))


def parse_config(name: str, hidden: tuple, mode: str, part: str = "main") -> Config:
    if name == "local":
        return Config(name, "local", "n/a", 0, 1, False, hidden, part)
    trainer, _, shape = name.rpartition("_") if not name.endswith("_sync") else \
        name[:-5].rpartition("_")
    num_ps, num_workers = (int(x) for x in shape.rstrip("w").split("ps"))
    keeps_mode = trainer == "lowlevel" or (trainer == "estimator" and mode == EXACT_NO_PRODUCTS)
    return Config(name, trainer, mode if keeps_mode else "n/a", num_ps,
                  num_workers, name.endswith("_sync"), hidden, part)


def selected(names: list, modes: list, hidden: tuple, allowed: Optional[list],
             part: str) -> list:
    out = []
    for name in names:
        for mode in (modes if name.startswith("lowlevel") else ["n/a"]):
            if allowed is not None and name not in allowed and f"{name}:{mode}" not in allowed:
                continue
            cfg = parse_config(name, hidden, mode, part)
            if part == "sweep":
                cfg = dataclasses.replace(cfg, name=f"{name}_h{hidden[0]}")
            out.append(cfg)
    return out


def analytic_bytes(cfg: Config, period: int, batch_size: int) -> int:
    """Bytes a worker's step moves, both ways.

    Each exchange moves every variable once each way, 2 x 4 bytes x parameters; async
    comm_reduced, Adagrad's accumulators too (shared among the workers,
    `lowlevel.modes.local_sgd.ADDITIVE_SLOTS`: twice that; sync keeps them per worker);
    lowlevel's exact step with one ps moves fewer, its dense layers' products placed by
    `lowlevel.modes.ps_products` (with more ps tasks the kernels are sharded and stay
    classic): the built-in MLP's, and the estimator suite's model_fn's with the runtime's
    default flags.
    """
    if cfg.num_ps == 0:
        return 0
    products = ((cfg.trainer == "lowlevel" and cfg.mode == "exact") or
                (cfg.trainer == "estimator" and cfg.mode == "n/a"))  # the runtime's default
    if products and cfg.num_ps == 1:
        # Kernels under lowlevel.modes.exact.SMALL_BYTES (64 KiB) travel with the biases.
        return 4 * ps_products.mlp_step_floats([784, *cfg.hidden, 10], batch_size,
                                               small_floats=(64 << 10) // 4)
    if cfg.mode != "comm_reduced":
        return round(8 * cfg.params)
    shared_slots = 0 if cfg.sync or cfg.trainer != "lowlevel" else 1  # Adagrad's accumulator
    return round(8 * cfg.params * (1 + shared_slots) / period)


def run_config(cfg: Config, warmup: int, measured: int, workdir: str, batch_size: int,
               learning_rate: float, period: int, timeout_secs: float,
               lowlevel_flags: tuple = (), runners=_runners) -> dict:
    """Runs the configuration's trainer: `warmup` + `measured` local steps per worker.

    `lowlevel_flags` are appended to the lowlevel (local, estimator) trainer commands only.
    `runners`: what starts the processes, `_runners` (this machine) or an object with
    the same `run_lowlevel`, `run_classic` and `run_tf2_pss` (`_link_runners.OnHosts`:
    every task on its own host behind a bandwidth-limited link).

    Returns the run dict of `_runners` (examples/s, step ms, bytes, RSS, times).
    """
    steps = warmup + measured
    # The global step to stop at: async, every worker step is one; sync, one per
    # aggregation of one step from each worker.
    global_steps = steps if cfg.sync or cfg.num_ps == 0 else steps * cfg.num_workers
    hidden = ",".join(str(h) for h in cfg.hidden)
    common = [f"--hidden_units={hidden}", f"--batch_size={batch_size}",
              f"--learning_rate={learning_rate}"]
    timeout, batch = timeout_secs, batch_size
    if cfg.trainer in ("local", "lowlevel"):
        flags_ = common + [f"--dataset={cfg.dataset}", "--model=mlp", "--optimizer=adagrad",
                           f"--warmup_steps={warmup}",
                           "--save_checkpoint_secs=100000", "--log_every_secs=5",
                           f"--train_steps={global_steps}"]
        if cfg.sync:
            flags_.append("--sync")
        if cfg.mode == "comm_reduced":
            flags_.append(f"--communication_period={period}")
        if cfg.mode == EXACT_NO_PRODUCTS:
            flags_.append("--ps_products=false")
        flags_ += list(lowlevel_flags)
        return runners.run_lowlevel(cfg.num_ps, cfg.num_workers, flags_, workdir, timeout,
                                     batch)
    if cfg.trainer == "estimator":  # the same runtime, on benchmarks/estimator_model.py
        params = {"hidden_units": list(cfg.hidden), "learning_rate": learning_rate,
                  "batch_size": batch_size}
        flags_ = [f"--model={MODEL_FN}", f"--input_fn={INPUT_FN}",
                  f"--params={json.dumps(params)}", f"--warmup_steps={warmup}",
                  "--save_checkpoint_secs=100000", "--log_every_secs=5",
                  f"--train_steps={global_steps}"]
        if cfg.mode == EXACT_NO_PRODUCTS:
            flags_.append("--ps_products=false")
        flags_ += list(lowlevel_flags)
        return runners.run_lowlevel(cfg.num_ps, cfg.num_workers, flags_, workdir, timeout,
                                     batch)
    if cfg.trainer == "classic":
        flags_ = common + [f"--train_steps={steps * cfg.num_workers}",
                           f"--warmup_steps={warmup}"]
        return runners.run_classic(cfg.num_ps, cfg.num_workers, flags_, workdir, timeout,
                                    batch)
    flags_ = common + [f"--train_steps={steps * cfg.num_workers}",
                       f"--warmup_steps={warmup * cfg.num_workers}"]
    return runners.run_tf2_pss(cfg.num_ps, cfg.num_workers, flags_, workdir, timeout, batch)


def paired_order(cfgs: list, rng: random.Random) -> list:
    """A round's order: shuffled, except that the two sides of every ratio
    (`_report.RATIOS`; of one with alternatives, the first) run back to back where
    the ratios allow it.

    The ratios link the configurations into chains (lowlevel_1ps1w exact - local -
    lowlevel_1ps1w comm_reduced; sync exact - 1ps2w exact - tf2_pss - 1ps2w
    comm_reduced - sync comm_reduced); each chain runs in a row, forwards or
    backwards, and the chains in shuffled order. The machine's speed drifts by
    10-25 % over tens of seconds here (a 2-core VM on a shared host), and a ratio is
    taken within a round: two runs seconds apart see the same machine, two a round
    apart often do not. This changes which runs are compared, not what a run measures.
    """
    by_key = {c.key: c for c in cfgs}
    links: dict = {k: [] for k in by_key}
    for num, den in _report.RATIOS.values():
        a = num[0] if isinstance(num[0], tuple) else num
        b = den[0] if isinstance(den[0], tuple) else den
        a, b = f"{a[0]}:{a[1]}", f"{b[0]}:{b[1]}"
        if a in by_key and b in by_key:
            links[a].append(b)
            links[b].append(a)
    chains, placed = [], set()
    # Start each chain at an end (fewest links), then walk it depth first.
    for key in sorted(by_key, key=lambda k: (len(links[k]), rng.random())):
        if key in placed:
            continue
        chain, todo = [], [key]
        while todo:
            k = todo.pop()
            if k in placed:
                continue
            placed.add(k)
            chain.append(by_key[k])
            todo += [n for n in links[k] if n not in placed]
        if rng.random() < 0.5:
            chain.reverse()
        chains.append(chain)
    rng.shuffle(chains)
    return [c for chain in chains for c in chain]
