"""A TF1 script's training step, counted: an async run ends at exactly its last step.

A script builds its step (`opt.minimize(loss, global_step=global_step)`) before it makes its
`MonitoredTrainingSession`, and its last step is in a hook it gives that session
(`StopAtStepHook(last_step=N)`). The stock step reads global_step, applies, and adds 1, so
every worker that read the step before the end applies its update too: an async run of the
Distributed TensorFlow guide's skeleton on 1 ps + 2 workers ended at N + 1 (measured:
docs/tf1-programs.md). Once `install`ed (`lowlevel.train.Server` does, in the process of a
ps/worker task), every `tf.compat.v1.train.Optimizer.apply_gradients` given a `global_step`
(which `minimize` calls) builds the exact mode's counted update instead
(`exact.counted_update`: the step reserves its number on global_step's ps first, then
applies) with its limit left open, the largest value of the step's dtype. `close_limit`
sets it to N when the session is made, before the graph is finalised: each step number up
to N is then taken by exactly one worker, and a step that finds none left raises
`tf.errors.OutOfRangeError`; `tf.compat.v1.Session.run` then runs the same fetches with
the step swapped for a NoOp and returns them (`_run_past_the_end`: the step's result None,
as an op's is, the global step N), so `StopAtStepHook` and a loop `until step >= N` both
end there. A script whose loop is its own (a `Supervisor`'s or a plain session, `until
step >= N`) can give N in the environment, `LOWLEVEL_LAST_STEP=N`: its steps are made with
that limit. With neither, the limit stays open: the steps run as the stock ones do,
reserved first.

The limit is an attribute of the `CountUpTo` op, fixed when the op is made; `close_limit`
changes it with `Operation._set_attr`, TensorFlow's private API (the one reach into TF's
private state here; present since TF 1.x, used by TF's own graph rewrites).

A `SyncReplicasOptimizer`'s own apply is left alone: it pushes gradients, and the inner
optimizer's apply it builds (run by the chief's sync op) keeps its global step. Its
`make_session_run_hook` returns a `DeferredSyncHook`, which behaves as the stock hook
unless the session that gets it replaces it (`lowlevel.train` does, with the runtime's
hook, whose chief loop stops at the last step: tensorflow/tensorflow#7970). A loop of the
script's own starts the chief's queue runner itself: with `LOWLEVEL_LAST_STEP`, its
`get_chief_queue_runner` returns a `CountedChiefQueueRunner`, which stops there too.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Optional

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

from lowlevel.modes import exact, optimizer_capture

v1 = tf.compat.v1

COUNTED_STEPS = "lowlevel_counted_steps"  # graph collection: the CountUpTo ops, limit open
# The name, under a counted step's own (`STEP/no_step_left`), of the NoOp run in its place
# once no step is left.
STAND_IN = "no_step_left"
# The environment variable that gives the last step when no StopAtStepHook does (a loop of
# the script's own, `until step >= N`): a positive integer.
LAST_STEP_ENV = "LOWLEVEL_LAST_STEP"

_install_lock = threading.Lock()
_originals: dict = {}  # (class, attribute name) -> TensorFlow's own, while installed
_sync_global_steps: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def install() -> None:
    """Makes every `tf.compat.v1.train.Optimizer`'s apply with a global step the counted
    update, `SyncReplicasOptimizer.make_session_run_hook` a `DeferredSyncHook`, and
    `tf.compat.v1.Session.run` one that runs on past the last step (`_run_past_the_end`),
    for the rest of the process (once; later calls do nothing)."""
    base, sync = v1.train.Optimizer, v1.train.SyncReplicasOptimizer
    with _install_lock:
        if _originals:
            return
        for cls, name in ((base, "apply_gradients"), (sync, "apply_gradients"),
                          (sync, "make_session_run_hook"), (sync, "get_chief_queue_runner"),
                          (v1.Session, "run")):
            _originals[cls, name] = getattr(cls, name)
    own_apply, own_sync_apply = base.apply_gradients, sync.apply_gradients
    own_hook, own_runner = sync.make_session_run_hook, sync.get_chief_queue_runner
    v1.Session.run = _run_past_the_end(v1.Session.run)

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        if global_step is None or optimizer_capture.inside_sync():
            return own_apply(self, grads_and_vars, global_step, name)
        return counted_step(self, grads_and_vars, global_step)

    sync_apply_gradients = optimizer_capture.marking_sync_apply(
        own_sync_apply, _sync_global_steps.__setitem__)

    def make_session_run_hook(self, is_chief, num_tokens=-1):
        return DeferredSyncHook(self, is_chief, num_tokens, own_hook(self, is_chief, num_tokens))

    def get_chief_queue_runner(self):
        return counted_chief_queue_runner(self, own_runner(self))

    base.apply_gradients, sync.apply_gradients = apply_gradients, sync_apply_gradients
    sync.make_session_run_hook = make_session_run_hook
    sync.get_chief_queue_runner = get_chief_queue_runner


def uninstall() -> None:
    """Puts TensorFlow's own methods back (for tests: the runtime never uninstalls)."""
    with _install_lock:
        for (cls, name), own in _originals.items():
            setattr(cls, name, own)
        _originals.clear()


