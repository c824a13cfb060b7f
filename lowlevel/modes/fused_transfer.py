"""The fused transfer: a model's small variables read in one tensor per ps, their gradients
pushed in one.

Each tensor that crosses between a worker and a ps is one `RecvTensor` RPC, and
with every core busy each RPC's fixed CPU cost counts whatever its size
(`lowlevel.modes.exact`). It is done to the step once it is built, without
changing how the model was written: an Estimator `model_fn`'s and a
built-in model's alike (`lowlevel.runtime.step`, in `lowlevel.runtime.graph`).

- `fuse_reads`: per ps, one flat read of the small variables the worker reads,
  split on the worker; every op on the worker that consumed a read of one of
  them now consumes its slice of that split. Values are the same, so the
  gradients the model already built (whose ops consume the same reads) are
  too.
- `fuse_gradients`: per ps, the small dense gradients concatenated on the worker
  and split on the ps, before the optimizer's apply (a model_fn's `grads_and_vars`
  from `optimizer_capture`); a gradient computed on its variable's ps stays there.

- `share_reads`: for a model built once per device (`lowlevel.modes.towers`),
  every other variable's worker-side reads moved to one read per step, held on
  the worker's CPU for all its towers.

What keeps its classic reads (one RPC each; logged once per graph): a read
inside a `tf.while_loop` or `tf.cond`, a read ordered by a control dependency
(it must see its predecessor's effect; the step's own wait, `fuse_reads`' `after`,
moves with it), a reference (non-resource) variable,
a variable of `SMALL_BYTES` or more, and a ps holding a single small variable.

Rewiring a consumer uses `tf.Operation._update_input` (TensorFlow's
`UpdateEdge`, what `tf.contrib.graph_editor` used): the one reach into
TensorFlow's private state here, besides `sessions.live_session`; tests
(`tests/test_fused_transfer.py`) build and run a rewired graph, so a TensorFlow
that drops it fails them, not a user's run.
"""

from __future__ import annotations

import collections

import tensorflow as tf
from absl import logging

from lowlevel.modes.exact import is_small

v1 = tf.compat.v1


def fuse_reads(graph: tf.Graph, variables, worker_device: str, after=()) -> list:
    """Rewires the worker's reads of the small `variables` to one flat read per ps.

    Args:
      graph: the built training graph (the model's ops in it).
      variables: candidate variables (the model's trainable ones).
      worker_device: where the flat reads are split, e.g. "/job:worker/task:0/device:CPU:0".
      after: tensors every read of the step was built to wait for
        (`tf.control_dependencies`; the data queue's sync reads global_step before every
        parameter, `lowlevel.modes.elastic_sync`): a read under no other control
        dependency may move, and the flat read waits for them too.
    Returns:
      The variables whose worker-side reads now come from a fused read.
    """
    reads, waits = _resource_reads(graph), {t.op for t in after}
    groups, kept = collections.defaultdict(list), []
    for v in variables:
        consumers = _worker_consumers(v, reads.get(id(_handle_op(v)), []), waits)
        if consumers is None:
            kept.append(v)
        elif consumers and is_small(v):
            groups[(v.device, v.dtype.base_dtype)].append((v, consumers))
    fused, reads = [], 0
    for (device, _), members in groups.items():
        if len(members) < 2:
            kept.extend(v for v, _ in members)
            continue
        _rewire(members, device, worker_device, after)
        fused.extend(v for v, _ in members)
        reads += 1
    if fused:
        logging.info("fused transfer: %d small variables read in %d tensor(s), one per ps",
                     len(fused), reads)
    if kept:
        logging.info("fused transfer: %d variable(s) keep their classic reads (a read in a "
                     "control-flow context or under a control dependency, a reference "
                     "variable, or alone on its ps): %s", len(kept),
                     ", ".join(sorted(v.op.name for v in kept)[:8]))
    return fused


def share_reads(graph: tf.Graph, variables, hub: str) -> list:
    """Rewires the worker's reads of each of `variables` to one read per step, held on `hub`.

    For a model built once per device (`lowlevel.modes.towers`): each tower's ops
    (its backward pass's included) read a variable through their own read, one
    crossing from the ps per device; after this they consume one read's copy on
    `hub`, the worker's CPU, and the crossing is one. Reads that cannot move stay
    (as in `fuse_reads`); call it after `fuse_reads`, for the variables it left.

    Returns:
      The variables whose worker-side reads now come from the one copy.
    """
    reads, shared = _resource_reads(graph), []
    for v in variables:
        consumers = _worker_consumers(v, reads.get(id(_handle_op(v)), []))
        if not consumers:
            continue
        with tf.device(v.device):
            value = v.read_value()
        with tf.device(hub):
            copy = tf.identity(value, name=f"{v.op.name}/tower_copy")
        for op, index in consumers:
            op._update_input(index, copy)  # pylint: disable=protected-access
        shared.append(v)
    return shared


