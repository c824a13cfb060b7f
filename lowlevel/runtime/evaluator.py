"""The evaluator task of every model: each checkpoint as it appears, until that of the last step.

One loop (`continuous_eval`) for every model, its checkpoint's pass given by the trainable
(`trainables`): a built-in model on a split in one graph and session built at the first
checkpoint (`BuiltinCheckpoints`), a user's model_fn as `Estimator.evaluate` does
(`ModelFnCheckpoints`). Around it, for both: every wait for a checkpoint and every read and
write of the output directory bounded (`_bounded_io`: a hung network file system ends the
evaluator with a line), a checkpoint deleted under it skipped, records
(`eval_metrics.json`), metrics (`metrics.evaluated`), log lines and exports.
"""

from __future__ import annotations

import contextlib
import json
import os
import time

import tensorflow as tf
from absl import logging

from lowlevel import errors, output_layout
from lowlevel.config import TrainConfig
from lowlevel.models import catalogue as models
from lowlevel.models import dynamic_embeddings
from lowlevel.outputs import checkpoints, files
from lowlevel.runtime import evaluation, faults, metrics

v1 = tf.compat.v1


def continuous_eval(config: TrainConfig, trainable, on_train_data: bool = False,
                    session_config=None) -> dict:
    """Evaluates each new checkpoint in `config.output_dir` until that of the final step, for
    every model: one evaluator, its checkpoint's pass given by the trainable
    (`trainables.Builtin.checkpoint_evaluation`: `BuiltinCheckpoints`, `ModelFnCheckpoints`).

    The evaluator runs in its own process with no server: it reads checkpoint
    files, so it never holds up training. `tf.compat.v1.train.checkpoints_iterator`
    yields a checkpoint only once the chief's Saver has recorded it in the
    `checkpoint` state file, which it writes after the data files, so a
    half-written checkpoint is never read; one deleted by the chief's
    `--keep_checkpoint_max` before it is read is skipped with a warning.

    Per checkpoint it appends a record to `eval_metrics.json` under
    `<output_dir>/eval/` (`eval_train/` for a built-in model's training split):
    global_step, the metrics, split, checkpoint; reports it (`metrics.evaluated`) and
    logs it; the pass writes the metrics as summaries there. With
    `config.export_every_checkpoint` it also exports each checkpoint
    (`trainable.export`: a built-in model's SavedModel). Every read and write of
    `config.output_dir` is bounded (`_bounded_io`).

    Returns:
      The record of the checkpoint whose global_step is >= `config.train_steps`.

    Raises:
      errors.EvalTimeout: no new checkpoint for `config.eval_timeout_secs` seconds.
      errors.StorageTimeout: a read or write in `config.output_dir` did not complete in time.
      errors.CheckpointMismatch: a checkpoint of another model.
      errors.ModelFnError: a user's model_fn or input_fn failed.
    """
    records_path = output_layout.eval_records(config.output_dir, on_train_data)
    os.makedirs(os.path.dirname(records_path), exist_ok=True)
    records = _read_records(records_path)
    with trainable.checkpoint_evaluation(config, on_train_data, session_config) as evaluate_at:
        logging.info("evaluator: watching %s for checkpoints; evaluating %s until global "
                     "step %d", config.output_dir, evaluate_at.what, config.train_steps)
        for path in _checkpoints(config):
            record = evaluate_at(path)
            if record is None:  # gone or unreadable
                continue
            records = _keep(record, records, records_path, config)
            if config.export_every_checkpoint and config.keep_exports:
                _bounded_io(lambda: _export(path, config, trainable), path,
                            config.fault_timeout_secs, "exporting", "--fault_timeout_secs")
            if record["global_step"] >= config.train_steps:
                return record
    raise _no_final_checkpoint(config)


