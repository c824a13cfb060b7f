"""Towers against single-device workers: bytes per example on the wire, and examples/s.

    python -m benchmarks.towers                 # 3 rounds x 2 sides: ~2 min on 2 idle cores
    python -m benchmarks.towers --repeats=5 --towers=2 --measured_steps=600
    python -m benchmarks.towers --model=model_fn   # the MLP as a user's Estimator model_fn

Two sides, every task a process on this machine (`python -m lowlevel.launch
--no_isolation`), the built-in MLP (784-512-512-10 on synthetic MNIST-shaped data,
Adagrad), exact mode without the dense layers' products on the ps (`--ps_products=false`:
what a GPU worker does; towers keep their products on the worker too):

  towers    1 ps + 1 worker with `--towers=N` (N logical CPU devices standing in for N
            GPUs), each tower `--batch_size` examples: N x batch_size a worker step
  workers   1 ps + N workers with one device each, `--batch_size` examples a step

so both sides train N x batch_size examples per round of N devices. With
`--model=model_fn` the MLP is a user's Estimator model_fn (benchmarks/estimator_model.py,
its own Adagrad train_op) whose input_fn reads N x batch_size on the towers side, split
among the towers. Each round runs
both, the order alternating, one cluster at a time.

The figures of a run (`benchmarks._runners`):

  bytes/example  the TCP bytes (both ways) between a worker and the ps per local step in
                 its measured window (`ss` counters, `_measure.Watcher`), over the examples
                 of that step: towers x batch_size, or batch_size
  examples/s     all workers, after warm-up
  final step     the run's final global step (must be the step asked for)

The ratio is towers / workers of bytes per example within a round; the summary gives
the median over rounds. Target (towers on N = 2 devices): <= 0.55, half with 10 %
for the per-step constants (the step's number, RPC framing). Examples/s is information
here: on 2 cores the logical devices share the same cores, so towers measure the wire,
not the compute.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile

from absl import app, flags

from benchmarks import _configs, _runners

FLAGS = flags.FLAGS
flags.DEFINE_integer("repeats", 3, "Rounds (each runs both sides).")
flags.DEFINE_integer("towers", 2, "Towers of the towers side, and workers of the other.")
flags.DEFINE_integer("batch_size", 128, "Examples per tower (per worker on the other side).")
flags.DEFINE_integer("warmup_steps", 50, "Local steps per worker left out of the window.")
flags.DEFINE_integer("measured_steps", 400, "Local steps per worker in the window.")
flags.DEFINE_string("out", None, "Directory for the runs and results.json (default: a "
                    "new temporary directory).")
flags.DEFINE_float("timeout_secs", 300, "A run still going after this is killed (failed).")
flags.DEFINE_enum("model", "builtin", ["builtin", "model_fn"], "builtin: lowlevel's MLP; "
                  "model_fn: the same MLP as a user's Estimator model_fn "
                  "(benchmarks/estimator_model.py), whose input_fn's batch the towers split.")

TARGET = 0.55


def _run(side: str, workdir: str) -> dict:
    """One cluster of `side` (towers | workers); the run dict of `_runners` plus
    bytes_per_example and the global step it should end at."""
    n, steps = FLAGS.towers, FLAGS.warmup_steps + FLAGS.measured_steps
    workers, towers = (1, n) if side == "towers" else (n, 1)
    common = [f"--towers={towers}", f"--warmup_steps={FLAGS.warmup_steps}",
              "--save_checkpoint_secs=100000", "--log_every_secs=5",
              f"--train_steps={steps * workers}"]
    if FLAGS.model == "builtin":
        flags_ = common + ["--model=mlp", "--dataset=synthetic", "--hidden_units=512,512",
                           f"--batch_size={FLAGS.batch_size}", "--ps_products=false",
                           "--optimizer=adagrad"]
    else:  # the input_fn's batch is the worker's: towers x batch_size, split among them
        params = {"hidden_units": [512, 512], "learning_rate": 0.1,
                  "batch_size": FLAGS.batch_size * towers}
        flags_ = common + [f"--model={_configs.MODEL_FN}", f"--input_fn={_configs.INPUT_FN}",
                           f"--params={json.dumps(params)}"]
    run = _runners.run_lowlevel(1, workers, flags_, workdir, FLAGS.timeout_secs,
                                FLAGS.batch_size * towers)
    run["expected_step"] = steps * workers
    if run.get("bytes_per_step"):
        run["bytes_per_example"] = run["bytes_per_step"] / (FLAGS.batch_size * towers)
    return run


def summarise(rounds: list) -> dict:
    """Medians over the rounds of each side's figures and of the ratio."""
    def median(values):
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else None

    ratios = [r["towers"]["bytes_per_example"] / r["workers"]["bytes_per_example"]
              for r in rounds
              if r["towers"].get("bytes_per_example") and r["workers"].get("bytes_per_example")]
    out = {side: {k: median([r[side].get(k) for r in rounds])
                  for k in ("bytes_per_example", "examples_per_sec")}
           for side in ("towers", "workers")}
    exact = all(r[s].get("global_step") == r[s]["expected_step"] for r in rounds
                for s in ("towers", "workers"))
    out.update(ratio=median(ratios), ratios=[round(x, 3) for x in ratios],
               final_step_exact=exact, target=TARGET)
    out["pass"] = bool(out["ratio"] is not None and out["ratio"] <= TARGET and exact)
    return out


def main(argv) -> None:
    del argv
    out = FLAGS.out or tempfile.mkdtemp(prefix="towers_bench_")
    rounds = []
    for i in range(FLAGS.repeats):
        order = ("towers", "workers") if i % 2 == 0 else ("workers", "towers")
        result = {}
        for side in order:
            workdir = os.path.join(out, f"{side}_r{i}")
            os.makedirs(workdir, exist_ok=True)
            run = _run(side, workdir)
            if not run.get("ok"):
                raise SystemExit(f"{side}, round {i}: {run.get('error') or run}")
            result[side] = run
            print(f"round {i} {side:8s} bytes/example "
                  f"{run.get('bytes_per_example') or float('nan'):9.0f}  examples/s "
                  f"{run['examples_per_sec']:9.1f}  final step {run['global_step']}"
                  f" (asked {run['expected_step']})", flush=True)
        rounds.append({s: {k: result[s].get(k) for k in (
            "bytes_per_example", "bytes_per_step", "examples_per_sec", "global_step",
            "expected_step")} for s in result})
    summary = summarise(rounds)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump({"rounds": rounds, "summary": summary}, f, indent=1)
    print(f"towers={FLAGS.towers} / {FLAGS.towers} workers, bytes per example: median "
          f"{summary['ratio']:.3f} (rounds {summary['ratios']}; target <= {TARGET}): "
          f"{'PASS' if summary['pass'] else 'FAIL'}")
    print(json.dumps(summary))


if __name__ == "__main__":
    app.run(main)
