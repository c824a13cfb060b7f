"""`train_and_evaluate` with a cluster in `TF_CONFIG`: every task through lowlevel's runtime.

tensorflow_estimator 2.15 ran this with its own, textbook runtime (measured, see
tests/fixtures/estimator215/BEHAVIOUR.md): the ps tasks block in `server.join()`
forever, a worker sleeps `min(60, (task_id + 1) * 5)` s before it starts and waits
30 s more when the chief is not ready, an async run ends up to (workers - 1)
steps past `max_steps`, and `SyncReplicasOptimizer`'s chief hangs 120 s at the
end. Here each task runs lowlevel's schedule for its job (`runtime.schedules`), the
model_fn trained as a `trainables.ModelFn`:

- ps: serves its variables until the chief says the run is over; returns;
- chief (or master) and workers: the runtime's placement by bytes, session
  creators (a worker starts as soon as the chief has the model), the counted step
  (the run ends at exactly `max_steps`), fault handling, the end-of-training
  protocol, preemption at a safe point; the chief saves checkpoints per the
  RunConfig. The chief neither evaluates nor exports, as in 2.15;
- evaluator: evaluates each new checkpoint (`start_delay_secs` first,
  `throttle_secs` apart), runs the exporters, and returns after the checkpoint of
  `max_steps` (2.15's `_TrainingExecutor.run_evaluator`); a chief that saves
  nothing new for `--eval_timeout_secs` ends it with status 200.

A run the chief ends before `max_steps` (an early-stopping hook,
`lowlevel.estimator.early_stopping`, or any hook's `request_stop`) ends on every
task, where 2.15 left the evaluator and the ps tasks running: the workers stop
within 0.1 s (`runtime.shutdown`, "A run ended early"), the ps tasks exit
after the final checkpoint, and the evaluator, once the chief's final metrics
appear, evaluates the final checkpoint at once (not a throttle later) and returns.

`LOWLEVEL_SYNC=1` in the environment trains synchronously through the runtime (its
`--sync`; `LOWLEVEL_REPLICAS_TO_AGGREGATE` its `--replicas_to_aggregate`);
`LOWLEVEL_COMMUNICATION_PERIOD=K` trains K local steps between exchanges with the ps (its
`--communication_period`: `lowlevel.modes.local_sgd`).

`run` returns None on every task, as 2.15. A task that must stop with a status
other than 0 (preempted: 128 + N; a failure: the exit-status table of
`lowlevel.errors`) raises `SystemExit` with it, or the failure's exception.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time

import tensorflow as tf

from lowlevel import config as config_lib
from lowlevel import events, output_layout
from lowlevel.cluster import channels, tf_config
from lowlevel.cluster.spec import PS
from lowlevel.config import TrainConfig
from lowlevel.errors import EvalTimeout, UsageError
from lowlevel.runtime import schedules, trainables

logging = tf.compat.v1.logging  # the 'tensorflow' logger, as tensorflow_estimator 2.15 logs

# An async run with no max_steps trains until its input ends: a limit no run reaches.
NO_LIMIT_STEPS = 2 ** 62
EVAL_TIMEOUT_SECS = TrainConfig.__dataclass_fields__["eval_timeout_secs"].default


def run(estimator, train_spec, eval_spec, evaluator_cls) -> None:
    """Runs this task's part of a distributed `train_and_evaluate` (see the module docstring).

    `evaluator_cls`: the `_Evaluator` of `lowlevel.estimator.training` (evaluate and export).

    Raises:
      SystemExit: the task must exit with a status other than 0 (preempted).
      errors.EvalTimeout: the evaluator saw no new checkpoint for `EVAL_TIMEOUT_SECS`.
      Whatever the runtime raises (`lowlevel.errors`; the exit-status table).
    """
    config = estimator.config
    if config.task_type == "evaluator":
        return _evaluate(estimator, train_spec, eval_spec, evaluator_cls)
    cluster, task = tf_config.from_tf_config(os.environ["TF_CONFIG"])
    _show_runtime_lines()
    run_config = _train_config(estimator, train_spec, cluster)
    channels.use_channel_options()  # before the task's server makes its channels
    output_layout.ensure_writable(run_config.output_dir)
    _open_events(run_config.output_dir, task.name)
    model = dataclasses.replace(estimator._model(train_spec.input_fn),  # noqa: SLF001
                                hooks=tuple(train_spec.hooks))
    trainable = trainables.ModelFn(model, None, f"model_fn {_name(estimator._model_fn)}")
    schedule = (config_lib.RUN_STD_SERVER if task.job_name == PS else config_lib.TRAIN)
    status = schedules.run(schedule, run_config, cluster, task, _preemption(task.name),
                           trainable=trainable, set_logger=False)  # the script's verbosity
    if status:
        raise SystemExit(status)
    return None


def _train_config(estimator, train_spec, cluster) -> TrainConfig:
    """The runtime's settings of this run: the RunConfig's checkpoints and seed, max_steps."""
    config = estimator.config
    return TrainConfig(
        model=_name(estimator._model_fn), input_fn=_name(train_spec.input_fn),  # noqa: SLF001
        output_dir=estimator.model_dir,
        train_steps=train_spec.max_steps or NO_LIMIT_STEPS,
        save_checkpoint_steps=config.save_checkpoints_steps,
        save_checkpoint_secs=config.save_checkpoints_secs or 600.0,
        keep_checkpoint_max=config.keep_checkpoint_max or 5,
        seed=config.tf_random_seed or 0, keep_exports=0, **_mode_from_environment(),
    ).validate(cluster.num_workers if cluster else None)


def _mode_from_environment() -> dict:
    """The training mode the environment asks for, as TrainConfig fields.

    `LOWLEVEL_SYNC=1`: the runtime trains the model_fn's optimizer synchronously (the
    trainer's --sync: one SyncReplicasOptimizer round per step, every worker's gradient,
    exact end); `LOWLEVEL_REPLICAS_TO_AGGREGATE=N` leaves backup workers. For a model_fn
    that does not wrap its optimizer itself: a canned estimator's, say.
    `LOWLEVEL_COMMUNICATION_PERIOD=K`: K local steps on worker-local copies between
    exchanges with the ps (the trainer's --communication_period; async local SGD or, with
    LOWLEVEL_SYNC=1, model averaging; 1: the exact mode).

    Raises:
      UsageError: a value that is not 0/1 (or true/false), or not a positive integer.
    """
    found = {}
    text = os.environ.get("LOWLEVEL_SYNC", "").strip().lower()
    if text:
        if text not in ("0", "1", "true", "false"):
            raise UsageError(f"LOWLEVEL_SYNC={text!r}: expected 1 or 0")
        found["sync"] = text in ("1", "true")
    for field in ("replicas_to_aggregate", "communication_period"):
        name = f"LOWLEVEL_{field.upper()}"
        text = os.environ.get(name, "").strip()
        if text:
            if not text.isdigit() or int(text) < 1:
                raise UsageError(f"{name}={text!r}: expected a positive integer (the "
                                 f"trainer's --{field})")
            found[field] = int(text)
    return found


def _name(fn) -> str:
    """"module:qualname" of a function, as `--model` names one (a callable object: its type)."""
    fn = getattr(fn, "func", fn)  # functools.partial
    module = getattr(fn, "__module__", None) or type(fn).__module__
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"{module}:{name}".replace("<locals>.", "").replace("<", "").replace(">", "")


def _show_runtime_lines() -> None:
    """The runtime's log lines (absl, INFO: progress, faults, the end of training) are shown,
    as the trainer shows them; TensorFlow's own logger keeps its single handler."""
    from absl import logging as absl_logging
    absl_logging.set_verbosity(absl_logging.INFO)
    tf.get_logger().propagate = False  # else its lines reach absl's root handler twice


