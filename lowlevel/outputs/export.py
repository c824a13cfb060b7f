"""SavedModel export: the trained model, loadable with no cluster, no GPU and no lowlevel.

At the end of training the chief writes `<output_dir>/export/<global_step>/`
(the evaluator too, for each checkpoint it evaluates, with
`--export_every_checkpoint`), in the layout TensorFlow Serving watches (a
numbered version directory per export), holding a TF1 SavedModel
(`saved_model.pb`, `variables/`) with the tag `serve` and one signature:

    serving_default:
      inputs:  images         float32 [N, H, W, C]  pixels in the data set's own scale
                                                     (digits 0-16; mnist, synthetic 0-255)
      outputs: probabilities  float32 [N, classes]  softmax of the logits
               classes        int64   [N]           argmax

plus `assets.extra/lowlevel_export.json` (global_step, checkpoint, model,
hidden_units, dataset, data_dir, image_shape, num_classes, max_value), which
`lowlevel.predict` reads to find the test split.

It is built after the training session has closed, in a fresh graph with no
device placements (`clear_devices`), from a checkpoint file: the variables
are restored whole whatever the number of ps tasks that held them, so the
export needs no server. An export is complete or absent: it is written under
a hidden temporary name in `export/` and renamed into place (a rename within
one directory is atomic on POSIX file systems); TensorFlow Serving skips
names that are not numbers. The newest `--keep_exports` (by global step) are
kept.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from typing import Optional

import tensorflow as tf
from absl import logging

from lowlevel import output_layout
from lowlevel.config import TrainConfig
from lowlevel.data import images as data_lib
from lowlevel.models import catalogue as models
from lowlevel.outputs import checkpoints

v1 = tf.compat.v1

SIGNATURE = "serving_default"
INPUT = "images"
OUTPUTS = ("probabilities", "classes")
METADATA = os.path.join("assets.extra", "lowlevel_export.json")


def exportable(data) -> bool:
    """Whether a model on `data` has this export: one of images (`image_shape`); a
    click-through model takes feature dicts, which the `images` signature does not
    describe (not exported yet)."""
    if not hasattr(data, "image_shape"):
        logging.info("no SavedModel export for a model of %s (its input is a dict of "
                     "features, not images); the checkpoints hold the model", data.name)
        return False
    return True


def export(checkpoint_path: str, base: str, config: TrainConfig, data: data_lib.DataSet,
           keep: Optional[int] = None) -> Optional[str]:
    """Exports checkpoint `checkpoint_path` as the SavedModel `<base>/<global step>/`.

    Args:
      checkpoint_path: a checkpoint path prefix ("<output_dir>/model.ckpt-2000").
      base: the export directory (`output_layout.export_base(output_dir)`).
      config: the run's configuration (model, hidden_units, dataset, seed).
      data: the data set (image shape, classes, pixel scale).
      keep: keep the newest `keep` exports, delete older ones; None keeps all.

    Returns:
      The export's directory. If it exists already (exported by the chief or
      the evaluator before), it is left as it is. None for a model that has no
      export (`exportable`).

    Raises:
      tf.errors.OpError, OSError: the checkpoint cannot be read, or the
        export cannot be written (no partial export is left behind).
    """
    if not exportable(data):
        return None
    step = int(tf.train.load_checkpoint(checkpoint_path).get_tensor(checkpoints.GLOBAL_STEP))
    target = os.path.join(base, str(step))
    if os.path.isdir(target):
        logging.info("export %s exists already; leaving it", target)
        return target
    os.makedirs(base, exist_ok=True)
    tmp = os.path.join(base, f".tmp-{step}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _write(tmp, checkpoint_path, config, data)
        _write_metadata(tmp, step, checkpoint_path, config, data)
        try:
            os.rename(tmp, target)
        except OSError:
            if not os.path.isdir(target):
                raise
            logging.info("export %s was written by another task meanwhile; leaving it", target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    logging.info("exported %s as SavedModel %s (signature %s: %s float32 %s -> %s)",
                 os.path.basename(checkpoint_path), target, SIGNATURE, INPUT,
                 [None, *data.image_shape], ", ".join(OUTPUTS))
    if keep is not None:
        prune(base, keep)
    return target


def ensure_exported(checkpoint_path: str, step: int, config: TrainConfig) -> Optional[str]:
    """For a finished run: exports its final checkpoint unless `export/<step>/` exists.

    A run restarted after its end (or one from before exports, or whose
    export failed) gets its export this way. Loads the data set only when
    there is something to export. Returns the export's directory, or None
    with `--keep_exports=0`.
    """
    if not (config.builtin and config.keep_exports and config.output_dir):
        return None
    base = output_layout.export_base(config.output_dir)
    if os.path.isdir(os.path.join(base, str(step))):
        return os.path.join(base, str(step))
    from lowlevel.data import catalogue
    return export(checkpoint_path, base, config, catalogue.load_for(config), config.keep_exports)


def exports(base: str) -> list[str]:
    """The complete exports in `base`, oldest (lowest global step) first."""
    if not os.path.isdir(base):
        return []
    steps = sorted(int(n) for n in os.listdir(base)
                   if re.fullmatch(r"\d+", n) and os.path.isdir(os.path.join(base, n)))
    return [os.path.join(base, str(s)) for s in steps]


def prune(base: str, keep: int) -> None:
    """Deletes all but the newest `keep` exports in `base`."""
    found = exports(base)
    for path in found[:max(len(found) - keep, 0)]:
        shutil.rmtree(path, ignore_errors=True)
        logging.info("deleted export %s (--keep_exports=%d)", path, keep)


def _write(tmp: str, checkpoint_path: str, config: TrainConfig, data: data_lib.DataSet) -> None:
    graph = tf.Graph()
    with graph.as_default():
        images = v1.placeholder(tf.float32, [None, *data.image_shape], name=INPUT)
        logits = models.build(config.model, images / data.max_value, data.num_classes,
                              config.hidden_units, config.seed)
        probabilities = tf.nn.softmax(logits, name=OUTPUTS[0])
        classes = tf.argmax(logits, axis=1, output_type=tf.int64, name=OUTPUTS[1])
        variables = graph.get_collection(v1.GraphKeys.GLOBAL_VARIABLES)
        checkpoints.check_compatible(os.path.dirname(checkpoint_path), variables,
                                     checkpoint_path)
        saver = v1.train.Saver(variables)
        signature = v1.saved_model.predict_signature_def(
            inputs={INPUT: images},
            outputs={OUTPUTS[0]: probabilities, OUTPUTS[1]: classes})
        session_config = v1.ConfigProto(intra_op_parallelism_threads=1,
                                        inter_op_parallelism_threads=1)
        with v1.Session(graph=graph, config=session_config) as sess:
            saver.restore(sess, checkpoint_path)
            builder = v1.saved_model.Builder(tmp)
            builder.add_meta_graph_and_variables(
                sess, [v1.saved_model.tag_constants.SERVING],
                signature_def_map={SIGNATURE: signature}, clear_devices=True,
                strip_default_attrs=True)
            builder.save()


def _write_metadata(tmp: str, step: int, checkpoint_path: str, config: TrainConfig,
                    data: data_lib.DataSet) -> None:
    path = os.path.join(tmp, METADATA)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(dict(global_step=step, checkpoint=os.path.basename(checkpoint_path),
                       model=config.model, hidden_units=list(config.hidden_units),
                       dataset=data.name, data_dir=config.data_dir, image_shape=list(data.image_shape),
                       num_classes=data.num_classes, max_value=data.max_value,
                       signature=SIGNATURE, inputs={INPUT: "float32"},
                       outputs={OUTPUTS[0]: "float32", OUTPUTS[1]: "int64"}), f, indent=2)


def read_metadata(export_dir: str) -> dict:
    """The `lowlevel_export.json` of an export; {} when it has none (not made by lowlevel)."""
    try:
        with open(os.path.join(export_dir, METADATA)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}
