"""The sparse suite of `benchmarks.throughput` (`--suite=sparse`; short in `--quick`).

The wide & deep click-through model (`lowlevel/models/wide_deep.py`) on Criteo-shaped synthetic
clicks (`lowlevel.data.ctr.synthetic_ctr`), `--sparse_vocab_size` rows over the 26 fields
(10 M x 16 floats: 640 MB of deep tables, 40 MB of wide ones, and as much again
of Adagrad accumulators), 2 ps + 2 workers, async Adagrad 0.1, batch 256, side by side:

  lowlevel   `python -m lowlevel.launch --model=wide_deep --dataset=synthetic_ctr ...`
             (the fields share one table per part, split by rows into one shard per ps;
             ids deduplicated on the worker; rows initialised lazily)
  lowlevel_dynamic  the same with `--embedding=dynamic`: raw ids in hash tables on the ps
             (`--sparse_dynamic_capacity` rows per shard), live rows reported; targets
             against lowlevel: >= 0.8x its examples/s, test AUC within 0.005
  classic    `benchmarks/classic_sparse.py`: the textbook TF1 trainer, `embedding_lookup`
             on `fixed_size_partitioner(2)` tables, round-robin placement, no deduplication
  tf2_pss    `benchmarks/tf2_pss_sparse.py`: TF2 ParameterServerStrategy with
             `FixedShardsPartitioner(2)` sharded variables

Each (or those of `--sparse_trainers`) runs `--sparse_steps` measured local steps per
worker after `--sparse_warmup_steps`,
in a shuffled order, `--sparse_repeats` rounds (figures: medians; ratios: medians of the
within-round ratios), each bounded by `--sparse_timeout_secs` (a run past it is reported
as a timeout). Figures (units): examples/s (all workers, after warm-up); bytes per step
(between one worker and all ps tasks per local step, both directions, from the kernel's
TCP counters: `_measure.Watcher`); the limit beside it (`limit`); ps byte imbalance
(bytes each ps moved in the measured windows, max / mean); peak RSS per task (VmHWM, MiB);
each lowlevel ps's state (the bytes of the variables on it, from the chief's graph), its
RSS over state, and the target peak RSS <= 0.5 GiB + 1.25 x state (`sparse_ps_rss_over_budget`).

Every run goes under a memory limit of its own (`--sparse_memory_limit`, default 85 % of
the machine's memory: `_memory.limited`, a cgroup all the run's processes share): at
100 M rows a trainer that does not fit is killed within its cgroup and reported as "did
not fit in <limit>: out of memory, peak <cgroup peak>", and the suite goes on.

The limit (`limit`): what a step must move at least, from the unique ids of batches drawn
as the trainers draw them from the same training split: every unique row touched, each
way, 4 bytes per float (deep: `embedding_dim` floats, wide: 1, per field; 1 per cross),
plus the dense part (the MLP, the wide part's dense unit) once each way. Ids themselves
(8 bytes per unique id and table) and gRPC framing are not in it: they are the measured
figure's overhead over the limit.
"""

from __future__ import annotations

import dataclasses
import os
import random
import re
import shutil
import time
from typing import Optional

import numpy as np

from benchmarks import _memory, _runners
from benchmarks._sparse_report import TARGETS, TRAINERS, aggregate, markdown, ratios, rss_over_budget, rss_over_state, targets  # noqa: F401 (the suite's report, re-exported)
from lowlevel.data import ctr as ctr_data
from lowlevel.ops import resources


@dataclasses.dataclass(frozen=True)
class Settings:
    vocab_size: int = 10_000_000
    embedding_dim: int = 16
    hash_buckets: int = 10000
    hidden_units: tuple = (128, 128)
    batch_size: int = 256
    learning_rate: float = 0.1
    warmup_steps: int = 30  # local steps per worker, not measured
    steps: int = 400  # measured local steps per worker
    num_ps: int = 2
    num_workers: int = 2
    repeats: int = 1
    timeout_secs: float = 420.0
    # every run (all its processes) in a memory cgroup of this many bytes (`_memory`);
    # None: 85 % of the machine's memory; 0: no limit
    memory_limit_bytes: Optional[int] = None
    dynamic_capacity: int = 1_000_000  # lowlevel_dynamic: rows per ps shard of each table
    trainers: tuple = TRAINERS  # which of TRAINERS run (a target missing one of its pair: SKIP)


QUICK = dict(vocab_size=1_000_000, warmup_steps=10, steps=80, timeout_secs=150.0)


