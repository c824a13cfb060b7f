"""`--dataset=criteo_files`: Criteo-layout click logs read from files by each worker's graph.

The in-memory click-through sets (`ctr`) are loaded whole by every task; this one is
read as it trains (`criteo.dataset`: `tf.data` in the worker's graph), so the files may
be larger than memory. Each worker reads every num_workers-th training file (or, with
fewer files than workers, every num_workers-th line), shuffled by file and by batch,
epoch after epoch. The chief's final evaluation and the evaluator read `--eval_files`
once per evaluation. The features are `wide_deep`'s (`ctr.CtrSplit`'s columns): 13
dense, 26 categorical fields with `ctr.criteo_field_sizes(--vocab_size)` rows, 3 crosses
into `--hash_buckets` rows.

What this is not yet: each worker's share is fixed by its index, so a worker that dies
leaves its files unread until it is back, and a resized job reads with the old split.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional

from lowlevel.data import criteo, ctr


@dataclasses.dataclass(frozen=True)
class FileSplit:
    """A split held in files: `files` (paths), `skip_bad_lines` (drop malformed lines)."""

    files: tuple[str, ...]
    skip_bad_lines: bool = False

    @property
    def description(self) -> str:
        size = sum(os.path.getsize(f) for f in self.files)
        return f"{len(self.files)} file(s), {size / 1e6:,.1f} MB"


@dataclasses.dataclass(frozen=True)
class CtrFileSet:
    """The click-through data set of Criteo-layout files (the interface of `ctr.CtrDataSet`)."""

    train: FileSplit
    test: FileSplit
    field_sizes: tuple[int, ...]
    hash_buckets: int
    name: str = "criteo_files"
    field_names: tuple[str, ...] = tuple(f"C{i + 1}" for i in range(criteo.NUM_CATEGORICAL))
    cross_names: tuple[str, ...] = criteo.CROSS_NAMES
    num_classes: int = 2
    max_value: float = 1.0
    num_dense: int = criteo.NUM_INTEGER

    @property
    def description(self) -> str:
        return f"{self.name} ({self.train.description} train / {self.test.description} test)"

    def train_iterator(self, batch_size: int, num_shards: int, shard: int, seed: int):
        """Worker `shard`'s input, as `ctr.train_iterator` gives it (no feed: files)."""
        import tensorflow as tf
        ds = criteo.dataset(self.train.files, batch_size, self.field_sizes, self.hash_buckets,
                            num_shards, shard, shuffle_seed=seed + shard,
                            skip_bad_lines=self.train.skip_bad_lines)
        it = tf.compat.v1.data.make_initializable_iterator(ds)
        return it.initializer, {}, it

    def span_input(self, batch_size: int, worker: int, device: str, lease_secs: float,
                   seed: int, count_examples: bool = False,
                   line_counts_cache: Optional[str] = None, sync: bool = False):
        """Worker `worker`'s input from the data queue on `device` (`spans.SpanInput`: span k
        is training file k). `count_examples` counts the files' lines first (reads those
        not in `line_counts_cache`, `spans.line_counts`). `sync`: the queue of sync training
        (`spans.SpanQueue`)."""
        from lowlevel.data import spans
        files = self.train.files
        counts = spans.line_counts(files, line_counts_cache) if count_examples else None
        queue = spans.SpanQueue(len(files), device, lease_secs, seed, counts, sync)
        compression = "GZIP" if files[0].endswith(".gz") else ""
        return spans.SpanInput(queue, files, worker, lambda file, skip, start: (
            criteo.span_batches(file, skip, start, batch_size, self.field_sizes,
                                self.hash_buckets, compression, self.train.skip_bad_lines)))

    def eval_input(self, split: FileSplit, batch_size: int = 1000):
        """`split` once, in order, as `ctr.eval_input` gives it."""
        import tensorflow as tf
        ds = criteo.dataset(split.files, batch_size, self.field_sizes, self.hash_buckets,
                            repeat=False, drop_remainder=False,
                            skip_bad_lines=split.skip_bad_lines)
        it = tf.compat.v1.data.make_initializable_iterator(ds)
        return it.initializer, {}, it.get_next()

    def probe_inputs(self) -> dict:
        return ctr.probe_features(self)


def check(train_files: str, eval_files: str) -> tuple[list[str], list[str]]:
    """The files of `--train_files` and `--eval_files` (comma-separated globs), each opened
    and its first line checked (the launcher calls this before it starts anything).

    Raises:
      errors.UsageError: a glob matches no file or mixes .gz and plain files; a file
        cannot be read, or its first line is not of the layout (`criteo.check_readable`).
    """
    train = criteo.resolve(train_files, "--train_files")
    test = criteo.resolve(eval_files, "--eval_files")
    for paths, flag in ((train, "--train_files"), (test, "--eval_files")):
        for path in paths:
            criteo.check_readable(path, flag)
    return train, test


def load(train_files: str, eval_files: str, vocab_size: int, hash_buckets: int,
         skip_bad_lines: bool = False) -> CtrFileSet:
    """The data set of `--train_files` and `--eval_files` (`check`'s files and errors)."""
    train, test = check(train_files, eval_files)
    return CtrFileSet(FileSplit(tuple(train), skip_bad_lines), FileSplit(tuple(test),
                      skip_bad_lines), ctr.criteo_field_sizes(vocab_size), hash_buckets)
