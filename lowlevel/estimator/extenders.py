"""`add_metrics` (tensorflow_estimator 2.15's `extenders.py`): an Estimator with more
evaluation metrics, its training and checkpoints unchanged.
"""

from __future__ import annotations

from lowlevel.estimator.estimator import Estimator
from lowlevel.models.spec import ModeKeys, fn_args

_METRIC_FN_ARGS = ("features", "labels", "predictions", "config")


def add_metrics(estimator, metric_fn):
    """A new Estimator on `estimator`'s model_dir, config and warm start whose evaluation
    also reports `metric_fn`'s metrics (2.15's `tf.estimator.add_metrics`).

    Args:
      metric_fn: a function of any of (features, labels, predictions, config) returning
        {name: (value_tensor, update_op)} (tf.compat.v1.metrics); a name the model's own
        metrics have is replaced.

    Raises:
      ValueError: `metric_fn` takes another argument (2.15's message).
    """
    args = fn_args(metric_fn)
    unexpected = [a for a in args if a not in _METRIC_FN_ARGS]
    if unexpected:
        raise ValueError(f"metric_fn ({metric_fn}) has following not expected args: "
                         f"{unexpected}")
    model_fn = estimator.model_fn

    def new_model_fn(features, labels, mode, config):
        spec = model_fn(features, labels, mode, config)
        if mode != ModeKeys.EVAL:
            return spec
        given = {"features": features, "labels": labels, "predictions": spec.predictions,
                 "config": config}
        metrics = dict(spec.eval_metric_ops or {})
        metrics.update(metric_fn(**{a: given[a] for a in args}))
        return spec._replace(eval_metric_ops=metrics)

    return Estimator(model_fn=new_model_fn, model_dir=estimator.model_dir,
                     config=estimator.config,
                     warm_start_from=estimator._warm_start_settings)  # noqa: SLF001
