"""Sequential heads (tensorflow_estimator 2.15's head/sequential_head.py).

`SequentialHeadWrapper` applies a static head (BinaryClassHead, MultiClassHead,
RegressionHead, ...) at every valid time step of a sequence model
(`RNNClassifier(return_sequences=True)` builds its head so; `RNNEstimator`
with `return_sequences=True` needs one). The sequence mask, a bool `[batch, time]`
tensor at `features[input_sequence_mask_key]`, tells the valid steps:

- TRAIN / EVAL: logits `[batch, time, logits_dimension]`, labels (`Tensor` or
  `SparseTensor` `[batch, time]` or `[batch, time, d]`) and the `feature_columns`
  features (typically the weight column, per step) are flattened to the valid steps
  (`[n_valid, ...]`, a rank-2 tensor gets a trailing 1) and handed to the static head:
  the loss and every eval metric are reduced over the valid steps only (the static
  head's `loss_reduction`: 'sum_over_batch_size' divides by the number of valid steps).
- PREDICT: the static head's predictions at every step (`[batch, time, ...]`; 2.15's
  per-example `all_class_ids` / `all_classes`, and MultiLabelHead's `classes`, stay
  `[batch, n_classes]`), plus the mask under `input_sequence_mask_key`.

As 2.15's: MultiHead is refused (ValueError), SparseTensor labels/features are taken in
index order (`tf.sparse.reorder`), and a flattened tensor whose length is not the mask's
number of valid steps fails at run time (InvalidArgumentError "Tensor shape is
incompatible with provided mask.").
"""

from __future__ import annotations

from collections.abc import Iterable

import tensorflow as tf

from lowlevel.estimator.canned import heads as heads_lib
from lowlevel.estimator.canned.multi_head import MultiHead
from lowlevel.models.spec import EstimatorSpec, ModeKeys

_MASK_MISMATCH = "Tensor shape is incompatible with provided mask."
# Predictions 2.15's heads build from the batch size only (`base_head.all_class_ids`,
# `all_classes`): per example, not per step, under a sequential head too.
_PER_EXAMPLE_KEYS = ("all_class_ids", "all_classes")


class SequentialHead(heads_lib.Head):
    """2.15's `_SequentialHead`: a head whose features hold a sequence mask.

    Subclasses implement `input_sequence_mask_key` (str: the key of the bool
    `[batch, time]` mask in the features dict) besides the Head interface.
    """

    @property
    def input_sequence_mask_key(self):
        """Key (str) of the sequence mask in the features dict (abstract:
        NotImplementedError here)."""
        raise NotImplementedError("Calling an abstract method.")


_SequentialHead = SequentialHead  # 2.15's name (rnn.py checks isinstance against it)


def _columns(feature_columns):
    """2.15's checks of `feature_columns`: a str or an iterable of str -> list of str."""
    feature_columns = feature_columns or []
    if not isinstance(feature_columns, Iterable):
        raise TypeError("`feature_columns` must be either a string or an iterable of "
                        f"strings got {type(feature_columns)} instead.")
    if isinstance(feature_columns, str):
        return [feature_columns]
    columns = list(feature_columns)
    for column in columns:
        if not isinstance(column, str):
            raise TypeError(f"Column must a string. Given type: {type(column)}.")
    return columns


