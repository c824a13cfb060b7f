"""Session-run hooks of the training loop.

- `CheckpointHook`, `SummaryHook`: the chief's checkpoints and TensorBoard
  summaries. The stock `CheckpointSaverHook` and `SummarySaverHook` each add
  a read of global_step to every step — a round trip to its ps that the
  communication-reduced mode's local steps would otherwise not make at all.
  These take the step the training loop already knows (`LoopState`).
- `SyncReplicasHook`: `SyncReplicasOptimizer`'s own hook, except that the
  chief's sync loop ends by itself at the last step instead of blocking in
  the ps's accumulators until its session is cancelled, and a step stuck on
  a dead worker is reported instead of waiting silently.
(`progress.ProgressHook`: progress lines and events, throughput, step times.)
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Optional

import tensorflow as tf
from absl import logging

from lowlevel import errors, events, output_layout
from lowlevel.outputs import checkpoints, files, storage

v1 = tf.compat.v1


class LoopState:
    """What the training loop knows, shared with the hooks so they need not fetch it.

    The loop runs most steps through a callable on the raw session, past the
    hooks (`loop.StepRunner`); a step goes through the monitored session,
    and so through the hooks, when one of them is `due()`.

    Attributes:
      value: the global step as the loop last saw it.
      in_step: the run under way is a training step (not an exchange or a
        claim): hooks that fetch the batch's loss or summaries act only then.
      outage: the task's `faults.Outage` once training runs (None before, and
        in-process): a hook whose run may outlast a step's deadline (a save)
        extends the run's allowance there.
    """

    def __init__(self):
        self.value = 0
        self.in_step = False
        self.outage = None


INITIAL_SAVE_MAX_BYTES = 1 << 30  # `CheckpointHook`: larger states are not saved at session start
SAVE_MIN_BYTES_PER_SEC = 20e6  # a save's deadline allows writing at this speed (a slow disk)


def save_timeout_secs(step_timeout_secs: float, state_bytes: int) -> float:
    """The deadline of a save of `state_bytes`: a step's, plus the bytes at
    `SAVE_MIN_BYTES_PER_SEC` (13.6 GB: 740 s; this machine writes 450 MB/s)."""
    return step_timeout_secs + state_bytes / SAVE_MIN_BYTES_PER_SEC


class CheckpointHook(v1.train.SessionRunHook):
    """Saves a checkpoint every `save_steps` global steps or `save_secs` seconds, and at the end.

    Writes `graph.pbtxt` and the graph summary when the first session is
    created, and saves the state it starts from (as the stock hook does)
    unless it is the ps tasks' live model, newer than the newest checkpoint (a
    restarted chief adopted it, `sessions.ChiefSessionCreator`: the save, 3.5 s
    of a 1 GB state, would delay its first step and, with the data queue, pause
    every worker; the cadence saves it), or the model's variables hold more than
    `INITIAL_SAVE_MAX_BYTES`:
    that state is the checkpoint just restored, or the deterministic initial
    one (tables start lazily, `embeddings`; the built-in models' initialisers
    are seeded), and at 100 M rows its 13.6 GB save took longer than the
    60 s to the first step that issue 27 allows. The
    final save in `end` runs after every earlier hook's `end`: place it after
    the hook that waits for the other workers, so it holds their last updates.

    Args:
      saver: the `tf.compat.v1.train.Saver`.
      output_dir: where `model.ckpt-<global step>` files go.
      steps: the training loop's `LoopState`.
      save_steps / save_secs: the cadence; steps win when both are given.
      max_failures: saves in a row that may fail (full or read-only disk: one
        line each, `storage.CheckpointSaves`) before the run ends with
        `errors.StorageFailure`.
      state_bytes: bytes of the variables the saver writes (decides the
        first save; 0: always save it).
      save_timeout_secs: the deadline of a save's runs (None: the session's);
        the task's outage clock (`steps.outage`) allows the run in flight as
        long (`faults.Outage.extended`).

    Attributes:
      saves: the `storage.CheckpointSaves`; `saves.last_failed` after `end`
        says whether the final checkpoint is missing.
    """

    def __init__(self, saver, output_dir: str, steps: LoopState,
                 save_steps: Optional[int] = None, save_secs: Optional[float] = None,
                 max_failures: int = 3, state_bytes: int = 0,
                 save_timeout_secs: Optional[float] = None):
        self._saver = saver
        self._state_bytes = state_bytes
        self._save_timeout_secs = save_timeout_secs
        self.saves = storage.CheckpointSaves(output_dir, max_failures)
        self._graph_writes = storage.Writes("the graph")
        self._output_dir = output_dir
        self._prefix = output_layout.checkpoint_prefix(output_dir)
        self._steps = steps
        self._timer = v1.train.SecondOrStepTimer(every_secs=None if save_steps else save_secs,
                                                 every_steps=save_steps)
        self._first_session = True

    def begin(self):
        self._global_step = v1.train.get_global_step()

    def after_create_session(self, session, coord):
        if isinstance(self._saver, checkpoints.StateSaver):  # a dead chief's save's pause
            self._saver.lift(session)
        step = int(session.run(self._global_step))
        self._steps.value = step
        if self._first_session:
            self._first_session = False
            graph = v1.get_default_graph()
            self._graph_writes.run(lambda: files.write_graph(graph, self._output_dir),
                                   self._output_dir)
            newest = max((s for s in map(checkpoints.step_of, checkpoints.all_checkpoints(
                self._output_dir)) if s is not None), default=None)
            if newest is not None and step > newest:
                logging.info("not saving the state at step %d: the ps tasks' live model, newer "
                             "than checkpoint %d (a restarted chief adopted it); the next "
                             "checkpoint comes with the cadence", step, newest)
            elif self._state_bytes <= INITIAL_SAVE_MAX_BYTES:
                self._save(session, step)
            else:
                logging.info("not saving the state at step %d (%.1f GB, above %.1f GB: restored "
                             "or deterministic); the first checkpoint comes with the cadence",
                             step, self._state_bytes / 1e9, INITIAL_SAVE_MAX_BYTES / 1e9)
        self._timer.update_last_triggered_step(step)

    def due(self) -> bool:
        # Before the next run the loop has recorded the step the last one ended at.
        return self._timer.should_trigger_for_step(self._steps.value)

    def before_run(self, run_context):
        if self.due():
            self._timer.update_last_triggered_step(self._steps.value)
            self._save(run_context.session, self._steps.value)

    def end(self, session):
        # Always: a save at this same step may predate the other workers' last
        # updates (in the communication-reduced mode, their last exchanges).
        self._save(session, self._steps.value, final=True)

    def _save(self, session, step: int, final: bool = False) -> None:
        secs, outage = self._save_timeout_secs, self._steps.outage
        kwargs = {"timeout_secs": secs} if secs and isinstance(
            self._saver, checkpoints.StateSaver) else {}
        with outage.extended(secs) if outage and secs else contextlib.nullcontext():
            path = self.saves.save(
                lambda: self._saver.save(session, self._prefix, global_step=self._global_step,
                                         **kwargs), step, final)
        if path is None:
            return
        logging.info("saved %s", os.path.basename(path))
        events.emit("checkpoint_saved", checkpoints.step_of(path),
                    path=os.path.basename(path), emergency=False)


class LeaveHook(v1.train.SessionRunHook):
    """A worker leaves the data queue at its loop's end: `leave` (int32, the spans freed: an
    op, `spans.SpanQueue.release`; or a callable of the session and run options,
    `elastic_sync.ElasticSync.leave` in sync) frees its span
    and clears its mark in the async save gate (a last step refused as the run ended
    leaves one, which the final save would wait for) and its sync heartbeat. Stopped by
    SIGTERM or SIGINT (`preempted` set: a resize, a preemption), that frees its span for
    the next claim at once rather than after `--span_lease_secs` (60 s), and no sync step
    waits `--sync_live_secs` for it: logged, with a `left` event. Best effort: if ps 0
    does not answer within `LEAVE_TIMEOUT_SECS`, the lease and the heartbeat's age do it."""

    LEAVE_TIMEOUT_SECS = 10.0

    def __init__(self, leave, preempted: threading.Event):
        self._leave, self._preempted = leave, preempted

    def end(self, session):
        options = v1.RunOptions(timeout_in_ms=int(self.LEAVE_TIMEOUT_SECS * 1000))
        try:
            freed = int(self._leave(session, options) if callable(self._leave) else
                        session.run(self._leave, options=options))
        except tf.errors.OpError as e:
            if self._preempted.is_set():
                logging.warning("data queue: could not leave (%s); the span goes to another "
                                "worker after --span_lease_secs", str(e).splitlines()[0])
            return
        if not self._preempted.is_set():
            return
        logging.info("data queue: left (stopped by a signal): %d span(s) freed for the other "
                     "workers", freed)
        events.emit("left", None, spans_freed=freed)


