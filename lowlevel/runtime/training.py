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

from lowlevel import errors, events, output_layout
from lowlevel.cluster import probes
from lowlevel.cluster.spec import CHIEF, WORKER, Cluster, Task
from lowlevel.config import TrainConfig
from lowlevel.outputs import checkpoints
from lowlevel.runtime import faults, finish, graph, loop, sessions
from lowlevel.runtime import metrics as metrics_lib
from lowlevel.runtime.graph import TrainGraph
from lowlevel.runtime.preemption import Preemption

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
    model_fn, input and placement (`graph.build`), final evaluation and export.

    Failures of other tasks are recovered from inside (`MonitoredSession`
    recreates the session on `UnavailableError`/`AbortedError`; the creators
    in `sessions` wait for the ps tasks, then adopt, restore or wait for the
    model). A preemption (`preemption.requested`) stops the loop after the
    current step; the chief's session close then saves a checkpoint. What
    follows the session (final metrics, export, records) is `finish`.

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
    g = graph.build(config, trainable, cluster, task, worker_gpu, preempted)
    metrics_lib.watch_training(g.progress, g.steps, g.progress.batch_size or config.batch_size)
    if task.is_chief and cluster:
        metrics_lib.placement_built(g.graph, cluster, config.output_dir)
    partial = _checked_checkpoint(config.output_dir, g, task)
    # The task's one outage clock (`faults.Outage`): its runs' deadlines, a lost session's
    # replacement and the waits on the way all count against it.
    outage = (faults.Outage(task.name, faults.peers_of(cluster, task, config.sync),
                            config.fault_timeout_secs) if cluster else None)
    with g.graph.as_default():
        creator = _session_creator(config, cluster, task, g, server, session_config, partial,
                                   outage)
        logging.info("%s: graph built in %.1f s (%.2f CPU s in this process); creating "
                     "session", task.name, time.monotonic() - started, time.process_time())
        with _monitored_session(creator, g, config, cluster, task) as sess:
            _session_ready(sess, creator, g, task, started, preemption, config.output_dir)
            watch = None
            if cluster:
                watch = faults.FaultWatch(task.name, outage.peers, config.step_timeout_secs,
                                          config.fault_timeout_secs, outage=outage)
                g.steps.outage = outage
                outage.watchdog()
            loop.run(sess, g, config.train_steps, preempted, watch)
            logging.info("%s: %s; closing the session", task.name,
                         "stopping for the preemption" if preempted.is_set()
                         else "last step done")
            if not preempted.is_set():
                events.emit("done", g.steps.value, local_steps=g.progress.local_steps)
        return finish.after_training(config, cluster, task, g, trainable, preemption, started)


def end_predecessor_lease(config: TrainConfig, cluster: Optional[Cluster], task: Task,
                          server, session_config=None) -> None:
    """Sync training from the data queue: as its server starts, before its graph, a worker
    ends the heartbeat a dead process of its index left on ps 0 (`elastic_sync.end_lease`),
    so the others do not wait for this one's start. Only where ps 0 answers at once (a
    restart in a running job; else there is nothing to end). Never raises."""
    if not (cluster and server is not None and config.sync and task.replica_index is not None
            and config.span_queue(True, True)):
        return
    from lowlevel.modes import elastic_sync
    if probes.answers(cluster.hosts("ps")[0], 0.5):
        elastic_sync.end_lease(server.target, task.replica_index, "/job:ps/task:0",
                               f"/job:{task.job_name}/task:{task.task_index}",
                               session_config=session_config)


def _checked_checkpoint(output_dir: Optional[str], g: TrainGraph, task: Task):
    """Checks the newest checkpoint fits the model (before anything runs); returns the chief's
    `checkpoints.PartialRestore` of one that lacks some optimizer state, else None.

    Raises:
      errors.CheckpointMismatch: the checkpoint is of another model.
    """
    newest = checkpoints.newest_readable(output_dir)
    path = checkpoints.check_compatible(output_dir, g.saved, newest[0] if newest else None,
                                        optional=g.optimizer_names)
    if path and task.is_chief and checkpoints.missing_names(path, g.saved):
        with g.graph.as_default():
            return checkpoints.PartialRestore(
                path, g.saved, checkpoints.missing_names(path, g.saved),
                timeout_secs=getattr(g.scaffold.saver, "timeout_secs", None))
    return None


def _monitored_session(creator, g: TrainGraph, config: TrainConfig, cluster, task: Task):
    """The task's `MonitoredSession` (its hooks, a short stop grace).

    Raises:
      errors.StartupError: (a worker) the chief did not have the model ready in time.
    """
    try:
        return v1.train.MonitoredSession(creator, g.hooks, stop_grace_period_secs=STOP_GRACE_SECS)
    except tf.errors.DeadlineExceededError:
        chief = cluster.task(CHIEF, 0) if cluster.chief_hosts else cluster.task(WORKER, 0)
        where = cluster.hosts(chief.job_name)[0] or "an address this task was not given"
        raise errors.StartupError(
            f"{task.name}: the chief ({chief.name} at {where}) "
            f"did not have the model ready within {config.startup_timeout_secs:g} s "
            "(--startup_timeout_secs): is it running?") from None


def _session_ready(sess, creator, g: TrainGraph, task: Task, started: float, preemption,
                   output_dir: Optional[str]) -> None:
    """Logs and records the new session (`session_ready`); from now on a preemption stops
    training at a safe point (the chief: after an emergency checkpoint if stuck)."""
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
            _emergency_save(sess, g, output_dir) if task.is_chief else None)


