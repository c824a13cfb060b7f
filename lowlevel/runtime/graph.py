"""The training graph of one worker for a built-in model, per mode, and its session hooks.

Between-graph replication: every worker builds the whole graph, with its
variables on the ps tasks (`placement`: byte-balanced, large tables partitioned),
its input from its shard of the data set or from the data queue (`spans`).
`build` picks the mode:

- in-process (no cluster);
- exact (`--communication_period=1`): small variables fused into one transfer per
  ps, products on the ps, towers; async with a counted update, `--sync` through
  `SyncReplicasOptimizer`, or with the data queue its live workers' sync;
- communication-reduced (`--communication_period=K`): local copies and
  exchanges (`local_sgd`), async or model averaging.

In every mode the step is the built-in model's model_fn (`models.catalogue.model_fn`)
through the step every model_fn trains with (`runtime.step`).

The chief evaluates the test split at the end, inside its session
(`evaluation.FinalEvalHook`). The hooks come in the order of the end-of-training
protocol (`shutdown.end_of_training_hooks`). Running the graph is `training.train`.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Optional

import tensorflow as tf
from absl import logging

from lowlevel import output_layout
from lowlevel.cluster import probes
from lowlevel.cluster.spec import Cluster, Task
from lowlevel.config import TrainConfig
from lowlevel.errors import UsageError
from lowlevel.data import images as data_lib
from lowlevel.data import spans
from lowlevel.models import catalogue as models
from lowlevel.models.model_fn_model import ModelFnModel
from lowlevel.models.optimizers import make_optimizer
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
    """How a task trains: derived from the config and the cluster."""

    num_workers: int
    replicas: int  # replicas_to_aggregate in effect
    sync: bool  # SyncReplicasOptimizer (exact), the data queue's sync, or model averaging
    local: bool  # communication-reduced
    declared: Optional[int] = 1  # the cluster's workers; None on a sparseCluster

    @classmethod
    def of(cls, config: TrainConfig, cluster: Optional[Cluster]) -> "Mode":
        # A sparseCluster (dynamic workers) does not say how many: one replica here (sync
        # only from the data queue, which counts the live workers).
        num_workers = (cluster.num_workers or 1) if cluster else 1
        return cls(num_workers, config.replicas_to_aggregate or num_workers,
                   bool(config.sync and cluster),
                   bool(cluster and config.communication_period > 1),
                   cluster.num_workers if cluster else 1)


@dataclasses.dataclass
class Step:
    """The training ops one mode builds."""

    loss: tf.Tensor
    train_op: Optional[tf.Tensor] = None
    local_ops: Optional[local_sgd.LocalSGDOps] = None
    sync_optimizer: Optional[v1.train.SyncReplicasOptimizer] = None
    elastic: Optional[elastic_sync.ElasticSync] = None  # sync from the data queue


def build(config: TrainConfig, data: data_lib.DataSet, cluster: Optional[Cluster],
          task: Task, worker_gpu: int, preempted: Optional[threading.Event] = None
          ) -> TrainGraph:
    """Builds worker `task`'s training graph (the in-process one with `cluster=None`).

    Args:
      worker_gpu: GPUs per worker (0: compute on the CPU).
      preempted: set when the task is being preempted; the end-of-training
        hooks (final evaluation, shutdown handshake) then do nothing.
    """
    preempted = preempted or threading.Event()
    mode = Mode.of(config, cluster)
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(config.seed)
        # one device in one process and in the communication-reduced mode
        hub, devices = placement.task_devices(cluster, task, 1 if mode.local else config.towers,
                                              worker_gpu)
        device, partitioner = (_placement(config, data, cluster, task, worker_gpu, hub)
                               if cluster else (None, None))
        params = models.params_for(config, data, partitioner, cluster.num_ps if cluster else 0)
        with v1.device(device):
            global_step = v1.train.get_or_create_global_step()
            iter_init, feed, iterator, span_input = _train_input(config, data, cluster, task,
                                                                 mode, len(devices))
            images, labels = iterator.get_next()
            step = _model_fn_step(config, params, images, labels, global_step, hub, devices,
                                  cluster, span_input,
                                  iterator.get_next if mode.local else None)
            final_eval = None
            if task.is_chief:
                final_eval = evaluation.FinalEvalHook(
                    evaluation.build(data, data.test, models.logits_fn(params)),
                    skip=preempted)
        v1.summary.scalar("loss", step.loss)
        iter_init, around_save = _elastic_state(config, step, iter_init, span_input)
        scaffold, saved, optimizer_names = scaffold_for(config, graph, step.local_ops,
                                                     iter_init, feed, around_save=around_save)
        examples_per_step = (config.batch_size * len(devices) *
                             (mode.replicas if mode.sync else 1))
        steps = hooks.LoopState()
        progress = progress_lib.ProgressHook(global_step, step.loss, examples_per_step,
                                      config.train_steps, config.log_every_secs, steps,
                                      config.output_dir if task.is_chief else None,
                                      config.warmup_steps, config.batch_size * len(devices),
                                      step_from_loop=mode.local)
        run_hooks = session_hooks(config, mode, cluster, task, step, global_step, scaffold,
                                  steps, progress, final_eval, preempted,
                                  span_input=span_input)
    return TrainGraph(graph, step.train_op, step.local_ops, step.loss, global_step, scaffold,
                      run_hooks, progress, final_eval, examples_per_step, steps, saved,
                      optimizer_names, span_input)


def _elastic_state(config: TrainConfig, step: Step, iter_init, span_input=None):
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


def _train_input(config: TrainConfig, data, cluster: Optional[Cluster], task: Task,
                 mode: Mode, towers: int):
    """(initializer, its feed, iterator, `spans.SpanInput` or None) of the worker's input:
    the data queue's (`_span_input`), else its fixed shard of the training split."""
    span_input = _span_input(config, data, cluster, task, mode, towers)
    if span_input is not None:
        return span_input.initializer, {}, span_input, span_input
    if cluster and cluster.sparse:  # dynamic workers: the whole split, own order
        shards, shard, seed = 1, 0, config.seed + task.replica_index
    else:
        shards, shard, seed = mode.num_workers, task.replica_index, config.seed
    return (*data.train_iterator(config.batch_size * towers, shards, shard, seed), None)


