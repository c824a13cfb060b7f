"""The training graph of one worker for a model given as an Estimator `model_fn`.

Between-graph replication as for the built-in models (`graph`): the worker
builds the whole graph with its variables on the ps tasks, byte-balanced
(`placement`, measured by building the model once in a scratch graph), calls
the training `input_fn` and the `model_fn` in TRAIN mode, and runs the step the
model_fn built, with five changes that leave the model_fn as it is
(`modes.optimizer_capture`, `modes.fused_transfer`, `modes.ps_products`):

- on a cluster, the small variables the worker reads come from one read per ps,
  and their gradients go back in one tensor per ps (the built-in models' fused
  transfer, applied to the built graph: `fused_transfer`);
- on a CPU worker with one device (`--ps_products`), each dense layer's product
  runs where it moves the fewest bytes, its kernel's ps or the worker, as for the
  built-in models (`ps_products`: the model_fn's MatMuls placed while it builds);
- async, its optimizer's apply with the global step becomes the counted update
  (`exact.counted_update`): the run ends at exactly the last step; its gradients are
  built ungated, as `tf.gradients` builds the built-in models', when its variables
  are resource variables (`optimizer_capture`: same values, no wait across tasks);
- `--sync` wraps that optimizer in a `SyncReplicasOptimizer`; a model_fn that
  wraps it itself gets the runtime's sync hook from `make_session_run_hook`, which
  does not hang at the last step;
- the model's hooks run beside the runtime's (progress, summaries, checkpoints,
  the end-of-training protocol of `shutdown`), every step through the monitored
  session when one of them acts per step.

A step the runtime could not take over (an optimizer that is not a
`tf.compat.v1.train.Optimizer`, a train_op that moves global_step by itself) runs
as the model_fn built it, followed by a read of global_step; an async run may
then overshoot the last step by up to (workers - 1) steps, and says so.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Optional

import tensorflow as tf
from absl import logging

from lowlevel import errors
from lowlevel.cluster import probes
from lowlevel.cluster.spec import Cluster, Task
from lowlevel.config import TrainConfig
from lowlevel.data import replaceable
from lowlevel.models import input_fns, user
from lowlevel.models import spec as spec_lib
from lowlevel.models import warm_start as warm_start_lib
from lowlevel.models.model_fn_model import ModelFnModel
from lowlevel.modes import exact, fused_transfer, optimizer_capture, ps_products
from lowlevel.modes import towers as towers_lib
from lowlevel.runtime import graph as graph_lib
from lowlevel.runtime import hooks, placement
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
        worker, devices = placement.task_devices(cluster, task, config.towers or 1, worker_gpu)
        device = _device(config, model, cluster, task, worker_gpu, worker) if cluster else None
        with v1.device(device):
            global_step = v1.train.get_or_create_global_step()
            features, labels, input_hooks = _train_input(model)
            sync = bool(config.sync and cluster)
            num_workers = (cluster.num_workers or 1) if cluster else 1
            replicas = config.replicas_to_aggregate or num_workers
            made = _StepMaker(config, worker, global_step, sync, replicas, num_workers, cluster,
                              towers=len(devices))
            # its MatMuls and their gradients placed while it builds, each gradient beside
            # its forward op; a layer whose batch is not static stays classic
            on_ps = ps_products.wanted(config.ps_products, worker, len(devices))
            with optimizer_capture.capture(global_step, made.update, made.sync_hook,
                                           colocate_gradients=on_ps) as cap, \
                    ps_products.placed(on_ps):
                spec = (_tower_specs(model, features, labels, devices, worker)
                        if len(devices) > 1 else _call_model_fn(model, features, labels))
            if worker:
                fused = fused_transfer.fuse_reads(graph, v1.global_variables(), worker)
                if len(devices) > 1:
                    _check_towers(model, cap, made)
                    fused_ids = {id(v) for v in fused}
                    fused_transfer.share_reads(graph, [v for v in v1.global_variables()
                                                       if id(v) not in fused_ids], worker)
            if model.warm_start and not tf.train.latest_checkpoint(model.model_dir):
                warm_start_lib.warm_start(model.warm_start)
            step = _step_value(spec, cap, global_step, config.train_steps, cluster, model)
        return _assemble(config, model, cluster, task, graph, spec, step, global_step, made,
                         cap, input_hooks, _batch_size(labels, features), preempted)


def _seed(config: TrainConfig, model: ModelFnModel) -> int:
    seed = getattr(model.run_config, "tf_random_seed", None)
    return config.seed if seed is None else seed


def _train_input(model: ModelFnModel):
    """(features, labels, input hooks) of the training input_fn, in the current graph."""
    with user.calling("input_fn", model.input_fn):
        result = input_fns.call_input_fn(model.input_fn, TRAIN, model.params, model.run_config)
        # a user's Dataset: no autotune thread for a replaced session to wait for
        return input_fns.features_and_labels(replaceable.without_autotune(result))


def _call_model_fn(model: ModelFnModel, features, labels):
    """The model_fn's TRAIN `EstimatorSpec` (a failure: one line naming it, `user.calling`)."""
    with user.calling("model_fn", model.model_fn):
        return spec_lib.call_model_fn(model.model_fn, features, labels, TRAIN, model.params,
                                      model.run_config)


