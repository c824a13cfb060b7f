"""The launcher's supervisor: starts the tasks, relays their output, restarts or stops them.

`Supervisor` holds the tasks (`subprocess.Popen`, or `forking.ForkedTask` when forked
from the launcher) and reads their output with a selector, from one thread;
`supervise` is the loop that runs until every task has finished or one has failed,
with what happens to an ended task decided by `errors.decide`. `Progress` is the
live tqdm line fed by the chief's `progress` events. The flags and the cluster's
commands are `lowlevel.launch`'s.
"""

from __future__ import annotations

import collections
import os
import selectors
import signal
import subprocess
import sys
import time
from typing import Optional

from lowlevel import errors, events
from lowlevel.ops import forking, lifetime
from lowlevel.ops.task_cgroups import CHIEF  # worker 0: the launcher's clusters have no chief job
# Seconds the ps tasks may outlive the chief's finished run before the launcher stops them.
PS_AFTER_CHIEF_SECS = 15.0
# With the live line on, the tasks' own progress lines are not relayed (the line
# shows the same figures, from the events). Cosmetic only: nothing is read from them.
PROGRESS_LINE_MARK = " examples/s | "


def describe_exit(code: int) -> str:
    """"exited with status 1 (permanent failure)", "was killed by SIGKILL", ... for a Popen
    return code."""
    return errors.describe(code)


FINISHED, RESTART, FAILED = errors.FINISHED, errors.RESTART, errors.FAILED