def _span_input(config: TrainConfig, data, cluster: Optional[Cluster], task: Task, mode: Mode,
                towers: int):
    """The worker's `spans.SpanInput` (the queue on ps 0) with --data_sharding=queue in
    effect (`TrainConfig.span_queue`), else None.

    Raises:
      UsageError: --data_sharding=queue on a worker with towers (the GPUs it found).
    """
    if not config.span_queue(cluster is not None, mode.sync):
        return None
    if towers > 1:
        if config.data_sharding == "queue":
            raise UsageError(f"--data_sharding=queue: not with towers ({towers} devices in "
                             "this worker); give --towers=1 or --data_sharding=static")
        return None
    logging.info("data: %d span(s) (files) handed out by the queue on /job:ps/task:0",
                 len(data.train.files))
    cache = (output_layout.line_counts_file(config.output_dir)
             if config.output_dir and config.count_examples else None)
    return data.span_input(config.batch_size, task.replica_index, "/job:ps/task:0",
                           config.span_lease_secs, config.seed, config.count_examples, cache,
                           sync=mode.sync)


def scaffold_for(config: TrainConfig, graph: tf.Graph, local_ops, iter_init, feed,
                 model_scaffold=None, around_save=(None, None)):
    """(scaffold, saved, optimizer names): local init and a saver of the portable names.

    Every mode saves the same names (`checkpoints.saved_names`), so a
    checkpoint resumes in any mode; the communication-reduced mode's local
    optimizer state is saved through its twins on the ps and loaded from them
    at local init (`lowlevel.modes.optimizer_state`).

    `iter_init`: the input's initializer, or None; `model_scaffold`: a model_fn's
    own `Scaffold`, whose init_op, init_fn, ready ops and local init op are kept
    (its saver is replaced by the portable one). `around_save`: ops run before and
    after each save (`checkpoints.StateSaver`), or None.
    """
    local_init = tf.group(v1.local_variables_initializer(), v1.tables_initializer(),
                          *([iter_init] if iter_init is not None else []),
                          *_own(model_scaffold, "local_init_op"))
    state = local_ops.state if local_ops else None
    if state:  # the optimizer's local state starts from its twins on the ps
        local_init = state.load_state(after=local_init)
    saved = checkpoints.saved_names(graph.get_collection(v1.GraphKeys.GLOBAL_VARIABLES),
                                    state.names if state else None)
    scaffold = v1.train.Scaffold(
        **_kept(model_scaffold), local_init_op=local_init, local_init_feed_dict=feed,
        saver=checkpoints.StateSaver(saved, state.save_state if state else around_save[0],
                                     after_save=around_save[1], sharded=True,
                                     max_to_keep=config.keep_checkpoint_max,
                                     save_relative_paths=True,
                                     timeout_secs=hooks.save_timeout_secs(
                                         config.step_timeout_secs, _variable_bytes(
                                             graph.get_collection(
                                                 v1.GraphKeys.GLOBAL_VARIABLES)))))
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


