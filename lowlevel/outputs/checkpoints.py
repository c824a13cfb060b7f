"""Checkpoints in `--output_dir`: finding them, reading them, checking they fit the model.

A run on an `--output_dir` that holds a checkpoint resumes from it. A
checkpoint whose files are truncated or missing (a disk that filled up, a copy
cut short) is skipped with a warning for the one before it (`newest_readable`),
rather than failing the run or starting it over. If the checkpoint
checkpoint was written by a different model (other `--model`,
`--hidden_units`, `--dataset` or optimizer), TensorFlow's restore fails deep
inside session creation with a long traceback; `check_compatible` finds the
mismatch before anything runs or is written, and names the variable.

Checkpoints are portable between the modes and cluster shapes: every mode
saves the same names (`saved_names`; a variable sharded over the ps tasks is
saved as one logical tensor, the communication-reduced mode saves the
chief's optimizer slots under the names the exact mode uses), so a
checkpoint of one mode restores in any other, with any number of ps tasks or
workers, or in one process. What a checkpoint may lack is the optimizer's
state (a checkpoint from before the communication-reduced mode saved its
slots): that starts fresh, with one warning line naming it
(`PartialRestore`); a missing model variable, or another shape, is still an
error.
"""

from __future__ import annotations

import os
import re
import time
from typing import Iterable, Optional

import numpy as np
import tensorflow as tf
from absl import logging

# `Saver.save` accepts only a `SessionInterface` (no public name in TensorFlow 2).
from tensorflow.python.client import session as tf_session

from lowlevel import errors
from lowlevel.errors import CheckpointMismatch, NoReadableCheckpoint
from lowlevel.data import spans
from lowlevel.models import dynamic_embeddings
from lowlevel.outputs import chunked_save

v1 = tf.compat.v1

GLOBAL_STEP = "global_step"
# Graph collection of a model's `SaveableObject`s other than variables that the runtime's
# saver writes too (`saved_names`): LinearSDCA's per-example state tables. (The stock
# `Saver` takes every SAVEABLE_OBJECTS entry; the runtime's names what it saves.)
EXTRA_SAVEABLES = "lowlevel_extra_saveables"
_warned: set = set()  # unreadable checkpoints already reported by this process


def latest(checkpoint_dir: Optional[str]) -> Optional[str]:
    """The path prefix of the newest checkpoint in `checkpoint_dir`, or None."""
    if not checkpoint_dir or not os.path.isdir(checkpoint_dir):
        return None
    return tf.train.latest_checkpoint(checkpoint_dir)


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


def step_of(path: str) -> Optional[int]:
    """The global step in a checkpoint's name ("dir/model.ckpt-1200" -> 1200; the step
    `Saver.save(global_step=...)` appends), or None for a name without one."""
    tail = path.rpartition("-")[2]
    return int(tail) if tail.isdigit() else None


WHOLE_READ_MAX_BYTES = 64 << 20  # `read_step` reads tensors up to this size


def read_step(path: str) -> int:
    """The global step stored in checkpoint `path`, after checking that it reads whole.

    Every tensor of up to `WHOLE_READ_MAX_BYTES` is read (its checksum
    checked). Larger ones (an embedding table: 6.4 GB at 100 M rows x 16)
    are not loaded into this process; the data files must hold at least the
    bytes the index gives all numeric tensors, which a data file cut short
    (a full disk) does not.

    Raises:
      tf.errors.OpError, IndexError, ValueError, ...: the checkpoint is missing
        or unreadable (the reader's error depends on where the file is cut).
    """
    reader = tf.train.load_checkpoint(path)
    dtypes = reader.get_variable_to_dtype_map()
    declared = 0
    for name, shape in reader.get_variable_to_shape_map().items():
        dtype = tf.as_dtype(dtypes[name])
        nbytes = 0 if dtype == tf.string else int(np.prod(shape, dtype=np.int64)) * dtype.size
        declared += nbytes
        if nbytes <= WHOLE_READ_MAX_BYTES:
            reader.get_tensor(name)
    _check_data_files(path, declared)
    return int(reader.get_tensor(GLOBAL_STEP))


def _check_data_files(path: str, declared: int) -> None:
    """Raises ValueError if `path`'s data files are missing or hold under `declared` bytes."""
    files = tf.io.gfile.glob(f"{path}.data-*-of-*")
    expected = int(files[0].rpartition("-of-")[2]) if files else 1
    held = sum(tf.io.gfile.stat(f).length for f in files)
    if len(files) != expected or held < declared:
        raise ValueError(f"its {len(files)} of {expected} data file(s) hold {held} bytes, "
                         f"its tensors {declared}")


