"""The end of training: how every task of a cluster learns that the run is over, and exits 0.

A `tf.compat.v1.train.Server` cannot be stopped, and `server.join()` never
returns (tensorflow/tensorflow#4713, tensorflow/ecosystem#19), so the classic
ps task runs until somebody kills it. Here the end goes through the cluster
itself, with two queues that live in the ps tasks' resource managers (shared
by name, so every session that builds them gets the same queue):

- `lowlevel/workers_done` on ps 0: each non-chief worker enqueues its replica
  index when its training loop has ended;
- `lowlevel/stop_ps<K>` on ps K: the chief enqueues one element when the run
  is over; ps K waits on it (`run_std_server`) and exits 0.

The protocol, step by step, is `end_of_training_hooks` (the order of the
hooks' `end` calls, which `MonitoredSession` makes in list order inside the
session, before it closes), `run_std_server` (the ps side) and `stop_cluster`
(a chief restarted on a finished run); what follows the session is
`lowlevel.runtime.finish` (steps 9-13).

`MonitoredSession` calls every hook's `end` in list order, inside the
session, when the training loop is over. Running there, before the session
is closed, means no new session is needed (creating one can wait seconds
behind the closing one's clean-up, tensorflow/tensorflow#21745). The end
of a run, step by step:

1. Every worker's loop stops at the last step (`loop.run`; the counted
   update and the sync hook make the global step end at exactly
   `--train_steps`).
2. A non-chief worker: its `training` hooks end (its throughput figures),
   then it enqueues its replica index on ps 0's `workers_done` queue
   (`ReportDoneHook`) and exits. Best effort: if ps 0 is down, the chief
   notices the worker's exit instead.
3. The chief first waits (`WaitForWorkersHook`) until every other worker
   has reported, or its server has refused connections for `GONE_SECS`
   (it exited or died after its last step), or `timeout_secs` have
   passed (logged: the run goes on without it).
4. The chief's `training` hooks end (the progress hook reads the final
   global step, which now holds every worker's last update).
5. `checkpoint`: the final checkpoint, of that final state.
6. `final_eval`: the final evaluation on the test split.
7. The chief enqueues one element on each ps's `stop_ps<K>` queue
   (`StopPsHook`); a ps already gone is logged and skipped.
8. Each ps (`run_std_server`) dequeues it, keeps serving `LINGER_SECS`
   for the clean-up calls of the closing sessions, and exits 0.

**A run ended early.** A chief whose loop ends before `--train_steps` (a hook
requested the stop: an Estimator's early-stopping hook, a model's own hook; its
input ended) tells the others first (`EndEarlyHook`, before step 3): it
enqueues one element on ps 0's `lowlevel/ended_early` queue. Each non-chief
worker looks at that queue's size every `ENDED_EARLY_POLL_SECS` (`EndedEarlyHook`,
one 4-byte fetch through the hooks), stops at its next step once it is not empty,
and goes on with step 2; steps 3-8 follow as above. Every task exits 0, and the
final checkpoint (below `--train_steps`) holds every worker's last update. In a
sync run the chief also closes the sync token queue, which ends the wait of a
worker inside its step.

When `preempted` is set (SIGTERM/SIGINT), steps 2, 3, 6 and 7 do nothing:
the task will be back and the run is not over; the chief's checkpoint
(5) is still saved. A chief restarted on a finished run skips all of it
and calls `stop_cluster` instead; a script's worker whose loop ran without these hooks
runs steps 2, 3 and 7 after it (`end_outside_a_session`). In-process (no `channel`) the list is
the training hooks, the checkpoint and the final evaluation.
"""

from __future__ import annotations

import threading
import time
from typing import Optional, Sequence

import tensorflow as tf
from absl import logging

from lowlevel import events
from lowlevel.cluster.probes import POLL_SECS, reachable, wait_for_ps
from lowlevel.cluster.spec import Cluster, Task
from lowlevel.errors import StartupError, peer_unreachable

v1 = tf.compat.v1

# How long a worker's port must refuse connections before the chief, at the end
# of training, stops waiting for that worker's report.
GONE_SECS = 2.0
# After the chief's stop signal a ps keeps serving this long, so that the
# clean-up calls of sessions closing at that moment (the chief's among them)
# still reach it instead of logging "Cleanup partition error: UNAVAILABLE".
LINGER_SECS = 0.5
# Seconds a report or a stop signal may take before the ps is taken to be gone.
SIGNAL_TIMEOUT_MS = 10_000
# How often a non-chief worker looks for the chief's early end (`EndedEarlyHook`), seconds.
ENDED_EARLY_POLL_SECS = 0.1


