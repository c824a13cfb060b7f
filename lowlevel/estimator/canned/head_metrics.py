"""Graph-mode metric objects for the heads' `metrics()` / `update_metrics()`, with the
Keras metric interface tensorflow_estimator 2.15's heads use (their `tf.keras.metrics.Mean`,
`Accuracy`, `BinaryAccuracy`, `Precision`, `Recall`, `AUC` of Keras 2.15).

Keras 3's metrics do not run in a TF1 graph; these do. Each object owns float32
variables (local, in `METRIC_VARIABLES`: the evaluation's local initializer zeroes
them) and has Keras' methods: `update_state(...)` (returns the update op and appends
it to `updates`), `result()` (float32 Tensor: a scalar, or `[len(thresholds)]` for
several thresholds), `variables`, `reset_state()` / `reset_states()` (the op that
zeroes them), `name`, `dtype`, `add_update(op)` and `__call__` (update, then result).
An `EstimatorSpec`'s `eval_metric_ops` takes them as they are (it uses
`(result(), updates[0])`, as 2.15's).

The arithmetic is Keras 2.15's (keras/src/metrics/, keras/src/utils/metrics_utils.py):
weighted means `total / count` (0 when count is 0); confusion counts with
`prediction > threshold` (strict); AUC over `num_thresholds` thresholds
`[-1e-7, 1/(n-1), ..., (n-2)/(n-1), 1 + 1e-7]`, ROC by trapezoids, PR by Davis &
Goadrich's interpolation ("interpolation", the default); `sample_weight` broadcast to
the values (after Keras' squeeze-or-expand of a trailing dimension of 1).
"""

from __future__ import annotations

import re

import tensorflow as tf

v1 = tf.compat.v1
_EPSILON = 1e-7  # Keras' backend.epsilon()
_COLLECTIONS = (v1.GraphKeys.LOCAL_VARIABLES, v1.GraphKeys.METRIC_VARIABLES)


def _scope_name(name):
    return re.sub(r"[^A-Za-z0-9_.\-/]", "_", name).strip("/") or "metric"


class Metric:
    """The base (Keras' `Metric` in a graph): variables, updates, `result()`.

    Subclasses implement `_update(*args, **kwargs)` (-> an op) and `result()`.
    `name` (str) defaults to the class name in snake case, as Keras'.
    """

    def __init__(self, name=None, dtype=None):
        default = re.sub(r"(?<!^)(?=[A-Z][a-z])", "_", type(self).__name__).lower()
        self.name = name or default
        self.dtype = tf.as_dtype(dtype or tf.float32)
        self._variables, self._updates = [], []
        with v1.name_scope(_scope_name(self.name)) as scope:
            self._scope = scope  # one unique scope for all its variables

    def add_weight(self, name, shape=()):
        """A zero-initialised local variable `shape` of `dtype`, in METRIC_VARIABLES."""
        with tf.control_dependencies(None), v1.name_scope(self._scope):
            variable = v1.Variable(tf.zeros(shape, self.dtype), trainable=False, name=name,
                                   collections=list(_COLLECTIONS), use_resource=True)
        self._variables.append(variable)
        return variable

    @property
    def variables(self):
        """The metric's variables (list), in creation order."""
        return list(self._variables)

    @property
    def updates(self):
        """The update ops made so far (list); `updates[0]` is what an Estimator runs."""
        return list(self._updates)

    def add_update(self, op):
        """Record `op` as an update (Keras' `add_update`)."""
        self._updates.append(op)

    def update_state(self, *args, **kwargs):
        """Accumulate a batch; returns the update op (also appended to `updates`)."""
        op = self._update(*args, **kwargs)
        self.add_update(op)
        return op

    def _update(self, *args, **kwargs):
        raise NotImplementedError("Calling an abstract method.")

    def result(self):
        """The metric's value from its variables (float32 Tensor)."""
        raise NotImplementedError("Calling an abstract method.")

    def reset_state(self):
        """The op that zeroes every one of `variables` (run it in a session)."""
        return tf.group(*[v.assign(tf.zeros_like(v)) for v in self.variables])

    reset_states = reset_state

    def __call__(self, *args, **kwargs):
        """update_state(*args, **kwargs), then the result after it (float32 Tensor)."""
        with tf.control_dependencies([self.update_state(*args, **kwargs)]):
            return tf.identity(self.result())

    def __repr__(self):
        return f"<{type(self).__module__}.{type(self).__name__} name={self.name!r}>"


