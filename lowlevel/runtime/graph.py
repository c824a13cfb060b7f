"""The training graph of one worker, for every model, and its session hooks.

Between-graph replication: every worker builds the whole graph, with its variables on
the ps tasks (`placement`: byte-balanced, measured by building the model once in a
scratch graph; a built-in model's large tables partitioned), its input in its graph,
and the step every model trains with (`runtime.step`: its model_fn in TRAIN mode taken
over by the runtime). One `build` for both kinds of model (`trainables`), which give
what differs:

- the model_fn and the device function (`placed`): a user's model_fn as it is; a built-in
  model's (`models.catalogue.model_fn`) with the params of the flags and its tables'
  partitioner;
- the input (`train_input`, a `trainables.TrainInput`): a user's training input_fn; a
  built-in model's shard of its data set or the data queue (`spans`);
- a built-in model's evaluation of the test split at the end, inside the chief's session
  (`evaluation.FinalEvalHook`); a user's model is evaluated after the run.

The mode follows from the config and the cluster, for every model: in-process (no
cluster); exact (`--communication_period=1`: small variables fused into one transfer per
ps, products on the ps, towers; async with a counted update, `--sync` through
`SyncReplicasOptimizer`, or with the data queue its live workers' sync);
communication-reduced (`--communication_period=K`: local copies and exchanges,
`local_sgd`, async or model averaging).

Around the step: a model's own hooks beside the runtime's (progress, summaries,
checkpoints), every step through the monitored session when one of them acts per step;
a model_fn that wraps its optimizer in a `SyncReplicasOptimizer` itself gets the
runtime's sync hook from `make_session_run_hook`, which does not hang at the last step;
a warm start when the model_dir has no checkpoint yet. The hooks come in the order of
the end-of-training protocol (`shutdown.end_of_training_hooks`). Running the graph is
`training.train`.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Optional

import tensorflow as tf

from lowlevel.cluster import probes
from lowlevel.cluster.spec import Cluster, Task
from lowlevel.config import TrainConfig
from lowlevel.data import spans
from lowlevel.models import warm_start as warm_start_lib
from lowlevel.modes import elastic_sync, local_sgd
from lowlevel.outputs import checkpoints
from lowlevel.runtime import evaluation, hooks, placement, shutdown, start
from lowlevel.runtime import progress as progress_lib
from lowlevel.runtime import step as step_lib

v1 = tf.compat.v1


@dataclasses.dataclass
class TrainGraph:
    """What `build` puts in the graph, for one worker."""

    graph: tf.Graph
    train_op: Optional[tf.Tensor]  # int64 scalar: the global step after this step's update
    local_ops: Optional[local_sgd.LocalSGDOps]  # instead, with --communication_period > 1
    loss: tf.Tensor  # float32 scalar: the batch loss
    global_step: tf.Variable  # int64 scalar, on a ps
    scaffold: v1.train.Scaffold
    hooks: list[v1.train.SessionRunHook]  # in the order of the end-of-training protocol
    progress: progress_lib.ProgressHook
    final_eval: Optional[evaluation.FinalEvalHook]
    examples_per_step: int  # examples per global step, all workers
    steps: hooks.LoopState  # the global step as the loop last saw it
    saved: dict  # the saver's {name in checkpoints: variable or its shards}
    optimizer_names: set  # the names in `saved` that are optimizer state
    span_input: Optional[object] = None  # `spans.SpanInput` with --data_sharding=queue


@dataclasses.dataclass(frozen=True)
class Mode:
    """How a task trains: derived from the config and the cluster, then from its step."""

    num_workers: int  # the cluster's workers; 1 on a sparseCluster (it does not say)
    replicas: int  # replicas_to_aggregate in effect (1 without a sync optimizer)
    sync: bool  # SyncReplicasOptimizer (exact), the data queue's sync, or model averaging
    local: bool  # communication-reduced

    @classmethod
    def of(cls, config: TrainConfig, cluster: Optional[Cluster]) -> "Mode":
        """The mode the flags ask for (sync only from the data queue on a sparseCluster,
        which counts the live workers)."""
        num_workers = (cluster.num_workers or 1) if cluster else 1
        return cls(num_workers, config.replicas_to_aggregate or num_workers,
                   bool(config.sync and cluster),
                   bool(cluster and config.communication_period > 1))

    def of_step(self, config: TrainConfig, step: step_lib.TrainStep) -> "Mode":
        """The mode the step took: sync if the runtime's sync optimizer or the data queue's
        sync wraps it; replicas from the flags wherever a sync optimizer aggregates (a
        model's own keeps its figure private; every worker is its usual setting)."""
        aggregates = step.sync_optimizer is not None or step.elastic is not None
        return dataclasses.replace(
            self, replicas=(config.replicas_to_aggregate or self.num_workers) if aggregates
            else 1, sync=step.runtime_sync is not None or step.elastic is not None,
            local=step.local_ops is not None)


def build(config: TrainConfig, trainable, cluster: Optional[Cluster], task: Task,
          worker_gpu: int = 0, preempted: Optional[threading.Event] = None) -> TrainGraph:
    """Builds worker `task`'s training graph of `trainable` (the in-process one with
    `cluster=None`).

    Args:
      config: the run's settings (train_steps, sync, checkpoints, timeouts).
      trainable: what it trains (`trainables.Builtin` or `trainables.ModelFn`): its
        model_fn, placement, input and final evaluation.
      worker_gpu: GPUs per worker (0: compute on the CPU).
      preempted: set when the task is being preempted; the end-of-training
        hooks (final evaluation, shutdown handshake) then do nothing.
    Raises:
      UsageError: --data_sharding=queue on a worker with towers.
      Whatever the input_fn and model_fn raise, with tensorflow_estimator 2.15's
      messages for a wrong result (`lowlevel.models.spec`, `input_fns`).
    """
    preempted = preempted or threading.Event()
    mode = Mode.of(config, cluster)
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(trainable.seed(config))
        # one device in the communication-reduced mode
        hub, devices = placement.task_devices(cluster, task,
                                              1 if mode.local else trainable.towers(config),
                                              worker_gpu)
        model, device = trainable.placed(config, cluster, task, worker_gpu, hub)
        with v1.device(device):
            global_step = v1.train.get_or_create_global_step()
            data = trainable.train_input(config, cluster, task, len(devices))
            step = step_lib.build(config, model, data.features, data.labels, global_step, hub,
                                  devices, cluster, data.span,
                                  data.next_batch if mode.local else None,
                                  trainable.table_optimizer(config))
            final_eval = trainable.final_eval(model, preempted) if task.is_chief else None
            if model.warm_start and not tf.train.latest_checkpoint(model.model_dir):
                warm_start_lib.warm_start(model.warm_start)
        return _assemble(config, mode.of_step(config, step), cluster, task, model, step,
                         global_step, data, final_eval, trainable.ends_early, preempted)


def _assemble(config: TrainConfig, mode: Mode, cluster, task: Task, model, step, global_step,
              data, final_eval, may_end_early: bool, preempted) -> TrainGraph:
    """The `TrainGraph` around the step: the loss summary, scaffold, the model's hooks beside
    the runtime's, progress."""
    graph, spec = v1.get_default_graph(), step.spec
    if not any(s.op.name == "loss" for s in v1.get_collection(v1.GraphKeys.SUMMARIES)):
        v1.summary.scalar("loss", spec.loss)  # unless the model made one (as estimator 2.15)
    steps = hooks.LoopState()
    model_hooks = list(data.hooks) + list(model.hooks) + list(spec.training_hooks)
    if task.is_chief:
        model_hooks += list(spec.training_chief_hooks)
    # before the saver: a hook's variables made here are saved (early stopping's STOP)
    model_hooks = [_every_step(_on_runtime(h, steps)) for h in model_hooks
                   if h not in step.sync_hooks]
    local_init, around_save = _elastic_state(config, step, data.initializer, data.span)
    scaffold, saved, optimizer_names = scaffold_for(config, graph, step.local_ops, local_init,
                                                    data.feed, spec.scaffold, around_save,
                                                    saves=task.is_chief)
    examples_per_step = data.batch_size * mode.replicas
    progress = progress_lib.ProgressHook(global_step, spec.loss, examples_per_step,
                                         config.train_steps, config.log_every_secs, steps,
                                         config.output_dir if task.is_chief else None,
                                         config.warmup_steps, data.batch_size,
                                         step_from_loop=mode.local)
    run_hooks = session_hooks(config, mode, cluster, task, step, global_step, scaffold, steps,
                              progress, final_eval, preempted,
                              extra=step.sync_hooks + model_hooks,
                              may_end_early=may_end_early, span_input=data.span)
    return TrainGraph(graph, step.value, step.local_ops, spec.loss, global_step, scaffold,
                      run_hooks, progress, final_eval, examples_per_step, steps, saved,
                      optimizer_names, data.span)


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


def _elastic_state(config: TrainConfig, step: step_lib.TrainStep, iter_init, span_input=None):
    """(local init, (before, after) each save) with the data queue: sync, its step state
    set up at local init and reset by a restore, its steps' completion paused while a
    checkpoint is written (`elastic_sync`); async, the save gate set up at local init and
    the steps' start paused once those begun have committed (`spans.SaveHold`); without
    the queue (iter_init, (None, None))."""
    if span_input is None and step.elastic is None:
        return iter_init, (None, None)
    secs = hooks.save_timeout_secs(config.step_timeout_secs,
                                   _variable_bytes(v1.global_variables()))
    if step.elastic is None:
        hold = spans.SaveHold(span_input.queue, secs)
        return tf.group(iter_init, span_input.queue.local_init()), (hold.before, hold.after)
    v1.add_to_collection(checkpoints.EXTRA_SAVEABLES, elastic_sync.StepStateReset(step.elastic))
    return (tf.group(iter_init, step.elastic.local_init()), step.elastic.pause(secs))


def scaffold_for(config: TrainConfig, graph: tf.Graph, local_ops, iter_init, feed,
                 model_scaffold=None, around_save=(None, None), saves: bool = True):
    """(scaffold, saved, optimizer names): local init and a saver of the portable names.

    Every mode saves the same names (`checkpoints.saved_names`), so a
    checkpoint resumes in any mode; the communication-reduced mode's local
    optimizer state is saved through its twins on the ps and loaded from them
    at local init (`lowlevel.modes.optimizer_state`).

    `iter_init`: the input's initializer, or None; `model_scaffold`: a model_fn's
    own `Scaffold`, whose init_op, init_fn, ready ops and local init op are kept
    (its saver is replaced by the portable one). `around_save`: ops run before and
    after each save (`checkpoints.StateSaver`), or None. `saves`: False on a worker that
    is not the chief, whose saver builds no ops (`checkpoints.WorkerSaver`).
    """
    local_init = tf.group(v1.local_variables_initializer(), v1.tables_initializer(),
                          *([iter_init] if iter_init is not None else []),
                          *_own(model_scaffold, "local_init_op"))
    state = local_ops.state if local_ops else None
    if state:  # the optimizer's local state starts from its twins on the ps
        local_init = state.load_state(after=local_init)
    saved = checkpoints.saved_names(graph.get_collection(v1.GraphKeys.GLOBAL_VARIABLES),
                                    state.names if state else None)
    timeout_secs = hooks.save_timeout_secs(config.step_timeout_secs, _variable_bytes(
        graph.get_collection(v1.GraphKeys.GLOBAL_VARIABLES)))
    saver = checkpoints.StateSaver(
        saved, state.save_state if state else around_save[0], after_save=around_save[1],
        sharded=True, max_to_keep=config.keep_checkpoint_max, save_relative_paths=True,
        timeout_secs=timeout_secs) if saves else checkpoints.WorkerSaver(timeout_secs)
    scaffold = v1.train.Scaffold(**_kept(model_scaffold), local_init_op=local_init,
                                 local_init_feed_dict=feed, saver=saver)
    model_names = checkpoints.saved_names(v1.trainable_variables())
    return scaffold, saved, set(saved) - set(model_names) - {checkpoints.GLOBAL_STEP}


def _own(scaffold, name: str) -> list:
    """[the model scaffold's `name`] if it set one, else []."""
    value = getattr(scaffold, name, None) if scaffold is not None else None
    return [value] if value is not None else []


def _kept(scaffold) -> dict:
    """The parts of a model_fn's `Scaffold` the runtime's keeps (all but saver and local init)."""
    if scaffold is None:
        return {}
    names = ("init_op", "init_feed_dict", "init_fn", "ready_op", "ready_for_local_init_op",
             "summary_op")
    return {n: getattr(scaffold, n) for n in names if getattr(scaffold, n, None) is not None}


def _variable_bytes(variables) -> int:
    """Bytes of `variables` (shapes fully defined; others count 0)."""
    return sum((v.shape.num_elements() or 0) * v.dtype.size for v in variables)


def session_hooks(config, mode: Mode, cluster, task, step: step_lib.TrainStep, global_step,
                  scaffold, steps, progress, final_eval, preempted, extra=(), may_end_early=False,
                  span_input=None) -> list:
    """The task's session hooks, in the order of the end-of-training protocol (`shutdown`).

    `extra`: a model_fn's own hooks, run with the training hooks (before the
    chief's summaries and checkpoint). `may_end_early`: the chief may stop before
    `--train_steps` (a model_fn's hook, its input's end): the run then ends on every
    task ("A run ended early" in `shutdown`; exact and sync modes). The built-in
    models never do, and their workers skip the watch.
    """
    channel = shutdown.ShutdownChannel(cluster.num_ps) if cluster else None
    training = [progress, *extra]
    if mode.local and not mode.sync and cluster and cluster.num_workers and config.start_wait_secs:
        others = {t.replica_index: f"{t.job_name}{t.task_index} at "
                  f"{cluster.hosts(t.job_name)[t.task_index]}"
                  for t in cluster.training_tasks() if not t.is_chief}
        barrier = start.StartBarrier(global_step, shutdown.ps_device(0))
        training.insert(0, start.StartTogetherHook(barrier, task.replica_index, others,
                                                   config.start_wait_secs, preempted))
    if step.elastic is not None:
        training.append(elastic_sync.TickHook(step.elastic))
    elif mode.sync:
        # Model averaging starts without tokens: a worker's first exchange must
        # wait for the first average, not pull the model it started from.
        training.append(hooks.SyncReplicasHook(
            step.sync_optimizer, task.is_chief, global_step, config.train_steps,
            config.sync_timeout_secs, lambda: probes.silent_sync_peers(cluster),
            num_tokens=0 if mode.local else -1))
    if span_input is not None and cluster:  # after the ticks' end: no heartbeat after it
        leave = step.elastic.leave() if step.elastic is not None else \
            span_input.queue.release(span_input.worker)
        training.append(hooks.LeaveHook(leave, preempted))
    checkpoint = None
    if task.is_chief and config.output_dir:
        state_bytes = _variable_bytes(v1.global_variables())
        training.append(hooks.SummaryHook(config.output_dir,
                                          max(config.log_every_secs, 1.0), steps,
                                          step_from_loop=mode.local))
        checkpoint = hooks.CheckpointHook(scaffold.saver, config.output_dir, steps,
                                          config.save_checkpoint_steps,
                                          config.save_checkpoint_secs,
                                          config.max_checkpoint_failures,
                                          state_bytes=state_bytes,
                                          save_timeout_secs=hooks.save_timeout_secs(
                                              config.step_timeout_secs, state_bytes))
    return shutdown.end_of_training_hooks(
        task, cluster, channel, training, checkpoint=checkpoint, final_eval=final_eval,
        timeout_secs=config.shutdown_timeout_secs, preempted=preempted,
        global_step=global_step if may_end_early and not mode.local else None,
        last_step=config.train_steps, sync=mode.sync or step.sync_optimizer is not None)
