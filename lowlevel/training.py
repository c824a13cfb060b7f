"""Building the training graph of one worker and running its training loop.

Between-graph replication: every worker builds the whole graph with its
variables on the ps tasks (`placement`) and runs its own loop; the chief
(worker 0) also initialises or restores the model, saves checkpoints and
summaries, evaluates at the end and shuts the cluster down (`server`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
from typing import Optional

import tensorflow as tf
from absl import logging

from lowlevel import data as data_lib
from lowlevel import (checkpoints, evaluation, exact, export, hooks, local_sgd, loop, models,
                      placement, sessions)
from lowlevel import server as server_lib
from lowlevel.cluster import Cluster, Task
from lowlevel.config import TrainConfig
from lowlevel.preemption import Preemption

v1 = tf.compat.v1

# Seconds a session waits for its helper threads (the chief's sync loop) at
# close; the stock 120 s is what made a stuck sync chief linger
# (tensorflow/tensorflow#7970). Ours end by themselves at the last step.
STOP_GRACE_SECS = 2.0


def make_optimizer(name: str, learning_rate: float):
    """The `tf.compat.v1.train` optimizer called `name` (adagrad, sgd, momentum 0.9, adam)."""
    if name == "adagrad":
        return v1.train.AdagradOptimizer(learning_rate)
    if name == "sgd":
        return v1.train.GradientDescentOptimizer(learning_rate)
    if name == "momentum":
        return v1.train.MomentumOptimizer(learning_rate, momentum=0.9)
    if name == "adam":
        return v1.train.AdamOptimizer(learning_rate)
    raise ValueError(f"unknown optimizer {name!r}")


@dataclasses.dataclass
class TrainGraph:
    """What `build` puts in the graph, for one worker."""

    graph: object
    train_op: Optional[object]  # int64 scalar: the global step after this step's update
    local_ops: Optional[local_sgd.LocalSGDOps]  # instead, with --communication_period > 1
    loss: object
    global_step: object
    scaffold: object
    hooks: list
    progress: hooks.ProgressHook
    final_eval: Optional[evaluation.FinalEvalHook]
    examples_per_step: int
    steps: hooks.LoopState  # the global step as the loop last saw it
    saved: dict  # the saver's {name in checkpoints: variable or shards}
    optimizer_names: set  # the names of `saved` that are optimizer state


def build(config: TrainConfig, data: data_lib.DataSet, cluster: Optional[Cluster],
          task: Task, worker_gpu: int, preempted: Optional[threading.Event] = None
          ) -> TrainGraph:
    """Builds worker `task`'s training graph (the in-process one with `cluster=None`).

    Args:
      preempted: set when the task is being preempted; the end-of-training
        hooks (final evaluation, shutdown handshake) then do nothing.
    """
    preempted = preempted or threading.Event()
    num_workers = cluster.num_workers if cluster else 1
    sync = bool(config.sync and cluster)
    local = bool(cluster and config.communication_period > 1)
    replicas = config.replicas_to_aggregate or num_workers
    hidden = config.hidden_units

    partitioner = None

    def model_fn(images):
        return models.build(config.model, images, data.num_classes, hidden, config.seed,
                            partitioner)

    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(config.seed)
        device = None
        if cluster:
            def probe():
                return model_fn(tf.zeros([1, *data.image_shape]))
            total = sum(placement.measure_variables(probe).values())
            partitioner = placement.partitioner(cluster.num_ps, total)
            device = placement.device_setter(cluster.as_dict(), task.task_index, worker_gpu,
                                             placement.measure_variables(probe), task.job_name)
        with v1.device(device):
            global_step = v1.train.get_or_create_global_step()
            iter_init, feed, (images, labels) = data_lib.train_input(
                data, config.batch_size, num_workers, task.replica_index, config.seed)
            opt = make_optimizer(config.optimizer, config.lr)
            train_op = local_ops = None
            if local:  # communication-reduced: the model computes with worker-local copies
                copies = local_sgd.LocalCopies(
                    placement.worker_device(task.task_index, worker_gpu, task.job_name))
                with v1.variable_scope(v1.get_variable_scope(), custom_getter=copies):
                    loss, accuracy = models.loss_and_accuracy(model_fn(images), labels)
                local_ops = local_sgd.build(opt, loss, copies, global_step,
                                            config.communication_period, config.train_steps,
                                            (replicas, num_workers) if sync else None)
            elif cluster:  # exact: small variables travel together (lowlevel.exact)
                model_fn(tf.zeros([1, *data.image_shape]))  # creates the variables
                small = exact.SmallVariables(
                    v1.trainable_variables(),
                    placement.worker_device(task.task_index, worker_gpu, task.job_name))
                small.pull()
                with v1.variable_scope(v1.get_variable_scope(), custom_getter=small):
                    loss, accuracy = models.loss_and_accuracy(model_fn(images), labels)
                grads = small.gradients(loss, v1.trainable_variables())
            else:
                loss, accuracy = models.loss_and_accuracy(model_fn(images), labels)
                grads = [(g, v) for g, v in opt.compute_gradients(loss) if g is not None]
            if sync and not local:
                opt = v1.train.SyncReplicasOptimizer(
                    opt, replicas_to_aggregate=replicas, total_num_replicas=num_workers)
                update = opt.apply_gradients(grads, global_step=global_step)
                # The step read after the update lets a worker stop as soon as the
                # last step is done (only the chief's sync loop moves it).
                with tf.control_dependencies([update]):
                    train_op = global_step.read_value()
            elif not local:
                train_op = exact.counted_update(opt, grads, global_step, config.train_steps)
            final_eval = None
            if task.is_chief:
                final_eval = evaluation.FinalEvalHook(evaluation.build(
                    data.test, data.max_value, config.model, data.num_classes, hidden,
                    config.seed, partitioner), skip=preempted)
            shutdown = server_lib.ShutdownChannel(cluster.num_ps) if cluster else None
        v1.summary.scalar("loss", loss)
        v1.summary.scalar("accuracy", accuracy)
        local_init = tf.group(v1.local_variables_initializer(), v1.tables_initializer(),
                              iter_init)
        state = local_ops.state if local_ops else None
        if state:  # the optimizer's local state starts from its twins on the ps
            with tf.control_dependencies([local_init]):
                local_init = tf.group(state.load_state)
        # Every mode saves the same names: a checkpoint resumes in any mode.
        saved = checkpoints.saved_names(graph.get_collection(v1.GraphKeys.GLOBAL_VARIABLES),
                                        state.names if state else None)
        scaffold = v1.train.Scaffold(
            local_init_op=local_init, local_init_feed_dict=feed,
            saver=checkpoints.StateSaver(saved, state.save_state if state else None,
                                         sharded=True, max_to_keep=config.keep_checkpoint_max,
                                         save_relative_paths=True))
        model_names = checkpoints.saved_names(v1.trainable_variables())
        optimizer_names = set(saved) - set(model_names) - {checkpoints.GLOBAL_STEP}

        examples_per_step = config.batch_size * (replicas if sync else 1)
        summary_dir = config.output_dir if task.is_chief else None
        steps = hooks.LoopState()
        progress = hooks.ProgressHook(global_step, loss, examples_per_step,
                                      config.train_steps, config.log_every_secs, steps,
                                      summary_dir, config.warmup_steps, config.batch_size)
        # The chief first waits for the other workers (so that its final checkpoint
        # and evaluation hold their last updates) and tells the ps tasks to exit
        # last; a worker reports that it is done after everything else.
        done = (server_lib.WorkersDoneHook(shutdown, task, cluster,
                                           config.shutdown_timeout_secs, preempted)
                if shutdown else None)
        run_hooks = [done] if done and task.is_chief else []
        run_hooks.append(progress)
        if sync:
            others = [t for t in cluster.training_tasks() if not t.is_chief]
            # Model averaging starts without tokens: a worker's first exchange must
            # wait for the first average, not pull the model it started from.
            run_hooks.append(hooks.SyncReplicasHook(
                local_ops.sync_optimizer if local else opt, task.is_chief, global_step,
                config.train_steps, config.sync_timeout_secs,
                lambda: server_lib.unreachable_tasks(cluster, others),
                num_tokens=0 if local else -1))
        if task.is_chief and config.output_dir:
            run_hooks += [
                hooks.CheckpointHook(scaffold.saver, config.output_dir, steps,
                                     config.save_checkpoint_steps, config.save_checkpoint_secs),
                hooks.SummaryHook(config.output_dir, max(config.log_every_secs, 1.0), steps)]
        if final_eval:
            run_hooks.append(final_eval)
        if done and task.is_chief:
            run_hooks.append(server_lib.StopPsHook(shutdown, preempted))
        elif done:
            run_hooks.append(done)
    return TrainGraph(graph, train_op, local_ops, loss, global_step, scaffold, run_hooks,
                      progress, final_eval, examples_per_step, steps, saved, optimizer_names)


def train(config: TrainConfig, data: data_lib.DataSet, cluster: Optional[Cluster],
          task: Task, server=None, session_config=None, worker_gpu: int = 0,
          preemption: Optional[Preemption] = None) -> Optional[dict]:
    """Runs worker `task` to `config.train_steps`; returns the chief's final metrics.

    Failures of other tasks are recovered from inside (`MonitoredSession`
    recreates the session on `UnavailableError`/`AbortedError`; the creators
    in `hooks` wait for the ps tasks, then adopt, restore or wait for the
    model). A preemption (`preemption.requested`) stops the loop after the
    current step; the chief's session close then saves a checkpoint.

    The chief's metrics (also written to `<output_dir>/final_metrics.json`):
    global_step, start_global_step, accuracy, loss (test split),
    train_examples_per_sec (all workers), wall_seconds (from building the
    graph to the end of the final evaluation and shutdown handshake), num_ps,
    num_workers, sync, model, dataset, batch_size, and export_dir (the
    SavedModel of the final checkpoint, `lowlevel.export`; unless
    --keep_exports=0). Every training task also
    writes its own step times to `<output_dir>/tasks/<task>.json`
    (`ProgressHook.task_record`).

    Returns:
      The chief's metrics; None on other workers and when preempted.

    Raises:
      checkpoints.CheckpointMismatch: the checkpoint in `output_dir` is of
        another model (checked before anything runs).
      checkpoints.TrainingFinished: (non-chief) the run ended while this
        worker waited for the cluster.
      server.StartupError: a ps did not answer, or (non-chief) the chief had
        not initialised the model, within `config.startup_timeout_secs`.
    """
    started = time.monotonic()
    preempted = preemption.requested if preemption else threading.Event()
    g = build(config, data, cluster, task, worker_gpu, preempted)
    newest = checkpoints.newest_readable(config.output_dir)
    path = checkpoints.check_compatible(config.output_dir, g.saved, newest[0] if newest else None,
                                        optional=g.optimizer_names)
    partial = None
    if path and task.is_chief and checkpoints.missing_names(path, g.saved):
        with g.graph.as_default():
            partial = checkpoints.PartialRestore(path, g.saved,
                                                 checkpoints.missing_names(path, g.saved))
    master = server.target if server else ""
    wait_for_cluster = cluster_alive = None
    if cluster:
        def cluster_alive():
            return all(server_lib.reachable(a, 0.1) for a in cluster.ps_hosts)

        def wait_for_cluster():
            give_up = None
            if not task.is_chief and config.output_dir:
                def give_up():
                    checkpoints.check_finished(config.output_dir, config.train_steps)
            server_lib.wait_for_ps(cluster, config.startup_timeout_secs, give_up=give_up)

    with g.graph.as_default():
        if task.is_chief:
            creator = sessions.ChiefSessionCreator(g.scaffold, master, session_config,
                                                config.output_dir, wait_for_cluster,
                                                cluster_alive, partial)
        else:
            creator = sessions.WorkerSessionCreator(g.scaffold, master, session_config,
                                                 config.startup_timeout_secs, wait_for_cluster,
                                                 cluster_alive)
        logging.info("%s: graph built in %.1f s; creating session", task.name,
                     time.monotonic() - started)
        try:
            sess = v1.train.MonitoredSession(creator, g.hooks,
                                             stop_grace_period_secs=STOP_GRACE_SECS)
        except tf.errors.DeadlineExceededError:
            chief = cluster.training_tasks()[0]
            raise server_lib.StartupError(
                f"{task.name}: the chief ({chief.name} at {cluster.hosts(chief.job_name)[0]}) "
                f"did not have the model ready within {config.startup_timeout_secs:g} s "
                "(--startup_timeout_secs): is it running?") from None
        with sess:
            logging.info("%s: session ready at global step %d after %.1f s%s", task.name,
                         g.progress.initial_step, time.monotonic() - started,
                         f" ({creator.describe()})" if task.is_chief and
                         creator.origin != "initialised" else "")
            if preemption:
                preemption.training_started(
                    _emergency_save(sess, g, config.output_dir) if task.is_chief else None)
            loop.run(sess, g, config.train_steps, preempted)
            logging.info("%s: %s; closing the session", task.name,
                         "stopping for the preemption" if preempted.is_set()
                         else "last step done")
        v1.summary.FileWriterCache.clear()  # flush and close the summary writers
        if preempted.is_set():
            saved = checkpoints.latest(config.output_dir) if task.is_chief else None
            logging.info("%s: preempted at global step %s%s; exiting", task.name,
                         g.progress.end_step,
                         f"; saved {os.path.basename(saved)}" if saved else "")
            if preemption:
                preemption.mark_safe()
            return None
        logging.info("%s: training done at global step %s after %d local steps",
                     task.name, g.progress.end_step, g.progress.local_steps)
        _write_json(config.output_dir, os.path.join("tasks", f"{task.name}.json"),
                    dict(task=task.name, **g.progress.task_record()))
        metrics = _final_metrics(config, cluster, g, time.monotonic() - started)
        if task.is_chief and config.output_dir and config.keep_exports:
            # After the session: from the final checkpoint, in a fresh graph.
            metrics["export_dir"] = export.export(
                checkpoints.latest(config.output_dir), export.export_base(config.output_dir),
                config, data, config.keep_exports)
        if task.is_chief:
            _write_json(config.output_dir, "final_metrics.json", metrics)
    return metrics if task.is_chief else None


def _emergency_save(sess, g: TrainGraph, output_dir: Optional[str]):
    """The chief's `on_stuck` action: saves a checkpoint from the signal thread."""
    def save() -> bool:
        raw = sess._coordinated_creator.tf_sess  # noqa: SLF001 - the live tf.Session
        if not output_dir:
            return True
        if raw is None:
            logging.info("no live session (it is being recreated after a failure); the last "
                         "checkpoint stands")
            return True
        path = g.scaffold.saver.save(raw, os.path.join(output_dir, "model.ckpt"),
                                     global_step=g.global_step)
        logging.info("saved %s", path)
        return True
    return save


def _write_json(output_dir: Optional[str], name: str, value: dict) -> None:
    if not output_dir:
        return
    path = os.path.join(output_dir, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(value, f, indent=2)


def _final_metrics(config, cluster, g: TrainGraph, wall_seconds: float) -> dict:
    result = g.final_eval.result if g.final_eval and g.final_eval.result else {}
    return {
        "global_step": g.progress.end_step,
        "start_global_step": g.progress.initial_step,
        "accuracy": result.get("accuracy"),
        "loss": result.get("loss"),
        "train_examples_per_sec": round(g.progress.examples_per_sec, 1),
        "wall_seconds": round(wall_seconds, 3),
        "num_ps": cluster.num_ps if cluster else 0,
        "num_workers": cluster.num_workers if cluster else 1,
        "sync": bool(config.sync and cluster),
        "model": config.model,
        "dataset": config.dataset,
        "batch_size": config.batch_size,
    }
