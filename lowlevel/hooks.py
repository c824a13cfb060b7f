"""Session-run hooks and session creators that fix the classic runtime's waits.

- `ChiefSessionCreator` / `WorkerSessionCreator`: the stock creators build a
  `SessionManager` with `recovery_wait_secs=30`, so a non-chief worker that
  asks before the chief has initialised the model sleeps 30 s
  (tensorflow/tensorflow#10679; `MonitoredTrainingSession` in 2.21 has no
  argument for it). These poll every `RECOVERY_WAIT_SECS` instead, as
  TensorFlow's own `mnist_replica.py` does with its 1 s. They also make
  every recovery bounded and lossless: see `ChiefSessionCreator`.
- Both creators bound the final `Session.close()` to `CLOSE_TIMEOUT_SECS`: a
  distributed session's close sometimes blocks for several seconds in
  TF_CloseSession after the work is done (tensorflow/tensorflow#21745; seen
  here for 4-37 s), and the ps tasks may have exited by then. The end-of-
  training handshake has run before the close (`server.ShutdownHook`) and
  the process is exiting, so the close is left to finish, or not, in a
  daemon thread.
- `SyncReplicasHook`: `SyncReplicasOptimizer`'s own hook, except that the
  chief's sync loop ends by itself at the last step instead of blocking in
  the ps's accumulators until its session is cancelled, and a step stuck on
  a dead worker is reported instead of waiting silently.
- `ProgressHook`: progress lines, examples/sec summaries, the throughput
  figures of the final metrics and each task's step times.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Optional

import numpy as np
import tensorflow as tf
from absl import logging

from lowlevel import checkpoints

v1 = tf.compat.v1

RECOVERY_WAIT_SECS = 0.5
CLOSE_TIMEOUT_SECS = 2.0


def _bounded_close(sess, cluster_alive=None):
    """Makes `sess.close()` return after at most `CLOSE_TIMEOUT_SECS` seconds.

    With `cluster_alive` (returns whether every ps task answers) it returns at
    once when a ps is gone: the close of a session that lost its ps (the one a
    recovery replaces) cannot complete, and waiting for it only delays the
    recovery.
    """
    close = sess.close

    def bounded():
        t = threading.Thread(target=close, name="session_close", daemon=True)
        t.start()
        deadline = time.monotonic() + CLOSE_TIMEOUT_SECS
        while t.is_alive() and time.monotonic() < deadline:
            t.join(0.1)
            if cluster_alive is not None and t.is_alive() and not cluster_alive():
                return
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
    """Makes the chief's session: adopts the model the ps tasks hold, or restores, or initialises.

    Called for the first session and again for every session that replaces one
    lost to a failed task (`MonitoredSession` recreates it on
    `UnavailableError`/`AbortedError`). Each time:

    1. `wait_for_ps` (a bounded poll, so a ps that stays down ends in a clear
       `server.StartupError` instead of a CreateSession that waits forever);
    2. if the ps tasks hold an initialised model (the chief itself was
       restarted; the ps and the other workers carried on) it is used as it
       is: nothing trained since the last checkpoint is lost;
    3. else the newest checkpoint that reads whole is restored
       (`checkpoints.newest_readable`: a truncated newest one is skipped, with
       a warning, for the one before);
    4. else the model is initialised.

    Attributes:
      origin: how the last session got its model: "adopted", "restored" or
        "initialised".
      restored_from: (path, global step) of the checkpoint last restored, or None.
    """

    def __init__(self, scaffold, master, config, checkpoint_dir, wait_for_cluster=None,
                 cluster_alive=None):
        super().__init__(scaffold=scaffold, master=master, config=config)
        self._output_dir = checkpoint_dir
        self._wait_for_cluster = wait_for_cluster
        self._cluster_alive = cluster_alive
        self.origin = self.restored_from = None
        self.sessions = 0

    def create_session(self):
        self._scaffold.finalize()
        manager = self._get_session_manager()
        self.sessions += 1
        sess = None
        if self._wait_for_cluster is not None:
            self._wait_for_cluster()
            try:
                sess = manager.wait_for_session(self._master, self._config, max_wait_secs=0)
                self.origin = "adopted"
            except tf.errors.DeadlineExceededError:
                pass  # the ps tasks hold no initialised model
        if sess is None:
            self.restored_from = checkpoints.newest_readable(self._output_dir)
            self._checkpoint_filename_with_path = (self.restored_from[0] if self.restored_from
                                                   else None)
            self.origin = "restored" if self.restored_from else "initialised"
            sess = super().create_session()
        if self.sessions > 1:
            logging.info("chief: new session after a failure; %s", self.describe())
        return _bounded_close(sess, self._cluster_alive)

    def describe(self) -> str:
        """How the last session got its model, in words."""
        if self.origin == "restored":
            path, step = self.restored_from
            return f"restored from checkpoint {os.path.basename(path)}, at global step {step}"
        if self.origin == "adopted":
            return "the ps tasks still held the model: continuing from it"
        return "model initialised"

    def _get_session_manager(self):
        if not self._session_manager:
            self._session_manager = _session_manager(self._scaffold)
        return self._session_manager


class WorkerSessionCreator(v1.train.WorkerSessionCreator):
    """Waits (polling every `RECOVERY_WAIT_SECS`) until the chief has the model ready.

    Each session, the first and every one that replaces a lost one, first
    runs `wait_for_cluster` (the bounded ps poll), then waits for the model at
    most `max_wait_secs`.

    Raises (from `create_session`):
      tf.errors.DeadlineExceededError: not ready after `max_wait_secs` seconds.
    """

    def __init__(self, scaffold, master, config, max_wait_secs, wait_for_cluster=None,
                 cluster_alive=None):
        super().__init__(scaffold=scaffold, master=master, config=config,
                         max_wait_secs=max_wait_secs)
        self._wait_for_cluster = wait_for_cluster
        self._cluster_alive = cluster_alive
        self.sessions = 0

    def create_session(self):
        self.sessions += 1
        if self._wait_for_cluster is not None:
            self._wait_for_cluster()
        sess = super().create_session()
        if self.sessions > 1:
            logging.info("worker: new session after a failure; the model is ready again")
        return _bounded_close(sess, self._cluster_alive)

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

    A sync step waits for gradients for at most `timeout_secs` at a time; when
    it runs out (a worker died and there are no backup workers) the loop logs
    which workers do not answer (`missing_workers()`) and waits again. The step
    completes as soon as a restarted worker sends its gradient: nothing is
    lost and nothing hangs silently.

    Args:
      sync_optimizer: the optimizer, after `minimize`/`apply_gradients`.
      is_chief: whether this worker is the chief.
      global_step: the global step variable.
      last_step: the step training stops at.
      timeout_secs: seconds a sync step may wait before the loop reports it.
      missing_workers: returns "name at host:port" of workers that do not answer.
      num_tokens: tokens put in the queue at start; -1: `replicas_to_aggregate`.
    """

    def __init__(self, sync_optimizer, is_chief: bool, global_step, last_step: int,
                 timeout_secs: float = 60.0, missing_workers=None, num_tokens: int = -1):
        self._opt = sync_optimizer
        self._is_chief = is_chief
        self._global_step = global_step
        self._last_step = last_step
        self._timeout_ms = max(1, int(timeout_secs * 1000))
        self._missing_workers = missing_workers or (lambda: [])
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
        options = v1.RunOptions(timeout_in_ms=self._timeout_ms)
        waited = 0.0
        try:
            while not coord.should_stop():
                step = session.run(self._global_step)
                if step >= self._last_step:
                    return
                try:
                    session.run(self._sync_op, options=options)
                    if waited:
                        logging.info("sync step %d complete again after %.0f s", step, waited)
                    waited = 0.0
                except tf.errors.DeadlineExceededError:
                    waited += self._timeout_ms / 1000
                    missing = self._missing_workers()
                    logging.warning(
                        "sync step %d: still waiting for gradients after %.0f s "
                        "(--sync_timeout_secs); %s", step, waited,
                        f"not answering: {', '.join(missing)}" if missing else
                        "every worker answers (a slow or restarting worker?)")
        except (tf.errors.CancelledError, tf.errors.OutOfRangeError):
            return
        except Exception as e:  # noqa: BLE001 - handed to the coordinator
            coord.request_stop(e)