def end_of_training_hooks(task: Task, cluster: Optional[Cluster],
                          channel: Optional["ShutdownChannel"],
                          training: Sequence[v1.train.SessionRunHook], *,
                          checkpoint: Optional[v1.train.SessionRunHook] = None,
                          final_eval: Optional[v1.train.SessionRunHook] = None,
                          timeout_secs: float = 60.0,
                          preempted: Optional[threading.Event] = None,
                          global_step=None, last_step: Optional[int] = None,
                          sync: bool = False) -> list:
    """The task's hooks, in the order that is the end-of-training protocol.

    The order is the protocol above: see the module docstring, steps 1-8.

    Args:
      task: this training task.
      cluster: the cluster, None in-process.
      channel: the `ShutdownChannel` in the graph, None in-process.
      training: the hooks of the training loop itself (progress, sync,
        summaries); their order among themselves is kept.
      checkpoint: the chief's `hooks.CheckpointHook`, or None.
      final_eval: the chief's `evaluation.FinalEvalHook`, or None.
      timeout_secs: the chief's longest wait in step 3, seconds.
      preempted: set when the task is being preempted.
      global_step, last_step: the run's global step variable and `--train_steps`;
        given both, a run the chief ends before `last_step` ends on every task
        ("A run ended early" above).
      sync: the run trains through a `SyncReplicasOptimizer` (its token queue is
        closed at an early end).

    Returns:
      The hooks for `MonitoredSession`, in order.
    """
    preempted = preempted or threading.Event()
    training = list(training)
    if channel is None:
        return training + [h for h in (checkpoint, final_eval) if h is not None]
    early = global_step is not None and last_step is not None
    if not task.is_chief:
        watch = [EndedEarlyHook(channel, task)] if early else []
        return watch + training + [ReportDoneHook(channel, task, preempted)]
    others = _other_workers(cluster)
    end_early = [EndEarlyHook(channel, global_step, last_step, preempted, sync)] if early \
        else []
    return (end_early + [WaitForWorkersHook(channel, others, timeout_secs, preempted)] +
            training +
            [h for h in (checkpoint, final_eval) if h is not None] +
            [StopPsHook(channel, preempted)])


def _other_workers(cluster: Cluster) -> dict[int, str]:
    """{replica index: "host:port"} of the training tasks other than the chief."""
    return {t.replica_index: cluster.hosts(t.job_name)[t.task_index]
            for t in cluster.training_tasks() if not t.is_chief}


def end_outside_a_session(target: str, task: Task, cluster: Cluster, config,
                          timeout_secs: float) -> None:
    """Steps 2, 3 and 7 for a worker whose training loop ran without these hooks (a
    script's own loop over a `Supervisor`'s or a plain session), from a session of its own
    made after the loop: a non-chief reports its end; the chief waits for the other
    workers' reports (at most `timeout_secs`, logged), then tells every ps to exit."""
    with tf.Graph().as_default():
        channel = ShutdownChannel(cluster.num_ps)
        with v1.Session(target, config=config) as sess:
            if not task.is_chief:
                channel.report_done(sess, task.replica_index)
                return
            missing = channel.wait_for_workers(sess, _other_workers(cluster), timeout_secs)
            if missing:
                logging.warning("chief: no end-of-training report from the workers at %s "
                                "within %.0f s; going on without them",
                                ", ".join(missing.values()), timeout_secs)
            channel.stop_ps(sess)
    logging.info("chief: told %d ps task(s) to exit", cluster.num_ps)


def queue(name: str, device: str, capacity: int = 1024):
    """An int32 FIFO queue in `device`'s resource manager, shared by `name` across graphs."""
    with v1.device(device):
        return v1.FIFOQueue(capacity, [tf.int32], shapes=[[]], shared_name=name,
                            name=name.replace("/", "_"))


# How often `ReportQueue.take` reads the queue's size while it waits, seconds.
REPORT_POLL_SECS = 0.02