def _remove_squeezable(labels, predictions):
    """Keras' `remove_squeezable_dimensions` (static ranks; expected rank difference 0)."""
    p_rank, l_rank = predictions.shape.rank, labels.shape.rank
    if p_rank is None or l_rank is None:
        return labels, predictions
    if p_rank - l_rank == 1 and predictions.shape[-1] == 1:
        predictions = tf.squeeze(predictions, [-1])
    elif p_rank - l_rank == -1 and labels.shape[-1] == 1:
        labels = tf.squeeze(labels, [-1])
    return labels, predictions


def squeeze_or_expand(y_pred, y_true=None, sample_weight=None):
    """Keras' `squeeze_or_expand_dimensions` for static ranks: drops a trailing 1 so
    y_true and y_pred have one rank, and squeezes or expands `sample_weight` by one rank
    to y_pred's. Returns (y_pred, y_true, sample_weight)."""
    if y_true is not None:
        p_rank, t_rank = y_pred.shape.rank, y_true.shape.rank
        if p_rank is not None and t_rank is not None and \
                (p_rank - t_rank != 1 or y_pred.shape[-1] == 1):
            y_true, y_pred = _remove_squeezable(y_true, y_pred)
    if sample_weight is None or sample_weight.shape.rank in (0, None) or \
            y_pred.shape.rank is None:
        return y_pred, y_true, sample_weight
    if sample_weight.shape.rank - y_pred.shape.rank == 1:
        sample_weight = tf.squeeze(sample_weight, [-1])
    elif y_pred.shape.rank - sample_weight.shape.rank == 1:
        sample_weight = tf.expand_dims(sample_weight, -1)
    return y_pred, y_true, sample_weight


def _broadcast(weights, values):
    return tf.broadcast_to(weights, tf.shape(values))


class Mean(Metric):
    """The weighted mean of every value given (Keras' `Mean`): `total` / `count`.

    update_state(values, sample_weight=None): values any float-castable Tensor;
    sample_weight broadcastable to it. result(): float32 scalar, 0 before any weight.
    """

    def __init__(self, name="mean", dtype=None):
        super().__init__(name, dtype)
        self.total = self.add_weight("total")
        self.count = self.add_weight("count")

    def _update(self, values, sample_weight=None):
        values = tf.cast(values, self.dtype)
        if sample_weight is not None:
            values, _, sample_weight = squeeze_or_expand(
                values, sample_weight=tf.cast(sample_weight, self.dtype))
            sample_weight = _broadcast(sample_weight, values)
            values = values * sample_weight
        value_sum = tf.reduce_sum(values)
        with tf.control_dependencies([value_sum]):
            update_total = self.total.assign_add(value_sum)
        if sample_weight is None:
            num = tf.cast(tf.size(values), self.dtype)
        else:
            num = tf.reduce_sum(sample_weight)
        with tf.control_dependencies([update_total]):
            return self.count.assign_add(num)

    @property
    def variables(self):
        """[total, count] — those of them still variables: as Keras' attribute tracking, a
        `total` or `count` replaced by a Tensor (2.15's accuracy_baseline) drops out and
        one replaced by another metric's variable is that one."""
        return [v for v in (self.total, self.count) if isinstance(v, tf.Variable)]

    def result(self):
        """total / count (0 when count is 0), float32 scalar."""
        return tf.math.divide_no_nan(self.total, self.count)


class _MatchesMean(Mean):
    """Keras' `MeanMetricWrapper`: the weighted mean of `_matches(y_true, y_pred)`."""

    def _update(self, y_true, y_pred, sample_weight=None):
        y_true, y_pred = tf.cast(y_true, self.dtype), tf.cast(y_pred, self.dtype)
        y_pred, y_true, _ = squeeze_or_expand(y_pred, y_true)
        return super()._update(self._matches(y_true, y_pred), sample_weight)

    def _matches(self, y_true, y_pred):
        raise NotImplementedError("Calling an abstract method.")


