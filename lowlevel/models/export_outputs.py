"""A model's serving outputs (`tf.estimator.export.*Output`) and the SignatureDefs built from them.

The observable behaviour of TensorFlow 2.15's
`tensorflow/python/saved_model/model_utils/export_output.py` and
`export_utils.py` (which tensorflow_estimator 2.15 re-exports), written anew
on TensorFlow 2.21's public `tf.compat.v1.saved_model.*_signature_def`:

- `PredictOutput(outputs)`: a Tensor (key "output") or a dict of them ->
  method `tensorflow/serving/predict`, inputs = the receiver tensors.
- `ClassificationOutput(scores=None, classes=None)`: scores float, classes
  string -> method `tensorflow/serving/classify`, input key `inputs`, output
  keys `scores`/`classes`; only for ONE string receiver tensor (serialized
  tf.Example), otherwise the signature is left out of an export (logged, as
  2.15 does).
- `RegressionOutput(value)`: float value -> `tensorflow/serving/regress`,
  input `inputs`, output `outputs`; same receiver rule.
- `EvalOutput` / `TrainOutput(loss=None, predictions=None, metrics=None)`:
  methods `tensorflow/supervised/eval` / `.../training`, outputs "loss/...",
  "predictions/...", "metrics/<key>/value|update_op" (not servable:
  `build_all_signature_defs(serving_only=True)` drops them).

`get_export_outputs` adds the default `serving_default` signature and
`build_all_signature_defs` turns a receiver and outputs into the map that
`SavedModelBuilder` writes. Error types and messages are 2.15's.
"""

from __future__ import annotations

import abc

import tensorflow as tf

from lowlevel.models import keras_metrics

logging = tf.compat.v1.logging  # the 'tensorflow' logger, as tensorflow_estimator 2.15 logs

DEFAULT_SERVING_SIGNATURE_DEF_KEY = "serving_default"
SINGLE_RECEIVER_DEFAULT_NAME = "input"
_SEPARATOR = "/"

_NEEDS_ONE_STRING_INPUT = (
    "{} signatures can only accept a single tensor input of type tf.string. Please check "
    "to make sure that you have structured the serving_input_receiver_fn so that it creates "
    "a single string placeholder. If your model function expects multiple inputs, then use "
    "`tf.io.parse_example()` to parse the string into multiple tensors.\n Received: {}")

_FRIENDLY_METHOD_NAMES = {
    "tensorflow/serving/classify": "Classify",
    "tensorflow/serving/regress": "Regress",
    "tensorflow/serving/predict": "Predict",
    "tensorflow/supervised/training": "Train",
    "tensorflow/supervised/eval": "Eval",
}


def _is_tensor(value) -> bool:
    return isinstance(value, tf.Tensor)


class ExportOutput(abc.ABC):
    """One output of a model that can be served: `as_signature_def(receiver_tensors)`.

    Subclasses return a `tf.compat.v1.saved_model` SignatureDef proto whose
    inputs are `receiver_tensors` (a dict of name -> Tensor).
    """

    @abc.abstractmethod
    def as_signature_def(self, receiver_tensors):
        """Returns the SignatureDef proto of this output fed by `receiver_tensors` (dict)."""

    @staticmethod
    def _check_output_key(key, error_label):
        if isinstance(key, tuple):
            key = _SEPARATOR.join(key)
        if not isinstance(key, str):
            raise ValueError(f"{error_label} output key must be a string; got {key}.")
        return key

    def _wrap_and_check_outputs(self, outputs, single_output_default_name, error_label=None):
        if not isinstance(outputs, dict):
            outputs = {single_output_default_name: outputs}
        checked = {}
        for key, value in outputs.items():
            error_name = error_label or single_output_default_name
            key = self._check_output_key(key, error_name)
            if not _is_tensor(value):
                raise ValueError(f"{error_name} output value must be a Tensor; got {value}.")
            checked[key] = value
        return checked


def _single_string_input(kind: str, receiver_tensors):
    if len(receiver_tensors) != 1:
        raise ValueError(_NEEDS_ONE_STRING_INPUT.format(kind, receiver_tensors))
    (_, examples), = receiver_tensors.items()
    if tf.as_dtype(examples.dtype) != tf.string:
        raise ValueError(_NEEDS_ONE_STRING_INPUT.format(kind, receiver_tensors))
    return examples


