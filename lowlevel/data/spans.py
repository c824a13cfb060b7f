"""Work handed out by span: a queue of the training files held on the first ps task.

`--data_sharding=queue` (`--dataset=criteo_files`, exact mode; in sync training the
steps 2-3 below are `lowlevel.modes.elastic_sync`'s instead). The training files
are the spans (span k is file k of `--train_files`, sorted). Instead of reading a fixed
share, each worker takes its next span from the queue when it has read the last one, so
a worker that dies, joins or leaves changes who reads what, not what is read. The
queue is TensorFlow state on ps 0 (variables under `data_queue/`), reached by every
worker through its session: it survives any worker's death, and it is saved in the same
checkpoint as the model, so a restore after a ps or chief failure resumes the data where
the restored model was.

The state (span k of S; all int64 unless said):

    data_queue/passes            [S]  passes over span k completed (its epochs)
    data_queue/owner (int32)     [S]  FREE (-1), or the worker reading it
    data_queue/offset            [S]  lines of span k's current pass in the model
    data_queue/lease (float64)   [S]  seconds since the Unix epoch of its owner's last step
    data_queue/committed_steps   []   steps whose batch was committed
    data_queue/duplicated_batches []  batches applied although their lines were applied
                                      (see below: 0 unless a worker froze past its lease)
    data_queue/seen (int32)      [L]  with --count_examples: how often each training line
                                      (file by file, in order) is in the model

and, not saved (set up at every session's local init where ps 0 has none):

    data_queue/entered (float64) [MAX_WORKERS]  async: when each worker's step in flight
                                      began (0: none), for the save gate
    data_queue/paused_until (float64) []  async: no step begins before this time
    data_queue/pending           [S]  sync: lines accepted for the step under way
    data_queue/resume_at         [S, 2]  a line of span k and the byte it begins at (the
                                      last batch committed, or accepted in sync: its end),
                                      so a claim resumes an uncompressed file by seeking
                                      instead of reading every line before `offset`
                                      ((0, 0) where unknown: after a ps 0 restart)

The protocol, per worker (`SpanInput`, driven by the training loop):
1. Claim (under one `tf.CriticalSection` on ps 0): the worker's own span in flight (a
   restarted worker resumes it), else, of the spans free or held by a worker that has
   not committed a step for `--span_lease_secs` (taken over), the one with the fewest
   passes; among equals in an order shuffled per pass. The worker reads the file from
   `offset` on. No worker waits at an epoch's end: the next pass of a span may begin
   while another span's pass is in flight. Passes stay close (the fewest go first) but
   not in lockstep: a span held by a slow worker, or waiting for its dead worker's
   restart or lease, falls behind while the others go on. A worker that finds every span held (more
   workers than files) polls every 0.5 s, until the last step is taken.
2. Each step's batch is one span's consecutive lines [first, first + n). Before the step
   reserves its number (`exact.counted_update`), a check on ps 0 requires that the worker
   owns the span and that `first == offset`; otherwise the step fails, nothing is
   applied, and the worker claims again (it resumes where the model is).
3. After the step's update is applied on every ps, the commit adds n to `offset` (if it
   still equals `first`), refreshes the lease, and with `--count_examples` adds 1 to
   `seen` for each line.
4. At the end of its file the worker claims again, naming the finished span: if `offset`
   has reached the lines the worker read, the span's pass is complete (`passes` + 1,
   `offset` 0, free).

What this guarantees: every line's update is in the model exactly once per pass of its
span (`seen` = `passes`, plus 1 before `offset`), across worker kills, restarts, joins and
leaves, and ps or chief restores from a checkpoint (the queue is restored with the
model). What it does not: with several ps tasks, a worker that dies after some ps applied
its step and before the commit leaves that part of the update in, and its lines are read
again: `global_step - committed_steps` (for steps trained from the queue) bounds those
steps. Two workers that both passed the check for the same lines (one frozen past its
lease between its check and its commit, the other taking the span over) apply them
twice: counted in `duplicated_batches`.

Checkpoints are consistent cuts (`SaveHold`). A TF1 checkpoint is written while the
other workers train, each variable read at its own moment (a large `seen` in slices), so
a step applied during the save could be in the saved model, offsets and counts
differently, and a restore apply its lines again (measured before the gate: 12 batches,
benchmarks/NOTES.md). So each async step first passes a gate on ps 0 (`enter`, before
its batch is read: it marks the step as in flight, then reads the pause; refused, the
worker tries again `PAUSE_POLL_SECS` later with nothing read or applied), the commit
clears the mark, and the chief's save pauses the gate and waits until no step that began
is still to commit; in sync, the save pauses the steps' completion
(`lowlevel.modes.elastic_sync`). A step begun over `STEP_STALE_SECS` ago and never
committed is a dead worker's: the save does not wait for it (with several ps tasks its
partial update may be in the model: the case above).
"""

