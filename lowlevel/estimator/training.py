"""`TrainSpec`, `EvalSpec` and `train_and_evaluate` (tensorflow_estimator 2.15 `training.py`).

Locally (no cluster in TF_CONFIG, not an evaluator) `train_and_evaluate` is
2.15's `_TrainingExecutor.run_local`: ONE `estimator.train(train_spec.input_fn,
max_steps=train_spec.max_steps, hooks=train_spec.hooks, saving_listeners=
train_spec.saving_listeners + (an evaluation listener,))`; the listener
evaluates after each checkpoint save but the first (the step-0 save), at most
once per `eval_spec.throttle_secs` ("Skip the current checkpoint eval due to
throttle secs" otherwise), and once more at the end if the last checkpoint
was not evaluated; each evaluation (on the latest checkpoint, skipped if it
was already evaluated) runs `eval_spec.exporters` into
`<model_dir>/export/<exporter name>/`, with `is_the_final_export` when the
evaluated global_step >= train_spec.max_steps. Returns (the last eval
result dict, the last list of export results), or (None, None) if nothing
was evaluated. `start_delay_secs` is not used locally (as in 2.15).

With a cluster in TF_CONFIG (ps/chief/worker/evaluator, or master) each task
runs through lowlevel's runtime (`lowlevel.estimator.distributed`) and gets
None, as in 2.15.
"""

from __future__ import annotations

import collections
import os
import time

import tensorflow as tf

from lowlevel.estimator import estimator as estimator_lib
from lowlevel.estimator import exporters as exporter_lib
from lowlevel.models import run_config as run_config_lib

logging = tf.compat.v1.logging  # the 'tensorflow' logger, as tensorflow_estimator 2.15 logs

v1 = tf.compat.v1


def _validate_input_fn(input_fn):
    if not callable(input_fn):
        raise TypeError(f"`input_fn` must be callable, given: {input_fn}")


def _validate_hooks(hooks):
    hooks = tuple(hooks or [])
    for hook in hooks:
        if not isinstance(hook, v1.train.SessionRunHook):
            raise TypeError(f"All hooks must be `SessionRunHook` instances, given: {hook}")
    return hooks


def _validate_saving_listeners(listeners):
    listeners = tuple(listeners or [])
    for listener in listeners:
        if not isinstance(listener, v1.train.CheckpointSaverListener):
            raise TypeError("All saving_listeners must be `CheckpointSaverListener` instances, "
                            f"given: {listener}")
    return listeners


def _validate_exporters(exporters):
    if not exporters:
        return ()
    if isinstance(exporters, exporter_lib.Exporter):
        exporters = [exporters]
    names = []
    try:
        for exporter in exporters:
            if not isinstance(exporter, exporter_lib.Exporter):
                raise TypeError
            if not exporter.name:
                raise ValueError("An Exporter cannot have a name that is `None` or empty. All "
                                 f"exporter names: {[e.name for e in exporters]}")
            if not isinstance(exporter.name, str):
                raise ValueError(
                    f"An Exporter must have a string name. Given: {type(exporter.name)}")
            if exporter.name in names:
                raise ValueError("`exporters` must have unique names. Such a name cannot be "
                                 f"`None`. All exporter names: {[e.name for e in exporters]}")
            names.append(exporter.name)
    except TypeError:
        raise TypeError("`exporters` must be an Exporter, an iterable of Exporter, or `None`, "
                        f"found {exporters}.") from None
    return tuple(exporters)


class TrainSpec(collections.namedtuple(
        "TrainSpec", ["input_fn", "max_steps", "hooks", "saving_listeners"])):
    """The training half of train_and_evaluate: input_fn, max_steps (> 0 or None), hooks.

    TypeError for a non-callable input_fn, hooks or listeners of the wrong
    type; ValueError "Must specify max_steps > 0, given: ..." (2.15's).
    """

    def __new__(cls, input_fn, max_steps=None, hooks=None, saving_listeners=None):
        _validate_input_fn(input_fn)
        if max_steps is not None and max_steps <= 0:
            raise ValueError(f"Must specify max_steps > 0, given: {max_steps}")
        return super().__new__(cls, input_fn=input_fn, max_steps=max_steps,
                               hooks=_validate_hooks(hooks),
                               saving_listeners=_validate_saving_listeners(saving_listeners))


