"""The training graph of one worker, per mode, and its session hooks.

Between-graph replication: every worker builds the whole graph, with its
variables on the ps tasks (`placement`). `build` picks the mode:

- in-process (no cluster): plain gradients, counted up to the last step;
- exact (`--communication_period=1`): small variables fused into one
  transfer per ps (`exact`); async with a counted update, or `--sync`
  through `SyncReplicasOptimizer`;
- communication-reduced (`--communication_period=K`): local copies and
  exchanges (`local_sgd`), async or model averaging.

The hooks come in the order of the end-of-training protocol
(`shutdown.end_of_training_hooks`). Running the graph is `training.train`.
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
from lowlevel.models import embeddings
from lowlevel.models.optimizers import make_optimizer
from lowlevel.modes import elastic_sync, exact, fused_transfer, local_sgd, ps_products
from lowlevel.modes import towers as towers_lib
from lowlevel.outputs import checkpoints
from lowlevel.runtime import evaluation, hooks, placement, shutdown, start
from lowlevel.runtime import progress as progress_lib

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
    accuracy: tf.Tensor
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
        model_fn = models.for_config(config, data, partitioner,
                                     cluster.num_ps if cluster else 0)
        with v1.device(device):
            global_step = v1.train.get_or_create_global_step()
            iter_init, feed, iterator, span_input = _train_input(config, data, cluster, task,
                                                                 mode, len(devices))
            images, labels = iterator.get_next()
            opt = make_optimizer(config.optimizer, config.lr)
            if mode.local:
                step = _local_sgd_step(config, mode, model_fn, images, labels, iterator, opt,
                                       global_step, hub)
            elif cluster:
                step = _exact_step(config, mode, model_fn, images, labels, opt, global_step,
                                   hub, data.probe_inputs, devices, span_input)
            else:
                step = _in_process_step(config, model_fn, images, labels, opt, global_step)
            final_eval = None
            if task.is_chief:
                final_eval = evaluation.FinalEvalHook(
                    evaluation.build(data, data.test, model_fn), skip=preempted)
        v1.summary.scalar("loss", step.loss)
        v1.summary.scalar("accuracy", step.accuracy)
        iter_init, around_save = _elastic_state(config, step, iter_init, span_input)
        scaffold, saved, optimizer_names = scaffold_for(config, graph, step.local_ops,
                                                     iter_init, feed, around_save=around_save)
        examples_per_step = (config.batch_size * len(devices) *
                             (mode.replicas if mode.sync else 1))
        steps = hooks.LoopState()
        progress = progress_lib.ProgressHook(global_step, step.loss, examples_per_step,
                                      config.train_steps, config.log_every_secs, steps,
                                      config.output_dir if task.is_chief else None,
                                      config.warmup_steps, config.batch_size * len(devices))
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


def _in_process_step(config, model_fn, images, labels, opt, global_step) -> Step:
    """One process, no servers: the plain gradients, counted up to the last step."""
    loss, accuracy = models.loss_and_accuracy(model_fn(images), labels)
    grads = [(g, v) for g, v in opt.compute_gradients(loss) if g is not None]
    return Step(loss, accuracy,
                 exact.counted_update(opt, grads, global_step, config.train_steps))


def _exact_step(config, mode: Mode, model_fn, images, labels, opt, global_step,
                worker_device: str, probe_inputs, devices=(None,), span=None) -> Step:
    """The exact mode: small variables travel together (`lowlevel.modes.fused_transfer`, as
    for a model_fn), dense layers' products run where they move fewest bytes
    (`lowlevel.modes.ps_products`); async or sync.

    `devices`: more than one, the step's towers (`lowlevel.modes.towers`), with
    `worker_device` their hub; they keep their products (a tower's product on the
    ps would send its inputs there once per tower). `span`: the batch's check and
    commit (`spans.SpanInput`), async only."""
    graph = v1.get_default_graph()
    first = len(graph.get_operations())
    model_fn(probe_inputs())  # creates the variables
    on_ps = ps_products.wanted(config.ps_products, worker_device, len(devices))
    on_ps_only = (ps_products.forward_layer_variables(graph.get_operations()[first:],
                                                      config.batch_size) if on_ps else set())
    # sync from the data queue: global_step read before every parameter (elastic_sync, 1.)
    after = [global_step.read_value()] if mode.sync and span is not None else []
    with ps_products.placed(on_ps), tf.control_dependencies(after):
        if len(devices) > 1:
            logging.info("%d towers on %s, %d examples each; shared reads and summed "
                         "gradients on %s", len(devices), ", ".join(devices),
                         config.batch_size, worker_device)
            losses, loss, accuracy = _tower_losses(model_fn, images, labels, devices,
                                                   worker_device)
        else:
            loss, accuracy = models.loss_and_accuracy(model_fn(images), labels)
    grads = _fused_gradients(graph, loss, losses if len(devices) > 1 else None, devices,
                             worker_device, on_ps_only, after)
    if not mode.sync:
        return Step(loss, accuracy, exact.counted_update(opt, grads, global_step,
                                                         config.train_steps, span=span))
    return _sync_step(config, mode, opt, grads, global_step, loss, accuracy, span,
                      after[0] if after else None)


def _fused_gradients(graph, loss, losses, devices, worker_device: str, on_ps_only: set,
                     after) -> list:
    """[(gradient, variable)] of the built step, its small variables read in one tensor per
    ps and their gradients pushed in one (`fused_transfer`; not an embedding table, not a
    forward layer's variable, `ps_products`); with towers (`losses`, one per device),
    every other variable read once a step for all of them."""
    variables = v1.trainable_variables()
    grads = (towers_lib.gradients(losses, variables, devices, worker_device)
             if losses is not None else tf.gradients(loss, variables))
    pairs = [(g, v) for g, v in zip(grads, variables) if g is not None]
    fused = {id(v) for v in fused_transfer.fuse_reads(
        graph, [v for v in variables if v.op.name not in on_ps_only
                and not embeddings.is_table(v)], worker_device, after)}
    if losses is not None:  # every other variable read once a step, for all the towers
        fused_transfer.share_reads(graph, [v for v in variables if id(v) not in fused],
                                   worker_device)
    return fused_transfer.fuse_gradients(pairs, worker_device)


def _sync_step(config, mode: Mode, opt, grads, global_step, loss, accuracy, span=None,
               local_step=None) -> Step:
    """The exact mode's sync step: through `SyncReplicasOptimizer`, or with the data queue
    (`span`) through `elastic_sync` (its step `local_step`, read before the parameters)."""
    if span is not None:
        cap = config.replicas_to_aggregate or mode.declared
        elastic = elastic_sync.ElasticSync(span, opt, grads, global_step, local_step,
                                           config.train_steps, cap, config.min_replicas,
                                           config.sync_live_secs, span.worker)
        return Step(loss, accuracy, elastic.push(), elastic=elastic)
    sync_opt = v1.train.SyncReplicasOptimizer(opt, replicas_to_aggregate=mode.replicas,
                                              total_num_replicas=mode.num_workers)
    # The step's value is the token it took, which the chief's sync op fills with the
    # global step after its update: a worker stops as soon as the last step is done
    # (only the sync op moves global_step). Not a read of global_step after the token:
    # that costs two more hops (the token's assign on the worker, then a control edge
    # back to the ps and the value out again), ~0.6 ms a step (benchmarks/NOTES.md).
    train_op = tf.identity(sync_opt.apply_gradients(grads, global_step=global_step))
    return Step(loss, accuracy, train_op, sync_optimizer=sync_opt)


def _tower_losses(model_fn, images, labels, devices, hub: str):
    """([tower loss], loss, accuracy): the towers' losses (`towers.build`), and the mean
    loss and accuracy of the worker's batch on `hub`."""
    per_tower = towers_lib.build(
        lambda x, y: models.loss_and_accuracy(model_fn(x), y), [images, labels], devices)
    losses, accuracies = zip(*per_tower)
    return losses, towers_lib.mean(losses, hub), towers_lib.mean(accuracies, hub)


def _local_sgd_step(config, mode: Mode, model_fn, images, labels, iterator, opt,
                    global_step, worker_device: str) -> Step:
    """The communication-reduced mode: the model computes with worker-local copies.

    `iterator` gives the batches of a block of local steps run at once (`local_sgd.build`).
    """
    copies = local_sgd.LocalCopies(worker_device)

    def loss_on(batch_images, batch_labels):
        with v1.variable_scope(v1.get_variable_scope(), custom_getter=copies):
            return models.loss_and_accuracy(model_fn(batch_images), batch_labels)

    loss, accuracy = loss_on(images, labels)
    ops = local_sgd.build(opt, loss, copies, global_step, config.communication_period,
                          config.train_steps,
                          (mode.replicas, mode.num_workers) if mode.sync else None,
                          make_optimizer(config.optimizer, config.lr),
                          next_loss=lambda: loss_on(*iterator.get_next())[0])
    return Step(loss, accuracy, local_ops=ops, sync_optimizer=ops.sync_optimizer)


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
                                          max(config.log_every_secs, 1.0), steps))
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
