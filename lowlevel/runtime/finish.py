"""The end of a run for one task, after its session: metrics, export, records, exit status.

Read top to bottom, this is what a training task does once its training loop is
over. Inside the session the end-of-training protocol has run already (steps
1-8 of `shutdown.end_of_training_hooks`: the workers' reports, the chief's final
checkpoint and evaluation, the ps tasks' stop signal). After the session:

9.  `after_training`: the summary writers are flushed and closed; a preempted
    task logs where it stopped, emits `preempted` and returns no metrics.
10. The chief's final metrics (`final_metrics`), from the final evaluation and the
    progress hook; a final checkpoint that could not be saved ends the run
    (`errors.StorageFailure`, exit 1) before anything is exported.
11. The chief exports the final checkpoint as a SavedModel (`outputs.export`).
12. Every task writes its step times (`tasks/<task>.json`), the chief its final
    metrics (`final_metrics.json`) (`output_layout`; best effort on a full disk).
13. `report`: a preempted task exits 128 + N; the chief prints its metrics as its
    last line of stdout; exit 0.

A chief that finds the run already finished (its newest checkpoint is at
`--train_steps`) trains nothing: `finished_run` tells the ps tasks to exit
(`shutdown.stop_cluster`), exports the final checkpoint if that was not done, and
reports the metrics the run left.
"""

from __future__ import annotations

import json
import os
import time
from typing import Optional

import tensorflow as tf
from absl import logging

from lowlevel import errors, events, output_layout
from lowlevel.cluster.spec import Cluster, Task
from lowlevel.config import TrainConfig
from lowlevel.outputs import checkpoints, export, files, storage
from lowlevel.runtime import hooks, shutdown

v1 = tf.compat.v1

# A chief that finds the run finished tells the ps tasks to exit. They may be
# starting (the whole cluster was restarted) or long gone (only the chief was
# restarted, after the end-of-training handshake); it waits this long for them.
FINISHED_PS_WAIT_SECS = 30.0


def after_training(config: TrainConfig, cluster: Optional[Cluster], task: Task, g, trainable,
                   preemption, started: float) -> Optional[dict]:
    """Steps 9-12 for a task whose session has closed; returns the chief's final metrics.

    Args:
      g: the task's `graph.TrainGraph`.
      trainable: what was trained (`trainables`): its final evaluation and export.
      preemption: the task's `preemption.Preemption`, or None.
      started: `time.monotonic()` when the task began building its graph.

    Returns:
      The chief's metrics; None on other workers and when preempted.

    Raises:
      errors.StorageFailure: the chief's final checkpoint could not be saved.
    """
    # Flush and close the summary writers (a full disk fails here too: a line).
    storage.Writes("summaries").run(_close_summaries, config.output_dir or "")
    if preemption is not None and preemption.requested.is_set():
        _preempted(config.output_dir, task, g.progress.end_step, preemption)
        return None
    logging.info("%s: training done at global step %s after %d local steps",
                 task.name, g.progress.end_step, g.progress.local_steps)
    final = checkpoints.latest(config.output_dir) if task.is_chief else None
    evaluated = trainable.final_evaluation(g, config, final) if task.is_chief else {}
    metrics = final_metrics(config, cluster, g, evaluated, time.monotonic() - started)
    saves = next((h.saves for h in g.hooks if isinstance(h, hooks.CheckpointHook)), None)
    if saves is not None and saves.last_failed:  # nothing to export either
        raise errors.StorageFailure(
            f"the final checkpoint (global step {g.progress.end_step}) could not be saved "
            f"in {config.output_dir}; free space or make it writable, then run the same "
            "command again: it resumes from the newest checkpoint")
    if task.is_chief and config.output_dir and config.keep_exports:
        # After the session: from the final checkpoint, in a fresh graph.
        export_dir = trainable.export(final, config)
        if export_dir:
            metrics["export_dir"] = export_dir
    if config.output_dir:
        _write_records(config.output_dir, task, g.progress.task_record(),
                       metrics if task.is_chief else None)
    return metrics if task.is_chief else None


def _close_summaries() -> None:
    """Flushes and closes the runtime's events writers and any a user's hook made through
    TF's `FileWriterCache`."""
    files.close_event_writers()
    v1.summary.FileWriterCache.clear()