def _tower_specs(model: ModelFnModel, features, labels, devices, hub: str):
    """The model_fn called once per tower on its slice of the batch, its variables shared
    (`tf.compat.v1.get_variable` with reuse); the last tower's spec, whose train_op applies
    every tower's gradients (`_StepMaker.update`), with the towers' mean loss.

    Raises:
      errors.ModelFnError: the model_fn made new variables for a tower after the first.
    """
    logging.info("%d towers on %s, the input_fn's batch split among them; shared reads "
                 "and summed gradients on %s", len(devices), ", ".join(devices), hub)
    specs, first = [], None
    with v1.variable_scope(v1.get_variable_scope(), reuse=v1.AUTO_REUSE):
        for i, (device, (f, y)) in enumerate(zip(devices, towers_lib.split(
                [features, labels], len(devices)))):
            # tower 0 unscoped: a tf.Variable there keeps the name it has with one tower
            scope = v1.name_scope(f"tower_{i}") if i else contextlib.nullcontext()
            with v1.device(towers_lib.compute_on(device)), scope:
                specs.append(_call_model_fn(model, f, y))
            variables = v1.trainable_variables()
            first = variables if first is None else first
    if len(variables) != len(first):
        made = ", ".join(v.op.name for v in variables[len(first):][:3])
        _towers_error(model, len(devices), f"made new variables for its other towers "
                      f"({made}): towers share the variables tf.compat.v1.get_variable makes")
    return specs[-1]._replace(loss=towers_lib.mean([s.loss for s in specs], hub))


def _check_towers(model: ModelFnModel, cap, made) -> None:
    """Raises `errors.ModelFnError` when the towers' step is not the runtime's: the model's
    gradients not applied once per tower through a captured optimizer (`optimizer_capture`)."""
    own_sync = cap.sync_optimizer is not None and cap.sync_optimizer is not made.runtime_sync
    if own_sync or made.tower_applies != made.towers:
        _towers_error(model, made.towers, "did not apply its gradients once per tower through "
                      "a tf.compat.v1.train.Optimizer with the global step, or wrapped it in "
                      "its own SyncReplicasOptimizer (--sync does that)")


def _towers_error(model: ModelFnModel, towers: int, problem: str):
    raise errors.ModelFnError(f"--towers={towers}: model_fn {user.name(model.model_fn)} "
                              f"{problem}; or use --towers=1")


def _device(config: TrainConfig, model: ModelFnModel, cluster: Cluster, task: Task,
            worker_gpu: int, worker: Optional[str] = None):
    """The device function: variables on the ps tasks by bytes (the model measured in a
    scratch graph, with its input), compute on the worker (`placement.device_setter`)."""
    def probe():
        v1.train.get_or_create_global_step()
        features, labels, _ = _train_input(model)
        _call_model_fn(model, features, labels)

    sizes, tables = placement.measure(probe)
    return placement.device_setter(cluster.as_dict(), task.task_index, worker_gpu, sizes,
                                   task.job_name, tables, worker=worker)


