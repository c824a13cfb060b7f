"""The data queue under churn: what a kill costs, and whether every example is in once.

    python -m benchmarks.elastic                      # ~9 min on 2 idle cores before the
                                                      # matched reference; a churn round of
                                                      # three launches: ~8-10 min (2026-12-07)
    python -m benchmarks.elastic --repeats=1 --skip_steady
    python -m benchmarks.elastic --skip_steady --data_dir=/data/criteo --churn_steps=24000
    python -m benchmarks.elastic --sync               # the same in sync training
    python -m benchmarks.elastic --sync --skip_churn  # the steady rounds only

wide_deep on Criteo-layout files with a planted signal (written first, `--rows` lines in
`--files` files, by `lowlevel.data.criteo`), every task a process on this machine
(`python -m lowlevel.launch --no_isolation`), async exact mode, `--batch_size`; with
`--sync`, sync: static is `SyncReplicasOptimizer`, the queue `lowlevel.modes.elastic_sync`
(its steps aggregate the live workers), and a global step is ~2 workers' batches (the
churn run's examples per step: the final `sync_queue/aggregated` / global_step).

steady  `--data_sharding=static` against `--data_sharding=queue`, 1 ps + 2 workers,
        alternating, `--repeats` rounds: examples/s after warm-up (`benchmarks._runners`)
        and test AUC. What the queue costs when nothing fails (its check and commit on
        ps 0 each step, one file read at a time by each worker).
churn   2 ps + 2 workers, `--data_sharding=queue --count_examples --dynamic_workers`,
        the launcher restarting what dies (`--max_restarts=1`); at 20, 35 and 50 % of
        the steps, SIGKILL of worker1, of ps1, of worker0 (the chief), in turn; at 65 %
        worker2 joins (`lowlevel.launch --resize=3`), at 85 % it leaves (`--resize=2`:
        SIGTERM, it stops at a safe point and frees its span). Each point is moved on by
        `--kill_phase` of a checkpoint interval (default half: mid-interval). From the tasks' events
        (`lowlevel.events`):
          resume_secs    a kill to the first progress after it (a ps's kill: after the
                         sessions' recovery): the cluster training again, whoever trains
          rolled_back_steps  (a ps's kill) the global step at the kill less the step of
                         the checkpoint the chief restored (work done again)
          rescale_secs   (a worker's kill, a join) its new process's `started` to its
                         first `progress`: a new worker's start to its first applied
                         steps, within --log_every_secs (0.25 s)
          rescale_cpu_secs  the CPU its new process had spent by then (the `progress`
                         event's `cpu_secs`; a forked task counts from its fork): what
                         the rescale costs apart from the cores it shares
          left_secs      (a leave) the resize request to the worker's `left` event
          churn_ratio    examples/s per live worker from the first kill to the end,
                         against the reference run's examples/s per worker over the same
                         steps (from 20 % to the end) (a worker is live from its
                         `session_ready`/`recovered` to its kill). The reference is the
                         same launch with nothing killed or resized, run beside it
                         (`--churn_rounds` pairs, the order alternating; the summary's
                         `churn_ratio` is the median of the rounds')
          churn_ratio_matched  the same against the matched reference run's examples/s
                         per live worker over the same window: the same launch with
                         worker2's join and leave acted as in the churn run and nothing
                         killed (`--matched_reference`). In sync, a step of 3 workers
                         waits for the slowest of 3 and brings ps0 a third push, so 3
                         workers train fewer examples/s per worker than 2 with nothing
                         failing (0.76-0.85 here, benchmarks/NOTES.md, thirtieth stop);
                         the 2-worker reference counts that as churn's cost, the matched
                         one does not: it is what the kills and restarts cost against
                         steady training of the same workers. Each round runs its three
                         launches back to back, the order reversed every other round
          churn_ratio_in_run  the same against the churn run's own rate before its
                         first kill (steps 200 to 20 %: a short window, early in the
                         files; information)
          churn_ratio_bracketed  the same against the mean of the churn run's own
                         rates before its first kill and after worker2's leave (from
                         1 s after its `left`, 2 workers again): both ends of the churn
                         window in the same run, so a machine whose speed drifts over
                         the run moves numerator and denominator alike (this machine's
                         did: NOTES, 2026-12-03, twenty-eighth stop); absent when
                         the run ends < 6 s after the `left` (async at 4,000 steps)
        Examples are worker batches applied: async a batch a global step; sync 2 a step
        with 2 live workers, and over the churn window the final checkpoint's
        `sync_queue/aggregated` less 2 a step before the first kill
          cluster_ratio  the cluster's examples/s from the first kill to the end against
                         the reference's over the same steps, whoever trains: what churn
                         costs where the workers share the machine's cores (a worker
                         that joins then adds no CPU, so per live worker cannot hold)
          machine_busy   the fraction of the machine's CPU in use from the first kill (the
                         reference: its point) to the end (`psutil.cpu_times`); the churn
                         run's `join_busy` while worker2 is in
        and from the final checkpoint (`data_queue/seen`, one count per line):
          lost / duplicated   lines counted fewer / more times than their span's
                              passes say (`lowlevel.data.spans`)
          uncommitted         global_step - committed_steps: steps begun whose commit
                              did not happen (with 2 ps, part of their update may be in)

`--cpu` gives each task of the churn and reference runs a CPU limit of its own
(`lowlevel.launch --cpu`, a CFS quota per task, as pods with `resources.limits.cpu`):
without it every task shares this machine's cores, so a worker that joins adds no CPU
and the per-live-worker rate cannot hold while it is in (`cluster_ratio` is the figure
for that case); with it each task has its own share, as on machines of its own, which
is what a per-live-worker target assumes, and a restarted task starts at its limit too
(its rescale takes longer than on a machine whose other tasks wait for it). The limits'
sum with the third worker in should stay below the machine's cores (the launcher warns
otherwise).

Results go to `<out>/results.json`; benchmarks/NOTES.md has the runs.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import psutil
from absl import app, flags

from benchmarks import _churn_figures, _runners
from lowlevel import events
from lowlevel.ops import cpu_limits

FLAGS = flags.FLAGS
flags.DEFINE_integer("repeats", 2, "Steady rounds (each runs both sides).")
flags.DEFINE_bool("sync", False, "Sync training (every run): see the module doc.")
flags.DEFINE_bool("skip_steady", False, "Run the churn run only.")
flags.DEFINE_bool("skip_churn", False, "Run the steady rounds only.")
flags.DEFINE_integer("rows", 400_000, "Training lines written (and 20,000 test lines).")
flags.DEFINE_integer("files", 16, "Training files: the queue's spans.")
flags.DEFINE_integer("batch_size", 256, "Examples per worker step.")
flags.DEFINE_integer("steady_steps", 1500, "Global steps of a steady run.")
flags.DEFINE_integer("churn_steps", 4000, "Global steps of the churn run.")
flags.DEFINE_integer("checkpoint_steps", 500, "--save_checkpoint_steps of every run (a ps's "
                     "kill rolls back to the last checkpoint).")
flags.DEFINE_string("out", None, "Directory for the data, runs and results.json.")
flags.DEFINE_string("data_dir", None, "Use the files already in <data_dir>/train (*.tsv) and "
                    "<data_dir>/test instead of writing --rows lines (e.g. a file set larger "
                    "than memory, written once by python -m lowlevel.data.make_criteo).")
flags.DEFINE_integer("churn_rounds", 1, "Churn runs, each with its reference run (the order "
                     "alternating).")
flags.DEFINE_bool("churn_reference", True, "Run each churn run's reference: the same run with "
                  "nothing killed or resized (churn_ratio's denominator).")
flags.DEFINE_bool("matched_reference", True, "Run each churn run's matched reference too: the "
                  "same run with worker2's join and leave and nothing killed "
                  "(churn_ratio_matched's denominator).")
flags.DEFINE_float("kill_phase", 0.5, "Where in a checkpoint interval the schedule acts "
                   "(fraction of --checkpoint_steps after a save: 0.5, mid-interval, a ps's kill "
                   "rolls back half an interval, the mean of a kill at a random time; 0, as a "
                   "save begins, the worst case: a ps's kill cuts the save and rolls back a whole "
                   "interval).")
flags.DEFINE_string("cpu", None, "Each task's CPU limit in the churn and reference runs "
                    "(lowlevel.launch --cpu: a cgroup per task with a CFS quota, as a pod's "
                    "limits.cpu), e.g. ps=400m,worker=300m: a joining worker brings its own "
                    "CPU instead of taking the others' (module doc). Default: none, every task "
                    "shares the machine's cores.")
flags.DEFINE_enum("graph_rewrites", "auto", ["auto", "default", "one", "off"],
                  "The trainer's --graph_rewrites in every run (Grappler at each new session: "
                  "what a restart pays before its first step).")
flags.DEFINE_float("timeout_secs", 600, "A run still going after this is killed (failed).")

# (fraction of --churn_steps, what, task): SIGKILL a task; resize to 3 (worker2 joins)
# and back to 2 (it leaves)
SCHEDULE = ((0.2, "kill", "worker1"), (0.35, "kill", "ps1"), (0.5, "kill", "worker0"),
            (0.65, "join", "worker2"), (0.85, "leave", "worker2"))
# the references' schedules: the churn window's start noted ("none"), and for the matched
# reference worker2's join and leave acted as in SCHEDULE
REFERENCES = {"reference": ((SCHEDULE[0][0], "none", "-"),),
              "matched": ((SCHEDULE[0][0], "none", "-"),
                          *(act for act in SCHEDULE if act[1] in ("join", "leave")))}


def _data(out: str) -> list:
    from lowlevel.data import criteo
    if FLAGS.data_dir:
        return [f"--train_files={os.path.join(FLAGS.data_dir, 'train')}/*.tsv",
                f"--eval_files={os.path.join(FLAGS.data_dir, 'test')}/*"]
    train = criteo.write_files(os.path.join(out, "data", "train"), FLAGS.rows, FLAGS.files)
    criteo.write_files(os.path.join(out, "data", "test"), 20_000, 1, seed=9)
    return [f"--train_files={os.path.dirname(train[0])}/*.tsv",
            f"--eval_files={os.path.join(out, 'data', 'test')}/*"]


def _train_paths(files: list) -> list:
    """The training files of the flags `files` (`--train_files=<dir>/*.tsv` first)."""
    train_dir = os.path.dirname(files[0].split("=", 1)[1])
    return sorted(os.path.join(train_dir, p) for p in os.listdir(train_dir)
                  if p.endswith(".tsv"))


def _common(files: list) -> list:
    return ["--model=wide_deep", "--dataset=criteo_files", f"--batch_size={FLAGS.batch_size}",
            f"--save_checkpoint_steps={FLAGS.checkpoint_steps}", *files,
            f"--graph_rewrites={FLAGS.graph_rewrites}", *(["--sync"] if FLAGS.sync else [])]


def steady(out: str, files: list) -> dict:
    """The static/queue rounds: {side: [run summaries]} and the median ratio."""
    sides: dict = {"static": [], "queue": []}
    for i in range(FLAGS.repeats):
        for side in (("static", "queue") if i % 2 == 0 else ("queue", "static")):
            workdir = os.path.join(out, f"steady_{side}_r{i}")
            os.makedirs(workdir, exist_ok=True)
            run = _runners.run_lowlevel(1, 2, _common(files) + [
                f"--data_sharding={side}", f"--train_steps={FLAGS.steady_steps}",
                "--warmup_steps=100", "--log_every_secs=5"],
                workdir, FLAGS.timeout_secs, FLAGS.batch_size)
            if not run.get("ok"):
                raise SystemExit(f"steady {side}, round {i}: {run.get('error')}")
            sides[side].append({"examples_per_sec": run["examples_per_sec"],
                                "auc": run["auc"], "global_step": run["global_step"]})
            print(f"steady round {i} {side:6s} examples/s {run['examples_per_sec']:9.1f}  "
                  f"AUC {run['auc']:.4f}  final step {run['global_step']}", flush=True)
    ratios = [q["examples_per_sec"] / s["examples_per_sec"]
              for q, s in zip(sides["queue"], sides["static"])]
    return {**sides, "ratios": [round(r, 3) for r in ratios],
            "ratio": round(statistics.median(ratios), 3)}


def _task(launcher: psutil.Process, run_dir: str, name: str) -> psutil.Process:
    """Task `name`'s live process: the pid of its last `started` event, a launcher's child
    (with `--dynamic_workers` the tasks' argv do not name them)."""
    pids = [r["pid"] for r in events.read_all(run_dir)
            if r["task"] == name and r["event"] == "started"]
    children = {c.pid: c for c in launcher.children()}
    if not pids or pids[-1] not in children:
        raise RuntimeError(f"no live {name} among the launcher's children")
    return children[pids[-1]]


def _point(at: float) -> float:
    """The global step at which a `SCHEDULE` entry acts: `at` of --churn_steps, moved on by
    --kill_phase of a checkpoint interval (the schedule's fractions of 20,000 or 4,000
    steps are multiples of the interval: unmoved, every kill falls as a save begins)."""
    return at * FLAGS.churn_steps + FLAGS.kill_phase * FLAGS.checkpoint_steps


def _act(proc, run_dir: str, what: str, name: str) -> None:
    """One step of `SCHEDULE`: SIGKILL task `name`, or resize (a join: 3 workers; a leave:
    2) through the launcher's `--resize`."""
    if what == "kill":
        _task(psutil.Process(proc.pid), run_dir, name).send_signal(signal.SIGKILL)
        return
    resized = subprocess.run([sys.executable, "-m", "lowlevel.launch", f"--output_dir={run_dir}",
                              f"--resize={3 if what == 'join' else 2}"],
                             capture_output=True, text=True, timeout=180)
    if resized.returncode != 0:
        raise RuntimeError(f"--resize: {resized.stdout}{resized.stderr}")


def churn(out: str, files: list) -> dict:
    """`--churn_rounds` rounds of the churn run and its reference (the same run, nothing
    killed or resized), the order alternating; each round's figures (module doc) and the
    median of its churn_ratio."""
    from lowlevel.data import spans
    counts = os.path.join(out, "line_counts.json")
    # the files' lines counted once, before any clock starts (`--count_examples` reads them)
    spans.line_counts(_train_paths(files), counts)
    rounds = []
    sides = ["reference"] * FLAGS.churn_reference + ["matched"] * FLAGS.matched_reference
    for i in range(FLAGS.churn_rounds):
        order = (sides + ["churn"]) if i % 2 == 0 else (["churn"] + sides[::-1])
        runs = {side: _churn_run(os.path.join(out, f"{side}_r{i}"), files, counts,
                                 REFERENCES.get(side, SCHEDULE)) for side in order}
        figures = runs["churn"]
        if "reference" in runs:
            figures["reference_per_worker"] = runs["reference"]["per_worker"]
            figures["churn_ratio"] = round(
                figures["churn_per_live_worker"] / figures["reference_per_worker"], 3)
            figures["cluster_ratio"] = round(
                figures["per_worker"] / figures["reference_per_worker"], 3)
            figures["reference_machine_busy"] = runs["reference"]["machine_busy"]
            if "held_back" in runs["reference"]:
                figures["reference_held_back"] = runs["reference"]["held_back"]
                _warn_ps_bound(runs["reference"]["ps_bound"])
        if "matched" in runs:
            figures["matched_per_live_worker"] = runs["matched"]["churn_per_live_worker"]
            figures["churn_ratio_matched"] = round(
                figures["churn_per_live_worker"] / figures["matched_per_live_worker"], 3)
        rounds.append(figures)
        print(f"churn round {i}: " + json.dumps({k: v for k, v in figures.items()
                                                  if k != "kills"}), flush=True)
    summary = {"rounds": rounds, "cpu": FLAGS.cpu}
    for name in ("churn_ratio", "churn_ratio_matched"):
        ratios = [r[name] for r in rounds if name in r]
        if ratios:
            summary[name] = round(statistics.median(ratios), 3)
    return summary


def _warn_ps_bound(ps_bound: dict) -> None:
    """A line when a ps of the reference run was held back by its `--cpu` limit in most of
    its periods (`ps_bound`: `cpu_limits.ps_held_back`): a joining worker's pushes then
    wait on that ps too, so per live worker against the 2-worker reference partly
    measures the ps's limit."""
    if ps_bound:
        print("churn: warning: the reference's ps tasks were held back by their CPU limits "
              "in most periods (" + ", ".join(f"{name} {share:.0%}"
                                             for name, share in ps_bound.items())
              + "): a joining worker's pushes wait on them too, and per live worker partly "
              "measures that limit (--cpu=ps=... gives them more)", flush=True)


def _churn_run(workdir: str, files: list, counts: str, schedule) -> dict:
    """One 2 ps + 2 worker run of `--churn_steps`, `schedule` (`SCHEDULE`, or one of
    `REFERENCES`) acted on as the global step passes each point ("none": only noted, for
    `_churn_figures.rates`' window)."""
    run_dir = os.path.join(workdir, "out")
    os.makedirs(run_dir, exist_ok=True)
    shutil.copy(counts, os.path.join(run_dir, "line_counts.json"))
    log = open(os.path.join(workdir, "launch.log"), "w")
    proc = subprocess.Popen([sys.executable, "-m", "lowlevel.launch", "--num_ps=2",
                             "--num_workers=2", "--no_isolation", f"--output_dir={run_dir}",
                             "--max_restarts=1", "--log_every_secs=0.25", "--count_examples",
                             "--dynamic_workers", f"--train_steps={FLAGS.churn_steps}",
                             *([f"--cpu={FLAGS.cpu}"] if FLAGS.cpu else []),
                             *_common(files)], stdout=log, stderr=subprocess.STDOUT)
    kills, deadline = [], time.monotonic() + FLAGS.timeout_secs
    cpu = {}  # what -> the machine's CPU times when the schedule acted
    # the new records only: a read of every record each poll cost this process ~0.1-0.2 of
    # a core by the run's end, taken from the capped tasks' share of the 2 cores
    follower, last = events.Follower(run_dir), (0.0, 0)  # the newest progress: time, step
    try:
        for at, what, name in schedule:
            while time.monotonic() < deadline and proc.poll() is None:
                last = max([last] + [(r["unix_time"], r["global_step"]) for r in follower.new()
                                     if r["event"] == "progress"])
                if last[1] >= _point(at):
                    break
                time.sleep(0.05)
            step = last[1]  # the newest step (after a ps's kill, the restored one)
            cpu.setdefault("first", psutil.cpu_times())
            cpu[what] = psutil.cpu_times()
            kills.append({"task": name, "what": what, "unix_time": time.time(),
                          "global_step": step})
            if what != "none":
                _act(proc, run_dir, what, name)
                print(f"churn: {what} {name} at global step {step}", flush=True)
        code = proc.wait(max(1.0, deadline - time.monotonic()))
        cpu["end"] = psutil.cpu_times()
    finally:
        if proc.poll() is None:
            for child in psutil.Process(proc.pid).children():
                child.kill()
            proc.kill()
            proc.wait()
        log.close()
    if code != 0:
        raise SystemExit(f"{workdir}: the launcher exited {code}; see {log.name}")
    counted = _counts(run_dir, files)
    busy = {"machine_busy": _busy(cpu["first"], cpu["end"]),
            **({"join_busy": _busy(cpu["join"], cpu["leave"])} if "leave" in cpu else {})}
    records = events.read_all(run_dir)
    with open(log.name) as f:
        used = cpu_limits.parse_summary(f.read())
    acted = [kill for kill in kills if kill["what"] != "none"]
    return {"kills": _churn_figures.kill_figures(records, acted),
            **_churn_figures.rates(records, kills, FLAGS.batch_size, counted.get("aggregated")),
            **busy, **counted, **({"held_back": cpu_limits.held_back_shares(used),
                                   "ps_bound": cpu_limits.ps_held_back(used)} if used else {})}


def _busy(start, end) -> float:
    """The fraction of the machine's CPU (all cores) in use between two `psutil.cpu_times()`."""
    idle = (end.idle + getattr(end, "iowait", 0.0)) - (start.idle + getattr(start, "iowait", 0.0))
    total = sum(end) - sum(start)
    return round(1.0 - idle / total, 3) if total > 0 else float("nan")


def _counts(run_dir: str, files: list) -> dict:
    """Lost, duplicated and uncommitted, from the final checkpoint (module doc)."""
    import tensorflow as tf
    from lowlevel.data import spans
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(run_dir))
    state = {n: reader.get_tensor(f"{spans.SCOPE}/{n}") for n in (
        "seen", "offset", "passes", "committed_steps")}
    counts = spans.line_counts(_train_paths(files), os.path.join(run_dir, "line_counts.json"))
    expected, start = np.zeros(sum(counts), np.int64), 0
    for k, n in enumerate(counts):  # each line: its span's passes, +1 before the offset
        expected[start:start + n] = state["passes"][k]
        expected[start:start + state["offset"][k]] += 1
        start += n
    step = int(reader.get_tensor("global_step"))
    aggregated = int(reader.get_tensor("sync_queue/aggregated")) if FLAGS.sync else None
    sync = {"aggregated": aggregated,
            "batches_per_step": round(aggregated / step, 3)} if FLAGS.sync else {}
    return {"global_step": step, **sync, "passes": [int(state["passes"].min()),
                                            int(state["passes"].max())],
            "lost": int(np.sum(np.maximum(expected - state["seen"], 0))),
            "duplicated": int(np.sum(np.maximum(state["seen"] - expected, 0))),
            "uncommitted": step - int(state["committed_steps"])}


def main(argv) -> None:
    del argv
    out = FLAGS.out or tempfile.mkdtemp(prefix="elastic_bench_")
    os.makedirs(out, exist_ok=True)  # with --data_dir nothing else makes it
    files = _data(out)
    results = {} if FLAGS.skip_steady else {"steady": steady(out, files)}
    if not FLAGS.skip_churn:
        results["churn"] = churn(out, files)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(json.dumps(results))


if __name__ == "__main__":
    app.run(main)