class ClassificationOutput(ExportOutput):
    """A classification head: `scores` (float Tensor [N, K]) and/or `classes` (string [N, K]).

    Raises ValueError (2.15's messages) for a non-float `scores`, a non-string
    `classes`, or neither given. Its signature (`tensorflow/serving/classify`)
    needs a single string receiver tensor.
    """

    def __init__(self, scores=None, classes=None):
        if scores is not None and not (_is_tensor(scores) and scores.dtype.is_floating):
            raise ValueError(f"Classification scores must be a float32 Tensor; got {scores}")
        if classes is not None and not (_is_tensor(classes) and
                                        tf.as_dtype(classes.dtype) == tf.string):
            raise ValueError(f"Classification classes must be a string Tensor; got {classes}")
        if scores is None and classes is None:
            raise ValueError("Cannot create a ClassificationOutput with empty arguments. At "
                             "least one of `scores` and `classes` must be defined.")
        self._scores = scores
        self._classes = classes

    @property
    def scores(self):
        """The float scores Tensor or None."""
        return self._scores

    @property
    def classes(self):
        """The string classes Tensor or None."""
        return self._classes

    def as_signature_def(self, receiver_tensors):
        """`tensorflow/serving/classify`: input `inputs`, outputs `classes`/`scores`."""
        examples = _single_string_input("Classification", receiver_tensors)
        return tf.compat.v1.saved_model.classification_signature_def(
            examples, self.classes, self.scores)


class RegressionOutput(ExportOutput):
    """A regression head: `value`, a float Tensor [N] or [N, 1].

    Raises ValueError if `value` is not a floating Tensor. Its signature
    (`tensorflow/serving/regress`, input `inputs`, output `outputs`) needs a
    single string receiver tensor.
    """

    def __init__(self, value):
        if not (_is_tensor(value) and value.dtype.is_floating):
            raise ValueError(f"Regression output value must be a float32 Tensor; got {value}")
        self._value = value

    @property
    def value(self):
        """The float value Tensor."""
        return self._value

    def as_signature_def(self, receiver_tensors):
        """`tensorflow/serving/regress`: input `inputs`, output `outputs`."""
        examples = _single_string_input("Regression", receiver_tensors)
        return tf.compat.v1.saved_model.regression_signature_def(examples, self.value)


class PredictOutput(ExportOutput):
    """A generic prediction head: a Tensor (output key "output") or a dict name -> Tensor.

    Raises ValueError ("Prediction output key must be a string; ..." or
    "Prediction output value must be a Tensor; ...") as 2.15.
    """

    _SINGLE_OUTPUT_DEFAULT_NAME = "output"

    def __init__(self, outputs):
        self._outputs = self._wrap_and_check_outputs(
            outputs, self._SINGLE_OUTPUT_DEFAULT_NAME, error_label="Prediction")

    @property
    def outputs(self):
        """The dict name -> Tensor."""
        return self._outputs

    def as_signature_def(self, receiver_tensors):
        """`tensorflow/serving/predict`: inputs = receiver tensors, outputs = `outputs`."""
        return tf.compat.v1.saved_model.predict_signature_def(receiver_tensors, self.outputs)