def _placement(config: TrainConfig, data: data_lib.DataSet, cluster: Cluster, task: Task,
               worker_gpu: int, hub: str):
    """(device function, variable partitioner or None) of a training task.

    The model is measured unsharded for its total bytes, which size the
    shards, and then sharded, for the plan that balances the shards' bytes
    over the ps tasks (`placement`).
    """
    def probe(partitioner):
        return lambda: models.for_config(config, data, partitioner, cluster.num_ps)(
            data.probe_inputs())

    whole, tables = placement.measure(probe(None))
    partitioner = placement.partitioner(cluster.num_ps, sum(whole.values()),
                                        sum(whole[n] for n in tables))
    sizes, tables = placement.measure(probe(partitioner))
    device = placement.device_setter(cluster.as_dict(), task.task_index, worker_gpu, sizes,
                                     task.job_name, tables, worker=hub)
    return device, partitioner


def _model_fn_step(config, params: dict, images, labels, global_step, worker: Optional[str],
                   devices, cluster: Optional[Cluster], span=None, next_batch=None) -> Step:
    """The built-in model's `model_fn` (`models.catalogue.model_fn` with `params`) through
    the step every model_fn trains with (`runtime.step`): in one process; in the exact
    mode with the fused transfer, products on the ps, towers, the counted update,
    `--sync`, the data queue's batch check and commit and its sync; in the
    communication-reduced mode local steps (in blocks of batches from `next_batch`) and
    exchanges, its tables updated by an optimizer of their own. Its training accuracy is
    the model_fn's summary."""
    model = ModelFnModel(models.model_fn, params, run_config=None,
                         model_dir=config.output_dir or "")
    made = step_lib.build(config, model, images, labels, global_step, worker, devices,
                          cluster, span, next_batch,
                          lambda: make_optimizer(config.optimizer, config.lr))
    return Step(made.spec.loss, made.value, made.local_ops,
                sync_optimizer=made.sync_optimizer, elastic=made.elastic)


def _variable_bytes(variables) -> int:
    """Bytes of `variables` (shapes fully defined; others count 0)."""
    return sum((v.shape.num_elements() or 0) * v.dtype.size for v in variables)


def session_hooks(config, mode: Mode, cluster, task, step: Step, global_step, scaffold, steps,
                  progress, final_eval, preempted, extra=(), may_end_early=False,
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
