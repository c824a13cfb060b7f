"""Sync training from the data queue, aggregating over the workers that are alive.

`--sync` with the data queue (`lowlevel.data.spans`). `SyncReplicasOptimizer` cannot keep
the queue exact: a worker's gradient can be dropped as stale after its batch was noted,
or applied after its worker died before noting it, and it waits for a fixed number of
gradients, so a worker that leaves stalls every step. Here a step's gradients and its
batches are accepted together and applied together, each under the queue's lock on
ps 0 (one `tf.CriticalSection`), and the number of gradients a step aggregates follows
the live workers.

The protocol, per worker step:
1. The worker reads global_step (its step s) before any parameter: a gradient it pushes
   for s was computed on the parameters of step s.
2. Push, in the lock. Accepted iff global_step is still s (< `last_step`), the worker
   owns its batch's span and the batch begins where the model and the batches already
   accepted for step s end (`offset + pending`). Accepted: the gradients go into the
   step's accumulators (TensorFlow's `ConditionalAccumulator`, sparse for embedding rows,
   as in `SyncReplicasOptimizer`), the batch into `pending`, and the worker's heartbeat
   is refreshed. Refused because s is over: `spans.MOVED_ON`; the worker claims again
   and reads on from where the model is (its lines are not in the model).
3. Completion, in the same lock: by the push that brings the accepted count to the
   required count, or, once a worker has left, by the completion op (`completion`: the
   lock, the count checked again) that a worker runs after its heartbeat tick (`tick`,
   every `TICK_SECS`), after its leave and after a save's pause. Required: the live
   workers (a heartbeat within `live_secs`, from
   every worker's tick thread and push; a worker process that starts, before its graph,
   ends the heartbeat a dead process of its index left: `end_lease`), clipped to
   [`floor`, `cap`] (`--min_replicas`, `--replicas_to_aggregate` or the declared
   workers). The mean of the accepted gradients is applied, `pending` is added to the
   queue's `offset` (and to `seen`), global_step + 1, and one token per accepted push
   goes into the token queue (`sync_token_q`, which the end-of-training protocol
   closes).
4. An accepted worker waits in its step for a token (`_wait`) that is for its push:
   every token carries the generation (`resets`: the restores since ps 0 started) and
   the step it ends, and a push waits for one later than its own (generation, step).
   A token nobody took (its worker died waiting, or a restore woke a worker that had
   died) is later than no push made after it, and is dropped by the next worker that
   takes it. The step's result is the global step after it.

What this guarantees: a batch is in the model iff it was accepted and its step
completed, and the commit is in the same critical section as the update: every line
is in the model exactly once per pass across worker kills, joins and leaves. A ps or
chief restore rewinds model and queue together; the step under way is dropped
(`StepStateReset`: the accepted count and `pending` go back to 0, the accumulators
are emptied, and the workers it had accepted are woken to push again). A
completion cut short by a ps's death between the update and the commit is rewound
by that restore; one cancelled by a run's deadline in that window
(none seen) would leave its lines to be read again.

Why a token must be for its push: before tokens carried their step, any token woke any
waiting worker. A token left over (a restore woke `accepted` workers whose processes
had died with ps 1's kill) let a worker return at once and push again for the same step,
its second gradient filling the count a slower live worker's push was needed for; the
step completed without it, its push arrived stale and was refused, and the leftover
token survived each step (a step gave one token per push, one more than it had
waiters). Seen with Grappler off: the chief refused 778 times in a row, training
nothing (benchmarks/NOTES.md, twenty-third and twenty-fifth stops).
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Optional

import tensorflow as tf
from absl import logging
from tensorflow.python.training.saving import saveable_object

from lowlevel import errors
from lowlevel.data import spans

v1 = tf.compat.v1

SCOPE = "sync_queue"
NEVER_STALE = 1 << 62  # the accumulators' local_step: the lock, not they, decides staleness
MAX_ENTRIES = 4096  # pushes one step may accept (a bound: one a live worker, see 4.)
MAX_WORKERS = spans.MAX_WORKERS  # worker (replica) indices with a heartbeat
TICK_SECS = 1.0  # a worker's heartbeat, and its check for a step whose workers left
GENERATION = 1 << 40  # a token's and a push's key: generation * GENERATION + global step
BEAT = "beat"  # the heartbeats' variable in `SCOPE`: float64 [MAX_WORKERS], Unix seconds


@dataclasses.dataclass(frozen=True)
class InTurn:
    """An op, then the step's completion (`ElasticSync.completion`), in two runs: called with
    a session (and `tf.compat.v1.RunOptions`), returns the first op's value."""

    op: object
    completion: object

    def __call__(self, session, options=None):
        value = session.run(self.op, options=options)
        session.run(self.completion, options=options)
        return value