class _SupervisedOutput(ExportOutput):
    """Loss, predictions and metrics of a TRAIN or EVAL graph (TensorFlow 2.15's export_output).

    loss, predictions: a Tensor or dict of them, keys prefixed "loss/" and
    "predictions/" (unless they start so); metrics: a (value, update_op)
    tuple, a Keras metric object (Keras 2 or 3, `keras_metrics`) or a dict of
    them -> "metrics/<key>/value" and "metrics/<key>/update_op" (an Operation
    wrapped in an empty float32 constant run after it). ValueError with 2.15's
    messages for a non-string key or a non-Tensor value or update_op.
    """

    LOSS_NAME = "loss"
    PREDICTIONS_NAME = "predictions"
    METRICS_NAME = "metrics"
    METRIC_VALUE_SUFFIX = "value"
    METRIC_UPDATE_SUFFIX = "update_op"
    _METHOD_NAME = None

    def __init__(self, loss=None, predictions=None, metrics=None):
        self._loss = self._predictions = self._metrics = None
        if loss is not None:
            self._loss = self._prefixed(self._wrap_and_check_outputs(loss, self.LOSS_NAME),
                                        self.LOSS_NAME)
        if predictions is not None:
            self._predictions = self._prefixed(
                self._wrap_and_check_outputs(predictions, self.PREDICTIONS_NAME),
                self.PREDICTIONS_NAME)
        if metrics is not None:
            self._metrics = self._wrap_and_check_metrics(metrics)

    def _prefix_key(self, key, output_name):
        return key if key.find(output_name) == 0 else output_name + _SEPARATOR + key

    def _prefixed(self, outputs, output_name):
        return {self._prefix_key(k, output_name): v for k, v in outputs.items()}

    def _wrap_and_check_metrics(self, metrics):
        if not isinstance(metrics, dict):
            metrics = {self.METRICS_NAME: metrics}
        outputs = {}
        for key, value in metrics.items():
            value_tensor, update = (value if isinstance(value, tuple)
                                    else keras_metrics.as_metric_op(value))
            key = self._prefix_key(self._check_output_key(key, self.METRICS_NAME),
                                   self.METRICS_NAME)
            if not _is_tensor(value_tensor):
                raise ValueError(f"{key} output value must be a Tensor; got {value_tensor}.")
            if not isinstance(update, (tf.Tensor, tf.Operation, tf.Variable)):
                raise ValueError(f"{key} update_op must be a Tensor or Operation; got {update}.")
            if not isinstance(update, tf.Tensor):
                with tf.control_dependencies([update]):
                    update = tf.constant([], name="metric_op_wrapper")
            outputs[key + _SEPARATOR + self.METRIC_VALUE_SUFFIX] = value_tensor
            outputs[key + _SEPARATOR + self.METRIC_UPDATE_SUFFIX] = update
        return outputs

    @property
    def loss(self):
        """{"loss/...": Tensor} or None."""
        return self._loss

    @property
    def predictions(self):
        """{"predictions/...": Tensor} or None."""
        return self._predictions

    @property
    def metrics(self):
        """{"metrics/<key>/value" and ".../update_op": Tensor} or None."""
        return self._metrics

    def as_signature_def(self, receiver_tensors):
        """A SignatureDef of method `_METHOD_NAME`: inputs = receiver tensors, outputs = all.

        Raises ValueError "<method> `inputs` cannot be None or empty." for no inputs.
        """
        if not receiver_tensors:
            raise ValueError(f"{self._METHOD_NAME} `inputs` cannot be None or empty.")
        info = tf.compat.v1.saved_model.build_tensor_info
        outputs = {}
        for group in (self.loss, self.predictions, self.metrics):
            outputs.update({k: info(t) for k, t in (group or {}).items()})
        return tf.compat.v1.saved_model.build_signature_def(
            {k: info(t) for k, t in receiver_tensors.items()}, outputs, self._METHOD_NAME)


class TrainOutput(_SupervisedOutput):
    """The outputs of a TRAIN graph: method `tensorflow/supervised/training` (not served)."""

    _METHOD_NAME = "tensorflow/supervised/training"


class EvalOutput(_SupervisedOutput):
    """The outputs of an EVAL graph: method `tensorflow/supervised/eval` (not served)."""

    _METHOD_NAME = "tensorflow/supervised/eval"


def get_export_outputs(export_outputs, predictions):
    """Validates `export_outputs` or makes the default `{serving_default: PredictOutput}`.

    As 2.15's `export_utils.get_export_outputs`: None -> a PredictOutput of
    `predictions`; a single output under another key is also added as
    `serving_default`; several outputs without `serving_default` -> ValueError;
    not a dict, or a value not an ExportOutput -> TypeError.
    """
    if export_outputs is None:
        export_outputs = {DEFAULT_SERVING_SIGNATURE_DEF_KEY: PredictOutput(predictions)}
    if not isinstance(export_outputs, dict):
        raise TypeError(f"`export_outputs` must be dict, received: {export_outputs}.")
    for value in export_outputs.values():
        if not isinstance(value, ExportOutput):
            raise TypeError("Values in `export_outputs` must be ExportOutput objects, "
                            f"received: {export_outputs}.")
    if len(export_outputs) == 1:
        (key, value), = export_outputs.items()
        if key != DEFAULT_SERVING_SIGNATURE_DEF_KEY:
            export_outputs[DEFAULT_SERVING_SIGNATURE_DEF_KEY] = value
    if len(export_outputs) > 1 and DEFAULT_SERVING_SIGNATURE_DEF_KEY not in export_outputs:
        raise ValueError(
            "Multiple `export_outputs` were provided, but none of them are specified as the "
            "default. Use`tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY` to specify a "
            "default.")
    return export_outputs


