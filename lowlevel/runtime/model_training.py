"""Training a `ModelFnModel` (an Estimator model_fn): single-process; the cluster runtime replaces this.

SINGLE-PROCESS; THE CLUSTER RUNTIME REPLACES THIS. `train(model, hooks,
steps, max_steps, saving_listeners)` is the one call `Estimator.train` makes;
its body here is a real, working, local implementation of tensorflow_estimator
2.15's `Estimator._train_model_default` + `_train_with_estimator_spec`
(no device function, no cluster): a fresh `tf.Graph()` seeded with
`run_config.tf_random_seed`; `global_step` (int64) created first; the
train input_fn and the model_fn in TRAIN mode; warm start when model_dir
has no checkpoint; a `loss` scalar summary unless the model made one; the
Estimator's default hooks (NanTensorHook; LoggingTensorHook of loss and
step every `log_step_count_steps`; StopAtStepHook(steps, max_steps);
CheckpointSaverHook per save_checkpoints_steps/secs with the listeners,
unless the model gives one; StepCounterHook and SummarySaverHook through
`MonitoredTrainingSession`) and a sharded Saver keeping
`keep_checkpoint_max` checkpoints (relative paths), run in
`tf.compat.v1.train.MonitoredTrainingSession` until it should stop.

lowlevel's runtime (its session creators, fault handling, shutdown protocol
and placement for ps/chief/worker) takes over this body; the signature stays.
"""

from __future__ import annotations

from typing import Optional, Sequence

import tensorflow as tf

from lowlevel.data import replaceable
from lowlevel.models import input_fns
from lowlevel.models import spec as spec_lib
from lowlevel.models import warm_start as warm_start_lib
from lowlevel.models.model_fn_model import ModelFnModel

logging = tf.compat.v1.logging  # the 'tensorflow' logger, as tensorflow_estimator 2.15 logs

v1 = tf.compat.v1


def build_train_spec(model: ModelFnModel):
    """In the default graph: global_step, the train input and the TRAIN EstimatorSpec.

    Returns (spec, input_hooks, global_step). The graph is seeded with
    `model.run_config.tf_random_seed` and warm-started per `model.warm_start`
    when `model.model_dir` has no checkpoint.
    """
    config = model.run_config
    graph = v1.get_default_graph()
    v1.random.set_random_seed(config.tf_random_seed)
    v1.train.create_global_step(graph)
    result = input_fns.call_input_fn(model.input_fn, spec_lib.ModeKeys.TRAIN, model.params,
                                     config)
    # a user's Dataset: no autotune thread for a replaced session to wait for
    features, labels, input_hooks = input_fns.features_and_labels(
        replaceable.without_autotune(result))
    spec = spec_lib.call_model_fn(model.model_fn, features, labels, spec_lib.ModeKeys.TRAIN,
                                  model.params, config)
    if model.warm_start and not tf.train.latest_checkpoint(model.model_dir):
        warm_start_lib.warm_start(model.warm_start)
    if not any(s.op.name == "loss" for s in v1.get_collection(v1.GraphKeys.SUMMARIES)):
        v1.summary.scalar("loss", spec.loss)
    v1.add_to_collection(v1.GraphKeys.LOSSES, spec.loss)
    return spec, input_hooks, v1.train.get_global_step(graph)


def _worker_hooks(model, spec, input_hooks, hooks, global_step):
    config = model.run_config
    worker_hooks = list(input_hooks) + list(hooks)
    worker_hooks.append(v1.train.NanTensorHook(spec.loss))
    if config.log_step_count_steps is not None:
        worker_hooks.append(v1.train.LoggingTensorHook(
            {"loss": spec.loss, "step": global_step},
            every_n_iter=config.log_step_count_steps))
    worker_hooks.extend(spec.training_hooks)
    return worker_hooks


