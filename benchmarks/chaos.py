"""A bounded chaos soak: random SIGKILLs and SIGTERMs to a training cluster, with restarts on.

    python -m benchmarks.chaos                      # 5 minutes, 1 ps + 2 workers, async, digits
    python -m benchmarks.chaos --duration_secs=60 --sync --seed=3

Runs `lowlevel.launch --max_restarts=...` on one `--output_dir` in segments of
`--segment_steps` global steps (each segment resumes from the previous one's
checkpoint: a run restarted on its own output is part of what is tested).
While a segment trains, faults come on a random schedule (exponential gaps,
mean `--mean_fault_interval_secs`): a random task (ps0, the chief worker0,
worker1, ...) gets SIGKILL (killed by the signal) or SIGTERM (it stops at a safe point
and exits 143); both are retryable (lowlevel/errors.py) and the launcher restarts it.
One fault at a time: the next waits until the task hit by the last one is back. None
in a segment's last tenth of steps: the progress a fault is timed by lags the global step
by up to a log interval, and a fault landing after the last step (seen: at step "3990" of
4000) tests nothing and has no recovery to measure. When
`--duration_secs` (counted from the first training step) has passed no new fault is
injected and the current segment trains to its end.

A fault is *survived* when its segment ends with every task exiting 0 and the
global step at exactly the segment's `--train_steps`. Per fault it measures,
from the tasks' own events (`lowlevel.events`: Unix times, this machine's clock):

- recovery: seconds from the fault to the next global step logged by any
  worker (the cluster training again; ~0 when other workers carry on);
- task back: seconds from the fault to the first step (or, for a ps, the
  chief's `recovered` event) of the restarted task;
- steps lost: the global step before the fault minus the step training
  resumed from (a ps failure: the checkpoint the chief restored; approximate
  to the steps of one progress interval otherwise).

Prints a table by fault kind and writes `chaos.json` (every fault, every
segment) to `--out`. Exit status 0 when every fault was survived, 1 otherwise.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Optional

import psutil
from absl import app, flags

from lowlevel import events

FLAGS = flags.FLAGS
flags.DEFINE_float("duration_secs", 300.0, "Seconds during which faults are injected, "
                   "from the first training step.")
flags.DEFINE_float("mean_fault_interval_secs", 8.0, "Mean gap between faults (exponential).")
flags.DEFINE_integer("seed", 0, "Seed of the fault schedule.")
flags.DEFINE_integer("num_workers", 2, "Workers (worker 0 is the chief).")
flags.DEFINE_integer("num_ps", 1, "ps tasks.")
flags.DEFINE_boolean("sync", False, "Synchronous training (with one backup worker).")
flags.DEFINE_integer("segment_steps", 6000, "Global steps per launcher run.")
flags.DEFINE_integer("save_checkpoint_steps", 500, "Checkpoint interval, global steps.")
flags.DEFINE_list("signals", ["SIGKILL", "SIGTERM"], "Signals to inject.")
flags.DEFINE_string("out", None, "Directory for chaos.json and the run (default: a temp dir).")

class Segment:
    """One launcher run; follows the tasks' events in `out` (`lowlevel.events`)."""

    def __init__(self, out: str, train_steps: int):
        argv = [sys.executable, "-m", "lowlevel.launch", f"--output_dir={out}",
                f"--num_ps={FLAGS.num_ps}", f"--num_workers={FLAGS.num_workers}",
                "--max_restarts=1000", f"--train_steps={train_steps}",
                f"--save_checkpoint_steps={FLAGS.save_checkpoint_steps}",
                "--log_every_secs=0.2", "--sync_timeout_secs=5"]
        if FLAGS.sync:
            argv += ["--sync", f"--replicas_to_aggregate={FLAGS.num_workers - 1}"]
        self.train_steps = train_steps
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, cwd=os.path.dirname(os.path.dirname(
                                         os.path.abspath(__file__))))
        self.tail: list[str] = []
        self._follower = events.Follower(out)
        self._follower.new()  # earlier segments' events
        self._records: list[dict] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:  # kept only to show when a segment fails
            self.tail = (self.tail + [line.rstrip("\n")])[-40:]

    def records(self, event: str, since=0.0, until=float("inf")) -> list[dict]:
        """This segment's `event` records with `unix_time` in [since, until), oldest first."""
        self._records += self._follower.new()
        return [r for r in self._records
                if r["event"] == event and since <= r["unix_time"] < until]

    def steps(self, since=0.0, until=float("inf")):
        """[(time, task, global step)] of the progress events in [since, until)."""
        return [(r["unix_time"], r["task"], r["global_step"])
                for r in self.records("progress", since, until)]

    def task(self, name: str):
        job, index = re.match(r"(\D+)(\d+)$", name).groups()
        for child in psutil.Process(self.proc.pid).children():
            try:
                cmd = child.cmdline()
            except psutil.Error:
                continue
            if f"--job_name={job}" in cmd and f"--task_index={index}" in cmd:
                return child
        return None


