"""Heads (tensorflow_estimator 2.15's `tf.estimator.*Head`): loss, predictions, metrics
and export outputs from a model's logits.

A head turns `logits` (float32 `[batch, logits_dimension]`) into what each
mode needs; `create_estimator_spec` returns the `EstimatorSpec`. The keys and
shapes are 2.15's (tests/fixtures/canned215/heads.json, captured from the real
2.15):

- predictions: BinaryClassHead `logits` [B, 1], `logistic` [B, 1],
  `probabilities` [B, 2], `class_ids` int64 [B, 1], `classes` string [B, 1],
  `all_class_ids` int32 [B, 2], `all_classes` string [B, 2]; MultiClassHead the
  same without `logistic`, over n_classes; MultiLabelHead `logits`,
  `probabilities` (sigmoid), `classes` (every class's name, string [B, n]); RegressionHead
  `predictions` [B, label_dimension] (and `logits` with an inverse link:
  PoissonRegressionHead exp, LogisticRegressionHead sigmoid).
- eval metrics (`metrics()` makes the metric objects of
  `canned.head_metrics`, `update_metrics()` updates them; EVAL's
  `eval_metric_ops` are those, as 2.15's): binary `average_loss`, `accuracy`,
  `precision`, `recall`, `prediction/mean`, `label/mean`, `accuracy_baseline`,
  `auc`, `auc_precision_recall` (Keras' AUC: 200 thresholds, ROC by trapezoids,
  PR by Davis & Goadrich's interpolation) and per threshold
  `accuracy|precision|recall/positive_threshold_<t>`; multi-class `average_loss`,
  `accuracy`; multi-label `average_loss`, `auc`, `auc_precision_recall`, the
  threshold ones and per class in `classes_for_class_based_metrics`
  `probability_mean|auc|auc_precision_recall/class<i>` (or `/<vocabulary name>`);
  regression `average_loss`, `prediction/mean`, `label/mean`; every head
  `regularization_loss` when regularization losses are given; keys suffixed
  `/<name>` for a named head. `loss` (the mean over batches of the regularized
  loss) is added by the Estimator.
- export outputs: classification heads `serving_default` and `classification`
  (`ClassificationOutput(scores=probabilities, classes=all_classes)`),
  binary also `regression` (the logistic); regression heads
  `serving_default` and `regression`; every head `predict` (all predictions).

Losses: unreduced `[B, 1]` (multi-label: the mean over classes), weighted by
the weight column (a feature key or numeric column: float `[B]` or `[B, 1]`)
and reduced by `loss_reduction`: 'sum_over_batch_size' (2.15's default: the
weighted sum over the number of elements) or 'sum'.
"""

from __future__ import annotations

import tensorflow as tf

from lowlevel.estimator.canned import head_metrics as hm
from lowlevel.models import export_outputs as outputs
from lowlevel.models.spec import EstimatorSpec, ModeKeys

v1 = tf.compat.v1
SUM_OVER_BATCH_SIZE, SUM = "sum_over_batch_size", "sum"
_REDUCTIONS = (SUM_OVER_BATCH_SIZE, SUM)  # 2.15's heads take these two (errors.json)
LOSS_REGULARIZATION = "regularization_loss"  # 2.15's MetricKeys.LOSS_REGULARIZATION


