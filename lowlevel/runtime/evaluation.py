"""Evaluating a model once, for every model: a built-in model on a whole split, a model_fn as
tensorflow_estimator 2.15's `Estimator.evaluate` does.

- A built-in model (`build`, `evaluate`): loss and accuracy over a whole split; for
  wide_deep also AUC and log loss. Its evaluation graph reuses the training model's
  variables (the `model/` scope is built with AUTO_REUSE), so on a worker it reads them
  from the ps tasks; the final evaluation is run by the chief after its last step
  (`FinalEvalHook`).
- A model_fn (`evaluate_model_fn(model, input_fn, steps, hooks, checkpoint_path, name)`,
  2.15's `Estimator.evaluate` core): the EVAL graph in a fresh `tf.Graph()` (2.15's
  `_evaluate_build_graph`: seed, global_step, input_fn and model_fn in EVAL mode, a
  `loss` metric = `tf.compat.v1.metrics.mean(loss)`, `global_step` added to the
  results), `checkpoint_path` restored (default: the latest in model_dir; none: the
  variables are initialised, as 2.15 logs), every metric's update op run `steps` times or
  until the input ends (OutOfRangeError), the metric values read once at the end (a
  FinalOpsHook), written as scalar summaries (and the checkpoint path as a text summary)
  to `<model_dir>/eval` or `<model_dir>/eval_<name>` at the checkpoint's global step, and
  returned: {"loss": np.float32, <metric>: value, "global_step": np.int64}. It logs to the
  'tensorflow' logger, as 2.15 does.

The evaluator task of every model, which runs these at each checkpoint, is `evaluator`.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Optional, Sequence

import numpy as np
import tensorflow as tf

from lowlevel.models import dynamic_embeddings, input_fns
from lowlevel.models import spec as spec_lib
from lowlevel.models import warm_start as warm_start_lib
from lowlevel.models.model_fn_model import ModelFnModel
from lowlevel.outputs import files

v1 = tf.compat.v1
tf_logging = tf.compat.v1.logging  # the 'tensorflow' logger, as tensorflow_estimator 2.15 logs


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


def eval_dir(model_dir: str, name: Optional[str] = None) -> str:
    """`<model_dir>/eval`, or `<model_dir>/eval_<name>` for a named evaluation."""
    return os.path.join(model_dir, "eval" if not name else "eval_" + name)


class StopAfterNEvalsHook(v1.train.SessionRunHook):
    """Stops an evaluation after `num_evals` update steps, logging "Evaluation [i/n]"."""

    def __init__(self, num_evals: int, evals_completed):
        self._num_evals = num_evals
        self._evals_completed = evals_completed
        self._log_every = max(num_evals // 10, 1)

    def before_run(self, run_context):
        """Fetches the number of evaluation steps done."""
        return v1.train.SessionRunArgs({"evals_completed": self._evals_completed})

    def after_run(self, run_context, run_values):
        """Requests the stop once `num_evals` steps are done."""
        done = run_values.results["evals_completed"]
        if done % self._log_every == 0 or done == self._num_evals:
            tf_logging.info("Evaluation [%d/%d]", done, self._num_evals)
        if done >= self._num_evals:
            run_context.request_stop()


def _eval_step():
    existing = v1.get_collection(v1.GraphKeys.EVAL_STEP)
    if existing:
        return existing[0]
    return v1.get_variable("eval_step", shape=[], dtype=tf.int64,
                           initializer=v1.zeros_initializer(), trainable=False,
                           collections=[v1.GraphKeys.LOCAL_VARIABLES, v1.GraphKeys.EVAL_STEP])


def _metric_ops(spec):
    metrics = dict(spec.eval_metric_ops)
    if spec_lib.LOSS_METRIC_KEY in metrics:
        raise ValueError('Metric with name "loss" is not allowed, because Estimator already '
                         "defines a default metric with the same name.")
    metrics[spec_lib.LOSS_METRIC_KEY] = v1.metrics.mean(spec.loss)
    update_ops, values = [], {}
    for name, value in sorted(metrics.items()):
        values[name] = value[0]
        update_ops.append(value[1])
    return tf.group(*update_ops), values


def build_eval_graph(model: ModelFnModel, input_fn, hooks: Sequence = (), checkpoint_path=None):
    """In the default graph: (scaffold, update_op, eval_dict, all_hooks) of one evaluation.

    eval_dict maps metric names, "loss" and "global_step" to value tensors;
    all_hooks are the input's, `hooks` and the spec's evaluation_hooks. Raises ValueError
    (2.15's messages) for a metric named "loss" or "global_step".
    """
    config = model.run_config
    v1.random.set_random_seed(config.tf_random_seed)
    v1.train.create_global_step(v1.get_default_graph())
    result = input_fns.call_input_fn(input_fn, spec_lib.ModeKeys.EVAL, model.params, config)
    features, labels, input_hooks = input_fns.features_and_labels(result)
    spec = spec_lib.call_model_fn(model.model_fn, features, labels, spec_lib.ModeKeys.EVAL,
                                  model.params, config)
    update_op, eval_dict = _metric_ops(spec)
    if not checkpoint_path and model.warm_start:
        warm_start_lib.warm_start(model.warm_start)
    if v1.GraphKeys.GLOBAL_STEP in eval_dict:
        raise ValueError("Metric with name `global_step` is not allowed, because Estimator "
                         "already defines a default metric with the same name.")
    eval_dict[v1.GraphKeys.GLOBAL_STEP] = v1.train.get_global_step()
    scaffold = spec.scaffold
    if scaffold.local_init_op is not None:
        _eval_step()
        scaffold = v1.train.Scaffold(
            local_init_op=tf.group(scaffold.local_init_op,
                                   v1.train.Scaffold.default_local_init_op()),
            copy_from_scaffold=scaffold)
    all_hooks = list(input_hooks) + list(hooks) + list(spec.evaluation_hooks)
    return scaffold, update_op, eval_dict, all_hooks


def _evaluate_once(checkpoint_path, config, scaffold, update_op, eval_dict, hooks, steps):
    """2.15's `evaluation._evaluate_once`: returns the final values of eval_dict."""
    eval_step = _eval_step()
    with tf.control_dependencies([update_op]):
        bump = v1.assign_add(eval_step, 1, use_locking=True)
    hooks = list(hooks)
    if steps is not None:
        hooks.append(StopAfterNEvalsHook(steps, bump))
    final = v1.train.FinalOpsHook(eval_dict)
    hooks.append(final)
    tf_logging.info("Starting evaluation at %s", time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()))
    start = time.time()
    creator = v1.train.ChiefSessionCreator(
        scaffold=scaffold, checkpoint_filename_with_path=checkpoint_path,
        master=config.evaluation_master, config=config.session_config)
    with v1.train.MonitoredSession(session_creator=creator, hooks=hooks) as session:
        while not session.should_stop():
            session.run([update_op, bump])
    tf_logging.info("Inference Time : %.5fs", time.time() - start)
    tf_logging.info("Finished evaluation at %s", time.strftime("%Y-%m-%d-%H:%M:%S", time.gmtime()))
    return final.final_ops_values