class EvalSpec(collections.namedtuple("EvalSpec", [
        "input_fn", "steps", "name", "hooks", "exporters", "start_delay_secs",
        "throttle_secs"])):
    """The evaluation half: input_fn, steps=100 (None: whole input), name, hooks, exporters,
    start_delay_secs=120, throttle_secs=600; 2.15's validation and messages."""

    def __new__(cls, input_fn, steps=100, name=None, hooks=None, exporters=None,
                start_delay_secs=120, throttle_secs=600):
        _validate_input_fn(input_fn)
        if steps is not None and steps <= 0:
            raise ValueError(f"Must specify steps > 0, given: {steps}")
        if name is not None and not isinstance(name, str):
            raise TypeError(f"`name` must be string, given: {name}")
        hooks = _validate_hooks(hooks)
        exporters = _validate_exporters(exporters)
        if start_delay_secs < 0:
            raise ValueError(f"Must specify start_delay_secs >= 0, given: {start_delay_secs}")
        if throttle_secs < 0:
            raise ValueError(f"Must specify throttle_secs >= 0, given: {throttle_secs}")
        return super().__new__(cls, input_fn=input_fn, steps=steps, name=name, hooks=hooks,
                               exporters=exporters, start_delay_secs=start_delay_secs,
                               throttle_secs=throttle_secs)


def _assert_eval_spec(eval_spec):
    if not isinstance(eval_spec, EvalSpec):
        raise TypeError(f"`eval_spec` must have type `tf.estimator.EvalSpec`. Got: "
                        f"{type(eval_spec)}")


class _Evaluator:
    """Evaluates the latest checkpoint once and runs the exporters (2.15's `_Evaluator`)."""

    def __init__(self, estimator, eval_spec, max_training_steps):
        self._estimator = estimator
        self._eval_spec = eval_spec
        self._max_training_steps = max_training_steps
        self._previous_checkpoint = None
        self._last_warning_time = 0
        self.checkpoint = None

    def _warn(self, message):
        if time.time() - self._last_warning_time > 600:
            logging.warning(message)
            self._last_warning_time = time.time()

    def evaluate_and_export(self):
        """Returns (metrics or None, export results list)."""
        latest = self._estimator.latest_checkpoint()
        if not latest:
            self._warn("Estimator is not trained yet. Will start an evaluation when a "
                       "checkpoint is ready.")
            return None, []
        if latest == self._previous_checkpoint:
            self._warn("No new checkpoint ready for evaluation. Skip the current evaluation "
                       "pass as evaluation results are expected to be same for the same "
                       "checkpoint.")
            return None, []
        self.checkpoint = latest  # the one under evaluation (for a caller's error message)
        metrics = self._estimator.evaluate(
            input_fn=self._eval_spec.input_fn, steps=self._eval_spec.steps,
            name=self._eval_spec.name, checkpoint_path=latest, hooks=self._eval_spec.hooks)
        is_final = (metrics[v1.GraphKeys.GLOBAL_STEP] >= self._max_training_steps
                    if self._max_training_steps else False)
        export_base = os.path.join(tf.compat.as_str_any(self._estimator.model_dir), "export")
        results = [exporter.export(estimator=self._estimator,
                                   export_path=os.path.join(export_base, exporter.name),
                                   checkpoint_path=latest, eval_result=metrics,
                                   is_the_final_export=is_final)
                   for exporter in self._eval_spec.exporters]
        self._last_warning_time = 0
        self._previous_checkpoint = latest
        return metrics, results