class ElasticSync:
    """The sync step's ops on ps 0 (`push`, `tick`, `leave`, `pause`) for one worker.

    Args:
      span_input: the worker's input from the data queue (`spans.SpanInput`; its queue
        built with `sync=True`, which gives it `pending`).
      opt: the optimizer whose `apply_gradients` applies each step's mean.
      grads_and_vars: this worker's [(gradient, variable)]; IndexedSlices for rows.
      global_step: int64 resource variable on ps 0 (the queue's device).
      local_step: int64 scalar, global_step read before every parameter (step 1).
      last_step: `--train_steps`.
      cap, floor: the most and fewest gradients a step aggregates (cap None: no bound
        but the live workers).
      live_secs: a worker without a heartbeat for this long has left (`--sync_live_secs`).
      worker: this worker's replica index (int, < `MAX_WORKERS`).
    """

    def __init__(self, span_input, opt, grads_and_vars, global_step, local_step, last_step: int,
                 cap: Optional[int], floor: int, live_secs: float, worker: int):
        if worker >= MAX_WORKERS:
            raise errors.UsageError(f"--sync with the data queue: worker {worker}: at most "
                                    f"{MAX_WORKERS} workers")
        queue = span_input.queue
        self.queue, self._input = queue, span_input
        self._opt, self._gs, self._local = opt, global_step, local_step
        self._last, self._cap, self._floor = last_step, cap or MAX_WORKERS, floor
        self._live_secs, self.worker = live_secs, worker
        self._pairs = list(grads_and_vars)
        with v1.device(queue.device), v1.variable_scope(SCOPE):
            def step_var(name, value):  # not saved: `StepStateReset` zeroes them on restore
                return v1.get_variable(name, initializer=value, trainable=False,
                                       collections=[], use_resource=True)
            self.accepted = step_var("accepted", tf.constant(0, tf.int64))
            self.beat = step_var(BEAT, tf.zeros([MAX_WORKERS], tf.float64))
            # seconds since the Unix epoch until which no step completes (a save's cut)
            self.paused_until = step_var("paused_until", tf.constant(0.0, tf.float64))
            # restores since ps 0 started (not saved, not reset: a token's generation)
            self.resets = step_var("resets", tf.constant(0, tf.int64))
            self.aggregated = v1.get_variable(  # saved: gradients applied, all steps
                "aggregated", initializer=tf.constant(0, tf.int64), trainable=False,
                use_resource=True)
            self.tokens = v1.FIFOQueue(-1, tf.int64, shapes=(), shared_name="sync_token_q",
                                       name="tokens")
            # the mutex of the queue's lock (`spans.SpanQueue.lock`), by its shared name
            self._mutex = tf.raw_ops.MutexV2(shared_name=f"{spans.SCOPE}_lock")
        self._state = [self.accepted, self.beat, self.paused_until, queue.pending,
                       queue.resume_at]
        self._accumulators = [_accumulator(g, v) for g, v in self._pairs]
        self._completion = None

    def push(self):
        """The worker's train op: int64 scalar, the global step after its step (blocks until
        the step completes). Fails with `spans.MOVED_ON` if the push was refused."""
        where = self._input.marked()
        status = self._locked_push(where)
        with v1.device(self.queue.device):
            accepted, now, key = status[0] > 0, status[1], status[2]
            ended = now >= self._last
            check = tf.debugging.Assert(tf.logical_or(accepted, ended),
                                        [spans.MOVED_ON, "stale or moved-on batch", where])
            with tf.control_dependencies([check]):
                return tf.cond(accepted, lambda: self._wait(key), lambda: tf.identity(now))

    def _locked_push(self, where):
        """`_push` holding the queue's lock, its arguments first copied to the ps tasks.

        `tf.CriticalSection.execute`'s protocol (lock after the arguments are computed,
        the call, release after its outputs) written out, as `DynamicShard._locked` does:
        `execute` would make the lock wait on a group of the arguments' ops on the
        worker, one more tensor crossing to ps 0 per gradient. Here each gradient is
        copied to its variable's ps and the lock waits on one group per ps. The lock
        still waits for every gradient: holding it while one is computed would stall the
        other workers' pushes behind this worker's backward pass."""
        with v1.colocate_with(None, ignore_existing=True):
            pairs, groups = [], {}
            for g, v in self._pairs:
                with v1.device(v.device):
                    copy = (tf.identity(g) if isinstance(g, tf.Tensor) else tf.IndexedSlices(
                        tf.identity(g.values), tf.identity(g.indices), g.dense_shape))
                    groups.setdefault(v.device, []).extend(
                        tf.nest.flatten(copy, expand_composites=True))
                pairs.append((copy, v))
            with v1.device(self.queue.device):
                where = tf.identity(where)
                arrived = [where]
                for device, tensors in groups.items():
                    with v1.device(device):
                        arrived.append(tf.group(*tensors))
                with tf.control_dependencies(arrived):
                    lock = tf.raw_ops.MutexLock(mutex=self._mutex)
                with tf.control_dependencies([lock]):
                    status = self._push(where, pairs)
                with tf.control_dependencies([status]):
                    released = tf.raw_ops.ConsumeMutexLock(mutex_lock=lock)
                with tf.control_dependencies([released]):
                    return tf.identity(status)

    def _push(self, where, pairs):
        """In the lock: [accepted (0/1), global_step, the push's key (generation,
        global_step: `GENERATION`)]. `pairs`: (gradient, variable), each gradient on its
        variable's ps."""
        q, n = self.queue, where[2]
        span, first = where[0], where[1]
        step = self._gs.read_value()
        owns = tf.logical_and(tf.equal(q.owner.sparse_read(span), self.worker), tf.equal(
            q.offset.sparse_read(span) + q.pending.sparse_read(span), first))
        ok = tf.logical_and(tf.logical_and(owns, tf.equal(step, self._local)),
                            tf.logical_and(step < self._last,
                                           self.accepted.read_value() < MAX_ENTRIES))
        ok64 = tf.cast(ok, tf.int64)
        # A refused gradient is applied with local_step -1: below every accumulator's
        # step, dropped (the accumulators count only accepted ones).
        local = tf.where(ok, tf.constant(NEVER_STALE, tf.int64), -1)
        applies = [acc.apply_grad(g, local) if isinstance(g, tf.Tensor) else
                   acc.apply_indexed_slices_grad(g, local)
                   for acc, (g, _) in zip(self._accumulators, pairs)]
        now = tf.timestamp()
        with tf.control_dependencies(applies):
            writes = [q.pending.scatter_add(spans.at(span, n * ok64)),
                      q.resumes_after(where, ok),
                      self.accepted.assign_add(ok64),
                      self.beat.scatter_update(spans.at(self.worker, now)),
                      q.lease.scatter_update(spans.at(span, tf.where(
                          ok, now, q.lease.sparse_read(span))))]
        with tf.control_dependencies(writes):
            done = self._complete_if_ready()
        with tf.control_dependencies([done]):
            return tf.stack([ok64, step, self.resets.read_value() * GENERATION + step])

    def _wait(self, key):
        """int64: the global step once this worker has a token later than its push's `key`:
        its step's completion, or a restore after the push (which dropped it). An earlier
        token is one nobody took: dropped, and the worker takes the next."""
        token, = tf.while_loop(lambda t: t <= key, lambda t: [self.tokens.dequeue()],
                               [self.tokens.dequeue()], parallel_iterations=1)
        with tf.control_dependencies([token]):
            return tf.maximum(token % GENERATION, self._gs.read_value())

    def completion(self):
        """Op: in the queue's lock, completes the step under way if it has the gradients the
        live workers require (a bool). One op for every caller but the push (a heartbeat, a
        leave, a save's resume: `InTurn`), built once: each copy of the completion is an
        apply of the whole model's optimizer inside a `tf.cond`, ~10 % of a sync worker's
        graph build per copy for wide_deep, paid at every restart and join
        (benchmarks/NOTES.md, twenty-seventh stop). Build it before the graph is
        finalized."""
        if self._completion is None:  # whatever the first caller's context
            with tf.control_dependencies(None), v1.colocate_with(None, ignore_existing=True), \
                    v1.device(self.queue.device):
                self._completion = self.queue.lock.execute(self._complete_if_ready,
                                                           name="sync_complete")
        return self._completion

    def tick(self) -> InTurn:
        """This worker's heartbeat, then the completion of a step that has what the live
        workers require (its other workers left): int64, global_step at the heartbeat."""
        def beat():
            with tf.control_dependencies([self.beat.scatter_update(spans.at(
                    self.worker, tf.timestamp()))]):
                return self._gs.read_value()

        with v1.device(self.queue.device):
            return InTurn(self.queue.lock.execute(beat, name="sync_tick"), self.completion())

    def leave(self) -> InTurn:
        """This worker leaves (stopped by SIGTERM): its span freed (`SpanQueue.released`),
        its heartbeat cleared, so the step under way requires one gradient fewer at once,
        not after `--sync_live_secs`; then the step completes if what it has is now
        enough. int32: spans freed."""
        def leave():
            freed = self.queue.released(self.worker)
            with tf.control_dependencies([freed, self.beat.scatter_update(spans.at(
                    self.worker, tf.constant(0.0, tf.float64)))]):
                return tf.identity(freed)

        with v1.device(self.queue.device):
            return InTurn(self.queue.lock.execute(leave, name="sync_leave"), self.completion())

    def _complete_if_ready(self):
        """In the lock: completes the step if it has the gradients the live workers require."""
        live = tf.reduce_sum(tf.cast(self.beat.read_value() > tf.timestamp() - self._live_secs,
                                     tf.int64))
        required = tf.clip_by_value(live, self._floor, max(self._cap, self._floor))
        count = self.accepted.read_value()
        ready = tf.logical_and(tf.logical_and(count >= required, count > 0),
                               tf.timestamp() >= self.paused_until.read_value())
        return tf.cond(ready, lambda: self._complete(count), lambda: tf.constant(False))

    def _complete(self, count):
        """The step's mean applied, its batches committed, global_step + 1, `count` tokens."""
        q = self.queue
        mean = [(_take(acc, g, v), v) for acc, (g, v) in zip(self._accumulators, self._pairs)]
        update = self._opt.apply_gradients(mean)
        with tf.control_dependencies([update]):
            pending, offset = q.pending.read_value(), q.offset.read_value()
        with tf.control_dependencies([pending, offset]):
            writes = [q.offset.assign_add(pending), q.committed.assign_add(1),
                      self.aggregated.assign_add(count)]
            if q.seen is not None:
                writes.append(_count_seen(q, offset, pending))
        with tf.control_dependencies(writes):
            bumped = self._gs.assign_add(1, read_value=False)
        with tf.control_dependencies([bumped]):
            step = self._gs.read_value()
            tokens = self.resets.read_value() * GENERATION + step
            reset = [q.pending.assign(tf.zeros_like(pending)), self.accepted.assign(0),
                     self.tokens.enqueue_many([tf.fill([count], tokens)])]
        with tf.control_dependencies(reset):
            return tf.constant(True)

    def pause(self, secs: float):
        """(pause op, resume `InTurn`) for a checkpoint save: between them no step
        completes, so the model, the queue and `seen` are saved as of one step (pushes are
        still accepted; the step under way is not saved). The pause ends by itself after
        `secs` (a save's deadline), should its saver die before `resume`; `resume` then
        completes a step that became ready meanwhile."""
        with v1.device(self.queue.device):
            def set_pause():
                return self.paused_until.assign(tf.timestamp() + secs, read_value=False)

            def unpause():
                return self.paused_until.assign(0.0, read_value=False)

            return (self.queue.lock.execute(set_pause, name="sync_pause"),
                    InTurn(self.queue.lock.execute(unpause, name="sync_resume"),
                           self.completion()))

    def local_init(self):
        """Op for every session's local init: the step state's initial values where they
        have none (a fresh ps 0); an initialised state is left alone (a step under way)."""
        return spans.initialize_missing([*self._state, self.resets])

    def reset(self):
        """Op: the step under way dropped (the restore's; see `StepStateReset`), in the
        lock; the workers whose pushes it had accepted get tokens of the next generation,
        and push again."""
        with v1.device(self.queue.device):
            return self.queue.lock.execute(self._reset, name="sync_reset")

    def _reset(self):
        drains = [tf.cond(acc.num_accumulated() > 0, lambda acc=acc, g=g, v=v: tf.group(
            tf.nest.flatten(_take(acc, g, v), expand_composites=True)), tf.no_op)
            for acc, (g, v) in zip(self._accumulators, self._pairs)]
        with v1.device(self.queue.device):
            # a fresh ps 0 (state not yet initialized) has no step under way and no waiter
            fresh = tf.logical_not(tf.logical_and(self.accepted.is_initialized(),
                                                  self.resets.is_initialized()))
            waiting, generation = tf.cond(fresh, lambda: (tf.constant(0, tf.int64),) * 2,
                                          lambda: (self.accepted.read_value(),
                                                   self.resets.assign_add(1)))
            # the tokens' step is 0 (`_wait` returns the global step): a restore may be
            # writing global_step in the same run, so it is not read here
            wake = self.tokens.enqueue_many([tf.fill([waiting], generation * GENERATION)])
        # Assigns made here, after the reads: a control dependency on the variables' own
        # `initializer`s (made with them) would not order them, and an initializer that
        # ran before the read woke nobody (seen: 0 tokens for an accepted push).
        with tf.control_dependencies([wake, *drains]):
            return tf.group(*[v.assign(v.initial_value, read_value=False)
                              for v in self._state])


