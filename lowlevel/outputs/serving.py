"""Serving inputs (`tf.estimator.export.*Receiver*`) and the SavedModel export of a model_fn.

The observable behaviour of tensorflow_estimator 2.15's `export/export.py`
(receivers, `build_raw_serving_input_receiver_fn`,
`build_parsing_serving_input_receiver_fn`, their ValueError messages) and of
`Estimator._export_all_saved_models` for the PREDICT mode:

`export_saved_model(model, export_dir_base, serving_input_receiver_fn, ...)`
builds a fresh graph (global_step, seed), calls the receiver fn and the
model_fn in PREDICT mode on the receiver's features, builds the
SignatureDef map from the spec's export_outputs (default: one PredictOutput
of the predictions under `serving_default`; a single output under another
key is also `serving_default`; outputs needing a string input are left out
when the receiver is not one string tensor), restores the checkpoint
(default the latest; else the warm-start checkpoint; else ValueError
"Couldn't find trained model at <model_dir>."), and writes a TF1 SavedModel
with the tag `serve`, the local-variable initializer as main op, the
checkpoint's variables, `assets.extra/` copies, into
`<export_dir_base>/temp-<unix seconds>/`, renamed to
`<export_dir_base>/<unix seconds>/` when complete. The graph is written
without device placements and without attributes at their default values,
so that TensorFlow 2.15 loads it. Returns the export directory as bytes
(2.15 does).
"""

from __future__ import annotations

import collections
import os
import time

import tensorflow as tf

from lowlevel.models import export_outputs as export_outputs_lib
from lowlevel.models import spec as spec_lib
from lowlevel.models.model_fn_model import ModelFnModel

logging = tf.compat.v1.logging  # the 'tensorflow' logger, as tensorflow_estimator 2.15 logs

v1 = tf.compat.v1

SINGLE_FEATURE_DEFAULT_NAME = "feature"
SINGLE_LABEL_DEFAULT_NAME = "label"
SINGLE_RECEIVER_DEFAULT_NAME = "input"
_DEFAULT_NAMES = {"feature": SINGLE_FEATURE_DEFAULT_NAME, "label": SINGLE_LABEL_DEFAULT_NAME,
                  "receiver_tensor": SINGLE_RECEIVER_DEFAULT_NAME,
                  "receiver_tensors_alternative": SINGLE_RECEIVER_DEFAULT_NAME}
_MAX_DIRECTORY_ATTEMPTS = 10


def _check_tensor(tensor, name, error_label="feature"):
    if isinstance(tensor, (tf.Tensor, tf.sparse.SparseTensor, tf.RaggedTensor)):
        return
    error = ValueError("{}{} must be a Tensor, SparseTensor, or RaggedTensor.".format(
        error_label, f" {name}" if name else ""))
    if not hasattr(tensor, "tensor"):
        raise error
    try:
        tf.convert_to_tensor(tensor)
    except TypeError:
        raise error from None


def wrap_and_check_input_tensors(tensors, field_name, allow_int_keys=False):
    """A dict name -> tensor of `tensors` (a single tensor gets 2.15's default name).

    Raises ValueError "<field>s must be defined." for None, "<field> keys must
    be strings: <key>." (or "strings or ints"), "<field> <name> must be a
    Tensor, SparseTensor, or RaggedTensor.".
    """
    if tensors is None:
        raise ValueError(f"{field_name}s must be defined.")
    if not isinstance(tensors, dict):
        tensors = {_DEFAULT_NAMES[field_name]: tensors}
    for name, tensor in tensors.items():
        if not isinstance(name, str):
            if not allow_int_keys:
                raise ValueError(f"{field_name} keys must be strings: {name}.")
            if not isinstance(name, int):
                raise ValueError(f"{field_name} keys must be strings or ints: {name}.")
        _check_tensor(tensor, name, error_label=field_name)
    return tensors


class ServingInputReceiver(collections.namedtuple(
        "ServingInputReceiver", ["features", "receiver_tensors",
                                 "receiver_tensors_alternatives"])):
    """What a serving_input_receiver_fn returns: features for the model_fn, tensors fed at serving.

    features: Tensor or dict (str/int keys) of Tensor/SparseTensor/RaggedTensor
    (a single one becomes {"feature": t}); receiver_tensors: Tensor or dict
    (a single one becomes {"input": t}); receiver_tensors_alternatives: None or
    a dict name -> receiver tensors. ValueError messages as 2.15.
    """

    def __new__(cls, features, receiver_tensors, receiver_tensors_alternatives=None):
        features = wrap_and_check_input_tensors(features, "feature", allow_int_keys=True)
        receiver_tensors = wrap_and_check_input_tensors(receiver_tensors, "receiver_tensor")
        if receiver_tensors_alternatives is not None:
            if not isinstance(receiver_tensors_alternatives, dict):
                raise ValueError("receiver_tensors_alternatives must be a dict: "
                                 f"{receiver_tensors_alternatives}.")
            for name, alternative in receiver_tensors_alternatives.items():
                receiver_tensors_alternatives[name] = wrap_and_check_input_tensors(
                    alternative, "receiver_tensors_alternative")
        return super().__new__(cls, features=features, receiver_tensors=receiver_tensors,
                               receiver_tensors_alternatives=receiver_tensors_alternatives)


