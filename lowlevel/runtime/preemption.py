"""SIGTERM and SIGINT for a task: stop at a safe point, within seconds, with status 128 + N.

Cluster managers preempt a task with SIGTERM and kill it a grace period later
(Kubernetes: 30 s by default; here we aim for 5 s). A Python signal handler
runs only when the main thread is between bytecodes, and a training task's
main thread spends its time inside `session.run`, which can block for long
(a sync worker waiting for its token while another worker is down). So both
signals are blocked in every thread of the process (set before TensorFlow
starts its own threads, which inherit the mask) and taken by one thread that
waits for them with `sigwait`; it works whatever the main thread is doing.

What happens on a signal depends on the phase the task has reached:

- before training (importing TensorFlow, building the graph, waiting for the
  cluster): nothing is at stake; the process exits at once;
- training: `requested` is set; the training loop stops after its current
  step, the chief's session close saves a checkpoint, and the process exits.
  If that has not happened within `GRACE_SECS` (the main thread is blocked)
  the task's `on_stuck` action runs (the chief saves a checkpoint from this
  thread) and the process exits; if that save failed too, the error is logged
  and the newest earlier checkpoint is what a restart resumes from.

The exit status is 128 + N for signal N (SIGTERM: 143, SIGINT: 130), as a
shell and Kubernetes report a process killed by that signal: the task was
stopped, the run is not finished, and a restart with the same flags resumes
it (`errors.is_retryable`). Exiting 0 on SIGTERM would read as "succeeded"
to a Kubernetes Job or `TFJob`: a preempted chief would end the whole job with
training unfinished.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Callable, Optional

from absl import logging

from lowlevel import events
from lowlevel.errors import signal_status

SIGNALS = (signal.SIGTERM, signal.SIGINT)
# Seconds between the signal and the fallback `on_stuck` action: the main
# thread normally finishes its step and the chief its checkpoint well within it.
GRACE_SECS = 3.0
# The words a task logs when a signal stops it (its exit status, 128 + N, is
# what the launcher and cluster managers act on).
PREEMPTED = "preempted by"


_current: Optional["Preemption"] = None  # the process's, once made


def current() -> Optional["Preemption"]:
    """The process's `Preemption`, or None if none was made yet."""
    return _current


def exit_status(signum: int) -> int:
    """128 + the signal number (143 for SIGTERM, 130 for SIGINT): stopped, retryable."""
    return signal_status(signum)


class Preemption:
    """Owns SIGTERM and SIGINT for the life of the process. Create it first, in the main thread.

    Attributes:
      requested: set once a signal arrived during training; the loop polls it.
      signum: the signal received, or None.
    """

    def __init__(self, task_name: str = "task"):
        global _current
        _current = self
        self.task_name = task_name
        self.requested = threading.Event()
        self.signum: Optional[int] = None
        self._training = False
        self._on_stuck: Optional[Callable[[], bool]] = None
        self._safe = False
        self._lock = threading.Lock()
        signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
        threading.Thread(target=self._wait, name="preemption", daemon=True).start()

    def training_started(self, on_stuck: Optional[Callable[[], bool]] = None) -> None:
        """From now on a signal stops training at a safe point instead of exiting at once.

        Args:
          on_stuck: run from the signal thread if the main thread has not
            exited `GRACE_SECS` after the signal; returns whether the state is
            safe (the chief: a checkpoint was saved). None: nothing to save.
        """
        with self._lock:
            self._training = True
            self._on_stuck = on_stuck

    @property
    def signal_name(self) -> Optional[str]:
        """"SIGTERM" or "SIGINT" once a signal arrived, else None."""
        return None if self.signum is None else signal.Signals(self.signum).name

    def mark_safe(self) -> None:
        """The main thread has saved the training state: if it is slow to exit now, just exit."""
        with self._lock:
            self._safe = True

    def _wait(self):
        signum = signal.sigwait(SIGNALS)
        self.signum = signum
        name = signal.Signals(signum).name
        with self._lock:
            training, on_stuck = self._training, self._on_stuck
            self.requested.set()
        if not training:
            logging.info("%s: %s %s; nothing to save here; exiting", self.task_name,
                         PREEMPTED, name)
            events.emit("preempted", None, signal=name, checkpoint=None)
            _exit(exit_status(signum))
        logging.info("%s: %s %s; stopping at the end of the current step", self.task_name,
                     PREEMPTED, name)
        # A second signal, or the grace period running out, means the main thread
        # is stuck: save what can be saved from here and leave.
        threading.Thread(target=self._second_signal, daemon=True).start()
        self._stuck_timer = threading.Timer(GRACE_SECS, self._give_up, args=(on_stuck,))
        self._stuck_timer.daemon = True
        self._stuck_timer.start()

    def _second_signal(self):
        signal.sigwait(SIGNALS)
        logging.warning("%s: second signal; exiting now", self.task_name)
        _exit(exit_status(self.signum))

    def _give_up(self, on_stuck):
        logging.warning("%s: the current step has not finished %.0f s after the signal "
                        "(blocked on another task?)", self.task_name, GRACE_SECS)
        with self._lock:
            if self._safe:
                on_stuck = None
        saved = True  # nothing to save, or the main thread saved it already
        if on_stuck is not None:
            try:
                saved = bool(on_stuck())
            except Exception as e:  # noqa: BLE001 - reported below
                logging.error("%s: could not save the training state: %s", self.task_name, e)
                saved = False
            if not saved:  # still retryable: a restart resumes from the newest checkpoint
                logging.warning("%s: no checkpoint at the stop; a restart resumes from the "
                                "newest earlier one", self.task_name)
        events.emit("preempted", None, signal=self.signal_name, checkpoint=None, stuck=True,
                    safe=saved)
        _exit(exit_status(self.signum))


def _exit(code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