class ReportQueue:
    """A queue of int32 reports (replica indices) on one ps, written by many tasks and
    read by one (the chief), built into the current graph.

    The reader never waits inside a dequeue. A dequeue whose `session.run` passes
    its `timeout_in_ms` can lose the element it was just given: ps's queue hands
    it over, then the step is cancelled and its result dropped (TF logs "Skipping
    cancelled dequeue attempt"). Measured on TF 2.21, one ps and a reader
    polling with 5 ms deadlines: 170 of 2,000 elements lost; at the chief's old
    500 ms deadlines, the start barrier lost a worker's only report once in CI
    (2026-12-07). `take` instead polls the size (a read: nothing is lost when its
    deadline passes) and dequeues only the reports already there, which returns at
    once because no other task dequeues them.

    Args:
      name: the queue's shared name, e.g. "lowlevel/workers_done".
      device: the ps device string it lives on.
    """

    def __init__(self, name: str, device: str):
        q = queue(name, device)
        self._index = v1.placeholder(tf.int32, [], name=name.replace("/", "_") + "_index")
        self._count = v1.placeholder(tf.int32, [], name=name.replace("/", "_") + "_count")
        self._report = q.enqueue(self._index)
        self._size = q.size()
        self._take = q.dequeue_many(self._count)

    def report(self, sess, index: int) -> None:
        """Enqueues `index`. Raises what the run raises (ps unreachable: `peer_unreachable`)."""
        sess.run(self._report, {self._index: index},
                 options=v1.RunOptions(timeout_in_ms=SIGNAL_TIMEOUT_MS))

    def take(self, sess, timeout_secs: float,
             stop: Optional[threading.Event] = None) -> list[int]:
        """The reader: the reports queued within `timeout_secs` seconds (the size is read
        every `REPORT_POLL_SECS`); [] if none came or `stop` was set.

        Raises:
          What a run raises (`DeadlineExceededError` or `UnavailableError` when the
          ps does not answer: `peer_unreachable`).
        """
        deadline = time.monotonic() + timeout_secs
        while True:
            # A healthy ps answers a size read in ~1 ms; a frozen one delays the
            # caller's deadline by at most a second.
            left_ms = (deadline - time.monotonic()) * 1000
            count = int(sess.run(self._size, options=v1.RunOptions(
                timeout_in_ms=int(min(SIGNAL_TIMEOUT_MS, max(1000, left_ms))))))
            if count:
                return [int(i) for i in sess.run(
                    self._take, {self._count: count},
                    options=v1.RunOptions(timeout_in_ms=SIGNAL_TIMEOUT_MS))]
            left = deadline - time.monotonic()
            if left <= 0 or (stop is not None and stop.is_set()):
                return []
            time.sleep(min(REPORT_POLL_SECS, left))


def ps_device(k: int) -> str:
    """The device string of ps task `k`'s CPU, where its queues live."""
    return f"/job:ps/task:{k}/device:CPU:0"


class ShutdownChannel:
    """The shutdown queues, built into the current graph (before it is finalised)."""

    def __init__(self, num_ps: int):
        self.num_ps = num_ps
        self._done = ReportQueue("lowlevel/workers_done", ps_device(0))
        self._stop_ps = [queue(f"lowlevel/stop_ps{k}", ps_device(k)).enqueue(0)
                         for k in range(num_ps)]
        ended = queue("lowlevel/ended_early", ps_device(0))
        self._end_early, self.ended_early = ended.enqueue(0), ended.size()

    def end_early(self, sess) -> None:
        """Tells the other workers that the run ended before its last step (the chief's).

        Raises:
          Whatever the run raises but a ps that cannot be reached (logged).
        """
        try:
            sess.run(self._end_early, options=v1.RunOptions(timeout_in_ms=SIGNAL_TIMEOUT_MS))
        except Exception as e:  # noqa: BLE001 - narrowed by `peer_unreachable`
            if not peer_unreachable(e):
                raise
            logging.warning("could not tell the workers through ps0 that the run ended "
                            "early: %s", e.message)

    def report_done(self, sess, task_index: int) -> None:
        """Tells the chief that training task `task_index` (its replica index) has finished.

        Best effort: if ps 0 cannot be reached (it is being restarted), the
        chief notices this worker's exit instead (`wait_for_workers`).
        """
        try:
            self._done.report(sess, task_index)
        except Exception as e:  # noqa: BLE001 - narrowed by `peer_unreachable`
            if not peer_unreachable(e):
                raise
            logging.warning("could not report the end of training to ps0: %s", e.message)

    def wait_for_workers(self, sess, workers: dict[int, str], timeout_secs: float,
                         stop: Optional[threading.Event] = None) -> dict[int, str]:
        """Waits until every worker has reported done or is gone; returns the ones still missing.

        A worker counts as gone once its server has refused connections for
        `GONE_SECS`: it exited (or died) after its last step, or its report
        was lost with a restarted ps 0. A worker restarted after this point
        finds the final checkpoint and exits at once. While ps 0 cannot be
        reached (`errors.peer_unreachable`: e.g. the chief's channel to it still
        reconnecting right after a recovered outage), the reports cannot be read
        and the exits alone count (once seen in CI: the chief then failed with
        `UnavailableError` after its last step, exit 200).

        Args:
          workers: {replica index: "host:port"} of the workers to hear from.
          timeout_secs: the longest wait, seconds.
          stop: ends the wait early when set (the chief is being preempted).
        """
        missing = dict(workers)
        refused_since: dict[int, float] = {}
        deadline = time.monotonic() + timeout_secs
        warned = False
        while missing and time.monotonic() < deadline and not (stop and stop.is_set()):
            try:
                for i in self._done.take(sess, min(POLL_SECS, deadline - time.monotonic()), stop):
                    missing.pop(i, None)
            except Exception as e:  # noqa: BLE001 - narrowed by `peer_unreachable`
                if not peer_unreachable(e):
                    raise
                # ps 0 unreachable or not answering (its channel reconnecting after an
                # outage, or it is being restarted): the reports are best effort; the
                # workers' exits still count, and the wait stays bounded by its deadline.
                if not warned:
                    logging.warning("chief: cannot read the workers' reports on ps0 (%s); "
                                    "watching for their exits instead", type(e).__name__)
                    warned = True
                time.sleep(min(POLL_SECS, max(0.0, deadline - time.monotonic())))
            now = time.monotonic()
            for i, address in list(missing.items()):
                if reachable(address, 0.2):
                    refused_since.pop(i, None)
                elif now - refused_since.setdefault(i, now) >= GONE_SECS:
                    logging.info("chief: the worker at %s has exited; not waiting for its "
                                 "report", address)
                    del missing[i]
        return missing

    def stop_ps(self, sess) -> None:
        """Tells every ps task to exit. A ps that is already gone is logged and skipped."""
        for k, op in enumerate(self._stop_ps):
            try:
                sess.run(op, options=v1.RunOptions(timeout_in_ms=SIGNAL_TIMEOUT_MS))
            except Exception as e:  # noqa: BLE001 - narrowed by `peer_unreachable`
                if not peer_unreachable(e):
                    raise
                logging.warning("could not reach ps%d to stop it: %s", k, e.message)