class _EvaluateOnNewCheckpoint(v1.train.CheckpointSaverListener):
    """Evaluates after checkpoint saves, throttled (2.15's `_NewCheckpointListenerForEvaluate`)."""

    def __init__(self, evaluator, throttle_secs):
        self._evaluator = evaluator
        self._throttle_secs = throttle_secs
        self.eval_result, self.export_results = None, None
        self._timer = None
        self._is_first_run = True

    def begin(self):
        """Starts the throttle timer; the next save (the step-0 one) is not evaluated."""
        self._timer = v1.train.SecondOrStepTimer(every_secs=self._throttle_secs)
        self._is_first_run = True

    def after_save(self, session, global_step_value):
        """Evaluates the new checkpoint unless throttled."""
        del session
        if self._is_first_run:
            self._is_first_run = False
            return
        if self._timer.should_trigger_for_step(global_step_value):
            self._evaluate(global_step_value)
        else:
            logging.info("Skip the current checkpoint eval due to throttle secs (%s secs).",
                         self._throttle_secs)

    def end(self, session, global_step_value):
        """Evaluates the final checkpoint if the last evaluation was of another step."""
        del session
        if global_step_value != self._timer.last_triggered_step():
            self._evaluate(global_step_value)

    def _evaluate(self, global_step_value):
        self._timer.update_last_triggered_step(global_step_value)
        metrics, exports = self._evaluator.evaluate_and_export()
        if metrics is None:
            raise RuntimeError("There was no new checkpoint after the training. Eval status: "
                               "no new checkpoint")
        self.eval_result, self.export_results = metrics, exports


def _run_local(estimator, train_spec, eval_spec):
    config = estimator.config
    logging.info("Start train and evaluate loop. The evaluate will happen after every "
                 "checkpoint. Checkpoint frequency is determined based on RunConfig arguments: "
                 "save_checkpoints_steps %s or save_checkpoints_secs %s.",
                 config.save_checkpoints_steps, config.save_checkpoints_secs)
    listener = _EvaluateOnNewCheckpoint(_Evaluator(estimator, eval_spec, train_spec.max_steps),
                                        eval_spec.throttle_secs)
    estimator.train(input_fn=train_spec.input_fn, max_steps=train_spec.max_steps,
                    hooks=list(train_spec.hooks),
                    saving_listeners=train_spec.saving_listeners + (listener,))
    return listener.eval_result, listener.export_results


def train_and_evaluate(estimator, train_spec, eval_spec):
    """Trains and evaluates `estimator` (see the module docstring); returns (metrics, exports).

    TypeError (2.15's messages) for arguments of the wrong type; ValueError
    for an evaluator task id > 0. With a cluster in TF_CONFIG each task runs
    through lowlevel's runtime (`lowlevel.estimator.distributed`) and gets None.
    """
    _assert_eval_spec(eval_spec)
    if not isinstance(estimator, estimator_lib.Estimator):
        raise TypeError("`estimator` must have type `tf.estimator.Estimator`. Got: "
                        f"{type(estimator)}")
    if not isinstance(train_spec, TrainSpec):
        raise TypeError("`train_spec` must have type `tf.estimator.TrainSpec`. Got: "
                        f"{type(train_spec)}")
    config = estimator.config
    if config.task_type == run_config_lib.TaskType.EVALUATOR and config.task_id > 0:
        raise ValueError("For distributed training, there can only be one `evaluator` task "
                         f"(with task id 0).  Given task id {config.task_id}")
    if not config.cluster_spec and config.task_type != run_config_lib.TaskType.EVALUATOR:
        logging.info("Running training and evaluation locally (non-distributed).")
        return _run_local(estimator, train_spec, eval_spec)
    _check_task_type(config)
    from lowlevel.estimator import distributed
    return distributed.run(estimator, train_spec, eval_spec, _Evaluator)


_TASK_TYPES = ["chief", "evaluator", "master", "ps", "worker"]


def _check_task_type(config):
    """2.15's `_TrainingExecutor.run` checks of a distributed task's type (ValueError)."""
    if not config.task_type:
        raise ValueError("`estimator.config` must have task_type set. This usually means "
                         "TF_CONFIG environment is not set correctly.")
    if config.task_type == "local":
        raise ValueError(
            "`task.type` in TF_CONFIG cannot be `local`. Leaving `cluster` and `task` "
            "properties in TF_CONFIG absent triggers train and evaluate `Estimator` locally "
            "(non-distributed).")
    if config.task_type not in _TASK_TYPES:
        raise ValueError(f"Task type {config.task_type} is not supported. Supported task types "
                         f"are {_TASK_TYPES}")
