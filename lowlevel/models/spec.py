"""What a `model_fn` returns (`EstimatorSpec`), the modes it is called in, and how it is called.

The observable behaviour of tensorflow_estimator 2.15 (`mode_keys.py`,
`model_fn.py` `EstimatorSpec` and its `_validate_*` functions,
`estimator.py` `_call_model_fn` and `_verify_model_fn_args`), written for
TensorFlow 2.21 in the models layer so that lowlevel's runtime can build a
model_fn's graph without the `lowlevel.estimator` entry point:

- `ModeKeys`: TRAIN "train", EVAL "eval", PREDICT "infer".
- `EstimatorSpec(mode, predictions, loss, train_op, eval_metric_ops,
  export_outputs, training_chief_hooks, training_hooks, scaffold,
  evaluation_hooks, prediction_hooks)`: validated as 2.15 (ValueError /
  TypeError with its messages); hooks become tuples, a missing scaffold a
  default `tf.compat.v1.train.Scaffold()`, a loss of shape [1] a scalar.
- `call_model_fn(model_fn, features, labels, mode, params, config)`: passes
  the subset of (labels, mode, params, config) that `model_fn` names.
"""

from __future__ import annotations

import collections
import functools
import inspect

import tensorflow as tf

from lowlevel.models import export_outputs as export_outputs_lib
from lowlevel.models import keras_metrics

logging = tf.compat.v1.logging  # the 'tensorflow' logger, as tensorflow_estimator 2.15 logs

LOSS_METRIC_KEY = "loss"
_VALID_MODEL_FN_ARGS = {"features", "labels", "mode", "params", "self", "config"}

_NOT_IN_DEFAULT_GRAPH = (
    '{0} with "{1}" must be from the default graph. '
    "Possible causes of this error include: \n\n"
    "1) {0} was created outside the context of the default graph."
    "\n\n"
    "2) The object passed through to EstimatorSpec was not created "
    'in the most recent call to "model_fn".')


class ModeKeys:
    """The three modes a model_fn is called in (the strings are 2.15's)."""

    TRAIN = "train"
    EVAL = "eval"
    PREDICT = "infer"


def fn_args(fn) -> tuple:
    """The names of `fn`'s positional-or-keyword arguments, as TensorFlow's `fn_args`.

    A `functools.partial` drops the arguments it binds; a callable object is
    read through `__call__`; a bound method drops its first (self) argument.
    """
    if isinstance(fn, functools.partial):
        args = fn_args(fn.func)
        return tuple(a for a in args[len(fn.args):] if a not in (fn.keywords or {}))
    if not (inspect.isfunction(fn) or inspect.ismethod(fn)) and callable(fn) and \
            hasattr(fn, "__call__") and not inspect.isbuiltin(fn):
        fn = fn.__call__
    args = list(inspect.getfullargspec(fn).args)
    if inspect.ismethod(fn) and args:
        args.pop(0)
    return tuple(args)


def named_kwargs(fn, **candidates) -> dict:
    """The `candidates` whose names `fn` takes (`fn_args`): how 2.15 passed a model_fn's,
    input_fn's or logit_fn's optional `mode`, `params` and `config`."""
    names = fn_args(fn)
    return {k: v for k, v in candidates.items() if k in names}


def _in_default_graph(value) -> bool:
    return tf.executing_eagerly() or value.graph is tf.compat.v1.get_default_graph()


def _check_is_tensor(x, name):
    if not isinstance(x, tf.Tensor):
        raise TypeError(f"{name} must be Tensor, given: {x}")
    return x


def _validate_train_op(train_op, mode):
    if train_op is None:
        if mode == ModeKeys.TRAIN:
            raise ValueError("Missing train_op.")
        return train_op
    if not isinstance(train_op, (tf.Operation, tf.Tensor, tf.Variable)):
        raise TypeError(f"train_op must be Operation or Tensor, given: {train_op}")
    if isinstance(train_op, tf.Variable):
        train_op = train_op.op
    if not _in_default_graph(train_op):
        raise ValueError(_NOT_IN_DEFAULT_GRAPH.format("train_op", train_op.name))
    return train_op