def _accumulator(g, v):
    """The accumulator of variable `v`'s gradients (`g` a Tensor or IndexedSlices), on its ps."""
    with v1.device(v.device):
        name = v.op.name.replace("/", "_") + "_sync_accumulator"
        if isinstance(g, tf.IndexedSlices):
            return v1.SparseConditionalAccumulator(g.dtype, shape=v.shape, shared_name=name,
                                                   name=name)
        return v1.ConditionalAccumulator(g.dtype, shape=v.shape, shared_name=name, name=name)


def _take(acc, g, v):
    """The mean of what `acc` holds (it holds at least one). In a `tf.cond` branch: a
    sparse accumulator's handle is a reference, which a branch cannot take from outside,
    so the branch makes its own handle to the same accumulator (its shared name)."""
    if isinstance(g, tf.Tensor):
        return acc.take_grad(1)
    return _accumulator(g, v).take_indexed_slices_grad(1)


def _count_seen(q, offset, pending):
    """Op: +1 in `seen` for each line of `pending` (lines after `offset` per span)."""
    starts = q.bases + offset
    ids = tf.ragged.range(starts, starts + pending).flat_values
    return q.seen.scatter_add(tf.IndexedSlices(tf.ones_like(ids, tf.int32), ids))


def end_lease(target: str, worker: int, device: str, own_device: str,
              timeout_secs: float = 5.0, session_config=None) -> bool:
    """Ends worker `worker`'s heartbeat on ps 0 (`device`) at once, from a graph of its own:
    what a worker process does as it starts, before its training graph and session.

    A worker SIGKILLed and restarted quickly (the launcher's `--max_restarts`, a container
    restarted in its pod) left a heartbeat that stays live for `--sync_live_secs` (10 s):
    until the new process's first push, every step under way waited for it (7-11 s in the
    churn benchmark with per-task CPU limits: benchmarks/NOTES.md, twenty-second stop).
    Ended here, the others train on without it from their next tick (`TICK_SECS`), and
    the new process counts again from its first push or tick. A worker that is not a
    restart (the job's first start, a join) has no live heartbeat, and this changes
    nothing; a live process of the same index (not dead after all) beats again within a
    tick. Each step is still aggregated from the gradients the lock accepted for it.

    Args:
      target: this worker's server (`grpc://...`).
      worker: its replica index.
      device, own_device: ps 0 ("/job:ps/task:0") and this worker, the session's only
        peers (`device_filters`).
      timeout_secs: the run's deadline.
      session_config: the worker's `ConfigProto` (on a sparseCluster it carries the
        `cluster_def` its sessions need); its device filters are narrowed to the two.
    Returns:
      True if the heartbeat was ended; False where there is none to end (no such
      variable on ps 0 yet: a fresh job, or another mode) or ps 0 did not answer in time.
    """
    graph = tf.Graph()
    with graph.as_default(), tf.device(device):
        handle = tf.raw_ops.VarHandleOp(dtype=tf.float64, shape=[MAX_WORKERS],
                                        shared_name=f"{SCOPE}/{BEAT}")
        end = tf.raw_ops.ResourceScatterUpdate(
            resource=handle, indices=tf.constant([worker], tf.int32),
            updates=tf.zeros([1], tf.float64))
    config = v1.ConfigProto()
    if session_config is not None:
        config.CopyFrom(session_config)
    config.device_filters[:] = [device, own_device]
    config.operation_timeout_in_ms = int(timeout_secs * 1000)
    try:
        with v1.Session(target, graph=graph, config=config) as sess:
            sess.run(end, options=v1.RunOptions(timeout_in_ms=int(timeout_secs * 1000)))
    except tf.errors.NotFoundError:  # no heartbeats on ps 0: a fresh job, no sync queue
        return False
    except tf.errors.OpError as e:
        logging.info("sync: could not end worker %d's earlier heartbeat (%s); the others "
                     "wait for this process's first push, at most --sync_live_secs", worker,
                     str(e).splitlines()[0])
        return False
    logging.info("sync: worker %d's earlier heartbeat ended (a restarted worker: the others "
                 "train on without it until its first push)", worker)
    return True