def fuse_gradients(grads_and_vars, worker_device: str) -> list:
    """`grads_and_vars` with the small dense gradients sent to each ps as one tensor.

    Args:
      grads_and_vars: [(gradient, variable)] as `Optimizer.compute_gradients` gives them;
        a gradient may be None or `tf.IndexedSlices` (left as it is).
      worker_device: where the gradients are concatenated.
    Returns:
      The pairs in the same order; a fused pair's gradient is its slice of the flat
      tensor, split on the variable's ps (same shape and dtype). A gradient computed on
      its variable's task already (a layer's backward on the ps,
      `lowlevel.modes.ps_products`) is left where it is.
    """
    pairs = list(grads_and_vars)
    groups = collections.defaultdict(list)  # (ps device, dtype) -> [index in pairs]
    for i, (g, v) in enumerate(pairs):
        if (isinstance(g, tf.Tensor) and is_small(v) and g.shape.is_fully_defined()
                and not _at_home(g, v)):
            groups[(v.device, g.dtype.base_dtype)].append(i)
    for (device, _), indices in groups.items():
        if len(indices) < 2:
            continue
        with tf.device(worker_device):
            flat = tf.concat([tf.reshape(pairs[i][0], [-1]) for i in indices], 0)
        with tf.device(device):
            pieces = tf.split(flat, [pairs[i][1].shape.num_elements() for i in indices])
            for i, piece in zip(indices, pieces):
                pairs[i] = (tf.reshape(piece, pairs[i][1].shape), pairs[i][1])
    return pairs


def _at_home(gradient, v) -> bool:
    """Whether `gradient` is computed on the task that holds `v` (it then never crosses)."""
    return bool(gradient.device and v.device) and _task(gradient.device) == _task(v.device)


def _handle_op(v):
    handle = getattr(v, "handle", None)
    return handle.op if handle is not None else None


def _resource_reads(graph: tf.Graph) -> dict:
    """{id(VarHandleOp): [its ReadVariableOps]} over the graph."""
    out = collections.defaultdict(list)
    for op in graph.get_operations():
        if op.type == "ReadVariableOp":
            out[id(op.inputs[0].op)].append(op)
    return out


def _worker_consumers(v, reads, waits=frozenset()):
    """[(consumer op, input index)] on another task than `v`'s that read `v`; None when a
    read cannot move (a reference variable, a read in control flow or after a control
    dependency other than `waits`' ops, a consumer in control flow)."""
    if _handle_op(v) is None or not v.device:
        return None
    home = _task(v.device)
    out = []
    for read in reads:
        remote = [(c, i) for c in read.outputs[0].consumers()
                  for i, t in enumerate(c.inputs) if t is read.outputs[0] and _remote(c, home)]
        if not remote:
            continue
        if set(read.control_inputs) - waits or _in_control_flow(read) or any(
                _in_control_flow(c) for c, _ in remote):
            return None
        out.extend(remote)
    return out


def _task(device: str):
    spec = tf.DeviceSpec.from_string(device)
    return spec.job, spec.replica or 0, spec.task


def _remote(op, home) -> bool:
    """Whether `op` runs on another task than `home`: its device names one, and it takes
    no resource (an op taking a resource runs where the resource lives)."""
    if not op.device or _task(op.device) == home:
        return False
    return not any(t.dtype == tf.resource for t in op.inputs)


def _in_control_flow(op) -> bool:
    return getattr(op, "_control_flow_context", None) is not None


def _rewire(members, device: str, worker_device: str, after=()) -> None:
    """One flat read of `members`' variables on `device` (after `after`), split on
    `worker_device`; each consumer's input moved to its variable's slice."""
    variables = [v for v, _ in members]
    with tf.device(device), tf.control_dependencies(list(after)):
        flat = tf.concat([tf.reshape(v.read_value(), [-1]) for v in variables], 0)
    with tf.device(worker_device):
        pieces = tf.split(flat, [v.shape.num_elements() for v in variables])
        values = [tf.reshape(p, v.shape) for p, v in zip(pieces, variables)]
    for (_, consumers), value in zip(members, values):
        for op, index in consumers:
            op._update_input(index, value)  # pylint: disable=protected-access
