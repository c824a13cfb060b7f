"""Saving large resource variables a slice at a time, without a full-size copy.

TensorFlow 2.21's `Saver` reads each resource variable with
`read_value_no_copy`, whose `DisableCopyOnRead` op nothing in a TF1 graph
depends on, so it never runs: a variable that has had a sparse update (an
embedding table, its Adagrad accumulator) is in copy-on-read mode, and the
save's `ReadVariableOp` copies it whole. Measured on a ps of the sparse
benchmark (10 M rows x 16 on 2 ps, benchmarks/NOTES.md): each save added one
full copy of the 305 MiB table shard and one of its accumulator, 610 MiB
above the 648 MiB of state. Disabling copy-on-read would not help while
training runs: the next sparse update then copies the variable instead
(copy-on-write).

`ChunkedSaverBuilder` saves every variable above `chunk_bytes` as slices of
at most `chunk_bytes` (rows `[a, b)` read by `ResourceGather`, which copies only
those rows), one `SaveV2` per slice into its own part file, each after the
one before on the same device: a save holds at most one slice per device.
The checkpoint is the usual V2 bundle (`MergeV2Checkpoints` joins the parts;
a variable's slices carry their slice specs, as a partitioned variable's
shards do), so it restores as before, with any partitioning, and
`tf.train.load_variable` reads the whole tensor. Restores are unchanged.
"""

from __future__ import annotations

import tensorflow as tf

# No public API holds a Saver's builder or a SaveSpec in TensorFlow 2 (tf.compat.v1.train.Saver
# takes `builder=` all the same); both are as in 2.21.
from tensorflow.python.training import saver as saver_lib
from tensorflow.python.training.saving import saveable_object

v1 = tf.compat.v1

CHUNK_BYTES = 64 << 20  # a saved slice: at most this many bytes (one row if rows are larger)


class _RowSlice:
    """Rows `[begin, end)` of a resource variable, as a saveable of one slice spec."""

    def __init__(self, variable, spec, begin: int, end: int):
        info = getattr(variable, "_save_slice_info", None)
        shape = variable.shape.as_list()
        if info is not None:
            full_name, full_shape, offset = info.full_name, info.full_shape, info.var_offset
        else:
            full_name, full_shape, offset = spec.name, shape, [0] * len(shape)
        self.device = variable.device
        self.name = spec.name
        self.op = variable
        row = [offset[0] + begin, *offset[1:]]
        slice_spec = v1.Variable.SaveSliceInfo(full_name, full_shape, row,
                                               [end - begin, *shape[1:]]).spec
        handle, dtype = variable.handle, variable.dtype.base_dtype

        def read():
            with tf.device(variable.device):
                return tf.raw_ops.ResourceGather(
                    resource=handle, indices=tf.range(begin, end, dtype=tf.int64),
                    dtype=dtype)
        self.specs = [saveable_object.SaveSpec(read, slice_spec, spec.name,
                                                            dtype=dtype, device=self.device)]


def _slices(saveable, chunk_bytes: int) -> list:
    """`saveable` as `_RowSlice`s of at most `chunk_bytes`, or [saveable] if it stays whole."""
    variable = saveable.op
    if not (hasattr(variable, "handle") and len(saveable.specs) == 1 and
            variable.shape.is_fully_defined() and variable.shape.rank):
        return [saveable]
    rows = variable.shape[0]
    row_bytes = variable.shape[1:].num_elements() * variable.dtype.base_dtype.size
    if rows * row_bytes <= chunk_bytes:
        return [saveable]
    step = max(1, chunk_bytes // max(1, row_bytes))
    return [_RowSlice(variable, saveable.specs[0], a, min(a + step, rows))
            for a in range(0, rows, step)]


class ChunkedSaverBuilder(saver_lib.BulkSaverBuilder):
    """A `SaverBuilder` whose sharded V2 saves write large variables a slice at a time.

    Args:
      chunk_bytes: the largest slice saved at once (bytes); variables up to it
        are saved whole, in one part file per device as before.
    """

    def __init__(self, chunk_bytes: int = CHUNK_BYTES):
        super().__init__()
        self.chunk_bytes = chunk_bytes
        self._last_save: dict = {}

    def _AddShardedSaveOpsForV2(self, checkpoint_prefix, per_device):
        parts = []
        for device, saveables in per_device:
            whole, sliced = [], []
            for saveable in saveables:
                pieces = _slices(saveable, self.chunk_bytes)
                (sliced if pieces[0] is not saveable else whole).extend(pieces)
            parts += [(device, whole)] if whole else []
            parts += [(device, [piece]) for piece in sliced]
        self._last_save = {}
        return super()._AddShardedSaveOpsForV2(checkpoint_prefix, parts)

    def save_op(self, filename_tensor, saveables):
        """One `SaveV2`, after the previous one on the same device (slices are read in turn)."""
        device = saveables[0].device if saveables else ""
        previous = self._last_save.get(device)
        with tf.control_dependencies([previous] if previous is not None else []):
            save = super().save_op(filename_tensor, saveables)
        self._last_save[device] = save
        return save
