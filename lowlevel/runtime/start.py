"""The start of a communication-reduced async run: every worker takes its first step together.

In the communication-reduced mode (`lowlevel.modes.local_sgd`) each worker's optimizer
state (Adagrad's accumulators, Adam's moments) is its own and starts fresh. A
worker whose session is ready after the chief has trained for a while joins a
trained model with that fresh state, and takes steps far larger than the
chief's (fresh Adagrad: ~10x after 1,000 steps), which can throw the shared
model off. Without a barrier that is what a fresh run did now and then: a
non-chief worker polls for the chief's model every 0.5 s
(`sessions.WorkerSessionCreator`), and meanwhile the chief, alone, ran 240 to
1,000 of the digits MLP's 2,000 steps (1 ps + 2 workers, K = 16: about 1 run
in 22 ended below 0.93 test accuracy against 0.96-0.98; benchmarks/NOTES.md,
2026-11-24). The exact mode keeps its optimizer state on the ps, shared, so a
late worker there is harmless and this module is not used.

The protocol, on a fresh run only (global step 0 when the session is ready):

1. Each non-chief worker, once its session is ready, enqueues its replica
   index on ps 0's `lowlevel/workers_ready` queue, then waits (polling every
   `WORKER_POLL_SECS`) until the global step moves: the chief's first claim.
2. The chief, once its session is ready, takes the reports (`shutdown.ReportQueue`,
   which never loses one to a deadline) until every other worker has reported
   or `wait_secs` (`--start_wait_secs`) have passed; the
   workers still missing are logged (they will join late) and named in the
   `start_barrier` event.
3. The chief starts training; its first claim moves the global step, and
   every waiting worker starts within a poll.

A run resumed from a checkpoint, or a session recreated after a fault at a
global step above 0, skips the barrier: training is under way, and a worker
restarted then loads the optimizer state of the last checkpoint
(`lowlevel.modes.optimizer_state`). A worker that waits longer than `wait_secs` +
`WORKER_GRACE_SECS` (the chief died meanwhile) starts anyway; the fault
handling of its first run takes over from there.
"""

from __future__ import annotations

import threading
import time
from typing import Optional

import tensorflow as tf
from absl import logging

from lowlevel import events
from lowlevel.errors import peer_unreachable
from lowlevel.runtime import shutdown

v1 = tf.compat.v1

# A waiting worker reads the global step this often: its start lags the chief's
# by about this, ~20 of the MLP's local steps, about one block.
WORKER_POLL_SECS = 0.01
# How much longer than the chief a worker waits before it starts on its own.
WORKER_GRACE_SECS = 5.0


class StartBarrier:
    """The ready queue on ps 0 and the global step read, built into the current graph.

    Args:
      global_step: the int64 global step variable.
      ps0_device: ps 0's CPU device string, where the queue lives (shared by name).
    """

    def __init__(self, global_step, ps0_device: str):
        self._ready = shutdown.ReportQueue("lowlevel/workers_ready", ps0_device)
        self._step = global_step.read_value()

    def step(self, sess) -> int:
        return int(sess.run(self._step))

    def report_ready(self, sess, replica_index: int) -> None:
        """A non-chief worker: tells the chief its session is ready."""
        self._ready.report(sess, replica_index)

    def wait_for_reports(self, sess, workers: dict[int, str], timeout_secs: float,
                         stop: threading.Event) -> dict[int, str]:
        """The chief: waits for each of `workers` ({replica index: name}) to report.

        Returns the workers that did not report within `timeout_secs` seconds
        (or before `stop` was set), as `workers` names them. A ps 0 that does not
        answer ends the wait (logged): training's fault handling takes over.
        """
        missing = dict(workers)
        deadline = time.monotonic() + timeout_secs
        while missing and not stop.is_set() and time.monotonic() < deadline:
            try:
                for index in self._ready.take(sess, deadline - time.monotonic(), stop):
                    missing.pop(index, None)
            except Exception as e:  # noqa: BLE001 - narrowed by `peer_unreachable`
                if not peer_unreachable(e):
                    raise
                logging.warning("chief: cannot read the workers' ready reports on ps0 (%s); "
                                "starting without them", type(e).__name__)
                break
        return missing

    def wait_for_start(self, sess, timeout_secs: float, stop: threading.Event) -> bool:
        """A non-chief worker: waits until the global step moves; False if it never did."""
        deadline = time.monotonic() + timeout_secs
        while not stop.is_set() and time.monotonic() < deadline:
            if self.step(sess) > 0:
                return True
            time.sleep(WORKER_POLL_SECS)
        return False


class StartTogetherHook(v1.train.SessionRunHook):
    """Protocol steps 1 and 2, in `after_create_session` (before the task's first run).

    Args:
      barrier: the `StartBarrier` in the graph.
      replica_index: this task's replica index (0: the chief).
      workers: the chief: {replica index: name} of the other workers, a name as
        the logs give it ("worker1 at 127.0.0.1:2224").
      wait_secs: the chief's longest wait, seconds (`--start_wait_secs`).
      preempted: set when the task is being preempted: ends a wait early.
    """

    def __init__(self, barrier: StartBarrier, replica_index: int, workers: dict[int, str],
                 wait_secs: float, preempted: Optional[threading.Event] = None):
        self._barrier, self._replica_index = barrier, replica_index
        self._waiting_for = dict(workers)  # across sessions: a report is dequeued once
        self._wait_secs = wait_secs
        self._preempted = preempted or threading.Event()
        self._reported = False

    def after_create_session(self, session, coord):
        if self._barrier.step(session) > 0:
            return
        if self._replica_index == 0:
            self._chief_waits(session)
            return
        if not self._reported:
            try:
                self._barrier.report_ready(session, self._replica_index)
                self._reported = True
            except Exception as e:  # noqa: BLE001 - narrowed by `peer_unreachable`
                if not peer_unreachable(e):
                    raise
                logging.warning("could not tell the chief this worker is ready: %s", e.message)
        started = time.monotonic()
        if not self._barrier.wait_for_start(session, self._wait_secs + WORKER_GRACE_SECS,
                                            self._preempted):
            if not self._preempted.is_set():
                logging.warning("the chief has not started training %.0f s after this worker "
                                "was ready; starting anyway", time.monotonic() - started)

    def _chief_waits(self, session) -> None:
        if not self._waiting_for:
            return
        started = time.monotonic()
        logging.info("chief: waiting up to %.0f s for %d worker(s) to be ready, so that all "
                     "start together (--start_wait_secs)", self._wait_secs,
                     len(self._waiting_for))
        self._waiting_for = self._barrier.wait_for_reports(
            session, self._waiting_for, self._wait_secs, self._preempted)
        waited = time.monotonic() - started
        missing = [name for _, name in sorted(self._waiting_for.items())]
        if self._preempted.is_set():
            logging.info("chief: stopped waiting for the workers after %.2f s: preempted", waited)
        elif missing:
            logging.warning("chief: %s not ready after %.0f s; starting without them (a worker "
                            "that joins later starts with fresh optimizer state)",
                            ", ".join(missing), waited)
        else:
            logging.info("chief: every worker ready after %.2f s; starting", waited)
        events.emit("start_barrier", 0, waited_secs=round(waited, 3), missing=missing)
        self._waiting_for = {}