class Supervisor:
    """Starts the tasks, relays their output, watches them end, restarts the ones that die.

    What happens to a task that ended is `errors.decide`'s: *finished* on exit 0 (or
    any end once the chief, `worker0`, has finished: the run is over), a
    *restart* with the same command for a retryable status (a signal, 128 + N,
    200) while it has restarts left, else the run has *failed*.

    Attributes:
      procs: {task name: its current `subprocess.Popen` or `forking.ForkedTask`}.
      restarts: {task name: restarts so far}.
      events: (time.time(), task name, what happened) for every start and end,
        for tools that measure recovery (benchmarks/chaos.py).
      memory: the tasks' memory cgroups (`memory_limits.TaskCgroups`, `--memory`), or
        None: each task is put in its own as it starts, and an end its limit caused says so.
      cpu: the tasks' CPU cgroups (`cpu_limits.TaskCgroups`, `--cpu`), or None: each
        task is put in its own as it starts.
      envs: {task name: variables added to that task's environment} (a script's
        `TF_CONFIG`: `lowlevel.launch --script_cluster=tf_config`; every task's with
        `--dynamic_workers`), at every start.
      retiring: tasks asked to leave the job (`retire`: `lowlevel.ops.resize`).
    """

    def __init__(self, commands: dict[str, list[str]], out=sys.stdout, max_restarts: int = 0,
                 fork: bool = False, memory=None, envs: Optional[dict[str, dict]] = None,
                 cpu=None):
        self.out = out
        self.envs = envs or {}
        self.memory = memory  # a `memory_limits.TaskCgroups`, or None
        self.cpu = cpu  # a `cpu_limits.TaskCgroups`, or None
        self.commands = commands
        self.max_restarts = max_restarts
        self.fork = fork
        self.procs: dict = {}
        self.restarts = {name: 0 for name in commands}
        self.events: list[tuple[float, str, str]] = []
        self.stopping = False
        self.retiring: set[str] = set()  # tasks asked to leave the job (`retire`)
        self.progress = None  # the live progress line, when supervise shows one
        self._open: set[int] = set()  # pids whose output is still being read
        self._env = lifetime.child_env(dict(os.environ, PYTHONUNBUFFERED="1"))
        # The tasks' output is read here, with no thread: a fork from a process with
        # threads can deadlock (lowlevel.ops.forking).
        self._selector = selectors.DefaultSelector()
        self._lines: collections.deque = collections.deque()
        for name in commands:
            self._start(name)

    def _start(self, name: str) -> None:
        """Starts the task `name`: forked (`lowlevel.ops.forking`) or as its own command."""
        read_fd, write_fd = os.pipe()
        # A forked task waits for its cgroups (`forking.start`'s gate): it would otherwise
        # size its thread pools before it is in its CPU cgroup (seen: "2 CPUs (cores)")
        gate_r, gate_w = os.pipe() if self.fork else (None, None)
        env = dict(self._env, **self.envs.get(name, {}))
        try:
            if self.fork:
                others = [key.fd for key in self._selector.get_map().values()]
                proc = forking.start(self.commands[name], env, write_fd,
                                     others + [read_fd, self._selector.fileno(), gate_w],
                                     gate=gate_r)
            else:
                proc = subprocess.Popen(self.commands[name], stdout=write_fd, stderr=write_fd,
                                        stdin=subprocess.DEVNULL, env=env)
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            for fd in (write_fd, gate_r):
                if fd is not None:
                    os.close(fd)
        self.procs[name] = proc
        try:
            for cgroups in (self.memory, self.cpu):
                if cgroups is not None:
                    cgroups.add(name, proc.pid)
            if gate_w is not None:
                os.write(gate_w, forking.RELEASE)
        finally:
            if gate_w is not None:
                os.close(gate_w)  # not released: the task exits (`forking.start`)
        self._open.add(proc.pid)
        self.events.append((time.time(), name, "started"))
        self._selector.register(read_fd, selectors.EVENT_READ, (name, proc.pid, bytearray()))

    def add(self, name: str, command: list[str], env: Optional[dict] = None) -> None:
        """Starts a new task `name` (a worker joining a `--dynamic_workers` job, or one of
        that name that left, anew: its restarts start from 0)."""
        self.commands[name], self.envs[name] = command, env or {}
        self.restarts[name] = 0
        for cgroups in (self.memory, self.cpu):
            if cgroups is not None:
                cgroups.inherit(name)  # its role's limits (--memory, --cpu)
        self.retiring.discard(name)
        self._start(name)

    def retire(self, name: str) -> None:
        """Asks task `name` to leave the job (SIGTERM: it stops at a safe point); its end,
        whatever its status, is then *finished*, never a restart or a failure."""
        self.retiring.add(name)
        proc = self.procs[name]
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)

    def next_line(self, timeout: float) -> Optional[tuple]:
        """(task name, pid, line) of the next line a task wrote, line None at the end of
        its output; None if nothing came within `timeout` seconds."""
        if not self._lines:
            for key, _ in self._selector.select(timeout):
                name, pid, pending = key.data
                chunk = os.read(key.fd, 1 << 16)
                if chunk:
                    pending += chunk
                    *lines, rest = pending.split(b"\n")
                    pending[:] = rest
                else:
                    lines = [bytes(pending)] if pending else []
                self._lines.extend((name, pid, line.decode(errors="replace")) for line in lines)
                if not chunk:
                    self._selector.unregister(key.fd)
                    os.close(key.fd)
                    self._lines.append((name, pid, None))
        return self._lines.popleft() if self._lines else None

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
            if code != 0 and self.memory is not None:
                what += self.memory.ended(name)
            self.events.append((time.time(), name, what))
            if name in self.retiring:
                _write(f"launch: {name} left the job: {what}", self.progress, self.out)
                finished.add(name)
                continue
            decision = errors.decide(code, self.restarts[name], self.max_restarts,
                                         CHIEF in finished, self.stopping)
            if decision == FINISHED:
                if code != 0 and CHIEF in finished and not self.stopping:
                    _write(f"launch: {name} {what} after the chief finished; not restarting "
                           "it", self.progress, self.out)
                finished.add(name)
                continue
            if decision == FAILED:
                if not errors.is_retryable(code):
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
              output_dir: Optional[str] = None, after_chief: tuple = ("ps",),
              resizer=None) -> int:
    """Relays output until every task has finished or one has failed; returns the exit status.

    With `progress` (a `Progress`), the chief's `progress` events in
    `output_dir` drive it. Once the chief has finished, tasks whose names start with one
    of `after_chief` and are all that is left are stopped after `PS_AFTER_CHIEF_SECS`
    (the ps tasks; a script's workers too: one restarted after the chief's end would
    wait for the ps tasks that are gone). `resizer` (`resize.Resizer`, with
    `--dynamic_workers`) adds and retires workers between lines.
    """
    sup.progress = progress
    follower = events.Follower(output_dir) if progress is not None and output_dir else None
    if follower is not None:
        follower.new()  # skip the events of earlier runs on this output_dir
    finished: set = set()
    failed = None
    ps_waiting_since = None
    while len(finished) < len(sup.procs):
        name, pid, line = sup.next_line(0.2) or (None, None, None)
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
        if resizer is not None and failed is None:
            resizer.apply(sup, finished, CHIEF)
        left = set(sup.procs) - finished
        if CHIEF in finished and left and all(n.startswith(after_chief) for n in left):
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
        tqdm.monitor_interval = 0  # no monitor thread: the launcher forks (lowlevel.ops.forking)
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
    """Relays `text` (a task's line or the launcher's) to `out`, or above the progress line.

    A closed output (its reader gone: `| head`, a `tee` or ssh session that died) ends the
    relaying, not the run (`output_closed`). Before, the `BrokenPipeError` ended the
    launcher's main thread with its tasks still running, and a SIGTERM then stopped none.
    """
    try:
        if progress is not None:
            progress.write(text)
        else:
            print(text, file=out, flush=True)
    except BrokenPipeError:
        output_closed(sys.stderr if progress is not None else out)


def output_closed(out) -> None:
    """Points `out`'s file descriptor at /dev/null after its reader went away (later writes,
    the interpreter's last flush included, then succeed), and says so on stderr if it can."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, out.fileno())
    finally:
        os.close(devnull)
    try:
        print("launch: the output's reader is gone (a closed pipe); the tasks go on, their "
              "lines are no longer shown", file=sys.stderr, flush=True)
    except OSError:
        pass