class Head:
    """The base of every head; a user's subclass implements the abstract parts.

    Subclasses set `name` (str or None: metric and summary keys get a "/name"
    suffix, as 2.15's `_summary_key`), `logits_dimension` (int) and
    `loss_reduction`, and implement `_unweighted_loss(labels, logits)` (float
    `[B, 1]`), `predictions(logits)`, `metrics(regularization_losses=None)`,
    `update_metrics(eval_metrics, features, logits, labels,
    regularization_losses=None)` and `_export_outputs(predictions)`; or override
    `create_estimator_spec` itself. As tensorflow_estimator 2.15's base_head.py,
    EVAL's `eval_metric_ops` are `update_metrics(metrics(...), ...)`.
    """

    name = None
    logits_dimension = 1
    loss_reduction = SUM_OVER_BATCH_SIZE
    weight_column = None

    def _labels(self, labels):  # -> labels as the loss takes them (float or int ids)
        return labels

    def _unweighted_loss(self, labels, logits):
        raise NotImplementedError

    def predictions(self, logits, keys=None):
        """{prediction key: Tensor} from logits (abstract: NotImplementedError here)."""
        raise NotImplementedError("Calling an abstract method.")

    def metrics(self, regularization_losses=None):
        """{metric key (str): metric object} for EVAL, not yet updated (abstract, as
        2.15's `Head.metrics`: NotImplementedError here). The heads here return
        `canned.head_metrics` objects (Keras-metric interface, graph mode)."""
        raise NotImplementedError("Calling an abstract method.")

    def update_metrics(self, eval_metrics, features, logits, labels, mode=None,
                       regularization_losses=None):
        """Updates `eval_metrics` (a dict from `metrics()`) with a batch's logits and
        labels and returns the updated dict (abstract, as 2.15's
        `Head.update_metrics`: NotImplementedError here; `mode` is unused)."""
        raise NotImplementedError("Calling an abstract method.")

    def _export_outputs(self, predictions):
        raise NotImplementedError

    def _summary_key(self, key):
        """2.15's: `key/name` for a named head, else `key`."""
        return f"{key}/{self.name}" if self.name else key

    def _weights(self, features, logits):
        if self.weight_column is None:
            return tf.ones_like(logits[:, :1])
        key = getattr(self.weight_column, "key", self.weight_column)
        if key not in features:
            raise ValueError(f"Feature {key} is not in features dictionary.")
        weights = tf.cast(features[key], tf.float32)
        return tf.reshape(weights, [-1, 1])

    def _reduce(self, unweighted, weights):
        weighted = unweighted * weights
        if self.loss_reduction == SUM:
            return tf.reduce_sum(weighted)
        return tf.reduce_sum(weighted) / tf.cast(tf.size(weighted), tf.float32)

    def _loss_parts(self, features, logits, labels):
        """(processed labels, unweighted loss `[B, ...]`, weights float32 `[B, 1]`)."""
        labels = self._labels(labels)
        return labels, self._unweighted_loss(labels, logits), \
            self._weights(features or {}, logits)

    def loss(self, labels, logits, features=None, mode=None, regularization_losses=None):
        """The regularized training loss: float32 scalar."""
        unweighted = self._unweighted_loss(self._labels(labels), logits)
        loss = self._reduce(unweighted, self._weights(features or {}, logits))
        if regularization_losses:
            loss += tf.add_n(list(regularization_losses))
        return loss

    def create_estimator_spec(self, features, mode, logits, labels=None, optimizer=None,
                              trainable_variables=None, train_op_fn=None, update_ops=None,
                              regularization_losses=None):
        """The EstimatorSpec of `mode` (2.15's `Head.create_estimator_spec`).

        TRAIN: `optimizer` (a `tf.compat.v1.train.Optimizer` or one
        `canned.optimizers.get_optimizer_instance` accepts) minimises the
        regularized loss over `trainable_variables` (default: the trainable
        variables) with the global step, or `train_op_fn(loss)` makes the op;
        ValueError if both or neither are given. `update_ops` run with it.
        EVAL: `eval_metric_ops` = `update_metrics(metrics(reg), features, logits,
        labels, regularization_losses=reg)`, reg being `regularization_losses`
        (None when empty). ValueError when labels are missing in TRAIN or EVAL.
        """
        logits = tf.convert_to_tensor(logits)
        predictions = self.predictions(logits)
        if mode == ModeKeys.PREDICT:
            return EstimatorSpec(mode, predictions=predictions,
                                 export_outputs=self._export_outputs(predictions))
        if labels is None:
            raise ValueError("You must provide a labels Tensor. Given: None. Suggested "
                             "troubleshooting steps: Check that your data contain your label "
                             "feature. Check that your input_fn properly parses and returns "
                             "labels.")
        _, unweighted, weights = self._loss_parts(features, logits, labels)
        loss = self._reduce(unweighted, weights)
        if regularization_losses:
            loss += tf.add_n(list(regularization_losses))
        if mode == ModeKeys.EVAL:
            return EstimatorSpec(mode, predictions=predictions, loss=loss,
                                 eval_metric_ops=self._updated_metrics(
                                     features, logits, labels, regularization_losses))
        train_op = _train_op(loss, optimizer, trainable_variables, train_op_fn, update_ops)
        return EstimatorSpec(mode, predictions=predictions, loss=loss, train_op=train_op)

    def _updated_metrics(self, features, logits, labels, regularization_losses):
        reg = list(regularization_losses) if regularization_losses else None
        eval_metrics = self.metrics(regularization_losses=reg)
        return self.update_metrics(eval_metrics, features, logits, labels,
                                   regularization_losses=reg)

    def _update_regularization(self, eval_metrics, regularization_losses):
        if regularization_losses is not None:
            eval_metrics[self._summary_key(LOSS_REGULARIZATION)].update_state(
                values=tf.add_n(list(regularization_losses)))