class ReportDoneHook(v1.train.SessionRunHook):
    """Protocol step 2: a non-chief worker reports that it is done (not when preempted)."""

    def __init__(self, channel: ShutdownChannel, task: Task, preempted: threading.Event):
        self._channel, self._task, self._preempted = channel, task, preempted

    def end(self, session):
        if not self._preempted.is_set():
            self._channel.report_done(session, self._task.replica_index)


class EndEarlyHook(v1.train.SessionRunHook):
    """The chief's early end: if its loop ended below `last_step` (not preempted), it tells
    the other workers (`ShutdownChannel.end_early`), logs it and emits `ended_early`.

    In a sync run the other workers wait inside their step for a token the chief's sync
    loop will no longer give: the hook also closes `SyncReplicasOptimizer`'s token queue
    (shared by its name, "sync_token_q", beside global_step), so that wait ends with
    `OutOfRangeError`, which ends a worker's loop as a run's last step does (`loop.run`).

    Args:
      global_step: the run's global step variable (read once, in `end`).
      last_step: `--train_steps`.
      sync: the run trains through a `SyncReplicasOptimizer`.
    """

    def __init__(self, channel: ShutdownChannel, global_step, last_step: int,
                 preempted: threading.Event, sync: bool = False):
        self._channel, self._global_step = channel, global_step
        self._last_step, self._preempted = last_step, preempted
        self._sync, self._close_tokens = sync, None

    def begin(self):
        if self._sync:
            with v1.device(self._global_step.device), v1.name_scope(None):
                tokens = v1.FIFOQueue(-1, self._global_step.dtype.base_dtype, shapes=(),
                                      shared_name="sync_token_q", name="end_early_token_q")
                self._close_tokens = tokens.close(cancel_pending_enqueues=True)

    def end(self, session):
        if self._preempted.is_set():
            return
        try:
            step = int(session.run(self._global_step,
                                   options=v1.RunOptions(timeout_in_ms=SIGNAL_TIMEOUT_MS)))
        except Exception as e:  # noqa: BLE001 - narrowed by `peer_unreachable`
            if not peer_unreachable(e):
                raise
            logging.warning("chief: could not read the global step at the end: %s", e.message)
            return
        if step >= self._last_step:
            return
        logging.info("chief: training stopped at global step %d, before --train_steps=%d (a "
                     "hook requested it, or the input ended); ending the run on every task",
                     step, self._last_step)
        events.emit("ended_early", step, train_steps=self._last_step)
        self._channel.end_early(session)
        if self._close_tokens is not None:
            session.run(self._close_tokens,
                        options=v1.RunOptions(timeout_in_ms=SIGNAL_TIMEOUT_MS))