def back_time(seg: Segment, fault: dict):
    """When the task hit by `fault` was working again, or None (not yet)."""
    target, t0 = fault["target"], fault["time"]
    if target.startswith("ps"):
        back = [r for r in seg.records("recovered", since=t0) if r["task"] == "worker0"]
    else:
        back = [r for r in seg.records("progress", since=t0 + 0.3) if r["task"] == target]
    return back[0]["unix_time"] if back else None


class Window:
    """The `--duration_secs` of fault injection, counted from the first training step.

    Counting from the launch instead would let a slow start (TensorFlow's
    imports on a loaded machine) use up a short window before any task trains.
    """

    def __init__(self, secs: float):
        self.secs = secs
        self.deadline: Optional[float] = None

    def start(self) -> None:
        if self.deadline is None:
            self.deadline = time.time() + self.secs

    def over(self) -> bool:
        return self.deadline is not None and time.time() >= self.deadline


def inject(seg: Segment, rng: random.Random, faults: list, window: Window) -> None:
    """Injects faults into `seg` until it ends or the window closes."""
    names = [f"ps{i}" for i in range(FLAGS.num_ps)] + [f"worker{i}" for i in
                                                       range(FLAGS.num_workers)]
    while seg.proc.poll() is None and window.deadline is None:  # not training yet
        if seg.steps():
            window.start()
        else:
            time.sleep(0.1)
    while seg.proc.poll() is None and not window.over():
        gap = min(max(rng.expovariate(1 / FLAGS.mean_fault_interval_secs), 2.0), 30.0)
        end = time.time() + gap
        while time.time() < end and seg.proc.poll() is None:
            time.sleep(0.1)
        progress = seg.steps()
        if seg.proc.poll() is not None or window.over() or not progress:
            continue
        if progress[-1][2] >= 0.9 * seg.train_steps:  # see the module doc: the last tenth
            continue
        target, signame = rng.choice(names), rng.choice(FLAGS.signals)
        proc = seg.task(target)
        if proc is None:
            continue
        fault = {"target": target, "signal": signame, "time": time.time(),
                 "step_before": progress[-1][2], "segment": seg.train_steps}
        try:
            proc.send_signal(getattr(signal, signame))
        except psutil.NoSuchProcess:
            continue
        faults.append(fault)
        print(f"chaos: {signame} -> {target} at global step {fault['step_before']}", flush=True)
        wait_until = time.time() + 120  # one fault at a time: wait for this one's recovery
        while seg.proc.poll() is None and back_time(seg, fault) is None and \
                time.time() < wait_until:
            time.sleep(0.2)


def measure(seg: Segment, fault: dict, survived: bool) -> None:
    t0 = fault["time"]
    after = [(t, s) for t, _, s in seg.steps(since=t0 + 0.05)]
    fault["survived"] = survived
    fault["recovery_secs"] = round(after[0][0] - t0, 3) if after else None
    back = back_time(seg, fault)
    fault["task_back_secs"] = round(back - t0, 3) if back else None
    restored = [r["restored_step"] for r in seg.records("recovered", since=t0)
                if r["origin"] == "restored"]
    resumed = restored[0] if restored else min((s for t, s in after if t < t0 + 10),
                                               default=fault["step_before"])
    fault["steps_lost"] = max(0, fault["step_before"] - resumed)