class StepStateReset(saveable_object.SaveableObject):
    """A checkpoint entry (`sync_queue/step_state`, one int64 0) whose restore drops the step
    under way (`ElasticSync.reset`): a restored model and queue start a step afresh."""

    def __init__(self, sync: ElasticSync):
        with v1.device(sync.queue.device):
            zero = tf.constant(0, tf.int64, name="sync_step_state")
        name = f"{SCOPE}/step_state"
        super().__init__(zero, [saveable_object.SaveSpec(zero, "", name)], name)
        self._reset = sync.reset

    def restore(self, restored_tensors, restored_shapes):
        return self._reset()


class TickHook(v1.train.SessionRunHook):
    """Runs `ElasticSync.tick` every `TICK_SECS` in a thread, for each session (a
    recovered session gets a new thread). A failed tick is left to the training loop's
    fault handling: the thread logs it once and goes on."""

    def __init__(self, sync: ElasticSync):
        self._sync, self._stop = sync, threading.Event()
        self._op, self._thread = None, None

    def begin(self):
        self._op = self._sync.tick()

    def after_create_session(self, session, coord):
        self._stop.set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, args=(session, self._stop),
                                        daemon=True, name="sync_queue_tick")
        self._thread.start()

    def _loop(self, session, stop):
        logged = False
        options = v1.RunOptions(timeout_in_ms=int(TICK_SECS * 10_000))
        while not stop.wait(TICK_SECS):
            try:
                self._op(session, options)
            except Exception as e:  # noqa: BLE001 - any failure: the loop's faults handle it
                if not logged:
                    logging.info("sync heartbeat: %s (the training loop handles faults)",
                                 str(e).splitlines()[0])
                    logged = True
                if errors.run_cancelled(e):
                    return

    def end(self, session):
        self._stop.set()
        if self._thread is not None:  # no heartbeat after this (a leave clears it)
            self._thread.join(TICK_SECS * 10)