class SummaryHook(v1.train.SessionRunHook):
    """Writes the graph's merged summaries (of a training step) every `every_secs` seconds,
    at the global step fetched with them, or with `step_from_loop` at the loop's
    (`LoopState.value`: the communication-reduced mode, `progress.ProgressHook`)."""

    def __init__(self, output_dir: str, every_secs: float, state: LoopState,
                 step_from_loop: bool = False):
        self._output_dir = output_dir
        self._step_from_loop = step_from_loop
        self._every_secs = every_secs
        self._state = state
        self._next = 0.0
        self._acting = False  # this hooked step writes (it was due)
        self._writes = storage.Writes("summaries")

    def begin(self):
        self._summary = v1.summary.merge_all()
        self._global_step = v1.train.get_global_step()

    def due(self) -> bool:
        return self._summary is not None and time.monotonic() >= self._next

    def before_run(self, run_context):
        # Fetched in every step run through the hooks, written when due: one set of
        # fetches, one executor (`loop.StepRunner`).
        if not self._state.in_step or self._summary is None:
            return None
        self._acting = self.due()
        if self._acting:
            self._next = time.monotonic() + self._every_secs
        fetches = {"summary": self._summary}
        if not self._step_from_loop:
            fetches["step"] = self._global_step
        return v1.train.SessionRunArgs(fetches)

    def after_run(self, run_context, run_values):
        if run_values.results and self._acting:
            step = run_values.results.get("step", self._state.value)
            self._writes.run(lambda: files.event_writer(self._output_dir).add_summary(
                run_values.results["summary"], step), self._output_dir)


