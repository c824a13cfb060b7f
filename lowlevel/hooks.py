"""Session-run hooks and session creators that fix the classic runtime's waits.

- `ChiefSessionCreator` / `WorkerSessionCreator`: the stock creators build a
  `SessionManager` with `recovery_wait_secs=30`, so a non-chief worker that
  asks before the chief has initialised the model sleeps 30 s
  (tensorflow/tensorflow#10679; `MonitoredTrainingSession` in 2.21 has no
  argument for it). These poll every `RECOVERY_WAIT_SECS` instead, as
  TensorFlow's own `mnist_replica.py` does with its 1 s.
- `SyncReplicasHook`: `SyncReplicasOptimizer`'s own hook, except that the
  chief's queue runner treats the cancellation of its blocked step at session
  close as the end of training, instead of dying with a CancelledError
  traceback (the stock hook's runner counts only OutOfRangeError).
- `ProgressHook`: progress lines, examples/sec summaries and the throughput
  figures of the final metrics.
"""

from __future__ import annotations

import time
from typing import Optional

import tensorflow as tf
from absl import logging

v1 = tf.compat.v1

RECOVERY_WAIT_SECS = 0.5


def _session_manager(scaffold):
    return v1.train.SessionManager(
        local_init_op=scaffold.local_init_op,
        local_init_feed_dict=scaffold.local_init_feed_dict,
        ready_op=scaffold.ready_op,
        ready_for_local_init_op=scaffold.ready_for_local_init_op,
        graph=v1.get_default_graph(),
        recovery_wait_secs=RECOVERY_WAIT_SECS)


class ChiefSessionCreator(v1.train.ChiefSessionCreator):
    """Initialises the model, or restores it from the newest checkpoint in `checkpoint_dir`."""

    def _get_session_manager(self):
        if not self._session_manager:
            self._session_manager = _session_manager(self._scaffold)
        return self._session_manager


class WorkerSessionCreator(v1.train.WorkerSessionCreator):
    """Waits (polling every `RECOVERY_WAIT_SECS`) until the chief has the model ready.

    Raises (from `create_session`):
      tf.errors.DeadlineExceededError: not ready after `max_wait_secs` seconds.
    """

    def _get_session_manager(self):
        if not self._session_manager:
            self._session_manager = _session_manager(self._scaffold)
        return self._session_manager


class SyncReplicasHook(v1.train.SessionRunHook):
    """Initialises a `SyncReplicasOptimizer` and runs the chief's queue runner.

    The chief's runner repeatedly runs the optimizer's sync op: wait for
    `replicas_to_aggregate` gradients in the ps's accumulators, apply their
    mean, bump global_step, and put one token per worker in the token queue.
    After the last step it waits in the accumulator forever; the chief's
    session close cancels that wait, which this runner takes as its end.

    Args:
      sync_optimizer: the optimizer, after `minimize`/`apply_gradients`.
      is_chief: whether this worker is the chief.
      num_tokens: tokens put in the queue at start; -1: `replicas_to_aggregate`.
    """

    def __init__(self, sync_optimizer, is_chief: bool, num_tokens: int = -1):
        self._opt = sync_optimizer
        self._is_chief = is_chief
        self._num_tokens = num_tokens

    def begin(self):
        opt = self._opt
        self._init_tokens_op = self._q_runner = None
        if not self._is_chief:
            self._local_init_op = opt.local_step_init_op
            return
        self._local_init_op = opt.chief_init_op
        self._init_tokens_op = opt.get_init_tokens_op(self._num_tokens)
        stock = opt.get_chief_queue_runner()
        self._q_runner = v1.train.queue_runner.QueueRunner(
            stock.queue, stock.enqueue_ops, stock.close_op, stock.cancel_op,
            queue_closed_exception_types=(tf.errors.OutOfRangeError,
                                          tf.errors.CancelledError))

    def after_create_session(self, session, coord):
        session.run(self._local_init_op)
        if self._init_tokens_op is not None:
            session.run(self._init_tokens_op)
        if self._q_runner is not None:
            self._q_runner.create_threads(session, coord=coord, daemon=True, start=True)


class ProgressHook(v1.train.SessionRunHook):
    """Logs progress every `every_secs` seconds and measures throughput.

    A line reads `step 1200/3000 | loss 0.1234 | 12,345 examples/s | 95.1 steps/s`
    (rates over all workers since the previous line; the launcher parses it).

    Args:
      global_step: the global step variable.
      loss: float32 scalar tensor of the batch loss.
      examples_per_step: examples consumed per global step (batch size, times
        replicas_to_aggregate in sync mode).
      train_steps: the last step, for the "x/y" display.
      every_secs: seconds between lines.
      summary_dir: where the chief writes the `examples_per_sec` summary; None
        for no summaries.
    """

    def __init__(self, global_step, loss, examples_per_step: int, train_steps: int,
                 every_secs: float, summary_dir: Optional[str] = None):
        self._global_step = global_step
        self._loss = loss
        self._examples_per_step = examples_per_step
        self._train_steps = train_steps
        self._every_secs = every_secs
        self._summary_dir = summary_dir
        self.initial_step = self.first_step = self.end_step = None
        self.first_step_time = self.end_time = None
        self.local_steps = 0

    def after_create_session(self, session, coord):
        self.initial_step = self._last_step = int(session.run(self._global_step))
        self._last_time = time.monotonic()

    def before_run(self, run_context):
        if self.first_step_time is None or time.monotonic() - self._last_time >= self._every_secs:
            return v1.train.SessionRunArgs({"step": self._global_step, "loss": self._loss})
        return None

    def after_run(self, run_context, run_values):
        self.local_steps += 1
        now = time.monotonic()
        if run_values.results is None:
            return
        step, loss = int(run_values.results["step"]) + 1, float(run_values.results["loss"])
        if self.first_step_time is None:
            self.first_step_time, self.first_step = now, step
        elapsed = now - self._last_time
        steps_per_sec = (step - self._last_step) / elapsed if elapsed > 0 else 0.0
        examples_per_sec = steps_per_sec * self._examples_per_step
        logging.info("step %d/%d | loss %.4f | %s examples/s | %.1f steps/s",
                     step, self._train_steps, loss, f"{examples_per_sec:,.0f}", steps_per_sec)
        if self._summary_dir and step > self._last_step:
            writer = v1.summary.FileWriterCache.get(self._summary_dir)
            writer.add_summary(v1.Summary(value=[v1.Summary.Value(
                tag="examples_per_sec", simple_value=examples_per_sec)]), step)
        self._last_step, self._last_time = step, now

    def end(self, session):
        self.end_step = int(session.run(self._global_step))
        self.end_time = time.monotonic()

    @property
    def train_seconds(self) -> float:
        """Seconds from this task's first step to the end of its session."""
        if self.first_step_time is None or self.end_time is None:
            return 0.0
        return self.end_time - self.first_step_time

    @property
    def examples_per_sec(self) -> float:
        """All workers' examples/sec over this task's training, from the global step."""
        secs = self.train_seconds
        if not secs or self.end_step is None:
            return 0.0
        return (self.end_step - self.first_step) * self._examples_per_step / secs