class BuiltinCheckpoints:
    """A built-in model's pass over a split at each checkpoint (`build`, `evaluate`): its
    graph and session made once, at the first checkpoint (`_built_at`: dynamic tables need
    its number of shards), each checkpoint restored into them; `loss` and `accuracy`
    (binary models: also `auc` and `log_loss`) written as summaries to
    `<output_dir>/eval/` (`eval_train/` for the training split). A context manager: the
    session and the summary writer close at its end.
    """

    def __init__(self, config: TrainConfig, data, on_train_data: bool = False,
                 session_config=None):
        self._config, self._data, self._session_config = config, data, session_config
        self._split_name, self._split = (("train", data.train) if on_train_data
                                         else ("test", data.test))
        self.what = (f"the {self._split_name} split (" +
                     (getattr(self._split, "description", None) or
                      f"{len(self._split)} examples") + ")")
        self._eval_dir = output_layout.eval_dir(config.output_dir, on_train_data)
        self._stack = contextlib.ExitStack()
        self._built = None
        self._writer = None

    def __enter__(self):
        os.makedirs(self._eval_dir, exist_ok=True)
        self._writer = v1.summary.FileWriter(self._eval_dir, graph=None)
        return self

    def __exit__(self, *exc):
        self._stack.close()
        _bounded_io(self._writer.close, self._eval_dir, self._config.fault_timeout_secs,
                    "closing the summaries in", "--fault_timeout_secs")

    def __call__(self, path: str):
        """The record of checkpoint `path`, or None if it is gone or unreadable."""
        config = self._config
        self._built = self._built or _built_at(path, self._stack, config, self._data,
                                               self._split, self._session_config)
        _, global_step, ops, variables, saver, sess = self._built
        if not _restored(saver, sess, config, variables, path):
            return None
        record = dict(global_step=int(sess.run(global_step)), **evaluation.evaluate(sess, ops),
                      split=self._split_name, checkpoint=os.path.basename(path))
        _bounded_io(lambda: _write_summaries(self._writer, record), self._eval_dir,
                    config.fault_timeout_secs, "writing the evaluation to",
                    "--fault_timeout_secs")
        return record


class ModelFnCheckpoints:
    """A user's model_fn at each checkpoint, evaluated as `Estimator.evaluate` does on its
    eval input_fn (`evaluation.evaluate_model_fn`: its eval_metric_ops, `loss`,
    `global_step`; its summaries in `<output_dir>/eval/`). A context manager (nothing to
    close).
    """

    what = "the eval input_fn"

    def __init__(self, config: TrainConfig, model, eval_input_fn):
        self._config, self._model, self._input_fn = config, model, eval_input_fn

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def __call__(self, path: str):
        """The record of checkpoint `path`, or None if it is gone or unreadable."""
        try:
            result = _bounded_io(lambda: evaluation.evaluate_model_fn(
                self._model, self._input_fn, checkpoint_path=path), path,
                self._config.fault_timeout_secs, "evaluating", "--fault_timeout_secs")
        except (errors.StorageTimeout, errors.ModelFnError):
            raise
        except (tf.errors.OpError, ValueError) as e:  # deleted meanwhile
            logging.warning("evaluator: skipping %s, which is gone or unreadable "
                            "(deleted by the chief's --keep_checkpoint_max?): %s",
                            path, getattr(e, "message", e))
            return None
        record = evaluation.as_record(result)
        record.update(split="eval", checkpoint=os.path.basename(path))
        return record


def _no_final_checkpoint(config: TrainConfig) -> errors.EvalTimeout:
    """The evaluator's error when the final checkpoint did not come in time."""
    return errors.EvalTimeout(
        f"evaluator: no new checkpoint in {config.output_dir} for {config.eval_timeout_secs:g} "
        f"s (--eval_timeout_secs) before the one of global step {config.train_steps}: is the "
        "chief running?")


def _bounded_io(io, what: str, limit_secs: float, doing: str, flag: str):
    """`io()`, abandoned (`faults.abandonable`) after `limit_secs` with `errors.StorageTimeout`.

    A read or write on a network file system whose server stopped answering
    blocks in the kernel with no deadline (a hard NFS mount: forever); the
    evaluator then exits 200 naming what it was doing instead of hanging.
    """
    deadline = time.monotonic() + limit_secs

    def guard():
        if time.monotonic() >= deadline:
            logging.error("evaluator: %s %s did not complete within %g s (%s)", doing, what,
                          limit_secs, flag)
            raise errors.StorageTimeout(
                f"evaluator: {doing} {what} did not complete within {limit_secs:g} s ({flag}): "
                "is the storage under --output_dir answering?")
    return faults.abandonable(io, guard, "checkpoint_io")


def _checkpoints(config: TrainConfig):
    """Each new checkpoint's path, as `checkpoints_iterator` yields them, each wait bounded by
    `--eval_timeout_secs` + `--fault_timeout_secs` (I/O on storage that stops answering
    blocks with no deadline)."""
    found = v1.train.checkpoints_iterator(config.output_dir, timeout=config.eval_timeout_secs)
    wait_secs = config.eval_timeout_secs + config.fault_timeout_secs
    while True:
        path = _bounded_io(lambda: next(found, None), config.output_dir, wait_secs,
                           "waiting for a checkpoint in",
                           "--eval_timeout_secs + --fault_timeout_secs")
        if path is None:
            return
        yield path


def _built_at(path: str, stack: contextlib.ExitStack, config: TrainConfig, data, split,
              session_config) -> tuple:
    """`_eval_graph`'s tuple and a session on it (closed with `stack`), built for the first
    checkpoint, `path`: dynamic tables get as many shards as the ps tasks that wrote it."""
    def shards() -> int:
        if config.embedding != "dynamic":
            return 0
        _read_index(path)  # a hang shows here, not in the reader holding the GIL
        return dynamic_embeddings.shards_in(path)
    count = _bounded_io(shards, path, config.fault_timeout_secs, "reading",
                        "--fault_timeout_secs")
    built = _eval_graph(config, data, split, count)
    return (*built, stack.enter_context(v1.Session(graph=built[0], config=session_config)))


