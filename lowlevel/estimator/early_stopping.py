"""Early stopping: tensorflow_estimator 2.15's `tf.estimator.experimental` stop hooks.

The same signatures, defaults, checks and log lines as 2.15's
`early_stopping.py` and `hooks/hooks.py` (checked against the real 2.15 on the
same script: tests/fixtures/estimator215/early_stopping.json):

- `stop_if_higher_hook`, `stop_if_lower_hook`: stop once an evaluation in
  `eval_dir` (default `estimator.eval_dir()`) at a step >= `min_steps` has the
  metric above (below) `threshold`;
- `stop_if_no_increase_hook`, `stop_if_no_decrease_hook`: stop once
  `max_steps_without_*` training steps separate the newest evaluation from the
  best one;
- `make_early_stopping_hook`: stop when `should_stop_fn()` returns True;
- `make_stop_at_checkpoint_step_hook`: the chief stops at `last_step`; another
  worker once the newest checkpoint is at `last_step`.

The chief checks every `run_every_secs` seconds (default 60) or every
`run_every_steps` steps, from the evaluations the evaluator wrote (event files'
`simple_value` summaries, by step).

**On a cluster.** In 2.15 the chief's stop set a `signal_early_stopping/STOP`
variable that the other workers read every step; the chief and workers then
exited, and the evaluator and the ps tasks ran on forever (its docstring: "you
will need other means to detect and stop it"). On lowlevel's runtime
(`lowlevel.estimator.distributed`) a chief that stops before `max_steps`, by
these hooks or any hook's `request_stop`, ends the run on every task
(`lowlevel.runtime.shutdown`, "A run ended early"): the workers end at their next
check (every 0.1 s), the chief saves the final checkpoint and stops the ps tasks, and the
evaluator evaluates that checkpoint and exits; every task exits 0. The STOP
variable is made and saved as in 2.15 (checkpoints hold its name), but only the
chief sets it; the workers learn of the stop from the runtime's signal.
"""

from __future__ import annotations

import collections
import operator
import os
import time

import tensorflow as tf

v1 = tf.compat.v1
logging = v1.logging  # the 'tensorflow' logger, as 2.15 logs

_EVENT_FILE_GLOB_PATTERN = "events.out.tfevents.*"


def _check_estimator(estimator) -> None:
    from lowlevel.estimator.estimator import Estimator
    if not isinstance(estimator, Estimator):
        raise TypeError("`estimator` must have type `tf.estimator.Estimator`. "
                        f"Got: {type(estimator)}")


def make_early_stopping_hook(estimator, should_stop_fn, run_every_secs=60,
                             run_every_steps=None):
    """A `SessionRunHook` that stops training when `should_stop_fn()` returns True (2.15's).

    Args:
      estimator: a `tf.estimator.Estimator`; its `config.is_chief` picks the hook.
      should_stop_fn: callable of no arguments returning a bool, called by the chief.
      run_every_secs: seconds between calls (default 60); or
      run_every_steps: global steps between calls. Only one may be set.

    Returns:
      On the chief `_StopOnPredicateHook`, on other workers `_CheckForStoppingHook`.

    Raises:
      TypeError: `estimator` is not an Estimator; (the chief's hook) `should_stop_fn`
        is not callable.
      ValueError: both `run_every_secs` and `run_every_steps` are set.
    """
    _check_estimator(estimator)
    if run_every_secs is not None and run_every_steps is not None:
        raise ValueError("Only one of `run_every_secs` and `run_every_steps` must be set.")
    if estimator.config.is_chief:
        return _StopOnPredicateHook(should_stop_fn, run_every_secs, run_every_steps)
    return _CheckForStoppingHook()


def stop_if_higher_hook(estimator, metric_name, threshold, eval_dir=None, min_steps=0,
                        run_every_secs=60, run_every_steps=None):
    """Stops once an evaluation's `metric_name` is above `threshold` (2.15's); see the module."""
    return _threshold_hook(estimator, metric_name, threshold, True, eval_dir, min_steps,
                           run_every_secs, run_every_steps)


def stop_if_lower_hook(estimator, metric_name, threshold, eval_dir=None, min_steps=0,
                       run_every_secs=60, run_every_steps=None):
    """Stops once an evaluation's `metric_name` is below `threshold` (2.15's); see the module."""
    return _threshold_hook(estimator, metric_name, threshold, False, eval_dir, min_steps,
                           run_every_secs, run_every_steps)


def stop_if_no_increase_hook(estimator, metric_name, max_steps_without_increase,
                             eval_dir=None, min_steps=0, run_every_secs=60,
                             run_every_steps=None):
    """Stops once `metric_name` has not risen for `max_steps_without_increase` global steps
    of evaluations (2.15's); see the module."""
    return _no_improvement_hook(estimator, metric_name, max_steps_without_increase, True,
                                eval_dir, min_steps, run_every_secs, run_every_steps)