def newest_readable(checkpoint_dir: Optional[str]) -> Optional[tuple[str, int]]:
    """(path prefix, global step) of the newest checkpoint that reads whole; None if none exist.

    Each newer checkpoint that fails to read is logged as a warning. A chief
    saving meanwhile rewrites the listing and deletes the oldest files (a
    worker starting beside it reads them mid-change), so when none reads the
    listing is read again, after `RELIST_SECS`, and checked anew if it changed.

    Raises:
      NoReadableCheckpoint: checkpoints are listed but none can be read, the
        listing unchanged over `RELIST_SECS` seconds.
    """
    paths = all_checkpoints(checkpoint_dir)
    while True:
        for path in reversed(paths):
            try:
                return path, read_step(path)
            except Exception as e:  # noqa: BLE001 - a cut-short file fails in many ways
                _warn_unreadable(path, e)  # (DataLossError, IndexError "Read less bytes", ...)
        if not paths:
            return None
        time.sleep(RELIST_SECS)
        relisted = all_checkpoints(checkpoint_dir)
        if relisted == paths:
            raise NoReadableCheckpoint(
                f"--output_dir={checkpoint_dir}: none of its {len(paths)} checkpoint(s) can be "
                "read (truncated or missing files); move them away to start afresh")
        paths = relisted


RELIST_SECS = 1.0  # `newest_readable`'s wait before reading the listing again


def _warn_unreadable(path: str, error: Exception) -> None:
    """One warning per process for unreadable checkpoint `path`."""
    if path in _warned:
        return
    _warned.add(path)
    message = getattr(error, "message", None) or str(error)
    logging.warning("checkpoint %s is unreadable (%s); trying the one before it",
                    os.path.basename(path), message.strip().splitlines()[0])


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
        raise errors.TrainingFinished(*found)


