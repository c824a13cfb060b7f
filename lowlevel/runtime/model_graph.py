"""The training graph of one worker for a model given as an Estimator `model_fn`.

Between-graph replication as for the built-in models (`graph`): the worker
builds the whole graph with its variables on the ps tasks, byte-balanced
(`placement`, measured by building the model once in a scratch graph), calls
the training `input_fn`, and builds the step every model trains with
(`runtime.step`: the model_fn in TRAIN mode, its step taken over by the runtime:
fused transfer, products on the ps, towers, the counted update or `--sync`).
Around it:

- a model_fn that wraps its optimizer in a `SyncReplicasOptimizer` itself gets the
  runtime's sync hook from `make_session_run_hook`, which does not hang at the last
  step;
- the model's hooks run beside the runtime's (progress, summaries, checkpoints,
  the end-of-training protocol of `shutdown`), every step through the monitored
  session when one of them acts per step;
- its warm start applies when the model_dir has no checkpoint yet.
"""

from __future__ import annotations

import threading
from typing import Optional

import tensorflow as tf

from lowlevel.cluster.spec import Cluster, Task
from lowlevel.config import TrainConfig
from lowlevel.data import replaceable
from lowlevel.models import input_fns, user
from lowlevel.models import spec as spec_lib
from lowlevel.models import warm_start as warm_start_lib
from lowlevel.models.model_fn_model import ModelFnModel
from lowlevel.runtime import graph as graph_lib
from lowlevel.runtime import hooks, placement
from lowlevel.runtime import step as step_lib
from lowlevel.runtime import progress as progress_lib

v1 = tf.compat.v1
TRAIN = spec_lib.ModeKeys.TRAIN


def build(config: TrainConfig, model: ModelFnModel, cluster: Optional[Cluster], task: Task,
          worker_gpu: int = 0, preempted: Optional[threading.Event] = None
          ) -> graph_lib.TrainGraph:
    """Builds worker `task`'s training graph of `model` (the in-process one with `cluster=None`).

    `config` gives the run's settings (train_steps, sync, checkpoints, timeouts);
    `model` the model_fn, its params and run config, and the training input_fn.

    Raises:
      Whatever the input_fn and model_fn raise, with tensorflow_estimator 2.15's
      messages for a wrong result (`lowlevel.models.spec`, `input_fns`).
    """
    preempted = preempted or threading.Event()
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(_seed(config, model))
        # A model_fn gets towers only when --towers asks: whether it can share its variables
        # shows only once built (a Keras layer cannot), and the default must not refuse a
        # script that runs on one device (GPU task_index mod worker_gpu, as before towers).
        # (one device in the communication-reduced mode, as for the built-in models)
        towers = 1 if graph_lib.Mode.of(config, cluster).local else config.towers or 1
        worker, devices = placement.task_devices(cluster, task, towers, worker_gpu)
        device = _device(config, model, cluster, task, worker_gpu, worker) if cluster else None
        with v1.device(device):
            global_step = v1.train.get_or_create_global_step()
            features, labels, input_hooks = _train_input(model)
            step = step_lib.build(config, model, features, labels, global_step, worker,
                                  devices, cluster)
            if model.warm_start and not tf.train.latest_checkpoint(model.model_dir):
                warm_start_lib.warm_start(model.warm_start)
        return _assemble(config, model, cluster, task, graph, step, global_step, input_hooks,
                         _batch_size(labels, features), preempted)


def _seed(config: TrainConfig, model: ModelFnModel) -> int:
    seed = getattr(model.run_config, "tf_random_seed", None)
    return config.seed if seed is None else seed


def _train_input(model: ModelFnModel):
    """(features, labels, input hooks) of the training input_fn, in the current graph."""
    with user.calling("input_fn", model.input_fn):
        result = input_fns.call_input_fn(model.input_fn, TRAIN, model.params, model.run_config)
        # a user's Dataset: no autotune thread for a replaced session to wait for
        return input_fns.features_and_labels(replaceable.without_autotune(result))