def _train_op(loss, optimizer, trainable_variables, train_op_fn, update_ops):
    if optimizer is not None and train_op_fn is not None:
        raise ValueError("train_op_fn and optimizer cannot both be set.")
    if optimizer is not None:
        from lowlevel.estimator.canned import optimizers  # noqa: PLC0415 (a cycle otherwise)
        optimizer = optimizers.get_optimizer_instance(optimizer)
        global_step = v1.train.get_or_create_global_step()
        with tf.name_scope("training"):
            train_op = optimizer.minimize(loss, global_step=global_step,
                                          var_list=trainable_variables)
    elif train_op_fn is not None:
        train_op = train_op_fn(loss)
    else:
        raise ValueError("train_op_fn and optimizer cannot both be None.")
    if update_ops:
        train_op = tf.group(train_op, *update_ops)
    return train_op


def _check_reduction(loss_reduction):
    if loss_reduction not in _REDUCTIONS:
        raise ValueError(f"Invalid loss_reduction: {loss_reduction}. See `tf.losses.Reduction` "
                         "for valid options.")
    return loss_reduction


def _as_column(labels, dtype=None):
    labels = tf.convert_to_tensor(labels)
    if labels.shape.rank == 1:
        labels = tf.expand_dims(labels, -1)
    return labels if dtype is None else tf.cast(labels, dtype)


def _class_strings(n_classes, label_vocabulary):
    if label_vocabulary:
        return tf.constant(list(label_vocabulary), tf.string)
    return tf.strings.as_string(tf.range(n_classes))


def _label_ids(labels, n_classes, label_vocabulary, integer=True):
    """Labels -> int64 class ids `[B, 1]`, checked to be in [0, n_classes); `integer`:
    ValueError for float labels (2.15's multi-class head; its binary head takes 0.0/1.0)."""
    labels = _as_column(labels)
    if label_vocabulary:
        if labels.dtype != tf.string:
            raise ValueError("Labels dtype should be string if there is a vocabulary. "
                             f"Instead got {labels.dtype}")
        table = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
            list(label_vocabulary), tf.range(len(label_vocabulary), dtype=tf.int64)), -1)
        ids = table.lookup(labels)
        check = tf.debugging.assert_non_negative(ids, message="Labels must be in the "
                                                 "label_vocabulary")
    else:
        if labels.dtype == tf.string or (integer and not labels.dtype.is_integer):
            raise ValueError(f"Labels dtype should be integer. Instead got {labels.dtype}.")
        ids = tf.cast(labels, tf.int64)
        check = tf.group(
            tf.debugging.assert_non_negative(ids, message="Labels must be >= 0"),
            tf.debugging.assert_less_equal(ids, tf.constant(n_classes - 1, tf.int64),
                                           message="Labels must be <= n_classes - 1"))
    with tf.control_dependencies([check]):
        return tf.identity(ids)


def _classes_predictions(logits, probabilities, n_classes, label_vocabulary):
    class_ids = tf.argmax(probabilities, axis=-1, output_type=tf.int64)[:, None]
    strings = _class_strings(n_classes, label_vocabulary)
    batch = tf.shape(logits)[:1]
    all_ids = tf.tile(tf.range(n_classes, dtype=tf.int32)[None, :],
                      tf.concat([batch, [1]], 0))
    return {"logits": logits, "probabilities": probabilities, "class_ids": class_ids,
            "classes": tf.gather(strings, class_ids),
            "all_class_ids": all_ids, "all_classes": tf.gather(strings, all_ids)}


