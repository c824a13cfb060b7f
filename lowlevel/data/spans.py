"""Work handed out by span: a queue of the training files held on the first ps task.

`--data_sharding=queue` (`--dataset=criteo_files`, async exact mode). The training files
are the spans (span k is file k of `--train_files`, sorted). Instead of reading a fixed
share, each worker takes its next span from the queue when it has read the last one, so
a worker that dies, joins or leaves changes who reads what, not what is read. The
queue is TensorFlow state on ps 0 (variables under `data_queue/`, changed under one
`tf.CriticalSection`), reached by every worker through its session: it survives any
worker's death, and it is saved in the same checkpoint as the model, so a restore after
a ps or chief failure resumes the data where the restored model was.

The state (span k of S; all int64 unless said):

    data_queue/epoch             []   passes over the queue begun (0: the first)
    data_queue/owner (int32)     [S]  FREE (-1), DONE (-2), or the worker reading it
    data_queue/offset            [S]  lines of span k whose updates are in the model
    data_queue/lease (float64)   [S]  seconds since the epoch of its owner's last step
    data_queue/committed_steps   []   steps whose batch was committed
    data_queue/duplicated_batches []  batches applied although their lines were applied
                                      (see below: 0 unless a worker froze past its lease)
    data_queue/seen (int32)      [L]  with --count_examples: how often each training line
                                      (file by file, in order) is in the model

The protocol, per worker (`SpanInput`, driven by the training loop):
1. Claim: in the critical section, the worker's own span in flight (a restarted worker
   resumes it), else a free one, else one whose owner has not stepped for
   `--span_lease_secs` (it is taken over), in an order shuffled per epoch. It reads the
   file from `offset` on. When every span is DONE, the epoch advances and every span is
   free again; when none is free but some are in flight elsewhere, the worker waits
   (polling every 0.5 s).
2. Each step's batch is one span's consecutive lines [first, first + n). Before the step
   reserves its number (`exact.counted_update`), a check on ps 0 requires that the worker
   still owns the span and that `first == offset`; otherwise the step fails, nothing is
   applied, and the worker claims again (it resumes where the model is).
3. After the step's update is applied on every ps, the commit (critical section) adds n to
   `offset`, refreshes the lease, and with `--count_examples` adds 1 to `seen` for each
   line.
4. At the end of its file the worker claims again, naming the finished span: it becomes
   DONE when `offset` has reached the lines the worker read.

What this guarantees: every line's update is in the model exactly once per epoch, across
worker kills, restarts, joins and leaves, and ps or chief restores from a checkpoint (the
queue is restored with the model). What it does not: with several ps tasks, a worker that
dies after some ps applied its step and before the commit leaves that part of the update
in, and its lines are read again: `global_step - committed_steps` (for steps trained from
the queue) bounds those steps. A worker frozen past its lease, whose span another worker
then took over, applies its in-flight batch twice: counted in `duplicated_batches`.
"""

from __future__ import annotations

import gzip
import time
from typing import Optional, Sequence

from absl import logging

FREE, DONE = -1, -2
SCOPE = "data_queue"
WAIT_SECS = 0.5  # a worker's poll while the epoch's last spans are in flight elsewhere
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