class _StepMaker:
    """What the captured optimizer's apply becomes, and the sync hook (`optimizer_capture`).

    `worker_device`: the worker's compute device, where its small gradients are fused
    into one tensor per ps (`fused_transfer`); None in one process.
    """

    def __init__(self, config: TrainConfig, worker_device: Optional[str], global_step,
                 sync: bool, replicas: int, num_workers: int, cluster=None, towers: int = 1):
        self._config, self._cluster, self._worker = config, cluster, worker_device
        self._global_step = global_step
        self._sync, self._replicas, self._num_workers = sync, replicas, num_workers
        self.sync_hooks: list = []
        self.runtime_sync = None  # the SyncReplicasOptimizer `--sync` wrapped around the model's
        self.towers, self.tower_applies = towers, 0
        self._tower_grads: list = []  # [[(gradient, variable)]], a tower's each

    def update(self, opt, grads_and_vars):
        """The mode's update of `grads_and_vars`: int64, the global step after it.

        With towers, each tower's model_fn applies once: the towers before the last
        are kept, and the last one's update applies their average (`towers.average`)."""
        if self.towers > 1:
            self.tower_applies += 1
            self._tower_grads.append(list(grads_and_vars))
            if len(self._tower_grads) < self.towers:
                return tf.constant(0, tf.int64)  # never run: the last tower's step is
            variables = [v for _, v in self._tower_grads[0]]
            by_tower = [{id(v): g for g, v in t} for t in self._tower_grads]
            grads = towers_lib.average([[t.get(id(v)) for v in variables] for t in by_tower],
                                       self._worker)
            grads_and_vars = list(zip(grads, variables))
        if self._worker:
            grads_and_vars = fused_transfer.fuse_gradients(grads_and_vars, self._worker)
        if not self._sync:
            return exact.counted_update(opt, grads_and_vars, self._global_step,
                                        self._config.train_steps)
        self.runtime_sync = v1.train.SyncReplicasOptimizer(
            opt, replicas_to_aggregate=self._replicas, total_num_replicas=self._num_workers)
        return tf.identity(self.runtime_sync.apply_gradients(
            grads_and_vars, global_step=self._global_step))

    def sync_hook(self, sync_opt, is_chief: bool, num_tokens: int = -1):
        """The runtime's `hooks.SyncReplicasHook` for `sync_opt` (stops at the last step)."""
        hook = hooks.SyncReplicasHook(
            sync_opt, is_chief, self._global_step, self._config.train_steps,
            self._config.sync_timeout_secs, self._silent_peers, num_tokens=num_tokens)
        self.sync_hooks.append(hook)
        return hook

    def _silent_peers(self) -> list:
        return probes.silent_sync_peers(self._cluster)


def _step_value(spec, cap, global_step, last_step: int, cluster, model: ModelFnModel):
    """int64 scalar: the global step after a run of the model's step.

    The captured step's own value when the runtime made it; after a
    `SyncReplicasOptimizer`'s apply, the token it took (the global step after the
    chief's update); else a read of global_step after the model's train_op.
    """
    train_op = spec.train_op
    if cap.step is not None and _depends_on(train_op, cap.step):
        return _after(train_op, cap.step)
    if cap.sync_optimizer is not None:  # the chief's sync op moves global_step
        if not isinstance(train_op, tf.Operation):  # the token (a lazily read local step)
            return tf.identity(train_op)
        with tf.control_dependencies([train_op]):
            return global_step.read_value()
    if not _writes(train_op, global_step):
        raise errors.ModelFnError(
            f"model_fn {user.name(model.model_fn)}: its train_op does not increment the global "
            "step, so the run would never end: pass global_step=tf.compat.v1.train."
            "get_global_step() to the optimizer's minimize (or apply_gradients)")
    if cluster is not None and cluster.num_workers != 1:
        logging.warning(
            "the model_fn's train_op does not apply a tf.compat.v1.train.Optimizer with the "
            "global step: its steps are run as built, and an async run may end up to "
            "(workers - 1) steps past --train_steps=%d", last_step)
    with tf.control_dependencies([train_op]):
        return global_step.read_value()


