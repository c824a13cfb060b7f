"""Running one worker: its graph (`graph.build`), its session, its loop, its end.

Between-graph replication: every worker builds the whole graph with its
variables on the ps tasks (`placement`) and runs its own loop (`loop`); the
chief (worker 0) also initialises or restores the model, saves checkpoints
and summaries, evaluates at the end and shuts the cluster down (`shutdown`).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Optional

import tensorflow as tf
from absl import logging

from lowlevel import events
from lowlevel.outputs import checkpoints
from lowlevel.runtime import faults, finish
from lowlevel.runtime import loop
from lowlevel.runtime import metrics as metrics_lib
from lowlevel.cluster import probes
from lowlevel.runtime import sessions
from lowlevel.runtime.graph import TrainGraph
from lowlevel.cluster.spec import CHIEF, WORKER, Cluster, Task
from lowlevel.config import TrainConfig
from lowlevel.runtime.preemption import Preemption
from lowlevel import errors
from lowlevel import output_layout

v1 = tf.compat.v1

# Seconds a session waits for its helper threads (the chief's sync loop) at
# close; the stock 120 s is what made a stuck sync chief linger
# (tensorflow/tensorflow#7970). Ours end by themselves at the last step.
STOP_GRACE_SECS = 2.0


def train(config: TrainConfig, trainable, cluster: Optional[Cluster],
          task: Task, server=None, session_config=None, worker_gpu: int = 0,
          preemption: Optional[Preemption] = None) -> Optional[dict]:
    """Runs worker `task` to `config.train_steps`; returns the chief's final metrics.

    `trainable`: what it trains (`trainables.Builtin` or `trainables.ModelFn`): its
    graph, final evaluation and export.

    Failures of other tasks are recovered from inside (`MonitoredSession`
    recreates the session on `UnavailableError`/`AbortedError`; the creators
    in `sessions` wait for the ps tasks, then adopt, restore or wait for the
    model). A preemption (`preemption.requested`) stops the loop after the
    current step; the chief's session close then saves a checkpoint.

    The chief's metrics (also written to `<output_dir>/final_metrics.json`):
    global_step, start_global_step, accuracy, loss (test split),
    train_examples_per_sec (all workers), wall_seconds (from building the
    graph to the end of the final evaluation and shutdown handshake), num_ps,
    num_workers, sync, model, dataset, batch_size, and export_dir (the
    SavedModel of the final checkpoint, `lowlevel.outputs.export`; unless
    --keep_exports=0). Every training task also
    writes its own step times to `<output_dir>/tasks/<task>.json`
    (`progress.ProgressHook.task_record`).

    Returns:
      The chief's metrics; None on other workers and when preempted.

    Raises:
      errors.CheckpointMismatch: the checkpoint in `output_dir` is of
        another model (checked before anything runs).
      errors.TrainingFinished: (non-chief) the run ended while this
        worker waited for the cluster.
      errors.StartupError: a ps did not answer, or (non-chief) the chief had
        not initialised the model, within `config.startup_timeout_secs` (a
        session lost mid-run: its ps within `config.fault_timeout_secs`).
      errors.NetworkFault: mid-run, the peers did not answer for
        `config.fault_timeout_secs` (every run has `config.step_timeout_secs`).
    """
    started = time.monotonic()
    preempted = preemption.requested if preemption else threading.Event()
    g = trainable.build(config, cluster, task, worker_gpu, preempted)
    metrics_lib.watch_training(g.progress, g.steps, config.batch_size)
    if task.is_chief and cluster:
        metrics_lib.placement_built(g.graph, cluster, config.output_dir)
    newest = checkpoints.newest_readable(config.output_dir)
    path = checkpoints.check_compatible(config.output_dir, g.saved, newest[0] if newest else None,
                                        optional=g.optimizer_names)
    partial = None
    if path and task.is_chief and checkpoints.missing_names(path, g.saved):
        with g.graph.as_default():
            partial = checkpoints.PartialRestore(path, g.saved,
                                                 checkpoints.missing_names(path, g.saved))
    with g.graph.as_default():
        creator = _session_creator(config, cluster, task, g, server, session_config, partial)
        logging.info("%s: graph built in %.1f s; creating session", task.name,
                     time.monotonic() - started)
        try:
            sess = v1.train.MonitoredSession(creator, g.hooks,
                                             stop_grace_period_secs=STOP_GRACE_SECS)
        except tf.errors.DeadlineExceededError:
            chief = cluster.task(CHIEF, 0) if cluster.chief_hosts else cluster.task(WORKER, 0)
            where = cluster.hosts(chief.job_name)[0] or "an address this task was not given"
            raise errors.StartupError(
                f"{task.name}: the chief ({chief.name} at {where}) "
                f"did not have the model ready within {config.startup_timeout_secs:g} s "
                "(--startup_timeout_secs): is it running?") from None
        with sess:
            fields = creator.event_fields()
            # The chief's model starts where its creator put it: read afterwards (by the
            # hooks), the global step can already hold a fast worker's first steps (208 for
            # a restore at 200 was seen).
            if fields["origin"] in ("restored", "initialised"):
                g.progress.initial_step = fields["restored_step"] or 0
            logging.info("%s: session ready at global step %d after %.1f s%s", task.name,
                         g.progress.initial_step, time.monotonic() - started,
                         f" ({creator.describe()})" if task.is_chief and
                         creator.origin != "initialised" else "")
            events.emit("session_ready", g.progress.initial_step, **fields)
            if preemption:
                preemption.training_started(
                    _emergency_save(sess, g, config.output_dir) if task.is_chief else None)
            watch = None
            if cluster:
                watch = faults.FaultWatch(task.name, faults.peers_of(cluster, task, config.sync),
                                          config.step_timeout_secs, config.fault_timeout_secs)
            loop.run(sess, g, config.train_steps, preempted, watch)
            logging.info("%s: %s; closing the session", task.name,
                         "stopping for the preemption" if preempted.is_set()
                         else "last step done")
            if not preempted.is_set():
                events.emit("done", g.steps.value, local_steps=g.progress.local_steps)
        return finish.after_training(config, cluster, task, g, trainable, preemption, started)


def _session_creator(config: TrainConfig, cluster: Optional[Cluster], task: Task,
                     g: TrainGraph, server, session_config,
                     partial: Optional[checkpoints.PartialRestore] = None):
    """The chief's or a worker's session creator (`sessions`), bound to the cluster's probes.

    `partial`: the chief's restore of a checkpoint that lacks some optimizer state.
    """
    master = server.target if server else ""
    wait_for_cluster = cluster_alive = None
    if cluster and session_config is not None:
        # The deadline of every run that has none of its own: the hooks' (a
        # checkpoint save, the final evaluation) and the session's set-up. The
        # loop's own runs carry theirs (`faults.FaultWatch`).
        session_config = type(session_config).FromString(session_config.SerializeToString())
        session_config.operation_timeout_in_ms = int(config.step_timeout_secs * 1000)
    if cluster:
        def cluster_alive():
            return all(probes.reachable(a, 0.1) for a in cluster.ps_hosts)

        calls = []

        def wait_for_cluster():
            give_up = None
            if not task.is_chief and config.output_dir:
                def give_up():
                    checkpoints.check_finished(config.output_dir, config.train_steps)
            calls.append(None)
            if len(calls) == 1:
                probes.wait_for_ps(cluster, config.startup_timeout_secs, give_up=give_up)
            else:  # a session lost mid-run: the outage is bounded like any other fault
                probes.wait_for_ps(cluster, config.fault_timeout_secs, give_up=give_up,
                                   flag="--fault_timeout_secs")

    if task.is_chief:
        creator = sessions.ChiefSessionCreator(g.scaffold, master, session_config,
                                               config.output_dir, wait_for_cluster,
                                               cluster_alive, partial)
        creator.retry_secs = config.fault_timeout_secs
        return creator
    return sessions.WorkerSessionCreator(g.scaffold, master, session_config,
                                         config.startup_timeout_secs, wait_for_cluster,
                                         cluster_alive)


def _emergency_save(sess, g: TrainGraph, output_dir: Optional[str]):
    """The chief's `on_stuck` action: saves a checkpoint from the signal thread."""
    def save() -> bool:
        raw = sessions.live_session(sess)
        if not output_dir:
            return True
        if raw is None:
            logging.info("no live session (it is being recreated after a failure); the last "
                         "checkpoint stands")
            return True
        path = g.scaffold.saver.save(raw, output_layout.checkpoint_prefix(output_dir),
                                     global_step=g.global_step)
        logging.info("saved %s", path)
        events.emit("checkpoint_saved", int(path.rpartition("-")[2]),
                    path=os.path.basename(path), emergency=True)
        return True
    return save