class SpanQueue:
    """The queue's state and its ops, built in a worker's graph on `device` (ps 0).

    Args:
      num_spans: S, the training files.
      lease_secs: a span in flight on a worker that has not committed a step for this
        long may be taken over (`--span_lease_secs`).
      seed: the per-epoch order's seed (`--seed`).
      line_counts: with `--count_examples`, each file's lines (`count_lines`): `seen` is
        built, one int32 per line.
    """

    def __init__(self, num_spans: int, device: str, lease_secs: float, seed: int,
                 line_counts: Optional[Sequence[int]] = None):
        import tensorflow as tf
        v1 = tf.compat.v1
        self.num_spans, self.device, self._lease, self._seed = num_spans, device, lease_secs, seed
        with v1.device(device), v1.variable_scope(SCOPE):
            def var(name, value):
                return v1.get_variable(name, initializer=value, trainable=False,
                                       use_resource=True)
            self.epoch = var("epoch", tf.constant(0, tf.int64))
            self.owner = var("owner", tf.fill([num_spans], FREE))
            self.offset = var("offset", tf.zeros([num_spans], tf.int64))
            self.lease = var("lease", tf.zeros([num_spans], tf.float64))
            self.committed = var("committed_steps", tf.constant(0, tf.int64))
            self.duplicated = var("duplicated_batches", tf.constant(0, tf.int64))
            self.seen, self.bases = None, None
            if line_counts is not None:
                self.seen = var("seen", tf.zeros([sum(line_counts)], tf.int32))
                starts = [sum(line_counts[:k]) for k in range(num_spans)]
                self.bases = tf.constant(starts, tf.int64)
            self._lock = tf.CriticalSection(name="lock", shared_name=f"{SCOPE}_lock")

    def claim(self, worker, finished, finished_lines):
        """Op (on ps 0): int64 [3] (span or -1 to wait, its first unread line, epoch).

        `worker`: int32 scalar; `finished`: int32 span the worker read to its end, or -1;
        `finished_lines`: int64 lines it read of it (DONE if `offset` reached them).
        """
        import tensorflow as tf
        with tf.compat.v1.device(self.device):
            return self._lock.execute(lambda: self._claim(worker, finished, finished_lines),
                                      name="claim")

    def _claim(self, worker, finished, finished_lines):
        import tensorflow as tf
        spans = tf.range(self.num_spans)
        owner, offset = self.owner.read_value(), self.offset.read_value()
        epoch, lease = self.epoch.read_value(), self.lease.read_value()
        is_finished = tf.logical_and(tf.equal(spans, finished), tf.equal(owner, worker))
        owner = tf.where(tf.logical_and(is_finished, offset >= finished_lines), DONE, owner)
        new_epoch = tf.reduce_all(tf.equal(owner, DONE))
        epoch = epoch + tf.cast(new_epoch, tf.int64)
        owner = tf.where(new_epoch, tf.fill([self.num_spans], FREE), owner)
        offset = tf.where(new_epoch, tf.zeros_like(offset), offset)
        now = tf.timestamp()
        expired = tf.logical_and(owner >= 0, now - lease > self._lease)
        rank = tf.argsort(tf.random.stateless_uniform(
            [self.num_spans], tf.stack([tf.constant(self._seed, tf.int64), epoch])))
        kind = tf.where(tf.equal(owner, worker), 0, tf.where(
            tf.equal(owner, FREE), 1, tf.where(expired, 2, 3)))
        chosen = tf.cast(tf.argmin(kind * self.num_spans + tf.cast(rank, tf.int32)), tf.int32)
        ok = kind[chosen] < 3
        take = tf.logical_and(tf.equal(spans, chosen), ok)
        with tf.control_dependencies([owner, offset, epoch, lease]):
            writes = [self.owner.assign(tf.where(take, worker, owner)),
                      self.offset.assign(offset), self.epoch.assign(epoch),
                      self.lease.assign(tf.where(take, now, lease))]
        with tf.control_dependencies(writes):
            return tf.stack([tf.where(ok, tf.cast(chosen, tf.int64), -1),
                             tf.where(ok, offset[chosen], 0), epoch])

    def check(self, worker, span, first):
        """Op (on ps 0) that fails with `MOVED_ON` unless `worker` owns `span` and the model
        holds exactly its lines before `first` (all int64 but `worker`, int32)."""
        import tensorflow as tf
        with tf.compat.v1.device(self.device):
            s = tf.cast(span, tf.int32)
            owned = tf.logical_and(tf.equal(tf.gather(self.owner.read_value(), s), worker),
                                   tf.equal(tf.gather(self.offset.read_value(), s), first))
            return tf.debugging.Assert(owned, [MOVED_ON, "span", span, "line", first])

    def commit(self, worker, span, first, n):
        """Op (on ps 0, critical section): the batch's `n` lines from `first` of `span` are in
        the model. Build it under a control dependency on the step's update."""
        import tensorflow as tf
        with tf.compat.v1.device(self.device):
            return self._lock.execute(lambda: self._commit(worker, span, first, n),
                                      name="commit")

    def _commit(self, worker, span, first, n):
        import tensorflow as tf
        s = tf.cast(span, tf.int32)
        owner, offset = self.owner.read_value(), self.offset.read_value()
        ok = tf.logical_and(tf.equal(owner[s], worker), tf.equal(offset[s], first))
        one = tf.one_hot(s, self.num_spans, dtype=tf.int64)
        with tf.control_dependencies([owner, offset]):
            writes = [self.offset.assign_add(one * n * tf.cast(ok, tf.int64)),
                      self.lease.assign(tf.where(tf.cast(one, tf.bool), tf.timestamp(),
                                                 self.lease.read_value())),
                      self.committed.assign_add(1),
                      self.duplicated.assign_add(1 - tf.cast(ok, tf.int64))]
            if self.seen is not None:
                ids = self.bases[s] + first + tf.range(n)
                writes.append(self.seen.scatter_add(tf.IndexedSlices(
                    tf.fill([n], tf.cast(ok, tf.int32)), ids)))
        with tf.control_dependencies(writes):
            return tf.identity(ok)


