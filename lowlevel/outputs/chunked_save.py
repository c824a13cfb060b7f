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
`tf.train.load_variable` reads the whole tensor.

Restores of the same variables are sliced too (`_restore_in_slices`): a
stock restore reads a device's variables whole, all at once, and assigns
them: a ps that survived another's restart rolls back to the checkpoint
holding its state twice (measured for 100 M rows on 2 ps: 6.5 GB of state
each, benchmarks/NOTES.md). Here each large variable is read a slice at a
time (`RestoreV2` of a slice spec: any saved slicing or partitioning) and
written into it in place (`ResourceScatterUpdate`), one slice per device at
a time; a variable not yet initialised (its ps restarted) is read whole and
adopts the restored buffer. Each ps reads only its own variables' rows.
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
        self.device = spec.device
        self.name = spec.name
        self.op = handle
        self.shape, self.begin, self.rows, self.saved_spec = shape, begin, end - begin, spec
        slice_spec = _spec_of(spec, shape, begin, end)
        dtype = spec.dtype

        def read():
            with tf.device(spec.device):
                index = tf.int32 if shape[0] < 2 ** 31 else tf.int64
                first = _opaque(handle, begin, index)
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
    index_bytes = 4 if rows < 2 ** 31 else 8  # a slice's rows and their indices fit the chunk
    step = max(1, chunk_bytes // (row_bytes + index_bytes))
    return [_RowSlice(handle, shape.as_list(), saveable.specs[0], a, min(a + step, rows))
            for a in range(0, rows, step)]


def _opaque(handle, value: int, dtype):
    """`value` (a `dtype` scalar) computed when the graph runs, from the variable's state.

    Both TensorFlow's graph optimizer (at executor creation) and Grappler fold
    a range whose bounds are constants, or `PlaceholderWithDefault`s of
    constants, into a `Const`, which the executor keeps with its `GraphDef`'s
    copy for as long as the graph runs: measured 2.2x the slices' indices
    (177 MiB after a save of a 610 MiB variable in 64 MiB slices,
    benchmarks/NOTES.md). `VarIsInitializedOp` reads the resource: nothing
    folds it (it is true whenever this runs).
    """
    known = tf.cast(tf.raw_ops.VarIsInitializedOp(resource=handle), dtype)
    return known * tf.constant(value, dtype)


def _spec_of(spec, shape: list, begin: int, end: int) -> str:
    """The slice spec of rows `[begin, end)` of a variable saved under `spec` (its `SaveSpec`)."""
    if spec.slice_spec:
        info = v1.Variable.SaveSliceInfo.from_spec(spec.slice_spec)
        full_shape, offset = info.full_shape, info.var_offset
    else:
        full_shape, offset = shape, [0] * len(shape)
    return v1.Variable.SaveSliceInfo(spec.name, full_shape, [offset[0] + begin, *offset[1:]],
                                     [end - begin, *shape[1:]]).spec


def _restore_in_slices(filename, slices: list):
    """The restore of the variable behind `_RowSlice`s `slices`; returns its last op.

    An initialised variable (a ps that survived) is overwritten a slice at a
    time, in place. One not initialised (its ps restarted) is restored whole
    and assigned: the variable adopts the restored buffer, so that costs no
    second copy either, and a restore cut short leaves it uninitialised (not
    half-restored memory a new session would take for a model).
    """
    first = slices[0]
    handle, dtype, shape = first.op, first.specs[0].dtype, first.shape

    def read(spec):
        return tf.raw_ops.RestoreV2(prefix=filename, tensor_names=[first.name],
                                    shape_and_slices=[spec], dtypes=[dtype])[0]

    def in_place():
        last = []
        for piece in slices:
            with tf.control_dependencies(last):
                begin = [piece.begin] + [0] * (len(shape) - 1)
                last = [tf.raw_ops.ResourceStridedSliceAssign(
                    ref=handle, begin=begin, end=[piece.begin + piece.rows, *shape[1:]],
                    strides=[1] * len(shape), value=read(piece.specs[0].slice_spec))]
        with tf.control_dependencies(last):
            return tf.constant(True)

    def whole():
        spec = _spec_of(first.saved_spec, shape, 0, shape[0])
        with tf.control_dependencies([tf.raw_ops.AssignVariableOp(resource=handle,
                                                                  value=read(spec))]):
            return tf.constant(True)
    return tf.cond(tf.raw_ops.VarIsInitializedOp(resource=handle), in_place, whole).op


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

    def _AddShardedRestoreOps(self, filename_tensor, per_device, restore_sequentially,
                              reshape):
        """Small saveables restored as before; large variables a slice at a time per device."""
        restores = []
        for shard, (device, saveables) in enumerate(per_device):
            whole, sliced = [], []
            for saveable in saveables:
                pieces = _slices(saveable, self.chunk_bytes)
                if pieces[0] is saveable:
                    whole.append(saveable)
                else:
                    sliced.append(pieces)
            with tf.device(device):
                last = None
                if whole:
                    last = self._AddRestoreOps(filename_tensor, whole, restore_sequentially,
                                               reshape, preferred_shard=shard,
                                               name="restore_shard")
                for pieces in sliced:
                    with tf.control_dependencies([last] if last is not None else []):
                        last = _restore_in_slices(filename_tensor, pieces)
                restores.append(last)
        return tf.group(*restores, name="restore_all")

    def save_op(self, filename_tensor, saveables):
        """One `SaveV2`, after the previous one on the same device (slices are read in turn)."""
        device = saveables[0].device if saveables else ""
        previous = self._last_save.get(device)
        with tf.control_dependencies([previous] if previous is not None else []):
            save = super().save_op(filename_tensor, saveables)
        self._last_save[device] = save
        return save
