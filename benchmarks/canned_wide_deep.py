"""The canned wide & deep estimator script as a TF_CONFIG cluster: tensorflow 2.15 against lowlevel.

    python -m benchmarks.canned_wide_deep        # 2 rounds x 2 sides, 2000 steps: ~2.5 min
                                                 # on the idle 2-core machine, ~4 min loaded
    python -m benchmarks.canned_wide_deep --repeats=1 --max_steps=1000 --evaluator
    python -m benchmarks.canned_wide_deep --repeats=3 --communication_period=8
                                                 # lowlevel in the communication-reduced mode

Runs tests/estimator_scripts/wide_deep_movielens.py (MovieLens 100K,
`tf.estimator.DNNLinearCombinedClassifier` under `tf.estimator.train_and_evaluate`,
unmodified) as one ps, a chief and `--num_workers` workers (async; plus an evaluator with
`--evaluator`), every task a process of its own with its TF_CONFIG, on free loopback ports:

  tf2.15    `REF_PYTHON SCRIPT ...` with `--ref_python` (default /work/ref215/bin/python:
            tensorflow 2.15.1 + tensorflow-estimator 2.15.0)
  lowlevel  `python -m lowlevel.estimator SCRIPT ...` with this interpreter (TF 2.21); with
            `--communication_period=K` > 1 its tasks get LOWLEVEL_COMMUNICATION_PERIOD=K (K
            local steps between exchanges with the ps, lowlevel/modes/local_sgd.py), else
            the exact async mode

Both sides in each round, the order alternating (round 0: tf2.15 first, round 1: lowlevel
first, ...), `--repeats` rounds, one cluster at a time. Every task starts at once; each
side keeps its own start-up behaviour (2.15's non-chief worker sleeps 5 s before it
starts, lowlevel's starts when the chief has the model).

The figures of a run, the same definitions for both sides:

  examples/s  final global step x batch_size / window, where the window runs from the
              first training step of the cluster (the earliest arrival, at this driver,
              of a training task's first progress line: 2.15's LoggingTensorHook
              "loss = ..., step = N", lowlevel's "step N/M | loss ..."; each is logged
              right after the task's first `session.run`) to the chief's final checkpoint
              (the mtime of its `.index` file; both write it when training ends, before
              the script's own evaluation). Start-up (imports, graph, session creation)
              and the chief's closing evaluation are outside it; periodic checkpoint saves
              (none at these lengths: every 600 s) would be inside.
  final step  the global step of the chief's final checkpoint (`checkpoint` file).
  test AUC    the chief's RESULT line: `estimator.evaluate(name="chief")` on the 20 %
              test split after training (both sides evaluate the same final checkpoint
              the same way).
  chief eps   information: the chief's own RESULT `examples_per_sec` (its local steps x
              batch / its training seconds: this task only).
  startup     information: first process started -> the window's start.
  steady      information: the same rate from the first progress line (any training
              task) at least `--steady_warmup_secs` (2) after the LAST training task's
              first step, to the final checkpoint: every worker training, past its
              warm-up. (2.15's chief trains alone until its worker's 5 s start delay and
              graph building are over; the headline window counts that time, this does
              not.) With it, per task, the CPU time (user + system, children included;
              psutil sampled every 0.2 s) in that span per global step.

The ratio is lowlevel / tf2.15 examples/s within a round (also of the steady rates); the
summary gives the median over rounds of each side and of the ratios, and the AUC
difference (lowlevel - 2.15, of the medians). Target (the issue's): ratio >= 1.5 with
|AUC difference| <= 0.01. The machine is shared: the one-minute load average at each
run's start is in the table; compare only figures of the same invocation.

Processes: after the chief exits, the workers (lowlevel: every task) get `--linger_secs`
to exit by themselves (2.15's ps and evaluator never do: `server.join()`, so they are not
waited for), then every process still running is killed by PID, its children included; a
cluster still running after `--timeout_secs` is killed the same way (that run is reported
as failed). Each task's output goes to
OUT/<side>_r<round>/<task>.log, every line prefixed with the Unix time it arrived at.
The last line printed is the summary as one JSON object (also OUT/results.json).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Optional

import portpicker
import psutil

from benchmarks import _measure

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tests", "estimator_scripts", "wide_deep_movielens.py")
SIDES = ("tf2.15", "lowlevel")
# A training task's progress line, logged after its first session.run and then periodically.
# Group 1: the global step the line reports.
STEP_LINE = {
    "tf2.15": re.compile(r"INFO:tensorflow:loss = [-\d.e+naninf]+, step = (\d+)"),
    "lowlevel": re.compile(r"step (\d+)/\d+ \| loss "),
}
TRAINING = ("chief", "worker")
TARGET_RATIO, AUC_TOLERANCE = 1.5, 0.01


class Task:
    """One process of a cluster; its output lines, timestamped as they arrive, go to `log`."""

    def __init__(self, name: str, argv: list, env: dict, log: str, step_line: re.Pattern):
        self.name, self.log = name, log
        self.first_step_unix: Optional[float] = None
        self.steps_seen: list = []  # (arrival unix time, global step) of its progress lines
        self.result: Optional[dict] = None
        self.exit_unix: Optional[float] = None
        self.killed = False
        self._step_line = step_line
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=env, cwd=ROOT)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.cpu_samples: list = []  # (unix time, CPU seconds of the process and children)

    def sample_cpu(self) -> None:
        try:
            root = psutil.Process(self.proc.pid)
            total = 0.0
            for p in [root] + root.children(recursive=True):
                t = p.cpu_times()
                total += t.user + t.system
        except psutil.Error:
            return
        self.cpu_samples.append((time.time(), total))

    def cpu_between(self, start: float, end: float) -> Optional[float]:
        """CPU seconds used between `start` and `end` (linear between samples)."""
        s = self.cpu_samples
        if len(s) < 2 or s[0][0] > start:
            return None

        def at(t):
            for (t0, c0), (t1, c1) in zip(s, s[1:]):
                if t0 <= t <= t1:
                    return c0 + (c1 - c0) * (t - t0) / (t1 - t0) if t1 > t0 else c1
            return s[-1][1] if t > s[-1][0] else None
        a, b = at(start), at(end)
        return None if a is None or b is None else b - a

    def _read(self) -> None:
        with open(self.log, "w") as out:
            for raw in self.proc.stdout:
                now = time.time()
                line = raw.decode("utf-8", "replace")
                out.write(f"[{now:.3f}] {line}")
                m = self._step_line.search(line)
                if m:
                    self.steps_seen.append((now, int(m.group(1))))
                    if self.first_step_unix is None:
                        self.first_step_unix = now
                if line.startswith("RESULT "):
                    try:
                        self.result = json.loads(line[len("RESULT "):])
                    except ValueError:
                        pass

    def poll(self) -> Optional[int]:
        code = self.proc.poll()
        if code is not None and self.exit_unix is None:
            self.exit_unix = time.time()
        return code

    def kill(self) -> None:
        """SIGKILL to this process and every child of it still running (by PID)."""
        if self.poll() is not None:
            return
        try:
            _measure.kill_tree([psutil.Process(self.proc.pid)])
        except psutil.NoSuchProcess:
            pass
        self.proc.wait(timeout=10)
        self.killed = True
        self.poll()

    def join_reader(self) -> None:
        self._reader.join(timeout=5)

    def tail(self, lines: int = 12) -> str:
        try:
            with open(self.log, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""


def _final_checkpoint(model_dir: str) -> tuple[Optional[int], Optional[float]]:
    """(global step, mtime of its .index) of the checkpoint the `checkpoint` file names last."""
    try:
        with open(os.path.join(model_dir, "checkpoint")) as f:
            text = f.read()
    except OSError:
        return None, None
    m = re.search(r'^model_checkpoint_path: "([^"]+)"', text, re.M)
    if not m:
        return None, None
    path = m.group(1)
    if not os.path.isabs(path):
        path = os.path.join(model_dir, path)
    step = re.search(r"-(\d+)$", path)
    try:
        mtime = os.path.getmtime(path + ".index")
    except OSError:
        mtime = None
    return (int(step.group(1)) if step else None), mtime


def _env(side: str, tf_config: dict, communication_period: int = 1) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("TF_CONFIG", "PYTHONPATH", "LOWLEVEL_COMMUNICATION_PERIOD")}
    env.update(PYTHONUNBUFFERED="1", TF_CONFIG=json.dumps(tf_config))
    if side == "lowlevel":
        env["PYTHONPATH"] = ROOT
        if communication_period > 1:
            env["LOWLEVEL_COMMUNICATION_PERIOD"] = str(communication_period)
    return env


def _layout(flags) -> tuple[dict, list]:
    """(cluster spec on free loopback ports, [(job, index)] of every task to start)."""
    def port():
        return f"127.0.0.1:{portpicker.pick_unused_port()}"
    spec = {"chief": [port()], "worker": [port() for _ in range(flags.num_workers)],
            "ps": [port() for _ in range(flags.num_ps)]}
    if not spec["worker"]:
        del spec["worker"]
    roles = ([("ps", i) for i in range(flags.num_ps)] + [("chief", 0)] +
             [("worker", i) for i in range(flags.num_workers)] +
             ([("evaluator", 0)] if flags.evaluator else []))
    return spec, roles


def _start(side: str, flags, workdir: str, model_dir: str, tasks: dict) -> None:
    """Starts every task of the cluster at once into `tasks` ({name: Task}; filled as each
    starts, so that the caller ends those already started if one fails to)."""
    spec, roles = _layout(flags)
    runner = ([flags.ref_python] if side == "tf2.15" else
              [flags.python, "-m", "lowlevel.estimator"])
    argv = runner + [flags.script, f"--data_dir={flags.data_dir}",
                     f"--model_dir={model_dir}", f"--max_steps={flags.max_steps}",
                     f"--batch_size={flags.batch_size}", *flags.script_args]
    for job, index in roles:
        name = f"{job}{index}"
        tf_config = {"cluster": spec, "task": {"type": job, "index": index}}
        tasks[name] = Task(name, argv, _env(side, tf_config, flags.communication_period),
                           os.path.join(workdir, f"{name}.log"), STEP_LINE[side])


def _wait(side: str, tasks: dict, flags) -> Optional[str]:
    """Samples CPU until the chief exits (or the timeout); then the others' linger. Returns
    what went wrong, or None."""
    chief = tasks["chief0"]
    deadline = time.monotonic() + flags.timeout_secs
    while chief.poll() is None and time.monotonic() < deadline:
        for t in tasks.values():
            if t.poll() is None:
                t.sample_cpu()
        time.sleep(0.2)
    if chief.poll() is None:
        return f"chief still running after {flags.timeout_secs:.0f} s"
    if chief.proc.returncode != 0:
        return f"chief exited {chief.proc.returncode}"
    # 2.15's ps and evaluator never exit (server.join()): wait only for its workers.
    waited = [t for n, t in tasks.items() if side == "lowlevel" or
              n.rstrip("0123456789") in TRAINING]
    linger = time.monotonic() + flags.linger_secs
    while time.monotonic() < linger and any(t.poll() is None for t in waited):
        time.sleep(0.1)
    return None


def _cpu_per_step(tasks: dict, start: float, end: float, steps: int) -> dict:
    """{task: CPU milliseconds per global step over [start, end]} (tasks with samples)."""
    found = {}
    for n, t in tasks.items():
        used = t.cpu_between(start, end)
        if used is not None:
            found[n] = round(used * 1000.0 / steps, 2)
    return found


def _steady(tasks: dict, step: int, end: float, flags) -> dict:
    """The rate from the first progress line (any training task) at least
    --steady_warmup_secs after the last training task's first step, to the end."""
    training = [t for n, t in tasks.items() if n.rstrip("0123456789") in TRAINING]
    if not (end and step and all(t.first_step_unix for t in training)):
        return {}
    after = max(t.first_step_unix for t in training) + flags.steady_warmup_secs
    seen = sorted(x for t in training for x in t.steps_seen if after <= x[0] < end)
    if not seen or step <= seen[0][1] or end <= seen[0][0]:
        return {}
    s0, g0 = seen[0]
    return {"examples_per_sec": round((step - g0) * flags.batch_size / (end - s0), 1),
            "from_step": g0, "secs": round(end - s0, 2),
            "cpu_ms_per_step": _cpu_per_step(tasks, s0, end, step - g0)}


