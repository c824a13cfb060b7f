"""Checkpoints in `--output_dir`: finding them, reading them, checking they fit the model.

A run on an `--output_dir` that holds a checkpoint resumes from it. A
checkpoint whose files are truncated or missing (a disk that filled up, a copy
cut short) is skipped with a warning for the one before it (`newest_readable`),
rather than failing the run or starting it over. If the checkpoint
checkpoint was written by a different model (other `--model`,
`--hidden_units`, `--dataset` or optimizer), TensorFlow's restore fails deep
inside session creation with a long traceback; `check_compatible` finds the
mismatch before anything runs or is written, and names the variable.
"""

from __future__ import annotations

import os
import re
from typing import Iterable, Optional

import tensorflow as tf
from absl import logging

from lowlevel.config import RuntimeFailure

GLOBAL_STEP = "global_step"
_warned: set = set()  # unreadable checkpoints already reported by this process


class CheckpointMismatch(RuntimeFailure):
    """The checkpoint in `--output_dir` does not fit the model being built.

    A permanent failure (exit status 1, `exit_codes.FAILURE`): a restart finds
    the same checkpoint.
    """


def latest(checkpoint_dir: Optional[str]) -> Optional[str]:
    """The path prefix of the newest checkpoint in `checkpoint_dir`, or None."""
    if not checkpoint_dir or not os.path.isdir(checkpoint_dir):
        return None
    return tf.train.latest_checkpoint(checkpoint_dir)


class NoReadableCheckpoint(RuntimeFailure):
    """`--output_dir` lists checkpoints but none of them can be read."""


def all_checkpoints(checkpoint_dir: Optional[str]) -> list[str]:
    """Path prefixes of the checkpoints the `checkpoint` state file lists, oldest first."""
    if not checkpoint_dir or not os.path.isdir(checkpoint_dir):
        return []
    state = tf.train.get_checkpoint_state(checkpoint_dir)
    if state is None:
        return []
    paths = list(state.all_model_checkpoint_paths) or [state.model_checkpoint_path]
    if state.model_checkpoint_path and state.model_checkpoint_path not in paths:
        paths.append(state.model_checkpoint_path)
    return [p if os.path.isabs(p) else os.path.join(checkpoint_dir, p) for p in paths]


def read_step(path: str) -> int:
    """The global step stored in checkpoint `path`, reading every tensor on the way.

    Reading all of it (a checkpoint is read whole by a restore anyway) is what
    finds a data file cut short; the index alone can be intact.

    Raises:
      tf.errors.OpError, IndexError, ValueError, ...: the checkpoint is missing
        or unreadable (the reader's error depends on where the file is cut).
    """
    reader = tf.train.load_checkpoint(path)
    for name in reader.get_variable_to_shape_map():
        reader.get_tensor(name)
    return int(reader.get_tensor(GLOBAL_STEP))


def newest_readable(checkpoint_dir: Optional[str]) -> Optional[tuple[str, int]]:
    """(path prefix, global step) of the newest checkpoint that reads whole; None if none exist.

    Each newer checkpoint that fails to read is logged as a warning.

    Raises:
      NoReadableCheckpoint: checkpoints are listed but none can be read.
    """
    paths = all_checkpoints(checkpoint_dir)
    for path in reversed(paths):
        try:
            return path, read_step(path)
        except Exception as e:  # noqa: BLE001 - a cut-short file fails in many ways
            # (DataLossError, IndexError "Read less bytes than requested", ...)
            message = getattr(e, "message", None) or str(e)
            if path in _warned:
                continue
            _warned.add(path)
            logging.warning("checkpoint %s is unreadable (%s); trying the one before it",
                            os.path.basename(path), message.strip().splitlines()[0])
    if paths:
        raise NoReadableCheckpoint(
            f"--output_dir={checkpoint_dir}: none of its {len(paths)} checkpoint(s) can be "
            "read (truncated or missing files); move them away to start afresh")
    return None


class TrainingFinished(Exception):
    """The newest checkpoint has reached `--train_steps`: there is nothing left to train.

    Attributes:
      path: the checkpoint's path prefix.
      step: its global step.
    """

    def __init__(self, path: str, step: int):
        super().__init__(f"checkpoint {os.path.basename(path)} is at global step {step}")
        self.path, self.step = path, step


def check_finished(checkpoint_dir: Optional[str], train_steps: int) -> None:
    """Raises `TrainingFinished` if the newest readable checkpoint is at `train_steps` or beyond.

    Cheap when it is not (the step is first read from the checkpoint's name,
    "model.ckpt-<step>"), so waiting loops may call it every poll.
    """
    state = tf.train.get_checkpoint_state(checkpoint_dir) if checkpoint_dir and \
        os.path.isdir(checkpoint_dir) else None
    match = re.search(r"-(\d+)$", state.model_checkpoint_path) if state else None
    if not match or int(match.group(1)) < train_steps:
        return
    found = newest_readable(checkpoint_dir)
    if found and found[1] >= train_steps:
        raise TrainingFinished(*found)


def check_compatible(checkpoint_dir: Optional[str], variables: Iterable,
                     path: Optional[str] = None) -> Optional[str]:
    """Checks that checkpoint `path` (default: the newest) holds every variable, same shape and dtype.

    Args:
      checkpoint_dir: the `--output_dir`.
      variables: the `tf.Variable`s a restore would read (the saver's list).
      path: a checkpoint path prefix; None picks the newest in `checkpoint_dir`.

    Returns:
      The checkpoint's path prefix, or None when there is no checkpoint.

    Raises:
      CheckpointMismatch: a variable is missing from the checkpoint or has
        another shape or dtype; the message names it and both shapes.
    """
    path = path or latest(checkpoint_dir)
    if path is None:
        return None
    reader = tf.train.load_checkpoint(path)
    shapes = reader.get_variable_to_shape_map()
    dtypes = reader.get_variable_to_dtype_map()
    where = f"--output_dir={checkpoint_dir}: checkpoint {os.path.basename(path)}"
    advice = ("it was written by a different model; use a new --output_dir, or the "
              "--model/--hidden_units/--dataset/--optimizer of the run that wrote it")
    wanted = _logical(variables)
    for name, (mine, dtype) in wanted.items():  # shape and dtype first: they say most
        if name in shapes and list(shapes[name]) != mine:
            raise CheckpointMismatch(f"{where}: variable {name} has shape {list(shapes[name])} "
                                     f"there but {mine} in this model: {advice}")
        if name in dtypes and dtypes[name] != dtype:
            raise CheckpointMismatch(f"{where}: variable {name} is {dtypes[name].name} there "
                                     f"but {dtype.name} in this model: {advice}")
    for name, (mine, _) in wanted.items():
        if name not in shapes:
            raise CheckpointMismatch(f"{where} has no variable {name} (shape {mine} in this "
                                     f"model): {advice}")
    return path


def _logical(variables) -> dict:
    """{name in checkpoints: (shape, dtype)}; a sharded variable's shards count as one."""
    found = {}
    for var in variables:
        info = getattr(var, "_save_slice_info", None)
        if info is not None:
            found[info.full_name] = (list(info.full_shape), var.dtype.base_dtype)
        else:
            found[var.op.name] = (var.shape.as_list(), var.dtype.base_dtype)
    return found