def _classification_outputs(predictions):
    out = outputs.ClassificationOutput(scores=predictions["probabilities"],
                                       classes=predictions["all_classes"])
    return {"serving_default": out, "classification": out,
            "predict": outputs.PredictOutput(predictions)}


_THRESHOLD_KINDS = (("accuracy", hm.BinaryAccuracy, "threshold"),
                    ("precision", hm.Precision, "thresholds"),
                    ("recall", hm.Recall, "thresholds"))


def _auc_metrics(summary_key) -> dict:
    """2.15's `auc` (ROC) and `auc_precision_recall` (PR) metrics, in that order."""
    return {summary_key("auc"): hm.AUC(name="auc"),
            summary_key("auc_precision_recall"): hm.AUC(curve="PR",
                                                        name="auc_precision_recall")}


def _regularization_metric(summary_key, regularization_losses) -> dict:
    """2.15's `regularization_loss` Mean when `regularization_losses` is not None, else {}."""
    if regularization_losses is None:
        return {}
    return {summary_key(LOSS_REGULARIZATION): hm.Mean(name=LOSS_REGULARIZATION)}


def _threshold_metrics(summary_key, thresholds):
    """2.15's `accuracy|precision|recall/positive_threshold_<t>` metrics, by threshold."""
    found = {}
    for t in thresholds:
        for kind, cls, arg in _THRESHOLD_KINDS:
            key = summary_key(f"{kind}/positive_threshold_{t:g}")
            found[key] = cls(name=key, **{arg: t})
    return found


def _update_thresholds(eval_metrics, summary_key, thresholds, labels, scores, weights):
    for t in thresholds:
        for kind, _, _ in _THRESHOLD_KINDS:
            eval_metrics[summary_key(f"{kind}/positive_threshold_{t:g}")].update_state(
                y_true=labels, y_pred=scores, sample_weight=weights)


