"""Progress of the training loop: lines and events, throughput, each task's step times."""

from __future__ import annotations

import time
from typing import Optional

import numpy as np
import tensorflow as tf
from absl import logging

from lowlevel import events
from lowlevel.models import dynamic_embeddings
from lowlevel.outputs import files
from lowlevel.runtime.hooks import LoopState

v1 = tf.compat.v1


class ProgressHook(v1.train.SessionRunHook):
    """Logs progress every `every_secs` seconds and measures throughput.

    A line reads `step 1200/3000 | loss 0.1234 | 12,345 examples/s | 95.1 steps/s`
    (rates over all workers since the previous line), for humans; the same
    figures go to the task's `progress` event (`lowlevel.events`), for tools, with
    the live rows of each dynamic embedding shard (`dynamic_rows`) if there are any.
    The training loop times every step (`record`), for `task_record`; a
    line is due (`due`) at the first step and then every `every_secs`, and is
    written from a step run through the hooks.

    Args:
      global_step: the global step variable.
      loss: float32 scalar tensor of the batch loss.
      examples_per_step: examples consumed per global step (batch size, times
        replicas_to_aggregate in sync mode); 0 if unknown (a model_fn's input with no
        static batch size): the lines then give steps/s only.
      train_steps: the last step, for the "x/y" display.
      every_secs: seconds between lines.
      state: the loop's `LoopState`.
      summary_dir: where the chief writes the `examples_per_sec` summary; None
        for no summaries.
      warmup_steps: this task's first local steps, left out of the step times.
      batch_size: examples per local step, for this task's own examples/sec.
      step_from_loop: the step a line reports is the loop's (`state.value`), not a
        fetch of global_step: the communication-reduced mode, whose local steps touch
        no ps (a fetch of global_step there made each hooked local step a round trip
        to its ps: ~1 ms of CPU a step, benchmarks/NOTES.md 2026-12-02).
    """

    def __init__(self, global_step, loss, examples_per_step: int, train_steps: int,
                 every_secs: float, state: LoopState, summary_dir: Optional[str] = None,
                 warmup_steps: int = 0, batch_size: int = 0, step_from_loop: bool = False):
        self._global_step = global_step
        self._step_from_loop = step_from_loop
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
        self._acting = False  # this hooked step logs (it was due)
        self.step_secs: list[float] = []
        # {shard scope: live rows} of the graph's dynamic embedding tables, for the events
        self._live_rows = dynamic_embeddings.live_rows()

    @property
    def batch_size(self) -> int:
        """Examples per local step of this task."""
        return self._batch_size

    def after_create_session(self, session, coord):
        step = int(session.run(self._global_step))
        if self.initial_step is None:  # not again for a session that replaces a lost one
            self.initial_step = step
        self._last_step = step
        self._last_time = time.monotonic()

    def record(self, start: float, seconds: float, steps: int = 1) -> None:
        """`steps` training steps took `seconds`, from `start` (`time.time()`).

        A block of local steps run at once (`local_sgd.local_block`) counts as
        `steps` steps of `seconds / steps` each, one after the other.
        """
        each = seconds / steps
        for i in range(steps):
            if self.local_steps == self._warmup_steps:
                self._window_start = start + i * each
            self.local_steps += 1
            self.last_step_unix = start + (i + 1) * each
            if self.first_step_unix is None:
                self.first_step_unix = self.last_step_unix
            if self.local_steps > self._warmup_steps:
                self.step_secs.append(each)

    def due(self) -> bool:
        return (self.first_step_time is None or
                time.monotonic() - self._last_time >= self._every_secs)

    def before_run(self, run_context):
        # Fetched in every step the loop runs through the hooks, due or not: one set of
        # fetches, one executor (`loop.StepRunner`: a new set stalls the step).
        if not self._state.in_step:
            return None
        self._acting = self.due()
        fetches = {"loss": self._loss}
        if not self._step_from_loop:
            fetches["step"] = self._global_step
        if self._live_rows:
            fetches["rows"] = self._live_rows
        return v1.train.SessionRunArgs(fetches)

    def after_run(self, run_context, run_values):
        if run_values.results is None or not self._acting:
            return
        now = time.monotonic()
        step = int(run_values.results.get("step", self._state.value)) + 1
        loss = float(run_values.results["loss"])
        if self.first_step_time is None:
            self.first_step_time, self.first_step = now, step
        elapsed = now - self._last_time
        steps_per_sec = (step - self._last_step) / elapsed if elapsed > 0 else 0.0
        examples_per_sec = steps_per_sec * self._examples_per_step
        rate = f"{examples_per_sec:,.0f} examples/s | " if self._examples_per_step else ""
        logging.info("step %d/%d | loss %.4f | %s%.1f steps/s", step, self._train_steps, loss,
                     rate, steps_per_sec)
        rows = {k: int(v) for k, v in run_values.results.get("rows", {}).items()}
        events.emit("progress", step, loss=loss, examples_per_sec=round(examples_per_sec, 1),
                    steps_per_sec=round(steps_per_sec, 2), train_steps=self._train_steps,
                    **({"dynamic_rows": rows} if rows else {}))
        if self._summary_dir and step > self._last_step:
            writer = files.event_writer(self._summary_dir)
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


class GlobalStepProgressHook(v1.train.SessionRunHook):
    """Progress of a loop the runtime does not run (a TF1 script's own, under
    `lowlevel.train.MonitoredTrainingSession`): every `every_secs` seconds, with the run
    under way (and at the first run), fetches the global step and logs `worker1: step
    1200/3000 | 95.1 steps/s` (the global step before the run; steps/s of all workers
    since the previous line, none on the first; `/3000` only when the last step is known),
    and emits the same as a `progress` event (`lowlevel.events`). The loss is the
    script's own business: it is not known here.

    Args:
      task_name: "worker1", for the lines.
      last_step: the run's last global step, or None.
      every_secs: seconds between lines.
    """

    def __init__(self, task_name: str, last_step: Optional[int], every_secs: float):
        self._task_name, self._last_step, self._every_secs = task_name, last_step, every_secs
        self._global_step = None
        self._seen: Optional[tuple[int, float]] = None  # (global step, monotonic seconds)

    def begin(self):
        self._global_step = v1.train.get_global_step()

    def before_run(self, run_context):
        if self._global_step is None or (
                self._seen is not None and time.monotonic() - self._seen[1] < self._every_secs):
            return None
        return v1.train.SessionRunArgs(self._global_step)

    def after_run(self, run_context, run_values):
        if run_values.results is None:
            return
        step, now = int(run_values.results), time.monotonic()
        of = f"/{self._last_step}" if self._last_step is not None else ""
        steps_per_sec = None
        if self._seen is not None and now > self._seen[1]:
            steps_per_sec = (step - self._seen[0]) / (now - self._seen[1])
        rate = "" if steps_per_sec is None else f" | {steps_per_sec:.1f} steps/s"
        logging.info("%s: step %d%s%s", self._task_name, step, of, rate)
        events.emit("progress", step, train_steps=self._last_step,
                    steps_per_sec=None if steps_per_sec is None else round(steps_per_sec, 2))
        self._seen = (step, now)
