"""`MultiHead`: several named heads trained as one model (tf.estimator.MultiHead), as
tensorflow_estimator 2.15's head/multi_head.py.

`MultiHead(heads, head_weights=None)` merges the heads of `lowlevel.estimator.canned.heads`
(or a user's `Head` subclass), each with its own `name` (str):

- logits: a dict {head name: float32 `[B, head.logits_dimension]`}, or one float32
  Tensor `[B, sum of the heads' logits_dimension]` split along its last axis in the
  order of `heads`;
- labels: a dict {head name: that head's labels};
- loss: the sum over heads of `head_weights[i] *` head i's reduced training loss
  (float32 scalar; weights default 1), plus the sum of `regularization_losses`;
- predictions: {(head name, key): Tensor} (tuple keys, as 2.15);
- eval metrics (`metrics()` then `update_metrics()`, as 2.15's; metric objects of
  `canned.head_metrics`): `regularization_loss/<multi-head name>` when regularization
  losses are given, `loss/<head name>` (the mean over batches of head i's
  unweighted-by-head_weights training loss), and each head's (suffixed `/<head name>`);
- export outputs: `serving_default` = the first head's default, `<head name>` =
  each head's default, `<head name>/<key>` its others, and `predict` = one
  PredictOutput of every head's predictions keyed `<head name>/<key>`;
- TRAIN: `optimizer` or `train_op_fn` applied to the merged loss; summaries `loss`,
  `loss/<head name>` (and `regularization_loss`). The optimizer's variables are
  named `training_<n>/<Optimizer>/...` for n heads (2.15 opens a root `training`
  name scope per head before its own: a 2.15 model_dir restores).

Errors (ValueError, 2.15's messages, tests/fixtures/canned215/multi_head.json):
no heads; a head without a name; head_weights of another length; `loss_reduction`
read when the heads' differ; logits or labels missing a head; labels not a dict;
a logits Tensor whose last dimension is not the sum (2.15's message, with its two
numbers swapped).
"""

from __future__ import annotations

import tensorflow as tf

from lowlevel.estimator.canned import head_metrics
from lowlevel.estimator.canned import heads as heads_lib
from lowlevel.estimator.canned import optimizers
from lowlevel.models import export_outputs as outputs
from lowlevel.models.spec import EstimatorSpec, ModeKeys

v1 = tf.compat.v1
DEFAULT_SERVING_KEY, PREDICT_SERVING_KEY = "serving_default", "predict"
LOSS_REGULARIZATION = heads_lib.LOSS_REGULARIZATION  # 2.15's MetricKeys' key


def _no_op_train_fn(loss):
    del loss
    return tf.no_op()


def _check_heads(heads, head_weights):
    if not heads:
        raise ValueError(f"Must specify heads. Given: {heads}")
    if head_weights and len(head_weights) != len(heads):
        raise ValueError("heads and head_weights must have the same size. Given len(heads): "
                         f"{len(heads)}. Given len(head_weights): {len(head_weights)}.")
    for head in heads:
        if head.name is None:
            raise ValueError(f"All given heads must have name specified. Given: {head}")


def _default_export_output(export_outputs, head_name):
    if len(export_outputs) == 1:
        return next(iter(export_outputs.values()))
    if DEFAULT_SERVING_KEY not in export_outputs:
        raise ValueError(f"{head_name} did not specify default export_outputs. Given: "
                         f"{export_outputs} Suggested fix: Use one of the heads in "
                         f"tf.estimator, or include key {DEFAULT_SERVING_KEY} in export_outputs.")
    return export_outputs[DEFAULT_SERVING_KEY]


def _with_prefix(opt, prefix):
    """`opt` (one of `canned.optimizers`, or their `Combined`), set to name its variables
    `<prefix>/<Optimizer>/...` instead of `training/...` (2.15's Keras optimizer takes the
    enclosing `training_<n>` scope); other optimizers as they are."""
    parts = [part for part, _ in getattr(opt, "_parts", ())] or [opt]
    for part in parts:
        if isinstance(part, optimizers.KerasNamedOptimizer):
            part.scope_prefix = prefix
    return opt


