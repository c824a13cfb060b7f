"""Session creators that make the classic runtime start fast and recover without loss.

- `ChiefSessionCreator` / `WorkerSessionCreator`: the stock creators build a
  `SessionManager` with `recovery_wait_secs=30`, so a non-chief worker that
  asks before the chief has initialised the model sleeps 30 s
  (tensorflow/tensorflow#10679; `MonitoredTrainingSession` in 2.21 has no
  argument for it). These poll every `RECOVERY_WAIT_SECS` instead, as
  TensorFlow's own `mnist_replica.py` does with its 1 s. They are called
  again for every session that replaces one lost to a failed task, and make
  that recovery bounded and lossless: see `ChiefSessionCreator`.
- Both creators bound the final `Session.close()` to `CLOSE_TIMEOUT_SECS`: a
  distributed session's close sometimes blocks for several seconds in
  TF_CloseSession after the work is done (tensorflow/tensorflow#21745; seen
  here for 4-37 s), and the ps tasks may have exited by then. The end-of-
  training handshake has run before the close (`shutdown.end_of_training_hooks`)
  and the process is exiting, so the close is left to finish, or not, in a
  daemon thread.
- Both creators make each session in a thread they can abandon
  (`faults.abandonable`), calling their `guard` while it runs: a new
  session's first run creates the master session, whose device scan waits for
  every ps with no deadline (a frozen ps: forever, "CreateSession still
  waiting for response from worker"; `lowlevel.runtime.faults`), and the close of a
  session not ready yet (`SessionManager` polls with a new session each time)
  waits the same way. The guard raises to give up (past
  `--fault_timeout_secs` of the task's outage, or the start-up limit); the
  thread is left blocked and the task exits with status 200.
- `live_session`: the one way into a `MonitoredSession`'s private state.

Every session that replaces a lost one is announced as events
(`fault_noticed` when the creator is called again, `recovered` when the new
session exists; `lowlevel.events`).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time

import tensorflow as tf
from absl import logging

from lowlevel import events
from lowlevel.outputs import checkpoints
from lowlevel.runtime import faults

v1 = tf.compat.v1

RECOVERY_WAIT_SECS = 0.5
CLOSE_TIMEOUT_SECS = 2.0


def live_session(monitored) -> "v1.Session | None":
    """The `tf.compat.v1.Session` behind a `MonitoredSession`; None while it is being recreated.

    `MonitoredSession` keeps its session behind private attributes and replaces
    it after a failure (`UnavailableError`/`AbortedError`); between the loss
    and the new session there is none. This is the only place that reaches
    into those internals (`_tf_sess()`, TensorFlow 2.21's
    `training/monitored_session.py`), so a change there is one fix here.
    """
    get = getattr(monitored, "_tf_sess", None)
    try:
        return get() if get is not None else None
    except AttributeError:  # not yet (or no longer) created
        return None


def _announce_recreation(sessions: int) -> None:
    """A creator called again means the session before was lost to a fault."""
    if sessions > 1:
        events.emit("fault_noticed", None, error="session lost (a task failed or was "
                    "restarted); creating a new one")


def _bounded_close(sess, cluster_alive=None):
    """Makes `sess.close()` return after at most `CLOSE_TIMEOUT_SECS` seconds.

    With `cluster_alive` (returns whether every ps task answers) it returns at
    once when a ps is gone: the close of a session that lost its ps (the one a
    recovery replaces) cannot complete, and waiting for it only delays the
    recovery.
    """
    close = sess.close

    def bounded():
        t = threading.Thread(target=close, name="session_close", daemon=True)
        t.start()
        deadline = time.monotonic() + CLOSE_TIMEOUT_SECS
        while t.is_alive() and time.monotonic() < deadline:
            t.join(0.1)
            if cluster_alive is not None and t.is_alive() and not cluster_alive():
                return
        if t.is_alive():
            logging.info("session close unfinished after %.0f s (the ps tasks may have exited "
                         "already; tensorflow/tensorflow#21745); not waiting for it",
                         CLOSE_TIMEOUT_SECS)

    sess.close = bounded
    return sess


def _retrying_deadlines(create, budget_secs: float):
    """`create()`, run again while it fails with a run's deadline (not "not ready") within
    `budget_secs` seconds: the session's `operation_timeout_in_ms` (`--step_timeout_secs`)
    bounds each ready check, and one that times out (a loaded host, a ps not answering
    yet) says nothing about the model."""
    deadline = time.monotonic() + budget_secs
    while True:
        try:
            return create()
        except tf.errors.DeadlineExceededError as e:
            if "not ready" in str(e) or time.monotonic() >= deadline:
                raise
            logging.info("session set-up timed out (%s); trying again", e.message)
            time.sleep(RECOVERY_WAIT_SECS)


@contextlib.contextmanager
def _timed(phases: dict, name: str):
    """`phases[name]`: the block's seconds (also when it raises)."""
    started = time.monotonic()
    try:
        yield
    finally:
        phases[name] = time.monotonic() - started