class TensorServingInputReceiver(collections.namedtuple(
        "TensorServingInputReceiver", ["features", "receiver_tensors",
                                       "receiver_tensors_alternatives"])):
    """A ServingInputReceiver whose `features` is one Tensor passed to model_fn unwrapped."""

    def __new__(cls, features, receiver_tensors, receiver_tensors_alternatives=None):
        if features is None:
            raise ValueError("features must be defined.")
        _check_tensor(features, None)
        receiver = ServingInputReceiver(features, receiver_tensors,
                                        receiver_tensors_alternatives)
        return super().__new__(
            cls, features=receiver.features[SINGLE_FEATURE_DEFAULT_NAME],
            receiver_tensors=receiver.receiver_tensors,
            receiver_tensors_alternatives=receiver.receiver_tensors_alternatives)


class SupervisedInputReceiver(collections.namedtuple(
        "SupervisedInputReceiver", ["features", "labels", "receiver_tensors"])):
    """Features, labels and receiver tensors (for TRAIN/EVAL receivers); checked as 2.15."""

    def __new__(cls, features, labels, receiver_tensors):
        wrap_and_check_input_tensors(features, "feature", allow_int_keys=True)
        wrap_and_check_input_tensors(labels, "label", allow_int_keys=True)
        receiver_tensors = wrap_and_check_input_tensors(receiver_tensors, "receiver_tensor")
        return super().__new__(cls, features=features, labels=labels,
                               receiver_tensors=receiver_tensors)


def build_parsing_serving_input_receiver_fn(feature_spec, default_batch_size=None):
    """A receiver fn parsing serialized tf.Examples (string [default_batch_size]) with `feature_spec`.

    The placeholder is `input_example_tensor`, received under the key
    "examples"; features = `tf.compat.v1.io.parse_example(examples, feature_spec)`.
    """
    def serving_input_receiver_fn():
        examples = v1.placeholder(dtype=tf.string, shape=[default_batch_size],
                                  name="input_example_tensor")
        features = v1.io.parse_example(examples, feature_spec)
        return ServingInputReceiver(features, {"examples": examples})
    return serving_input_receiver_fn


def _placeholder_from_tensor(t, default_batch_size=None):
    shape = tf.TensorShape([default_batch_size]).concatenate(t.get_shape()[1:])
    try:
        name = t.op.name
    except AttributeError:  # an eager tensor: the placeholder keeps TensorFlow's default name
        name = None
    return v1.placeholder(dtype=t.dtype, shape=shape, name=name)


def build_raw_serving_input_receiver_fn(features, default_batch_size=None):
    """A receiver fn feeding raw tensors: one placeholder per feature (dtype, shape[1:]).

    `features`: dict name -> Tensor (eager or graph); the batch dimension
    becomes `default_batch_size` (None); a graph tensor's placeholder takes its
    op name, an eager one TensorFlow's default ("Placeholder", "Placeholder_1").
    """
    def serving_input_receiver_fn():
        tensors = {name: _placeholder_from_tensor(t, default_batch_size)
                   for name, t in features.items()}
        return ServingInputReceiver(tensors, tensors)
    return serving_input_receiver_fn


def timestamped_export_dir(export_dir_base) -> bytes:
    """`<export_dir_base>/<unix seconds>` (bytes) that does not exist yet; waits 1 s on a clash.

    RuntimeError after 10 attempts (2.15's `get_timestamped_export_dir`).
    """
    for attempt in range(1, _MAX_DIRECTORY_ATTEMPTS + 1):
        result = os.path.join(tf.compat.as_bytes(export_dir_base),
                              tf.compat.as_bytes(str(int(time.time()))))
        if not tf.io.gfile.exists(result):
            return result
        time.sleep(1)
        logging.warning("Directory %s already exists; retrying (attempt %d/%d)",
                        tf.compat.as_str(result), attempt, _MAX_DIRECTORY_ATTEMPTS)
    raise RuntimeError("Failed to obtain a unique export directory name after "
                       f"{_MAX_DIRECTORY_ATTEMPTS} attempts.")