class MultiHead(heads_lib.Head):
    """tf.estimator.MultiHead (2.15): several named heads as one (see the module docstring).

    Args: heads (list/tuple of `Head`s, each with a distinct `name`; the first is
    served by default); head_weights (optional list of floats, one per head:
    each head's loss is multiplied by its weight before the sum). Raises
    ValueError (2.15's messages) for no heads, an unnamed head or head_weights
    of another length.
    """

    def __init__(self, heads, head_weights=None):
        _check_heads(heads, head_weights)
        self._heads = tuple(heads)
        self._head_weights = tuple(head_weights) if head_weights else ()
        self._loss_keys = tuple(f"loss/{head.name}" for head in self._heads)

    @property
    def name(self):
        """The heads' names joined by "_" (str)."""
        return "_".join(head.name for head in self._heads)

    @property
    def logits_dimension(self):
        """The sum of the heads' logits dimensions (int)."""
        return sum(head.logits_dimension for head in self._heads)

    @property
    def loss_reduction(self):
        """The heads' common loss_reduction; ValueError when they differ (2.15's message)."""
        found = [head.loss_reduction for head in self._heads]
        if len(set(found)) > 1:
            raise ValueError(f"The loss_reduction must be the same for different heads. "
                             f"Given: {found}")
        return found[0]

    def _split_logits(self, logits):
        """A float Tensor `[..., logits_dimension]` -> {head name: its slice of the last axis}."""
        with v1.name_scope("split_logits", values=[logits]):
            logits = tf.convert_to_tensor(logits)
            dims = [head.logits_dimension for head in self._heads]
            shape = logits.shape.as_list()
            if shape[-1] is not None and shape[-1] != sum(dims):
                raise ValueError(  # 2.15's message, its last two numbers swapped as 2.15's
                    f"Could not split logits of shape {shape!r} among the heads with "
                    f"individual logits dimensions: {dims!r}. The last dimension of the "
                    f"logits tensor should equal {shape[-1]} but is {sum(dims)}.")
            found, begin = {}, 0
            for head, dim in zip(self._heads, dims):
                found[head.name] = logits[..., begin:begin + dim]
                begin += dim
        return found

    def _check_logits_and_labels(self, logits, labels=None):
        names = [head.name for head in self._heads]
        if isinstance(logits, dict):
            missing = list(set(names) - set(logits))
            if missing:
                raise ValueError(f"logits has missing values for head(s): {missing}")
        else:
            logits = self._split_logits(logits)
        if labels is not None:
            if not isinstance(labels, dict):
                raise ValueError(f"labels must be a dict. Given: {labels}")
            missing = list(set(names) - set(labels))
            if missing:
                raise ValueError(f"labels has missing values for head(s): {missing}")
        return logits

    def _head_losses(self, labels, logits_dict, features, mode=None):
        return [head.loss(labels[head.name], logits_dict[head.name], features=features,
                          mode=mode) for head in self._heads]

    def _merge(self, losses, regularization_losses):
        with v1.name_scope("merge_losses"):
            if self._head_weights:
                losses = [loss * weight for loss, weight in zip(losses, self._head_weights)]
            merged = tf.add_n(losses)
            if regularization_losses:
                merged += tf.add_n(list(regularization_losses))
        return merged

    def loss(self, labels, logits, features=None, mode=None, regularization_losses=None):
        """The merged regularized training loss, float32 scalar (2.15's `MultiHead.loss`).

        labels: {head name: labels}; logits: a dict by head name or one Tensor
        (split). ValueError for missing heads or labels that are not a dict.
        """
        logits_dict = self._check_logits_and_labels(logits, labels)
        losses = self._head_losses(labels, logits_dict, features or {}, mode)
        return self._merge(losses, regularization_losses)

    def predictions(self, logits, keys=None):
        """{(head name, prediction key): Tensor} of every head (`keys` is ignored, as 2.15)."""
        logits_dict = self._check_logits_and_labels(logits)
        found = {}
        with v1.name_scope("merge_pred"):
            for head in self._heads:
                for key, value in head.predictions(logits_dict[head.name]).items():
                    found[(head.name, key)] = value
        return found

    def metrics(self, regularization_losses=None):
        """{key: head_metrics.Mean} as 2.15's multi_head.py: `regularization_loss/<name>`
        (when `regularization_losses` is not None), then `loss/<head name>` per head.
        The heads' own metrics join in `update_metrics`."""
        found = {}
        if regularization_losses is not None:
            found[self._summary_key(LOSS_REGULARIZATION)] = head_metrics.Mean(
                name=LOSS_REGULARIZATION)
        with v1.name_scope("merge_eval"):
            for key in self._loss_keys:
                found[key] = head_metrics.Mean(name=key)
        return found

    def update_metrics(self, eval_metrics, features, logits, labels,
                       regularization_losses=None):
        """Updates `eval_metrics` (from `metrics()`) and returns it with every head's
        metrics added (2.15's): `loss/<head name>` gets head i's reduced training loss
        (float32 scalar), then `head.update_metrics(head.metrics(), ...)` joins in.
        logits: dict by head name or one Tensor (split); labels: dict by head name.
        ValueError (2.15's messages) for a head missing in logits or labels."""
        logits_dict = self._check_logits_and_labels(logits, labels)
        if regularization_losses is not None:
            eval_metrics[self._summary_key(LOSS_REGULARIZATION)].update_state(
                values=tf.add_n(list(regularization_losses)))
        for key, head in zip(self._loss_keys, self._heads):
            head_logits, head_labels = logits_dict[head.name], labels[head.name]
            eval_metrics[key].update_state(values=head.loss(
                logits=head_logits, labels=head_labels, features=features))
            updated = head.update_metrics(head.metrics(), features, head_logits, head_labels)
            eval_metrics.update(updated or {})
        return eval_metrics

    def _merge_export_outputs(self, specs):
        """2.15's `_merge_predict_export_outputs`: the first head served by default."""
        found = {DEFAULT_SERVING_KEY: _default_export_output(specs[0].export_outputs,
                                                             self._heads[0].name)}
        merged = {}
        for head, spec in zip(self._heads, specs):
            for key, value in spec.export_outputs.items():
                found[head.name if key == DEFAULT_SERVING_KEY else f"{head.name}/{key}"] = value
                if key == PREDICT_SERVING_KEY and isinstance(value, outputs.PredictOutput):
                    for name, tensor in value.outputs.items():
                        merged[f"{head.name}/{name}"] = tensor
        found[PREDICT_SERVING_KEY] = outputs.PredictOutput(merged)
        return found

    def _head_specs(self, features, mode, logits_dict, labels):
        specs = []
        for head in self._heads:
            if mode == ModeKeys.TRAIN:
                with v1.name_scope(""), v1.name_scope("training"):
                    pass  # 2.15: each head's no-op train op opens a root `training` scope
            specs.append(head.create_estimator_spec(
                features=features, mode=mode, logits=logits_dict[head.name],
                labels=labels[head.name] if labels else None, train_op_fn=_no_op_train_fn))
        return specs

    def create_estimator_spec(self, features, mode, logits, labels=None, optimizer=None,
                              trainable_variables=None, train_op_fn=None, update_ops=None,
                              regularization_losses=None):
        """The merged EstimatorSpec of `mode` (2.15's `MultiHead.create_estimator_spec`).

        logits: dict by head name or one Tensor `[B, logits_dimension]`; labels:
        dict by head name (needed in TRAIN and EVAL). TRAIN: `optimizer` or
        `train_op_fn` (ValueError if both or neither) on the merged loss.
        """
        with v1.name_scope(self.name):
            logits_dict = self._check_logits_and_labels(logits, labels)
            specs = self._head_specs(features, mode, logits_dict, labels)
            predictions = self.predictions(logits_dict)
            if mode == ModeKeys.PREDICT:
                return EstimatorSpec(mode, predictions=predictions,
                                     export_outputs=self._merge_export_outputs(specs))
            losses = self._head_losses(labels, logits_dict, features)
            loss = self._merge(losses, regularization_losses)
            if mode == ModeKeys.EVAL:
                return EstimatorSpec(mode, predictions=predictions, loss=loss,
                                     eval_metric_ops=self._updated_metrics(
                                         features, logits, labels, regularization_losses))
            if mode != ModeKeys.TRAIN:
                raise ValueError(f"mode={mode} unrecognized")
            train_op = self._train_op(loss, optimizer, trainable_variables, train_op_fn,
                                      update_ops)
            self._summaries(loss, losses, regularization_losses)
            return EstimatorSpec(mode, predictions=predictions, loss=loss, train_op=train_op,
                                 eval_metric_ops={})

    def _train_op(self, loss, optimizer, trainable_variables, train_op_fn, update_ops):
        """In a root `training` scope, uniquified as 2.15's (`training_<n>` after n heads)."""
        self.loss_reduction  # noqa: B018 (2.15 reads it here: ValueError when the heads' differ)
        with v1.name_scope(""), v1.name_scope("training") as scope:
            if optimizer is not None and train_op_fn is None:
                optimizer = _with_prefix(optimizers.get_optimizer_instance(optimizer),
                                         scope.rstrip("/"))
            return heads_lib._train_op(loss, optimizer, trainable_variables,  # noqa: SLF001
                                       train_op_fn, update_ops)

    def _summaries(self, loss, losses, regularization_losses):
        with v1.name_scope(""):
            v1.summary.scalar("loss", loss)
            if regularization_losses:
                v1.summary.scalar(LOSS_REGULARIZATION, tf.add_n(list(regularization_losses)))
            for head, head_loss in zip(self._heads, losses):
                v1.summary.scalar(f"loss/{head.name}", head_loss)
