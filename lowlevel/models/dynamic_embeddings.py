"""Dynamic embedding tables: raw 64-bit ids, rows created on admission, evicted when stale.

`--embedding=dynamic`, built on TensorFlow's stock ops only:
`MutableHashTable`, resource variables with gather and scatter, and a lock
(`MutexV2`, as `tf.CriticalSection` holds) per shard on its ps.

A `DynamicTable` of width `dim` is split into `num_shards` `DynamicShard`s, one
per ps task; id `x` belongs to shard `mix64(x) mod num_shards` (`shard_of`:
a 64-bit finaliser, so consecutive or patterned ids spread evenly). A shard
holds, on its ps:

- `index`: a `MutableHashTable` int64 id -> int64 row in `[0, capacity)`;
- `rows`: float32 `[capacity, dim]`, the embedding rows, and `slots`, the
  optimizer's (`SLOTS`; Adagrad: `accumulators` `[capacity, dim]`; lazy Adam:
  `m`, `v` `[capacity, dim]` and `updates` `[capacity]`): a slot follows its
  row (same row index, written on admission, freed on eviction);
- `keys`, `counts`, `last_seen`: int64 `[capacity]`, the id of each row, its
  sightings, and the global step that last saw it (-1: the row is free);
- `free_rows` int64 `[capacity]` and `free_count` int64 scalar: the free rows
  are `free_rows[:free_count]`, a stack (admission pops, eviction pushes; not
  checkpointed: a restore rebuilds it);
- `pending`: a `MutableHashTable` int64 id -> int64 `[2]` (sightings, last
  step seen) of the ids seen but not yet admitted;
- `default_row`: float32 `[dim]` zeros, what an id without a row reads.

Semantics (exact; `tests/test_dynamic_embeddings.py` checks them on a scripted
stream):

- **Sightings** are occurrences in the batches looked up (an id twice in a
  batch: 2). **Admission**: an id gets a row in the lookup where its sightings
  reach `admit_after` (1: at once); that lookup already returns the new row
  and its gradient updates it. Before, it reads `default_row` and its gradient
  is dropped. A new row starts at a deterministic function of (id, seed)
  (uniform, standard deviation `stddev`; the same after any restart) and its
  accumulator at `initial_accumulator`. With no free row left (`capacity`
  reached) the id stays pending and is admitted once a row is free
  (`DynamicShard.refused` counts those lookups' ids).
- **Eviction**: a lookup at global step `s` (after recording its own
  sightings) sweeps, if `sweep_every_steps` have passed since the last sweep,
  every row with `s - last_seen > evict_after_steps` (unseen for more than that
  many steps): its key leaves `index`, the row and its accumulator are free
  for the next admission; pending ids unseen as long are forgotten too.
  `evict_after_steps=0`: never.
- **Updates** (Adagrad or lazy Adam: `DynamicShard.apply_gradients`), under the
  shard's lock, go to the rows the forward lookup read, checked by gathers (the
  row's key is the id, the row is in use), not by a second search of the index: a
  row evicted (and maybe given to another id) since the lookup is not touched; an
  id that had no row at its lookup gets nothing, even if admitted since (its
  gradient is the default row's).
- **Consistency**: lookup, update, checkpoint export and restore of a shard
  each run as one call holding the shard's lock on its ps, so none interleaves
  with another: a checkpoint's keys, rows, accumulators, counts and last-seen
  steps are one snapshot of the shard (DeepRec #1023 is rows and slots
  saved at different moments). `DynamicShard.saveable` is that snapshot, one
  `SaveableObject` per shard; the shard's variables are left out of the
  variable savers (`DYNAMIC_STATE`).

Gradients reach the tables through `DynamicTable.lookup`'s custom gradient:
computing the gradient of the looked-up rows applies the shard's Adagrad
update, and hands a zero gradient to a one-float trainable `anchor` so that
any optimizer's `minimize` runs it within its train op. The table's learning
rate is its own (`learning_rate`), whatever the optimizer of the dense
variables; under `--sync` its updates are applied per worker step (async).

Costs: a lookup or update moves (unique ids) x (8 + 4 dim) bytes each way; the
ps's work per lookup is O(unique ids), plus O(capacity) at a sweep (scanning
`last_seen`). Free rows come off the `free_rows` stack: before, each lookup that
admitted ids scanned `last_seen` for them, and since a variable updated by
scatters is in TensorFlow's copy-on-read mode, that read first copied all of it
(8 x capacity bytes: 8 MB per shard at the default capacity, on most steps).
"""

from __future__ import annotations

import contextlib
import dataclasses
import re

import tensorflow as tf
from tensorflow.python.training.saving import saveable_object

