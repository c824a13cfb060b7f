"""Network faults end in a word, not a hang: a deadline on every run of the training loop.

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
completes ends the outage (`fault_cleared`, with its length). An outage longer
than `--fault_timeout_secs` (counted from the start of the first run that
timed out) raises `NetworkFault`: exit status 200 (retryable), naming the
tasks that did not answer.
"""

from __future__ import annotations

import time
from typing import Callable, Optional, Sequence

import tensorflow as tf
from absl import logging

from lowlevel import events
from lowlevel.cluster import probes
from lowlevel.errors import NetworkFault

v1 = tf.compat.v1

PROBE_TIMEOUT_SECS = 1.0  # how long one peer probe waits for an answer


class FaultWatch:
    """Per-run deadline, fault reports and the bounded wait of one training task.

    Args:
      task_name: this task ("worker1"), for the messages.
      peers: [(name, "host:port")] of the tasks this one's runs depend on.
      step_timeout_secs: the deadline of one run, seconds.
      fault_timeout_secs: the longest outage, seconds, before `NetworkFault`.
      clock: seconds, monotonic (tests pass their own).
    """

    def __init__(self, task_name: str, peers: Sequence[tuple[str, str]],
                 step_timeout_secs: float, fault_timeout_secs: float,
                 clock: Callable[[], float] = time.monotonic):
        self.task_name = task_name
        self.peers = list(peers)
        self.step_timeout_secs = step_timeout_secs
        self.fault_timeout_secs = fault_timeout_secs
        self.options = v1.RunOptions(timeout_in_ms=max(1, int(step_timeout_secs * 1000)))
        self._clock = clock
        self._since: Optional[float] = None  # start of the outage under way

    def run(self, fn: Callable, what: str = "step", global_step: Optional[int] = None):
        """Returns `fn(options)`, run again after each deadline until it completes.

        Raises:
          NetworkFault: the outage lasted `fault_timeout_secs`.
          Whatever else `fn` raises.
        """
        while True:
            try:
                value = fn(self.options)
            except tf.errors.DeadlineExceededError as e:
                self.timed_out(what, e, global_step)
                continue
            self.answered(global_step)
            return value

    def not_answering(self) -> list[str]:
        """"name at host:port" of each peer that does not answer now (`probes.answers`)."""
        return [f"{name} at {address}" for name, address in self.peers
                if not probes.answers(address, PROBE_TIMEOUT_SECS)]

    def timed_out(self, what: str, error: BaseException, global_step: Optional[int]) -> None:
        """Reports a run that hit its deadline; raises NetworkFault past the limit."""
        now = self._clock()
        if self._since is None:
            self._since = now - self.step_timeout_secs  # the run waited that long
        waited = now - self._since
        silent = self.not_answering()
        who = (f"not answering: {', '.join(silent)}" if silent else
               "every peer answers its probe (overloaded, or waiting on a worker?)")
        message = getattr(error, "message", None) or str(error)
        events.emit("fault_noticed", global_step, error=f"{what} timed out: {message}",
                    missing=silent, waited_secs=round(waited, 3))
        if waited >= self.fault_timeout_secs:
            logging.error("%s: no %s completed for %.0f s (--fault_timeout_secs=%g); %s; "
                          "giving up", self.task_name, what, waited, self.fault_timeout_secs,
                          who)
            raise NetworkFault(
                f"{self.task_name}: no {what} completed for {waited:.0f} s "
                f"(--fault_timeout_secs={self.fault_timeout_secs:g}); {who}: a network "
                "partition, a frozen or dead host? Restart this task once they are back")
        logging.warning("%s: %s did not complete within %g s (--step_timeout_secs); %s; "
                        "retrying (giving up after %g s, --fault_timeout_secs)",
                        self.task_name, what, self.step_timeout_secs, who,
                        self.fault_timeout_secs)

    def answered(self, global_step: Optional[int] = None) -> None:
        """A run completed: ends the outage under way, if any."""
        if self._since is None:
            return
        outage = self._clock() - self._since
        self._since = None
        logging.info("%s: the cluster answers again after %.0f s; training goes on",
                     self.task_name, outage)
        events.emit("fault_cleared", global_step, outage_secs=round(outage, 3))


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