class BinaryClassHead(Head):
    """Two classes, one logit: sigmoid cross-entropy (2.15's `BinaryClassHead`).

    Args: weight_column; thresholds (floats in (0, 1): more accuracy, precision
    and recall metrics at each, keyed `accuracy/positive_threshold_0.7` as
    2.15); label_vocabulary (2 strings; labels are then strings); loss_reduction;
    name. Labels: int or float in {0, 1} `[B]` or `[B, 1]`.
    """

    logits_dimension = 1

    def __init__(self, weight_column=None, thresholds=None, label_vocabulary=None,
                 loss_reduction=SUM_OVER_BATCH_SIZE, loss_fn=None, name=None):
        if label_vocabulary is not None and len(label_vocabulary) != 2:
            raise ValueError(f"label_vocabulary length must be 2. Given: {len(label_vocabulary)}")
        for t in thresholds or ():
            if not 0.0 < t < 1.0:
                raise ValueError(f"thresholds not in (0, 1): {(tuple(thresholds),)}.")
        self.weight_column, self.thresholds = weight_column, tuple(thresholds or ())
        self.label_vocabulary, self.loss_fn, self.name = label_vocabulary, loss_fn, name
        self.loss_reduction = _check_reduction(loss_reduction)

    def _labels(self, labels):
        return _label_ids(labels, 2, self.label_vocabulary, integer=False)

    def _unweighted_loss(self, labels, logits):
        if self.loss_fn is not None:
            return _as_column(self.loss_fn(labels=labels, logits=logits), tf.float32)
        return tf.nn.sigmoid_cross_entropy_with_logits(labels=tf.cast(labels, tf.float32),
                                                       logits=logits)

    def predictions(self, logits, keys=None):
        logistic = tf.sigmoid(logits)
        probabilities = tf.nn.softmax(tf.concat([tf.zeros_like(logits), logits], -1))
        found = _classes_predictions(logits, probabilities, 2, self.label_vocabulary)
        found["logistic"] = logistic
        return {k: v for k, v in found.items() if keys is None or k in keys}

    def metrics(self, regularization_losses=None):
        """{key: metric} as 2.15's binary_class_head.py: `average_loss` (Mean),
        `accuracy` (Accuracy), `precision`, `recall`, `prediction/mean`, `label/mean`,
        `accuracy_baseline` (Means), `auc`, `auc_precision_recall` (AUC), then
        `regularization_loss` (Mean) when `regularization_losses` is not None, then
        per threshold BinaryAccuracy, Precision, Recall; keys `/name`-suffixed."""
        key = self._summary_key
        with tf.name_scope("metrics"):
            found = {key("average_loss"): hm.Mean(name="average_loss"),
                     key("accuracy"): hm.Accuracy(name="accuracy"),
                     key("precision"): hm.Precision(name="precision"),
                     key("recall"): hm.Recall(name="recall"),
                     key("prediction/mean"): hm.Mean(name="prediction/mean"),
                     key("label/mean"): hm.Mean(name="label/mean"),
                     key("accuracy_baseline"): hm.Mean(name="accuracy_baseline"),
                     **_auc_metrics(key)}
            found.update(_regularization_metric(key, regularization_losses))
            found.update(_threshold_metrics(key, self.thresholds))
        return found

    def update_metrics(self, eval_metrics, features, logits, labels,
                       regularization_losses=None):
        """Updates `eval_metrics` (from `metrics()`) with float32 logits `[B, 1]` and
        labels `[B]`/`[B, 1]` (weighted by the weight column of `features`), returns it.
        As 2.15's: precision and recall of `class_ids`, AUCs and threshold metrics of the
        logistic; `accuracy_baseline` = max(label mean, 1 - label mean) from `label/mean`'s
        variables (its own update is a no-op). KeyError for a missing key; ValueError for
        a missing weight feature."""
        logits = tf.convert_to_tensor(logits)
        predictions = self.predictions(logits)
        labels, unweighted, weights = self._loss_parts(features, logits, labels)
        key, logistic = self._summary_key, predictions["logistic"]
        eval_metrics[key("average_loss")].update_state(values=unweighted,
                                                       sample_weight=weights)
        for name in ("accuracy", "precision", "recall"):
            eval_metrics[key(name)].update_state(
                y_true=labels, y_pred=predictions["class_ids"], sample_weight=weights)
        hm.update_with_broadcast_weights(eval_metrics[key("prediction/mean")], logistic,
                                         weights)
        hm.update_with_broadcast_weights(eval_metrics[key("label/mean")], labels, weights)
        label_mean = eval_metrics[key("label/mean")]
        baseline = eval_metrics[key("accuracy_baseline")]
        baseline.add_update(tf.no_op())
        baseline.total = tf.maximum(label_mean.total, label_mean.count - label_mean.total)
        baseline.count = label_mean.count
        for name in ("auc", "auc_precision_recall"):
            eval_metrics[key(name)].update_state(y_true=labels, y_pred=logistic,
                                                 sample_weight=weights)
        self._update_regularization(eval_metrics, regularization_losses)
        _update_thresholds(eval_metrics, key, self.thresholds, labels, logistic, weights)
        return eval_metrics

    def _export_outputs(self, predictions):
        found = _classification_outputs(predictions)
        found["regression"] = outputs.RegressionOutput(predictions["logistic"])
        return found