from lowlevel.models import embeddings
from lowlevel.models.embeddings import initial_rows, mix64  # noqa: F401 (public here too)

v1 = tf.compat.v1

# Graph collections: every shard (for reports and savers), and the variables a shard's
# snapshot saves (variable savers leave them out).
SHARDS = "lowlevel_dynamic_embedding_shards"
DYNAMIC_STATE = "lowlevel_dynamic_embedding_state"
TABLE_REGISTRY = "lowlevel_dynamic_embedding_tables"  # [{scope name: DynamicTable}]
READING = "lowlevel_dynamic_embedding_reading"  # non-empty within `reading()`
# The optimizers of the rows and their slots, (name, one float per column: else one per row).
SLOTS = {"adagrad": (("accumulators", True),),
         "adam": (("m", True), ("v", True), ("updates", False))}
FIELD_BITS = 56  # `FieldTables`: field k's id x is the key (k << 56) | (x mod 2^56)
# Buckets of `string_ids`: the largest int64 bucket count, so strings are not folded.
STRING_BUCKETS = 2 ** 63 - 1


def shard_of(ids, num_shards: int):
    """The shard of each int64 id (any shape): `mix64(id) mod num_shards`, int32."""
    return tf.cast(tf.math.floormod(mix64(ids), num_shards), tf.int32)


def string_ids(strings):
    """64-bit ids of a string tensor (any shape) -> int64 in `[0, 2^63 - 1)`.

    FarmHash fingerprints (`tf.strings.to_hash_bucket_fast`) over 2^63 - 1
    buckets: no folding into a small vocabulary (two distinct strings share an
    id with probability ~n^2 / 2^64 for n strings).
    """
    return tf.strings.to_hash_bucket_fast(strings, STRING_BUCKETS)


class HashTable:
    """A `MutableHashTable` int64 -> int64 (or int64 `[k]`) shared by name on its device.

    TensorFlow's `tf.lookup.experimental.MutableHashTable` is shared only by its op's
    node name, and only when it is checkpointed on its own; with `checkpoint=False`
    (the shard's snapshot saves it) each kernel has a private table, so each worker's
    graph had one on the ps (measured: a 1 ps + 2 worker run admitted every id twice,
    test AUC 0.763). This one is created with `shared_name`, as variables are.

    Args:
      shared_name: the resource's name on its device (unique per table).
      default: what `lookup` gives for a missing key: an int, or a list of k ints.
    """

    def __init__(self, shared_name: str, default):
        self.default = tf.constant(default, tf.int64)
        if self.default.shape.rank:
            self.handle = tf.raw_ops.MutableHashTableOfTensorsV2(
                key_dtype=tf.int64, value_dtype=tf.int64, value_shape=self.default.shape,
                shared_name=shared_name, use_node_name_sharing=False)
        else:
            self.handle = tf.raw_ops.MutableHashTableV2(
                key_dtype=tf.int64, value_dtype=tf.int64, shared_name=shared_name,
                use_node_name_sharing=False)

    def lookup(self, keys):
        """int64 `[n]` -> int64 `[n]` (or `[n, k]`)."""
        return tf.raw_ops.LookupTableFindV2(table_handle=self.handle, keys=keys,
                                            default_value=self.default)

    def insert(self, keys, values):
        """Sets `keys` (int64 `[n]`) to `values`; returns the op."""
        return tf.raw_ops.LookupTableInsertV2(table_handle=self.handle, keys=keys,
                                              values=values)

    def remove(self, keys):
        """Removes `keys` (absent ones are ignored); returns the op."""
        return tf.raw_ops.LookupTableRemoveV2(table_handle=self.handle, keys=keys)

    def export(self):
        """(keys, values) of every entry, in no particular order."""
        return tf.raw_ops.LookupTableExportV2(table_handle=self.handle, Tkeys=tf.int64,
                                              Tvalues=tf.int64)

    def size(self):
        """int64 scalar: the entries."""
        return tf.raw_ops.LookupTableSizeV2(table_handle=self.handle)