class EndedEarlyHook(v1.train.SessionRunHook):
    """A non-chief worker's watch for the chief's early end: every `ENDED_EARLY_POLL_SECS`
    (`due`) one step runs through the hooks, and every such step fetches the size of ps 0's
    `ended_early` queue (due or not: one set of fetches, `loop.StepRunner`); once it is not
    empty the worker requests its stop (its loop ends after that step)."""

    def __init__(self, channel: ShutdownChannel, task: Task):
        self._channel, self._task = channel, task
        self._checked = time.monotonic()

    def due(self) -> bool:
        return time.monotonic() - self._checked >= ENDED_EARLY_POLL_SECS

    def before_run(self, run_context):
        self._checked = time.monotonic()
        return v1.train.SessionRunArgs(self._channel.ended_early)

    def after_run(self, run_context, run_values):
        if run_values.results:
            logging.info("%s: the chief ended the run before its last step; stopping",
                         self._task.name)
            run_context.request_stop()


class WaitForWorkersHook(v1.train.SessionRunHook):
    """Protocol step 3: the chief waits for the other workers' reports (not when preempted).

    Args:
      channel: the `ShutdownChannel` in the graph.
      workers: {replica index: "host:port"} of the other training tasks.
      timeout_secs: the longest wait, seconds (`--shutdown_timeout_secs`).
      preempted: set when the chief is being preempted.
    """

    def __init__(self, channel: ShutdownChannel, workers: dict[int, str],
                 timeout_secs: float, preempted: threading.Event):
        self._channel, self._workers = channel, workers
        self._timeout_secs, self._preempted = timeout_secs, preempted

    def end(self, session):
        if self._preempted.is_set():
            return
        missing = self._channel.wait_for_workers(session, self._workers, self._timeout_secs,
                                                 self._preempted)
        if missing and not self._preempted.is_set():
            logging.warning("chief: no end-of-training report from the workers at %s within "
                            "%.0f s; going on without them", ", ".join(missing.values()),
                            self._timeout_secs)


class StopPsHook(v1.train.SessionRunHook):
    """Protocol step 7: the chief tells every ps task to exit (not when preempted)."""

    def __init__(self, channel: ShutdownChannel, preempted: threading.Event):
        self._channel, self._preempted = channel, preempted

    def end(self, session):
        if self._preempted.is_set():
            return
        self._channel.stop_ps(session)
        logging.info("chief: told %d ps task(s) to exit", self._channel.num_ps)


def stop_cluster(server, cluster: Cluster, config, timeout_secs: float) -> None:
    """Step 7 for a chief with nothing to train: tells every ps task to exit, from its own session.

    The ps tasks may be starting (the whole cluster was restarted on a
    finished run) or long gone (only the chief was restarted, after the
    protocol had run). A ps that does not answer within `timeout_secs`
    seconds is taken to have exited already (logged, not an error).
    """
    try:
        wait_for_ps(cluster, timeout_secs)
    except StartupError as e:
        logging.warning("chief: not stopping the ps tasks: %s", e)
        return
    with tf.Graph().as_default():
        channel = ShutdownChannel(cluster.num_ps)
        with v1.Session(server.target, config=config) as sess:
            channel.stop_ps(sess)
    logging.info("chief: told %d ps task(s) to exit", cluster.num_ps)


def run_std_server(server, task: Task, config=None) -> int:
    """Step 8: serves as ps `task.task_index` until the chief's stop signal; returns 0.

    The wait for the signal is one blocking dequeue in a helper thread (a
    polling dequeue with a deadline makes the ps cancel a step every poll).
    SIGTERM and SIGINT are handled by `preemption.Preemption`, which ends the
    process at once (a ps has nothing to save: the chief's checkpoints are the
    state that survives it).
    """
    start_time = time.monotonic()
    stopped = threading.Event()
    with tf.Graph().as_default():
        wait = queue(f"lowlevel/stop_ps{task.task_index}", ps_device(task.task_index)
                      ).dequeue()
        sess = v1.Session(server.target, config=config)

    def wait_for_chief():
        sess.run(wait)
        stopped.set()

    threading.Thread(target=wait_for_chief, name="wait_for_chief", daemon=True).start()
    logging.info("%s: serving variables; will exit when the chief signals the end of "
                 "training", task.name)
    events.emit("serving")
    stopped.wait()
    logging.info("%s: the chief signalled the end of training after %.1f s; exiting",
                 task.name, time.monotonic() - start_time)
    events.emit("stopped", served_secs=round(time.monotonic() - start_time, 3))
    time.sleep(LINGER_SECS)
    return 0