class SequentialHeadWrapper(SequentialHead):
    """A static head applied at each valid step (as tensorflow_estimator 2.15's
    sequential_head.py `SequentialHeadWrapper`; see the module docstring).

    Args:
      static_head: the `Head` to wrap (not a MultiHead: ValueError).
      sequence_length_mask: str, the features key of the bool `[batch, time]` mask
        (TypeError if not a str).
      feature_columns: str or iterable of str (TypeError otherwise): the features
        flattened with the mask and passed to the static head, e.g. its weight column.
    """

    def __init__(self, static_head, sequence_length_mask="sequence_length_mask",
                 feature_columns=None):
        if not isinstance(sequence_length_mask, str):
            raise TypeError("`sequence_mask` column must be a string. "
                            f"Given type: {type(sequence_length_mask)}.")
        self._sequence_length_mask = sequence_length_mask
        self._feature_columns = _columns(feature_columns)
        if isinstance(static_head, MultiHead):
            raise ValueError("`MultiHead` is not supported with `SequentialHeadWrapper`.")
        self._static_head = static_head

    @property
    def input_sequence_mask_key(self):
        """The features key (str) of the sequence mask."""
        return self._sequence_length_mask

    @property
    def logits_dimension(self):
        """The static head's logits dimension (int)."""
        return self._static_head.logits_dimension

    @property
    def loss_reduction(self):
        """The static head's loss reduction (str)."""
        return self._static_head.loss_reduction

    @property
    def name(self):
        """`<static head's name>_sequential`, or None for an unnamed static head."""
        return f"{self._static_head.name}_sequential" if self._static_head.name else None

    @property
    def static_head(self):
        """The wrapped static head."""
        return self._static_head

    def _mask(self, features):
        key = self.input_sequence_mask_key
        if key not in features:
            raise ValueError(f"The provided sequence_length_mask key `{key}` should be "
                             "included in the features dictionary, but was not found. "
                             f"Found keys: {list(features.keys())}.")
        mask = features[key]
        if mask.get_shape().ndims != 2:
            raise ValueError("Mask is expected to have two dimensions, got "
                             f"{mask.get_shape().ndims} instead.")
        return mask

    def _flatten(self, labels, logits, features):
        """(labels, logits, {feature_columns' features}) at the valid steps only: dense
        `[n_valid, ...]` (2.15's `_flatten`). ValueError for a missing mask or column, a
        mask not of rank 2, or a tensor of rank < 2."""
        features = features or {}
        mask = self._mask(features)
        if labels is None:
            raise ValueError("You must provide a labels Tensor. Given: None.")
        with tf.name_scope("flatten"):
            expected = tf.reduce_sum(tf.cast(mask, tf.int32))
            flat_logits = flatten_tensor(logits, mask, expected)
            flat_labels = flatten_tensor(labels, mask, expected)
            flat_features = {}
            for column in self._feature_columns:
                if column not in features:
                    raise ValueError(f"`{column}` column expected in features dictionary.")
                flat_features[column] = flatten_tensor(features[column], mask, expected)
        return flat_labels, flat_logits, flat_features

    def loss(self, logits, labels, features=None, mode=None, regularization_losses=None):
        """The static head's regularized loss (float32 scalar) over the valid steps:
        logits `[batch, time, d]`, labels `[batch, time(, d)]` (dense or sparse)."""
        flat_labels, flat_logits, flat_features = self._flatten(labels, logits, features)
        return self._static_head.loss(logits=flat_logits, labels=flat_labels,
                                      features=flat_features, mode=mode,
                                      regularization_losses=regularization_losses)

    def create_estimator_spec(self, features, mode, logits, labels=None, optimizer=None,
                              trainable_variables=None, train_op_fn=None, update_ops=None,
                              regularization_losses=None):
        """The EstimatorSpec of `mode` (2.15's): TRAIN / EVAL the static head's on the
        valid steps (see `loss`); PREDICT the predictions per step `[batch, time, ...]`
        and the mask (bool `[batch, time]`) under `input_sequence_mask_key`."""
        if mode == ModeKeys.PREDICT:
            return self._predict_spec(features, logits)
        flat_labels, flat_logits, flat_features = self._flatten(labels, logits, features)
        return self._static_head.create_estimator_spec(
            features=flat_features, mode=mode, logits=flat_logits, labels=flat_labels,
            optimizer=optimizer, trainable_variables=trainable_variables,
            train_op_fn=train_op_fn, update_ops=update_ops,
            regularization_losses=regularization_losses)

    def _predict_spec(self, features, logits):
        static = self._static_head
        if _overrides(static, "predictions") and _overrides(static, "_export_outputs"):
            predictions = self.predictions(logits)
            spec = EstimatorSpec(ModeKeys.PREDICT, predictions=predictions,
                                 export_outputs=static._export_outputs(predictions))
        else:  # a user's head: 2.15's way, its own spec on the 3-D logits
            spec = static.create_estimator_spec(features=features, mode=ModeKeys.PREDICT,
                                                logits=logits)
        predictions = dict(spec.predictions)  # the export outputs keep theirs (as 2.15)
        predictions[self.input_sequence_mask_key] = self._mask(features)
        return spec._replace(predictions=predictions)

    def predictions(self, logits, keys=None):
        """The static head's predictions at each step, `{key: [batch, time, ...]}` from
        float32 logits `[batch, time, logits_dimension]` (`all_class_ids`,
        `all_classes` and MultiLabelHead's `classes`: `[batch, n_classes]`, as 2.15)."""
        logits = tf.convert_to_tensor(logits)
        shape = tf.shape(logits)
        flat = tf.reshape(logits, tf.concat([[-1], shape[2:]], 0))
        flat.set_shape(tf.TensorShape([None]).concatenate(logits.shape[2:]))
        found = self._static_head.predictions(flat, keys=keys)
        per_example = [k for k in found if k in _PER_EXAMPLE_KEYS or (
            k == "classes" and isinstance(self._static_head, heads_lib.MultiLabelHead))]
        if per_example:
            dummy = tf.zeros(tf.concat([shape[:1], shape[2:]], 0), logits.dtype)
            dummy.set_shape(tf.TensorShape([None]).concatenate(logits.shape[2:]))
            found.update(self._static_head.predictions(dummy, keys=per_example))
        out = {}
        for key, value in found.items():
            if key in per_example:
                out[key] = value
                continue
            step = tf.reshape(value, tf.concat([shape[:2], tf.shape(value)[1:]], 0))
            step.set_shape(logits.shape[:2].concatenate(value.shape[1:]))
            out[key] = step
        return out

    def metrics(self, regularization_losses=None):
        """The static head's metrics (`{key: metric}`, not yet updated)."""
        return self._static_head.metrics(regularization_losses)

    def update_metrics(self, eval_metrics, features, logits, labels,
                       regularization_losses=None):
        """The static head's `update_metrics` on the valid steps (see `loss`); returns
        `eval_metrics`."""
        flat_labels, flat_logits, flat_features = self._flatten(labels, logits, features)
        return self._static_head.update_metrics(
            eval_metrics=eval_metrics, features=flat_features, logits=flat_logits,
            labels=flat_labels, regularization_losses=regularization_losses)


