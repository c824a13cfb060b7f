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

`--network`: network faults instead of signals, at the trainer's default
limits unless `--step_timeout_secs`/`--fault_timeout_secs` are given (issue
28). Every task runs on its own host (a network namespace, `lowlevel.testing.netns`;
needs root), supervised as the launcher supervises its tasks
(`lowlevel.ops.supervisor`, restarts on a retryable status). A fault freezes a
task (SIGSTOP, SIGCONT at its end) or cuts its link (its bridge port down,
then up), for less than the step deadline (0.2-0.8x `--step_timeout_secs`,
random) or, every round(1 / `--long_fault_fraction`)-th fault, for longer
than the outage limit (1.2-1.5x `--fault_timeout_secs`): then the tasks that
depend on it exit 200 and are restarted (a task frozen that long exits 200
itself when it resumes: its clock counts its own freeze). Short and long
faults each hit every task in turn (the long ones the ps first), freezes and
cuts alternately, so that a soak of a few faults sees each kind. A network fault is
survived when every task it made exit ended with status 200 (the documented
one) and its segment ends at exactly its `--train_steps` with every task
exiting 0; "recovery" and "task back" count from the fault's end (the
SIGCONT, the heal), and every host must be empty of processes at the end.

    python -m benchmarks.chaos --network --duration_secs=400 --segment_steps=20000
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
from lowlevel.ops.supervisor import Supervisor, supervise
from lowlevel.testing import netns

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
flags.DEFINE_boolean("network", False, "Network faults (freezes, link cuts) on a cluster whose "
                     "every task is on its own namespace host, instead of signals (root).")
flags.DEFINE_float("long_fault_fraction", 0.35, "--network: the share of faults longer than "
                   "--fault_timeout_secs, every round(1/share)-th (the others are shorter "
                   "than --step_timeout_secs).")
flags.DEFINE_float("step_timeout_secs", None, "--network: passed to the trainer; default: "
                   "the trainer's own (60).")
flags.DEFINE_float("fault_timeout_secs", None, "--network: passed to the trainer; default: "
                   "the trainer's own (90).")

# The trainer's defaults (lowlevel/config.py), for the lengths of network faults.
DEFAULT_STEP_TIMEOUT_SECS, DEFAULT_FAULT_TIMEOUT_SECS = 60.0, 90.0
PORT = 2222  # every task on port 2222 of its own host's address

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

    def poll(self):
        """The launcher's exit status, or None while it runs."""
        return self.proc.poll()

    def wait(self, timeout: float):
        """The launcher's exit status; `subprocess.TimeoutExpired` after `timeout` seconds."""
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        """Kills the launcher and its tasks if they still run."""
        if self.proc.poll() is None:
            for child in psutil.Process(self.proc.pid).children():
                child.kill()
            self.proc.kill()
            self.proc.wait()
        self.reader.join(10)