def run_cluster(side: str, flags, workdir: str) -> dict:
    """One cluster of `side`, start to finish; returns its run dict (see the module doc)."""
    os.makedirs(workdir, exist_ok=True)
    model_dir = os.path.join(workdir, "model")
    load, launched, tasks = os.getloadavg()[0], time.time(), {}
    try:
        _start(side, flags, workdir, model_dir, tasks)
        error = _wait(side, tasks, flags)
    finally:
        for t in tasks.values():
            t.kill()
        for t in tasks.values():
            t.join_reader()
    chief = tasks["chief0"]
    if error is None and chief.result is None:
        error = "chief printed no RESULT line"
    if error:
        return {"side": side, "ok": False, "error": error, "workdir": workdir,
                "chief_tail": chief.tail(), "loadavg_1m": round(load, 2)}
    return _figures(side, tasks, model_dir, flags, launched, load, workdir)


def _figures(side, tasks, model_dir, flags, launched, load, workdir) -> dict:
    """The run dict of a finished cluster (the module doc defines each figure)."""
    chief, res = tasks["chief0"], tasks["chief0"].result
    firsts = [t.first_step_unix for n, t in tasks.items()
              if n.rstrip("0123456789") in TRAINING and t.first_step_unix]
    step, end = _final_checkpoint(model_dir)
    start = min(firsts) if firsts else None
    window = (end - start) if (start and end) else None
    eps = (step * flags.batch_size / window) if (step and window and window > 0) else None
    return {
        "side": side, "ok": True, "workdir": workdir, "loadavg_1m": round(load, 2),
        "examples_per_sec": round(eps, 1) if eps else None,
        "window_secs": round(window, 3) if window else None,
        "final_step": step, "auc": res.get("eval", {}).get("auc"),
        "accuracy": res.get("eval", {}).get("accuracy"),
        "chief_examples_per_sec": res.get("examples_per_sec"),
        "chief_local_steps": res.get("local_steps"),
        "startup_secs": round(start - launched, 2) if start else None,
        "cpu_ms_per_step": _cpu_per_step(tasks, start, end, step) if window and step else {},
        "steady": _steady(tasks, step, end, flags),
        "first_step_by_task": {n: round(t.first_step_unix - launched, 2)
                               for n, t in tasks.items() if t.first_step_unix},
        "exits": {n: ("killed" if t.killed else
                      f"exit {t.proc.returncode} at {t.exit_unix - chief.exit_unix:+.1f} s")
                  for n, t in tasks.items()},
        "wall_secs": round(time.time() - launched, 1),
    }


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarise(runs: list, flags) -> dict:
    by_side = {}
    for side in SIDES:
        mine = [r for r in runs if r["side"] == side and r["ok"]]
        by_side[side] = {k: _median([r[k] for r in mine]) for k in
                         ("examples_per_sec", "final_step", "auc", "window_secs",
                          "chief_examples_per_sec", "startup_secs")}
        by_side[side]["steady_examples_per_sec"] = _median(
            [r["steady"].get("examples_per_sec") for r in mine if r.get("steady")])
        by_side[side]["runs_ok"] = len(mine)
    ratios, steady_ratios = [], []
    for rnd in sorted({r["round"] for r in runs}):
        eps = {r["side"]: r.get("examples_per_sec") for r in runs if r["round"] == rnd}
        if eps.get("lowlevel") and eps.get("tf2.15"):
            ratios.append(eps["lowlevel"] / eps["tf2.15"])
        eps = {r["side"]: (r.get("steady") or {}).get("examples_per_sec") for r in runs
               if r["round"] == rnd}
        if eps.get("lowlevel") and eps.get("tf2.15"):
            steady_ratios.append(eps["lowlevel"] / eps["tf2.15"])
    ratio, steady_ratio = _median(ratios), _median(steady_ratios)
    aucs = [by_side[s]["auc"] for s in SIDES]
    auc_diff = (aucs[1] - aucs[0]) if None not in aucs else None
    passed = (ratio is not None and auc_diff is not None and ratio >= TARGET_RATIO and
              abs(auc_diff) <= AUC_TOLERANCE)
    return {"benchmark": "canned_wide_deep", "num_ps": flags.num_ps,
            "workers": 1 + flags.num_workers, "evaluator": flags.evaluator,
            "lowlevel_communication_period": flags.communication_period,
            "max_steps": flags.max_steps, "batch_size": flags.batch_size,
            "repeats": flags.repeats, "sides": by_side,
            "ratio_lowlevel_over_tf215": round(ratio, 3) if ratio is not None else None,
            "ratio_by_round": [round(r, 3) for r in ratios],
            "steady_ratio": round(steady_ratio, 3) if steady_ratio is not None else None,
            "steady_ratio_by_round": [round(r, 3) for r in steady_ratios],
            "auc_diff": round(auc_diff, 4) if auc_diff is not None else None,
            "target": f"ratio >= {TARGET_RATIO} and |auc_diff| <= {AUC_TOLERANCE}",
            "status": "PASS" if passed else "FAIL"}


