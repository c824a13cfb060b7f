"""One SavedModel with a model_fn's TRAIN, EVAL and PREDICT graphs, as 2.15's Estimator.

`export_all_saved_models(model, export_dir_base, input_receiver_fn_map, ...)`: the
observable behaviour of tensorflow_estimator 2.15's
`Estimator.experimental_export_all_saved_models` (`_export_all_saved_models`,
`_add_meta_graph_for_mode`, export_utils' `export_outputs_for_mode`):

- for each mode in `input_receiver_fn_map` (a dict ModeKeys -> receiver fn), in
  the order TRAIN, EVAL, PREDICT: a fresh graph (global_step, the seed), the
  receiver fn called (a `SupervisedInputReceiver` for TRAIN/EVAL gives labels),
  the model_fn called in that mode, the checkpoint restored, and one MetaGraphDef
  added with the tags `train` / `eval` / `serve`;
- signatures: TRAIN one `train` signature (`TrainOutput`: loss, predictions,
  metrics, method `tensorflow/supervised/training`), EVAL one `eval` signature
  (`EvalOutput`, `tensorflow/supervised/eval`), PREDICT the serving signatures
  of the spec's export_outputs (`lowlevel.outputs.serving`);
- the spec's train_op is kept in the collection `saved_model_train_op` (not run);
- the variables are saved once, with the first mode's graph;
- the directory, temp directory, assets.extra, checkpoint choice and restore
  error are `lowlevel.outputs.serving.export_saved_model`'s. Devices are cleared
  and default attributes stripped, so that TensorFlow 2.15 loads it.

ValueError "No valid modes for exporting found. Got dict_keys([...])." when the
map has no receiver fn for any of the three modes; ValueError "Couldn't find
trained model at <model_dir>." without a checkpoint.
"""

from __future__ import annotations

import os

import tensorflow as tf

from lowlevel.models import export_outputs as export_outputs_lib
from lowlevel.models import spec as spec_lib
from lowlevel.models.model_fn_model import ModelFnModel
from lowlevel.outputs import serving

v1 = tf.compat.v1
ModeKeys = spec_lib.ModeKeys

TRAIN_OP_KEY = "saved_model_train_op"  # tensorflow/python/saved_model/constants.py
_TAGS = {ModeKeys.TRAIN: ["train"], ModeKeys.EVAL: ["eval"],
         ModeKeys.PREDICT: [tf.saved_model.SERVING]}
_SUPERVISED = {ModeKeys.TRAIN: ("train", export_outputs_lib.TrainOutput),
               ModeKeys.EVAL: ("eval", export_outputs_lib.EvalOutput)}


def export_outputs_for_mode(spec):
    """{signature key: ExportOutput} for the spec's mode (2.15's export_outputs_for_mode)."""
    if spec.mode == ModeKeys.PREDICT:
        return export_outputs_lib.get_export_outputs(spec.export_outputs, spec.predictions)
    key, output_class = _SUPERVISED[spec.mode]
    return {key: output_class(loss=spec.loss, predictions=spec.predictions,
                              metrics=spec.eval_metric_ops)}


def _build_mode_graph(model: ModelFnModel, receiver_fn, mode):
    """(spec, signature map) of `mode` in the current default graph."""
    v1.train.create_global_step()
    v1.random.set_random_seed(model.run_config.tf_random_seed)
    receiver = receiver_fn()
    spec = spec_lib.call_model_fn(model.model_fn, receiver.features,
                                  getattr(receiver, "labels", None), mode, model.params,
                                  model.run_config)
    signatures = export_outputs_lib.build_all_signature_defs(
        receiver.receiver_tensors, export_outputs_for_mode(spec),
        getattr(receiver, "receiver_tensors_alternatives", None),
        serving_only=(mode == ModeKeys.PREDICT))
    return spec, signatures


def _add_train_op(train_op):
    if train_op is None:
        return
    if not isinstance(train_op, (tf.Tensor, tf.Operation)):
        raise TypeError(f"`train_op` {train_op} needs to be a Tensor or Op.")
    v1.add_to_collection(TRAIN_OP_KEY, train_op)


def _add_meta_graph_for_mode(builder, model, receiver_fn, checkpoint_path, save_variables,
                             mode, strip_default_attrs):
    with tf.Graph().as_default():
        spec, signatures = _build_mode_graph(model, receiver_fn, mode)
        with v1.Session(config=model.run_config.session_config) as session:
            local_init_op = (spec.scaffold.local_init_op
                             if spec.scaffold.local_init_op is not None
                             else v1.train.Scaffold.default_local_init_op())
            saver = spec.scaffold.saver or v1.train.Saver(sharded=True)
            serving._restore(saver, session, checkpoint_path, mode)
            _add_train_op(spec.train_op)
            kwargs = dict(tags=_TAGS[mode], signature_def_map=signatures,
                          assets_collection=v1.get_collection(v1.GraphKeys.ASSET_FILEPATHS),
                          main_op=local_init_op, saver=saver,
                          strip_default_attrs=strip_default_attrs, clear_devices=True)
            if save_variables:
                builder.add_meta_graph_and_variables(session, **kwargs)
            else:
                builder.add_meta_graph(**kwargs)


def _copy_assets_extra(temp_dir, assets_extra):
    for destination, source in (assets_extra or {}).items():
        target = os.path.join(tf.compat.as_bytes(temp_dir), b"assets.extra",
                              tf.compat.as_bytes(destination))
        tf.io.gfile.makedirs(os.path.dirname(target))
        tf.io.gfile.copy(source, target)


def export_all_saved_models(model: ModelFnModel, export_dir_base, input_receiver_fn_map,
                            assets_extra=None, as_text=False, checkpoint_path=None,
                            strip_default_attrs=True) -> bytes:
    """Writes `<export_dir_base>/<unix seconds>/` with one MetaGraphDef per mode; returns it.

    See the module docstring. input_receiver_fn_map: {ModeKeys.TRAIN/EVAL/PREDICT:
    receiver fn}; assets_extra: {relative destination: source path}; as_text:
    `saved_model.pbtxt`; checkpoint_path: default the latest. Returns the
    directory as bytes (2.15 does).
    """
    checkpoint_path = serving._checkpoint_to_export(model, checkpoint_path)
    export_dir = serving.timestamped_export_dir(export_dir_base)
    temp_dir = serving.temp_export_dir(export_dir)
    builder = v1.saved_model.Builder(temp_dir)
    save_variables = True
    for mode in (ModeKeys.TRAIN, ModeKeys.EVAL, ModeKeys.PREDICT):
        if input_receiver_fn_map.get(mode):
            _add_meta_graph_for_mode(builder, model, input_receiver_fn_map[mode],
                                     checkpoint_path, save_variables, mode, strip_default_attrs)
            save_variables = False
    if save_variables:
        raise ValueError(f"No valid modes for exporting found. Got {input_receiver_fn_map.keys()}.")
    builder.save(as_text)
    _copy_assets_extra(temp_dir, assets_extra)
    tf.io.gfile.rename(temp_dir, export_dir)
    return export_dir