class NetSegment(Segment):
    """One run with every task on its own namespace host (`--network`), supervised in this
    process as the launcher supervises its tasks (`lowlevel.ops.supervisor`: a task that ends
    with a retryable status is started again with the same command)."""

    def __init__(self, out: str, train_steps: int, hosts: netns.Hosts):
        self.hosts = hosts
        self.train_steps = train_steps
        self.tail: list[str] = []
        self._follower = events.Follower(out)
        self._follower.new()  # earlier segments' events
        self._records: list[dict] = []
        ps = [f"{hosts.addresses[f'ps{i}']}:{PORT}" for i in range(FLAGS.num_ps)]
        workers = [f"{hosts.addresses[f'worker{i}']}:{PORT}" for i in range(FLAGS.num_workers)]
        common = [sys.executable, "-m", "lowlevel.trainer", f"--ps_hosts={','.join(ps)}",
                  f"--worker_hosts={','.join(workers)}", f"--output_dir={out}",
                  f"--train_steps={train_steps}",
                  f"--save_checkpoint_steps={FLAGS.save_checkpoint_steps}",
                  "--log_every_secs=0.2"]
        if FLAGS.sync:
            common += ["--sync", f"--replicas_to_aggregate={FLAGS.num_workers - 1}"]
        for name in ("step_timeout_secs", "fault_timeout_secs"):
            if FLAGS[name].value is not None:
                common.append(f"--{name}={FLAGS[name].value:g}")
        self.commands = {
            name: ["ip", "netns", "exec", hosts.namespaces[name], *common,
                   f"--job_name={name.rstrip('0123456789')}",
                   f"--task_index={name[len(name.rstrip('0123456789')):]}"]
            for name in hosts.namespaces}
        self.code: Optional[int] = None
        self.sup: Optional[Supervisor] = None
        started = threading.Event()
        # Every task is started (and restarted) from this thread, which lives until the
        # run ends: a task's PR_SET_PDEATHSIG (lowlevel.ops.lifetime) follows its parent thread.
        self.reader = threading.Thread(target=self._supervise, args=(started,), daemon=True)
        self.reader.start()
        started.wait()

    def _supervise(self, started: threading.Event) -> None:
        try:
            self.sup = Supervisor(self.commands, out=_Tail(self), max_restarts=1000)
        finally:
            started.set()
        self.code = supervise(self.sup, 5.0)

    def task(self, name: str):
        proc = self.sup.procs.get(name) if self.sup else None
        try:
            return psutil.Process(proc.pid) if proc and proc.poll() is None else None
        except psutil.Error:
            return None

    def poll(self):
        return None if self.reader.is_alive() else self.code

    def wait(self, timeout: float):
        self.reader.join(timeout)
        if self.reader.is_alive():
            raise subprocess.TimeoutExpired("supervise", timeout)
        return self.code

    def stop(self) -> None:
        if self.reader.is_alive() and self.sup is not None:
            self.sup.stop(5.0)
        self.reader.join(30)

    def exits(self, since: float, until: float = float("inf")) -> list[dict]:
        """The tasks that ended in [since, until): {"task", "time", "what", "status"}."""
        out = []
        for when, name, what in list(self.sup.events if self.sup else []):
            if what == "started" or not since <= when < until:
                continue
            status = re.search(r"status (\d+)", what)
            out.append({"task": name, "time": round(when, 3), "what": what,
                        "status": int(status.group(1)) if status else (0 if what == "finished"
                                                                        else None)})
        return out


class _Tail:
    """The supervisor's output: the last 40 lines, kept to show when a segment fails."""

    def __init__(self, seg: Segment):
        self._seg = seg

    def write(self, text: str) -> None:
        for line in text.splitlines():
            if line:
                self._seg.tail = (self._seg.tail + [line])[-40:]

    def flush(self) -> None:
        pass


def back_time(seg: Segment, fault: dict):
    """When the task hit by `fault` was working again, or None (not yet).

    A network fault counts from its end: a ps is back at the first step any worker
    logs after it (a frozen ps loses no session when the fault is short), a worker at
    its own first step after it.
    """
    target, t0 = fault["target"], fault.get("end", fault["time"])
    if "kind" in fault and target.startswith("ps"):
        back = [r for r in seg.records("progress", since=t0 + 0.3)]
    elif target.startswith("ps"):
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
    while seg.poll() is None and window.deadline is None:  # not training yet
        if seg.steps():
            window.start()
        else:
            time.sleep(0.1)
    while seg.poll() is None and not window.over():
        gap = min(max(rng.expovariate(1 / FLAGS.mean_fault_interval_secs), 2.0), 30.0)
        end = time.time() + gap
        while time.time() < end and seg.poll() is None:
            time.sleep(0.1)
        progress = seg.steps()
        if seg.poll() is not None or window.over() or not progress:
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
        while seg.poll() is None and back_time(seg, fault) is None and \
                time.time() < wait_until:
            time.sleep(0.2)


def fault_secs(rng: random.Random, long: bool) -> float:
    """A network fault's length: longer than the outage limit, or shorter than the deadline."""
    step = FLAGS.step_timeout_secs or DEFAULT_STEP_TIMEOUT_SECS
    limit = FLAGS.fault_timeout_secs or DEFAULT_FAULT_TIMEOUT_SECS
    return round(limit * rng.uniform(1.2, 1.5) if long else step * rng.uniform(0.2, 0.8), 1)


