"""A model_fn's optimizer, taken over while the model_fn builds its train_op.

An Estimator `model_fn` builds its own `train_op`, usually
`optimizer.minimize(loss, global_step=tf.compat.v1.train.get_global_step())`.
Run as it is between workers, that step is the textbook one: each worker
reads global_step before applying its update, and an async run overshoots its
last step by up to (workers - 1) steps. Inside `capture`, the apply of every
`tf.compat.v1.train.Optimizer` (`apply_gradients`, which `minimize` calls) that
is given the run's global step is handed to the runtime's `update` instead:
the exact mode's counted update (`exact.counted_update`: the step reserves its
number on global_step's ps first, then applies), which ends the run at exactly
the last step. The model_fn sees the op it would have got; nothing in it
changes.

A `tf.compat.v1.train.SyncReplicasOptimizer` the model_fn wraps its optimizer
in keeps its own apply (its inner optimizer's apply, made by the chief's sync
op, is left alone); its `make_session_run_hook` returns the runtime's hook
(`sync_hook`), whose chief loop stops at the last step instead of hanging in the
ps's accumulators (tensorflow/tensorflow#7970).

How the gradients are built (`compute_gradients`, which `minimize` calls): ungated
(`gate_gradients=GATE_NONE`, as TF2's `tf.gradients` builds them; `minimize`'s default is
GATE_OP) when every variable is a resource variable. GATE_OP makes each op's gradients
wait for one another before any is used: a guard for reference variables, which an update
may change in place under a gradient still reading them, where a resource variable is
copied first. It costs a step a wait across tasks when an op's gradients are computed on
two of them (a layer's weight gradient on the ps, `lowlevel.modes.ps_products`). With
`colocate_gradients`, each gradient op beside its forward op
(`colocate_gradients_with_ops=True`, what `tf.gradients` always does; `minimize` passes
False): the backward pass of a layer computed on a ps stays there. Values are the same
either way; only devices and the order of independent ops change.

The patch is on the classes, for the duration of the `with` block, in the
building thread (graph building is single-threaded). Optimizers that are not
`tf.compat.v1.train.Optimizer`s (Keras' `tf.keras.optimizers`) are not taken
over: their step is run as the model_fn built it (`Captured.step` stays None).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Callable, Optional

import tensorflow as tf

v1 = tf.compat.v1


@dataclasses.dataclass
class Captured:
    """What the model_fn's optimizer did inside `capture`.

    Attributes:
      step: int64 scalar, the global step after this step's update, when the
        runtime's `update` made the step (None: the model's own step ran).
      sync_optimizer: the `SyncReplicasOptimizer` the model_fn applied, or None.
      loss: the loss its optimizer differentiated (`compute_gradients`), or None.
      applies: how many applies were taken over.
      other_applies: how many applies were built as the model_fn asked (no global step,
        or inside a sync optimizer's).
    """

    step: Optional[object] = None
    sync_optimizer: Optional[object] = None
    loss: Optional[object] = None
    applies: int = 0
    other_applies: int = 0


_inside_sync = threading.local()  # set while SyncReplicasOptimizer.apply_gradients runs


def inside_sync() -> bool:
    """Whether this thread is inside a `SyncReplicasOptimizer.apply_gradients` made by
    `marking_sync_apply` (building the inner optimizer's apply, which is left alone)."""
    return getattr(_inside_sync, "on", False)


def marking_sync_apply(own_sync_apply: Callable, on_apply: Callable) -> Callable:
    """`SyncReplicasOptimizer.apply_gradients` (TensorFlow's own: `own_sync_apply`) that
    first calls `on_apply(sync_optimizer, global_step)`, then builds TensorFlow's apply
    with `inside_sync()` true."""
    def sync_apply_gradients(self, grads_and_vars, global_step=None, name=None):
        on_apply(self, global_step)
        _inside_sync.on = True
        try:
            return own_sync_apply(self, grads_and_vars, global_step, name)
        finally:
            _inside_sync.on = False
    return sync_apply_gradients


@contextlib.contextmanager
def capture(global_step, update: Callable, sync_hook: Callable,
            colocate_gradients: bool = False, variables_for: Optional[Callable] = None):
    """Within the block, the model_fn's optimizer applies through `update`; yields `Captured`.

    Args:
      global_step: the run's global step variable (int64, on a ps).
      update: `update(optimizer, grads_and_vars) -> int64 scalar` (the global step
        after this step's update); it applies with `optimizer.apply_gradients(...,
        global_step=None)`, which is the optimizer's own.
      sync_hook: `sync_hook(sync_optimizer, is_chief, num_tokens) -> SessionRunHook`,
        what `SyncReplicasOptimizer.make_session_run_hook` returns instead of its own.
      colocate_gradients: each gradient op is built beside its forward op (see the
        module's docstring).
      variables_for: `variables_for(var_list) -> variables` the gradients are taken for
        instead of the model_fn's (its `var_list`, else the trainable ones): the
        communication-reduced mode's copies (`local_sgd.LocalCopies.local_of`).
    """
    captured = Captured()
    base, sync = v1.train.Optimizer, v1.train.SyncReplicasOptimizer
    own_apply, own_compute = base.apply_gradients, base.compute_gradients
    own_sync_apply, own_sync_hook = sync.apply_gradients, sync.make_session_run_hook

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        if global_step is not global_step_var or inside_sync():
            captured.other_applies += 1
            return own_apply(self, grads_and_vars, global_step, name)
        captured.applies += 1
        captured.step = update(self, list(grads_and_vars))
        return captured.step

    def compute_gradients(self, loss, *args, **kwargs):
        captured.loss = loss
        if variables_for is not None:
            args, kwargs = _with_argument(args, kwargs, _VAR_LIST_AT, "var_list", variables_for(
                tf.nest.flatten(_argument(args, kwargs, _VAR_LIST_AT, "var_list") or
                                _trainable())))
        if colocate_gradients:
            args, kwargs = _with_argument(args, kwargs, _COLOCATE_AT,
                                          "colocate_gradients_with_ops", True)
        if _all_resource(_argument(args, kwargs, _VAR_LIST_AT, "var_list")):
            args, kwargs = _with_argument(args, kwargs, _GATE_AT, "gate_gradients",
                                          base.GATE_NONE)
        return own_compute(self, loss, *args, **kwargs)

    def note_sync(sync_optimizer, _global_step):
        captured.sync_optimizer = sync_optimizer
    sync_apply_gradients = marking_sync_apply(own_sync_apply, note_sync)

    def make_session_run_hook(self, is_chief, num_tokens=-1):
        return sync_hook(self, is_chief, num_tokens)

    global_step_var = global_step
    base.apply_gradients, base.compute_gradients = apply_gradients, compute_gradients
    sync.apply_gradients, sync.make_session_run_hook = sync_apply_gradients, \
        make_session_run_hook
    try:
        yield captured
    finally:
        base.apply_gradients, base.compute_gradients = own_apply, own_compute
        sync.apply_gradients, sync.make_session_run_hook = own_sync_apply, own_sync_hook


# `Optimizer.compute_gradients(loss, var_list, gate_gradients, aggregation_method,
# colocate_gradients_with_ops, grad_loss)`: the arguments' places after `loss`.
_VAR_LIST_AT, _GATE_AT, _COLOCATE_AT = 0, 1, 3


def _argument(args: tuple, kwargs: dict, at: int, name: str):
    """The argument `name` (at `at` after `loss`) of a `compute_gradients` call, or None."""
    return args[at] if len(args) > at else kwargs.get(name)


def _with_argument(args: tuple, kwargs: dict, at: int, name: str, value) -> tuple:
    """`compute_gradients`' (args, kwargs) after `loss`, with `name` (at `at`) = `value`."""
    if len(args) > at:
        return args[:at] + (value,) + args[at + 1:], kwargs
    return args, dict(kwargs, **{name: value})


def _all_resource(var_list) -> bool:
    """Whether every variable the gradients are for (`var_list`, else the trainable ones
    and the trainable resource variables, as `compute_gradients` takes them) is a
    resource variable."""
    if var_list is None:
        var_list = _trainable()
    variables = tf.nest.flatten(var_list)
    return bool(variables) and all(
        getattr(getattr(v, "handle", None), "dtype", None) == tf.resource for v in variables)


def _trainable() -> list:
    """The variables `compute_gradients` differentiates for when given no var_list."""
    return v1.trainable_variables() + v1.get_collection(
        v1.GraphKeys.TRAINABLE_RESOURCE_VARIABLES)