class ProgressHook(v1.train.SessionRunHook):
    """Logs progress every `every_secs` seconds and measures throughput.

    A line reads `step 1200/3000 | loss 0.1234 | 12,345 examples/s | 95.1 steps/s`
    (rates over all workers since the previous line; the launcher parses it).
    It also times every `session.run` of the training loop, for `task_record`.

    Args:
      global_step: the global step variable.
      loss: float32 scalar tensor of the batch loss.
      examples_per_step: examples consumed per global step (batch size, times
        replicas_to_aggregate in sync mode).
      train_steps: the last step, for the "x/y" display.
      every_secs: seconds between lines.
      summary_dir: where the chief writes the `examples_per_sec` summary; None
        for no summaries.
      warmup_steps: this task's first local steps, left out of the step times.
      batch_size: examples per local step, for this task's own examples/sec.
    """

    def __init__(self, global_step, loss, examples_per_step: int, train_steps: int,
                 every_secs: float, summary_dir: Optional[str] = None, warmup_steps: int = 0,
                 batch_size: int = 0):
        self._global_step = global_step
        self._loss = loss
        self._examples_per_step = examples_per_step
        self._train_steps = train_steps
        self._every_secs = every_secs
        self._summary_dir = summary_dir
        self._warmup_steps = warmup_steps
        self._batch_size = batch_size
        self.initial_step = self.first_step = self.end_step = None
        self.first_step_time = self.end_time = None
        self.first_step_unix = self.last_step_unix = self._window_start = None
        self.local_steps = 0
        self.step_secs: list[float] = []

    def after_create_session(self, session, coord):
        step = int(session.run(self._global_step))
        if self.initial_step is None:  # not again for a session that replaces a lost one
            self.initial_step = step
        self._last_step = step
        self._last_time = time.monotonic()

    def before_run(self, run_context):
        self._t0 = time.perf_counter()
        if self.local_steps == self._warmup_steps:
            self._window_start = time.time()
        if self.first_step_time is None or time.monotonic() - self._last_time >= self._every_secs:
            return v1.train.SessionRunArgs({"step": self._global_step, "loss": self._loss})
        return None

    def after_run(self, run_context, run_values):
        dt = time.perf_counter() - self._t0
        self.local_steps += 1
        self.last_step_unix = time.time()
        if self.first_step_unix is None:
            self.first_step_unix = self.last_step_unix
        if self.local_steps > self._warmup_steps:
            self.step_secs.append(dt)
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

    def task_record(self) -> dict:
        """This task's own figures, warm-up excluded.

        Keys: local_steps (all), measured_steps, warmup_steps, examples_per_sec
        (measured steps * batch size / seconds from the start of the first
        measured step to the end of the last), step_ms_p50, step_ms_p90 (wall
        time of each measured `session.run`, milliseconds), first_step_unix and
        last_step_unix (when its first and last steps ended, Unix seconds).
        """
        n = len(self.step_secs)
        ms = np.asarray(self.step_secs) * 1000.0
        window = (self.last_step_unix - self._window_start) if n and self._window_start else 0
        return {
            "local_steps": self.local_steps,
            "measured_steps": n,
            "warmup_steps": self._warmup_steps,
            "examples_per_sec": round(n * self._batch_size / window, 1) if window > 0 else None,
            "step_ms_p50": round(float(np.percentile(ms, 50)), 3) if n else None,
            "step_ms_p90": round(float(np.percentile(ms, 90)), 3) if n else None,
            "first_step_unix": self.first_step_unix,
            "last_step_unix": self.last_step_unix,
        }