def _wait_for_training(seg: NetSegment, window: Window) -> None:
    """Waits until `seg` trains (its first progress record), then opens the window."""
    while seg.poll() is None and window.deadline is None:  # not training yet
        if seg.steps():
            window.start()
        else:
            time.sleep(0.1)


def _next_fault(seg: NetSegment, rng: random.Random, faults: list, names: list,
                long_names: list, period: int):
    """(fault record, the task's process for a freeze or None for a cut), or None when no
    fault is due now (the run ended, has not started, or is in its last tenth)."""
    progress = seg.steps()
    if seg.poll() is not None or not progress:
        return None
    if progress[-1][2] >= 0.9 * seg.train_steps:  # see the module doc: the last tenth
        return None
    # Every `period`-th fault longer than the limits; short and long faults each hit
    # every task in turn (short: a seeded order; long: the ps first), freezes and cuts
    # alternately: a short soak still sees each kind.
    long = bool(period) and len(faults) % period == period - 1
    k = sum(f["long"] == long for f in faults)  # faults of this length so far
    target = (long_names if long else names)[k % len(names)]
    kind = ("freeze", "cut")[k % 2]
    secs = fault_secs(rng, long)
    proc = seg.task(target) if kind == "freeze" else None
    if kind == "freeze" and proc is None:
        return None
    return ({"target": target, "kind": kind, "long": long, "planned_secs": secs,
             "time": time.time(), "step_before": progress[-1][2],
             "segment": seg.train_steps}, proc)


def _hold(seg: NetSegment, fault: dict, proc) -> None:
    """Keeps the fault on for its planned seconds (or until the run ends), then undoes it
    (SIGCONT, or the link up)."""
    try:
        while time.time() < fault["time"] + fault["planned_secs"] and seg.poll() is None:
            time.sleep(0.2)
    finally:
        if proc is not None:
            try:
                proc.resume()  # SIGCONT
            except psutil.NoSuchProcess:
                pass
        else:
            seg.hosts.heal(fault["target"])
        fault["end"] = time.time()


def inject_network(seg: NetSegment, rng: random.Random, faults: list, window: Window) -> None:
    """Freezes (SIGSTOP, then SIGCONT) or cuts off (link down, then up) random tasks of
    `seg`, one fault at a time, until it ends or the window closes."""
    names = list(seg.hosts.namespaces)
    random.Random(FLAGS.seed).shuffle(names)  # the same order in every segment
    # The long faults' targets: the ps tasks first (a frozen ps is the case that hung
    # every worker at the default limits), then the workers.
    long_names = sorted(names, key=lambda n: not n.startswith("ps"))
    period = max(1, round(1 / FLAGS.long_fault_fraction)) if FLAGS.long_fault_fraction else 0
    _wait_for_training(seg, window)
    while seg.poll() is None and not window.over():
        gap = min(max(rng.expovariate(1 / FLAGS.mean_fault_interval_secs), 2.0), 30.0)
        end = time.time() + gap
        while time.time() < end and seg.poll() is None:
            time.sleep(0.1)
        found = None if window.over() else _next_fault(seg, rng, faults, names, long_names,
                                                       period)
        if found is None:
            continue
        fault, proc = found
        try:
            if proc is not None:
                proc.suspend()  # SIGSTOP
            else:
                seg.hosts.partition(fault["target"])
        except psutil.NoSuchProcess:
            continue
        faults.append(fault)
        print(f"chaos: {fault['kind']} {fault['target']} for {fault['planned_secs']:g} s "
              f"({'longer' if fault['long'] else 'shorter'} than the limits) at global step "
              f"{fault['step_before']}", flush=True)
        _hold(seg, fault, proc)
        wait_until = time.time() + 240  # one fault at a time: wait for this one's recovery
        while seg.poll() is None and back_time(seg, fault) is None and \
                time.time() < wait_until:
            time.sleep(0.2)


