"""Towers: N replicas of a worker's step, one per device, and one push per ps per step.

The classic multi-GPU trainer's answer to a worker with several devices (the
CIFAR-10 multi-GPU tutorial's `cifar10_multi_gpu_train.py`, tensor2tensor's data
parallelism, `tf.contrib.estimator.replicate_model_fn`): the worker reads
`towers x batch_size` examples, splits them into `towers` batches of
`batch_size`, and builds the model once per device on its own batch. The
towers share the variables:

- every parameter crosses from its ps once per step, onto the worker's hub
  device (its CPU), and each tower takes the hub's copy: a device-to-device
  copy inside the process, not a second read from the ps (the small variables
  in their fused reads, the others by one shared read each: both by
  `lowlevel.modes.fused_transfer`, once the towers are built);
- the towers' gradients are summed on the worker and scaled by 1/towers, and
  pushed once per ps per step: the step is the one a single
  device would take on the whole `towers x batch_size` batch, and the bytes
  per example on the wire are 1/towers of a one-device worker's.

A user's model_fn gets the same through `lowlevel.runtime.step`: called once
per tower (variables reused), each tower's `minimize` captured, their gradients
averaged (`average`) and applied once; its reads shared the same way. There the input_fn's batch is the
worker's, split among the towers, as `replicate_model_fn` did.

Embedding tables are the exception: a tower looks up its own rows on the ps
(the lookup moves only the rows); the towers' sparse gradients are concatenated
on the worker into one update.

Each tower's backward pass runs on its device (`gradients`).
With no GPU, the towers are logical CPU devices of the worker's server
(`lowlevel.runtime.server.session_config`'s `cpu_devices`): the same graph,
the same bytes, for tests and for measuring on any machine.
"""

from __future__ import annotations

from typing import Callable, Sequence

import tensorflow as tf


v1 = tf.compat.v1


# The ops `replica_device_setter` puts on the ps tasks (TensorFlow's STANDARD_PS_OPS).
PS_OPS = frozenset((
    "Variable", "VariableV2", "AutoReloadVariable", "MutableHashTable", "MutableHashTableV2",
    "MutableHashTableOfTensors", "MutableHashTableOfTensorsV2", "MutableDenseHashTable",
    "MutableDenseHashTableV2", "VarHandleOp", "BoostedTreesEnsembleResourceHandleOp",
    "BoostedTreesQuantileStreamResourceHandleOp", "ResourceConditionalAccumulator",
    "DecisionTreeResource"))


def compute_on(device: str):
    """A device function for `tf.compat.v1.device` inside `replica_device_setter`'s: every
    op on `device`, but an op an inner scope placed already (the update's ops on the ps) and
    the ps ops (a variable a tower creates), which the outer setter places.

    (A plain `tf.device(device)` there would pin a variable made inside it to the worker:
    `replica_device_setter` keeps an op's device when it names another job.)
    """
    def device_function(op):
        return op.device if op.device or op.type in PS_OPS else device
    return device_function


def split(inputs, towers: int) -> list:
    """`towers` copies of the structure `inputs` (tensors, tuples, dicts of features):
    tower i's slice of every tensor along dimension 0.

    Raises:
      tf.errors.InvalidArgumentError (when run): a batch that does not divide by `towers`.
    """
    pieces = [tf.split(t, towers, axis=0) for t in tf.nest.flatten(inputs)]
    return [tf.nest.pack_sequence_as(inputs, [p[i] for p in pieces]) for i in range(towers)]


def build(model: Callable, inputs: Sequence[tf.Tensor], devices: Sequence[str]) -> list:
    """[model(*tower_inputs)] with tower i's ops on `devices[i]`, variables reused.

    `model` builds one tower from its slice of `inputs` (`split`) and returns
    what the step needs of it (a loss, logits, ...).
    """
    results = []
    for i, (device, tower_inputs) in enumerate(zip(devices, split(inputs, len(devices)))):
        with v1.device(compute_on(device)), v1.name_scope(f"tower_{i}"):
            results.append(model(*tower_inputs))
    return results


def gradients(losses: Sequence[tf.Tensor], xs: list, devices: Sequence[str],
              hub: str) -> list:
    """The gradients of the mean of the towers' `losses` for `xs` (variables or tensors),
    each tower's backward pass on its device, averaged on `hub` (`average`). None where
    no tower's loss depends on x."""
    per_tower = []
    for loss, device in zip(losses, devices):
        with tf.device(device):
            per_tower.append(tf.gradients(loss, xs))
    return average(per_tower, hub)


def average(per_tower: Sequence[list], hub: str) -> list:
    """The towers' gradients, position by position, summed on `hub` and scaled by 1/towers.

    With equal batches and a loss that is a mean over the batch, that is the
    gradient of the whole batch's mean loss (as `tf.contrib.estimator.replicate_model_fn`
    averaged by default). An embedding table's sparse gradients (`tf.IndexedSlices`)
    are concatenated, not added: one sparse update of the rows every tower looked
    up. None where every tower's is None.
    """
    scale = 1.0 / len(per_tower)
    out = []
    with tf.device(hub):
        for grads in zip(*per_tower):
            grads = [g for g in grads if g is not None]
            if not grads:
                out.append(None)
            elif any(isinstance(g, tf.IndexedSlices) for g in grads):
                rows = _concat_slices(grads)
                out.append(tf.IndexedSlices(rows.values * scale, rows.indices,
                                            rows.dense_shape))
            else:
                out.append(tf.add_n(grads) * scale)
    return out


def _concat_slices(grads: list) -> tf.IndexedSlices:
    """Sparse gradients (or dense ones, as every row) of one variable, as one IndexedSlices."""
    slices = [g if isinstance(g, tf.IndexedSlices) else
              tf.IndexedSlices(g, tf.range(tf.shape(g, out_type=tf.int64)[0]),
                               tf.shape(g, out_type=tf.int64)) for g in grads]
    return tf.IndexedSlices(tf.concat([s.values for s in slices], 0),
                            tf.concat([tf.cast(s.indices, tf.int64) for s in slices], 0),
                            slices[0].dense_shape)


def mean(values: Sequence[tf.Tensor], hub: str) -> tf.Tensor:
    """The towers' float scalars averaged on `hub`: the loss of the whole worker batch
    (every tower's batch is the same size)."""
    with tf.device(hub):
        return tf.add_n(list(values)) / float(len(values))