class SpanInput:
    """A worker's input from the queue: batches of one span's lines, then the next span.

    `get_next()` gives (features, labels) as `ctr_files`' iterators do; the batch's span,
    first line and line count ride along for `check` and `commit` (`guard`, `commit`).
    The loop calls `advance` when a step ends with `ended` (the span's file is read) or
    `moved_on` (the check refused the batch).
    """

    def __init__(self, queue: SpanQueue, files: Sequence[str], worker: int, dataset_fn):
        """`dataset_fn(files, skip)`: the batches (((features, labels), (first, n))) of
        string [k] `files` (0 or 1) from line `skip` (int64) on."""
        import tensorflow as tf
        v1 = tf.compat.v1
        self.queue, self.files, self.worker = queue, list(files), worker
        self._file = v1.placeholder_with_default(tf.zeros([0], tf.string), [None])
        self._skip = v1.placeholder_with_default(tf.constant(0, tf.int64), [])
        self._span = v1.placeholder_with_default(tf.constant(-1, tf.int64), [])
        self._iterator = v1.data.make_initializable_iterator(dataset_fn(self._file, self._skip))
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
        self._batch = None
        self._current, self._session, self._retries, self._verified_at = -1, None, 0, -1

    def get_next(self):
        """(features, labels) of the next batch (one call per graph)."""
        batch, (first, n) = self._iterator.get_next()
        self._batch = (self._span_var.read_value(), first, n)
        return batch

    def guard(self):
        """Op: the check before the step reserves its number, and this worker's count of the
        span's lines read (the claim's `finished_lines`)."""
        import tensorflow as tf
        span, first, n = self._batch
        with tf.control_dependencies([self._read.assign(first + n)]):
            return self.queue.check(tf.constant(self.worker), span, first)

    def commit(self):
        """Op: the commit of this step's batch (build it after the update)."""
        import tensorflow as tf
        span, first, n = self._batch
        return self.queue.commit(tf.constant(self.worker), span, first, n)

    @staticmethod
    def ended(error) -> bool:
        """Whether `error` is the end of the span's file (not the last step's `CountUpTo`)."""
        return "End of sequence" in (getattr(error, "message", None) or str(error))

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
        span, skip, epoch = self._claim_next(run, finished, lines, stopping)
        if span < 0:
            return False
        self._current, self._session, self._retries = span, session, retries
        self._verified_at = -1
        self._point(run, span, skip)
        logging.info("data queue: span %d (%s) from line %d, epoch %d", span,
                     self.files[span], skip + 1, epoch)
        return True

    def _point(self, run, span: int, skip: int) -> None:
        run(self._start, {self._file: [self.files[span]], self._skip: skip, self._span: span})

    def _claim_next(self, run, finished: int, lines: int, stopping):
        """(span, first unread line, epoch) claimed; span -1 if `stopping()` while waiting."""
        waiting = False
        while True:
            span, skip, epoch = (int(x) for x in run(self._claim, {
                self._finished: finished, self._finished_lines: lines}))
            finished = -1
            if span >= 0 or stopping():
                return span, skip, epoch
            if not waiting:
                logging.info("data queue: every span of epoch %d is taken; waiting for the "
                             "workers reading the last ones", epoch)
                waiting = True
            time.sleep(WAIT_SECS)
