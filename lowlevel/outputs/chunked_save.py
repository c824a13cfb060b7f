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
    """Rows `[begin, end)` of a resource variable, as a saveable of one slice spec.

    `handle`: the variable's resource handle; `shape`: its `[rows, ...]` (fully defined);
    `spec`: the variable's `SaveSpec` (name, and slice spec if it is a shard).
    """

    def __init__(self, handle, shape: list, spec, begin: int, end: int):
        if spec.slice_spec:
            info = v1.Variable.SaveSliceInfo.from_spec(spec.slice_spec)
            full_shape, offset = info.full_shape, info.var_offset
        else:
            full_shape, offset = shape, [0] * len(shape)
        self.device = spec.device
        self.name = spec.name
        self.op = handle
        slice_spec = v1.Variable.SaveSliceInfo(
            spec.name, full_shape, [offset[0] + begin, *offset[1:]],
            [end - begin, *shape[1:]]).spec
        dtype = spec.dtype

        def read():
            with tf.device(spec.device):
                # The rows' indices are made when the save runs: Grappler would fold a
                # constant range into a Const, which its kernel keeps (1/8 of the slice's
                # bytes for 16 floats a row, for every slice, for as long as the graph runs).
                first = tf.raw_ops.PlaceholderWithDefault(
                    input=tf.constant(begin, tf.int64), shape=[])
                return tf.raw_ops.ResourceGather(
                    resource=handle, indices=tf.range(first, first + (end - begin)),
                    dtype=dtype)
        self.specs = [saveable_object.SaveSpec(read, slice_spec, spec.name, dtype=dtype,
                                               device=spec.device)]


def _slices(saveable, chunk_bytes: int) -> list:
    """`saveable` as `_RowSlice`s of at most `chunk_bytes`, or [saveable] if it stays whole.

    Only a resource variable's saveable (a `VarHandleOp` behind it) of a fully defined
    shape of rank >= 1 is sliced.
    """
    handle = getattr(saveable, "handle_op", None)
    if handle is None or len(saveable.specs) != 1 or \
            getattr(getattr(handle, "op", None), "type", None) != "VarHandleOp":
        return [saveable]
    shape = tf.TensorShape(handle.op.get_attr("shape"))
    if not shape.is_fully_defined() or not shape.rank:
        return [saveable]
    rows, row_bytes = shape[0], shape[1:].num_elements() * saveable.specs[0].dtype.size
    if rows * row_bytes <= chunk_bytes:
        return [saveable]
    step = max(1, chunk_bytes // max(1, row_bytes))
    return [_RowSlice(handle, shape.as_list(), saveable.specs[0], a, min(a + step, rows))
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