def check_compatible(checkpoint_dir: Optional[str], variables, path: Optional[str] = None,
                     optional: Iterable[str] = ()) -> Optional[str]:
    """Checks that checkpoint `path` (default: the newest) holds every variable, same shape and dtype.

    Args:
      checkpoint_dir: the `--output_dir`.
      variables: the `tf.Variable`s a restore would read (the saver's list),
        or the saver's {name in checkpoints: variable or list of shards}.
      path: a checkpoint path prefix; None picks the newest in `checkpoint_dir`.
      optional: names a restore may do without (the optimizer's state, see
        `PartialRestore`), provided the checkpoint holds nothing this model
        lacks (which would be the state of another optimizer or model).

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
        if _queue_resized(name, shapes, mine):
            continue  # the training files changed: a fresh data queue (`missing_names`)
        if name in shapes and mine is not None and list(shapes[name]) != mine:
            raise CheckpointMismatch(f"{where}: variable {name} has shape {list(shapes[name])} "
                                     f"there but {mine} in this model: {advice}")
        if name in dtypes and dtypes[name] != dtype:
            raise CheckpointMismatch(f"{where}: variable {name} is {dtypes[name].name} there "
                                     f"but {dtype.name} in this model: {advice}")
    optional = set(optional)
    foreign = set(shapes) - set(wanted)
    _check_dynamic_shards(foreign, shapes, where)
    for name, (mine, _) in wanted.items():
        if name not in shapes and (name not in optional or foreign):
            raise CheckpointMismatch(f"{where} has no variable {name} (shape {mine} in this "
                                     f"model): {advice}")
    return path


def _check_dynamic_shards(foreign, names, where: str) -> None:
    """Raises `CheckpointMismatch` if the checkpoint holds dynamic embedding shards this
    model lacks: a restore would leave their rows out, silently (a table restores with the
    same number of ps tasks only; `dynamic_embeddings`)."""
    extra = sorted(n for n in foreign if re.search(r"/shard\d+/-keys$", n))
    if not extra:
        return
    shards = max(int(re.search(r"/shard(\d+)/-keys$", n).group(1)) for n in names
                 if re.search(r"/shard\d+/-keys$", n)) + 1
    raise CheckpointMismatch(
        f"{where} holds dynamic embedding tables in {shards} shards (written by {shards} ps "
        f"tasks), and this model has fewer ({extra[0].rpartition('/-')[0]} is not in it): a "
        f"dynamic table restores with the same number of ps tasks only; run with "
        f"--num_ps={shards}, or use a new --output_dir")


def missing_names(path: str, variables) -> list[str]:
    """Names (in checkpoints) of `variables` (a list, or a saver's dict) that checkpoint
    `path` lacks; and every data queue name if it holds the queue of another number of
    files (`_queue_resized`)."""
    shapes = tf.train.load_checkpoint(path).get_variable_to_shape_map()
    logical = _logical(variables)
    resized = any(_queue_resized(name, shapes, mine) for name, (mine, _) in logical.items())
    return sorted(name for name in logical if name not in shapes or (
        resized and name.startswith(spans.SCOPE + "/")))  # the whole queue afresh


def _queue_resized(name: str, shapes: dict, mine) -> bool:
    """Whether `name` is data queue state (`lowlevel.data.spans`) the checkpoint holds with
    another shape: the training files (or, with --count_examples, their lines) changed
    since, and the queue starts afresh instead of failing the restore."""
    return (name.startswith(spans.SCOPE + "/") and name in shapes and mine is not None
            and list(shapes[name]) != list(mine))


def saved_names(variables, renamed: Optional[dict] = None) -> dict:
    """The var_list of a `Saver` that writes `variables` under their checkpoint names.

    A sharded variable's shards go under the whole variable's name (as the
    default `Saver` does); each variable in `renamed` ({name: variable})
    under the name given there instead of its own. The default graph's dynamic
    embedding shards are saved by their snapshots (`ShardSaveable`, under the
    shard's scope name), their state variables not by themselves; its
    `EXTRA_SAVEABLES` under their names.

    Returns:
      {name in checkpoints: variable, or the list of a sharded variable's shards}.
    """
    renamed = dict(renamed or {})
    taken = {id(v) for v in renamed.values()}
    names: dict = {shard.name: shard for shard in dynamic_embeddings.saveables()}
    names.update({saveable.name: saveable for saveable in v1.get_collection(EXTRA_SAVEABLES)})
    for var in dynamic_embeddings.variables_to_save(variables):
        if id(var) in taken:
            continue
        info = getattr(var, "_save_slice_info", None)
        if info is not None:
            names.setdefault(info.full_name, []).append(var)
        else:
            names[var.op.name] = var
    names.update(renamed)
    return names


class StateSaver(v1.train.Saver):
    """A `Saver` that first runs `before_save` (an op, e.g. copying worker-local state to
    the ps; or a callable of the session), and `after_save` (an op or a callable of the
    session) once the save ended, written or not.

    Sharded saves write large variables a slice at a time, without a full-size
    copy (`chunked_save.ChunkedSaverBuilder`, unless `builder` is given).

    The communication-reduced mode keeps its optimizer slots on each worker;
    `before_save` copies the chief's to the variables this saver writes. Training from
    the data queue pauses around a save (a consistent cut): sync, its steps' completion
    (`lowlevel.modes.elastic_sync`); async, the steps' start, once those begun have
    committed (`lowlevel.data.spans.SaveHold`).

    `timeout_secs` (or `save(..., timeout_secs=T)`) gives each run of a save
    and of a restore a deadline of that many seconds instead of the session's
    `operation_timeout_in_ms` (`--step_timeout_secs`): at 100 M rows a save
    writes 13.6 GB (24-60 s at this machine's 450 MB/s) and a restore reads
    it (~75 s), and a step's 60 s cancelled both (measured, benchmarks/NOTES.md).
    """

    def __init__(self, var_list, before_save=None, timeout_secs: Optional[float] = None,
                 after_save=None, **kwargs):
        kwargs.setdefault("builder", chunked_save.ChunkedSaverBuilder())
        super().__init__(var_list, **kwargs)
        self._before_save, self._after_save = before_save, after_save
        self.timeout_secs = timeout_secs

    def save(self, sess, *args, timeout_secs: Optional[float] = None, **kwargs):
        timeout_secs = timeout_secs or self.timeout_secs
        if timeout_secs is not None:
            sess = _WithDeadline(sess, timeout_secs)
        _run_op_or_call(sess, self._before_save)  # e.g. a wait (`spans.SaveHold.before`)
        try:
            return super().save(sess, *args, **kwargs)
        finally:
            _run_op_or_call(sess, self._after_save)

    def lift(self, sess) -> None:
        """Runs `after_save` outside a save: a chief's new session lifts the
        pause a save of its predecessor left, killed mid-save (else the workers would
        wait out the pause's deadline, the save's: 110 s for a 1 GB state, measured as a
        73 s stall in benchmarks/NOTES.md). No save of this process is under way then."""
        _run_op_or_call(sess, self._after_save)

    def restore(self, sess, save_path):
        if self.timeout_secs is not None:
            sess = _WithDeadline(sess, self.timeout_secs)
        return super().restore(sess, save_path)


def _run_op_or_call(sess, what) -> None:
    """Runs `what` in `sess`: an op, or a callable of the session (a wait; a resume, then a
    completion: `elastic_sync.InTurn`); None does nothing."""
    if callable(what):
        what(sess)
    elif what is not None:
        sess.run(what)


class WorkerSaver(v1.train.Saver):
    """The saver of a training task that is not the chief: it builds no ops, and `save` and
    `restore` raise RuntimeError.

    Only the chief saves (`hooks.CheckpointHook`, its emergency save) and restores (its
    session creator); a worker's session waits for the model the chief made ready. A
    `Scaffold` needs a saver all the same, and a `StateSaver` of every variable builds a
    save and a restore op per variable: 10-16 % of a wide_deep worker's graph build, paid at
    every worker's start, restart and join (benchmarks/NOTES.md, twenty-seventh stop).

    `timeout_secs`: the chief's save deadline, which a worker's session creator reads too.
    """

    def __init__(self, timeout_secs: Optional[float] = None):
        super().__init__(defer_build=True)
        self.timeout_secs = timeout_secs

    def build(self):  # `Scaffold.finalize` calls it: nothing to build
        return None

    def save(self, *args, **kwargs):
        raise RuntimeError("a worker that is not the chief does not save checkpoints")

    def restore(self, *args, **kwargs):
        raise RuntimeError("a worker that is not the chief does not restore checkpoints")


class _WithDeadline(tf_session.SessionInterface):
    """`sess` whose runs without `options` get a deadline of `timeout_secs`."""

    def __init__(self, sess, timeout_secs: float):
        self._sess = sess
        self._options = v1.RunOptions(timeout_in_ms=max(1, int(timeout_secs * 1000)))

    @property
    def graph(self):
        return self._sess.graph

    @property
    def sess_str(self):
        return self._sess.sess_str

    def run(self, fetches, feed_dict=None, options=None, run_metadata=None):
        return self._sess.run(fetches, feed_dict, options or self._options, run_metadata)

    def partial_run_setup(self, fetches, feeds=None):
        return self._sess.partial_run_setup(fetches, feeds)

    def partial_run(self, handle, fetches, feed_dict=None):
        return self._sess.partial_run(handle, fetches, feed_dict)


class PartialRestore:
    """Restores a checkpoint that lacks some optimizer state (or the data queue,
    `lowlevel.data.spans`): the rest from it, that fresh.

    Build it (in the training graph, before the session is created) when
    `missing_names` finds names that `check_compatible` allowed as optional;
    it logs one warning line naming them. The chief's session creator then
    initialises every variable and calls `restore`, which reads from the
    checkpoint all the variables it holds.

    `timeout_secs`: the restore's deadline (`StateSaver`), None: the session's.

    Attributes:
      path: the checkpoint's path prefix.
      missing: the names it lacks, which start from their initial values.
    """

    def __init__(self, path: str, names: dict, missing: Iterable[str],
                 timeout_secs: Optional[float] = None):
        self.path, self.missing = path, sorted(missing)
        present = {k: v for k, v in names.items() if k not in set(self.missing)}
        self._saver = StateSaver(present, sharded=True, timeout_secs=timeout_secs)
        queue = [n for n in self.missing if n.startswith(spans.SCOPE + "/")]
        if queue:
            logging.warning(
                "checkpoint %s has no data queue for these training files (written with "
                "--data_sharding=static, before the queue existed, or with other "
                "--train_files): resuming with a fresh queue, every span unread",
                os.path.basename(path))
        # the sync step state (`elastic_sync`): nothing to restore, it starts afresh anyway
        optimizer = [n for n in self.missing if n not in queue and
                     not n.startswith("sync_queue/")]
        if optimizer:
            logging.warning(
                "checkpoint %s holds no optimizer state for %d variable(s) (%s): restoring "
                "the model and global_step from it; the optimizer's state starts fresh",
                os.path.basename(path), len(optimizer), ", ".join(optimizer))

    def restore(self, sess) -> None:
        """Restores what the checkpoint holds (after the init op has run)."""
        self._saver.restore(sess, self.path)


def _logical(variables) -> dict:
    """{name in checkpoints: (shape, dtype)}; a sharded variable's shards count as one."""
    if isinstance(variables, dict):
        found = {}
        for name, var in variables.items():
            if hasattr(var, "specs"):  # a SaveableObject (a dynamic shard, a table): its parts
                found.update({spec.name: (None, spec.dtype) for spec in var.specs})
                continue
            first = var[0] if isinstance(var, (list, tuple)) else var
            info = getattr(first, "_save_slice_info", None)
            shape = list(info.full_shape) if info is not None else first.shape.as_list()
            found[name] = (shape, first.dtype.base_dtype)
        return found
    found = {}
    for var in variables:
        info = getattr(var, "_save_slice_info", None)
        if info is not None:
            found[info.full_name] = (list(info.full_shape), var.dtype.base_dtype)
        else:
            found[var.op.name] = (var.shape.as_list(), var.dtype.base_dtype)
    return found