def measure(seg: Segment, fault: dict, survived: bool, until: float = float("inf")) -> None:
    """Fills in `fault`'s figures from `seg`'s events (see the module doc); a network fault's
    also from the tasks that ended between it and `until` (the next fault)."""
    t0 = fault["time"]
    after = [(t, s) for t, _, s in seg.steps(since=t0 + 0.05)]
    end = fault.get("end", t0)  # a network fault counts its recovery from its end
    after_end = [t for t, _, _ in seg.steps(since=end + 0.05)]
    fault["survived"] = survived
    fault["recovery_secs"] = round(after_end[0] - end, 3) if after_end else None
    back = back_time(seg, fault)
    fault["task_back_secs"] = round(back - end, 3) if back else None
    restored = [r["restored_step"] for r in seg.records("recovered", since=t0)
                if r["origin"] == "restored"]
    resumed = restored[0] if restored else min((s for t, s in after if t < t0 + 10),
                                               default=fault["step_before"])
    fault["steps_lost"] = max(0, fault["step_before"] - resumed)
    if isinstance(seg, NetSegment):
        # Every task this fault made exit must have ended with a documented status: 200
        # (restarted), or 0 (its part of the run done).
        fault["exits"] = seg.exits(t0, until)
        fault["documented"] = all(e["status"] in (0, 200) for e in fault["exits"])
        fault["survived"] = survived and fault["documented"]


def label(fault: dict) -> str:
    """"SIGKILL ps0"; a network fault: "freeze ps0, long" (longer than the limits)."""
    if "kind" in fault:
        return f"{fault['kind']} {fault['target']}, {'long' if fault['long'] else 'short'}"
    return f"{fault['signal']} {fault['target']}"


def summarize(faults: list) -> list[dict]:
    rows = []
    for kind in sorted({label(f) for f in faults}):
        fs = [f for f in faults if label(f) == kind]
        rec = [f["recovery_secs"] for f in fs if f["recovery_secs"] is not None]
        back = [f["task_back_secs"] for f in fs if f["task_back_secs"] is not None]
        row = {"fault": kind, "injected": len(fs),
               "survived": sum(f["survived"] for f in fs),
               "recovery_mean_s": round(statistics.mean(rec), 2) if rec else None,
               "recovery_worst_s": round(max(rec), 2) if rec else None,
               "task_back_mean_s": round(statistics.mean(back), 2) if back else None,
               "task_back_worst_s": round(max(back), 2) if back else None,
               "steps_lost_total": sum(f["steps_lost"] for f in fs),
               "steps_lost_worst": max(f["steps_lost"] for f in fs)}
        if "exits" in fs[0]:
            row["exits_200"] = sum(e["status"] == 200 for f in fs for e in f["exits"])
        rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    cols = ["fault", "injected", "survived", "recovery_mean_s", "recovery_worst_s",
            "task_back_mean_s", "task_back_worst_s", "steps_lost_total", "steps_lost_worst"]
    heads = ["fault", "injected", "survived", "recovery mean s", "recovery worst s",
             "task back mean s", "task back worst s", "steps lost", "worst steps lost"]
    if rows and "exits_200" in rows[0]:
        cols.append("exits_200")
        heads.append("task exits (200)")
    lines = ["| " + " | ".join(heads) + " |", "|" + " --- |" * len(heads)]
    lines += ["| " + " | ".join("-" if r[c] is None else str(r[c]) for c in cols) + " |"
              for r in rows]
    return "\n".join(lines)


def _network_hosts():
    """(hosts, what the faults are, in words) for --network, else (None, the signals); exits
    2 naming why when namespaces cannot be made."""
    if not FLAGS.network:
        return None, ", ".join(FLAGS.signals)
    reason = netns.unavailable()
    if reason:
        print(f"chaos: --network: {reason}", flush=True)
        sys.exit(2)
    hosts = netns.Hosts({**{f"ps{i}": [f"chaos-ps-{i}"] for i in range(FLAGS.num_ps)},
                         **{f"worker{i}": [f"chaos-worker-{i}"]
                            for i in range(FLAGS.num_workers)}})
    limits = (f"--step_timeout_secs={FLAGS.step_timeout_secs or DEFAULT_STEP_TIMEOUT_SECS:g}"
              f", --fault_timeout_secs="
              f"{FLAGS.fault_timeout_secs or DEFAULT_FAULT_TIMEOUT_SECS:g}")
    return hosts, f"freezes and link cuts at {limits}, each task on its own host"


