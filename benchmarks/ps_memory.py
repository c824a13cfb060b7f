"""Where a ps's memory goes: its VmRSS and VmHWM over time, during one sparse-suite run.

    python -m benchmarks.ps_memory --rows=10000000 --out=/tmp/psmem [--steps=600]
    python -m benchmarks.ps_memory --rows=100000000 --steps=3000 --memory=ps=9Gi,worker=3Gi \
        --save_checkpoint_steps=1500 --kill_ps_after_step=1500 --out=/tmp/psmem100

Starts `lowlevel.launch` (2 ps + 2 workers, the sparse suite's model flags:
`benchmarks.sparse.Settings`, `--max_restarts=1`) and, until it exits, samples every
task's /proc/PID/status every 0.1 s (tasks found every second; a restarted task is
sampled apart, "ps1 restarted") and ps0's /proc/PID/smaps every 2 s. Writes
`<out>/mem.tsv` (seconds since launch, task, VmRSS MiB, VmHWM MiB), `<out>/smaps.txt`
(seconds, then each mapping of 16 MiB or more as "size MiB:resident MiB": a
305 MiB mapping is one copy of a 10 M-row table's shard or its accumulator;
adjacent ones merge) and `<out>/launcher.log`; prints each task's peak (MiB), the
bytes each read through read(2) (/proc/PID/io rchar: a ps reads only checkpoints),
the tasks' events and first steps (seconds since launch).

`--kill_ps_after_step=N`: once the chief has saved a checkpoint at or after global step
N, ps1 gets SIGKILL; the launcher restarts it and the chief restores (every ps reads
its own shard of the checkpoint). `--memory`: the launcher's per-task limits; run large
`--rows` under them.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time

import psutil
from absl import app, flags

from benchmarks import sparse

FLAGS = flags.FLAGS
flags.DEFINE_integer("rows", 10_000_000, "Rows of the tables (--vocab_size).")
flags.DEFINE_integer("steps", 600, "Global steps (--train_steps).")
flags.DEFINE_string("out", None, "Output directory.", required=True)
flags.DEFINE_integer("kill_ps_after_step", 0, "Once the chief has saved a checkpoint at or "
                     "after this global step, SIGKILL ps1; the launcher restarts it "
                     "(--max_restarts=1) and the chief restores. 0: no kill.")
flags.DEFINE_integer("save_checkpoint_steps", 0, "Checkpoint cadence in global steps "
                     "(0: only the final save).")
flags.DEFINE_integer("fault_timeout_secs", None, "The tasks' --fault_timeout_secs (default: "
                     "the trainer's); a recovery's restore must fit in it.")
flags.DEFINE_string("memory", None, "Memory limits of the tasks, as the launcher's --memory "
                    "(e.g. ps=9Gi,worker=3Gi): a task past its limit is killed alone.")


def _launch(rows: int, steps: int, out: str, log, memory=None) -> subprocess.Popen:
    s = sparse.Settings(vocab_size=rows)
    argv = [sys.executable, "-m", "lowlevel.launch", "--num_ps=2", "--num_workers=2",
            f"--output_dir={out}/out", "--no_isolation", f"--vocab_size={s.vocab_size}",
            f"--embedding_dim={s.embedding_dim}", f"--hash_buckets={s.hash_buckets}",
            f"--hidden_units={','.join(map(str, s.hidden_units))}",
            f"--batch_size={s.batch_size}", f"--learning_rate={s.learning_rate}",
            "--model=wide_deep", "--dataset=synthetic_ctr", "--optimizer=adagrad",
            "--warmup_steps=10", "--keep_exports=0", f"--train_steps={steps}",
            "--log_every_secs=5", "--max_restarts=1"]
    argv += [f"--memory={memory}"] if memory else []
    argv += ([f"--fault_timeout_secs={FLAGS.fault_timeout_secs}"]
             if FLAGS.fault_timeout_secs else [])
    argv += ([f"--save_checkpoint_steps={FLAGS.save_checkpoint_steps}"]
             if FLAGS.save_checkpoint_steps else ["--save_checkpoint_secs=100000"])
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)


def _discover(pid: int, tasks: dict) -> None:
    for child in psutil.Process(pid).children():
        try:
            argv = child.cmdline()
        except psutil.Error:
            continue
        opts = dict(a[2:].split("=", 1) for a in argv if a.startswith("--") and "=" in a)
        if "job_name" in opts and "task_index" in opts:
            tasks.setdefault(opts["job_name"] + opts["task_index"], child.pid)


def _status(pid: int) -> dict:
    """{"VmRSS": MiB, "VmHWM": MiB} of a process, {} if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return {line.split(":")[0]: int(line.split()[1]) // 1024 for line in f
                    if line.startswith(("VmRSS", "VmHWM"))}
    except OSError:
        return {}


