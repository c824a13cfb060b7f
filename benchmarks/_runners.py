"""Running one configuration of one trainer, start to finish, and measuring it from outside.

Each `run_*` function starts the trainer's processes (cwd = this repository, so
`lowlevel` and `benchmarks` come from this tree), watches them with a
`_measure.Watcher`, waits for the records the trainers write, stops what never exits
by PID, and returns one *run* dict:

  ok: bool; error: str (when not ok); skipped: str (when the trainer rejected the mode)
  examples_per_sec: all workers, after warm-up (sum of the workers' own rates; tf2_pss:
      the coordinator's measured steps * batch / window)
  step_ms_p50, step_ms_p90: milliseconds, mean over the workers of each worker's
      percentile of its `session.run` wall times (tf2_pss: per-chunk, see tf2_pss.py)
  bytes_per_step: bytes moved (both ways) between one worker and all ps tasks per local
      worker step in the measured window, measured from the TCP counters
  bytes_by_ps: {ps name: bytes in the measured windows}, for the balance between ps tasks
  peak_rss_mb: {task: MiB}, VmHWM
  startup_secs: from starting the first process to the end of the first step of the
      last worker to start training (tf2_pss: the coordinator's first joined step)
  startup_import_secs: (lowlevel) the part of it until the last task had imported
      TensorFlow (its `started` event)
  shutdown_secs: from the last worker's last step to every process gone (None, with
      `shutdown_note`, when the trainer's ps never exits by itself)
  accuracy, loss: test split, from final_metrics.json (lowlevel only)
  tasks: the per-task records as the trainers wrote them
  wall_secs: the whole run, seconds
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Optional

import portpicker
import psutil

from benchmarks import _memory, _reference
from benchmarks._measure import Watcher, kill_tree
from lowlevel import events, output_layout
from lowlevel.ops import lifetime
from lowlevel.tf_import import skip_keras

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STOP_GRACE_SECS = 5.0


class Procs:
    """The processes of one run, started from ROOT with their output in `workdir`."""

    def __init__(self, workdir: str, watcher: Watcher):
        self.workdir = workdir
        self.watcher = watcher
        self.popen: dict[str, subprocess.Popen] = {}
        # lifetime.child_env: every process it starts dies with this one (a reference
        # trainer's ps never exits by itself: a benchmark killed with SIGKILL left them).
        self.env = lifetime.child_env(dict(
            os.environ, PYTHONUNBUFFERED="1",
            PYTHONPATH=os.pathsep.join([ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p])))
        self.env.pop("TF_CONFIG", None)
        # Every trainer here, lowlevel's and the references, imports TensorFlow without
        # Keras, which none of them uses (lowlevel/tf_import.py: ~3 s of CPU per process).
        skip_keras(self.env)
        self.launched = time.time()

    @classmethod
    def watched(cls, workdir: str, interval: float) -> "Procs":
        """A run's processes with their `Watcher` started, sampling every `interval` s."""
        watcher = Watcher(interval)
        procs = cls(workdir, watcher)
        watcher.start()
        procs.launched = time.time()
        return procs

    def start(self, name: str, argv: list, role: str = "other", ports=()) -> subprocess.Popen:
        with open(self.log_path(name), "w") as log:
            proc = subprocess.Popen(_memory.join_argv(argv), stdout=log,
                                    stderr=subprocess.STDOUT, cwd=ROOT, env=self.env,
                                    stdin=subprocess.DEVNULL)
        self.popen[name] = proc
        self.watcher.add(name, proc.pid, role, ports)
        return proc

    def log_path(self, name: str) -> str:
        return os.path.join(self.workdir, f"{name}.log")

    def log(self, name: str, lines: int = 15) -> str:
        try:
            with open(self.log_path(name), errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    def stop(self, names=None) -> None:
        """SIGTERM, then after STOP_GRACE_SECS SIGKILL (by PID, children included)."""
        procs = [p for n, p in self.popen.items() if names is None or n in names]
        for p in procs:
            if p.poll() is None:
                p.terminate()
        deadline = time.monotonic() + STOP_GRACE_SECS
        for p in procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        self.kill_all(names)

    def kill_all(self, names=None) -> None:
        handles = []
        for n, p in self.popen.items():
            if names is None or n in names:
                try:
                    handles.append(psutil.Process(p.pid))
                except psutil.NoSuchProcess:
                    pass
        kill_tree(handles)
        for n, p in self.popen.items():
            if names is None or n in names:
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass


def _py(module: str) -> list:
    return [sys.executable, "-m", module]


def _read_json(path: str) -> Optional[dict]:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _wait(pred, deadline: float, poll: float = 0.05) -> bool:
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(poll)
    return pred()


def summarise(tasks: list, watcher: Watcher, batch_size: int, launched_unix: float,
              worker_groups: list) -> dict:
    """The run's figures from the task records and what the watcher saw.

    Args:
      tasks: normalised records: {measured_steps, examples_per_sec, step_ms_p50,
        step_ms_p90, first_step_unix, last_step_unix}.
      worker_groups: per record, the worker process names whose bytes it accounts for.
    """
    eps = [t["examples_per_sec"] for t in tasks if t.get("examples_per_sec")]
    bytes_by_ps: dict = {}
    per_step = []
    for t, group in zip(tasks, worker_groups):
        if not t.get("examples_per_sec") or not t.get("measured_steps"):
            continue
        window = t["measured_steps"] * batch_size / t["examples_per_sec"]
        end = t["last_step_unix"]
        dt, by_ps = watcher.bytes_in_window(end - window, end, group)
        if dt <= 0 or not by_ps:
            continue
        steps = t["measured_steps"] * dt / window
        per_step.append(sum(by_ps.values()) / steps)
        for k, v in by_ps.items():
            bytes_by_ps[k] = bytes_by_ps.get(k, 0) + v
    firsts = [t["first_step_unix"] for t in tasks if t.get("first_step_unix")]
    p50 = [t["step_ms_p50"] for t in tasks if t.get("step_ms_p50")]
    p90 = [t["step_ms_p90"] for t in tasks if t.get("step_ms_p90")]
    return {
        "examples_per_sec": round(sum(eps), 1) if eps else None,
        "step_ms_p50": round(sum(p50) / len(p50), 3) if p50 else None,
        "step_ms_p90": round(sum(p90) / len(p90), 3) if p90 else None,
        "bytes_per_step": round(sum(per_step) / len(per_step)) if per_step else None,
        "bytes_by_ps": bytes_by_ps,
        "startup_secs": round(max(firsts) - launched_unix, 2) if firsts else None,
        "peak_rss_mb": {n: round(kb / 1024, 1) for n, kb in watcher.peak_kb.items()
                        if watcher.roles.get(n) in ("ps", "worker", "chief")},
    }


def _shutdown(watcher: Watcher, tasks: list) -> Optional[float]:
    lasts = [t["last_step_unix"] for t in tasks if t.get("last_step_unix")]
    if not lasts or not watcher.all_gone():
        return None
    return round(max(watcher.exit_unix.values()) - max(lasts), 2)


def _hosts(argv: list, flag: str) -> list:
    for a in argv:
        if a.startswith(f"--{flag}="):
            return [h for h in a.split("=", 1)[1].split(",") if h]
    return []


def _flag(argv: list, flag: str) -> Optional[str]:
    for a in argv:
        if a.startswith(f"--{flag}="):
            return a.split("=", 1)[1]
    return None


def run_lowlevel(num_ps: int, num_workers: int, flags: list, workdir: str, timeout_secs: float,
                 batch_size: int, interval: float = 0.1) -> dict:
    """`python -m lowlevel.launch` (num_ps >= 1) or in-process `lowlevel.trainer` (num_ps 0)."""
    out = os.path.join(workdir, "out")
    procs = Procs.watched(workdir, interval)
    watcher, launched = procs.watcher, procs.launched
    deadline = time.monotonic() + timeout_secs
    try:
        if num_ps == 0:
            main = procs.start("worker0", _py("lowlevel.trainer") + [f"--output_dir={out}"] +
                               flags, role="worker")
        else:
            # --no_isolation: the watcher counts each task's TCP bytes from this
            # namespace; in the launcher's private one its sockets are not visible.
            main = procs.start("launcher", _py("lowlevel.launch") + [
                f"--num_ps={num_ps}", f"--num_workers={num_workers}", f"--output_dir={out}",
                "--no_isolation"] + flags, role="other")
        found: set = set()
        while main.poll() is None and time.monotonic() < deadline:
            if num_ps and len(found) < num_ps + num_workers:
                _discover(main.pid, watcher, found)
            time.sleep(0.05)
        timed_out = main.poll() is None
        if timed_out:
            procs.stop()
        _wait(watcher.all_gone, time.monotonic() + STOP_GRACE_SECS)
        time.sleep(interval)
    finally:
        watcher.stop()
        procs.kill_all()
    name = "worker0" if num_ps == 0 else "launcher"
    if timed_out:
        return {"ok": False, "error": f"timed out after {timeout_secs:.0f} s:\n"
                                      f"{procs.log(name)}"}
    if main.returncode != 0:
        log = procs.log(name)
        if main.returncode == 2 and _flag(flags, "communication_period") not in (None, "1"):
            # A usage error (the exit status says so) for a communication-reduced
            # run: the trainer refuses that mode for this configuration; the
            # message is shown, not read.
            return {"ok": False, "skipped": _error_line(log)}
        return {"ok": False, "error": f"{name} exited {main.returncode}:\n{log}"}
    tasks = []
    for i in range(num_workers):
        rec = _read_json(output_layout.task_record(out, f"worker{i}"))
        if rec is None:
            return {"ok": False, "error": f"no tasks/worker{i}.json in {out}"}
        tasks.append(rec)
    metrics = _read_json(output_layout.final_metrics(out)) or {}
    run = summarise(tasks, watcher, batch_size, launched, [[t["task"]] for t in tasks])
    run.update(ok=True, shutdown_secs=_shutdown(watcher, tasks), shutdown_note=None,
               startup_import_secs=imported_secs(out, launched),
               accuracy=metrics.get("accuracy"), loss=metrics.get("loss"),
               auc=metrics.get("auc"), dynamic_rows=metrics.get("dynamic_rows"),
               global_step=metrics.get("global_step"), tasks=tasks,
               wall_secs=round(time.time() - launched, 1))
    return run


def imported_secs(output_dir: str, launched_unix: float) -> Optional[float]:
    """Seconds from the launch to the `started` event of the last task to send one.

    A lowlevel task sends `started` (`lowlevel.events`) once TensorFlow is imported,
    so this is the part of the start-up spent starting Python and importing TensorFlow.
    """
    first: dict = {}
    for record in events.read_all(output_dir):
        if record["event"] == "started" and record["unix_time"] >= launched_unix:
            first.setdefault(record["task"], record["unix_time"])
    return round(max(first.values()) - launched_unix, 2) if first else None


def _error_line(log: str) -> str:
    lines = [line.strip() for line in log.splitlines() if "error" in line.lower()]
    return lines[-1] if lines else log.strip().splitlines()[-1]


def _discover(launcher_pid: int, watcher: Watcher, found: set) -> None:
    """Registers the launcher's trainer children with the watcher as they appear."""
    try:
        children = psutil.Process(launcher_pid).children()
    except psutil.NoSuchProcess:
        return
    for child in children:
        if child.pid in found:
            continue
        try:
            argv = child.cmdline()
        except psutil.Error:
            continue
        job, index = _flag(argv, "job_name"), _flag(argv, "task_index")
        if job not in ("ps", "worker") or index is None:
            continue
        host = _hosts(argv, f"{job}_hosts")[int(index)]
        watcher.add(f"{job}{index}", child.pid, job, [int(host.rsplit(":", 1)[1])])
        found.add(child.pid)


def run_classic(num_ps: int, num_workers: int, flags: list, workdir: str, timeout_secs: float,
                batch_size: int, interval: float = 0.1, module: str = "benchmarks.classic") -> dict:
    """The textbook trainer, every task at once; the non-chief workers wait for the chief's
    session (`--start_file`), then all train together.

    `module`: benchmarks.classic (the MLP) or benchmarks.classic_sparse (wide & deep).
    """
    ps = [portpicker.pick_unused_port() for _ in range(num_ps)]
    wk = [portpicker.pick_unused_port() for _ in range(num_workers)]
    cluster = [f"--ps_hosts={','.join(f'127.0.0.1:{p}' for p in ps)}",
               f"--worker_hosts={','.join(f'127.0.0.1:{p}' for p in wk)}"]
    go = os.path.join(workdir, "go")
    procs = Procs.watched(workdir, interval)
    watcher, launched = procs.watcher, procs.launched
    deadline = time.monotonic() + timeout_secs
    error = None
    outs = [os.path.join(workdir, f"worker{i}.json") for i in range(num_workers)]
    try:
        for k in range(num_ps):
            procs.start(f"ps{k}", _py(module) + cluster + flags +
                        ["--job_name=ps", f"--task_index={k}"], "ps", [ps[k]])
        for i in range(num_workers):  # the others wait for the chief's session
            procs.start(f"worker{i}", _py(module) + cluster + flags + [
                "--job_name=worker", f"--task_index={i}", f"--out_json={outs[i]}",
                f"--start_file={go}"], "worker", [wk[i]])
        for i in range(num_workers):
            ready = _wait(lambda: os.path.exists(_reference.ready_file(go, f"worker{i}"))
                          or procs.popen[f"worker{i}"].poll() is not None, deadline)
            if not ready or procs.popen[f"worker{i}"].poll() is not None:
                error = f"worker{i} never had its session:\n{procs.log(f'worker{i}')}"
                break
        if error is None:
            open(go, "w").close()
            workers = [procs.popen[f"worker{i}"] for i in range(num_workers)]
            if not _wait(lambda: all(w.poll() is not None for w in workers), deadline, 0.1):
                error = f"workers still running after {timeout_secs:.0f} s"
            elif any(w.returncode for w in workers):
                bad = next(i for i, w in enumerate(workers) if w.returncode)
                error = (f"worker{bad} exited {workers[bad].returncode}:\n"
                         f"{procs.log(f'worker{bad}')}")
        time.sleep(interval)
    finally:
        watcher.stop()
        procs.stop()  # the ps tasks block in server.join() forever: killed by PID
    if error:
        return {"ok": False, "error": error}
    tasks = []
    for path in outs:
        rec = _read_json(path)
        if rec is None:
            return {"ok": False, "error": f"no record {path}"}
        tasks.append(dict(rec, measured_steps=rec["local_steps"]))
    run = summarise(tasks, watcher, batch_size, launched, [[t["task"]] for t in tasks])
    exits = [watcher.exit_unix.get(f"worker{i}") for i in range(num_workers)]
    lasts = [t["last_step_unix"] for t in tasks]
    run.update(ok=True, shutdown_secs=None, tasks=tasks, accuracy=None, loss=None,
               shutdown_note="ps never exits (server.join()); killed by PID",
               workers_exit_secs=round(max(exits) - max(lasts), 2) if all(exits) else None,
               wall_secs=round(time.time() - launched, 1))
    return run


def run_tf2_pss(num_ps: int, num_workers: int, flags: list, workdir: str, timeout_secs: float,
                batch_size: int, interval: float = 0.1, module: str = "benchmarks.tf2_pss") -> dict:
    """ParameterServerStrategy: ps and workers serve forever; the chief writes the record.

    `module`: benchmarks.tf2_pss (the MLP) or benchmarks.tf2_pss_sparse (wide & deep).
    """
    ps = [portpicker.pick_unused_port() for _ in range(num_ps)]
    wk = [portpicker.pick_unused_port() for _ in range(num_workers)]
    chief = portpicker.pick_unused_port()
    cluster = [f"--ps_hosts={','.join(f'127.0.0.1:{p}' for p in ps)}",
               f"--worker_hosts={','.join(f'127.0.0.1:{p}' for p in wk)}",
               f"--chief_host=127.0.0.1:{chief}"]
    out = os.path.join(workdir, "chief.json")
    procs = Procs.watched(workdir, interval)
    watcher, launched = procs.watcher, procs.launched
    error = None
    try:
        for k in range(num_ps):
            procs.start(f"ps{k}", _py(module) + cluster + flags +
                        ["--job_name=ps", f"--task_index={k}"], "ps", [ps[k]])
        for i in range(num_workers):
            procs.start(f"worker{i}", _py(module) + cluster + flags +
                        ["--job_name=worker", f"--task_index={i}"], "worker", [wk[i]])
        coord = procs.start("chief", _py(module) + cluster + flags +
                            ["--job_name=chief", f"--out_json={out}"], "chief", [chief])
        if not _wait(lambda: coord.poll() is not None, time.monotonic() + timeout_secs, 0.1):
            error = f"chief still running after {timeout_secs:.0f} s:\n{procs.log('chief')}"
        elif coord.returncode != 0:
            error = f"chief exited {coord.returncode}:\n{procs.log('chief')}"
        time.sleep(interval)
    finally:
        watcher.stop()
        procs.stop()  # ps and workers block in tf.distribute.Server.join(): killed by PID
    rec = _read_json(out)
    if error or rec is None:
        return {"ok": False, "error": error or f"no record {out}"}
    rec = dict(rec, measured_steps=rec["local_steps"])
    workers = [f"worker{i}" for i in range(num_workers)]
    run = summarise([rec], watcher, batch_size, launched, [workers])
    run.update(ok=True, shutdown_secs=None, tasks=[rec], accuracy=None, loss=None,
               shutdown_note="ps and workers never exit (Server.join()); killed by PID",
               wall_secs=round(time.time() - launched, 1))
    return run


def probe_comm_reduced(period: int) -> Optional[str]:
    """None if the trainer accepts --communication_period, else its one-line complaint.

    The launcher parses every trainer flag before anything starts (no TensorFlow import);
    --num_workers=0 then stops it with its own usage error if the flag was accepted.
    """
    proc = subprocess.run([sys.executable, "-m", "lowlevel.launch",
                           f"--communication_period={period}", "--num_workers=0"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=ROOT))
    text = (proc.stderr or "") + (proc.stdout or "")
    if "communication_period" in text:
        return next(line for line in text.splitlines() if "communication_period" in line)
    return None


def placement_balance(hidden: tuple) -> Optional[dict]:
    env = dict(os.environ, PYTHONPATH=ROOT)
    skip_keras(env)
    proc = subprocess.run([sys.executable, "-m", "benchmarks._placement",
                           f"--hidden_units={','.join(map(str, hidden))}", "--num_ps=2"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        print(f"placement: failed ({proc.stderr.strip()[-300:]})", flush=True)
        return None