def _dependency_placeholders(inputs, outputs):
    """Placeholders that `outputs` depend on without passing through `inputs`."""
    fed = {t.name for t in inputs}
    seen, stack, missing = set(), [t.op for t in outputs], []
    while stack:
        op = stack.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        if op.type == "Placeholder" and not all(o.name in fed for o in op.outputs):
            missing.append(op.name)
        for tensor in op.inputs:
            if tensor.name not in fed:
                stack.append(tensor.op)
        stack.extend(op.control_inputs)
    return missing


def _ensure_servable(receiver_tensors, signature):
    graph = next(iter(receiver_tensors.values())).graph
    outputs = [graph.get_tensor_by_name(info.name) for info in signature.outputs.values()]
    missing = _dependency_placeholders(list(receiver_tensors.values()), outputs)
    if missing:
        raise ValueError(
            f"The signature's input tensors {[t.name for t in receiver_tensors.values()]} are "
            f"insufficient to compute its output keys {list(signature.outputs.keys())} "
            f"(respectively, tensors {[t.name for t in outputs]}) because of the dependency "
            f"on `{missing[0]}` which is not given as a signature input")


def _add_signatures(signatures, excluded, receiver_tensors, export_outputs, prefix=""):
    for output_key, export_output in export_outputs.items():
        name = prefix + "{}".format(output_key or "None")
        try:
            signature = export_output.as_signature_def(receiver_tensors)
            _ensure_servable(receiver_tensors, signature)
            signatures[name] = signature
        except ValueError as e:
            excluded[name] = str(e)


def build_all_signature_defs(receiver_tensors, export_outputs,
                             receiver_tensors_alternatives=None, serving_only=True):
    """Returns {signature key: SignatureDef} for every export output, as 2.15.

    `receiver_tensors` is a Tensor (named "input") or a dict name -> Tensor;
    an output whose signature cannot be built from it (a ClassificationOutput
    fed by a float tensor, an output that needs another placeholder) is left
    out and logged ("Signatures EXCLUDED from export ..."), not raised.
    Alternatives add signatures "<receiver name>:<output key>". Raises
    ValueError if `export_outputs` is not a dict.
    """
    if not isinstance(receiver_tensors, dict):
        receiver_tensors = {SINGLE_RECEIVER_DEFAULT_NAME: receiver_tensors}
    if export_outputs is None or not isinstance(export_outputs, dict):
        raise ValueError(f"`export_outputs` must be a dict. Received {export_outputs} with "
                         f"type {type(export_outputs).__name__}.")
    signatures, excluded = {}, {}
    _add_signatures(signatures, excluded, receiver_tensors, export_outputs)
    for receiver_name, alternative in (receiver_tensors_alternatives or {}).items():
        if not isinstance(alternative, dict):
            alternative = {SINGLE_RECEIVER_DEFAULT_NAME: alternative}
        _add_signatures(signatures, excluded, alternative, export_outputs,
                        prefix="{}:".format(receiver_name or "None"))
    _log_signature_report(signatures, excluded)
    if serving_only:
        signatures = {k: v for k, v in signatures.items()
                      if tf.compat.v1.saved_model.is_valid_signature(v)}
    return signatures


def _log_signature_report(signatures, excluded):
    by_method = {method: [] for method in _FRIENDLY_METHOD_NAMES}
    for name, signature in signatures.items():
        by_method.setdefault(signature.method_name, []).append(name)
    for method, names in by_method.items():
        logging.info("Signatures INCLUDED in export for %s: %s",
                     _FRIENDLY_METHOD_NAMES.get(method, method), names or "None")
    if excluded:
        logging.info("Signatures EXCLUDED from export because they cannot be be served via "
                     "TensorFlow Serving APIs:")
        for name, message in excluded.items():
            logging.info("'%s' : %s", name, message)
    if not signatures:
        logging.warning("Export includes no signatures!")
    elif DEFAULT_SERVING_SIGNATURE_DEF_KEY not in signatures:
        logging.warning("Export includes no default signature!")