def _big_mappings(pid: int) -> list:
    """["size:resident" MiB] of the mappings of 16 MiB or more; [] if the process is gone."""
    found, size = [], 0
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                head = line.split()[0]
                if "-" in head and ":" not in head:
                    lo, hi = head.split("-")
                    size = (int(hi, 16) - int(lo, 16)) >> 20
                elif line.startswith("Rss:") and size >= 16:
                    found.append(f"{size}:{int(line.split()[1]) >> 10}")
    except OSError:
        return []
    return found


class _Tasks:
    """The launcher's tasks, each incarnation apart ("ps1", then "ps1 restarted").

    Attributes:
      pids: {incarnation: PID}; peak: {incarnation: VmHWM MiB};
      read: {incarnation: bytes read through read(2) (/proc/PID/io rchar): a ps
        reads nothing but checkpoints}.
    """

    def __init__(self):
        self.pids, self.peak, self.read = {}, {}, {}

    def discover(self, launcher: int) -> None:
        found = {}
        _discover(launcher, found)
        for name, pid in found.items():
            if pid in self.pids.values():
                continue
            key = name if name not in self.pids else f"{name} restarted"
            self.pids[key] = pid

    def sample(self, now: float, mem) -> None:
        for key, pid in self.pids.items():
            st = _status(pid)
            if st:
                mem.write(f"{now:.2f}\t{key}\t{st['VmRSS']}\t{st['VmHWM']}\n")
                self.peak[key] = max(self.peak.get(key, 0), st["VmHWM"])
                self.read[key] = _rchar(pid) or self.read.get(key, 0)

    def current(self, name: str):
        return self.pids.get(f"{name} restarted", self.pids.get(name))


def _rchar(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/io") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))
    except (OSError, StopIteration):
        return 0


def _saved_at_or_after(out: str, step: int) -> bool:
    """Whether the chief's events record a checkpoint of global step >= `step`."""
    for path in glob.glob(f"{out}/out/events/*.jsonl"):
        with open(path) as f:
            for line in f:
                r = json.loads(line)
                if r["event"] == "checkpoint_saved" and (r.get("global_step") or 0) >= step:
                    return True
    return False


def _run(out: str, log, mem, smaps) -> tuple:
    """Launches, samples until the launcher exits, kills the last ps if asked."""
    t0 = time.time()
    proc = _launch(FLAGS.rows, FLAGS.steps, out, log, FLAGS.memory)
    tasks, next_smaps, next_discovery, killed = _Tasks(), 0.0, 0.0, None
    victim = "ps1"
    while proc.poll() is None:
        now = time.time() - t0
        if now >= next_discovery:
            tasks.discover(proc.pid)
            next_discovery = now + 1.0
        tasks.sample(now, mem)
        if "ps0" in tasks.pids and now >= next_smaps:
            smaps.write(f"{now:.1f} {' '.join(_big_mappings(tasks.pids['ps0']))}\n")
            next_smaps = now + 2.0
            if FLAGS.kill_ps_after_step and killed is None and victim in tasks.pids and \
                    _saved_at_or_after(out, FLAGS.kill_ps_after_step):
                os.kill(tasks.pids[victim], signal.SIGKILL)
                killed = now
                log.write(f"ps_memory: SIGKILL to {victim} at {now:.2f} s\n")
                log.flush()
        time.sleep(0.1)
    return proc.returncode, t0, tasks, killed


def main(_) -> None:
    out = FLAGS.out
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "launcher.log"), "w") as log, \
            open(os.path.join(out, "mem.tsv"), "w") as mem, \
            open(os.path.join(out, "smaps.txt"), "w") as smaps:
        code, t0, tasks, killed = _run(out, log, mem, smaps)
    print("exit", code, "wall", round(time.time() - t0, 1), "peak MiB", tasks.peak)
    print("read MB", {k: round(v / 1e6) for k, v in tasks.read.items()})
    if killed is not None:
        print(f"ps1 killed at {killed:.2f} s")
    for path in sorted(glob.glob(f"{out}/out/events/*.jsonl")):
        with open(path) as f:
            for line in f:
                r = json.loads(line)
                print(f"{r['unix_time'] - t0:7.2f} {r['task']:8s} {r['event']} "
                      f"{r.get('global_step', '')}")
    for path in sorted(glob.glob(f"{out}/out/tasks/*.json")):
        with open(path) as f:
            r = json.load(f)
        if r.get("first_step_unix"):
            print(os.path.basename(path), "first step at", round(r["first_step_unix"] - t0, 2))


if __name__ == "__main__":
    app.run(main)