def stop_if_no_decrease_hook(estimator, metric_name, max_steps_without_decrease,
                             eval_dir=None, min_steps=0, run_every_secs=60,
                             run_every_steps=None):
    """Stops once `metric_name` has not fallen for `max_steps_without_decrease` global steps
    of evaluations (2.15's); see the module."""
    return _no_improvement_hook(estimator, metric_name, max_steps_without_decrease, False,
                                eval_dir, min_steps, run_every_secs, run_every_steps)


def read_eval_metrics(eval_dir):
    """{global step: {metric name: float}} of the `simple_value` summaries in `eval_dir`'s
    event files, by step (2.15's `read_eval_metrics`); {} when `eval_dir` does not exist."""
    by_step = collections.defaultdict(dict)
    for event in _summaries(eval_dir):
        if not event.HasField("summary"):
            continue
        metrics = {value.tag: value.simple_value for value in event.summary.value
                   if value.HasField("simple_value")}
        if metrics:
            by_step[event.step].update(metrics)
    return collections.OrderedDict(sorted(by_step.items(), key=lambda t: t[0]))


def _threshold_hook(estimator, metric_name, threshold, higher_is_better, eval_dir,
                    min_steps, run_every_secs, run_every_steps):
    eval_dir = estimator.eval_dir() if eval_dir is None else eval_dir
    better = operator.gt if higher_is_better else operator.lt
    words = "greater than" if higher_is_better else "less than"

    def crossed():
        for step, metrics in read_eval_metrics(eval_dir).items():
            if step < min_steps:
                continue
            value = metrics[metric_name]
            if better(value, threshold):
                logging.info('At step %s, metric "%s" has value %s which is %s the configured '
                             "threshold (%s) for early stopping.", step, metric_name, value,
                             words, threshold)
                return True
        return False

    return make_early_stopping_hook(estimator, crossed, run_every_secs, run_every_steps)


def _no_improvement_hook(estimator, metric_name, max_steps, higher_is_better, eval_dir,
                         min_steps, run_every_secs, run_every_steps):
    eval_dir = estimator.eval_dir() if eval_dir is None else eval_dir
    better = operator.gt if higher_is_better else operator.lt
    word = "increase" if higher_is_better else "decrease"

    def stalled():
        best, best_step = None, None
        for step, metrics in read_eval_metrics(eval_dir).items():
            if step < min_steps:
                continue
            value = metrics[metric_name]
            if best is None or better(value, best):
                best, best_step = value, step
            if step - best_step >= max_steps:
                logging.info('No %s in metric "%s" for %s steps, which is greater than or '
                             "equal to max steps (%s) configured for early stopping.", word,
                             metric_name, step - best_step, max_steps)
                return True
        return False

    return make_early_stopping_hook(estimator, stalled, run_every_secs, run_every_steps)


def _summaries(eval_dir):
    """Yields the `Event` protos of `eval_dir`'s event files; a file cut short (DataLossError)
    is read up to the damage, with 2.15's warning."""
    if not tf.io.gfile.exists(eval_dir):
        return
    for path in tf.io.gfile.glob(os.path.join(eval_dir, _EVENT_FILE_GLOB_PATTERN)):
        try:
            yield from v1.train.summary_iterator(path)
        except tf.errors.DataLossError as e:
            logging.warning("Skipping rest of the file due to encountering data corruption "
                            "error; file path: %s; original error raised by "
                            "`tf.train.summary_iterator`: %s", path, e)


def _get_or_create_stop_var():
    """2.15's `signal_early_stopping/STOP`: a bool scalar in GLOBAL_VARIABLES, beside global_step
    (2.15 placed it through the Estimator's device function)."""
    global_step = v1.train.get_global_step()
    with tf.device(global_step.device if global_step is not None else None), \
            v1.variable_scope("signal_early_stopping", values=[], reuse=v1.AUTO_REUSE):
        return v1.get_variable("STOP", shape=[], dtype=tf.bool,
                               initializer=v1.initializers.constant(False),
                               collections=[v1.GraphKeys.GLOBAL_VARIABLES], trainable=False)