class MultiClassHead(Head):
    """n_classes > 2 classes: softmax cross-entropy (2.15's `MultiClassHead`).

    Labels: int class ids in [0, n_classes) `[B]` or `[B, 1]`, or strings of
    `label_vocabulary`.
    """

    def __init__(self, n_classes, weight_column=None, label_vocabulary=None,
                 loss_reduction=SUM_OVER_BATCH_SIZE, loss_fn=None, name=None):
        if n_classes is None or n_classes <= 2:
            raise ValueError(f"n_classes must be > 2: {n_classes}.")
        if label_vocabulary is not None and len(label_vocabulary) != n_classes:
            raise ValueError(f'"label_vocabulary" does not have "n_classes" items. '
                             f"len(label_vocabulary)={len(label_vocabulary)}, "
                             f"n_classes={n_classes}, label_vocabulary={label_vocabulary}")
        self.n_classes, self.logits_dimension = n_classes, n_classes
        self.weight_column, self.label_vocabulary = weight_column, label_vocabulary
        self.loss_fn, self.name = loss_fn, name
        self.loss_reduction = _check_reduction(loss_reduction)

    def _labels(self, labels):
        return _label_ids(labels, self.n_classes, self.label_vocabulary)

    def _unweighted_loss(self, labels, logits):
        if self.loss_fn is not None:
            return _as_column(self.loss_fn(labels=labels, logits=logits), tf.float32)
        return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels[:, 0],
                                                              logits=logits)[:, None]

    def predictions(self, logits, keys=None):
        found = _classes_predictions(logits, tf.nn.softmax(logits), self.n_classes,
                                     self.label_vocabulary)
        return {k: v for k, v in found.items() if keys is None or k in keys}

    def metrics(self, regularization_losses=None):
        """{key: metric} as 2.15's multi_class_head.py: `average_loss` (Mean),
        `regularization_loss` (Mean, when `regularization_losses` is not None),
        `accuracy` (Accuracy); keys `/name`-suffixed."""
        key = self._summary_key
        with tf.name_scope("metrics"):
            found = {key("average_loss"): hm.Mean(name="average_loss")}
            found.update(_regularization_metric(key, regularization_losses))
            found[key("accuracy")] = hm.Accuracy(name="accuracy")
        return found

    def update_metrics(self, eval_metrics, features, logits, labels,
                       regularization_losses=None):
        """Updates `eval_metrics` (from `metrics()`) with float32 logits
        `[B, n_classes]` and class-id (or vocabulary string) labels `[B]`/`[B, 1]`,
        weighted by the weight column of `features`; returns it (2.15's)."""
        logits = tf.convert_to_tensor(logits)
        class_ids = self.predictions(logits)["class_ids"]
        labels, unweighted, weights = self._loss_parts(features, logits, labels)
        key = self._summary_key
        eval_metrics[key("average_loss")].update_state(values=unweighted,
                                                       sample_weight=weights)
        eval_metrics[key("accuracy")].update_state(y_true=labels, y_pred=class_ids,
                                                   sample_weight=weights)
        self._update_regularization(eval_metrics, regularization_losses)
        return eval_metrics

    def _export_outputs(self, predictions):
        return _classification_outputs(predictions)