class DynamicShard:
    """One ps's part of a `DynamicTable` (the module docstring lists its state).

    Create it under the ps's device scope (its variables and tables are placed
    there and every op of it runs there).

    Args:
      name: variable scope name of the shard.
      dim: floats per row.
      capacity: rows preallocated (x dim x 4 bytes for the rows and each slot).
      admit_after: sightings that admit an id (>= 1).
      evict_after_steps: a row unseen for more than this many global steps is
        evicted at the next sweep; 0: never.
      sweep_every_steps: global steps between sweeps (>= 1).
      stddev, seed: of `initial_rows`.
      learning_rate: the optimizer's; initial_accumulator: a new row's Adagrad
        accumulator; optimizer: "adagrad" or "adam" (`SLOTS`).
    """

    def __init__(self, name: str, dim: int, capacity: int, admit_after: int = 1,
                 evict_after_steps: int = 0, sweep_every_steps: int = 1, stddev: float = 0.1,
                 seed: int = 0, learning_rate: float = 0.1, initial_accumulator: float = 0.1,
                 optimizer: str = "adagrad"):
        if optimizer not in SLOTS:
            raise ValueError(f"dynamic table {name}: optimizer {optimizer!r}; expected one of "
                             f"{', '.join(SLOTS)}")
        if admit_after < 1 or capacity < 1 or sweep_every_steps < 1 or evict_after_steps < 0:
            raise ValueError(f"dynamic table {name}: admit_after, capacity and "
                             "sweep_every_steps must be >= 1, evict_after_steps >= 0")
        self.name, self.dim, self.capacity = name, dim, capacity
        self.admit_after, self.evict_after_steps = admit_after, evict_after_steps
        self.sweep_every_steps, self.stddev, self.seed = sweep_every_steps, stddev, seed
        self.learning_rate, self.initial_accumulator = learning_rate, initial_accumulator
        self.optimizer = optimizer
        self._functions = {}  # body name -> tf.function (`_function`)
        with v1.variable_scope(name):
            self.scope = v1.get_variable_scope().name
            self._make_state()
        self.device = self.rows.device
        self.saveable = ShardSaveable(self)
        v1.add_to_collection(SHARDS, self)

    def _variable(self, name, shape, dtype, value, initializer=None):
        var = v1.get_variable(
            name, shape, dtype, initializer or v1.constant_initializer(value), trainable=False,
            use_resource=True,
            collections=[v1.GraphKeys.GLOBAL_VARIABLES, DYNAMIC_STATE, embeddings.TABLES])
        if initializer is None:
            self._initial.append((var, value))
        return var

    def _make_state(self):
        cap, dim = self.capacity, self.dim
        self._initial = []  # (variable, initial value): a restore starts from them
        self.rows = self._variable("rows", [cap, dim], tf.float32, 0.0)
        self.slots = {name: self._variable(name, [cap, *([dim] if wide else [])], tf.float32,
                                           0.0)
                      for name, wide in SLOTS[self.optimizer]}
        self.keys = self._variable("keys", [cap], tf.int64, 0)
        self.counts = self._variable("counts", [cap], tf.int64, 0)
        self.last_seen = self._variable("last_seen", [cap], tf.int64, -1)
        self.default_row = self._variable("default_row", [dim], tf.float32, 0.0)
        self.last_sweep = self._variable("last_sweep", [], tf.int64, 0)
        self.refused = self._variable("refused", [], tf.int64, 0)
        # Popped from the end: rows 0, 1, 2, ... first, as a scan of last_seen gave them.
        self.free_rows = self._variable(
            "free_rows", [cap], tf.int64, None,
            lambda *_, **__: tf.range(cap - 1, -1, -1, dtype=tf.int64))
        self.free_count = self._variable("free_count", [], tf.int64, cap)
        # checkpoint=False: the shard's snapshot (`ShardSaveable`) saves them, not the tables.
        # Named resources: every worker's graph reaches the same tables on the ps.
        self.index = HashTable(f"{self.scope}/index", -1)
        self.pending = HashTable(f"{self.scope}/pending", [0, -1])
        # What tf.CriticalSection holds: a mutex, shared by name by every worker's graph.
        self.lock = tf.raw_ops.MutexV2(shared_name=f"{self.scope}/lock", name="lock")

    def _locked(self, fn, *args):
        """fn(*args) as one call holding the shard's lock, all on its ps (not where a
        gradient would colocate it: with the forward op, on the worker).

        `tf.CriticalSection.execute`'s protocol (lock after the arguments are computed,
        the call, release after its outputs) with the arguments first copied to the ps
        and nothing else leaving it. `execute` made the lock wait on a group of the
        arguments' ops wherever they ran, and gated its outputs through a group: in
        a worker's step, more tensors between worker and ps (each its own RPC) than
        the data itself (benchmarks/NOTES.md, 2026-11-28).
        The lock still waits for its arguments to arrive: an update holding it while
        its gradient waits on a lookup of the same shard would deadlock.
        """
        with self._here():
            args = [tf.identity(a) for a in args]
            with tf.control_dependencies(args):
                lock = tf.raw_ops.MutexLock(mutex=self.lock)
            with tf.control_dependencies([lock]):
                out = self._function(fn)(*args)
            flat = tf.nest.flatten(out)
            with tf.control_dependencies(flat):
                released = tf.raw_ops.ConsumeMutexLock(mutex_lock=lock)
            with tf.control_dependencies([released]):
                return tf.nest.pack_sequence_as(out, [tf.identity(t) for t in flat])

    def _function(self, fn):
        """`fn` (one of the shard's bodies) as a `tf.function`, made once per shard: a
        model built twice in one graph (the exact mode's two builds) reuses each trace
        (a dynamic run's start-up 2 s shorter, benchmarks/NOTES.md 2026-11-28)."""
        if fn.__name__ not in self._functions:
            self._functions[fn.__name__] = tf.function(fn, autograph=False)
        return self._functions[fn.__name__]

    @contextlib.contextmanager
    def _here(self):
        """Ops made within run on the shard's ps, whatever they would be colocated with."""
        with v1.colocate_with(None, ignore_existing=True), tf.device(self.device):
            yield

    def on_ps(self, tensor):
        """`tensor` copied to the shard's ps (a lookup and its update then share one copy)."""
        with self._here():
            return tf.identity(tensor)

    # -- lookup -----------------------------------------------------------------
    def lookup(self, ids, sightings, step):
        """Rows of the shard's distinct int64 `ids` `[U]` -> (float32 `[U, dim]`, int64 `[U]`).

        Records `sightings` (int64 `[U]`, occurrences of each id) at global step
        `step` (int64 scalar), admits and sweeps (module docstring). Ids without
        a row read `default_row`. The second result, on the shard's ps, is the row
        each id read (-1: none), for `apply_gradients`.
        """
        step = tf.cast(tf.convert_to_tensor(step), tf.int64)  # a value: not the variable
        return self._locked(self._lookup_body, ids, sightings, step)

    def read(self, ids):
        """Rows of int64 `ids` `[U]` as they are -> float32 `[U, dim]`; nothing is recorded."""
        return self._locked(self._read_body, ids)

    def _read_body(self, ids):
        row = self.index.lookup(ids)
        return tf.where((row >= 0)[:, None], tf.gather(self.rows, tf.maximum(row, 0)),
                        self.default_row[None, :])

    def _lookup_body(self, ids, sightings, step):
        row = self.index.lookup(ids)
        # Most steps of a long run see no new id: the admission's ~60 ops are skipped then.
        row = tf.cond(tf.reduce_any(row < 0), lambda: self._admit(ids, sightings, row, step),
                      lambda: row)
        known = row >= 0
        at = tf.where(known)[:, 0]  # the ids with a row
        seen = tf.gather(row, at)
        self.counts.scatter_add(tf.IndexedSlices(tf.gather(sightings, at), seen))
        self.last_seen.scatter_update(tf.IndexedSlices(tf.fill(tf.shape(seen), step), seen))
        values = tf.where(known[:, None], tf.gather(self.rows, tf.maximum(row, 0)),
                          self.default_row[None, :])
        if self.evict_after_steps:
            with tf.control_dependencies([values]):
                due = step - self.last_sweep >= self.sweep_every_steps
                tf.cond(due, lambda: self._sweep(step), lambda: tf.constant(0, tf.int64))
        return values, row

    def _admit(self, ids, sightings, row, step):
        """Counts the sightings of ids without a row; gives rows to those reaching admit_after.

        Returns `row` (int64 `[U]`, -1: none) with the admitted ids' new rows in.
        """
        new = row < 0
        new_ids, new_sightings = tf.boolean_mask(ids, new), tf.boolean_mask(sightings, new)
        total = self.pending.lookup(new_ids)[:, 0] + new_sightings
        ready = total >= self.admit_after
        wanted = tf.reduce_sum(tf.cast(ready, tf.int64))
        slots = self._take_free_rows(wanted)
        taken = tf.size(slots, tf.int64)
        order = tf.cumsum(tf.cast(ready, tf.int64))  # 1-based rank among the ready ids
        admitted = tf.logical_and(ready, order <= taken)
        admitted_ids = tf.boolean_mask(new_ids, admitted)
        self.refused.assign_add(wanted - taken)
        waiting = tf.logical_not(admitted)
        waiting_ids = tf.boolean_mask(new_ids, waiting)
        self.pending.insert(waiting_ids, tf.stack(
            [tf.boolean_mask(total, waiting), tf.fill(tf.shape(waiting_ids), step)], axis=1))
        self.pending.remove(admitted_ids)
        self._fill(slots, admitted_ids, tf.boolean_mask(total - new_sightings, admitted))
        self.index.insert(admitted_ids, slots)
        where = tf.boolean_mask(tf.where(new)[:, 0], admitted)  # the admitted ids' positions
        return tf.tensor_scatter_nd_update(row, where[:, None], slots)

    def _take_free_rows(self, wanted):
        """Pops min(wanted, free) rows off the free stack -> int64 `[taken]`, lowest first."""
        count = self.free_count.read_value()
        taken = tf.minimum(count, wanted)
        # A gather, not a slice: a whole read of a scattered variable copies it all.
        slots = tf.gather(self.free_rows, tf.range(count - 1, count - taken - 1, -1))
        self.free_count.assign_sub(taken)
        return slots

    def _give_back(self, rows):
        """Pushes int64 `rows` `[n]` (just freed) onto the free stack."""
        count = self.free_count.read_value()
        self.free_rows.scatter_update(tf.IndexedSlices(
            rows, tf.range(count, count + tf.size(rows, tf.int64))))
        self.free_count.assign_add(tf.size(rows, tf.int64))

    def _fill(self, slots, ids, counts):
        """Writes new rows `slots` for `ids`: initial row, optimizer slots, key, prior count."""
        self.rows.scatter_update(tf.IndexedSlices(
            initial_rows(ids, self.dim, self.stddev, self.seed), slots))
        for name, var in self.slots.items():
            value = self.initial_accumulator if name == "accumulators" else 0.0
            var.scatter_update(tf.IndexedSlices(
                tf.fill(tf.concat([tf.shape(slots), var.shape[1:]], 0), value), slots))
        self.keys.scatter_update(tf.IndexedSlices(ids, slots))
        self.counts.scatter_update(tf.IndexedSlices(counts, slots))

    def _sweep(self, step):
        """Evicts rows and forgets pending ids unseen for more than evict_after_steps."""
        last = self.last_seen.read_value()
        stale = tf.where(tf.logical_and(last >= 0, step - last > self.evict_after_steps))[:, 0]
        self.index.remove(tf.gather(self.keys, stale))
        self.last_seen.scatter_update(
            tf.IndexedSlices(tf.fill(tf.shape(stale), tf.constant(-1, tf.int64)), stale))
        self._give_back(stale)
        pending_ids, pending_values = self._pending_entries()
        old = step - pending_values[:, 1] > self.evict_after_steps
        self.pending.remove(tf.boolean_mask(pending_ids, old))
        self.last_sweep.assign(step)
        return tf.size(stale, tf.int64)

    def _pending_entries(self):
        """(ids int64 `[p]`, (sightings, last step) int64 `[p, 2]`) of the pending table."""
        ids, values = self.pending.export()
        return tf.reshape(ids, [-1]), tf.reshape(values, [-1, 2])

    # -- update -----------------------------------------------------------------
    def apply_gradients(self, ids, grads, rows):
        """The optimizer's update of the rows of distinct int64 `ids` `[U]`, float32 `grads`
        `[U, dim]`, at `rows` (int64 `[U]`, the rows their `lookup` read; -1: none). A row is
        updated only if it still holds its id (an eviction since the lookup, and a row given
        to another id, are left alone): no second search of the index. Returns the op.

        adagrad: `acc += g^2; row -= lr g / sqrt(acc)`. adam (lazy, per row: t counts
        the row's own updates since its admission): `m = b1 m + (1 - b1) g;
        v = b2 v + (1 - b2) g^2; row -= lr sqrt(1 - b2^t) / (1 - b1^t) m / (sqrt(v) + eps)`
        with b1 = 0.9, b2 = 0.999, eps = 1e-8 (`optimizers.LazyAdamOptimizer`'s, whose
        t is the global count of updates instead).
        """
        return self._locked(self._apply_body, ids, grads, rows)

    def _apply_body(self, ids, grads, rows):
        # Gathers from [capacity] arrays whose live part is dense (rows go out lowest
        # first) cost less than a hash search (`Find`: ~40 % of what the dynamic tables
        # added to a step, benchmarks/NOTES.md 2026-11-29).
        safe = tf.maximum(rows, 0)
        held = tf.logical_and(rows >= 0, tf.equal(tf.gather(self.keys, safe), ids))
        held = tf.logical_and(held, tf.gather(self.last_seen, safe) >= 0)
        at = tf.where(held)[:, 0]  # the ids whose row is still theirs
        row, g = tf.gather(rows, at), tf.gather(grads, at)
        if self.optimizer == "adagrad":
            self._adagrad(row, g)
        else:
            self.rows.scatter_sub(tf.IndexedSlices(self._adam(row, g), row))
        return tf.size(row)

    def _adagrad(self, row, g):
        """acc += g^2; row -= lr g / sqrt(acc): TensorFlow's fused sparse Adagrad (one op, not
        a gather, two scatters and the arithmetic between)."""
        tf.raw_ops.ResourceSparseApplyAdagrad(
            var=self.rows.handle, accum=self.slots["accumulators"].handle,
            lr=tf.constant(self.learning_rate, tf.float32), grad=g, indices=row)

    def _adam(self, row, g, beta1=0.9, beta2=0.999, epsilon=1e-8):
        m_var, v_var, t_var = (self.slots[k] for k in ("m", "v", "updates"))
        m = beta1 * tf.gather(m_var, row) + (1 - beta1) * g
        v = beta2 * tf.gather(v_var, row) + (1 - beta2) * tf.square(g)
        t = tf.gather(t_var, row) + 1.0
        m_var.scatter_update(tf.IndexedSlices(m, row))
        v_var.scatter_update(tf.IndexedSlices(v, row))
        t_var.scatter_update(tf.IndexedSlices(t, row))
        rate = self.learning_rate * tf.sqrt(1 - tf.pow(beta2, t)) / (1 - tf.pow(beta1, t))
        return rate[:, None] * m / (tf.sqrt(v) + epsilon)

    # -- snapshot ---------------------------------------------------------------
    def size(self):
        """int64 scalar: live rows (admitted ids) of the shard."""
        with tf.device(self.device):
            return self.index.size()

    def parts(self) -> tuple:
        """The names of `export`'s parts, in order."""
        return ("keys", "rows", *self.slots, "counts", "last_seen", "pending_keys",
                "pending_values")

    def export(self):
        """One snapshot of the shard, taken under its lock: a dict of tensors.

        keys int64 `[n]`, rows float32 `[n, dim]`, the optimizer's slots (adagrad:
        accumulators `[n, dim]`; adam: m and v `[n, dim]`, updates `[n]`), counts
        and last_seen int64 `[n]` (the n live rows, in row order), pending_keys
        int64 `[p]` and pending_values int64 `[p, 2]` (sightings, last step).
        """
        return dict(zip(self.parts(), self._locked(self._export_body)))

    def _export_body(self):
        live = tf.where(self.last_seen >= 0)[:, 0]
        pending_keys, pending_values = self._pending_entries()
        per_row = [self.keys, self.rows, *self.slots.values(), self.counts, self.last_seen]
        return (*(tf.gather(v, live) for v in per_row), pending_keys, pending_values)

    def restore(self, snapshot: dict):
        """Replaces the shard's state by `snapshot` (as `export` gives), under its lock.

        The n rows go to rows 0..n-1. Returns the op. Raises (when run)
        InvalidArgumentError if n exceeds the capacity.
        """
        return self._locked(self._restore_body, *(snapshot[k] for k in self.parts()))

    def _restore_body(self, keys, *values):
        *per_row, pending_keys, pending_values = values
        n = tf.size(keys, tf.int64)
        tf.debugging.assert_less_equal(n, tf.constant(self.capacity, tf.int64),
                                       message=f"{self.scope}: snapshot over capacity")
        old_keys, _ = self.index.export()
        self.index.remove(tf.reshape(old_keys, [-1]))
        old_pending, _ = self._pending_entries()
        self.pending.remove(old_pending)
        slots = tf.range(n)
        for var, value in self._initial:  # a restore replaces the initialisation
            var.assign(tf.fill(var.shape, tf.constant(value, var.dtype)))
        # The free stack as initialised (rows capacity-1 .. 0), its top n taken: rows 0..n-1.
        self.free_rows.assign(tf.range(self.capacity - 1, -1, -1, dtype=tf.int64))
        self.free_count.assign(self.capacity - n)
        targets = [self.rows, *self.slots.values(), self.counts, self.last_seen]
        self.keys.scatter_update(tf.IndexedSlices(keys, slots))
        for var, value in zip(targets, per_row):
            var.scatter_update(tf.IndexedSlices(value, slots))
        self.index.insert(keys, slots)
        self.pending.insert(pending_keys, pending_values)
        return n