def _run_segment(run_dir: str, target: int, hosts, rng, faults: list, window: Window,
                 leftovers: list) -> dict:
    """Trains one segment to global step `target` under faults; returns its record (and
    prints its tail when it did not end at exactly `target`)."""
    seg = NetSegment(run_dir, target, hosts) if hosts else Segment(run_dir, target)
    first = len(faults)
    try:
        (inject_network if hosts else inject)(seg, rng, faults, window)
        code = seg.wait(timeout=600)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        seg.stop()
    if hosts:  # every task of the run has ended: nothing may be left on a host
        leftovers += [(h, pid) for h in hosts.namespaces for pid in hosts.pids(h)]
    try:
        with open(os.path.join(run_dir, "final_metrics.json")) as f:
            metrics = json.load(f)
    except (OSError, ValueError):
        metrics = {}
    ok = code == 0 and metrics.get("global_step") == target
    mine = faults[first:]
    for k, fault in enumerate(mine):
        measure(seg, fault, ok, mine[k + 1]["time"] if k + 1 < len(mine) else float("inf"))
    print(f"chaos: segment to step {target}: launcher exit {code}, global step "
          f"{metrics.get('global_step')}, accuracy {metrics.get('accuracy')}", flush=True)
    if not ok:
        print("\n".join(seg.tail), flush=True)
    return {"train_steps": target, "exit_status": code, "ok": ok,
            "global_step": metrics.get("global_step"), "accuracy": metrics.get("accuracy"),
            "faults": len(mine)}


def _report(out: str, started: float, faults: list, segments: list, leftovers: list,
            target: int) -> int:
    """Writes `<out>/chaos.json`, prints the table and the summary line; returns the status
    (0: every fault survived, every segment exact, nothing left behind)."""
    rows = summarize(faults)
    final = segments[-1] if segments else {}
    report = {"duration_secs": round(time.time() - started, 1), "seed": FLAGS.seed,
              "sync": FLAGS.sync, "network": FLAGS.network, "faults": faults,
              "segments": segments, "summary": rows, "final_accuracy": final.get("accuracy"),
              "leftover_processes": leftovers,
              "all_survived": (bool(segments) and all(s["ok"] for s in segments) and
                               all(f["survived"] for f in faults) and not leftovers)}
    if FLAGS.network:
        report["limits"] = {
            "step_timeout_secs": FLAGS.step_timeout_secs or DEFAULT_STEP_TIMEOUT_SECS,
            "fault_timeout_secs": FLAGS.fault_timeout_secs or DEFAULT_FAULT_TIMEOUT_SECS}
    with open(os.path.join(out, "chaos.json"), "w") as f:
        json.dump(report, f, indent=2)
    print(f"\n{table(rows)}\n")
    print(f"chaos: {len(faults)} faults in {report['duration_secs']:.0f} s, "
          f"{sum(f['survived'] for f in faults)} survived; {len(segments)} segments to global "
          f"step {target}; final test accuracy {report['final_accuracy']}; "
          f"{len(leftovers)} processes left behind; "
          f"details in {os.path.join(out, 'chaos.json')}", flush=True)
    return 0 if report["all_survived"] else 1


def main(argv):
    """Runs segments under faults until --duration_secs is over; returns the exit status."""
    del argv
    out = FLAGS.out or tempfile.mkdtemp(prefix="chaos-")
    run_dir = os.path.join(out, "run")
    rng = random.Random(FLAGS.seed)
    started = time.time()
    window = Window(FLAGS.duration_secs)
    faults, segments, target, leftovers = [], [], 0, []
    hosts, what = _network_hosts()
    print(f"chaos: {FLAGS.duration_secs:.0f} s of faults ({what}) on "
          f"{FLAGS.num_ps} ps + {FLAGS.num_workers} workers, "
          f"{'sync' if FLAGS.sync else 'async'}; run in {run_dir}", flush=True)
    try:
        while not window.over():
            target += FLAGS.segment_steps
            segments.append(_run_segment(run_dir, target, hosts, rng, faults, window,
                                         leftovers))
            if not segments[-1]["ok"]:
                break
            window.start()  # a segment that ended before its first progress record
    finally:
        if hosts:
            hosts.close()
    return _report(out, started, faults, segments, leftovers, target)

if __name__ == "__main__":
    app.run(lambda argv: sys.exit(main(argv)))