def _preempted(output_dir: Optional[str], task: Task, end_step, preemption) -> None:
    """Step 9 for a preempted task: where it stopped, the `preempted` event, safe to exit."""
    saved = checkpoints.latest(output_dir) if task.is_chief else None
    logging.info("%s: preempted at global step %s%s; exiting", task.name, end_step,
                 f"; saved {os.path.basename(saved)}" if saved else "")
    events.emit("preempted", end_step, signal=preemption.signal_name,
                checkpoint=saved and os.path.basename(saved))
    preemption.mark_safe()


def final_metrics(config: TrainConfig, cluster: Optional[Cluster], g, evaluated: dict,
                  wall_seconds: float) -> dict:
    """Step 10: the chief's final metrics (also written to `final_metrics.json`).

    global_step, start_global_step, accuracy and loss (test split; wide_deep also
    auc and log_loss; a model_fn: its eval metrics), train_examples_per_sec (all
    workers), wall_seconds (from building the graph to the end of the final evaluation
    and shutdown handshake), num_ps, num_workers, sync, model, dataset (a model_fn's:
    its input_fn), batch_size (per worker step; a model_fn's from its input's static
    leading dimension: examples/s and batch size None when that is unknown).

    `evaluated`: the final evaluation's results (`trainable.final_evaluation`).
    """
    extra = {k: v for k, v in evaluated.items()
             if k not in ("accuracy", "loss", "global_step", "num_examples")}
    return {
        "global_step": g.progress.end_step,
        "start_global_step": g.progress.initial_step,
        "accuracy": evaluated.get("accuracy"),
        "loss": evaluated.get("loss"),
        **extra,
        # A model_fn's batch is its input_fn's: known where its leading dimension is static.
        "train_examples_per_sec": round(g.progress.examples_per_sec, 1)
        if g.examples_per_step else None,
        "wall_seconds": round(wall_seconds, 3),
        "num_ps": cluster.num_ps if cluster else 0,
        "num_workers": cluster.num_workers if cluster else 1,
        "sync": bool(config.sync and cluster),
        "model": config.model,
        "dataset": config.dataset if config.builtin else config.input_fn,
        "batch_size": config.batch_size if config.builtin else g.progress.batch_size or None,
    }


def _write_records(output_dir: str, task: Task, step_times: dict,
                   metrics: Optional[dict]) -> None:
    """Step 12: the task's step times and, from the chief, the final metrics (best effort)."""
    task_file = output_layout.task_record(output_dir, task.name)
    storage.Writes("step times").run(lambda: files.write_json(
        task_file, dict(task=task.name, **step_times)), task_file)
    if metrics is not None:
        metrics_file = output_layout.final_metrics(output_dir)
        storage.Writes("the final metrics").run(
            lambda: files.write_json(metrics_file, metrics), metrics_file)


def finished_run(config: TrainConfig, cluster: Optional[Cluster], task: Task, server,
                 session_config, done: errors.TrainingFinished) -> Optional[dict]:
    """A task that found the run finished (`done`): the chief stops the ps tasks, makes sure
    the final checkpoint is exported, and returns the metrics the run left; others None."""
    logging.info("%s: nothing to train: %s, and --train_steps=%d", task.name, done,
                 config.train_steps)
    if not task.is_chief:
        return None
    if cluster:  # the ps tasks of this (re)started cluster wait for the chief's word
        shutdown.stop_cluster(server, cluster, session_config,
                              min(config.startup_timeout_secs, FINISHED_PS_WAIT_SECS))
    metrics = _previous_metrics(config.output_dir, done.step)
    export_dir = export.ensure_exported(done.path, done.step, config)
    if export_dir:
        metrics["export_dir"] = export_dir
    return metrics


def _previous_metrics(output_dir: str, step: int) -> dict:
    """The final metrics a finished run left in `output_dir`, or the step alone."""
    try:
        with open(output_layout.final_metrics(output_dir)) as f:
            metrics = json.load(f)
        if metrics.get("global_step") == step:
            return metrics
    except (OSError, ValueError):
        pass
    return {"global_step": step, "start_global_step": step}


def report(metrics: Optional[dict], preemption) -> int:
    """Step 13: the exit status; the chief's metrics as its last line of stdout."""
    if preemption is not None and preemption.signum is not None:  # a safe point: retryable
        return errors.signal_status(preemption.signum)
    if metrics is not None:
        line = json.dumps(metrics)
        logging.info("final metrics: %s", line)
        print(line, flush=True)
    return 0