class ShardSaveable(saveable_object.SaveableObject):
    """A `DynamicShard`'s checkpoint entry: its `export` snapshot, saved and restored whole.

    Tensor names in the checkpoint: `<shard scope>/-<part>` for each part of
    `DynamicShard.export`. Restores into a shard of the same scope name (the
    same number of shards).
    """

    def __init__(self, shard: DynamicShard):
        self.shard = shard
        snapshot = shard.export()
        specs = [saveable_object.SaveSpec(t, "", f"{shard.scope}/-{k}", device=shard.device)
                 for k, t in snapshot.items()]
        self._parts = list(snapshot)
        super().__init__(snapshot["keys"], specs, shard.scope)

    def restore(self, restored_tensors, restored_shapes):
        return self.shard.restore(dict(zip(self._parts, restored_tensors)))


class DynamicTable:
    """An embedding table of raw int64 ids, sharded over ps devices (module docstring).

    Args:
      name: variable scope name.
      dim: floats per row.
      devices: one device per shard (a ps task's CPU), e.g.
        `["/job:ps/task:0", "/job:ps/task:1"]`; [None] in one process.
      capacity: rows per shard.
      learning_rate: the rows' learning rate.
      **options: `DynamicShard`'s (admit_after, evict_after_steps, sweep_every_steps,
        stddev, seed, initial_accumulator, optimizer).
    """

    def __init__(self, name: str, dim: int, devices, capacity: int, learning_rate: float,
                 **options):
        self.dim = dim
        self.shards = []
        with v1.variable_scope(name) as scope:
            scope.set_partitioner(None)  # a shard is whole: the model's partitioner is not for it
            self.name = scope.name
            for i, device in enumerate(devices):
                with tf.device(device):
                    self.shards.append(DynamicShard(f"shard{i}", dim, capacity,
                                                    learning_rate=learning_rate, **options))
            self.anchor = v1.get_variable(
                "anchor", [1], tf.float32, v1.zeros_initializer(), use_resource=True,
                collections=[v1.GraphKeys.GLOBAL_VARIABLES, v1.GraphKeys.TRAINABLE_VARIABLES,
                             embeddings.TABLES])

    @classmethod
    def get(cls, name: str, dim: int, devices, capacity: int, learning_rate: float,
            **options) -> DynamicTable:
        """The table `name` of the current variable scope in the default graph, made once.

        A model built twice in one graph (training, then evaluation) shares its
        tables, as `AUTO_REUSE` shares variables.
        """
        tables = v1.get_collection_ref(TABLE_REGISTRY)
        if not tables:
            tables.append({})
        scope = v1.get_variable_scope().name
        key = f"{scope}/{name}" if scope else name
        if key not in tables[0]:
            tables[0][key] = cls(name, dim, devices, capacity, learning_rate, **options)
        return tables[0][key]

    def lookup(self, ids, step):
        """Rows of int64 `ids` (any shape S) at global step `step` -> float32 `S + [dim]`.

        Each distinct id goes once to its shard, with its count in the batch;
        the gradient of the result updates the rows (module docstring). Within
        `reading()`: rows are only read (no sighting, admission or update).
        """
        flat = tf.reshape(ids, [-1])
        unique, index, counts = tf.unique_with_counts(flat, out_idx=tf.int64)
        n = len(self.shards)
        part = shard_of(unique, n)
        positions = tf.dynamic_partition(tf.range(tf.size(unique)), part, n)
        shard_ids = tf.dynamic_partition(unique, part, n)
        shard_counts = tf.dynamic_partition(counts, part, n)
        if _reading():
            found = [s.read(i) for s, i in zip(self.shards, shard_ids)]
            out = tf.gather(tf.dynamic_stitch(positions, found), index)
        else:
            shard_ids = [s.on_ps(i) for s, i in zip(self.shards, shard_ids)]  # sent once
            found = [s.lookup(i, c, step)
                     for s, i, c in zip(self.shards, shard_ids, shard_counts)]
            rows = self._trained(tf.dynamic_stitch(positions, [v for v, _ in found]),
                                 positions, shard_ids, [r for _, r in found])
            out = embeddings._expand(rows, index)
        return tf.reshape(out, tf.concat([tf.shape(ids), [self.dim]], axis=0))

    def _trained(self, rows, positions, shard_ids, shard_rows):
        """`rows` `[U, dim]`, whose gradient applies each shard's update (via the anchor) at
        the rows its lookup read (`shard_rows`, one int64 tensor per shard, on its ps)."""
        @tf.custom_gradient
        def trained(unique_rows, anchor):
            def grad(dy):
                updates = [s.apply_gradients(i, tf.gather(dy, p), r)
                           for s, i, p, r in zip(self.shards, shard_ids, positions,
                                                 shard_rows)]
                # made where the anchor's update runs: no zeros sent from the worker
                with tf.device(self.anchor.device), tf.control_dependencies(updates):
                    return None, tf.zeros_like(anchor)
            return tf.identity(unique_rows), grad
        return trained(rows, self.anchor.read_value() if hasattr(self.anchor, "read_value")
                       else tf.identity(self.anchor))

    def sizes(self):
        """int64 `[num_shards]`: live rows per shard."""
        return tf.stack([s.size() for s in self.shards])

    def saveables(self) -> list:
        """The shards' `ShardSaveable`s, one consistent snapshot each."""
        return [s.saveable for s in self.shards]


