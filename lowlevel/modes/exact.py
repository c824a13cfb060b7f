"""The exact training step: every step reads the parameters and pushes its gradients.

Three things make it cheaper than the textbook step without changing a number
it computes:

- Small variables travel together. Each tensor that crosses between a worker
  and a ps is one `RecvTensor` RPC, and with every core busy (1 ps + 2 workers
  on 2 cores) each RPC's fixed CPU cost counts, whatever its size: the MLP's
  biases and last kernel are 4 of its 6 tensors but 1 % of its bytes. The
  variables under `SMALL_BYTES` on a ps are read there as one flat tensor,
  split on the worker, and their gradients go back as one flat tensor, split
  on the ps (`lowlevel.modes.fused_transfer`, applied to the built step of a
  built-in model and of a model_fn alike). (Fusing the large kernels as well
  only adds copies: measured, benchmarks/NOTES.md.)
- Large kernels move less: `lowlevel.modes.ps_products` computes a dense layer's
  weight gradient, and the first layer's forward product, on the kernel's ps
  when that moves fewer bytes than the kernel does.
- The async step reserves its number first (`counted_update`), so a run ends
  at exactly `--train_steps`, and its result and the optimizer's constants
  live on global_step's ps (no learning rate sent to the ps every step).
"""

from __future__ import annotations

from typing import Optional

import tensorflow as tf

v1 = tf.compat.v1

SMALL_BYTES = 64 << 10  # below this a variable's transfer costs its RPC, not its bytes


def counted_update(opt, grads_and_vars, global_step, last_step: int,
                   collection: Optional[str] = None, span=None):
    """An async training step that stops global_step at exactly `last_step`.

    The step reserves its number first with `CountUpTo` (one atomic op on
    global_step's ps: returns the old value and adds 1, or fails with
    `OutOfRangeError` once the value is `last_step`), and its gradients are
    applied only after that. Each step number up to `last_step` is taken by
    exactly one worker, so the run ends at exactly `last_step`; with
    `minimize(global_step=...)` every worker that read the step before the end
    applies its update and the step overshoots by up to (workers - 1).

    Args:
      global_step: an integer variable (resource or not), on a ps.
      collection: a graph collection the `CountUpTo` op is added to, or None.
      span: the batch's place in the data queue (`lowlevel.data.spans.SpanInput`), or
        None: its `guard()` runs before the step reserves its number (a refused batch
        reserves nothing), its `commit()` after the update.

    Returns:
      scalar of global_step's dtype: this step's number (the global step after it).
      Running it raises `tf.errors.OutOfRangeError` when no step is left.
    """
    guard = [span.guard()] if span is not None else []
    with tf.device(global_step.device), tf.control_dependencies(guard):
        if hasattr(global_step, "handle"):
            previous = tf.raw_ops.ResourceCountUpTo(
                resource=global_step.handle, limit=last_step, T=global_step.dtype.base_dtype)
        else:  # a reference variable (TF1's default, v2 behaviour disabled)
            previous = v1.count_up_to(global_step, last_step)
    if collection is not None:
        v1.add_to_collection(collection, previous.op)
    gated = []
    for g, v in grads_and_vars:  # the gate sits beside the variable: no extra round trip
        with tf.device(v.device), tf.control_dependencies([previous]):
            gated.append((tf.identity(g), v))
    # On global_step's ps: the optimizer's constants (its learning rate would
    # otherwise be sent from the worker to the ps every step) and the step's
    # result (one 8-byte fetch, instead of a fetch and a control message).
    with tf.device(global_step.device):
        update = opt.apply_gradients(gated)
        with tf.control_dependencies([update]):
            done = [span.commit()] if span is not None else []
        with tf.control_dependencies([update] + done):
            return previous + 1


def is_small(v) -> bool:
    """Whether variable `v` travels fused: whole (not a partition's shard), of known shape,
    under `SMALL_BYTES`."""
    whole = getattr(v, "_save_slice_info", None) is None
    return (whole and v.shape.is_fully_defined() and
            v.shape.num_elements() * v.dtype.base_dtype.size < SMALL_BYTES)