def _default_saver(config):
    if not v1.get_collection(v1.GraphKeys.SAVERS):
        v1.add_to_collection(v1.GraphKeys.SAVERS, v1.train.Saver(
            sharded=True, max_to_keep=config.keep_checkpoint_max,
            keep_checkpoint_every_n_hours=config.keep_checkpoint_every_n_hours,
            defer_build=True, save_relative_paths=True))


def _chief_hooks(model, spec, worker_hooks, saving_listeners):
    config = model.run_config
    saver_hooks = [h for h in worker_hooks + list(spec.training_chief_hooks)
                   if isinstance(h, v1.train.CheckpointSaverHook)]
    chief_hooks = []
    if (config.save_checkpoints_secs or config.save_checkpoints_steps) and not saver_hooks:
        chief_hooks = [v1.train.CheckpointSaverHook(
            model.model_dir, save_secs=config.save_checkpoints_secs,
            save_steps=config.save_checkpoints_steps, scaffold=spec.scaffold,
            save_graph_def=config.checkpoint_save_graph_def)]
        saver_hooks = chief_hooks
    if saving_listeners:
        if not saver_hooks:
            raise ValueError(
                "There should be a CheckpointSaverHook to use saving_listeners. Please set one "
                "of the RunConfig.save_checkpoints_steps or RunConfig.save_checkpoints_secs.")
        for listener in saving_listeners:
            if listener not in saver_hooks[0]._listeners:  # noqa: SLF001 (as 2.15 does)
                saver_hooks[0]._listeners.append(listener)
    return chief_hooks + list(spec.training_chief_hooks)


def train(model: ModelFnModel, hooks: Sequence = (), steps: Optional[int] = None,
          max_steps: Optional[int] = None, saving_listeners: Sequence = ()) -> Optional[float]:
    """Trains `model` from `model.input_fn`; returns the loss of the last step (or None).

    Args:
      model: the model_fn, params, run_config, model_dir, warm start, input_fn.
      hooks: extra `tf.compat.v1.train.SessionRunHook`s (checked by the caller).
      steps: train this many more steps (StopAtStepHook's `num_steps`), or
      max_steps: train until global_step reaches it; both None: until the
        input ends (OutOfRangeError) or a hook stops.
      saving_listeners: CheckpointSaverListeners attached to the saver hook.
    Raises ValueError for saving_listeners without a checkpoint schedule, and
    whatever the model_fn/input_fn raise (2.15's messages through
    `lowlevel.models.spec`/`input_fns`).
    """
    config = model.run_config
    with tf.Graph().as_default():
        spec, input_hooks, global_step = build_train_spec(model)
        stop = [v1.train.StopAtStepHook(steps, max_steps)] if steps or max_steps else []
        worker_hooks = _worker_hooks(model, spec, input_hooks, list(hooks) + stop, global_step)
        _default_saver(config)
        chief_hooks = _chief_hooks(model, spec, worker_hooks, list(saving_listeners))
        return _run_loop(model, spec, worker_hooks, chief_hooks)


def _run_loop(model, spec, worker_hooks, chief_hooks):
    config = model.run_config
    loss, steps_run = None, 0
    with v1.train.MonitoredTrainingSession(
            master=config.master, is_chief=config.is_chief, checkpoint_dir=model.model_dir,
            scaffold=spec.scaffold, hooks=worker_hooks, chief_only_hooks=tuple(chief_hooks),
            save_checkpoint_secs=0, save_summaries_steps=config.save_summary_steps,
            config=config.session_config, max_wait_secs=config.session_creation_timeout_secs,
            log_step_count_steps=config.log_step_count_steps,
            save_graph_def=config.checkpoint_save_graph_def) as session:
        while not session.should_stop():
            steps_run += 1
            _, loss = session.run([spec.train_op, spec.loss])
    if steps_run == 0:
        logging.warning("Training with estimator made no steps. Perhaps input is empty or "
                        "misspecified.")
    return loss