def trains_in_sync() -> bool:
    """Whether a `SyncReplicasOptimizer` has been applied in this process (since `install`)."""
    return len(_sync_global_steps) > 0


def counted_step(opt, grads_and_vars, global_step) -> tf.Operation:
    """`opt`'s update of `grads_and_vars` as the counted update of `global_step` (a
    variable of integer dtype, resource or not), its limit `first_limit`'s until
    `close_limit`. Returns the step's op (as `apply_gradients` returns one).

    Raises:
      ValueError: no gradient at all (as `apply_gradients`); `LOWLEVEL_LAST_STEP` is set
        to something other than a positive integer.
    """
    pairs = [(g, v) for g, v in grads_and_vars if g is not None]
    if not pairs:
        raise ValueError(f"No gradients provided for any variable: {grads_and_vars}")
    step = exact.counted_update(opt, pairs, global_step, first_limit(global_step),
                                COUNTED_STEPS).op
    with tf.control_dependencies(None), tf.name_scope(step.name + "/"):
        tf.no_op(name=STAND_IN)
    return step


def first_limit(global_step) -> int:
    """The limit a counted step is made with: `LOWLEVEL_LAST_STEP` when set, else open (the
    largest value of global_step's dtype)."""
    value = env_last_step()
    return global_step.dtype.base_dtype.max if value is None else value


def env_last_step():
    """`LOWLEVEL_LAST_STEP` as an int, None when unset or empty.

    Raises:
      ValueError: it is not a positive integer.
    """
    text = os.environ.get(LAST_STEP_ENV, "").strip()
    if not text:
        return None
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{LAST_STEP_ENV}={text!r}: expected a positive integer (the global "
                         "step a script's training ends at)")
    return int(text)


def _run_past_the_end(own_run):
    """`Session.run` that, when a counted step it runs finds no step left
    (`OutOfRangeError` from its `CountUpTo`), runs the same fetches again with each counted
    step fetched in them swapped for a NoOp, and returns that: the step's own result is
    None (as an op's always is) and the rest (the global step: the last step) are real. A
    loop `until step >= N` then ends at N; `StopAtStepHook` sees N. A counted step reached
    only through another fetch (`tf.group(train_op, ...)`) still raises."""
    def run(self, fetches, feed_dict=None, options=None, run_metadata=None):
        try:
            return own_run(self, fetches, feed_dict, options, run_metadata)
        except tf.errors.OutOfRangeError as e:
            swapped = _without_steps(self.graph, fetches, e)
            if swapped is None:
                raise
            return own_run(self, swapped, feed_dict, options, run_metadata)
    return run


def _without_steps(graph, fetches, error):
    """`fetches` with each counted step in them swapped for its NoOp, when `error` is a
    counted step's `CountUpTo` and `fetches` holds a counted step; else None."""
    counted = {op.name for op in graph.get_collection(COUNTED_STEPS)}
    if error.op is None or error.op.name not in counted:
        return None
    found = []

    def swap(fetch):
        if not isinstance(fetch, tf.Operation):
            return fetch
        try:
            stand_in = graph.get_operation_by_name(f"{fetch.name}/{STAND_IN}")
        except KeyError:
            return fetch
        found.append(fetch)
        return stand_in
    swapped = _map_fetches(swap, fetches)
    return swapped if found else None


def _map_fetches(fn, fetches):
    """`fetches` (a fetch, or lists, tuples, namedtuples and dicts of them, as
    `Session.run` takes) with `fn` applied to each fetch. Not `tf.nest`: it sorts a dict's
    keys, and `MonitoredSession` keys its run's dict by its hooks and "caller"."""
    if isinstance(fetches, dict):
        return {key: _map_fetches(fn, value) for key, value in fetches.items()}
    if isinstance(fetches, tuple) and hasattr(fetches, "_fields"):
        return type(fetches)(*(_map_fetches(fn, value) for value in fetches))
    if isinstance(fetches, (list, tuple)):
        return type(fetches)(_map_fetches(fn, value) for value in fetches)
    return fn(fetches)


