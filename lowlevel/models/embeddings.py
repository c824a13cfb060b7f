"""Embedding tables partitioned over the ps tasks by rows, and deduplicated lookups.

The known failures of the classic trainer on sparse models (TensorFlow issues
#5892, #24953, #38537) and what is done here instead:

- A table is a variable of `[rows, dim]` created with the model's partitioner
  (`placement.partitioner`): above a shard's size it is split by rows into
  shards that `placement`'s byte balance spreads so every ps holds the same
  bytes. Rows go to shards by TensorFlow's "div" strategy (contiguous
  ranges), which is how the partitioner cuts the variable.
- `lookup` deduplicates a batch's ids on the worker (`tf.unique`), then
  gathers each shard's rows on the ps that holds them
  (`tf.compat.v1.nn.embedding_lookup` colocates each gather with its shard),
  so a step moves (unique ids touched) x dim x 4 bytes each way, whatever the
  table's size. The gradient of a gather is an `IndexedSlices`, which the
  optimizers apply with their sparse kernels (Adagrad:
  `ResourceSparseApplyAdagrad`) and `SyncReplicasOptimizer` aggregates in a
  `SparseConditionalAccumulator`.
- The fields of a model share one table per width (`FieldTable`): field k's id
  i is row `offsets[k] + i`, so a batch's ids of every field are deduplicated
  and looked up together, one gather and one sparse update per shard per step
  instead of one per field and shard (52 tables of wide & deep on 2 ps: ~400
  tensors on the wire per step, each a RecvTensor call; benchmarks/NOTES.md).
  Rows are spread over the table by a fixed multiplicative permutation, so
  the hot low ids of every field land on every shard and each ps serves the
  same traffic; the permutation does not depend on the number of ps tasks,
  so checkpoints still restore with another one.
- Tables are registered in the `TABLES` collection: the exact mode's fusion of
  small variables and the communication-reduced mode's local copies leave
  them alone (a whole-table read would make the gradient dense).
- A partitioned table is saved as one variable with slice information, so a
  checkpoint restores with another number of ps tasks (another partitioning).
- Rows are initialised lazily (issue 27: start-up independent of the table's
  size). A `FieldTable`'s variable holds each row's *offset* from its initial
  value and starts at zeros (zeroed memory, `optimizers.Filled`: no full-size
  temporary); the initial value of row r is `initial_rows(r)`, a
  hash of (r, column, seed), added on the worker to the rows a batch looks up.
  The model is the one whose table started at `initial_rows` of every row,
  the same after any restart, with any number of ps, without generating
  rows x dim random numbers before the first step (at 100 M rows x 16 that
  took >= 27 s per ps, benchmarks/NOTES.md). A checkpoint holds the offsets.
"""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

from lowlevel.models import optimizers

v1 = tf.compat.v1

TABLES = "lowlevel_embedding_tables"  # graph collection of every table (or shard of one)


def _signed(c: int) -> int:
    return c - 2 ** 64 if c >= 2 ** 63 else c


def mix64(x):
    """MurmurHash3's 64-bit finaliser (fmix64) of int64 `x` -> int64, a bijection of 64 bits."""
    u = tf.bitcast(tf.cast(x, tf.int64), tf.uint64)
    for multiplier in (0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53, None):
        u = tf.bitwise.bitwise_xor(u, tf.bitwise.right_shift(u, tf.constant(33, tf.uint64)))
        if multiplier:
            u = u * tf.constant(multiplier, tf.uint64)
    return tf.bitcast(u, tf.int64)


def initial_rows(ids, dim: int, stddev: float, seed: int):
    """The deterministic first value of the rows of int64 `ids` `[N]` -> float32 `[N, dim]`.

    Uniform in `[-sqrt(3) stddev, sqrt(3) stddev]` (standard deviation `stddev`),
    a function of (id, column, seed) only: two `mix64` rounds, 24 bits of the
    hash per float.
    """
    cols = tf.range(1, dim + 1, dtype=tf.int64) * tf.constant(_signed(0x9E3779B97F4A7C15),
                                                              tf.int64)
    h = mix64(mix64(ids[:, None] + seed) + cols[None, :])
    unit = tf.cast(tf.bitwise.bitwise_and(h, (1 << 24) - 1), tf.float32) / float(1 << 24)
    return (2.0 * unit - 1.0) * (math.sqrt(3.0) * stddev)


def table(name: str, rows: int, dim: int):
    """A `[rows, dim]` float32 table of zeros (partitioned if the scope has a partitioner).

    Each shard starts as zeroed memory on its ps (`optimizers.Filled`: no
    full-size temporary, no random
    numbers: the module doc's lazy initialisation). The scope's partitioner
    shards it, or its `for_tables` if it has one (`placement.EvenShards`: the
    dense variables are split by another rule).
    """
    return v1.get_variable(
        name, [rows, dim], tf.float32, optimizers.Filled(0.0),
        collections=[v1.GraphKeys.GLOBAL_VARIABLES, v1.GraphKeys.TRAINABLE_VARIABLES, TABLES],
        partitioner=getattr(v1.get_variable_scope().partitioner, "for_tables", None))