def _validate_loss(loss, mode):
    if loss is None:
        if mode in (ModeKeys.TRAIN, ModeKeys.EVAL):
            raise ValueError("Missing loss.")
        return loss
    loss = _check_is_tensor(loss, "loss")
    shape = loss.get_shape()
    if shape.num_elements() not in (None, 1):
        raise ValueError(f"Loss must be scalar, given: {loss}")
    if not shape.is_compatible_with(tf.TensorShape([])):
        loss = tf.reshape(loss, [])
    if not _in_default_graph(loss):
        raise ValueError(_NOT_IN_DEFAULT_GRAPH.format("loss", loss.name))
    return loss


def _validate_predictions(predictions, mode):
    if predictions is None:
        if mode == ModeKeys.PREDICT:
            raise ValueError("Missing predictions.")
        return {}
    if isinstance(predictions, dict):
        predictions = {k: _check_is_tensor(v, f"predictions[{k}]")
                       for k, v in predictions.items()}
        for key, value in predictions.items():
            if not _in_default_graph(value):
                raise ValueError(_NOT_IN_DEFAULT_GRAPH.format(
                    "prediction values", f"{key}: {value.name}"))
        return predictions
    predictions = _check_is_tensor(predictions, "predictions")
    if not _in_default_graph(predictions):
        raise ValueError(_NOT_IN_DEFAULT_GRAPH.format("prediction values", predictions.name))
    return predictions


def _validate_hooks(hooks):
    hooks = tuple(hooks or [])
    for hook in hooks:
        if not isinstance(hook, tf.compat.v1.train.SessionRunHook):
            raise TypeError(f"All hooks must be SessionRunHook instances, given: {hook}")
    return hooks


def _is_keras_metric(value) -> bool:
    return keras_metrics.is_keras_metric(value)


def _check_metric_shapes(eval_metric_ops):
    if not isinstance(eval_metric_ops, dict):
        raise TypeError(f"eval_metric_ops must be a dict, given: {eval_metric_ops}")
    for key, value in eval_metric_ops.items():
        if _is_keras_metric(value):
            if not keras_metrics.update_ops(value):
                raise ValueError(
                    f'Please call update_state(...) on the "{value.name}" metric')
        elif not isinstance(value, tuple) or len(value) != 2:
            raise TypeError("Values of eval_metric_ops must be (metric_value, update_op) "
                            f"tuples, given: {value} for key: {key}")


def _validate_eval_metric_ops(eval_metric_ops):
    """2.15's rules; a Keras Metric becomes (result, first update) and its variables local."""
    if eval_metric_ops is None:
        return {}
    _check_metric_shapes(eval_metric_ops)
    for key, value in list(eval_metric_ops.items()):
        if _is_keras_metric(value):
            to_check = keras_metrics.update_ops(value) + [value.result()]
        else:
            to_check = tf.nest.flatten(value)
        for item in to_check:
            if not _in_default_graph(item):
                raise ValueError(_NOT_IN_DEFAULT_GRAPH.format(
                    "eval_metric_ops", f"{key}: {item.name}"))
    for key, value in list(eval_metric_ops.items()):
        if _is_keras_metric(value):
            eval_metric_ops[key] = keras_metrics.as_metric_op(value)  # Keras 2 or 3
    return eval_metric_ops


def _validate_scaffold(scaffold):
    scaffold = scaffold or tf.compat.v1.train.Scaffold()
    if not isinstance(scaffold, tf.compat.v1.train.Scaffold):
        raise TypeError(f"scaffold must be tf.train.Scaffold. Given: {scaffold}")
    return scaffold


_FIELDS = ["mode", "predictions", "loss", "train_op", "eval_metric_ops", "export_outputs",
           "training_chief_hooks", "training_hooks", "scaffold", "evaluation_hooks",
           "prediction_hooks"]