def _open_events(output_dir: str, task_name: str) -> None:
    try:
        events.open_log(output_dir, task_name)
    except OSError as e:
        logging.warning("%s: no events file in %s (%s)", task_name, output_dir, e.strerror)


def _preemption(task_name: str):
    """The process's `Preemption` (SIGTERM/SIGINT at a safe point): the one
    `python -m lowlevel.estimator` made, else one made now (in the main thread)."""
    from lowlevel.runtime import preemption
    current = preemption.current() or preemption.Preemption(task_name)
    current.task_name = task_name
    return current


def _evaluate_once(evaluator):
    """`evaluator.evaluate_and_export()`'s metrics; None (with a warning) when its checkpoint
    was deleted under it (the chief keeps `keep_checkpoint_max`: a slow evaluation can lose
    the race), as the runtime's evaluator does (`runtime.evaluator`)."""
    try:
        return evaluator.evaluate_and_export()[0]
    except (ValueError, tf.errors.OpError) as e:
        path = evaluator.checkpoint
        if path is None or tf.compat.v1.train.checkpoint_exists(path):
            raise
        logging.warning("evaluator: skipping %s, deleted meanwhile (keep_checkpoint_max): %s",
                        os.path.basename(path), getattr(e, "message", e))
        return None


def _evaluate(estimator, train_spec, eval_spec, evaluator_cls) -> None:
    """The evaluator: each new checkpoint, throttled, until the one of max_steps, or until
    the final checkpoint of a run the chief ended early (`_ended_at`) is evaluated."""
    since = time.time()
    if eval_spec.start_delay_secs:
        logging.info("Waiting %f secs before starting eval.", eval_spec.start_delay_secs)
        _sleep_unless_ended(eval_spec.start_delay_secs, estimator.model_dir, since)
    evaluator = evaluator_cls(estimator, eval_spec, train_spec.max_steps)
    waited_since, evaluated = time.monotonic(), None
    while True:
        started = time.monotonic()
        metrics = _evaluate_once(evaluator)
        if metrics is not None:
            waited_since = time.monotonic()
            evaluated = int(metrics[tf.compat.v1.GraphKeys.GLOBAL_STEP])
            if train_spec.max_steps and evaluated >= train_spec.max_steps:
                logging.info("Exiting evaluation, global_step=%s >= train max_steps=%s",
                             evaluated, train_spec.max_steps)
                return None
        ended = _ended_at(estimator.model_dir, since)
        if ended is not None and evaluated is not None and evaluated >= ended:
            logging.info("Exiting evaluation: training ended at global_step=%s, before "
                         "max_steps=%s, and its final checkpoint is evaluated", ended,
                         train_spec.max_steps)
            return None
        if metrics is None and time.monotonic() - waited_since > EVAL_TIMEOUT_SECS:
            raise EvalTimeout(
                f"evaluator: no new checkpoint in {estimator.model_dir} for "
                f"{EVAL_TIMEOUT_SECS:g} s before the one of max_steps={train_spec.max_steps}: "
                "is the chief running?")
        delay = eval_spec.throttle_secs - (time.monotonic() - started)
        if delay > 0 and ended is None:
            logging.info("Waiting %f secs before starting next eval run.", delay)
            _sleep_unless_ended(delay, estimator.model_dir, since)
        else:
            time.sleep(1.0 if metrics is None else 0.0)


def _ended_at(model_dir: str, since: float):
    """The final global step of a run that ended after `since` (unix seconds): the chief
    writes `final_metrics.json` last (`lowlevel.runtime.finish`, step 12), so a file newer
    than the evaluator's start says training is over; None while it is not."""
    path = output_layout.final_metrics(model_dir)
    try:
        if os.stat(path).st_mtime < since:
            return None
        with open(path) as f:
            return int(json.load(f)["global_step"])
    except (OSError, ValueError, KeyError, TypeError):  # absent, or being written
        return None


def _sleep_unless_ended(seconds: float, model_dir: str, since: float) -> None:
    """Sleeps `seconds`, waking within `ENDED_POLL_SECS` once training has ended (a run the
    chief ended early: its final checkpoint is evaluated at once, not a throttle later)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and _ended_at(model_dir, since) is None:
        time.sleep(min(ENDED_POLL_SECS, max(0.0, deadline - time.monotonic())))


ENDED_POLL_SECS = 1.0  # how often a sleeping evaluator looks for the end of training
