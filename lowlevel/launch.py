"""Runs a whole ps/worker cluster on this machine and supervises it.

    python -m lowlevel.launch                      # 1 ps + 2 workers, mlp on digits
    python -m lowlevel.launch --num_workers=3 --sync --train_steps=3000
    python -m lowlevel.launch --evaluator     # plus an evaluator (continuous_eval)

Each task is a `python -m lowlevel.trainer` process on a free loopback port,
by default inside a private network namespace with only loopback
(`lowlevel.isolation`; `--no_isolation` to opt out): no other host or process
can connect to a task's server, which would run any graph it is sent;
every trainer flag given here is passed on to every task. Output is prefixed
with the task's name (`[ps0]`, `[worker1]`); on a terminal one live progress
line shows the chief's global step, rate and loss.

The live line is fed by the chief's `progress` events
(`<output_dir>/events/worker0.jsonl`, `lowlevel.events`), not by its log.

Exit status: 0 when every task exited 0; 2 for a usage error (one line on
stderr). With `--max_restarts=N` a task that ends with a retryable status
(killed or stopped by a signal, or status 200: `lowlevel.exit_codes`) is
started again with the same flags, up to N times, and every restart is
reported. A task that exits 1-127 (a permanent failure or a usage error), or a
retryable one with its restarts used up, fails the run: the launcher names it,
stops the others and exits 1.
Ctrl-C (exit 130) or SIGTERM (exit 143) stops every task; each child also gets
SIGTERM should the launcher itself die, even by SIGKILL (Linux
`PR_SET_PDEATHSIG`, which the child sets itself: `lowlevel.lifetime`), so no
orphan is left behind.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from typing import Optional

import portpicker
from absl import app, flags

from lowlevel import events, exit_codes, isolation, lifetime
from lowlevel import trainer  # defines the trainer flags passed on
from lowlevel.config import UsageError, exit_status_main, flags_parser

FLAGS = flags.FLAGS
flags.DEFINE_integer("num_ps", 1, "Number of ps tasks.")
flags.DEFINE_integer("num_workers", 2, "Number of worker tasks (worker 0 is the chief).")
flags.DEFINE_boolean("evaluator", False, "Add an evaluator task: it evaluates each new "
                     "checkpoint on the test split (<output_dir>/eval/) and exits after the "
                     "final one.")
flags.DEFINE_integer("max_restarts", 0, "Restart a task that ends with a retryable status "
                     "(killed or stopped by a signal, or 200: a transient failure), with the "
                     "same flags, up to this many times per task (as Kubernetes' "
                     "restartPolicy: ExitCode would); 0: any task that fails fails the run. "
                     "Statuses 1-127 (permanent failure, usage error) are never restarted.")
flags.DEFINE_boolean("no_isolation", False, "Run the tasks on the machine's own network. "
                     "By default they run in a private network namespace with only loopback "
                     "(root, or a user namespace where the OS allows it), so no other host, "
                     "namespace or process outside the launcher can reach their servers "
                     "(which run any graph sent to them, with no authentication).")
flags.DEFINE_float("stop_timeout_secs", 5.0, "After asking a task to stop (SIGTERM), seconds "
                   "to wait before killing it.")

CHIEF = "worker0"  # the launcher's clusters have no chief job: worker 0 is the chief
# Seconds the ps tasks may outlive the chief's finished run before the launcher stops them.
PS_AFTER_CHIEF_SECS = 15.0
CLUSTER_FLAGS = ("ps_hosts", "worker_hosts", "job_name", "task_index", "schedule")
# With the live line on, the tasks' own progress lines are not relayed (the line
# shows the same figures, from the events). Cosmetic only: nothing is read from them.
PROGRESS_LINE_MARK = " examples/s | "


def trainer_args() -> list[str]:
    """The trainer flags set on this command line, serialised to pass on."""
    names = [f.name for f in FLAGS.get_key_flags_for_module(sys.modules["lowlevel.trainer"])]
    names.append("verbosity")
    for name in CLUSTER_FLAGS:
        if FLAGS[name].present:
            raise UsageError(f"--{name} is set by the launcher; use --num_ps/--num_workers")
    return [FLAGS[n].serialize() for n in names if FLAGS[n].present and n != "output_dir"]


def task_commands(num_ps: int, num_workers: int, output_dir: str, extra: list[str],
                  host: str = "127.0.0.1", evaluator: bool = False) -> dict[str, list[str]]:
    """{task name: argv} for a cluster on free ports of `host` (and an evaluator)."""
    ps = [f"{host}:{portpicker.pick_unused_port()}" for _ in range(num_ps)]
    workers = [f"{host}:{portpicker.pick_unused_port()}" for _ in range(num_workers)]
    common = [sys.executable, "-m", "lowlevel.trainer", f"--ps_hosts={','.join(ps)}",
              f"--worker_hosts={','.join(workers)}", f"--output_dir={output_dir}", *extra]
    tasks = {f"ps{i}": common + ["--job_name=ps", f"--task_index={i}"] for i in range(num_ps)}
    tasks.update({f"worker{i}": common + ["--job_name=worker", f"--task_index={i}"]
                  for i in range(num_workers)})
    if evaluator:
        tasks["evaluator0"] = common + ["--job_name=evaluator"]
    return tasks


def describe_exit(code: int) -> str:
    """"exited with status 1 (permanent failure)", "was killed by SIGKILL", ... for a Popen
    return code."""
    return exit_codes.describe(code)


FINISHED, RESTART, FAILED = exit_codes.FINISHED, exit_codes.RESTART, exit_codes.FAILED


class Supervisor:
    """Starts the tasks, relays their output, watches them end, restarts the ones that die.

    What happens to a task that ended is `exit_codes.decide`'s: *finished* on exit 0 (or
    any end once the chief, `worker0`, has finished: the run is over), a
    *restart* with the same command for a retryable status (a signal, 128 + N,
    200) while it has restarts left, else the run has *failed*.

    Attributes:
      procs: {task name: its current Popen}.
      restarts: {task name: restarts so far}.
      events: (time.time(), task name, what happened) for every start and end,
        for tools that measure recovery (benchmarks/chaos.py).
    """

    def __init__(self, commands: dict[str, list[str]], out=sys.stdout, max_restarts: int = 0):
        self.out = out
        self.commands = commands
        self.max_restarts = max_restarts
        self.lines: queue.Queue = queue.Queue()
        self.procs: dict[str, subprocess.Popen] = {}
        self.restarts = {name: 0 for name in commands}
        self.events: list[tuple[float, str, str]] = []
        self.stopping = False
        self.progress = None  # the live progress line, when supervise shows one
        self._open: set[int] = set()  # pids whose output is still being read
        self._env = lifetime.child_env(dict(os.environ, PYTHONUNBUFFERED="1"))
        for name in commands:
            self._start(name)

    def _start(self, name: str) -> None:
        proc = subprocess.Popen(self.commands[name], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=self._env, text=True, errors="replace")
        self.procs[name] = proc
        self._open.add(proc.pid)
        self.events.append((time.time(), name, "started"))
        threading.Thread(target=self._read, args=(name, proc), daemon=True).start()

    def _read(self, name, proc):
        for line in proc.stdout:
            self.lines.put((name, proc.pid, line.rstrip("\n")))
        self.lines.put((name, proc.pid, None))

    def note_line(self, pid: int, line: Optional[str]) -> None:
        """Records the end of a task's output (`line` None); its end is read only after it."""
        if line is None:
            self._open.discard(pid)

    def check(self, finished: set) -> Optional[str]:
        """Handles every task that has ended since the last call.

        Adds finished tasks to `finished`, restarts the ones that may be, and
        returns a message naming the first task that failed (None if none).
        """
        for name, proc in self.procs.items():
            code = proc.poll()
            if name in finished or code is None or proc.pid in self._open:
                continue  # running, or its last lines are still to be read
            what = "finished" if code == 0 else describe_exit(code)
            self.events.append((time.time(), name, what))
            decision = exit_codes.decide(code, self.restarts[name], self.max_restarts,
                                         CHIEF in finished, self.stopping)
            if decision == FINISHED:
                if code != 0 and CHIEF in finished and not self.stopping:
                    _write(f"launch: {name} {what} after the chief finished; not restarting "
                           "it", self.progress, self.out)
                finished.add(name)
                continue
            if decision == FAILED:
                if not exit_codes.is_retryable(code):
                    return f"{name} {what}; not restarting it"
                return f"{name} {what}" + (f" and has used its {self.max_restarts} "
                                           "restart(s)" if self.max_restarts else "")
            self.restarts[name] += 1
            _write(f"launch: {name} {what}; restarting it (restart {self.restarts[name]} of "
                   f"{self.max_restarts})", self.progress, self.out)
            self._start(name)
        return None

    def stop(self, timeout_secs: float) -> None:
        """SIGTERM the workers and the evaluator, then the ps tasks; SIGKILL what is left
        after `timeout_secs` in all.

        The ps tasks go last: a worker stopped at a safe point, and the chief's checkpoint
        at the stop, still need them (stopped at once, a worker's step fails with
        `UnavailableError` and the chief's save with it).
        """
        self.stopping = True
        deadline = time.monotonic() + timeout_secs
        last = [n for n in self.procs if n.startswith("ps")]
        for group in ([n for n in self.procs if n not in last], last):
            procs = [self.procs[n] for n in group]
            for proc in procs:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for proc in procs:
                try:
                    proc.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def supervise(sup: Supervisor, stop_timeout_secs: float, progress=None,
              output_dir: Optional[str] = None) -> int:
    """Relays output until every task has finished or one has failed; returns the exit status.

    With `progress` (a `Progress`), the chief's `progress` events in
    `output_dir` drive it.
    """
    sup.progress = progress
    follower = events.Follower(output_dir) if progress is not None and output_dir else None
    if follower is not None:
        follower.new()  # skip the events of earlier runs on this output_dir
    finished: set = set()
    failed = None
    ps_waiting_since = None
    while len(finished) < len(sup.procs):
        try:
            name, pid, line = sup.lines.get(timeout=0.2)
        except queue.Empty:
            name = pid = line = None
        if pid is not None:
            sup.note_line(pid, line)
        if follower is not None:
            for record in follower.new():
                if record["task"] == CHIEF and record["event"] == "progress":
                    progress.update(record)
        if line is not None and not (progress is not None and PROGRESS_LINE_MARK in line):
            _write(f"[{name}] {line}", progress, sup.out)
        if failed is None:
            failed = sup.check(finished)
            if failed:
                _write(f"launch: {failed}; stopping the other tasks", progress, sup.out)
                sup.stop(stop_timeout_secs)
        else:
            sup.check(finished)
        left = set(sup.procs) - finished
        if CHIEF in finished and left and all(n.startswith("ps") for n in left):
            # The run is over. A ps exits within a second of the chief's stop signal;
            # one restarted after the signal was sent never gets it.
            ps_waiting_since = ps_waiting_since or time.monotonic()
            if time.monotonic() - ps_waiting_since > PS_AFTER_CHIEF_SECS and not sup.stopping:
                _write(f"launch: the run is finished; stopping {', '.join(sorted(left))} "
                       "(restarted after the chief's stop signal?)", progress, sup.out)
                sup.stop(stop_timeout_secs)
    if progress is not None:
        progress.close(complete=not failed)
    return 1 if failed else 0


