"""Keras metric objects in `eval_metric_ops` with Keras 3 (no tf-keras), as 2.15 took Keras 2's.

tensorflow_estimator 2.15 (`model_fn._validate_eval_metric_ops`) turned a
`tf.keras.metrics.Metric` into `(metric.result(), metric.updates[0])` and moved
its variables to the LOCAL_VARIABLES and METRIC_VARIABLES collections; Keras 2
recorded the update op of `update_state` in graph mode in `metric.updates`.
Keras 3 (TensorFlow 2.21's tf.keras) builds the same graph ops in a
`tf.compat.v1` graph but keeps no `updates`, and creates its variables in
GLOBAL_VARIABLES (an evaluation would then try to restore them from the
checkpoint). Here:

- `update_ops(metric)`: Keras 2's `metric.updates`; for Keras 3 the graph ops
  that write the metric's variables (AssignVariableOp / AssignAdd / AssignSub
  consumers of their handles, the initializers excepted) — [] before
  `update_state` was called.
- `variables(metric)`: the metric's `tf.Variable`s (Keras 3's wrap one each).
- `as_metric_op(metric)`: (result Tensor, one update op: the first of Keras 2's,
  all of Keras 3's grouped), the variables moved to the local collections.

What differs from 2.15 with Keras 3: when `update_state` was called more than
once in the graph, 2.15 ran only the first call's update (`updates[0]`), here
every call's writes run (grouped, in no set order; a `reset_state()` made in
the graph is among them).
"""

from __future__ import annotations

import tensorflow as tf

_WRITES = frozenset({"AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp"})


def is_keras_metric(value) -> bool:
    """Whether `value` is a metric object (update_state and result), not a (value, op) tuple."""
    return not isinstance(value, tuple) and hasattr(value, "update_state") and \
        hasattr(value, "result")


def variables(metric) -> list:
    """The metric's variables as `tf.Variable`s (a Keras 3 variable's `.value`)."""
    found = []
    for variable in metric.variables:
        found.append(variable if isinstance(variable, tf.Variable) else variable.value)
    return found


def update_ops(metric) -> list:
    """The update ops of `update_state` calls in a graph (see the module docstring); [] if none."""
    if getattr(metric, "updates", None):
        return list(metric.updates)
    ops = []
    for variable in variables(metric):
        handle = getattr(variable, "handle", None)
        if handle is None or not hasattr(handle, "consumers"):
            continue  # eager: no graph ops to find
        initializer = getattr(variable, "initializer", None)
        ops.extend(op for op in handle.consumers()
                   if op.type in _WRITES and op is not initializer)
    return ops


def _move_to_local_collections(metric) -> None:
    graph = tf.compat.v1.get_default_graph()
    keys = tf.compat.v1.GraphKeys
    global_ref = graph.get_collection_ref(keys.GLOBAL_VARIABLES)
    for variable in variables(metric):
        while any(v is variable for v in global_ref):
            global_ref.remove(variable)
        for collection in (keys.LOCAL_VARIABLES, keys.METRIC_VARIABLES):
            if not any(v is variable for v in graph.get_collection(collection)):
                graph.add_to_collection(collection, variable)


def as_metric_op(metric):
    """(result Tensor, update op) of a metric whose `update_state` was called in this graph.

    The result is `metric.result()` (float32 scalar for Mean, AUC, ...); the
    update op is Keras 2's first update, or Keras 3's writes grouped. The
    variables leave GLOBAL_VARIABLES for LOCAL_VARIABLES and METRIC_VARIABLES
    (initialized by the local initializer, never saved or restored).
    """
    ops = update_ops(metric)
    update = ops[0] if getattr(metric, "updates", None) or len(ops) == 1 else \
        tf.group(*ops, name=f"{metric.name}_update")
    _move_to_local_collections(metric)
    return metric.result(), update