def spread_multiplier(rows: int) -> int:
    """A multiplier `a` coprime with `rows`, near rows / golden ratio (Fibonacci hashing).

    `id -> (id * a) mod rows` is then a permutation of `[0, rows)` that sends
    consecutive ids far apart (Knuth, TAOCP vol. 3, 6.4).
    """
    a = max(1, round(rows * (math.sqrt(5) - 1) / 2))
    while math.gcd(a, rows) != 1:
        a += 1
    return a


class FieldTable:
    """The embedding tables of several categorical fields, as one partitioned table.

    Args:
      name: the variable's name in the current scope.
      sizes: rows of each field (ids of field k are in `[0, sizes[k])`).
      dim: floats per row.
      stddev, seed: the initial rows' (`initial_rows`, uniform of standard
        deviation `stddev`, keyed by table row and `seed`).

    Attributes:
      params: the `[sum(sizes), dim]` float32 table (`table`), rows permuted,
        each row's offset from its initial value.
      offsets: int64 `[K]`, the first row of each field before the permutation.
    """

    def __init__(self, name: str, sizes, dim: int, stddev: float, seed: int):
        self.sizes = tuple(int(n) for n in sizes)
        self.rows = sum(self.sizes)
        self.dim = dim
        self.offsets = np.cumsum([0, *self.sizes[:-1]]).astype(np.int64)
        self.multiplier = spread_multiplier(self.rows)
        self.stddev, self.seed = stddev, seed
        self.params = table(name, self.rows, dim)

    def row_of(self, ids):
        """The table row of each id: int64 `[B, K]` (column k: field k's ids) -> `[B, K]`."""
        logical = ids + tf.constant(self.offsets)
        return tf.math.floormod(logical * self.multiplier, self.rows)

    def lookup(self, ids):
        """Rows for int64 `ids` `[B, K]` (column k: field k's ids) -> float32 `[B, K, dim]`.

        Every distinct row of the batch, over all K fields, is gathered once
        (`lookup`) and added to its initial value (`initial_rows`).
        """
        rows = lookup(self.params, tf.reshape(self.row_of(ids), [-1]),
                      lambda r: initial_rows(r, self.dim, self.stddev, self.seed))
        return tf.reshape(rows, [-1, len(self.sizes), self.dim])


def shards(params) -> list:
    """The shards of a table: a list of variables (one if not partitioned)."""
    parts = getattr(params, "_get_variable_list", None)  # PartitionedVariable: no public name
    if parts is not None:
        return list(parts())
    if isinstance(params, (list, tuple)):
        return list(params)
    return [params]


def lookup(params, ids, initial=None):
    """Rows of `params` (`[rows, dim]`, maybe partitioned) for int64 `ids` `[B]` -> `[B, dim]`.

    Each distinct id is gathered once, on the ps holding its row, and its
    gradient goes back once (`_expand`). `initial`, if given, maps the
    distinct ids `[U]` to float32 `[U, dim]` added to their rows on the worker
    (the lazy initial values); the gradient flows to `params` alone.
    """
    unique_ids, index = tf.unique(ids)
    rows = v1.nn.embedding_lookup(shards(params), unique_ids, partition_strategy="div")
    if initial is not None:
        rows = rows + initial(unique_ids)
    return _expand(rows, index)


def _expand(rows, index):
    """`rows[index]` (`[U, dim]` -> `[B, dim]`), whose gradient is summed per row on the worker.

    The gradient of a plain `tf.gather` is an `IndexedSlices` of B rows, one
    per occurrence, which would travel to the ps as such (a hot id's row
    sent once per example: measured 1.38x the unique-row limit with
    synthetic_ctr, benchmarks/NOTES.md). Summed here (`unsorted_segment_sum`
    over `index`), the gradient of the U unique rows crosses the network, and
    the lookup turns it into each shard's `IndexedSlices` of its rows.
    """
    @tf.custom_gradient
    def expand(unique_rows):
        def grad(dy):
            return tf.math.unsorted_segment_sum(dy, index, tf.shape(unique_rows)[0])
        return tf.gather(unique_rows, index), grad
    return expand(rows)


def is_table(variable) -> bool:
    """Whether `variable` (a variable or shard) is in the `TABLES` collection of its graph."""
    return any(variable is t for t in variable.graph.get_collection(TABLES))


def is_table_request(kwargs: dict) -> bool:
    """Whether a custom getter's `get_variable` keyword arguments ask for a table."""
    return TABLES in (kwargs.get("collections") or ())
