"""Where a ps's memory goes: its VmRSS and VmHWM over time, during one sparse-suite run.

    python -m benchmarks.ps_memory --rows=10000000 --out=/tmp/psmem [--steps=600]

Starts `lowlevel.launch` (2 ps + 2 workers, the sparse suite's model flags:
`benchmarks.sparse.Settings`) and, until it exits, samples every task's
/proc/PID/status every 0.1 s and ps0's /proc/PID/smaps every 0.5 s. Writes
`<out>/mem.tsv` (seconds since launch, task, VmRSS MiB, VmHWM MiB), `<out>/smaps.txt`
(seconds, then each mapping of 16 MiB or more as "size MiB:resident MiB": a
305 MiB mapping is one copy of a 10 M-row table's shard or its accumulator;
adjacent ones merge) and `<out>/launcher.log`; prints each task's peak (MiB), the
tasks' events and first steps (seconds since launch). Run it under a memory
limit of its own (a cgroup) at large `--rows`.
"""

from __future__ import annotations

import glob
import json
import os
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


def _launch(rows: int, steps: int, out: str, log) -> subprocess.Popen:
    s = sparse.Settings(vocab_size=rows)
    argv = [sys.executable, "-m", "lowlevel.launch", "--num_ps=2", "--num_workers=2",
            f"--output_dir={out}/out", "--no_isolation", f"--vocab_size={s.vocab_size}",
            f"--embedding_dim={s.embedding_dim}", f"--hash_buckets={s.hash_buckets}",
            f"--hidden_units={','.join(map(str, s.hidden_units))}",
            f"--batch_size={s.batch_size}", f"--learning_rate={s.learning_rate}",
            "--model=wide_deep", "--dataset=synthetic_ctr", "--optimizer=adagrad",
            "--warmup_steps=10", "--keep_exports=0", f"--train_steps={steps}",
            "--save_checkpoint_secs=100000", "--log_every_secs=5"]
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


def main(_) -> None:
    out = FLAGS.out
    os.makedirs(out, exist_ok=True)
    t0 = time.time()
    with open(os.path.join(out, "launcher.log"), "w") as log, \
            open(os.path.join(out, "mem.tsv"), "w") as mem, \
            open(os.path.join(out, "smaps.txt"), "w") as smaps:
        proc, tasks, peak, next_smaps = _launch(FLAGS.rows, FLAGS.steps, out, log), {}, {}, 0.0
        while proc.poll() is None:
            _discover(proc.pid, tasks)
            now = time.time() - t0
            for name, pid in tasks.items():
                st = _status(pid)
                if st:
                    mem.write(f"{now:.2f}\t{name}\t{st['VmRSS']}\t{st['VmHWM']}\n")
                    peak[name] = max(peak.get(name, 0), st["VmHWM"])
            if "ps0" in tasks and now >= next_smaps:
                smaps.write(f"{now:.1f} {' '.join(_big_mappings(tasks['ps0']))}\n")
                next_smaps = now + 0.5
            time.sleep(0.1)
    print("exit", proc.returncode, "wall", round(time.time() - t0, 1), "peak MiB", peak)
    for path in sorted(glob.glob(f"{out}/out/events/*.jsonl")):
        with open(path) as f:
            for line in f:
                r = json.loads(line)
                print(f"{r['unix_time'] - t0:7.2f} {r['task']:8s} {r['event']}")
    for path in sorted(glob.glob(f"{out}/out/tasks/*.json")):
        with open(path) as f:
            r = json.load(f)
        if r.get("first_step_unix"):
            print(os.path.basename(path), "first step at", round(r["first_step_unix"] - t0, 2))


if __name__ == "__main__":
    app.run(main)