def _ancestors(train_op):
    """Every op running `train_op` runs (its inputs' and control inputs' ancestry)."""
    seen, stack = set(), [train_op.op if isinstance(train_op, tf.Tensor) else train_op]
    while stack:
        op = stack.pop()
        if op in seen:
            continue
        seen.add(op)
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    return seen


def _depends_on(train_op, tensor) -> bool:
    """Whether running `train_op` runs `tensor`'s op."""
    return tensor.op in _ancestors(train_op)


# Ops that write a resource variable in place: one of them on global_step's handle moves it.
_WRITES = ("AssignAddVariableOp", "AssignVariableOp", "ResourceCountUpTo", "AssignSubVariableOp")


def _writes(train_op, global_step) -> bool:
    """Whether running `train_op` writes `global_step` (a graph walk, before anything runs)."""
    handle = global_step.handle.op
    return any(op.type in _WRITES and op.inputs and op.inputs[0].op is handle
               for op in _ancestors(train_op))


def _after(train_op, step):
    """`step`, fetched after the rest of `train_op` (the user's grouped ops) has run."""
    if isinstance(train_op, tf.Tensor) and train_op is step:
        return step
    with tf.control_dependencies([train_op]):
        return tf.identity(step)


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


def _assemble(config, model, cluster, task, graph, spec, step, global_step, made, cap,
              input_hooks, batch_size, preempted) -> graph_lib.TrainGraph:
    """The `TrainGraph`: scaffold, the model's hooks beside the runtime's, progress."""
    sync = made.runtime_sync or cap.sync_optimizer
    num_workers = (cluster.num_workers or 1) if cluster else 1
    # Gradients a sync step aggregates: --replicas_to_aggregate, or every worker (a model's
    # own SyncReplicasOptimizer keeps its figure private; this is its usual setting).
    replicas = (config.replicas_to_aggregate or num_workers) if sync is not None else 1
    # The runtime's sync hook is added by `session_hooks` for its own --sync; a model's
    # own SyncReplicasOptimizer gets it from make_session_run_hook (`made.sync_hooks`).
    mode = graph_lib.Mode(num_workers=num_workers,
                          replicas=replicas, sync=made.runtime_sync is not None, local=False)
    steps = hooks.LoopState()
    model_hooks = list(input_hooks) + list(model.hooks) + list(spec.training_hooks)
    if task.is_chief:
        model_hooks += list(spec.training_chief_hooks)
    # before the saver: a hook's variables made here are saved (early stopping's STOP)
    model_hooks = [_every_step(_on_runtime(h, steps)) for h in model_hooks
                   if h not in made.sync_hooks]
    scaffold, saved, optimizer_names = graph_lib.scaffold_for(
        config, graph, None, _local_init(spec.scaffold), None, spec.scaffold)
    examples_per_step = batch_size * (replicas if sync is not None else 1)
    progress = progress_lib.ProgressHook(global_step, spec.loss, examples_per_step,
                                         config.train_steps, config.log_every_secs, steps,
                                         config.output_dir if task.is_chief else None,
                                         config.warmup_steps, batch_size)
    step_ops = graph_lib.Step(spec.loss, None, step, sync_optimizer=sync)
    run_hooks = graph_lib.session_hooks(config, mode, cluster, task, step_ops, global_step,
                                        scaffold, steps, progress, None, preempted,
                                        extra=made.sync_hooks + model_hooks,
                                        may_end_early=True)
    return graph_lib.TrainGraph(graph, step, None, spec.loss, global_step, scaffold, run_hooks,
                                progress, None, examples_per_step, steps, saved,
                                optimizer_names)


def _local_init(scaffold):
    """The model's own local init op (its scaffold's), or None for the default."""
    return getattr(scaffold, "local_init_op", None) if scaffold is not None else None
