"""Session-run hooks and session creators that fix the classic runtime's waits.

- `ChiefSessionCreator` / `WorkerSessionCreator`: the stock creators build a
  `SessionManager` with `recovery_wait_secs=30`, so a non-chief worker that
  asks before the chief has initialised the model sleeps 30 s
  (tensorflow/tensorflow#10679; `MonitoredTrainingSession` in 2.21 has no
  argument for it). These poll every `RECOVERY_WAIT_SECS` instead, as
  TensorFlow's own `mnist_replica.py` does with its 1 s.
- Both creators bound the final `Session.close()` to `CLOSE_TIMEOUT_SECS`: a
  distributed session's close sometimes blocks for several seconds in
  TF_CloseSession after the work is done (tensorflow/tensorflow#21745; seen
  here for 4-37 s), and the ps tasks may have exited by then. The end-of-
  training handshake has run before the close (`server.ShutdownHook`) and
  the process is exiting, so the close is left to finish, or not, in a
  daemon thread.
- `SyncReplicasHook`: `SyncReplicasOptimizer`'s own hook, except that the
  chief's sync loop ends by itself at the last step instead of blocking in
  the ps's accumulators until its session is cancelled.
- `ProgressHook`: progress lines, examples/sec summaries and the throughput
  figures of the final metrics.
"""

from __future__ import annotations

import threading
import time
from typing import Optional

import tensorflow as tf
from absl import logging

v1 = tf.compat.v1

RECOVERY_WAIT_SECS = 0.5
CLOSE_TIMEOUT_SECS = 2.0


def _bounded_close(sess):
    """Makes `sess.close()` return after at most `CLOSE_TIMEOUT_SECS` seconds."""
    close = sess.close

    def bounded():
        t = threading.Thread(target=close, name="session_close", daemon=True)
        t.start()
        t.join(CLOSE_TIMEOUT_SECS)
        if t.is_alive():
            logging.info("session close unfinished after %.0f s (the ps tasks may have exited "
                         "already; tensorflow/tensorflow#21745); not waiting for it",
                         CLOSE_TIMEOUT_SECS)

    sess.close = bounded
    return sess


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

    def create_session(self):
        return _bounded_close(super().create_session())

    def _get_session_manager(self):
        if not self._session_manager:
            self._session_manager = _session_manager(self._scaffold)
        return self._session_manager


class WorkerSessionCreator(v1.train.WorkerSessionCreator):
    """Waits (polling every `RECOVERY_WAIT_SECS`) until the chief has the model ready.

    Raises (from `create_session`):
      tf.errors.DeadlineExceededError: not ready after `max_wait_secs` seconds.
    """

    def create_session(self):
        return _bounded_close(super().create_session())

    def _get_session_manager(self):
        if not self._session_manager:
            self._session_manager = _session_manager(self._scaffold)
        return self._session_manager


class SyncReplicasHook(v1.train.SessionRunHook):
    """Initialises a `SyncReplicasOptimizer` and, on the chief, runs its sync loop.

    The chief's loop runs the optimizer's sync op: wait for
    `replicas_to_aggregate` gradients in the ps's accumulators, apply their
    mean, bump global_step and put one token per worker in the token queue.
    The stock queue runner keeps calling it after the last step, where it
    blocks in the accumulators until its session is closed and the close
    cancels it — the hang of tensorflow/tensorflow#7970, and the reason a sync
    chief's close could take many seconds. This loop stops by itself once
    global_step reaches `last_step` (only the sync op moves global_step in sync
    mode), so nothing is left blocked.

    Args:
      sync_optimizer: the optimizer, after `minimize`/`apply_gradients`.
      is_chief: whether this worker is the chief.
      global_step: the global step variable.
      last_step: the step training stops at.
      num_tokens: tokens put in the queue at start; -1: `replicas_to_aggregate`.
    """

    def __init__(self, sync_optimizer, is_chief: bool, global_step, last_step: int,
                 num_tokens: int = -1):
        self._opt = sync_optimizer
        self._is_chief = is_chief
        self._global_step = global_step
        self._last_step = last_step
        self._num_tokens = num_tokens

    def begin(self):
        opt = self._opt
        self._init_tokens_op = self._sync_op = None
        if not self._is_chief:
            self._local_init_op = opt.local_step_init_op
            return
        self._local_init_op = opt.chief_init_op
        self._init_tokens_op = opt.get_init_tokens_op(self._num_tokens)
        (self._sync_op,) = opt.get_chief_queue_runner().enqueue_ops

    def after_create_session(self, session, coord):
        session.run(self._local_init_op)
        if self._init_tokens_op is None:
            return
        session.run(self._init_tokens_op)
        thread = threading.Thread(target=self._sync_loop, args=(session, coord),
                                  name="sync_replicas_chief", daemon=True)
        coord.register_thread(thread)
        thread.start()

    def _sync_loop(self, session, coord):
        try:
            while not coord.should_stop():
                if session.run(self._global_step) >= self._last_step:
                    return
                session.run(self._sync_op)
        except (tf.errors.CancelledError, tf.errors.OutOfRangeError):
            return
        except Exception as e:  # noqa: BLE001 - handed to the coordinator
            coord.request_stop(e)


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