class _StopOnPredicateHook(v1.train.SessionRunHook):
    """The chief's hook: calls `should_stop_fn` every interval; when True, sets the STOP
    variable (locally) and requests the stop (2.15's).

    On lowlevel's runtime `on_runtime()` is called while the graph is built (the STOP
    variable is made then, so the runtime's saver keeps it; the runtime's end-of-run
    signal, not STOP, tells the other tasks), and `due()` says when the next check is, so
    the training loop runs only those steps through the hooks.

    Raises:
      TypeError: `should_stop_fn` is not callable ("`should_stop_fn` must be callable.").
    """

    def __init__(self, should_stop_fn, run_every_secs=60, run_every_steps=None):
        if not callable(should_stop_fn):
            raise TypeError("`should_stop_fn` must be callable.")
        self._should_stop_fn = should_stop_fn
        self._timer = v1.train.SecondOrStepTimer(every_secs=run_every_secs,
                                                 every_steps=run_every_steps)
        self._every_secs, self._every_steps = run_every_secs, run_every_steps
        self._global_step_tensor = self._stop_op = None
        self._checked_at = (None, time.monotonic())  # (global step, monotonic s) of the last

    def on_runtime(self, steps) -> "_StopOnPredicateHook":
        """Runs on lowlevel's runtime, whose `hooks.LoopState` `steps` holds the global step;
        the STOP variable is made now, while the graph is built, so the runtime saves it."""
        self._steps = steps
        self._stop_op = v1.assign(_get_or_create_stop_var(), True)
        return self

    def due(self) -> bool:
        step, at = self._checked_at
        if step is None:
            return True
        if self._every_steps is not None:
            return self._steps.value + 1 >= step + self._every_steps
        return time.monotonic() - at >= self._every_secs

    def begin(self):
        self._global_step_tensor = v1.train.get_global_step()
        if self._stop_op is None:
            self._stop_op = v1.assign(_get_or_create_stop_var(), True)

    def before_run(self, run_context):
        del run_context
        return v1.train.SessionRunArgs(self._global_step_tensor)

    def after_run(self, run_context, run_values):
        global_step = run_values.results
        if not self._timer.should_trigger_for_step(global_step):
            return
        self._timer.update_last_triggered_step(global_step)
        self._checked_at = (global_step, time.monotonic())
        if self._should_stop_fn():
            logging.info("Requesting early stopping at global step %d", global_step)
            run_context.session.run(self._stop_op)
            run_context.request_stop()


class _CheckForStoppingHook(v1.train.SessionRunHook):
    """A non-chief worker's hook: stops when the chief has set the STOP variable (2.15's).

    On lowlevel's runtime (`on_runtime()`) it reads nothing: the runtime ends the worker
    when the chief's run ends early (`lowlevel.runtime.shutdown`), and a STOP restored as
    True from a checkpoint of an earlier early stop does not end the resumed run at once,
    as it did in 2.15. It still makes the variable, so every task's graph has it.
    """

    def __init__(self):
        self._stop_var = None
        self._on_runtime = False

    def on_runtime(self, steps) -> "_CheckForStoppingHook":
        del steps
        _get_or_create_stop_var()
        self._on_runtime = True
        return self

    def due(self) -> bool:
        return not self._on_runtime

    def begin(self):
        if not self._on_runtime:
            self._stop_var = _get_or_create_stop_var()

    def before_run(self, run_context):
        del run_context
        return v1.train.SessionRunArgs(self._stop_var) if self._stop_var is not None else None

    def after_run(self, run_context, run_values):
        if run_values.results:
            logging.info("Early stopping requested, suspending run.")
            run_context.request_stop()


class _StopAtCheckpointStepHook(v1.train.SessionRunHook):
    """A non-chief worker's stop at `last_step`: once the newest checkpoint in `model_dir` is
    at `last_step` (read when the global step reaches it; `wait_after_file_check_secs`
    seconds of sleep after each read that finds it is not). 2.15's.

    Raises:
      ValueError: `last_step` or `model_dir` is None (2.15's messages).
      RuntimeError: (begin) the graph has no global step.
    """

    def __init__(self, model_dir, last_step, wait_after_file_check_secs=30):
        if last_step is None:
            raise ValueError("last_step must be specified.")
        if model_dir is None:
            raise ValueError("model_dir must be specified.")
        self._model_dir, self._last_step = model_dir, last_step
        self._wait_after_file_check_secs = wait_after_file_check_secs
        self._global_step_tensor = None

    def begin(self):
        self._global_step_tensor = v1.train.get_global_step()
        if self._global_step_tensor is None:
            raise RuntimeError("Global step should be created to use StopAtCheckpointStepHook.")

    def before_run(self, run_context):
        del run_context
        return v1.train.SessionRunArgs(self._global_step_tensor)

    def after_run(self, run_context, run_values):
        if run_values.results + 1 < self._last_step:
            return
        path = tf.train.latest_checkpoint(self._model_dir)
        step = int(tf.train.load_variable(path, "global_step")) if path else 0
        if step >= self._last_step:
            run_context.request_stop()
        else:
            time.sleep(self._wait_after_file_check_secs)


def make_stop_at_checkpoint_step_hook(estimator, last_step, wait_after_file_check_secs=30):
    """2.15's: on the chief `StopAtStepHook(last_step=last_step)`; on another worker a hook
    that stops once the newest checkpoint is at `last_step` (`_StopAtCheckpointStepHook`)."""
    if estimator.config.is_chief:
        return v1.train.StopAtStepHook(last_step=last_step)
    return _StopAtCheckpointStepHook(estimator.model_dir, last_step,
                                     wait_after_file_check_secs)