def temp_export_dir(export_dir: bytes) -> bytes:
    """The sibling `temp-<name>` of an export directory (TensorFlow Serving skips it)."""
    dirname, basename = os.path.split(tf.compat.as_bytes(export_dir))
    return os.path.join(dirname, b"temp-" + basename)


def _checkpoint_to_export(model: ModelFnModel, checkpoint_path):
    if checkpoint_path:
        return checkpoint_path
    checkpoint_path = tf.train.latest_checkpoint(model.model_dir)
    if checkpoint_path:
        return checkpoint_path
    if model.warm_start:
        checkpoint_path = model.warm_start[0]
        if tf.io.gfile.isdir(checkpoint_path):
            checkpoint_path = tf.train.latest_checkpoint(checkpoint_path)
        return checkpoint_path
    raise ValueError(f"Couldn't find trained model at {model.model_dir}.")


def _restore(saver, session, checkpoint_path, mode):
    try:
        saver.restore(session, checkpoint_path)
    except tf.errors.NotFoundError as e:
        raise ValueError(
            "Could not load all requested variables from checkpoint. Please make sure your "
            "model_fn does not expect variables that were not saved in the checkpoint.\n\n"
            f"Encountered error with mode `{mode}` while restoring checkpoint from: "
            f"`{checkpoint_path}`. Full Traceback:\n\n{e}") from e


def _add_predict_meta_graph(builder, model, serving_input_receiver_fn, checkpoint_path,
                            strip_default_attrs):
    mode = spec_lib.ModeKeys.PREDICT
    with tf.Graph().as_default() as graph:
        v1.train.create_global_step(graph)
        v1.random.set_random_seed(model.run_config.tf_random_seed)
        receiver = serving_input_receiver_fn()
        spec = spec_lib.call_model_fn(model.model_fn, receiver.features,
                                      getattr(receiver, "labels", None), mode, model.params,
                                      model.run_config)
        outputs = export_outputs_lib.get_export_outputs(spec.export_outputs, spec.predictions)
        signatures = export_outputs_lib.build_all_signature_defs(
            receiver.receiver_tensors, outputs,
            getattr(receiver, "receiver_tensors_alternatives", None), serving_only=True)
        with v1.Session(config=model.run_config.session_config) as session:
            local_init_op = (spec.scaffold.local_init_op
                             if spec.scaffold.local_init_op is not None
                             else v1.train.Scaffold.default_local_init_op())
            saver = spec.scaffold.saver or v1.train.Saver(sharded=True)
            _restore(saver, session, checkpoint_path, mode)
            builder.add_meta_graph_and_variables(
                session, [tf.saved_model.SERVING], signature_def_map=signatures,
                assets_collection=v1.get_collection(v1.GraphKeys.ASSET_FILEPATHS),
                main_op=local_init_op, saver=saver, strip_default_attrs=strip_default_attrs,
                clear_devices=True)


def export_saved_model(model: ModelFnModel, export_dir_base, serving_input_receiver_fn,
                       assets_extra=None, as_text=False, checkpoint_path=None,
                       strip_default_attrs=True, mode=spec_lib.ModeKeys.PREDICT) -> bytes:
    """Writes `<export_dir_base>/<unix seconds>/` (see the module docstring); returns its path.

    assets_extra: {relative destination: source path} copied under
    `assets.extra/`; as_text: write `saved_model.pbtxt`; checkpoint_path:
    default the latest. Only `mode` PREDICT (the serving graph) is exported:
    ValueError for another mode. Raises ValueError "An input_receiver_fn must
    be defined." without a receiver fn.
    """
    if not serving_input_receiver_fn:
        raise ValueError("An input_receiver_fn must be defined.")
    if mode != spec_lib.ModeKeys.PREDICT:
        raise ValueError(f"lowlevel exports the PREDICT (serving) graph only; got mode {mode!r}")
    checkpoint_path = _checkpoint_to_export(model, checkpoint_path)
    export_dir = timestamped_export_dir(export_dir_base)
    temp_dir = temp_export_dir(export_dir)
    builder = v1.saved_model.Builder(temp_dir)
    _add_predict_meta_graph(builder, model, serving_input_receiver_fn, checkpoint_path,
                            strip_default_attrs)
    builder.save(as_text)
    for destination, source in (assets_extra or {}).items():
        target = os.path.join(tf.compat.as_bytes(temp_dir), b"assets.extra",
                              tf.compat.as_bytes(destination))
        tf.io.gfile.makedirs(os.path.dirname(target))
        tf.io.gfile.copy(source, target)
    tf.io.gfile.rename(temp_dir, export_dir)
    return export_dir