def _session_creator(config: TrainConfig, cluster: Optional[Cluster], task: Task,
                     g: TrainGraph, server, session_config,
                     partial: Optional[checkpoints.PartialRestore] = None,
                     outage: Optional[faults.Outage] = None):
    """The chief's or a worker's session creator (`sessions`), bound to the cluster's probes
    (`ClusterWaits`).

    `partial`: the chief's restore of a checkpoint that lacks some optimizer state.
    """
    master = server.target if server else ""
    # The chief's restore of a lost session's state has its own deadline (`StateSaver`'s:
    # a step's, plus 1 s per 20 MB); a wait for the model with every peer answering may
    # last the bytes' part longer than the fault limit (0 s for a small model).
    saver_secs = getattr(g.scaffold.saver, "timeout_secs", None)
    restore_secs = max(0.0, saver_secs - config.step_timeout_secs) if saver_secs else 0.0
    finished = None
    if not task.is_chief and config.output_dir:
        def finished():
            checkpoints.check_finished(config.output_dir, config.train_steps)
    waits = (ClusterWaits(cluster, task, outage, config.startup_timeout_secs,
                          config.fault_timeout_secs, finished, restore_secs)
             if cluster else None)
    wait_for_cluster, cluster_alive, guard = ((waits.wait_for_cluster, waits.cluster_alive,
                                               waits.guard) if waits else (None, None, None))
    if cluster and session_config is not None:
        # The deadline of every run that has none of its own: the hooks' (a
        # checkpoint save, the final evaluation) and the session's set-up. The
        # loop's own runs carry theirs (`faults.FaultWatch`).
        session_config = type(session_config).FromString(session_config.SerializeToString())
        session_config.operation_timeout_in_ms = int(config.step_timeout_secs * 1000)
    if task.is_chief:
        creator = sessions.ChiefSessionCreator(g.scaffold, master, session_config,
                                               config.output_dir, wait_for_cluster,
                                               cluster_alive, partial, guard)
        creator.retry_secs = config.fault_timeout_secs
        return creator
    return sessions.WorkerSessionCreator(g.scaffold, master, session_config,
                                         config.startup_timeout_secs, wait_for_cluster,
                                         cluster_alive, guard)


class ClusterWaits:
    """What a session creator waits for, and the bound of each wait.

    Before each session it waits until every ps answers (`probes.wait_for_ps`
    with `answer`: a frozen ps's kernel still accepts connections). The first
    session is bounded by `startup_timeout_secs`; one that replaces a lost
    session begins the task's outage (`outage.begin`: at the start of the run
    that failed) and every wait for it counts against `fault_timeout_secs`,
    the session's creation included (`guard`, checked while `faults.abandonable`
    waits for it).

    Args:
      startup_timeout_secs, fault_timeout_secs: the bounds above, seconds
        (`--startup_timeout_secs`, `--fault_timeout_secs`).
      finished: called every poll of a wait; raises `errors.TrainingFinished` once
        the run is over (a non-chief worker), or None.
      restore_secs: how much longer than the outage limit a replacement's creation
        may take while every peer answers (the chief's restore of a large model).
    """

    def __init__(self, cluster: Cluster, task: Task, outage: faults.Outage,
                 startup_timeout_secs: float, fault_timeout_secs: float,
                 finished=None, restore_secs: float = 0.0):
        self._cluster, self._task, self._outage = cluster, task, outage
        self._startup_secs, self._fault_secs = startup_timeout_secs, fault_timeout_secs
        self._finished = finished or (lambda: None)
        self._restore_secs = restore_secs
        self._sessions = 0
        # The first session's creation may wait for the chief's model for
        # --startup_timeout_secs itself (`WorkerSessionCreator`); past that, and the
        # margin, it is stuck (a ps frozen during start-up).
        self._first_limit_secs = startup_timeout_secs + 60.0
        self._first_deadline: Optional[float] = None

    def cluster_alive(self) -> bool:
        """Whether every ps task accepts connections now."""
        return all(probes.reachable(a, 0.1) for a in self._cluster.ps_hosts)

    def wait_for_cluster(self) -> None:
        """Waits for every ps to answer: at start-up within `startup_timeout_secs`, for a
        session lost mid-run on the task's outage clock."""
        task = self._task
        self._sessions += 1
        if self._sessions == 1:
            probes.wait_for_ps(self._cluster, self._startup_secs,
                               give_up=self._finished, answer=True)
            self._first_deadline = time.monotonic() + self._first_limit_secs
            return
        # A session lost mid-run: the outage is bounded like any other fault.
        self._outage.begin()
        logging.warning("%s: session lost (a task failed or stopped answering); making a "
                        "new one (giving up %.0f s into the outage, --fault_timeout_secs)",
                        task.name, self._fault_secs)

        def give_up():
            self._finished()
            self._outage.check()
        probes.wait_for_ps(self._cluster, self._fault_secs, give_up=give_up,
                           flag="--fault_timeout_secs", answer=True)

    def guard(self) -> None:
        """Checked while a session is being made: raises past its bound (a replacement's: the
        outage limit, extended once by the restore's deadline if every peer answers)."""
        if self._sessions > 1:
            if self._outage.remaining() <= 0:
                self._outage.allow_restore(self._restore_secs)
            self._outage.check()
        elif self._first_deadline and time.monotonic() > self._first_deadline:
            silent = self._outage.not_answering()
            raise errors.StartupError(
                f"{self._task.name}: the session was not created within "
                f"{self._first_limit_secs:g} s of the ps tasks answering "
                f"(--startup_timeout_secs + 60 s); {self._outage.who(silent)}")


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
        events.emit("checkpoint_saved", checkpoints.step_of(path),
                    path=os.path.basename(path), emergency=True)
        return True
    return save