from __future__ import annotations

import gzip
import itertools
import json
import os
import time
from typing import Optional, Sequence

from absl import logging

from lowlevel import events

FREE = -1
SCOPE = "data_queue"
MAX_WORKERS = 1024  # worker (replica) indices the step state has a slot for
PAUSED = "lowlevel data_queue: paused for a checkpoint"  # the gate's refusal
PAUSE_POLL_SECS = 0.01  # a refused worker's wait before it tries its step again
# A step begun this long ago and not committed is taken for a dead worker's: a save
# waits for it no longer (steps take milliseconds to a second here).
STEP_STALE_SECS = 10.0
WAIT_SECS = 0.5  # a worker's poll while every span is in flight elsewhere (workers > spans)
MOVED_ON = "lowlevel data_queue: the span moved on"  # the check's failure message


def count_lines(files: Sequence[str]) -> list[int]:
    """Lines in each of `files` (gzip read decompressed); reads them whole, 1 MiB at a time."""
    counts = []
    for path in files:
        n = 0
        with (gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")) as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                n += block.count(b"\n")
        counts.append(n)
    return counts


def line_counts(files: Sequence[str], cache: Optional[str] = None) -> list[int]:
    """`count_lines(files)`, read from and written to the JSON file `cache` (a path, or
    None): a file whose size and mtime match its entry is not read again, so the workers
    of a job, and a restarted one, count each file once between them at most."""
    known = {}
    if cache and os.path.exists(cache):
        try:
            with open(cache) as f:
                known = json.load(f)
        except (OSError, ValueError):
            known = {}
    counts, changed = [], False
    for path in files:
        stat = os.stat(path)
        entry = known.get(path)
        if not (entry and entry[:2] == [stat.st_size, stat.st_mtime_ns]):
            entry, changed = [stat.st_size, stat.st_mtime_ns, count_lines([path])[0]], True
            known[path] = entry
        counts.append(entry[2])
    if cache and changed:  # best effort: a task that cannot write it counts again
        tmp = f"{cache}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w") as f:
                json.dump(known, f)
            os.replace(tmp, cache)
        except OSError as e:
            logging.warning("data queue: could not keep the line counts in %s: %s", cache, e)
    return counts