def summarize(faults: list) -> list[dict]:
    rows = []
    for kind in sorted({(f["signal"], f["target"]) for f in faults}):
        fs = [f for f in faults if (f["signal"], f["target"]) == kind]
        rec = [f["recovery_secs"] for f in fs if f["recovery_secs"] is not None]
        back = [f["task_back_secs"] for f in fs if f["task_back_secs"] is not None]
        rows.append({"fault": f"{kind[0]} {kind[1]}", "injected": len(fs),
                     "survived": sum(f["survived"] for f in fs),
                     "recovery_mean_s": round(statistics.mean(rec), 2) if rec else None,
                     "recovery_worst_s": round(max(rec), 2) if rec else None,
                     "task_back_mean_s": round(statistics.mean(back), 2) if back else None,
                     "task_back_worst_s": round(max(back), 2) if back else None,
                     "steps_lost_total": sum(f["steps_lost"] for f in fs),
                     "steps_lost_worst": max(f["steps_lost"] for f in fs)})
    return rows


def table(rows: list[dict]) -> str:
    cols = ["fault", "injected", "survived", "recovery_mean_s", "recovery_worst_s",
            "task_back_mean_s", "task_back_worst_s", "steps_lost_total", "steps_lost_worst"]
    heads = ["fault", "injected", "survived", "recovery mean s", "recovery worst s",
             "task back mean s", "task back worst s", "steps lost", "worst steps lost"]
    lines = ["| " + " | ".join(heads) + " |", "|" + " --- |" * len(heads)]
    lines += ["| " + " | ".join("-" if r[c] is None else str(r[c]) for c in cols) + " |"
              for r in rows]
    return "\n".join(lines)


def main(argv):
    del argv
    out = FLAGS.out or tempfile.mkdtemp(prefix="chaos-")
    run_dir = os.path.join(out, "run")
    rng = random.Random(FLAGS.seed)
    started = time.time()
    window = Window(FLAGS.duration_secs)
    faults, segments, target = [], [], 0
    print(f"chaos: {FLAGS.duration_secs:.0f} s of faults ({', '.join(FLAGS.signals)}) on "
          f"{FLAGS.num_ps} ps + {FLAGS.num_workers} workers, "
          f"{'sync' if FLAGS.sync else 'async'}; run in {run_dir}", flush=True)
    while not window.over():
        target += FLAGS.segment_steps
        seg = Segment(run_dir, target)
        first = len(faults)
        try:
            inject(seg, rng, faults, window)
            code = seg.proc.wait(timeout=600)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            if seg.proc.poll() is None:
                for child in psutil.Process(seg.proc.pid).children():
                    child.kill()
                seg.proc.kill()
                seg.proc.wait()
        seg.reader.join(10)
        try:
            with open(os.path.join(run_dir, "final_metrics.json")) as f:
                metrics = json.load(f)
        except (OSError, ValueError):
            metrics = {}
        ok = code == 0 and metrics.get("global_step") == target
        for fault in faults[first:]:
            measure(seg, fault, ok)
        segments.append({"train_steps": target, "exit_status": code, "ok": ok,
                         "global_step": metrics.get("global_step"),
                         "accuracy": metrics.get("accuracy"), "faults": len(faults) - first})
        print(f"chaos: segment to step {target}: launcher exit {code}, global step "
              f"{metrics.get('global_step')}, accuracy {metrics.get('accuracy')}", flush=True)
        if not ok:
            print("\n".join(seg.tail), flush=True)
            break
        window.start()  # a segment that ended before its first progress record
    rows = summarize(faults)
    final = segments[-1] if segments else {}
    report = {"duration_secs": round(time.time() - started, 1), "seed": FLAGS.seed,
              "sync": FLAGS.sync, "faults": faults, "segments": segments, "summary": rows,
              "final_accuracy": final.get("accuracy"),
              "all_survived": bool(segments) and all(s["ok"] for s in segments)}
    with open(os.path.join(out, "chaos.json"), "w") as f:
        json.dump(report, f, indent=2)
    print(f"\n{table(rows)}\n")
    print(f"chaos: {len(faults)} faults in {report['duration_secs']:.0f} s, "
          f"{sum(f['survived'] for f in faults)} survived; {len(segments)} segments to global "
          f"step {target}; final test accuracy {report['final_accuracy']}; "
          f"details in {os.path.join(out, 'chaos.json')}", flush=True)
    return 0 if report["all_survived"] else 1


if __name__ == "__main__":
    app.run(lambda argv: sys.exit(main(argv)))
