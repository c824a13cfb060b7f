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
- Tables are registered in the `TABLES` collection: the exact mode's fusion of
  small variables and the communication-reduced mode's local copies leave
  them alone (a whole-table read would make the gradient dense).
- A partitioned table is saved as one variable with slice information, so a
  checkpoint restores with another number of ps tasks (another partitioning).
"""

from __future__ import annotations

import tensorflow as tf

v1 = tf.compat.v1

TABLES = "lowlevel_embedding_tables"  # graph collection of every table (or shard of one)


def table(name: str, rows: int, dim: int, stddev: float, seed: int):
    """A `[rows, dim]` float32 table (partitioned if the scope has a partitioner).

    Initialised truncated-normal with `stddev`, shard by shard (no shard builds
    the whole table's initial value). The scope's partitioner shards it, or
    its `for_tables` if it has one (`placement.EvenShards`: the dense
    variables are split by another rule).
    """
    return v1.get_variable(
        name, [rows, dim], tf.float32,
        v1.truncated_normal_initializer(stddev=stddev, seed=seed),
        collections=[v1.GraphKeys.GLOBAL_VARIABLES, v1.GraphKeys.TRAINABLE_VARIABLES, TABLES],
        partitioner=getattr(v1.get_variable_scope().partitioner, "for_tables", None))


def shards(params) -> list:
    """The shards of a table: a list of variables (one if not partitioned)."""
    parts = getattr(params, "_get_variable_list", None)  # PartitionedVariable: no public name
    if parts is not None:
        return list(parts())
    if isinstance(params, (list, tuple)):
        return list(params)
    return [params]


def lookup(params, ids):
    """Rows of `params` (`[rows, dim]`, maybe partitioned) for int64 `ids` `[B]` -> `[B, dim]`.

    Each distinct id is gathered once, on the ps holding its row, and its
    gradient goes back once (`_expand`).
    """
    unique_ids, index = tf.unique(ids)
    rows = v1.nn.embedding_lookup(shards(params), unique_ids, partition_strategy="div")
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