class SpanQueue:
    """The queue's state and its ops, built in a worker's graph on `device` (ps 0).

    Args:
      num_spans: S, the training files.
      lease_secs: a span in flight on a worker that has not committed a step for this
        long may be taken over (`--span_lease_secs`).
      seed: the per-pass order's seed (`--seed`).
      line_counts: with `--count_examples`, each file's lines (`count_lines`): `seen` is
        built, one int32 per line.
      sync: for sync training (`lowlevel.modes.elastic_sync`): `pending` [S], the lines of
        each span accepted for the step under way (not saved; a claim resumes after them).
    """

    def __init__(self, num_spans: int, device: str, lease_secs: float, seed: int,
                 line_counts: Optional[Sequence[int]] = None, sync: bool = False):
        import tensorflow as tf
        v1 = tf.compat.v1
        self.num_spans, self.device, self._lease, self._seed = num_spans, device, lease_secs, seed
        with v1.device(device), v1.variable_scope(SCOPE):
            def var(name, value):
                return v1.get_variable(name, initializer=value, trainable=False,
                                       use_resource=True)
            self.passes = var("passes", tf.zeros([num_spans], tf.int64))
            self.owner = var("owner", tf.fill([num_spans], FREE))
            self.offset = var("offset", tf.zeros([num_spans], tf.int64))
            self.lease = var("lease", tf.zeros([num_spans], tf.float64))
            self.committed = var("committed_steps", tf.constant(0, tf.int64))
            self.duplicated = var("duplicated_batches", tf.constant(0, tf.int64))
            self.seen, self.bases = None, None
            if line_counts is not None:
                self.seen = var("seen", tf.zeros([sum(line_counts)], tf.int32))
                starts = [0, *itertools.accumulate(line_counts)][:num_spans]
                self.bases = tf.constant(starts, tf.int64)
            def step_var(name, value):  # not saved; set up by `local_init`
                return v1.get_variable(name, initializer=value, trainable=False,
                                       collections=[], use_resource=True)
            self.pending, self.entered, self.paused_until = None, None, None
            self.resume_at = step_var("resume_at", tf.zeros([num_spans, 2], tf.int64))
            if sync:
                self.pending = step_var("pending", tf.zeros([num_spans], tf.int64))
            else:  # the save gate (`enter`, `hold_for_save`): a consistent cut in async
                self.entered = step_var("entered", tf.zeros([MAX_WORKERS], tf.float64))
                self.paused_until = step_var("paused_until", tf.constant(0.0, tf.float64))
            self.lock = tf.CriticalSection(name="lock", shared_name=f"{SCOPE}_lock")
            self._spans = tf.range(num_spans, dtype=tf.int64)

    def claim(self, worker, finished, finished_lines):
        """Op (on ps 0): int64 [6]: span or -1 (every span in flight elsewhere: wait), its
        first unread line, its passes so far (this pass's epoch), 1 if it was taken
        over from a worker past its lease (else 0), and its `resume_at` (a line, its byte).

        `worker`: int32 scalar; `finished`: int32 span the worker read to its end, or -1;
        `finished_lines`: int64 lines it read of it (the pass completes if `offset` reached
        them).
        """
        import tensorflow as tf
        with tf.compat.v1.device(self.device):
            return self.lock.execute(lambda: self._claim(worker, finished, finished_lines),
                                      name="claim")

    def _claim(self, worker, finished, finished_lines):
        """The claim's body, in the critical section. It writes `offset` and `lease` only at
        the spans it changes (scatters): commits change them outside the lock."""
        import tensorflow as tf
        owner, offset = self.owner.read_value(), self.offset.read_value()
        passes, lease, read = self.passes.read_value(), self.lease.read_value(), offset
        f = tf.maximum(tf.cast(finished, tf.int64), 0)
        done = tf.logical_and(finished >= 0, tf.logical_and(
            tf.equal(owner[f], worker), offset[f] >= finished_lines))
        is_done = tf.logical_and(tf.equal(self._spans, f), done)
        passes = passes + tf.cast(is_done, tf.int64)
        owner = tf.where(is_done, FREE, owner)
        offset = tf.where(is_done, tf.zeros_like(offset), offset)
        now = tf.timestamp()
        expired = tf.logical_and(owner >= 0, now - lease > self._lease)
        # 0: its own; 1: free, or held past the lease (a dead worker's falls behind in
        # passes, so it is next); 3: held by a live worker
        kind = tf.cast(tf.where(tf.equal(owner, worker), 0, tf.where(
            tf.logical_or(tf.equal(owner, FREE), expired), 1, 3)), tf.int64)
        fewest = passes - tf.reduce_min(passes)
        key = (kind * (tf.reduce_max(fewest) + 1) + fewest) * self.num_spans + \
            self._order(passes)
        chosen = tf.argmin(key)
        ok = kind[chosen] < 3
        with tf.control_dependencies([owner, offset, passes, lease]):
            done_64 = tf.cast(done, tf.int64)
            writes = [
                self.owner.assign(tf.where(tf.logical_and(tf.equal(self._spans, chosen), ok),
                                           worker, owner)),
                self.offset.scatter_add(at(f, -read[f] * done_64)),  # to 0 if done
                self.passes.scatter_add(at(f, done_64)),
                self.lease.scatter_update(at(chosen, tf.where(ok, now, lease[chosen])))]
        with tf.control_dependencies(writes):
            # sync: a span resumes after the lines accepted for the step under way
            resume = offset if self.pending is None else offset + self.pending.read_value()
            return tf.concat([tf.stack([
                tf.where(ok, chosen, -1), tf.where(ok, resume[chosen], 0), passes[chosen],
                tf.cast(tf.logical_and(ok, expired[chosen]), tf.int64)]),
                self.resume_at.sparse_read(chosen)], 0)

    def local_init(self):
        """Op for every session's local init: the async save gate's state and `resume_at`
        set where they have none (a fresh ps 0), left alone otherwise (another worker's
        step in flight)."""
        return initialize_missing([v for v in (self.entered, self.paused_until,
                                               self.resume_at) if v is not None])

    def enter(self, worker):
        """Op (on ps 0), async: the step of `worker` (int) may begin; fails with `PAUSED`
        while a checkpoint is written (nothing read or applied: the worker tries again).
        It marks the worker's step as in flight first, then reads the pause, so a save
        that set the pause either sees the mark and waits for the commit, or the step
        sees the pause (Dekker's order; each op on the variables is atomic)."""
        import tensorflow as tf
        with tf.compat.v1.device(self.device):
            mark = self.entered.scatter_update(at(worker, tf.timestamp()))
            with tf.control_dependencies([mark]):
                paused = self.paused_until.read_value() > tf.timestamp()

            def back_off():
                with tf.control_dependencies([self._leave_gate(worker)]):
                    return tf.constant(False)

            ok = tf.cond(paused, back_off, lambda: tf.constant(True))
            return tf.debugging.Assert(ok, [PAUSED])

    def _leave_gate(self, worker):
        import tensorflow as tf
        return self.entered.scatter_update(at(worker, tf.constant(0.0, tf.float64)))

    def gate_ops(self, secs: float):
        """(pause, in flight, resume) ops of `hold_for_save`: the pause ends by itself after
        `secs` (a save's deadline), should the chief die before `resume`; in flight is
        int32 [2]: steps begun within `STEP_STALE_SECS` and not committed, and those begun
        earlier (taken for dead workers')."""
        import tensorflow as tf
        with tf.compat.v1.device(self.device):
            pause = self.paused_until.assign(tf.timestamp() + secs, read_value=False)
            age = tf.timestamp() - self.entered.read_value()
            began = self.entered.read_value() > 0
            in_flight = tf.stack([
                tf.reduce_sum(tf.cast(tf.logical_and(began, age < STEP_STALE_SECS), tf.int32)),
                tf.reduce_sum(tf.cast(tf.logical_and(began, age >= STEP_STALE_SECS),
                                      tf.int32))])
            resume = self.paused_until.assign(0.0, read_value=False)
        return pause, in_flight, resume

    def release(self, worker):
        """Op (on ps 0): int32: how many spans `worker` (int32 scalar) held, now FREE. A
        worker that leaves (stopped by SIGTERM: a resize, a preemption) runs it, so its
        span goes to the next claim at once instead of after `--span_lease_secs`; its
        lines in the model stay counted (`offset` is kept)."""
        import tensorflow as tf
        with tf.compat.v1.device(self.device):
            return self.lock.execute(lambda: self.released(worker), name="release")

    def released(self, worker):
        """`release`'s body, for a caller already in the lock: int32 spans freed."""
        import tensorflow as tf
        owner = self.owner.read_value()
        mine = tf.equal(owner, worker)
        writes = [self.owner.assign(tf.where(mine, FREE, owner))]
        if self.entered is not None:  # no step of its in flight: a save need not wait
            writes.append(self._leave_gate(worker))
        with tf.control_dependencies(writes):
            return tf.reduce_sum(tf.cast(mine, tf.int32))

    def _order(self, passes):
        """int64 [S]: the spans' ranks in a pseudo-random order, anew for each pass (a
        multiplicative hash of (seed, span, pass), ranked)."""
        import tensorflow as tf
        mixed = (self._spans * 2654435761 + (passes + 1) * 40503 + self._seed * 97) % 4294967291
        mixed = (mixed * 2246822519) % 4294967291
        return tf.cast(tf.argsort(tf.argsort(mixed, stable=True), stable=True), tf.int64)

    def check(self, worker, where):
        """Op (on ps 0) that fails with `MOVED_ON` unless `worker` (int32) owns the span of
        `where` (int64 [4]: span, first line, lines, end byte) and the model holds exactly
        its lines before `first`."""
        import tensorflow as tf
        with tf.compat.v1.device(self.device):
            span, first = where[0], where[1]
            owned = tf.logical_and(tf.equal(self.owner.sparse_read(span), worker),
                                   tf.equal(self.offset.sparse_read(span), first))
            return tf.debugging.Assert(owned, [MOVED_ON, "span", span, "line", first])

    def commit(self, where, worker=None):
        """Op (on ps 0): the batch `where` (int64 [4]: span, first line, n lines, the byte
        after them or -1) is in the model (its end becomes the span's `resume_at`);
        `worker`'s (int) step is no longer in flight (the save gate). Build it under
        a control dependency on the step's update. Not under the lock: the check before
        the step keeps two workers from committing the same lines unless one froze between
        its check and its commit past its lease (counted)."""
        import tensorflow as tf
        with tf.compat.v1.device(self.device):
            span, first, n = where[0], where[1], where[2]
            ok = tf.equal(self.offset.sparse_read(span), first)
            with tf.control_dependencies([ok]):
                writes = [
                    self.offset.scatter_add(tf.IndexedSlices(
                        tf.reshape(n * tf.cast(ok, tf.int64), [1]), tf.reshape(span, [1]))),
                    self.lease.scatter_update(tf.IndexedSlices(
                        tf.reshape(tf.timestamp(), [1]), tf.reshape(span, [1]))),
                    self.committed.assign_add(1),
                    self.duplicated.assign_add(1 - tf.cast(ok, tf.int64)),
                    self.resumes_after(where, ok)]
                if self.seen is not None:
                    ids = tf.gather(self.bases, span) + first + tf.range(n)
                    writes.append(self.seen.scatter_add(tf.IndexedSlices(
                        tf.fill([n], tf.cast(ok, tf.int32)), ids)))
            with tf.control_dependencies(writes):
                done = [self._leave_gate(worker)] if self.entered is not None and \
                    worker is not None else []
            with tf.control_dependencies(writes + done):
                return tf.identity(ok)

    def resumes_after(self, where, ok):
        """Op: if `ok` (bool) and the batch `where` (int64 [4]) has an end byte, its end
        (first + n, end) is its span's `resume_at`."""
        import tensorflow as tf
        span = where[0]
        new = tf.logical_and(ok, where[3] >= 0)
        row = tf.where(new, tf.stack([where[1] + where[2], where[3]]),
                       self.resume_at.sparse_read(span))
        return self.resume_at.scatter_update(tf.IndexedSlices(row[None], span[None]))