class MultiLabelHead(Head):
    """n_classes independent labels: sigmoid cross-entropy averaged over classes.

    Labels: a multi-hot int `[B, n_classes]`. Metrics: `auc`,
    `auc_precision_recall`, `average_loss` (and per class in
    `classes_for_class_based_metrics`: `auc/class{i}` and `auc_precision_recall/class{i}`).
    """

    def __init__(self, n_classes, weight_column=None, thresholds=None, label_vocabulary=None,
                 loss_reduction=SUM_OVER_BATCH_SIZE, loss_fn=None,
                 classes_for_class_based_metrics=None, name=None):
        if n_classes is None or n_classes < 2:
            raise ValueError(f"n_classes must be > 1 for multi-label classification. "
                             f"Given: {n_classes}")
        self.n_classes, self.logits_dimension = n_classes, n_classes
        self.weight_column, self.thresholds = weight_column, tuple(thresholds or ())
        self.label_vocabulary, self.loss_fn, self.name = label_vocabulary, loss_fn, name
        self.classes_for_class_based_metrics = tuple(classes_for_class_based_metrics or ())
        self.loss_reduction = _check_reduction(loss_reduction)

    def _labels(self, labels):
        return tf.cast(labels, tf.int64)

    def _unweighted_loss(self, labels, logits):
        if self.loss_fn is not None:
            return _as_column(self.loss_fn(labels=labels, logits=logits), tf.float32)
        each = tf.nn.sigmoid_cross_entropy_with_logits(labels=tf.cast(labels, tf.float32),
                                                       logits=logits)
        return tf.reduce_mean(each, axis=-1, keepdims=True)

    def predictions(self, logits, keys=None):
        found = _classes_predictions(logits, tf.sigmoid(logits), self.n_classes,
                                     self.label_vocabulary)
        found = {"logits": logits, "probabilities": found["probabilities"],
                 "classes": found["all_classes"]}  # 2.15: every class's name, [B, n]
        return {k: v for k, v in found.items() if keys is None or k in keys}

    def _class_keys(self):
        """[(class id, probability mean key, auc key, auc PR key)] of the class metrics."""
        found = []
        for i in self.classes_for_class_based_metrics:
            label = f"class{i}" if self.label_vocabulary is None else self.label_vocabulary[i]
            found.append((i, *(self._summary_key(f"{kind}/{label}") for kind in (
                "probability_mean", "auc", "auc_precision_recall"))))
        return found

    def metrics(self, regularization_losses=None):
        """{key: metric} as 2.15's multi_label_head.py: `average_loss` (Mean), `auc`,
        `auc_precision_recall` (AUC), `regularization_loss` (Mean, when
        `regularization_losses` is not None), per threshold BinaryAccuracy, Precision,
        Recall, per class of `classes_for_class_based_metrics`
        `probability_mean/class<i>` (Mean), `auc/class<i>`, `auc_precision_recall/class<i>`
        (`/<vocabulary name>` with a label_vocabulary); keys `/name`-suffixed."""
        key = self._summary_key
        with tf.name_scope("metrics"):
            found = {key("average_loss"): hm.Mean(name="average_loss"),
                     **_auc_metrics(key)}
            found.update(_regularization_metric(key, regularization_losses))
            found.update(_threshold_metrics(key, self.thresholds))
            for _, prob_key, auc_key, auc_pr_key in self._class_keys():
                found[prob_key] = hm.Mean(name=prob_key)
                found[auc_key] = hm.AUC(name=auc_key)
                found[auc_pr_key] = hm.AUC(curve="PR", name=auc_pr_key)
        return found

    def update_metrics(self, eval_metrics, features, logits, labels,
                       regularization_losses=None):
        """Updates `eval_metrics` (from `metrics()`) with float32 logits
        `[B, n_classes]` and multi-hot labels `[B, n_classes]`, weighted by the weight
        column of `features`; returns it (2.15's: AUCs over every (example, class)
        probability, threshold metrics per element, class metrics on class i's column)."""
        logits = tf.convert_to_tensor(logits)
        probabilities = self.predictions(logits)["probabilities"]
        labels, unweighted, weights = self._loss_parts(features, logits, labels)
        key = self._summary_key
        eval_metrics[key("average_loss")].update_state(values=unweighted,
                                                       sample_weight=weights)
        for name in ("auc", "auc_precision_recall"):
            eval_metrics[key(name)].update_state(y_true=labels, y_pred=probabilities,
                                                 sample_weight=weights)
        self._update_regularization(eval_metrics, regularization_losses)
        _update_thresholds(eval_metrics, key, self.thresholds, labels, probabilities,
                           weights)
        for i, prob_key, auc_key, auc_pr_key in self._class_keys():
            scores, truth = probabilities[..., i:i + 1], labels[..., i:i + 1]
            hm.update_with_broadcast_weights(eval_metrics[prob_key], scores, weights)
            for name in (auc_key, auc_pr_key):
                eval_metrics[name].update_state(y_true=truth, y_pred=scores,
                                                sample_weight=weights)
        return eval_metrics

    def _export_outputs(self, predictions):
        out = outputs.ClassificationOutput(scores=predictions["probabilities"],
                                           classes=predictions["classes"])
        return {"serving_default": out, "classification": out,
                "predict": outputs.PredictOutput(predictions)}