class Progress:
    """One live tqdm line: the chief's global step out of train_steps, rate and loss."""

    def __init__(self):
        from tqdm import tqdm
        self._bar = tqdm(total=1, unit="step", dynamic_ncols=True, leave=True,
                         bar_format="{l_bar}{bar}| step {n}/{total} [{elapsed}<{remaining}"
                                    "{postfix}]")

    def update(self, record: dict) -> None:
        """Shows a `progress` event (`lowlevel.events`)."""
        step, total = record["global_step"], record["train_steps"]
        self._bar.total = total
        self._bar.n = min(step, total)
        self._bar.set_postfix_str(f"{record['steps_per_sec']:.1f} steps/s, "
                                  f"{record['examples_per_sec']:,.0f} examples/s, "
                                  f"loss {record['loss']:.4f}", refresh=True)

    def write(self, text: str) -> None:
        self._bar.write(text)

    def close(self, complete: bool) -> None:
        if complete:
            self._bar.n = self._bar.total
            self._bar.refresh()
        self._bar.close()


def _write(text, progress, out):
    if progress is not None:
        progress.write(text)
    else:
        print(text, file=out, flush=True)


def main(argv) -> int:
    if len(argv) > 1:
        raise UsageError(f"unexpected argument {argv[1]!r} (flags are --name=value)")
    if FLAGS.num_ps < 1 or FLAGS.num_workers < 1:
        raise UsageError("--num_ps and --num_workers must be at least 1")
    if FLAGS.max_restarts < 0:
        raise UsageError(f"--max_restarts={FLAGS.max_restarts}: expected 0 or more")
    if os.environ.get("TF_CONFIG"):
        raise UsageError("TF_CONFIG is set: the launcher makes its own cluster; unset it "
                         "(or start the tasks yourself with python -m lowlevel.trainer)")
    extra = trainer_args()
    trainer.config_from_flags(FLAGS.num_workers)  # fail here, once, not in every task
    output_dir = FLAGS.output_dir or os.path.join(
        "runs", time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}")
    trainer.ensure_writable(output_dir)
    where = "on localhost"
    if not FLAGS.no_isolation:  # before any thread or port: the tasks inherit the namespace
        how, why = isolation.confine()
        if how is None:
            print(f"launch: warning: no private network namespace ({why}); the tasks' "
                  "servers listen on every interface of this machine with no authentication "
                  "(--no_isolation silences this)", flush=True)
        else:
            where = (f"on localhost in a {how}: loopback only, unreachable from outside "
                     "(--no_isolation to opt out)")
    commands = task_commands(FLAGS.num_ps, FLAGS.num_workers, os.path.abspath(output_dir),
                             extra, evaluator=FLAGS.evaluator)
    print(f"launch: {FLAGS.num_ps} ps + {FLAGS.num_workers} workers"
          f"{' + evaluator' if FLAGS.evaluator else ''} {where}; "
          f"output in {output_dir}", flush=True)
    started = time.monotonic()
    sup = Supervisor(commands, max_restarts=FLAGS.max_restarts)

    def on_signal(signum, frame):
        print(f"launch: {signal.Signals(signum).name}; stopping every task", flush=True)
        sup.stop(FLAGS.stop_timeout_secs)
        os._exit(128 + signum)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    progress = Progress() if sys.stdout.isatty() else None
    code = supervise(sup, FLAGS.stop_timeout_secs, progress, os.path.abspath(output_dir))
    elapsed = time.monotonic() - started
    restarted = ", ".join(f"{n} x{k}" for n, k in sup.restarts.items() if k)
    if code == 0:
        print(f"launch: all {len(commands)} tasks exited 0 after {elapsed:.1f} s"
              f"{f' (restarts: {restarted})' if restarted else ''}; metrics in "
              f"{os.path.join(output_dir, 'final_metrics.json')}", flush=True)
    return code


def run():
    """Console-script entry point."""
    app.run(exit_status_main("lowlevel.launch", main),
            flags_parser=flags_parser("lowlevel.launch"))


if __name__ == "__main__":
    run()