class SaveHold:
    """The async consistent cut: the chief's saver runs `before` (a callable of the
    session) and `after` (an op) around each save (`checkpoints.StateSaver`). `before`
    pauses the gate, then waits until no step that began is still to commit (polling every
    `PAUSE_POLL_SECS`), so the model, the queue and `seen` are saved as of the same
    steps; `after` lifts the pause. A step begun over `STEP_STALE_SECS` ago is taken for a
    dead worker's and not waited for; a live step still running after that long is not
    either, and the save says it may not be a consistent cut. `secs`: the save's deadline
    (the pause ends by itself after it)."""

    def __init__(self, queue: SpanQueue, secs: float):
        self._pause, self._in_flight, self.after = queue.gate_ops(secs)
        self._stale = 0

    def before(self, sess) -> None:
        sess.run(self._pause)
        deadline = time.monotonic() + STEP_STALE_SECS
        while True:
            fresh, stale = (int(x) for x in sess.run(self._in_flight))
            if fresh == 0:
                break
            if time.monotonic() > deadline:
                logging.warning("checkpoint: %d step(s) still to commit after %.0f s; saving "
                                "without them: this checkpoint may not be a consistent cut",
                                fresh, STEP_STALE_SECS)
                break
            time.sleep(PAUSE_POLL_SECS)
        if stale != self._stale:
            logging.info("checkpoint: %d worker(s) began a step over %.0f s ago and never "
                         "committed it (died mid-step); not waiting for them", stale,
                         STEP_STALE_SECS)
            self._stale = stale