class RegressionHead(Head):
    """Squared error on `label_dimension` float labels (2.15's `RegressionHead`).

    `inverse_link_fn` (optional) maps logits to predictions; `logits` is then
    a prediction too.
    """

    def __init__(self, label_dimension=1, weight_column=None,
                 loss_reduction=SUM_OVER_BATCH_SIZE, loss_fn=None, inverse_link_fn=None,
                 name=None):
        if label_dimension < 1:
            raise ValueError(f"Invalid label_dimension {label_dimension}.")
        self.logits_dimension = label_dimension
        self.weight_column, self.loss_fn, self.name = weight_column, loss_fn, name
        self.inverse_link_fn = inverse_link_fn
        self.loss_reduction = _check_reduction(loss_reduction)

    def _labels(self, labels):
        labels = _as_column(labels, tf.float32)
        width = labels.shape[-1]
        if width is not None and width != self.logits_dimension:
            raise ValueError(
                f"Mismatched label shape. Expected labels dimension={self.logits_dimension}.  "
                f"Received {width}. Suggested Fix: If your classifier expects one-hot encoding "
                "label, check your n_classes argument to the estimator and/or the shape of "
                "your label. Otherwise, check the shape of your label.")
        return labels

    def _unweighted_loss(self, labels, logits):
        if self.loss_fn is not None:
            return _as_column(self.loss_fn(labels=labels, logits=logits), tf.float32)
        return tf.square(logits - labels)

    def predictions(self, logits, keys=None):
        if self.inverse_link_fn is None:
            found = {"predictions": logits}
        else:
            found = {"predictions": self.inverse_link_fn(logits), "logits": logits}
        return {k: v for k, v in found.items() if keys is None or k in keys}

    def _reduce(self, unweighted, weights):
        return super()._reduce(unweighted, tf.broadcast_to(weights, tf.shape(unweighted)))

    def metrics(self, regularization_losses=None):
        """{key: Mean} as 2.15's regression_head.py: `average_loss`, `prediction/mean`,
        `label/mean`, `regularization_loss` (when `regularization_losses` is not
        None); keys `/name`-suffixed."""
        key = self._summary_key
        with tf.name_scope("metrics"):
            found = {key(name): hm.Mean(name=name)
                     for name in ("average_loss", "prediction/mean", "label/mean")}
            found.update(_regularization_metric(key, regularization_losses))
        return found

    def update_metrics(self, eval_metrics, features, logits, labels,
                       regularization_losses=None):
        """Updates `eval_metrics` (from `metrics()`) with float32 logits
        `[B, label_dimension]` and labels of that shape (or `[B]`), weighted by the
        weight column of `features`; returns it (2.15's: means over every element)."""
        logits = tf.convert_to_tensor(logits)
        predicted = self.predictions(logits)["predictions"]
        labels, unweighted, weights = self._loss_parts(features, logits, labels)
        key = self._summary_key
        eval_metrics[key("average_loss")].update_state(values=unweighted,
                                                       sample_weight=weights)
        eval_metrics[key("label/mean")].update_state(values=labels, sample_weight=weights)
        hm.update_with_broadcast_weights(eval_metrics[key("prediction/mean")], predicted,
                                         weights)
        self._update_regularization(eval_metrics, regularization_losses)
        return eval_metrics

    def _export_outputs(self, predictions):
        out = outputs.RegressionOutput(predictions["predictions"])
        return {"serving_default": out, "regression": out,
                "predict": outputs.PredictOutput(predictions)}


class PoissonRegressionHead(RegressionHead):
    """Counts: `tf.nn.log_poisson_loss(labels, logits, compute_full_loss=True)`,
    predictions exp(logits) (2.15's `PoissonRegressionHead`)."""

    def __init__(self, label_dimension=1, weight_column=None,
                 loss_reduction=SUM_OVER_BATCH_SIZE, compute_full_loss=True, name=None):
        super().__init__(label_dimension, weight_column, loss_reduction,
                         inverse_link_fn=tf.exp, name=name)
        self.compute_full_loss = compute_full_loss

    def _unweighted_loss(self, labels, logits):
        return tf.nn.log_poisson_loss(targets=labels, log_input=logits,
                                      compute_full_loss=self.compute_full_loss)


class LogisticRegressionHead(RegressionHead):
    """Labels in [0, 1]: sigmoid cross-entropy, predictions sigmoid(logits)
    (2.15's `LogisticRegressionHead`)."""

    def __init__(self, weight_column=None, loss_reduction=SUM_OVER_BATCH_SIZE, name=None):
        super().__init__(1, weight_column, loss_reduction, inverse_link_fn=tf.sigmoid,
                         name=name)

    def _unweighted_loss(self, labels, logits):
        check = tf.debugging.assert_less_equal(labels, 1.0, message="Labels must be in range "
                                               "[0, 1]")
        with tf.control_dependencies([check, tf.debugging.assert_non_negative(labels)]):
            return tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits)


def binary_or_multi_class_head(n_classes, weight_column, label_vocabulary, loss_reduction):
    """2.15's `head_utils.binary_or_multi_class_head`: n_classes 2 -> BinaryClassHead,
    else MultiClassHead (whose ValueError "n_classes must be > 2: 1." 2.15 gives for
    fewer than 2)."""
    if n_classes == 2:
        return BinaryClassHead(weight_column=weight_column, label_vocabulary=label_vocabulary,
                               loss_reduction=loss_reduction)
    return MultiClassHead(n_classes, weight_column=weight_column,
                          label_vocabulary=label_vocabulary, loss_reduction=loss_reduction)