def counted_chief_queue_runner(optimizer, stock):
    """The chief's queue runner of a `SyncReplicasOptimizer` (`stock`, its own) for a loop
    of the script's own: with `LOWLEVEL_LAST_STEP=N`, a `CountedChiefQueueRunner` that
    stops at global step N; else, or once the graph is finalised (no op can be added),
    `stock`."""
    last_step = env_last_step()
    global_step = _sync_global_steps.get(optimizer)
    if last_step is None or global_step is None or v1.get_default_graph().finalized:
        return stock
    workers = max(getattr(optimizer, "_total_num_replicas", 0) or 0,
                  getattr(optimizer, "_replicas_to_aggregate", 0) or 0)
    return CountedChiefQueueRunner(stock, global_step, last_step,
                                   optimizer.get_init_tokens_op(num_tokens=workers))


class CountedChiefQueueRunner(v1.train.QueueRunner):
    """A sync chief's queue runner that stops at the last step.

    The stock one runs the sync op (wait for the gradients, apply them, add 1 to global
    step, one token per worker) forever: a script's own loop `until step >= N` then ends
    up to one step per worker past N, since a worker whose run read the step just before
    the update to N runs once more and the chief applies it. This one runs the sync op
    until global step is `last_step`, then puts one more token per worker in the queue
    (`extra_tokens`: `get_init_tokens_op(workers)`), so that each worker's one extra run
    (its gradient is left in the accumulators, not applied) gets its token, reads N and
    its loop ends; then its thread ends. Same `queue`, `enqueue_ops`, close and cancel
    ops as `stock` (`SyncReplicasHook` reads its `enqueue_ops`).
    """

    def __init__(self, stock, global_step, last_step: int, extra_tokens):
        super().__init__(queue=stock.queue, enqueue_ops=stock.enqueue_ops,
                         close_op=stock.close_op, cancel_op=stock.cancel_op,
                         queue_closed_exception_types=stock.queue_closed_exception_types)
        (sync_op,) = stock.enqueue_ops
        with tf.control_dependencies([sync_op]):  # one round trip: sync, then read
            self._synced = tf.identity(global_step)
        self._global_step = tf.identity(global_step)
        self._last_step, self._extra_tokens = last_step, extra_tokens

    def _run(self, sess, enqueue_op, coord=None):
        """The thread's loop (QueueRunner's `_run`, which `create_threads` starts)."""
        try:
            step = sess.run(self._global_step)
            while step < self._last_step and not (coord is not None and coord.should_stop()):
                step = sess.run(self._synced)
            if step >= self._last_step:
                sess.run(self._extra_tokens)
        except self.queue_closed_exception_types:  # the session or the queue closed
            pass
        except Exception as e:  # noqa: BLE001 - as the stock runner: to the coordinator
            if coord is None:
                raise
            coord.request_stop(e)
        finally:
            with self._lock:  # noqa: SLF001 - QueueRunner's own count of live threads
                self._runs_per_session[sess] -= 1


def close_limit(graph, last_step: int) -> int:
    """Sets the limit of every counted step of `graph` to `last_step` (the global step the
    run ends at); call before the graph is finalised. Returns how many steps were set."""
    ops = graph.get_collection(COUNTED_STEPS)
    for op in ops:
        op._set_attr("limit", attr_value_pb2.AttrValue(i=int(last_step)))  # noqa: SLF001
    return len(ops)


class DeferredSyncHook(v1.train.SessionRunHook):
    """`SyncReplicasOptimizer.make_session_run_hook`'s hook, once `install`ed: the stock
    hook (`stock`, whose every call it passes on) until a session replaces it with one
    made from `optimizer`, `is_chief`, `num_tokens` and `global_step` (the variable the
    optimizer's apply was given; None if it was not applied)."""

    def __init__(self, optimizer, is_chief: bool, num_tokens: int, stock):
        self.optimizer, self.is_chief, self.num_tokens = optimizer, is_chief, num_tokens
        self.global_step: Optional[object] = _sync_global_steps.get(optimizer)
        self.stock = stock

    def begin(self):
        return self.stock.begin()

    def after_create_session(self, session, coord):
        return self.stock.after_create_session(session, coord)

    def before_run(self, run_context):
        return self.stock.before_run(run_context)

    def after_run(self, run_context, run_values):
        return self.stock.after_run(run_context, run_values)

    def end(self, session):
        return self.stock.end(session)