class Accuracy(_MatchesMean):
    """How often y_pred equals y_true (Keras' `Accuracy`): update_state(y_true, y_pred,
    sample_weight=None), both cast to float32; result() float32 scalar."""

    def __init__(self, name="accuracy", dtype=None):
        super().__init__(name, dtype)

    def _matches(self, y_true, y_pred):
        y_true.shape.assert_is_compatible_with(y_pred.shape)
        return tf.cast(tf.equal(y_true, y_pred), self.dtype)


class BinaryAccuracy(_MatchesMean):
    """How often `y_pred > threshold` equals y_true (Keras' `BinaryAccuracy`), element by
    element; result() float32 scalar."""

    def __init__(self, name="binary_accuracy", dtype=None, threshold=0.5):
        super().__init__(name, dtype)
        self.threshold = threshold

    def _matches(self, y_true, y_pred):
        above = tf.cast(y_pred > tf.cast(self.threshold, y_pred.dtype), y_pred.dtype)
        return tf.cast(tf.equal(y_true, above), self.dtype)


def _confusion_update(variables, y_true, y_pred, thresholds, sample_weight=None):
    """Keras' `update_confusion_matrix_variables` (not multi-label): adds to each of
    `variables` ({"tp"|"fp"|"tn"|"fn": float32 `[T]`}) the weighted count of examples
    with `y_pred > thresholds[t]` (and y_true != 0, as the key says). Returns the op."""
    y_true, y_pred = tf.cast(y_true, tf.float32), tf.cast(y_pred, tf.float32)
    if sample_weight is not None:
        sample_weight = tf.cast(sample_weight, tf.float32)
    y_pred, y_true, sample_weight = squeeze_or_expand(y_pred, y_true, sample_weight)
    y_pred.shape.assert_is_compatible_with(y_true.shape)
    preds = tf.reshape(y_pred, [1, -1])
    label_pos = tf.reshape(tf.cast(y_true, tf.bool), [1, -1])
    pred_pos = preds > tf.reshape(tf.constant(thresholds, tf.float32), [-1, 1])
    weights = tf.ones_like(preds) if sample_weight is None else \
        tf.reshape(_broadcast(sample_weight, y_pred), [1, -1])
    conditions = {"tp": label_pos & pred_pos, "fp": ~label_pos & pred_pos,
                  "tn": ~label_pos & ~pred_pos, "fn": label_pos & ~pred_pos}
    return tf.group(*[var.assign_add(tf.reduce_sum(
        tf.cast(conditions[key], tf.float32) * weights, axis=1))
        for key, var in variables.items()])


def _thresholds(thresholds):
    if thresholds is None:
        return [0.5]
    return [float(t) for t in (thresholds if isinstance(thresholds, (list, tuple))
                               else [thresholds])]


class _PrecisionOrRecall(Metric):
    """tp / (tp + fp) (Precision) or tp / (tp + fn) (Recall) at each threshold."""

    _OTHER = ""

    def __init__(self, thresholds=None, name=None, dtype=None):
        super().__init__(name, dtype)
        self.thresholds = _thresholds(thresholds)
        shape = [len(self.thresholds)]
        self.true_positives = self.add_weight("true_positives", shape)
        self.other = self.add_weight(self._OTHER, shape)

    def _update(self, y_true, y_pred, sample_weight=None):
        key = "fp" if self._OTHER == "false_positives" else "fn"
        return _confusion_update({"tp": self.true_positives, key: self.other}, y_true,
                                 y_pred, self.thresholds, sample_weight)

    def result(self):
        """float32: a scalar for one threshold, else `[len(thresholds)]`."""
        found = tf.math.divide_no_nan(self.true_positives,
                                      self.true_positives + self.other)
        return found[0] if len(self.thresholds) == 1 else found


class Precision(_PrecisionOrRecall):
    """Keras' `Precision`: of the examples with `y_pred > threshold` (0.5 by default),
    the weighted fraction whose y_true is non-zero. update_state(y_true, y_pred,
    sample_weight=None); result() float32 (scalar for one threshold)."""

    _OTHER = "false_positives"


class Recall(_PrecisionOrRecall):
    """Keras' `Recall`: of the examples whose y_true is non-zero, the weighted fraction
    with `y_pred > threshold` (0.5 by default); result() float32 (scalar for one
    threshold)."""

    _OTHER = "false_negatives"


