"""The training loop of one worker: steps, and in the communication-reduced mode the exchanges.

`training.train` builds the graph (`graph.TrainGraph`) and the session and
calls `run`; `run` returns when the last step is done, the session stops, or
a preemption is requested.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from typing import TYPE_CHECKING, Optional

import tensorflow as tf
from absl import logging

from lowlevel import events
from lowlevel.data import spans
from lowlevel.errors import NoLiveSession, lost_session, step_refused
from lowlevel.modes import local_sgd
from lowlevel.runtime.faults import FaultWatch
from lowlevel.runtime.sessions import live_session

if TYPE_CHECKING:
    from lowlevel.runtime.graph import TrainGraph


class StepRunner:
    """Runs training steps: past the hooks when none is due, through them when one is.

    `MonitoredSession.run` costs Python time on every step (each hook's
    `before_run`/`after_run`, a new fetch handler per call); with every core
    busy that is ~9 % fewer examples/s (1 ps + 2 workers, exact mode,
    benchmarks/NOTES.md). So a step runs as a callable made once on the raw
    session (`Session.make_callable`), unless a hook is `due()` (a progress
    line, a summary, a checkpoint), when it goes through the monitored
    session. A step that fails on the raw session with an error a failed task
    causes is run again through the monitored session, which recovers
    (creates a new session) first.

    The contract with the hooks: a hook that acts in `before_run`/`after_run`
    must have a `due()` method that says when its next run is needed (its
    timer or its step has come); the loop sends a step through the hooks
    only then. A hook without `due()` sees only the steps another hook made
    due: give it one, or it acts rarely and irregularly. Hooks that act only
    in `begin`, `after_create_session` or `end` need none. The runtime's hooks
    fetch the same tensors in every step sent through them and act only when
    due: each distinct set of fetches is a new executor on every task the step
    touches (partitioning, Grappler, the graph's functions instantiated), whose
    first run stalled the chief of a 2 ps + 2 workers dynamic-table job 0.66 s
    (0.16-0.31 s with static tables; benchmarks/NOTES.md, 2026-11-29).

    With a `faults.FaultWatch`, every run has its deadline
    (`--step_timeout_secs`) and a run past it is reported and run again
    (`FaultWatch.run`), up to `--fault_timeout_secs`.

    Raises (from the constructor):
      TypeError: a hook overrides `before_run` or `after_run` without `due()`.
    """

    def __init__(self, sess, g: TrainGraph, watch: Optional[FaultWatch] = None):
        self._sess = sess
        self._g = g
        self._watch = watch
        undue = [type(h).__name__ for h in g.hooks if _acts_per_step(h) and not hasattr(h, "due")]
        if undue:
            raise TypeError(f"{', '.join(undue)}: acts in before_run/after_run but has no due(); "
                            "the loop would run it only when another hook is due")
        self._due = [h.due for h in g.hooks if hasattr(h, "due")]
        self._raw = None
        self._calls: dict = {}

    def due(self) -> bool:
        """Whether a hook wants the next step run through it."""
        return any(due() for due in self._due)

    def __call__(self, fetch, steps: int = 1):
        """Runs `fetch`, `steps` training steps in one run; returns its value.

        One step goes through the hooks when one is due; a block of steps
        (`steps` > 1, `local_sgd.local_block`) never does: the hooks fetch the
        single step's tensors.
        """
        state, start = self._g.steps, time.time()
        t0 = time.perf_counter()
        if steps == 1 and self.due():
            state.in_step = True
            try:
                value = self.hooked(fetch)
            finally:
                state.in_step = False
        else:
            value = self.fast(fetch)
        self._g.progress.record(start, time.perf_counter() - t0, steps)
        return value

    @property
    def steps_value(self) -> int:
        """The global step as the loop last saw it."""
        return self._g.steps.value

    def _watched(self, run, what: str):
        if self._watch is None:
            return run(None)
        return self._watch.run(run, what, self._g.steps.value)

    def hooked(self, fetch, what: str = "step"):
        """Runs `fetch` through the monitored session (and so its hooks), with the deadline."""
        return self._watched(lambda options: self._sess.run(fetch, options=options), what)

    def fast(self, fetch, what: str = "step", feed_dict: Optional[dict] = None):
        """Runs `fetch` on the raw session (the monitored one after a failure); no hook sees it."""
        if feed_dict:
            return self._watched(lambda options: self._fed_once(fetch, feed_dict, options), what)
        return self._watched(lambda options: self._fast_once(fetch, options), what)

    def _fed_once(self, fetch, feed_dict: dict, options):
        raw = live_session(self._sess)
        try:
            if raw is not None:
                return raw.run(fetch, feed_dict, options=options)
        except Exception as e:  # noqa: BLE001 - narrowed by `lost_session`
            if not lost_session(e):
                raise
        return self._sess.run(fetch, feed_dict=feed_dict, options=options)

    def _fast_once(self, fetch, options):
        raw = live_session(self._sess)
        if raw is None:
            return self._sess.run(fetch, options=options)
        if raw is not self._raw:  # a new session, after a failure
            self._raw, self._calls = raw, {}
        if fetch not in self._calls:
            self._calls[fetch] = raw.make_callable(fetch, accept_options=True)
        try:
            return self._calls[fetch](options=options)
        except Exception as e:  # noqa: BLE001 - narrowed by `lost_session`
            if not lost_session(e):
                raise
            return self._sess.run(fetch, options=options)


def _acts_per_step(hook) -> bool:
    base = tf.compat.v1.train.SessionRunHook
    return (type(hook).before_run is not base.before_run or
            type(hook).after_run is not base.after_run)


def run(sess, g: TrainGraph, last_step: int, stop: threading.Event,
        watch: Optional[FaultWatch] = None) -> None:
    """Runs training steps until `last_step` is reached, the session stops, or `stop` is set.

    Exact mode: each run is one step and returns its step number; a worker
    whose step finds no step left gets `OutOfRangeError` (`counted_update`).
    Communication-reduced mode: blocks of local steps, each claimed first; an
    empty block ends the loop (`_local_sgd_loop`). With `watch`, every run has
    its deadline and a bounded retry (`faults.FaultWatch`).

    Raises:
      errors.NetworkFault: peers did not answer for `--fault_timeout_secs`.
    """
    step = StepRunner(sess, g, watch)
    try:
        if g.local_ops is not None:
            return _local_sgd_loop(sess, g, step, stop, watch)
        while not sess.should_stop() and not stop.is_set():
            try:
                g.steps.value = int(step(g.train_op))
            except Exception as e:  # noqa: BLE001 - narrowed by `step_refused`
                if not step_refused(e):
                    raise
                if not _next_span(sess, g, step, e, stop, watch, last_step):
                    return  # another worker took the last step
                continue
            if g.steps.value >= last_step:
                return
    finally:
        if watch is not None:  # a session lost from now on: its outage begins when noticed
            watch.stopped()


def _next_span(sess, g: TrainGraph, step: StepRunner, error, stop: threading.Event,
               watch: Optional[FaultWatch], last_step: int) -> bool:
    """After a step failed with `error`: with the data queue, waits if a checkpoint
    paused the steps, claims the next span if the span's file was read or its batch
    refused (`spans.SpanInput`), and returns whether the loop goes on. `OutOfRangeError` of the last step: False. Any other error: raised.

    A worker that waits for a span (more workers than files) stops waiting when the
    run is stopped or the other workers have taken the last step."""
    span = g.span_input
    if span is not None and span.paused(error):  # a checkpoint is being written
        time.sleep(spans.PAUSE_POLL_SECS)
        return not stop.is_set()
    if span is not None and (span.ended(error) or span.moved_on(error)):
        if span.moved_on(error):
            logging.info("data queue: batch refused (its span moved on); claiming again")

        def stopping() -> bool:
            return stop.is_set() or int(step.fast(g.global_step, "claim")) >= last_step

        return span.advance(lambda fetch, feed=None: step.fast(fetch, "claim", feed),
                            live_session(sess), stopping,
                            watch.retries if watch is not None else 0)
    if isinstance(error, tf.errors.OutOfRangeError):
        return False
    raise error


def _send(sess, op, options=None):
    """Runs `op` on the live session (in the exchange thread); NoLiveSession if there is none."""
    raw = live_session(sess)
    if raw is None:
        raise NoLiveSession("no live session")
    return raw.run(op, options=options)


def _local_sgd_loop(sess, g: TrainGraph, step: StepRunner, stop: threading.Event,
                    watch: Optional[FaultWatch] = None) -> None:
    """Blocks of local steps; between blocks, the exchange with the ps.

    Async: while a block trains, one run in a background thread (on the raw
    session) pushes the previous block's delta and pulls the model (`send`),
    and claims the next block (`exchange.claim`, so the next block can start at
    once: a claim waits a round trip, ~2 ms a block on loopback); it is folded in
    (`merge`) at the next boundary. The last exchange is waited for, so a
    worker has pushed everything before it reports done; so is the block a
    preemption interrupts (the block claimed meanwhile is left untrained: a
    preempted worker's last two claims may count up to 2K steps it did not
    take). Sync: `exchange` waits for the round's average.
    """
    ops = g.local_ops
    if ops.send is None:  # sync: model averaging, one blocking exchange per round
        next_round = ops.claim
        while not sess.should_stop() and not stop.is_set():
            start, left = (int(x) for x in step.hooked(next_round, "exchange"))
            next_round, g.steps.value = ops.exchange, start
            if left == 0:
                return
            _local_steps(step, g, left)
        return
    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="exchange")
    options = watch.options if watch else None
    trained = False
    running = lambda: not sess.should_stop() and not stop.is_set()  # noqa: E731
    claimed = step.fast(ops.claim, "claim") if running() else None
    try:
        while claimed is not None:
            start, left = (int(x) for x in claimed)
            g.steps.value = start
            if left == 0:
                break
            more = running()
            fetches = ([ops.send] if trained else []) + ([ops.claim] if more else [])
            pending = pool.submit(_send, sess, fetches, options) if fetches else None
            _local_steps(step, g, left, stop)
            claimed = _finish(step, ops, pending, trained, watch) if pending else None
            trained = True
            if claimed is _FAILED:
                claimed = step.fast(ops.claim, "claim") if more and running() else None
            elif not more:
                claimed = None
        if trained:  # the last block's (or the preempted block's) steps
            _finish(step, ops, pool.submit(_send, sess, [ops.send], options), True, watch)
    finally:
        pool.shutdown(wait=False)


def _local_steps(step: StepRunner, g: TrainGraph, n: int,
                 stop: Optional[threading.Event] = None) -> None:
    """Runs `n` local steps (fewer if `stop` is set): a block per run where one fits and
    no hook is due (`LocalSGDOps.block`), else one step per run."""
    ops = g.local_ops
    while n > 0 and not (stop and stop.is_set()):
        k = ops.block_steps if ops.block is not None and n >= ops.block_steps else 1
        if k > 1 and step.due():
            k = 1
        step(ops.block if k > 1 else ops.local_step, k)
        g.steps.value += k
        n -= k


_FAILED = object()  # what `_finish` returns after a failed exchange


def _finish(step: StepRunner, ops: local_sgd.LocalSGDOps, pending, sent: bool,
            watch: Optional[FaultWatch] = None):
    """Waits for a background run; merges its exchange (if `sent`); returns its last fetch.

    A failed run (a peer lost, or silent past the deadline) takes the ps
    model afresh (`resync`) and returns `_FAILED`: its delta, and the block
    it may have claimed, are lost.
    """
    try:
        values = pending.result()
    except tf.errors.DeadlineExceededError as e:  # a peer stopped answering mid-exchange
        if watch is None:
            raise
        watch.timed_out("exchange", e, step.steps_value)
        step.hooked(ops.resync, "exchange")  # bounded by the watch
        return _FAILED
    except Exception as e:  # noqa: BLE001 - narrowed by `lost_session`
        if not lost_session(e):
            raise
        message = getattr(e, "message", None) or str(e)
        logging.info("exchange with the ps failed (%s); taking the ps model afresh", message)
        events.emit("fault_noticed", None, error=f"exchange failed: {message}")
        step.hooked(ops.resync, "exchange")  # monitored: it recovers first if need be
        return _FAILED
    if sent:
        step.fast(ops.merge, "exchange")
    return values[-1]