def unique_per_batch(columns: np.ndarray, batch_size: int, num_batches: int = 64,
                     seed: int = 0) -> np.ndarray:
    """Mean number of distinct ids per column in batches of `batch_size` rows.

    Batches are drawn as the trainers draw theirs: consecutive slices of a random
    permutation of the rows. `columns` int64 `[N, K]` -> float64 `[K]`.
    """
    rng = np.random.default_rng(seed)
    n = len(columns) // batch_size * batch_size
    if n == 0:
        raise ValueError(f"{len(columns)} rows: fewer than one batch of {batch_size}")
    counts, taken = np.zeros(columns.shape[1]), 0
    while taken < num_batches:
        perm = rng.permutation(len(columns))[:n]
        for lo in range(0, n, batch_size):
            batch = np.sort(columns[perm[lo:lo + batch_size]], axis=0)
            counts += 1 + (np.diff(batch, axis=0) != 0).sum(axis=0)
            taken += 1
            if taken == num_batches:
                break
    return counts / num_batches


def dense_params(num_dense: int, num_fields: int, embedding_dim: int, hidden_units) -> int:
    """Parameters of the dense part: the wide unit on the dense features and the deep MLP."""
    widths = [num_dense + num_fields * embedding_dim, *hidden_units, 1]
    return (num_dense + 1) + sum(a * b + b for a, b in zip(widths[:-1], widths[1:]))


def limit_bytes(unique_fields, unique_crosses, embedding_dim: int, dense: int) -> dict:
    """The least bytes a worker step moves (both ways, float32), by part.

    Args:
      unique_fields: distinct ids per batch of each categorical field (each is a deep row of
        `embedding_dim` floats and a wide row of 1).
      unique_crosses: distinct ids per batch of each cross (a wide row of 1 float).
      dense: parameters of the dense part (read and updated whole every step).
    Returns:
      {"sparse", "dense", "total"}: bytes per step.
    """
    rows = float(np.sum(unique_fields)) * (embedding_dim + 1) + float(np.sum(unique_crosses))
    sparse, dense_b = 2 * 4 * rows, 2 * 4 * dense
    return {"sparse": round(sparse), "dense": round(dense_b), "total": round(sparse + dense_b)}


def imbalance(bytes_by_ps: Optional[dict]) -> Optional[float]:
    """max / mean of the bytes each ps task moved; None without bytes."""
    values = list((bytes_by_ps or {}).values())
    if not values or sum(values) <= 0:
        return None
    return round(max(values) / (sum(values) / len(values)), 3)


def limit(s: Settings) -> dict:
    data = ctr_data.synthetic_ctr(s.vocab_size, s.hash_buckets)
    uf = unique_per_batch(data.train.categorical, s.batch_size)
    uc = unique_per_batch(data.train.crosses, s.batch_size)
    out = limit_bytes(uf, uc, s.embedding_dim,
                      dense_params(data.num_dense, len(data.field_sizes), s.embedding_dim,
                                   s.hidden_units))
    out.update(unique_ids_per_batch=round(float(uf.sum() + uc.sum()), 1),
               ids_per_batch=s.batch_size * (len(uf) + len(uc)),
               table_bytes=4 * s.vocab_size * (s.embedding_dim + 1))
    return out


_DTYPE_BYTES = {"DT_FLOAT": 4, "DT_INT64": 8, "DT_INT32": 4, "DT_DOUBLE": 8, "DT_BOOL": 1}


def ps_state_bytes(graph_pbtxt: str) -> dict:
    """{ps task name: bytes of the variables on it} from a chief's `graph.pbtxt`.

    Every `VarHandleOp`/`VariableV2` placed on `/job:ps/task:K` counts by its
    shape and dtype: the model's variables and shards, their optimizer slots,
    the global step. {} if the file is missing. Source: the graph the chief ran.
    """
    try:
        with open(graph_pbtxt) as f:
            text = f.read()
    except OSError:
        return {}
    held: dict = {}
    for node in text.split("\nnode {")[1:]:
        op = re.search(r'\n  op: "(\w+)"', node)
        device = re.search(r'\n  device: "/job:ps/task:(\d+)', node)
        if not (op and device and op.group(1) in ("VarHandleOp", "VariableV2")):
            continue
        dtype = re.search(r'key: "dtype"\s*value \{\s*type: (\w+)', node)
        shape = re.search(r'key: "shape"\s*value \{\s*shape \{(.*?)\n      \}', node, re.DOTALL)
        dims = [int(d) for d in re.findall(r"size: (-?\d+)", shape.group(1))] if shape else []
        n = int(np.prod(dims)) if dims else 1
        name = f"ps{device.group(1)}"
        held[name] = held.get(name, 0) + max(n, 0) * _DTYPE_BYTES.get(
            dtype.group(1) if dtype else "", 4)
    return held