def _session_manager(scaffold):
    return v1.train.SessionManager(
        local_init_op=scaffold.local_init_op,
        local_init_feed_dict=scaffold.local_init_feed_dict,
        ready_op=scaffold.ready_op,
        ready_for_local_init_op=scaffold.ready_for_local_init_op,
        graph=v1.get_default_graph(),
        recovery_wait_secs=RECOVERY_WAIT_SECS)


class ChiefSessionCreator(v1.train.ChiefSessionCreator):
    """Makes the chief's session: adopts the model the ps tasks hold, or restores, or initialises.

    Called for the first session and again for every session that replaces one
    lost to a failed task (`MonitoredSession` recreates it on
    `UnavailableError`/`AbortedError`). Each time:

    1. `wait_for_ps` (a bounded poll, so a ps that stays down ends in a clear
       `errors.StartupError` instead of a CreateSession that waits forever);
    2. if the ps tasks hold an initialised model (the chief itself was
       restarted; the ps and the other workers carried on) it is used as it
       is: nothing trained since the last checkpoint is lost;
    3. else the newest checkpoint that reads whole is restored
       (`checkpoints.newest_readable`: a truncated newest one is skipped, with
       a warning, for the one before); if it is `partial.path` (a checkpoint
       lacking some optimizer state, `checkpoints.PartialRestore`), every
       variable is initialised and then what it holds restored;
    4. else the model is initialised.

    Attributes:
      origin: how the last session got its model: "adopted", "restored" or
        "initialised".
      restored_from: (path, global step) of the checkpoint last restored, or None.
      phases: seconds of the last set-up's parts: `ready_check` (whether the ps tasks
        hold the model: a session, its first run and the check), `restore_run` (a new
        session, the restore or the initialisation, the local init and the ready check:
        `SessionManager.prepare_session`), `total`.
    """

    def __init__(self, scaffold, master, config, checkpoint_dir, wait_for_cluster=None,
                 cluster_alive=None, partial=None, guard=None):
        super().__init__(scaffold=scaffold, master=master, config=config)
        self._output_dir = checkpoint_dir
        self._partial = partial
        self._wait_for_cluster = wait_for_cluster
        self._cluster_alive = cluster_alive
        self._guard = guard
        self.origin = self.restored_from = None
        self.phases: dict = {}
        self.sessions = 0
        self.retry_secs = 60.0  # how long a ready check that times out is retried

    def create_session(self):
        self._scaffold.finalize()
        manager = self._get_session_manager()
        self.sessions += 1
        _announce_recreation(self.sessions)
        if self._wait_for_cluster is not None:
            self._wait_for_cluster()
        started = time.monotonic()
        sess = faults.abandonable(lambda: self._create(manager), self._guard,
                                  "session_create")
        self.phases["total"] = time.monotonic() - started
        if self.sessions > 1:
            logging.info("chief: new session after a failure; %s (%s)", self.describe(),
                         self.describe_phases())
            fields = self.event_fields()
            events.emit("recovered", fields["restored_step"], **fields)
        return _bounded_close(sess, self._cluster_alive)

    def _create(self, manager):
        """Adopts, restores or initialises (the class doc's steps 2-4); returns the session."""
        sess, self.phases = None, {}
        if self._wait_for_cluster is not None:
            try:
                with _timed(self.phases, "ready_check"):
                    sess = _retrying_deadlines(lambda: manager.wait_for_session(
                        self._master, self._config, max_wait_secs=0), self.retry_secs)
                self.origin = "adopted"
            except tf.errors.DeadlineExceededError as e:
                # "Session was not ready after waiting 0 secs": the ps tasks hold no
                # initialised model. Any other deadline (--step_timeout_secs, a
                # ready check against a ps not answering yet) says nothing about
                # the model: restoring now would throw the live model away, so
                # the error goes to the training loop, which retries (bounded).
                if "not ready" not in str(e):
                    raise
        if sess is None:
            self.restored_from = checkpoints.newest_readable(self._output_dir)
            self._checkpoint_filename_with_path = (self.restored_from[0] if self.restored_from
                                                   else None)
            self.origin = "restored" if self.restored_from else "initialised"
            if self._partial is not None and self._checkpoint_filename_with_path == \
                    self._partial.path:
                sess = manager.prepare_session(
                    self._master, init_op=self._scaffold.init_op,
                    init_feed_dict=self._scaffold.init_feed_dict, config=self._config,
                    init_fn=self._partial.restore)
            else:
                with _timed(self.phases, "restore_run"):
                    sess = super().create_session()
        return sess

    def describe(self) -> str:
        """How the last session got its model, in words."""
        if self.origin == "restored":
            path, step = self.restored_from
            return f"restored from checkpoint {os.path.basename(path)}, at global step {step}"
        if self.origin == "adopted":
            return "the ps tasks still held the model: continuing from it"
        return "model initialised"

    def describe_phases(self) -> str:
        """Where the last session's set-up went, in seconds (`phases`)."""
        words = {"ready_check": "the ps tasks' model checked",
                 "restore_run": "session, restore, local init and ready check",
                 "total": "in all"}
        return ", ".join(f"{words[k]} {v:.1f} s" for k, v in self.phases.items())

    def event_fields(self) -> dict:
        """`origin` and `restored_step` of the last session, and its set-up's `phases`
        (seconds), for its events."""
        return {"origin": self.origin,
                "restored_step": self.restored_from[1] if self.origin == "restored" else None,
                "phases": {k: round(v, 3) for k, v in self.phases.items()}}

    def _get_session_manager(self):
        if not self._session_manager:
            self._session_manager = _session_manager(self._scaffold)
        return self._session_manager


