"""Session-run hooks of the training loop.

- `CheckpointHook`, `SummaryHook`: the chief's checkpoints and TensorBoard
  summaries. The stock `CheckpointSaverHook` and `SummarySaverHook` each add
  a read of global_step to every step — a round trip to its ps that the
  communication-reduced mode's local steps would otherwise not make at all.
  These take the step the training loop already knows (`LoopState`).
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

from lowlevel import events

v1 = tf.compat.v1


class LoopState:
    """What the training loop knows, shared with the hooks so they need not fetch it.

    The loop runs most steps through a callable on the raw session, past the
    hooks (`loop.StepRunner`); a step goes through the monitored session,
    and so through the hooks, when one of them is `due()`.

    Attributes:
      value: the global step as the loop last saw it.
      in_step: the run under way is a training step (not an exchange or a
        claim): hooks that fetch the batch's loss or summaries act only then.
    """

    def __init__(self):
        self.value = 0
        self.in_step = False


class CheckpointHook(v1.train.SessionRunHook):
    """Saves a checkpoint every `save_steps` global steps or `save_secs` seconds, and at the end.

    Writes `graph.pbtxt` and the graph summary when the first session is
    created, and saves the state it starts from (as the stock hook does). The
    final save in `end` runs after every earlier hook's `end`: place it after
    the hook that waits for the other workers, so it holds their last updates.

    Args:
      saver: the `tf.compat.v1.train.Saver`.
      output_dir: where `model.ckpt-<global step>` files go.
      steps: the training loop's `LoopState`.
      save_steps / save_secs: the cadence; steps win when both are given.
    """

    def __init__(self, saver, output_dir: str, steps: LoopState,
                 save_steps: Optional[int] = None, save_secs: Optional[float] = None):
        self._saver = saver
        self._output_dir = output_dir
        self._prefix = os.path.join(output_dir, "model.ckpt")
        self._steps = steps
        self._timer = v1.train.SecondOrStepTimer(every_secs=None if save_steps else save_secs,
                                                 every_steps=save_steps)
        self._first_session = True

    def begin(self):
        self._global_step = v1.train.get_global_step()

    def after_create_session(self, session, coord):
        step = int(session.run(self._global_step))
        self._steps.value = step
        if self._first_session:
            self._first_session = False
            graph = v1.get_default_graph()
            tf.io.write_graph(graph.as_graph_def(add_shapes=True), self._output_dir,
                              "graph.pbtxt")
            v1.summary.FileWriterCache.get(self._output_dir).add_graph(graph)
            self._save(session)
        self._timer.update_last_triggered_step(step)

    def due(self) -> bool:
        # Before the next run the loop has recorded the step the last one ended at.
        return self._timer.should_trigger_for_step(self._steps.value)

    def before_run(self, run_context):
        if self.due():
            self._timer.update_last_triggered_step(self._steps.value)
            self._save(run_context.session)

    def end(self, session):
        # Always: a save at this same step may predate the other workers' last
        # updates (in the communication-reduced mode, their last exchanges).
        self._save(session)

    def _save(self, session) -> None:
        path = self._saver.save(session, self._prefix, global_step=self._global_step)
        logging.info("saved %s", os.path.basename(path))
        events.emit("checkpoint_saved", int(path.rpartition("-")[2]),
                    path=os.path.basename(path), emergency=False)


class SummaryHook(v1.train.SessionRunHook):
    """Writes the graph's merged summaries (of a training step) every `every_secs` seconds."""

    def __init__(self, output_dir: str, every_secs: float, state: LoopState):
        self._output_dir = output_dir
        self._every_secs = every_secs
        self._state = state
        self._next = 0.0

    def begin(self):
        self._summary = v1.summary.merge_all()
        self._global_step = v1.train.get_global_step()

    def due(self) -> bool:
        return self._summary is not None and time.monotonic() >= self._next

    def before_run(self, run_context):
        if self._state.in_step and self.due():
            self._next = time.monotonic() + self._every_secs
            return v1.train.SessionRunArgs({"summary": self._summary,
                                            "step": self._global_step})
        return None

    def after_run(self, run_context, run_values):
        if run_values.results:
            v1.summary.FileWriterCache.get(self._output_dir).add_summary(
                run_values.results["summary"], run_values.results["step"])


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
        (sync_op,) = opt.get_chief_queue_runner().enqueue_ops
        with tf.control_dependencies([sync_op]):  # one round trip per step: sync, then read
            self._sync_op = self._global_step.read_value()

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
            step = session.run(self._global_step)
            while not coord.should_stop() and step < self._last_step:
                try:
                    step = session.run(self._sync_op, options=options)
                    if waited:
                        logging.info("sync steps complete again (global step %d) after %.0f s",
                                     step, waited)
                    waited = 0.0
                except tf.errors.DeadlineExceededError:
                    waited += self._timeout_ms / 1000
                    missing = self._missing_workers()
                    events.emit("fault_noticed", step, error="sync step still waiting for "
                                f"gradients after {waited:.0f} s", missing=missing)
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
    (rates over all workers since the previous line), for humans; the same
    figures go to the task's `progress` event (`lowlevel.events`), for tools.
    The training loop times every step (`record`), for `task_record`; a
    line is due (`due`) at the first step and then every `every_secs`, and is
    written from a step run through the hooks.

    Args:
      global_step: the global step variable.
      loss: float32 scalar tensor of the batch loss.
      examples_per_step: examples consumed per global step (batch size, times
        replicas_to_aggregate in sync mode).
      train_steps: the last step, for the "x/y" display.
      every_secs: seconds between lines.
      state: the loop's `LoopState`.
      summary_dir: where the chief writes the `examples_per_sec` summary; None
        for no summaries.
      warmup_steps: this task's first local steps, left out of the step times.
      batch_size: examples per local step, for this task's own examples/sec.
    """

    def __init__(self, global_step, loss, examples_per_step: int, train_steps: int,
                 every_secs: float, state: LoopState, summary_dir: Optional[str] = None,
                 warmup_steps: int = 0, batch_size: int = 0):
        self._global_step = global_step
        self._loss = loss
        self._examples_per_step = examples_per_step
        self._train_steps = train_steps
        self._every_secs = every_secs
        self._state = state
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

    def record(self, start: float, seconds: float) -> None:
        """One training step took `seconds`, from `start` (`time.time()`)."""
        if self.local_steps == self._warmup_steps:
            self._window_start = start
        self.local_steps += 1
        self.last_step_unix = start + seconds
        if self.first_step_unix is None:
            self.first_step_unix = self.last_step_unix
        if self.local_steps > self._warmup_steps:
            self.step_secs.append(seconds)

    def due(self) -> bool:
        return (self.first_step_time is None or
                time.monotonic() - self._last_time >= self._every_secs)

    def before_run(self, run_context):
        if self._state.in_step and self.due():
            return v1.train.SessionRunArgs({"step": self._global_step, "loss": self._loss})
        return None

    def after_run(self, run_context, run_values):
        if run_values.results is None:
            return
        now = time.monotonic()
        step, loss = int(run_values.results["step"]) + 1, float(run_values.results["loss"])
        if self.first_step_time is None:
            self.first_step_time, self.first_step = now, step
        elapsed = now - self._last_time
        steps_per_sec = (step - self._last_step) / elapsed if elapsed > 0 else 0.0
        examples_per_sec = steps_per_sec * self._examples_per_step
        logging.info("step %d/%d | loss %.4f | %s examples/s | %.1f steps/s",
                     step, self._train_steps, loss, f"{examples_per_sec:,.0f}", steps_per_sec)
        events.emit("progress", step, loss=loss, examples_per_sec=round(examples_per_sec, 1),
                    steps_per_sec=round(steps_per_sec, 2), train_steps=self._train_steps)
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