def _f(v, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def table(runs: list, summary: dict) -> str:
    lines = ["| round | side | examples/s | window s | final step | test AUC | steady "
             "examples/s | steady CPU ms/step | chief eps (own) | startup s | load | exits |",
             "|---|" + "---|" * 11]
    for r in runs:
        if not r["ok"]:
            lines.append(f"| {r['round']} | {r['side']} | FAILED: {r['error']} |" + " |" * 9)
            continue
        exits = ", ".join(f"{k}: {v}" for k, v in r["exits"].items() if k != "chief0")
        steady = r.get("steady") or {}
        cpu = " ".join(f"{k} {v:.1f}" for k, v in steady.get("cpu_ms_per_step", {}).items())
        lines.append(f"| {r['round']} | {r['side']} | {_f(r['examples_per_sec'], ',.0f')} | "
                     f"{_f(r['window_secs'], '.1f')} | {_f(r['final_step'], 'd')} | "
                     f"{_f(r['auc'], '.4f')} | {_f(steady.get('examples_per_sec'), ',.0f')} | "
                     f"{cpu or '-'} | {_f(r['chief_examples_per_sec'], ',.0f')} | "
                     f"{_f(r['startup_secs'], '.1f')} | {r['loadavg_1m']:.1f} | {exits} |")
    lines += ["", "| side | examples/s (median) | steady examples/s | final step | test AUC "
              "| runs |", "|---|---|---|---|---|---|"]
    for side in SIDES:
        s = summary["sides"][side]
        lines.append(f"| {side} | {_f(s['examples_per_sec'], ',.0f')} | "
                     f"{_f(s['steady_examples_per_sec'], ',.0f')} | "
                     f"{_f(s['final_step'], '.0f')} | {_f(s['auc'], '.4f')} | "
                     f"{s['runs_ok']} |")
    ratio = _f(summary["ratio_lowlevel_over_tf215"], ".3f")
    lines.append(f"\nlowlevel / tf2.15 examples/s: {ratio} "
                 f"(rounds: {summary['ratio_by_round']}); AUC difference "
                 f"{_f(summary['auc_diff'], '+.4f')}; target {summary['target']}: "
                 f"{summary['status']}\nsteady state (both workers training): lowlevel / tf2.15 "
                 f"{_f(summary['steady_ratio'], '.3f')} (rounds: "
                 f"{summary['steady_ratio_by_round']})")
    return "\n".join(lines)


def _ensure_data(data_dir: str, python: str) -> None:
    if all(os.path.exists(os.path.join(data_dir, f"ml-100k.{x}")) for x in
           ("inter", "user", "item")):
        return
    subprocess.run([python, os.path.join(ROOT, "scripts", "get_movielens"), data_dir],
                   check=True)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ref_python", default="/work/ref215/bin/python",
                   help="the interpreter of tensorflow 2.15.1 + tensorflow-estimator 2.15.0")
    p.add_argument("--python", default=sys.executable,
                   help="lowlevel's interpreter (TF 2.21)")
    p.add_argument("--script", default=SCRIPT)
    p.add_argument("--data_dir", default="/tmp/ml-100k",
                   help="MovieLens 100K (fetched with scripts/get_movielens if absent)")
    p.add_argument("--max_steps", type=int, default=2000)
    p.add_argument("--batch_size", type=int, default=256)
    p.add_argument("--num_ps", type=int, default=1)
    p.add_argument("--num_workers", type=int, default=1,
                   help="workers besides the chief (1: 2 training tasks)")
    p.add_argument("--evaluator", action="store_true", help="also run an evaluator task")
    p.add_argument("--communication_period", type=int, default=1,
                   help="lowlevel's side: local steps between exchanges with the ps "
                        "(LOWLEVEL_COMMUNICATION_PERIOD in its tasks' environment: the "
                        "communication-reduced mode, lowlevel/modes/local_sgd.py); 1: the "
                        "exact async mode")
    p.add_argument("--repeats", type=int, default=2, help="rounds (each runs both sides)")
    p.add_argument("--sides", default=",".join(SIDES), help="comma-separated subset")
    p.add_argument("--steady_warmup_secs", type=float, default=2.0,
                   help="the steady-state figures start this long after the last training "
                        "task's first step")
    p.add_argument("--linger_secs", type=float, default=10.0,
                   help="how long the other tasks may run on after the chief exits")
    p.add_argument("--timeout_secs", type=float, default=300.0, help="per cluster")
    p.add_argument("--out", default=None, help="default: a new temporary directory")
    p.add_argument("script_args", nargs="*", help="after --: more flags for the script")
    flags = p.parse_args(argv)
    flags.script = os.path.abspath(flags.script)
    out = flags.out or tempfile.mkdtemp(prefix="canned_wide_deep_")
    os.makedirs(out, exist_ok=True)
    _ensure_data(flags.data_dir, flags.python)
    sides = [s for s in flags.sides.split(",") if s]
    runs = []
    started = time.time()
    for rnd in range(flags.repeats):
        order = sides if rnd % 2 == 0 else list(reversed(sides))
        for side in order:
            run = run_cluster(side, flags, os.path.join(out, f"{side}_r{rnd}"))
            run["round"] = rnd
            runs.append(run)
            print(json.dumps(run), flush=True)
    summary = summarise(runs, flags)
    summary["wall_secs"] = round(time.time() - started, 1)
    summary["out"] = out
    print("\n" + table(runs, summary) + "\n", flush=True)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump({"summary": summary, "runs": runs}, f, indent=1)
    print(json.dumps(summary), flush=True)
    return summary


if __name__ == "__main__":
    main()