class WorkerSessionCreator(v1.train.WorkerSessionCreator):
    """Waits (polling every `RECOVERY_WAIT_SECS`) until the chief has the model ready.

    Each session, the first and every one that replaces a lost one, first
    runs `wait_for_cluster` (the bounded ps poll), then waits for the model at
    most `max_wait_secs`.

    Raises (from `create_session`):
      tf.errors.DeadlineExceededError: not ready after `max_wait_secs` seconds.
    """

    def __init__(self, scaffold, master, config, max_wait_secs, wait_for_cluster=None,
                 cluster_alive=None, guard=None):
        super().__init__(scaffold=scaffold, master=master, config=config,
                         max_wait_secs=max_wait_secs)
        self._wait_for_cluster = wait_for_cluster
        self._cluster_alive = cluster_alive
        self._guard = guard
        self.sessions = 0

    def create_session(self):
        self.sessions += 1
        _announce_recreation(self.sessions)
        if self._wait_for_cluster is not None:
            self._wait_for_cluster()
        create = super().create_session
        sess = faults.abandonable(lambda: _retrying_deadlines(create, self._max_wait_secs),
                                  self._guard, "session_create")
        if self.sessions > 1:
            logging.info("worker: new session after a failure; the model is ready again")
            events.emit("recovered", None, **self.event_fields())
        return _bounded_close(sess, self._cluster_alive)

    def event_fields(self) -> dict:
        """`origin` and `restored_step` of the last session, for its events."""
        return {"origin": "ready", "restored_step": None}

    def _get_session_manager(self):
        if not self._session_manager:
            self._session_manager = _session_manager(self._scaffold)
        return self._session_manager
