"""The layout of `--output_dir`: every path a run writes there, named once.

    <output_dir>/
      checkpoint                      the checkpoint state file (TensorFlow's `Saver`)
      model.ckpt-<step>.index         a checkpoint: index, data shards (one per ps), meta graph
      model.ckpt-<step>.data-K-of-N
      model.ckpt-<step>.meta
      events.out.tfevents.*           the chief's TensorBoard summaries (loss, accuracy, examples/s)
      final_metrics.json              the chief's final metrics (its last line of stdout)
      tasks/<task>.json               each training task's step times (`runtime.progress`)
      events/<task>.jsonl             each task's structured events (`lowlevel.events`)
      eval/, eval_train/              the evaluator's summaries and `eval_metrics.json`
      export/<step>/                  SavedModel exports (`outputs.export`)
      restarts/<task>.json            each task's starts in this run (`runtime.restarts`,
                                      with --max_restarts)
      placement.json                  where the chief put each variable (with metrics on)
      line_counts.json                the training files' lines, by path, size and mtime
                                      (with --count_examples: `data.spans`)

The directory is shared by every task of a cluster (a shared volume on several
hosts). The chief writes the checkpoints, summaries, final metrics and exports;
every task writes its own `tasks/` and `events/` files; the evaluator writes
under `eval/`. No TensorFlow import here: the launcher and the supervisor read
these paths too.
"""

from __future__ import annotations

import os
import tempfile

from lowlevel.errors import UsageError

CHECKPOINT_STATE = "checkpoint"
CHECKPOINT_PREFIX = "model.ckpt"  # a checkpoint is model.ckpt-<global step>.*
FINAL_METRICS = "final_metrics.json"
TASKS_DIR = "tasks"
EVENTS_DIR = "events"
EXPORT_DIR = "export"
EVAL_DIR, EVAL_TRAIN_DIR = "eval", "eval_train"
EVAL_RECORDS = "eval_metrics.json"
RESTARTS_DIR = "restarts"
PLACEMENT = "placement.json"


def checkpoint_prefix(output_dir: str) -> str:
    """`<output_dir>/model.ckpt`: what a `Saver` saves to (it appends `-<global step>`)."""
    return os.path.join(output_dir, CHECKPOINT_PREFIX)


def final_metrics(output_dir: str) -> str:
    """`<output_dir>/final_metrics.json`: the chief's final metrics."""
    return os.path.join(output_dir, FINAL_METRICS)


def task_record(output_dir: str, task_name: str) -> str:
    """`<output_dir>/tasks/<task_name>.json`: a training task's step times."""
    return os.path.join(output_dir, TASKS_DIR, f"{task_name}.json")


def events_dir(output_dir: str) -> str:
    """`<output_dir>/events`: every task's event file."""
    return os.path.join(output_dir, EVENTS_DIR)


def events_file(output_dir: str, task_name: str) -> str:
    """`<output_dir>/events/<task_name>.jsonl`: one task's events."""
    return os.path.join(output_dir, EVENTS_DIR, f"{task_name}.jsonl")


def export_base(output_dir: str) -> str:
    """`<output_dir>/export`: the numbered SavedModel exports, `export/<global step>/`."""
    return os.path.join(output_dir, EXPORT_DIR)


def eval_dir(output_dir: str, on_train_data: bool = False) -> str:
    """`<output_dir>/eval` (`eval_train` for the training split): the evaluator's output."""
    return os.path.join(output_dir, EVAL_TRAIN_DIR if on_train_data else EVAL_DIR)


def eval_records(output_dir: str, on_train_data: bool = False) -> str:
    """`<output_dir>/eval/eval_metrics.json`: the evaluator's record per checkpoint."""
    return os.path.join(eval_dir(output_dir, on_train_data), EVAL_RECORDS)


def restarts_file(output_dir: str, task_name: str) -> str:
    """`<output_dir>/restarts/<task_name>.json`: a task's starts in this run."""
    return os.path.join(output_dir, RESTARTS_DIR, f"{task_name}.json")


def line_counts_file(output_dir: str) -> str:
    """The training files' line counts a task made (`lowlevel.data.spans.line_counts`)."""
    return os.path.join(output_dir, "line_counts.json")


def placement_file(output_dir: str) -> str:
    """`<output_dir>/placement.json`: the chief's variable placement (for the metrics)."""
    return os.path.join(output_dir, PLACEMENT)


def ensure_writable(output_dir: str) -> None:
    """Creates `output_dir` if needed and checks that a file can be written in it.

    Raises:
      UsageError: it cannot be created or written.
    """
    try:
        os.makedirs(output_dir, exist_ok=True)
        with tempfile.TemporaryFile(dir=output_dir):
            pass
    except OSError as e:
        raise UsageError(f"--output_dir={output_dir}: cannot write there ({e.strerror}); "
                         "give a writable directory") from None
