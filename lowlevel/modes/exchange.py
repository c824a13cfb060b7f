"""The exchanges of the communication-reduced mode, between a worker's copies and the ps.

`lowlevel.modes.local_sgd` says what the mode computes and trades; this module builds
how the copies meet the ps variables: the async exchange (push the delta, pull
the result, merged later), the sync exchange (model averaging through
`SyncReplicasOptimizer`), the claim of a block of steps, and the reads and
splits of variables sharded over the ps tasks.
"""

from __future__ import annotations

import tensorflow as tf

from lowlevel.modes import packing as packing_lib

v1 = tf.compat.v1


def async_exchange(copies: list, device: str):
    """The async exchange of every copy with the ps tasks, one transfer each way per ps task.

    A model has a few variables per layer, and each transfer through gRPC
    costs CPU time of its own on both sides, whatever its size: the deltas
    bound for one ps task are packed into one flat tensor, and what comes
    back into another (`lowlevel.modes.packing`). On a 2-core machine the exchange's
    CPU time comes out of the local steps it overlaps, so it is what the mode
    costs (benchmarks/NOTES.md). The snapshot of each copy is read once: the
    delta pushed is snapshot - anchor, and what the merge adds later is
    pulled - snapshot, so no step taken meanwhile is lost or counted twice.

    Args:
      copies: the `local_sgd.Copy` of each trainable variable.
      device: the worker's device, where the copies are.

    Returns:
      (send, merge, resync): the ops `local_sgd.LocalSGDOps` describes.
    """
    packing = packing_lib.Packing(device)
    snapshots = []
    for c in copies:
        with tf.device(device):
            snapshot = c.copy.read_value()
            delta = snapshot - c.anchor.read_value()
        snapshots.append(snapshot)
        packing.add(split(delta, c.shards), c.shards)
    pulled = packing.exchange()
    sent, merged, resynced = [], [], []
    for c, snapshot, pieces in zip(copies, snapshots, pulled):
        now = pull(c.shards, device)
        with tf.device(device):
            fresh = pieces[0] if len(pieces) == 1 else tf.concat(pieces, axis=0)
            sent += [c.diff.assign(fresh - snapshot, read_value=False),
                     c.anchor.assign(fresh, read_value=False)]
            merged.append(c.copy.assign_add(c.diff.read_value(), read_value=False))
            resynced += [c.copy.assign(now, read_value=False),
                         c.anchor.assign(now, read_value=False)]
    return tf.group(sent), tf.group(merged), tf.group(resynced)


def sync_exchange(copies: list, device: str, global_step, period: int, last_step: int,
                  replicas: int, total: int):
    """The sync exchange: push -delta, wait for the round's average, pull it.

    Each worker's -delta goes through a `SyncReplicasOptimizer` as if it were a
    gradient (`replicas` of `total` workers aggregated; the others are backups).

    Returns:
      (exchange: int64 `[2]`, the next round as `next_round`, after the
      copies and anchors took the average; the `SyncReplicasOptimizer`).
    """
    sync_opt = v1.train.SyncReplicasOptimizer(
        AverageOptimizer(period, last_step), replicas_to_aggregate=replicas,
        total_num_replicas=total)
    negated = []
    for c in copies:
        with tf.device(device):
            delta = c.copy.read_value() - c.anchor.read_value()
            negated += [(-piece, shard) for piece, shard in zip(split(delta, c.shards),
                                                                 c.shards)]
    pushed = sync_opt.apply_gradients(negated, global_step=global_step)
    updates = []
    with tf.control_dependencies([pushed]):
        for c in copies:
            average = pull(c.shards, device)
            with tf.device(device):
                updates += [c.copy.assign(average, read_value=False),
                            c.anchor.assign(average, read_value=False)]
    with tf.control_dependencies(updates):
        return next_round(global_step, period, last_step), sync_opt


def claim(global_step, period: int, last_step: int):
    """int64 `[2]`: (start, n) — reserves the next n = min(period, last_step - start) steps.

    Runs in a `tf.CriticalSection` on global_step's device, shared by name by
    every worker's graph, so two claims never overlap.
    """
    with tf.device(global_step.device):
        section = tf.CriticalSection(name="claim_steps", shared_name="lowlevel_claim_steps")

        def reserve():
            start = global_step.read_value()
            n = steps_left(start, period, last_step)
            with tf.control_dependencies([global_step.assign_add(n, read_value=False)]):
                return tf.stack([start, n])

        return section.execute(reserve)


def steps_left(start, period: int, last_step: int):
    """int64 scalar: the steps of a block claimed at global step `start` (int64 scalar):
    `period`, fewer at the end, 0 past `last_step`."""
    return tf.maximum(tf.minimum(tf.constant(period, tf.int64), last_step - start), 0)


def next_round(global_step, period: int, last_step: int):
    """Sync: int64 `[2]`: (global step, steps in the next round); only the sync loop moves it."""
    with tf.device(global_step.device):
        start = global_step.read_value()
        return tf.stack([start, steps_left(start, period, last_step)])


class AverageOptimizer(v1.train.GradientDescentOptimizer):
    """Applies the averaged -delta at rate 1 and moves global_step by the round's local steps."""

    def __init__(self, period: int, last_step: int):
        super().__init__(1.0, name="ModelAverage")
        self._period, self._last_step = period, last_step

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        update = super().apply_gradients(grads_and_vars, name=name)
        with tf.control_dependencies([update]):
            steps = steps_left(global_step.read_value(), self._period, self._last_step)
            return global_step.assign_add(steps, read_value=False)


def shards_of(var) -> list:
    """The shards of a sharded (`PartitionedVariable`) variable, in order; [var] otherwise."""
    shards = getattr(var, "_get_variable_list", None)  # no public name for the class
    return list(shards()) if shards else [var]


def pull(shards: list, device: str):
    """The whole value of a (sharded) variable, read beside each shard, joined on `device`."""
    reads = []
    for shard in shards:
        with tf.device(shard.device):
            reads.append(shard.read_value())
    if len(reads) == 1:
        return reads[0]
    with tf.device(device):
        return tf.concat(reads, axis=0)


def split(value, shards: list) -> list:
    """`value` cut along axis 0 as the shards are."""
    if len(shards) == 1:
        return [value]
    return tf.split(value, [s.shape[0] for s in shards], axis=0)