def variables_to_save(variables) -> list:
    """`variables` without the dynamic shards' state (their snapshots save it)."""
    state = {id(v) for v in v1.get_collection(DYNAMIC_STATE)}
    return [v for v in variables if id(v) not in state]


def saveables() -> list:
    """Every dynamic shard's `ShardSaveable` in the default graph."""
    return [s.saveable for s in v1.get_collection(SHARDS)]


@contextlib.contextmanager
def reading():
    """Within it, the default graph's dynamic tables are looked up read-only (evaluation,
    serving): no sighting is counted, no row admitted, no gradient applied."""
    flag = v1.get_collection_ref(READING)
    flag.append(True)
    try:
        yield
    finally:
        flag.pop()


def _reading() -> bool:
    return bool(v1.get_collection(READING))


@dataclasses.dataclass(frozen=True)
class Options:
    """How a model's dynamic tables are made (`--embedding=dynamic` and its flags).

    Attributes:
      ps_tasks: shards, one per ps task (`/job:ps/task:K`); 0: one shard, in-process.
      capacity: rows per shard of each table.
      admit_after, evict_after_steps: as `DynamicShard`'s; sweeps every
        max(1, evict_after_steps // 10) steps.
      learning_rate, optimizer: the rows' optimizer ("adagrad" or "adam", `SLOTS`) and
        its learning rate.
      local_shards: > 0: that many shards, all in this process (an export or evaluation
        of a checkpoint written with that many ps tasks: `shards_in`); ps_tasks unused.
    """

    ps_tasks: int
    capacity: int
    admit_after: int = 1
    evict_after_steps: int = 0
    learning_rate: float = 0.1
    optimizer: str = "adagrad"
    local_shards: int = 0

    def devices(self) -> list:
        """One device per shard."""
        if self.local_shards:
            return [None] * self.local_shards
        if not self.ps_tasks:
            return [None]
        return [f"/job:ps/task:{i}/device:CPU:0" for i in range(self.ps_tasks)]

    def table(self, name: str, dim: int, stddev: float, seed: int) -> DynamicTable:
        """The table `name` of the current scope (`DynamicTable.get`) with these options."""
        return DynamicTable.get(
            name, dim, self.devices(), self.capacity, self.learning_rate,
            admit_after=self.admit_after, evict_after_steps=self.evict_after_steps,
            sweep_every_steps=max(1, self.evict_after_steps // 10), stddev=stddev, seed=seed,
            optimizer=self.optimizer)


class FieldTables:
    """Several categorical fields' raw ids in one `DynamicTable` (as `embeddings.FieldTable`).

    Field k's id x (int64, any value; only its low 56 bits count) is the key
    `(k << 56) | (x mod 2^56)`: ids of different fields never share a row, and
    no id is folded into a bucket.

    Args:
      name, dim, stddev, seed: the table's.
      num_fields: K, the fields (< 256).
      options: an `Options`.
    """

    def __init__(self, name: str, num_fields: int, dim: int, stddev: float, seed: int,
                 options: Options):
        if not 0 < num_fields <= 1 << (64 - FIELD_BITS - 1):
            raise ValueError(f"dynamic table {name}: {num_fields} fields; at most 128")
        self.num_fields, self.dim = num_fields, dim
        self.table = options.table(name, dim, stddev, seed)

    def keys(self, ids):
        """The table's keys of int64 `ids` `[B, K]` (column k: field k) -> int64 `[B, K]`."""
        fields = tf.range(self.num_fields, dtype=tf.int64)[None, :]
        low = tf.bitwise.bitwise_and(ids, tf.constant((1 << FIELD_BITS) - 1, tf.int64))
        return tf.bitwise.bitwise_or(
            tf.bitwise.left_shift(fields, tf.constant(FIELD_BITS, tf.int64)), low)

    def lookup(self, ids):
        """Rows for int64 `ids` `[B, K]` -> float32 `[B, K, dim]`, at the graph's global step
        (0 without one)."""
        step = v1.train.get_global_step()
        step = tf.constant(0, tf.int64) if step is None else tf.convert_to_tensor(step)
        return self.table.lookup(self.keys(ids), step)


def shards_in(checkpoint_path: str) -> int:
    """The shards per dynamic table in checkpoint `checkpoint_path` (the ps tasks that wrote
    it: a shard's snapshot is `<table>/shard<K>/-keys`); 0 for a checkpoint without any.

    Raises:
      tf.errors.OpError: the checkpoint cannot be read.
    """
    found = [int(m.group(1)) for name, _ in tf.train.list_variables(checkpoint_path)
             for m in [re.search(r"/shard(\d+)/-keys$", name)] if m]
    return max(found) + 1 if found else 0


def live_rows() -> dict:
    """{shard scope: int64 scalar tensor, its live rows} of the default graph's dynamic tables."""
    return {s.scope: s.size() for s in v1.get_collection(SHARDS)}