class AUC(Metric):
    """Keras' `AUC` (not multi-label): the area under the ROC or PR curve over
    `num_thresholds` (int > 1) thresholds.

    update_state(y_true, y_pred, sample_weight=None): y_pred probabilities in [0, 1],
    flattened with y_true. curve 'ROC' or 'PR'; summation_method 'interpolation'
    (default), 'minoring' or 'majoring'. ValueError for num_thresholds <= 1 or another
    curve / summation method. result(): float32 scalar.
    """

    def __init__(self, num_thresholds=200, curve="ROC", summation_method="interpolation",
                 name=None, dtype=None):
        if num_thresholds <= 1:
            raise ValueError("Argument `num_thresholds` must be an integer > 1. "
                             f"Received: num_thresholds={num_thresholds}")
        if curve.upper() not in ("ROC", "PR"):
            raise ValueError(f'Invalid AUC curve value: "{curve}". Expected values are '
                             '["PR", "ROC"]')
        if summation_method.lower() not in ("interpolation", "minoring", "majoring"):
            raise ValueError(f'Invalid AUC summation method value: "{summation_method}". '
                             'Expected values are ["interpolation", "majoring", "minoring"]')
        super().__init__(name, dtype)
        self.num_thresholds, self.curve = num_thresholds, curve.upper()
        self.summation_method = summation_method.lower()
        inner = [(i + 1) * 1.0 / (num_thresholds - 1) for i in range(num_thresholds - 2)]
        self.thresholds = [0.0 - _EPSILON] + inner + [1.0 + _EPSILON]
        self.true_positives = self.add_weight("true_positives", [num_thresholds])
        self.true_negatives = self.add_weight("true_negatives", [num_thresholds])
        self.false_positives = self.add_weight("false_positives", [num_thresholds])
        self.false_negatives = self.add_weight("false_negatives", [num_thresholds])

    def _update(self, y_true, y_pred, sample_weight=None):
        return _confusion_update({"tp": self.true_positives, "tn": self.true_negatives,
                                  "fp": self.false_positives, "fn": self.false_negatives},
                                 y_true, y_pred, self.thresholds, sample_weight)

    def _interpolate_pr_auc(self):
        n, tp = self.num_thresholds, self.true_positives
        dtp = tp[:n - 1] - tp[1:]
        p = tp + self.false_positives
        dp = p[:n - 1] - p[1:]
        slope = tf.math.divide_no_nan(dtp, tf.maximum(dp, 0))
        intercept = tp[1:] - slope * p[1:]
        ratio = tf.where(tf.logical_and(p[:n - 1] > 0, p[1:] > 0),
                         tf.math.divide_no_nan(p[:n - 1], tf.maximum(p[1:], 0)),
                         tf.ones_like(p[1:]))
        increment = tf.math.divide_no_nan(slope * (dtp + intercept * tf.math.log(ratio)),
                                          tf.maximum(tp[1:] + self.false_negatives[1:], 0))
        return tf.reduce_sum(increment)

    def result(self):
        """The area (float32 scalar), Keras 2.15's formulas."""
        if self.curve == "PR" and self.summation_method == "interpolation":
            return self._interpolate_pr_auc()
        n, tp = self.num_thresholds, self.true_positives
        recall = tf.math.divide_no_nan(tp, tp + self.false_negatives)
        if self.curve == "ROC":
            x = tf.math.divide_no_nan(self.false_positives,
                                      self.false_positives + self.true_negatives)
            y = recall
        else:
            x, y = recall, tf.math.divide_no_nan(tp, tp + self.false_positives)
        if self.summation_method == "interpolation":
            heights = (y[:n - 1] + y[1:]) / 2.0
        elif self.summation_method == "minoring":
            heights = tf.minimum(y[:n - 1], y[1:])
        else:
            heights = tf.maximum(y[:n - 1], y[1:])
        return tf.reduce_sum((x[:n - 1] - x[1:]) * heights)


def update_with_broadcast_weights(metric, values, weights):
    """2.15's `base_head.update_metric_with_broadcast_weights`: values cast to float32,
    weights (if any) broadcast to them, then `metric.update_state`; returns its op."""
    values = tf.cast(values, tf.float32)
    if weights is not None:
        weights = _broadcast(tf.cast(weights, tf.float32), values)
    return metric.update_state(values, sample_weight=weights)