def _eval_graph(config: TrainConfig, data, split, shards: int = 0):
    """(graph, global_step, eval ops, variables, their saver): the evaluator's finalised graph,
    its dynamic tables (if any) in `shards` shards in this process (0: one)."""
    graph = tf.Graph()
    with graph.as_default():
        global_step = v1.train.get_or_create_global_step()
        ops = evaluation.build(data, split, models.for_config(config, data, local_shards=shards))
        # the checkpoint's names (dynamic embedding shards: their snapshots)
        variables = checkpoints.saved_names(graph.get_collection(v1.GraphKeys.GLOBAL_VARIABLES))
        saver = v1.train.Saver(variables)
        graph.finalize()
    return graph, global_step, ops, variables, saver


def _restored(saver, sess, config: TrainConfig, variables, path: str) -> bool:
    """Restores checkpoint `path` (bounded by `--fault_timeout_secs`); False, with a warning,
    when it is gone or unreadable (deleted by the chief's `--keep_checkpoint_max`).

    Raises:
      errors.CheckpointMismatch: a checkpoint of another model.
      errors.StorageTimeout: the read did not complete in time.
    """
    try:
        _bounded_io(lambda: _restore(saver, sess, config.output_dir, variables, path), path,
                    config.fault_timeout_secs, "reading", "--fault_timeout_secs")
        return True
    except (errors.CheckpointMismatch, errors.StorageTimeout):
        raise
    except Exception as e:  # noqa: BLE001 - deleted, or cut short: skip it
        logging.warning("evaluator: skipping %s, which is gone or unreadable "
                        "(deleted by the chief's --keep_checkpoint_max?): %s",
                        path, getattr(e, "message", e))
        return False


def _restore(saver, sess, output_dir: str, variables, path: str) -> None:
    """Checks that checkpoint `path` is of this model, then restores it into `sess`.

    TensorFlow's checkpoint reader (`check_compatible`) holds Python's GIL while
    it opens the index: blocked there on storage that stopped answering, it would
    stop every thread of the process, the one bounding it too. So the index is
    read first through `tf.io.gfile`, which lets go of the GIL: a hang shows
    there (measured: a FIFO as the index, tests/test_storage.py); the reader then
    finds it in the page cache.
    """
    _read_index(path)
    checkpoints.check_compatible(output_dir, variables, path)
    saver.restore(sess, path)


def _read_index(path: str) -> None:
    """Reads checkpoint `path`'s index through `tf.io.gfile` (which lets go of the GIL)."""
    index = path + ".index"
    if tf.io.gfile.exists(index):
        with tf.io.gfile.GFile(index, "rb") as f:
            f.read()


def _write_summaries(writer, record: dict) -> None:
    """Writes a built-in model's `record` as scalar summaries at its global step."""
    writer.add_summary(v1.Summary(value=[
        v1.Summary.Value(tag=tag, simple_value=record[tag])
        for tag in ("loss", "accuracy", "auc", "log_loss") if record.get(tag) is not None]),
        record["global_step"])
    writer.flush()


def _keep(record: dict, records: list, records_path: str, config: TrainConfig) -> list:
    """Writes one checkpoint's `record` into `eval_metrics.json` (bounded by
    `--fault_timeout_secs`), reports and logs it; returns the records with this one in
    (replacing an older one of its step)."""
    step = record["global_step"]
    records = [r for r in records if r["global_step"] != step] + [record]
    _bounded_io(lambda: _write_records(records_path, records),
                os.path.dirname(records_path), config.fault_timeout_secs,
                "writing the evaluation to", "--fault_timeout_secs")
    metrics.evaluated(record)
    logging.info("evaluator: step %d | %s | %s", step, record["split"], " | ".join(
        f"{k} {v:.4f}" for k, v in record.items() if isinstance(v, float)))
    return records


def _export(path: str, config: TrainConfig, trainable) -> None:
    """`--export_every_checkpoint`: exports checkpoint `path` (`trainable.export`); one it
    cannot read is skipped."""
    try:
        trainable.export(path, config)
    except (tf.errors.OpError, ValueError) as e:  # deleted meanwhile (--keep_checkpoint_max)
        logging.warning("evaluator: could not export %s (deleted by the chief's "
                        "--keep_checkpoint_max?): %s", os.path.basename(path),
                        getattr(e, "message", e))


def _read_records(path: str) -> list:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return []


def _write_records(path: str, records: list) -> None:
    files.write_json(path, sorted(records, key=lambda r: r["global_step"]))