class SyncReplicasHook(v1.train.SessionRunHook):
    """Initialises a `SyncReplicasOptimizer` and, on the chief, runs its sync loop.

    The chief's loop runs the optimizer's sync op: wait for
    `replicas_to_aggregate` gradients in the ps's accumulators, apply their
    mean, bump global_step and put one token per worker in the token queue.
    The stock queue runner keeps calling it after the last step, where it
    blocks in the accumulators until its session is closed and the close
    cancels it — the hang of tensorflow/tensorflow#7970, and the reason a sync
    chief's close could take many seconds. This loop stops by itself once
    global_step reaches `last_step` (only the sync op moves global_step in sync
    mode), so nothing is left blocked.

    The sync op runs without a deadline: it takes one accumulator after the
    other, and a run cancelled between two of them (a `RunOptions` deadline
    while a restarted worker's gradients arrive) throws away the gradients
    already taken and leaves those accumulators a step ahead of the others,
    which then drop every gradient as stale: the cluster deadlocks with every
    task answering (seen in CI; a 2 ms deadline deadlocks a 2-worker run
    within a few steps). Instead a watcher thread reports a step that has
    waited `timeout_secs` for gradients (a worker died and there are no backup
    workers): it logs which workers do not answer (`missing_workers()`) and
    emits `fault_noticed`, every `timeout_secs` while the wait lasts. The step
    completes as soon as a restarted worker sends its gradient: nothing is
    lost and nothing hangs silently. A session closed under a waiting sync op
    (preemption, a failure elsewhere) cancels it and the loop ends. A ps that
    stops answering (frozen, cut off) holds the sync op too: the watcher names
    it, and the chief's own steps, which have their deadline, end the task with
    status 200 at `--fault_timeout_secs` (`faults.Outage`); this loop's thread,
    blocked in TensorFlow with no deadline, is a daemon and ends with the process.

    Args:
      sync_optimizer: the optimizer, after `minimize`/`apply_gradients`.
      is_chief: whether this worker is the chief.
      global_step: the global step variable.
      last_step: the step training stops at.
      timeout_secs: seconds a sync step may wait before the watcher reports it.
      missing_workers: returns "name at host:port" of the tasks a sync step waits on
        (the ps tasks, the other workers) that do not answer.
      num_tokens: tokens put in the queue at start; -1: `replicas_to_aggregate`.
    """

    # A deadline no sync step reaches: 0 would mean the session's own
    # `operation_timeout_in_ms` (`--step_timeout_secs`), which would cancel it.
    NO_DEADLINE_MS = 365 * 24 * 3600 * 1000

    def __init__(self, sync_optimizer, is_chief: bool, global_step, last_step: int,
                 timeout_secs: float = 60.0, missing_workers=None, num_tokens: int = -1):
        self._opt = sync_optimizer
        self._is_chief = is_chief
        self._global_step = global_step
        self._last_step = last_step
        self._timeout_secs = timeout_secs
        self._missing_workers = missing_workers or (lambda: [])
        self._num_tokens = num_tokens
        self._lock = threading.Lock()
        self._step = 0  # the global step the sync op under way will complete
        self._since = 0.0  # monotonic seconds: when it started
        self._reported = 0.0  # seconds of its wait reported so far

    def begin(self):
        opt = self._opt
        self._init_tokens_op = self._sync_op = None
        if not self._is_chief:
            self._local_init_op = opt.local_step_init_op
            return
        self._local_init_op = opt.chief_init_op
        self._init_tokens_op = opt.get_init_tokens_op(self._num_tokens)
        (sync_op,) = opt.get_chief_queue_runner().enqueue_ops
        with tf.control_dependencies([sync_op]):  # one round trip per step: sync, then read
            self._sync_op = self._global_step.read_value()

    def after_create_session(self, session, coord):
        session.run(self._local_init_op)
        if self._init_tokens_op is None:
            return
        session.run(self._init_tokens_op)
        ended = threading.Event()  # one per session: a recovered session starts anew
        with self._lock:  # the watcher's clock starts now, not at the first sync step
            self._since, self._reported = time.monotonic(), 0.0
        thread = threading.Thread(target=self._sync_loop, args=(session, coord, ended),
                                  name="sync_replicas_chief", daemon=True)
        coord.register_thread(thread)
        thread.start()
        threading.Thread(target=self._watch, args=(coord, ended), name="sync_replicas_watch",
                         daemon=True).start()

    def _sync_loop(self, session, coord, ended):
        options = v1.RunOptions(timeout_in_ms=self.NO_DEADLINE_MS)
        try:
            step = session.run(self._global_step)
            while not coord.should_stop() and step < self._last_step:
                with self._lock:
                    self._step, self._since, self._reported = step, time.monotonic(), 0.0
                step = session.run(self._sync_op, options=options)
                with self._lock:
                    waited = self._reported and time.monotonic() - self._since
                if waited:
                    logging.info("sync steps complete again (global step %d) after %.0f s",
                                 step, waited)
        except Exception as e:  # noqa: BLE001 - narrowed by `run_cancelled`
            if not errors.run_cancelled(e):
                coord.request_stop(e)  # handed to the coordinator
        finally:
            ended.set()

    def _watch(self, coord, ended):
        """Reports, every `timeout_secs`, a sync step still waiting for gradients."""
        poll = min(max(self._timeout_secs / 4, 0.05), 1.0)
        while not ended.wait(poll) and not coord.should_stop():
            with self._lock:
                step, waited = self._step, time.monotonic() - self._since
                due = waited >= self._reported + self._timeout_secs
                if due:
                    self._reported = waited
            if not due:
                continue
            missing = self._missing_workers()
            events.emit("fault_noticed", step, error="sync step still waiting for "
                        f"gradients after {waited:.0f} s", missing=missing)
            logging.warning(
                "sync step %d: still waiting for gradients after %.0f s "
                "(--sync_timeout_secs); %s", step, waited,
                f"not answering: {', '.join(missing)}" if missing else
                "every ps and worker answers (a slow or restarting worker?)")