def _overrides(head, method):
    return getattr(type(head), method, None) is not getattr(heads_lib.Head, method)


def flatten_tensor(tensor, sequence_mask, expected_length):
    """`tensor`'s valid steps: a dense `[expected_length, D2, ...]` (2.15's `_flatten_tensor`).

    `tensor` a `Tensor` (`[batch, time, D2, ...]`, the steps where the bool
    `sequence_mask` `[batch, time]` is True) or a `SparseTensor` (its values in index
    order); a rank-2 result gets a trailing dimension of 1. ValueError for a rank < 2 or
    another type; at run time InvalidArgumentError (eager: ValueError) when the length is
    not `expected_length` (int32 scalar).
    """
    if not isinstance(tensor, tf.SparseTensor):
        tensor = tf.convert_to_tensor(tensor)
    shape = tensor.get_shape()
    if shape.ndims is None or shape.ndims < 2:
        raise ValueError("Input tensor expected to have at least 2 dimensions, "
                         f"got {shape.ndims} instead.")
    if isinstance(tensor, tf.SparseTensor):
        flat = tf.sparse.reorder(tensor).values
        if shape.ndims > 2:
            flat = tf.reshape(flat, tf.concat([[-1], shape[2:]], axis=0))
    else:
        flat = tf.boolean_mask(tensor, sequence_mask)
    if shape.ndims == 2:
        flat = tf.expand_dims(flat, -1)
        expected_shape = tf.stack([expected_length, 1])
    else:
        expected_shape = tf.concat([[expected_length], shape[2:]], axis=0)
    if tf.executing_eagerly():
        if tuple(flat.shape) != tuple(expected_shape.numpy()):
            raise ValueError(_MASK_MISMATCH)
        return flat
    check = tf.debugging.assert_equal(tf.shape(flat), expected_shape, message=_MASK_MISMATCH)
    with tf.control_dependencies([check]):
        return tf.identity(flat)
