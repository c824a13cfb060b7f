"""Checkpoints in `--output_dir`: finding them and checking they fit the model.

A run on an `--output_dir` that holds a checkpoint resumes from it. If that
checkpoint was written by a different model (other `--model`,
`--hidden_units`, `--dataset` or optimizer), TensorFlow's restore fails deep
inside session creation with a long traceback; `check_compatible` finds the
mismatch before anything runs or is written, and names the variable.
"""

from __future__ import annotations

import os
from typing import Iterable, Optional

import tensorflow as tf

from lowlevel.config import UsageError


class CheckpointMismatch(UsageError):
    """The checkpoint in `--output_dir` does not fit the model being built."""


def latest(checkpoint_dir: Optional[str]) -> Optional[str]:
    """The path prefix of the newest checkpoint in `checkpoint_dir`, or None."""
    if not checkpoint_dir or not os.path.isdir(checkpoint_dir):
        return None
    return tf.train.latest_checkpoint(checkpoint_dir)


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
    variables = list(variables)
    for var in variables:  # shape and dtype first: they say most about what differs
        name, mine = var.op.name, var.shape.as_list()
        if name in shapes and list(shapes[name]) != mine:
            raise CheckpointMismatch(f"{where}: variable {name} has shape {list(shapes[name])} "
                                     f"there but {mine} in this model: {advice}")
        if name in dtypes and dtypes[name] != var.dtype.base_dtype:
            raise CheckpointMismatch(f"{where}: variable {name} is {dtypes[name].name} there "
                                     f"but {var.dtype.base_dtype.name} in this model: {advice}")
    for var in variables:
        if var.op.name not in shapes:
            raise CheckpointMismatch(f"{where} has no variable {var.op.name} (shape "
                                     f"{var.shape.as_list()} in this model): {advice}")
    return path