class EstimatorSpec(collections.namedtuple("EstimatorSpec", _FIELDS)):
    """Ops and objects a model_fn returns, validated as tensorflow_estimator 2.15's.

    TRAIN needs `loss` (a scalar or [1] float Tensor of the default graph) and
    `train_op` (Operation, Tensor or Variable); EVAL needs `loss`; PREDICT
    needs `predictions` (Tensor or dict of Tensors) and fills `export_outputs`
    ({"serving_default": PredictOutput(predictions)} when None). Errors:
    ValueError "Missing train_op." / "Missing loss." / "Missing predictions." /
    "Loss must be scalar, given: ..." / "... must be from the default graph.
    ..."; TypeError for a wrong type (a hook that is not a SessionRunHook,
    eval_metric_ops not a dict of (value, update_op) tuples or Metrics, a
    scaffold not a `tf.compat.v1.train.Scaffold`).
    """

    def __new__(cls, mode, predictions=None, loss=None, train_op=None, eval_metric_ops=None,
                export_outputs=None, training_chief_hooks=None, training_hooks=None,
                scaffold=None, evaluation_hooks=None, prediction_hooks=None):
        train_op = _validate_train_op(train_op, mode)
        loss = _validate_loss(loss, mode)
        predictions = _validate_predictions(predictions, mode)
        if mode == ModeKeys.PREDICT:
            export_outputs = export_outputs_lib.get_export_outputs(export_outputs, predictions)
        return super().__new__(
            cls, mode=mode, predictions=predictions, loss=loss, train_op=train_op,
            eval_metric_ops=_validate_eval_metric_ops(eval_metric_ops),
            export_outputs=export_outputs,
            training_chief_hooks=_validate_hooks(training_chief_hooks),
            training_hooks=_validate_hooks(training_hooks),
            scaffold=_validate_scaffold(scaffold),
            evaluation_hooks=_validate_hooks(evaluation_hooks),
            prediction_hooks=_validate_hooks(prediction_hooks))

    def _replace(self, **kwds):
        """A copy with fields replaced (validated again); ValueError if `mode` changes."""
        if "mode" in kwds and self.mode != kwds["mode"]:
            raise ValueError("mode of EstimatorSpec cannot be changed.")
        new_fields = map(kwds.pop, self._fields, list(self))
        return EstimatorSpec(*new_fields)


def verify_model_fn_args(model_fn, params) -> None:
    """Checks `model_fn`'s argument names against `params` as 2.15's Estimator constructor.

    Raises ValueError: no `features` argument; `params` given (not None) but
    no `params` argument; arguments outside features, labels, mode, params,
    config, self. Logs a warning when `params` is an argument but None.
    """
    args = set(fn_args(model_fn))
    if "features" not in args:
        raise ValueError(f"model_fn ({model_fn}) must include features argument.")
    if params is not None and "params" not in args:
        raise ValueError(f"model_fn ({model_fn}) does not include params argument, "
                         f"but params ({params}) is passed to Estimator.")
    if params is None and "params" in args:
        logging.warning("Estimator's model_fn (%s) includes params argument, but params are "
                        "not passed to Estimator.", model_fn)
    invalid = list(args - _VALID_MODEL_FN_ARGS)
    if invalid:
        raise ValueError(f"model_fn ({model_fn}) has following not expected args: {invalid}")


def call_model_fn(model_fn, features, labels, mode, params, config) -> EstimatorSpec:
    """Calls `model_fn` with the arguments it names; returns its EstimatorSpec.

    As 2.15's `Estimator._call_model_fn`: `features` always (by keyword);
    `labels` if named, and ValueError "model_fn does not take labels, but
    input_fn returns labels." if not named but not None; `mode`, `params`,
    `config` if named. ValueError "model_fn should return an EstimatorSpec."
    for any other result.
    """
    names = fn_args(model_fn)
    kwargs = {}
    if "labels" in names:
        kwargs["labels"] = labels
    elif labels is not None:
        raise ValueError("model_fn does not take labels, but input_fn returns labels.")
    kwargs.update(named_kwargs(model_fn, mode=mode, params=params, config=config))
    logging.info("Calling model_fn.")
    result = model_fn(features=features, **kwargs)
    logging.info("Done calling model_fn.")
    if not isinstance(result, EstimatorSpec):
        raise ValueError("model_fn should return an EstimatorSpec.")
    return result