def evaluate_model_fn(model: ModelFnModel, input_fn, steps: Optional[int] = None,
                      hooks: Sequence = (), checkpoint_path: Optional[str] = None,
                      name: Optional[str] = None) -> dict:
    """Evaluates `model` on `input_fn`'s data; returns {metric: value, "loss", "global_step"}.

    steps: update steps to run (None: until the input's OutOfRangeError);
    ValueError "Must specify steps > 0, given: <steps>" otherwise. hooks:
    SessionRunHooks (checked by the caller). checkpoint_path: a checkpoint
    prefix, default the latest in `model.model_dir`. name: results go to
    `eval_<name>`. Values are numpy scalars (float32 metrics, int64 step).
    """
    if steps is not None and steps <= 0:
        raise ValueError(f"Must specify steps > 0, given: {steps}")
    if not checkpoint_path:
        checkpoint_path = tf.train.latest_checkpoint(model.model_dir)
        if not checkpoint_path:
            tf_logging.info("Could not find trained model in model_dir: %s, running "
                         "initialization to evaluate.", model.model_dir)
    with tf.Graph().as_default():
        scaffold, update_op, eval_dict, all_hooks = build_eval_graph(
            model, input_fn, hooks, checkpoint_path)
        results = _evaluate_once(checkpoint_path, model.run_config, scaffold, update_op,
                                 eval_dict, all_hooks, steps)
        step = results[v1.GraphKeys.GLOBAL_STEP]
        write_dict_to_summary(eval_dir(model.model_dir, name), results, step)
        if checkpoint_path:
            write_checkpoint_path_to_summary(eval_dir(model.model_dir, name),
                                             checkpoint_path, step)
    return results


def as_record(results: dict) -> dict:
    """`evaluate_model_fn`'s results with numpy scalars as Python numbers (for JSON)."""
    return {k: v.item() if hasattr(v, "item") else v for k, v in results.items()}


def _summary_value(summary, key, value):
    if isinstance(value, (np.float32, float)):
        summary.value.add(tag=key, simple_value=float(value))
    elif isinstance(value, (np.int64, np.int32, int)):
        summary.value.add(tag=key, simple_value=int(value))
    elif isinstance(value, bytes):
        try:
            parsed = v1.Summary.FromString(value)
        except Exception:  # noqa: BLE001 (protobuf's DecodeError; 2.15 skips it too)
            tf_logging.warning("Skipping summary for %s, cannot parse string to Summary.", key)
            return
        for i, item in enumerate(parsed.value):
            item.tag = "%s/%d" % (key, i)
        summary.value.extend(parsed.value)
    elif isinstance(value, np.ndarray):
        item = summary.value.add(tag=key, node_name=key)
        item.tensor.CopyFrom(tf.make_tensor_proto(value))
    else:
        tf_logging.warning("Skipping summary for %s, must be a float, np.float32, np.int64, "
                        "np.int32 or int or np.ndarray or a serialized string of Summary.", key)


def write_dict_to_summary(output_dir: str, dictionary: dict, global_step: int) -> None:
    """Writes eval results (except global_step) as summaries at `global_step`, as 2.15."""
    tf_logging.info("Saving dict for global step %d: %s", global_step, ", ".join(
        "%s = %s" % (k, v) for k, v in sorted(dictionary.items()) if not isinstance(v, bytes)))
    summary = v1.Summary()
    for key, value in dictionary.items():
        if value is not None and key != "global_step":
            _summary_value(summary, key, value)
    writer = files.event_writer(output_dir)  # never truncates another run's events
    writer.add_summary(summary, global_step)
    writer.flush()


def write_checkpoint_path_to_summary(output_dir: str, checkpoint_path: str,
                                     global_step: int) -> None:
    """Writes the evaluated checkpoint's path as a string-tensor summary `checkpoint_path`."""
    tf_logging.info("Saving 'checkpoint_path' summary for global step %d: %s", global_step,
                 checkpoint_path)
    summary = v1.Summary()
    summary.value.add(tag="checkpoint_path",
                      tensor=tf.make_tensor_proto(checkpoint_path, dtype=tf.string))
    writer = files.event_writer(output_dir)  # never truncates another run's events
    writer.add_summary(summary, global_step)
    writer.flush()