def run_one(trainer: str, s: Settings, workdir: str) -> dict:
    """One trainer's run under the suite's memory limit: `_runners`' run dict plus
    `imbalance`, `memory` (`_memory.Box` as a dict) and, for lowlevel, `ps_state_bytes`
    (`ps_state_bytes` of the chief's graph). A run the limit killed fails with "did not
    fit in ...: out of memory" and its peak."""
    limit = (_memory.default_limit_bytes() if s.memory_limit_bytes is None
             else s.memory_limit_bytes)
    with _memory.limited(limit) as box:
        run = _run_one(trainer, s, workdir)
    run["memory"] = dataclasses.asdict(box)
    if box.words():  # whatever else it saw (a timeout, a task's exit) followed from that
        run.update(ok=False, timeout=False, error=f"{box.words()}\n{run.get('error') or ''}")
    return run


def _run_one(trainer: str, s: Settings, workdir: str) -> dict:
    hidden = ",".join(map(str, s.hidden_units))
    model = [f"--vocab_size={s.vocab_size}", f"--embedding_dim={s.embedding_dim}",
             f"--hash_buckets={s.hash_buckets}", f"--hidden_units={hidden}",
             f"--batch_size={s.batch_size}", f"--learning_rate={s.learning_rate}"]
    per_worker = s.warmup_steps + s.steps
    if trainer in ("lowlevel", "lowlevel_dynamic"):
        if trainer == "lowlevel_dynamic":
            model = model + ["--embedding=dynamic", f"--dynamic_capacity={s.dynamic_capacity}"]
        flags = model + ["--model=wide_deep", "--dataset=synthetic_ctr", "--optimizer=adagrad",
                         f"--warmup_steps={s.warmup_steps}", "--keep_exports=0",
                         f"--train_steps={per_worker * s.num_workers}",
                         "--save_checkpoint_secs=100000", "--log_every_secs=5"]
        run = _runners.run_lowlevel(s.num_ps, s.num_workers, flags, workdir, s.timeout_secs,
                                    s.batch_size)
        run["ps_state_bytes"] = ps_state_bytes(os.path.join(workdir, "out", "graph.pbtxt"))
    elif trainer == "classic":
        flags = model + [f"--train_steps={per_worker * s.num_workers}",
                         f"--warmup_steps={s.warmup_steps}", f"--num_partitions={s.num_ps}"]
        run = _runners.run_classic(s.num_ps, s.num_workers, flags, workdir, s.timeout_secs,
                                   s.batch_size, module="benchmarks.classic_sparse")
    else:
        flags = model + [f"--train_steps={per_worker * s.num_workers}",
                         f"--warmup_steps={s.warmup_steps * s.num_workers}",
                         f"--num_partitions={s.num_ps}"]
        run = _runners.run_tf2_pss(s.num_ps, s.num_workers, flags, workdir, s.timeout_secs,
                                   s.batch_size, module="benchmarks.tf2_pss_sparse")
    for root, _, files in os.walk(workdir):  # a 10 M-row checkpoint is 1.4 GB
        for f in files:
            if f.startswith(("model.ckpt", "events.out", "graph.pbtxt")):
                os.remove(os.path.join(root, f))
    error = run.get("error") or ""
    run["timeout"] = not run.get("ok") and ("timed out after" in error or
                                            "still running after" in error)
    run["imbalance"] = imbalance(run.get("bytes_by_ps"))
    return run


def describe(trainer: str, run: dict) -> str:
    if not run.get("ok"):
        return f"sparse {trainer}: FAILED ({run.get('error', '').strip().splitlines()[0]})"
    b = run.get("bytes_per_step")
    rss = run.get("peak_rss_mb") or {}
    state = run.get("ps_state_bytes") or {}
    held = (f" (ps state {max(state.values()) / 2**20:,.0f} MiB)" if state else "")
    return (f"sparse {trainer}: {run['examples_per_sec']:,.0f} examples/s, "
            f"{'-' if b is None else f'{b / 1e6:.3f}'} MB/step, imbalance "
            f"{run.get('imbalance')}, peak RSS {max(rss.values(), default=0):.0f} MiB{held}, "
            f"startup {run.get('startup_secs')} s ({run.get('wall_secs')} s)")


