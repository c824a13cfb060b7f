"""Many tensors bound for the same ps task, moved as one tensor each way.

Each tensor that crosses between tasks is its own gRPC transfer, with a CPU
cost on both sides of its own whatever its size (framing, a `RecvTensor`
call, copies). The communication-reduced mode's exchange moves every model
variable to the ps and back; packing the pieces bound for one ps task into
one flat tensor cut the CPU time (worker + ps) of pushing and pulling the
784-512-512-10 MLP's 6 variables from 10.1-12.7 to 9.3-9.4 ms (benchmarks/NOTES.md,
2026-11-24).
"""

from __future__ import annotations

import tensorflow as tf


class Packing:
    """Pieces bound for the ps tasks, packed per ps task into one transfer each way.

    `add` registers a variable's pieces (worker-side tensors, one per shard);
    `exchange` adds each piece to its shard on the shard's ps task and returns,
    per variable, the shards' values after all of that ps task's additions,
    back on `device`: a list of tensors, one per shard, in `add` order.
    """

    def __init__(self, device: str):
        self.device = device
        self.by_ps: dict[str, list] = {}  # ps device -> [(piece, shard, (variable, shard index))]
        self.count = 0

    def add(self, pieces: list, shards: list) -> None:
        """Registers one variable: `pieces[i]` (float32, `shards[i]`'s shape) goes to
        `shards[i]`."""
        for i, (piece, shard) in enumerate(zip(pieces, shards)):
            self.by_ps.setdefault(shard.device, []).append((piece, shard, (self.count, i)))
        self.count += 1

    def exchange(self) -> list:
        """Builds the transfers: per ps task, one flat float32 tensor there and one back.

        Returns:
          per `add` call, in order: the list of its shards' values (on `device`,
          each of its shard's shape) read after that ps task applied every piece.
        """
        out = [{} for _ in range(self.count)]
        for ps_device, items in self.by_ps.items():
            sizes = [s.shape.num_elements() for _, s, _ in items]
            with tf.device(self.device):
                flat = _flat([piece for piece, _, _ in items])
            with tf.device(ps_device):
                added = [shard.assign_add(tf.reshape(part, shard.shape), read_value=False)
                         for part, (_, shard, _) in zip(_parts(flat, sizes), items)]
                with tf.control_dependencies(added):
                    back = _flat([shard.read_value() for _, shard, _ in items])
            with tf.device(self.device):
                for part, (_, shard, (v, i)) in zip(_parts(back, sizes), items):
                    out[v][i] = tf.reshape(part, shard.shape)
        return [[pieces[i] for i in sorted(pieces)] for pieces in out]


def _flat(tensors: list):
    """float32 `[sum of sizes]`: `tensors` flattened and joined (the one tensor as is)."""
    flat = [tf.reshape(t, [-1]) for t in tensors]
    return flat[0] if len(flat) == 1 else tf.concat(flat, axis=0)


def _parts(flat, sizes: list) -> list:
    return [flat] if len(sizes) == 1 else tf.split(flat, sizes)