def _device(config: TrainConfig, model: ModelFnModel, cluster: Cluster, task: Task,
            worker_gpu: int, worker: Optional[str] = None):
    """The device function: variables on the ps tasks by bytes (the model measured in a
    scratch graph, with its input), compute on the worker (`placement.device_setter`)."""
    def probe():
        v1.train.get_or_create_global_step()
        features, labels, _ = _train_input(model)
        step_lib.call_model_fn(model, features, labels)

    sizes, tables = placement.measure(probe)
    return placement.device_setter(cluster.as_dict(), task.task_index, worker_gpu, sizes,
                                   task.job_name, tables, worker=worker)


def _batch_size(labels, features) -> int:
    """The examples a step takes, from the input's static leading dimension; 0 if unknown."""
    for tensor in tf.nest.flatten(labels) + tf.nest.flatten(features):
        shape = getattr(tensor, "shape", None)
        if shape is not None and shape.rank and shape[0] is not None:
            return int(shape[0])
    return 0


def _on_runtime(hook, steps: hooks.LoopState):
    """`hook.on_runtime(steps)` for a hook that runs differently on the runtime (an Estimator
    early-stopping hook: `lowlevel.estimator.early_stopping`), else `hook`. Called while the
    graph is built, before the saver: variables the hook makes then are saved."""
    return hook.on_runtime(steps) if hasattr(hook, "on_runtime") else hook


def _every_step(hook):
    """A model's hook that acts per step, given a `due()` that is always True: the loop then
    runs every step through the monitored session, as the model expects (`loop.StepRunner`)."""
    base = v1.train.SessionRunHook
    acts = (type(hook).before_run is not base.before_run or
            type(hook).after_run is not base.after_run)
    if acts and not hasattr(hook, "due"):
        hook.due = lambda: True
    return hook


def _assemble(config, model, cluster, task, graph, step: step_lib.TrainStep, global_step,
              input_hooks, batch_size, preempted) -> graph_lib.TrainGraph:
    """The `TrainGraph`: scaffold, the model's hooks beside the runtime's, progress."""
    spec, sync = step.spec, step.sync_optimizer
    num_workers = (cluster.num_workers or 1) if cluster else 1
    # Gradients a sync step aggregates: --replicas_to_aggregate, or every worker (a model's
    # own SyncReplicasOptimizer keeps its figure private; this is its usual setting).
    replicas = (config.replicas_to_aggregate or num_workers) if sync is not None else 1
    # The runtime's sync hook is added by `session_hooks` for its own --sync; a model's
    # own SyncReplicasOptimizer gets it from make_session_run_hook (`step.sync_hooks`).
    mode = graph_lib.Mode(num_workers=num_workers, replicas=replicas,
                          sync=step.runtime_sync is not None, local=step.local_ops is not None)
    steps = hooks.LoopState()
    model_hooks = list(input_hooks) + list(model.hooks) + list(spec.training_hooks)
    if task.is_chief:
        model_hooks += list(spec.training_chief_hooks)
    # before the saver: a hook's variables made here are saved (early stopping's STOP)
    model_hooks = [_every_step(_on_runtime(h, steps)) for h in model_hooks
                   if h not in step.sync_hooks]
    scaffold, saved, optimizer_names = graph_lib.scaffold_for(
        config, graph, step.local_ops, _local_init(spec.scaffold), None, spec.scaffold)
    examples_per_step = batch_size * (replicas if sync is not None else 1)
    progress = progress_lib.ProgressHook(global_step, spec.loss, examples_per_step,
                                         config.train_steps, config.log_every_secs, steps,
                                         config.output_dir if task.is_chief else None,
                                         config.warmup_steps, batch_size,
                                         step_from_loop=mode.local)
    step_ops = graph_lib.Step(spec.loss, step.value, step.local_ops, sync_optimizer=sync)
    run_hooks = graph_lib.session_hooks(config, mode, cluster, task, step_ops, global_step,
                                        scaffold, steps, progress, None, preempted,
                                        extra=step.sync_hooks + model_hooks,
                                        may_end_early=True)
    return graph_lib.TrainGraph(graph, step.value, step.local_ops, spec.loss, global_step,
                                scaffold,
                                run_hooks, progress, None, examples_per_step, steps, saved,
                                optimizer_names)


def _local_init(scaffold):
    """The model's own local init op (its scaffold's), or None for the default."""
    return getattr(scaffold, "local_init_op", None) if scaffold is not None else None
