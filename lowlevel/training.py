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

from lowlevel import data as data_lib
from lowlevel import (checkpoints, events, export, faults, files, hooks, loop, probes,
                      sessions, storage)
from lowlevel.graph import TrainGraph, build
from lowlevel.cluster import CHIEF, WORKER, Cluster, Task
from lowlevel.config import TrainConfig
from lowlevel.preemption import Preemption

v1 = tf.compat.v1

# Seconds a session waits for its helper threads (the chief's sync loop) at
# close; the stock 120 s is what made a stuck sync chief linger
# (tensorflow/tensorflow#7970). Ours end by themselves at the last step.
STOP_GRACE_SECS = 2.0


def train(config: TrainConfig, data: data_lib.DataSet, cluster: Optional[Cluster],
          task: Task, server=None, session_config=None, worker_gpu: int = 0,
          preemption: Optional[Preemption] = None) -> Optional[dict]:
    """Runs worker `task` to `config.train_steps`; returns the chief's final metrics.

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
    SavedModel of the final checkpoint, `lowlevel.export`; unless
    --keep_exports=0). Every training task also
    writes its own step times to `<output_dir>/tasks/<task>.json`
    (`progress.ProgressHook.task_record`).

    Returns:
      The chief's metrics; None on other workers and when preempted.

    Raises:
      checkpoints.CheckpointMismatch: the checkpoint in `output_dir` is of
        another model (checked before anything runs).
      checkpoints.TrainingFinished: (non-chief) the run ended while this
        worker waited for the cluster.
      probes.StartupError: a ps did not answer, or (non-chief) the chief had
        not initialised the model, within `config.startup_timeout_secs` (a
        session lost mid-run: its ps within `config.fault_timeout_secs`).
      faults.NetworkFault: mid-run, the peers did not answer for
        `config.fault_timeout_secs` (every run has `config.step_timeout_secs`).
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
    # The task's one outage clock (`faults.Outage`): its runs' deadlines, a lost session's
    # replacement and the waits on the way all count against it.
    outage = (faults.Outage(task.name, faults.peers_of(cluster, task, config.sync),
                            config.fault_timeout_secs) if cluster else None)
    with g.graph.as_default():
        creator = _session_creator(config, cluster, task, g, server, session_config, partial,
                                   outage)
        logging.info("%s: graph built in %.1f s; creating session", task.name,
                     time.monotonic() - started)
        try:
            sess = v1.train.MonitoredSession(creator, g.hooks,
                                             stop_grace_period_secs=STOP_GRACE_SECS)
        except tf.errors.DeadlineExceededError:
            chief = cluster.task(CHIEF, 0) if cluster.chief_hosts else cluster.task(WORKER, 0)
            where = cluster.hosts(chief.job_name)[0] or "an address this task was not given"
            raise probes.StartupError(
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
                watch = faults.FaultWatch(task.name, outage.peers, config.step_timeout_secs,
                                          config.fault_timeout_secs, outage=outage)
                outage.watchdog()
            loop.run(sess, g, config.train_steps, preempted, watch)
            logging.info("%s: %s; closing the session", task.name,
                         "stopping for the preemption" if preempted.is_set()
                         else "last step done")
            if not preempted.is_set():
                events.emit("done", g.steps.value, local_steps=g.progress.local_steps)
        # Flush and close the summary writers (a full disk fails here too: a line).
        storage.Writes("summaries").run(v1.summary.FileWriterCache.clear,
                                        config.output_dir or "")
        if preempted.is_set():
            saved = checkpoints.latest(config.output_dir) if task.is_chief else None
            logging.info("%s: preempted at global step %s%s; exiting", task.name,
                         g.progress.end_step,
                         f"; saved {os.path.basename(saved)}" if saved else "")
            events.emit("preempted", g.progress.end_step, signal=preemption and
                        preemption.signal_name, checkpoint=saved and os.path.basename(saved))
            if preemption:
                preemption.mark_safe()
            return None
        logging.info("%s: training done at global step %s after %d local steps",
                     task.name, g.progress.end_step, g.progress.local_steps)
        metrics = _final_metrics(config, cluster, g, time.monotonic() - started)
        saves = next((h.saves for h in g.hooks if isinstance(h, hooks.CheckpointHook)), None)
        if saves is not None and saves.last_failed:  # nothing to export either
            raise storage.StorageFailure(
                f"the final checkpoint (global step {g.progress.end_step}) could not be saved "
                f"in {config.output_dir}; free space or make it writable, then run the same "
                "command again: it resumes from the newest checkpoint")
        if task.is_chief and config.output_dir and config.keep_exports:
            # After the session: from the final checkpoint, in a fresh graph.
            metrics["export_dir"] = export.export(
                checkpoints.latest(config.output_dir), export.export_base(config.output_dir),
                config, data, config.keep_exports)
        if config.output_dir:
            task_file = os.path.join(config.output_dir, "tasks", f"{task.name}.json")
            storage.Writes("step times").run(lambda: files.write_json(
                task_file, dict(task=task.name, **g.progress.task_record())), task_file)
            if task.is_chief:
                metrics_file = os.path.join(config.output_dir, "final_metrics.json")
                storage.Writes("the final metrics").run(
                    lambda: files.write_json(metrics_file, metrics), metrics_file)
    return metrics if task.is_chief else None


def _session_creator(config: TrainConfig, cluster: Optional[Cluster], task: Task,
                     g: TrainGraph, server, session_config,
                     partial: Optional[checkpoints.PartialRestore] = None,
                     outage: Optional[faults.Outage] = None):
    """The chief's or a worker's session creator (`sessions`), bound to the cluster's probes.

    Before each session it waits until every ps answers (`probes.wait_for_ps`
    with `answer`: a frozen ps's kernel still accepts connections). The first
    session is bounded by `--startup_timeout_secs`; one that replaces a lost
    session begins the task's outage (`outage.begin`: at the start of the run
    that failed) and every wait for it counts against `--fault_timeout_secs`,
    the session's creation included (`faults.abandonable`).

    `partial`: the chief's restore of a checkpoint that lacks some optimizer state.
    """
    master = server.target if server else ""
    wait_for_cluster = cluster_alive = guard = None
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
        # The first session's creation may wait for the chief's model for
        # --startup_timeout_secs itself (`WorkerSessionCreator`); past that, and the
        # margin, it is stuck (a ps frozen during start-up).
        first_limit_secs = config.startup_timeout_secs + 60.0
        first_deadline = []

        def wait_for_cluster():
            finished = None
            if not task.is_chief and config.output_dir:
                def finished():
                    checkpoints.check_finished(config.output_dir, config.train_steps)
            calls.append(None)
            if len(calls) == 1:
                probes.wait_for_ps(cluster, config.startup_timeout_secs, give_up=finished,
                                   answer=True)
                first_deadline[:] = [time.monotonic() + first_limit_secs]
                return
            # A session lost mid-run: the outage is bounded like any other fault.
            outage.begin()
            logging.warning("%s: session lost (a task failed or stopped answering); making a "
                            "new one (giving up %.0f s into the outage, --fault_timeout_secs)",
                            task.name, config.fault_timeout_secs)

            def give_up():
                if finished is not None:
                    finished()
                outage.check()
            probes.wait_for_ps(cluster, config.fault_timeout_secs, give_up=give_up,
                               flag="--fault_timeout_secs", answer=True)

        def guard():
            if len(calls) > 1:
                outage.check()
            elif first_deadline and time.monotonic() > first_deadline[0]:
                silent = outage.not_answering()
                raise probes.StartupError(
                    f"{task.name}: the session was not created within {first_limit_secs:g} s "
                    f"of the ps tasks answering (--startup_timeout_secs + 60 s); "
                    f"{outage.who(silent)}")

    if task.is_chief:
        creator = sessions.ChiefSessionCreator(g.scaffold, master, session_config,
                                               config.output_dir, wait_for_cluster,
                                               cluster_alive, partial, guard)
        creator.retry_secs = config.fault_timeout_secs
        return creator
    return sessions.WorkerSessionCreator(g.scaffold, master, session_config,
                                         config.startup_timeout_secs, wait_for_cluster,
                                         cluster_alive, guard)


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
        path = g.scaffold.saver.save(raw, os.path.join(output_dir, "model.ckpt"),
                                     global_step=g.global_step)
        logging.info("saved %s", path)
        events.emit("checkpoint_saved", int(path.rpartition("-")[2]),
                    path=os.path.basename(path), emergency=True)
        return True
    return save


def _final_metrics(config, cluster, g: TrainGraph, wall_seconds: float) -> dict:
    result = g.final_eval.result if g.final_eval and g.final_eval.result else {}
    return {
        "global_step": g.progress.end_step,
        "start_global_step": g.progress.initial_step,
        "accuracy": result.get("accuracy"),
        "loss": result.get("loss"),
        **{k: result[k] for k in ("auc", "log_loss") if k in result},
        "train_examples_per_sec": round(g.progress.examples_per_sec, 1),
        "wall_seconds": round(wall_seconds, 3),
        "num_ps": cluster.num_ps if cluster else 0,
        "num_workers": cluster.num_workers if cluster else 1,
        "sync": bool(config.sync and cluster),
        "model": config.model,
        "dataset": config.dataset,
        "batch_size": config.batch_size,
    }