def run_suite(s: Settings, out: str, seed: int = 0, log=print) -> dict:
    """Runs the suite into `out`/runs/sparse-*; returns results.json's "sparse" section."""
    started = time.time()
    lim = limit(s)
    log(f"sparse: vocab {s.vocab_size:,} x dim {s.embedding_dim}, {s.num_ps} ps + "
        f"{s.num_workers} workers, batch {s.batch_size}; limit {lim['total'] / 1e6:.3f} MB/step "
        f"({lim['unique_ids_per_batch']:.0f} unique of {lim['ids_per_batch']} ids per batch)")
    rng, runs = random.Random(seed), []
    for rnd in range(s.repeats):
        order = [t for t in TRAINERS if t in s.trainers]
        rng.shuffle(order)
        for trainer in order:
            workdir = os.path.join(out, "runs", f"sparse-{rnd}-{trainer}")
            shutil.rmtree(workdir, ignore_errors=True)
            os.makedirs(workdir)
            run = dict(run_one(trainer, s, workdir), trainer=trainer, round=rnd)
            runs.append(run)
            log(describe(trainer, run))
    result = {"settings": dataclasses.asdict(s), "limit": lim, "runs": runs,
              "records": aggregate(runs), "wall_secs": round(time.time() - started, 1)}
    result["ratios"] = ratios(runs, lim)
    result["targets"] = targets(result["ratios"])
    return result


def define_flags(flags) -> None:
    """The suite's flags of `benchmarks.throughput` (`sparse_*`)."""
    d = Settings()
    flags.DEFINE_integer("sparse_vocab_size", None, f"Rows of the 26 fields' tables in all "
                         f"(default {d.vocab_size:,}; quick: {QUICK['vocab_size']:,}).")
    flags.DEFINE_integer("sparse_embedding_dim", d.embedding_dim, "Embedding width.")
    flags.DEFINE_integer("sparse_steps", None, f"Measured local steps per worker (default "
                         f"{d.steps}; quick: {QUICK['steps']}).")
    flags.DEFINE_integer("sparse_warmup_steps", None, f"Warm-up local steps per worker "
                         f"(default {d.warmup_steps}; quick: {QUICK['warmup_steps']}).")
    flags.DEFINE_integer("sparse_repeats", d.repeats, "Rounds of the three trainers.")
    flags.DEFINE_string("sparse_memory_limit", None, "Memory limit of each run, all its "
                        "processes together, as a Kubernetes quantity (20Gi); 0: none "
                        "(default: 85% of the machine's memory).")
    flags.DEFINE_list("sparse_trainers", list(d.trainers), "The trainers to run, of "
                      f"{', '.join(TRAINERS)}.")
    flags.DEFINE_integer("sparse_dynamic_capacity", d.dynamic_capacity,
                         "lowlevel_dynamic: rows per ps shard of each dynamic table.")
    flags.DEFINE_float("sparse_timeout_secs", None, f"A run still going after this many "
                       f"seconds is stopped and reported as a timeout (default "
                       f"{d.timeout_secs:g}; quick: {QUICK['timeout_secs']:g}).")


def _trainers(names) -> Optional[tuple]:
    """--sparse_trainers as a tuple; ValueError naming an unknown one."""
    if names is None:
        return None
    unknown = sorted(set(names) - set(TRAINERS))
    if unknown:
        raise ValueError(f"--sparse_trainers: unknown {', '.join(unknown)}; choose from "
                         f"{', '.join(TRAINERS)}")
    return tuple(names)


def _limit(text: Optional[str]) -> Optional[int]:
    """--sparse_memory_limit in bytes: None (the default share), 0 (none) or the quantity."""
    if text is None or text.strip().lower() in ("0", "none"):
        return None if text is None else 0
    return resources.memory_quantity(text)


def settings_from_flags(values, quick: bool) -> Settings:
    """`Settings` from the parsed `sparse_*` flags; unset ones from QUICK if `quick`."""
    base = dataclasses.replace(Settings(), **QUICK) if quick else Settings()
    given = {"vocab_size": values.sparse_vocab_size, "embedding_dim": values.sparse_embedding_dim,
             "steps": values.sparse_steps, "warmup_steps": values.sparse_warmup_steps,
             "repeats": values.sparse_repeats, "timeout_secs": values.sparse_timeout_secs,
             "dynamic_capacity": values.sparse_dynamic_capacity,
             "trainers": _trainers(values.sparse_trainers),
             "memory_limit_bytes": _limit(values.sparse_memory_limit)}
    return dataclasses.replace(base, **{k: v for k, v in given.items() if v is not None})
