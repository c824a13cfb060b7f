"""Evaluating a model: a built-in model on a whole split (loss and accuracy; for wide_deep
also AUC and log loss), and the evaluator task of every model.

The built-in model's evaluation graph reuses the training model's variables (the
`model/` scope is built with AUTO_REUSE), so on a worker it reads them from the ps
tasks; the final evaluation is run by the chief after its last step
(`FinalEvalHook`). The evaluator task (`continuous_eval`) is one loop for every model:
each checkpoint as it appears, evaluated by the trainable's pass (`BuiltinCheckpoints`;
a user's model_fn as `Estimator.evaluate` does, `ModelFnCheckpoints`), with the same
bounds on storage, records, metrics and exports.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time

import numpy as np
import tensorflow as tf
from absl import logging

from lowlevel import errors, output_layout
from lowlevel.config import TrainConfig
from lowlevel.models import catalogue as models
from lowlevel.models import dynamic_embeddings
from lowlevel.outputs import checkpoints, files
from lowlevel.runtime import faults, metrics

v1 = tf.compat.v1


@dataclasses.dataclass
class EvalOps:
    """Ops of one evaluation pass over a split, built into the current graph."""

    initializer: object
    feed: dict
    sum_loss: object   # float32 scalar: summed cross-entropy of the batch
    num_correct: object  # int64 scalar
    num_examples: object  # int32 scalar
    # Binary models (one logit per example): float32 `[b]` probabilities and int64 `[b]` labels.
    probabilities: object = None
    labels: object = None
    # Dynamic embedding tables: {shard scope: int64 scalar, its live rows} (empty without).
    live_rows: dict = dataclasses.field(default_factory=dict)


def build(data, split, model_fn) -> EvalOps:
    """Builds the evaluation of `model_fn` (inputs -> logits) on `split` of `data`, in batches
    of 1,000.

    `model_fn` must build the training model (`models.for_config`, with its
    partitioner), so that its variables are reused.
    """
    initializer, feed, (inputs, labels) = data.eval_input(split)
    with tf.name_scope("eval"), dynamic_embeddings.reading():  # no admission by test ids
        logits = model_fn(inputs)
        if logits.shape.rank == 1:  # one logit: sigmoid
            losses = tf.nn.sigmoid_cross_entropy_with_logits(
                labels=tf.cast(labels, tf.float32), logits=logits)
            correct = tf.equal(tf.cast(logits > 0, tf.int64), labels)
            binary = (tf.sigmoid(logits), labels)
        else:
            losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels,
                                                                    logits=logits)
            correct = tf.equal(tf.argmax(logits, axis=1), labels)
            binary = (None, None)
        return EvalOps(initializer, feed, tf.reduce_sum(losses),
                       tf.reduce_sum(tf.cast(correct, tf.int64)), tf.shape(labels)[0], *binary,
                       dynamic_embeddings.live_rows())


def evaluate(sess, ops: EvalOps) -> dict:
    """Runs one pass; returns {"loss": mean cross-entropy, "accuracy": fraction, "num_examples"}.

    For a binary model also "auc" (area under the ROC curve, exact, from every
    example's probability; scikit-learn's `roc_auc_score`) and "log_loss"
    (mean binary cross-entropy of the float32 probabilities, clipped to
    [1e-7, 1 - 1e-7], nats; "loss" is the same from the logits, unclipped). With
    dynamic embedding tables, "dynamic_rows": {shard scope: live rows} after the pass.
    """
    sess.run(ops.initializer, ops.feed)
    total_loss, correct, n = 0.0, 0, 0
    fetches = [ops.sum_loss, ops.num_correct, ops.num_examples]
    binary = ops.probabilities is not None
    if binary:
        fetches += [ops.probabilities, ops.labels]
    scores, truth = [], []
    while True:
        try:
            loss, c, b, *rest = sess.run(fetches)
        except tf.errors.OutOfRangeError:
            break
        total_loss, correct, n = total_loss + float(loss), correct + int(c), n + int(b)
        if binary:
            scores.append(rest[0])
            truth.append(rest[1])
    result = {"loss": total_loss / max(n, 1), "accuracy": correct / max(n, 1), "num_examples": n}
    if ops.live_rows:
        result["dynamic_rows"] = {k: int(v) for k, v in sess.run(ops.live_rows).items()}
    if binary and n:
        result.update(_binary_metrics(np.concatenate(truth), np.concatenate(scores)))
    return result


def _binary_metrics(labels: np.ndarray, probabilities: np.ndarray) -> dict:
    """{"auc", "log_loss"} of probabilities float `[N]` for labels {0, 1} `[N]`."""
    from sklearn.metrics import log_loss, roc_auc_score
    auc = (float(roc_auc_score(labels, probabilities)) if len(np.unique(labels)) == 2
           else None)  # undefined with one class
    return {"auc": auc, "log_loss": float(log_loss(labels, np.clip(probabilities, 1e-7,
                                                                   1 - 1e-7), labels=[0, 1]))}


class FinalEvalHook(v1.train.SessionRunHook):
    """Evaluates once, when the monitored session ends normally; result in `.result`.

    Skipped when `skip` is set (the task is being preempted: training is not over).
    """

    def __init__(self, ops: EvalOps, skip=None):
        self._ops = ops
        self._skip = skip
        self.result = None

    def end(self, session):
        if self._skip is None or not self._skip.is_set():
            self.result = evaluate(session, self._ops)


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
        record = dict(global_step=int(sess.run(global_step)), **evaluate(sess, ops),
                      split=self._split_name, checkpoint=os.path.basename(path))
        _bounded_io(lambda: _write_summaries(self._writer, record), self._eval_dir,
                    config.fault_timeout_secs, "writing the evaluation to",
                    "--fault_timeout_secs")
        return record


class ModelFnCheckpoints:
    """A user's model_fn at each checkpoint, evaluated as `Estimator.evaluate` does on its
    eval input_fn (`model_evaluation.evaluate`: its eval_metric_ops, `loss`,
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
        from lowlevel.runtime import model_evaluation
        try:
            result = _bounded_io(lambda: model_evaluation.evaluate(
                self._model, self._input_fn, checkpoint_path=path), path,
                self._config.fault_timeout_secs, "evaluating", "--fault_timeout_secs")
        except (errors.StorageTimeout, errors.ModelFnError):
            raise
        except (tf.errors.OpError, ValueError) as e:  # deleted meanwhile
            logging.warning("evaluator: skipping %s, which is gone or unreadable "
                            "(deleted by the chief's --keep_checkpoint_max?): %s",
                            path, getattr(e, "message", e))
            return None
        record = {k: v.item() if hasattr(v, "item") else v for k, v in result.items()}
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
        ops = build(data, split, models.for_config(config, data, local_shards=shards))
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
