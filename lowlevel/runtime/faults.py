"""Network faults end in a word, not a hang: one outage clock per task, a bound on every wait.

A peer that stops answering without closing its connections (a ps frozen with
SIGSTOP, a host cut off by a partition that drops frames, a stalled VM) gives
a TensorFlow run nothing to fail on: the classic trainer blocks in
`session.run` forever, and says nothing (issue 12). `RunOptions(timeout_in_ms)`
makes such a run raise `DeadlineExceededError` and leaves the session usable:
after SIGCONT or the heal the same session runs again at once (measured on
TensorFlow 2.21, /work/shared/notes "Across hosts").

`FaultWatch.run` wraps one run of the training loop (a step, a claim, an
exchange): it passes the per-step deadline (`--step_timeout_secs`); on expiry
it probes the peers the task depends on (`probes.answers`: the ps tasks, the
chief, in sync mode the other workers), logs which do not answer ("name at
host:port"), emits `fault_noticed`, and runs again. The first run that
completes ends the outage (`fault_cleared`, with its length).

A run can also leave through an error: gRPC's keepalive (`cluster.channels.GRPC_KEEPALIVE`)
closes a channel to a peer that stopped answering, the run fails with
`UnavailableError`, and `MonitoredSession` closes the session and asks its
creator for a new one (`sessions`). That path has waits TensorFlow gives no
deadline: a new session's first run creates the master session, whose device
scan waits for every ps's `GetStatus` with no timeout (`DeviceFinder::Wait`,
"CreateSession still waiting for response from worker", every 10 s, forever
against a frozen ps: `LocalMaster::CreateSession` keeps waiting after its own
deadline, "we must still wait for the call to complete"); so does
`LocalMaster::CloseSession`. So every path counts against one `Outage` clock,
the task's: the deadline, a lost session, its close, the new session's
creation (run in a thread the task can abandon, `abandonable`), the probes. It
starts with the run that first failed or timed out, and once it has run
`--fault_timeout_secs` the task raises `NetworkFault` (exit status 200,
retryable) naming the tasks that do not answer, whatever call it is in: where
the main thread cannot raise (stuck in a call with no deadline), `watchdog`
ends the process with the same status and line.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from typing import Callable, Optional, Sequence

import tensorflow as tf
from absl import logging

from lowlevel import events
from lowlevel.cluster import probes
from lowlevel.errors import TRANSIENT, NetworkFault

v1 = tf.compat.v1

PROBE_TIMEOUT_SECS = 1.0  # how long one probe round waits for the peers' answers
# How far past `--fault_timeout_secs` the watchdog lets a main thread stuck in a call
# with no deadline run before it ends the process: the main thread normally raises
# `NetworkFault` itself within a poll (0.2 s) of the limit, and its way out (closing
# the lost session: `sessions.CLOSE_TIMEOUT_SECS` and the coordinator's grace) takes
# up to ~5 s.
WATCHDOG_GRACE_SECS = 10.0
GUARD_POLL_SECS = 0.2  # how often `abandonable` checks its guard
# The shortest time between two runs of `FaultWatch.run` that failed with a lost connection
# (a dead peer refuses at once): seconds.
RETRY_PAUSE_SECS = 1.0
REPORT_EVERY_SECS = 10.0  # the longest `FaultWatch.failed` stays silent in an outage


class Outage:
    """The one clock of a task's outage: every path out of a failed run counts against it.

    An outage begins with the run that first timed out (its start: a frozen
    peer stopped it then); or, when a lost session must be replaced, when the
    training loop's last run completed (the loss may surface between runs, in
    `MonitoredSession.should_stop`, or in the next run: the peer stopped
    answering after that completion, not when the next run began), else at the
    start of the run under way; it ends when a run completes (`end`). Every
    wait on the way (the deadline's retries, the close of the lost session,
    the wait for the ps tasks, the new session's creation) calls `check`,
    which raises `NetworkFault` once the outage has lasted `fault_timeout_secs`,
    plus the restore allowance of an outage spent waiting for the chief's
    restore (`allow_restore`). Thread-safe.

    Args:
      task_name: this task ("worker1"), for the messages.
      peers: [(name, "host:port")] of the tasks this one's runs depend on.
      fault_timeout_secs: the longest outage, seconds.
      clock: seconds, monotonic (tests pass their own).

    Attributes:
      run_started: when the training run under way started (`FaultWatch.run`
        sets it), or None between runs.
      run_timeout_secs: that run's deadline, seconds (None between runs).
      last_completed: when the training loop's last run completed (`end`), or
        None outside the loop (`FaultWatch.stopped`).
    """

    def __init__(self, task_name: str, peers: Sequence[tuple[str, str]],
                 fault_timeout_secs: float, clock: Callable[[], float] = time.monotonic):
        self.task_name = task_name
        self.peers = list(peers)
        self.fault_timeout_secs = fault_timeout_secs
        self.run_started: Optional[float] = None
        self.run_timeout_secs: Optional[float] = None
        self.last_completed: Optional[float] = None
        self._clock = clock
        self._lock = threading.Lock()
        self._since: Optional[float] = None
        self._allowance = 0.0  # seconds past fault_timeout_secs for this outage
        self._what = "step"

    @property
    def since(self) -> Optional[float]:
        """When the outage under way began (clock seconds), or None."""
        return self._since

    def begin(self, at: Optional[float] = None, what: Optional[str] = None) -> None:
        """Starts the outage clock unless it runs already: at `at`, else when the loop's last
        run completed, else at the start of the run under way, else now. `what` names what
        cannot complete ("step", "exchange")."""
        with self._lock:
            if self._since is None:
                self._since = next(t for t in (at, self.last_completed, self.run_started,
                                               self._clock()) if t is not None)
            if what:
                self._what = what

    @contextlib.contextmanager
    def extended(self, secs: float):
        """Within: the run in flight may go on `secs` from now (a checkpoint save inside a
        step's run, with its own deadline) before `overdue_since` counts it."""
        before, started = self.run_timeout_secs, self.run_started
        if started is not None:
            self.run_timeout_secs = max(before or 0.0, self._clock() - started + secs)
        try:
            yield
        finally:
            if started is not None and self.run_started == started:
                self.run_timeout_secs = before

    @property
    def limit_secs(self) -> float:
        """The longest the outage under way may last: `fault_timeout_secs`, plus its
        `allow_restore` allowance, seconds."""
        return self.fault_timeout_secs + self._allowance

    def allow_restore(self, restore_secs: float) -> bool:
        """Past the limit with every peer answering: lets this outage last `restore_secs`
        longer, once (`end` takes it back); returns whether it did.

        A session that replaces a lost one waits for the model: the chief restores the
        checkpoint into the ps tasks first, and with every peer answering that is what
        the wait is for (not a fault). The caller passes the bytes' part of the
        restore's own deadline (`checkpoints.StateSaver`: 1 s per 20 MB; 680 s at
        13.6 GB, under 1 s for a model below 20 MB, which gets none): at 100 M rows
        the restore alone took ~75 s, and the 90 s default limit ended the workers
        88 s into it (benchmarks/NOTES.md, 2026-11-26).
        """
        with self._lock:
            if self._since is None or self._allowance or restore_secs < 1.0:
                return False
        if self.not_answering():
            return False
        with self._lock:
            self._allowance = restore_secs
        logging.warning("%s: no session after %.0f s (--fault_timeout_secs=%g) but every peer "
                        "answers: waiting for the chief's restore, up to %.0f s more (1 s per "
                        "20 MB of state)", self.task_name, self.waited(),
                        self.fault_timeout_secs, restore_secs)
        return True

    def waited(self) -> float:
        """Seconds the outage under way has lasted (0 without one)."""
        since = self._since
        return 0.0 if since is None else self._clock() - since

    def remaining(self) -> float:
        """Seconds left before the outage under way ends the task (inf without one)."""
        since = self._since
        return float("inf") if since is None else since + self.limit_secs - self._clock()

    def overdue_since(self, grace_secs: float) -> Optional[float]:
        """The start of the outage under way; or, without one, the deadline of a run still
        in flight `grace_secs` past it (TensorFlow did not return at the deadline: seen after
        a ps restart, a step cancelled at 60 s that returned 60 s later, "RunStep still
        blocked after 60 seconds"); else None. From the deadline, not the run's start: a
        monitored run's hooks (a checkpoint save in `after_run`) may legitimately outlast it."""
        since, started, timeout = self._since, self.run_started, self.run_timeout_secs
        if since is not None:
            return since
        if started is not None and timeout is not None and \
                self._clock() - started > timeout + grace_secs:
            return started + timeout
        return None

    def check(self, what: Optional[str] = None) -> None:
        """Raises `NetworkFault` if the outage under way has lasted `fault_timeout_secs`."""
        if self._since is not None and self.remaining() <= 0:
            raise self.give_up(what)

    def end(self) -> Optional[float]:
        """A run completed: ends the outage; returns its length (None if there was none)."""
        with self._lock:
            since, self._since, self._allowance = self._since, None, 0.0
            self.last_completed = self._clock()
        return None if since is None else self.last_completed - since

    def not_answering(self) -> list[str]:
        """"name at host:port" of each peer that does not answer now (`probes.answering`)."""
        answering = probes.answering([a for _, a in self.peers], PROBE_TIMEOUT_SECS)
        return [f"{name} at {address}" for name, address in self.peers
                if not answering[address]]

    def who(self, silent: Optional[list[str]] = None) -> str:
        """The words naming the peers that do not answer (probed now unless given)."""
        silent = self.not_answering() if silent is None else silent
        return (f"not answering: {', '.join(silent)}" if silent else
                "every peer answers its probe (overloaded, or waiting on a worker?)")

    def give_up(self, what: Optional[str] = None,
                silent: Optional[list[str]] = None) -> NetworkFault:
        """The `NetworkFault` that ends the task, logged and recorded (`fault_noticed`)."""
        what = what or self._what
        waited = self.waited()
        silent = self.not_answering() if silent is None else silent
        who = self.who(silent)
        events.emit("fault_noticed", None, error=f"no {what} completed for {waited:.0f} s; "
                    "giving up", missing=silent, waited_secs=round(waited, 3))
        allowed = f", +{self._allowance:.0f} s for a restore" if self._allowance else ""
        logging.error("%s: no %s completed for %.0f s (--fault_timeout_secs=%g%s); %s; "
                      "giving up", self.task_name, what, waited, self.fault_timeout_secs,
                      allowed, who)
        return NetworkFault(
            f"{self.task_name}: no {what} completed for {waited:.0f} s "
            f"(--fault_timeout_secs={self.fault_timeout_secs:g}{allowed}); {who}: a network "
            "partition, a frozen or dead host? Restart this task once they are back")

    def watchdog(self, poll_secs: float = 0.5,
                 grace_secs: Optional[float] = None) -> threading.Thread:
        """Starts a daemon thread that ends the process with status 200 (`NetworkFault`'s
        line on stderr, as the trainer writes it) if an outage lasts `grace_secs`
        (`WATCHDOG_GRACE_SECS`) past `fault_timeout_secs`: the main thread is then stuck in
        a call TensorFlow gives no deadline (a close, a hook's run past the limit). A run
        still in flight `grace_secs` past its own deadline counts as an outage begun at that
        deadline (`overdue_since`)."""
        grace = WATCHDOG_GRACE_SECS if grace_secs is None else grace_secs

        def watch():
            while True:
                time.sleep(poll_secs)
                since = self.overdue_since(grace)
                if since is None or since + self.limit_secs - self._clock() > -grace:
                    continue
                self.begin(since)
                fault = self.give_up()
                logging.error("%s: the main thread is stuck in a call with no deadline %.0f s "
                              "past the limit; exiting", self.task_name, grace)
                sys.stderr.write(f"lowlevel.trainer: error: {fault} (exit status {TRANSIENT}"
                                 "; retryable: restart this task)\n")
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(TRANSIENT)

        thread = threading.Thread(target=watch, name="outage_watchdog", daemon=True)
        thread.start()
        return thread


class FaultWatch:
    """Per-run deadline, fault reports and the bounded wait of one training task.

    Args:
      task_name: this task ("worker1"), for the messages.
      peers: [(name, "host:port")] of the tasks this one's runs depend on.
      step_timeout_secs: the deadline of one run, seconds.
      fault_timeout_secs: the longest outage, seconds, before `NetworkFault`.
      clock: seconds, monotonic (tests pass their own).
      outage: the task's `Outage` clock, shared with its session creators
        (default: a new one).

    Attributes:
      options: the `RunOptions` of a run outside an outage (the deadline).
      outage: the task's `Outage`.
    """

    def __init__(self, task_name: str, peers: Sequence[tuple[str, str]],
                 step_timeout_secs: float, fault_timeout_secs: float,
                 clock: Callable[[], float] = time.monotonic, outage: Optional[Outage] = None):
        self.task_name = task_name
        self.peers = list(peers)
        self.step_timeout_secs = step_timeout_secs
        self.fault_timeout_secs = fault_timeout_secs
        self.options = v1.RunOptions(timeout_in_ms=max(1, int(step_timeout_secs * 1000)))
        self.outage = outage or Outage(task_name, peers, fault_timeout_secs, clock)
        self._clock = clock
        self._reported: Optional[tuple] = None  # (outage start, when) of `failed`'s last line
        self.retries = 0  # runs timed out or failed so far (`timed_out`, `failed`)

    def run(self, fn: Callable, what: str = "step", global_step: Optional[int] = None,
            lost: tuple = (), lost_in_outage: tuple = ()):
        """Returns `fn(options)`, run again after each deadline until it completes.

        During an outage a run's deadline is what is left of it, if less than
        `step_timeout_secs`: the task gives up at the limit, not a deadline later. A run
        that fails with one of the `lost` error types (`tf.errors.UnavailableError`: gRPC's
        keepalive closed the channel to a peer that stopped answering) is reported and run
        again likewise, at most every `RETRY_PAUSE_SECS` (the session must stay usable
        after it: a plain session does, `MonitoredSession` makes a new one instead). The
        `lost_in_outage` error types count as lost only while an outage is under way
        (`tf.errors.OutOfRangeError`: an input iterator whose read the deadline cancelled
        then reports its end; outside an outage it is the input's real end).

        Raises:
          NetworkFault: the outage lasted `fault_timeout_secs`.
          Whatever else `fn` raises.
        """
        while True:
            self.outage.check(what)
            options = self._options()
            started = self.outage.run_started = self._clock()
            self.outage.run_timeout_secs = options.timeout_in_ms / 1000.0
            try:
                value = fn(options)
            except tf.errors.DeadlineExceededError as e:
                self.timed_out(what, e, global_step)
                continue
            except lost + lost_in_outage as e:
                if not isinstance(e, lost) and self.outage.since is None:
                    raise
                self.failed(what, e, global_step)
                time.sleep(max(0.0, min(started + RETRY_PAUSE_SECS - self._clock(),
                                        self.outage.remaining())))
                continue
            finally:
                self.outage.run_started = self.outage.run_timeout_secs = None
            self.answered(global_step)
            return value

    def _options(self):
        left = self.outage.remaining()
        if left >= self.step_timeout_secs:
            return self.options
        return v1.RunOptions(timeout_in_ms=max(100, int(left * 1000)))

    def not_answering(self) -> list[str]:
        """"name at host:port" of each peer that does not answer now (`probes.answering`)."""
        return self.outage.not_answering()

    def stopped(self) -> None:
        """The training loop is over: a session lost later (in the final save or evaluation)
        begins its outage when it is noticed, not at the loop's last run."""
        self.outage.last_completed = None

    def timed_out(self, what: str, error: BaseException, global_step: Optional[int]) -> None:
        """Reports a run that hit its deadline; raises NetworkFault past the limit."""
        self.retries += 1
        # The outage began when the run did (it waited that long).
        started = self.outage.run_started
        self.outage.begin(started if started is not None
                          else self._clock() - self.step_timeout_secs, what)
        waited = self.outage.waited()
        silent = self.not_answering()
        message = getattr(error, "message", None) or str(error)
        if self.outage.remaining() <= 0:
            raise self.outage.give_up(what, silent)
        events.emit("fault_noticed", global_step, error=f"{what} timed out: {message}",
                    missing=silent, waited_secs=round(waited, 3))
        logging.warning("%s: %s did not complete within %g s (--step_timeout_secs); %s; "
                        "retrying (giving up after %g s, --fault_timeout_secs)",
                        self.task_name, what, self.step_timeout_secs, self.outage.who(silent),
                        self.fault_timeout_secs)

    def failed(self, what: str, error: BaseException, global_step: Optional[int]) -> None:
        """Reports a run that failed with a lost connection (its outage begun when the last
        run completed), in a line at most every `REPORT_EVERY_SECS`; raises NetworkFault
        past the limit."""
        self.retries += 1
        self.outage.begin(None, what)
        silent = self.not_answering()
        message = ((getattr(error, "message", None) or str(error)).strip().splitlines()
                   or [""])[0]
        if self.outage.remaining() <= 0:
            raise self.outage.give_up(what, silent)
        now, since = self._clock(), self.outage.since
        if self._reported is not None and self._reported[0] == since and \
                now - self._reported[1] < REPORT_EVERY_SECS:
            return  # a dead peer refuses at once: one line per REPORT_EVERY_SECS
        self._reported = (since, now)
        events.emit("fault_noticed", global_step, error=f"{what} failed: {message}",
                    missing=silent, waited_secs=round(self.outage.waited(), 3))
        logging.warning("%s: %s failed (%s: %s); %s; retrying (giving up after %g s, "
                        "--fault_timeout_secs)", self.task_name, what, type(error).__name__,
                        message, self.outage.who(silent),
                        self.fault_timeout_secs)

    def answered(self, global_step: Optional[int] = None) -> None:
        """A run completed: ends the outage under way, if any."""
        outage = self.outage.end()
        if outage is None:
            return
        logging.info("%s: the cluster answers again after %.0f s; training goes on",
                     self.task_name, outage)
        events.emit("fault_cleared", global_step, outage_secs=round(outage, 3))


def abandonable(make: Callable, guard: Optional[Callable[[], None]] = None,
                name: str = "abandonable"):
    """Returns `make()`, run in a daemon thread while this one calls `guard()` every
    `GUARD_POLL_SECS`; whatever `guard` raises ends the wait (and is raised here), the
    thread left running: for calls TensorFlow gives no deadline and no way to cancel (a
    session's creation against a frozen ps, a read from storage that hangs), made by a task
    that is about to exit. The thread makes its call in this thread's default graph.
    Without `guard`, `make()` runs here.

    The call must let go of Python's GIL while it blocks, or no thread runs, this
    one included: TensorFlow's session calls (create, run, close) and `tf.io.gfile`
    do; its `CheckpointReader` does not (measured: blocked opening a FIFO, it
    stopped every thread).
    """
    if guard is None:
        return make()
    graph = v1.get_default_graph()  # thread-local: the new thread's would be the global one
    done: dict = {}

    def target():
        try:
            with graph.as_default():
                done["value"] = make()
        except BaseException as e:  # noqa: BLE001 - raised in the caller's thread
            done["error"] = e

    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    while True:
        thread.join(GUARD_POLL_SECS)
        if not thread.is_alive():
            break
        guard()
    if "error" in done:
        raise done["error"]
    return done["value"]


def peers_of(cluster, task, sync: bool) -> list[tuple[str, str]]:
    """[(name, "host:port")] of the tasks `task`'s training runs wait on.

    The ps tasks; a non-chief worker also the chief (it owns the model and, in
    sync mode, the step); in sync mode every other training task (a step
    waits for their gradients).
    """
    peers = [(f"ps{k}", a) for k, a in enumerate(cluster.ps_hosts) if a]
    for t in cluster.training_tasks():
        if t.name == task.name or not (sync or t.is_chief):
            continue
        address = cluster.hosts(t.job_name)[t.task_index]
        if address:  # a sparseCluster gives a worker no other worker's address
            peers.append((t.name, address))
    return peers