def initialize_missing(variables):
    """Op: each of `variables` (not saved, on a ps) set to its initial value where it has
    none (a fresh ps), left alone where it has one (state another worker is using)."""
    import tensorflow as tf
    # The assign is made in the branch: a branch returning `v.initializer`, an op made
    # outside it, would run it every time (and drop the state every worker's session start
    # found: seen as 60 s stalls in sync, benchmarks/NOTES.md).
    return tf.group(*[tf.cond(v.is_initialized(), tf.no_op, lambda v=v: v.assign(
        v.initial_value, read_value=False)) for v in variables])


def at(index, value):
    """`tf.IndexedSlices` of one scalar `value` at scalar `index` (for a variable's scatter)."""
    import tensorflow as tf
    return tf.IndexedSlices(tf.reshape(value, [1]), tf.reshape(index, [1]))


class SpanInput:
    """A worker's input from the queue: batches of one span's lines, then the next span.

    `get_next()` gives (features, labels) as `ctr_files`' iterators do; the batch's span,
    first line and line count ride along (one int64 [3] to ps 0) for `check` and
    `commit` (`guard`, `commit`).
    The loop calls `advance` when a step ends with `ended` (the span's file is read) or
    `moved_on` (the check refused the batch).
    """

    def __init__(self, queue: SpanQueue, files: Sequence[str], worker: int, dataset_fn):
        """`dataset_fn(files, skip, start)`: the batches (((features, labels), (first, n,
        end))) of string [k] `files` (0 or 1) from line `skip` (int64) on; `start` is
        int64 [3] (line <= skip, the byte it begins at, the file's bytes): where an
        uncompressed file may be read from (`criteo.span_batches`)."""
        import tensorflow as tf
        v1 = tf.compat.v1
        self.queue, self.files, self.worker = queue, list(files), worker
        self._file = v1.placeholder_with_default(tf.zeros([0], tf.string), [None])
        self._skip = v1.placeholder_with_default(tf.constant(0, tf.int64), [])
        self._span = v1.placeholder_with_default(tf.constant(-1, tf.int64), [])
        self._start_at = v1.placeholder_with_default(tf.zeros([3], tf.int64), [3])
        self._sizes = [os.path.getsize(f) for f in self.files]
        self._iterator = v1.data.make_initializable_iterator(
            dataset_fn(self._file, self._skip, self._start_at))
        self.initializer = self._iterator.initializer
        with v1.device(None):
            self._read = v1.get_variable(  # lines of this span read so far (this worker)
                "data_queue_read", initializer=tf.constant(0, tf.int64), trainable=False,
                collections=[v1.GraphKeys.LOCAL_VARIABLES], use_resource=True)
            self._span_var = v1.get_variable(
                "data_queue_span", initializer=tf.constant(-1, tf.int64), trainable=False,
                collections=[v1.GraphKeys.LOCAL_VARIABLES], use_resource=True)
        with tf.control_dependencies([self._iterator.initializer]):
            self._start = tf.group(self._span_var.assign(self._span),
                                   self._read.assign(self._skip))
        self._finished = v1.placeholder(tf.int32, [])
        self._finished_lines = v1.placeholder(tf.int64, [])
        self._claim = queue.claim(tf.constant(worker), self._finished, self._finished_lines)
        self._where = None
        self._current, self._session, self._retries, self._verified_at = -1, None, 0, -1

    def get_next(self):
        """(features, labels) of the next batch (one call per graph). Async: read only
        once the save gate lets the step begin (`SpanQueue.enter`), so a refused step has
        taken nothing from the span."""
        import tensorflow as tf
        gate = [] if self.queue.entered is None else [self.queue.enter(self.worker)]
        with tf.control_dependencies(gate):
            batch, (first, n, end) = self._iterator.get_next()
        self._where = tf.stack([self._span_var.read_value(), first, n, end])  # one transfer
        return batch

    def marked(self):
        """int64 [4]: the batch's (span, first line, lines, end byte), after this worker's
        count of the span's lines read (the claim's `finished_lines`) is updated."""
        import tensorflow as tf
        with tf.control_dependencies([self._read.assign(self._where[1] + self._where[2])]):
            self._where = tf.identity(self._where)  # the commit's too: sent once
        return self._where

    def guard(self):
        """Op: the check before the step reserves its number (after `marked`)."""
        import tensorflow as tf
        self.marked()
        with tf.compat.v1.device(self.queue.device):
            return self.queue.check(tf.constant(self.worker), self._where)

    def commit(self):
        """Op: the commit of this step's batch (build it after the update)."""
        return self.queue.commit(self._where, self.worker)

    @staticmethod
    def ended(error) -> bool:
        """Whether `error` is the end of the span's file (not the last step's `CountUpTo`)."""
        return "End of sequence" in (getattr(error, "message", None) or str(error))

    @staticmethod
    def paused(error) -> bool:
        """Whether `error` is the save gate's: a checkpoint is being written, nothing was
        read or applied; try the step again after `PAUSE_POLL_SECS`."""
        return PAUSED in (getattr(error, "message", None) or str(error))

    @staticmethod
    def moved_on(error) -> bool:
        """Whether `error` is the check's: the batch was refused, nothing applied."""
        return MOVED_ON in (getattr(error, "message", None) or str(error))

    def advance(self, run, session, stopping, retries: int = 0) -> bool:
        """Claims the next span and points the iterator at it; False if `stopping()` while
        waiting for one.

        `run(fetches, feed_dict=None)`: runs on the worker's session, through its fault
        watch and recovery (`loop.StepRunner.fast`). `session`: the raw session the step
        failed on (a new one means the worker's view was reset: nothing it read before
        counts as finished). `retries`: the fault watch's count of runs retried
        (`FaultWatch.retries`); if it moved since the span began, its end may be a
        cancelled read's, so the worker reads on from where it got to (one more pass over
        the lines read, unparsed) and finishes the span only when that ends at once.
        """
        finished, lines = -1, 0
        if session is self._session and self._current >= 0:
            finished, lines = self._current, int(run(self._read))
            if retries != self._retries and lines != self._verified_at:
                self._verified_at, self._retries = lines, retries
                self._point(run, finished, lines)
                return True
        span, skip, epoch, taken_over, *hint = self._claim_next(run, finished, lines, stopping)
        # epoch: the passes over this span before this one
        if span < 0:
            return False
        self._current, self._session, self._retries = span, session, retries
        self._verified_at = -1
        self._point(run, span, skip, hint)
        logging.info("data queue: span %d (%s) from line %d, epoch %d%s", span,
                     self.files[span], skip + 1, epoch, " (taken over: its worker had not "
                     "committed a step for --span_lease_secs)" if taken_over else "")
        events.emit("span_claimed", None, span=span, first_line=skip + 1, epoch=epoch,
                    taken_over=bool(taken_over))
        return True

    def _point(self, run, span: int, skip: int, hint=(0, 0)) -> None:
        """Points the iterator at line `skip` of `span`; `hint` (a line, its byte: the
        queue's `resume_at`) is where reading begins if it is not past `skip`."""
        line, byte = hint if 0 <= hint[0] <= skip and hint[1] >= 0 else (0, 0)
        run(self._start, {self._file: [self.files[span]], self._skip: skip, self._span: span,
                          self._start_at: [line, byte, self._sizes[span]]})

    def _claim_next(self, run, finished: int, lines: int, stopping):
        """(span, first unread line, epoch, taken over, resume line, its byte) claimed;
        span -1 if `stopping()` while waiting."""
        waiting = False
        while True:
            claimed = [int(x) for x in run(self._claim, {
                self._finished: finished, self._finished_lines: lines})]
            finished = -1
            if claimed[0] >= 0 or stopping():
                return claimed
            if not waiting:
                logging.info("data queue: every span is being read by another worker (more "
                             "workers than --train_files); waiting for one")
                waiting = True
            time.sleep(WAIT_SECS)
