"""SavedModel export: the trained model, loadable with no cluster, no GPU and no lowlevel.

At the end of training the chief writes `<output_dir>/export/<global_step>/`
(the evaluator too, for each checkpoint it evaluates, with
`--export_every_checkpoint`), in the layout TensorFlow Serving watches (a
numbered version directory per export), holding a TF1 SavedModel
(`saved_model.pb`, `variables/`) with the tag `serve` and one signature. An
image model's:

    serving_default:
      inputs:  images         float32 [N, H, W, C]  pixels in the data set's own scale
                                                     (digits 0-16; mnist, synthetic 0-255)
      outputs: probabilities  float32 [N, classes]  softmax of the logits
               classes        int64   [N]           argmax

a click-through model's (wide_deep: synthetic_ctr, movielens):

    serving_default:
      inputs:  dense          float32 [N, D]  the data set's dense features, scaled
               categorical    int64   [N, F]  an id per field (--embedding=dynamic: the
                                              raw ids; else ids in [0, the field's size))
               crosses        int64   [N, C]  the crosses, hashed into [0, hash_buckets)
      outputs: probabilities  float32 [N]     sigmoid of the logit: P(click)
               classes        int64   [N]     probability > 0.5

plus `assets.extra/lowlevel_export.json` (global_step, checkpoint, model,
hidden_units, dataset, data_dir, num_classes, max_value; image_shape, or the
field, cross and dense names), which `lowlevel.predict` reads to find the test
split. Dynamic embedding tables are carried as their shards' snapshots
(`dynamic_embeddings.ShardSaveable`: keys, rows and the rest, restored into
`MutableHashTable`s and variables by the SavedModel's own restore op, stock
ops only), so serving reads the rows the checkpoint holds, and an id without
a row the default row, as the evaluation does (`dynamic_embeddings.reading`).
A model whose variables exceed `MAX_EXPORT_BYTES` is not exported (the
export restores it whole in one process: 100 M rows are 6.8 GB).

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
from lowlevel.models import dynamic_embeddings
from lowlevel.outputs import checkpoints

v1 = tf.compat.v1

SIGNATURE = "serving_default"
INPUT = "images"
CTR_INPUTS = ("dense", "categorical", "crosses")
OUTPUTS = ("probabilities", "classes")
METADATA = os.path.join("assets.extra", "lowlevel_export.json")
# The largest model (its variables, bytes) exported: the export holds it whole in the
# exporting process, the chief's or the evaluator's, besides their own state.
MAX_EXPORT_BYTES = 2 << 30


def is_ctr(data) -> bool:
    """Whether `data` is a click-through data set (its model takes a dict of features)."""
    return hasattr(data, "field_sizes")


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
      the evaluator before), it is left as it is. None for a model over
      `MAX_EXPORT_BYTES` (logged).

    Raises:
      tf.errors.OpError, OSError: the checkpoint cannot be read, or the
        export cannot be written (no partial export is left behind).
    """
    step = int(tf.train.load_checkpoint(checkpoint_path).get_tensor(checkpoints.GLOBAL_STEP))
    target = os.path.join(base, str(step))
    if os.path.isdir(target):
        logging.info("export %s exists already; leaving it", target)
        return target
    os.makedirs(base, exist_ok=True)
    tmp = os.path.join(base, f".tmp-{step}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        if not _write(tmp, checkpoint_path, config, data):
            return None
        _write_metadata(tmp, step, checkpoint_path, config, data)
        try:
            os.rename(tmp, target)
        except OSError:
            if not os.path.isdir(target):
                raise
            logging.info("export %s was written by another task meanwhile; leaving it", target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    inputs = (", ".join(CTR_INPUTS) if is_ctr(data) else
              f"{INPUT} float32 {[None, *data.image_shape]}")
    logging.info("exported %s as SavedModel %s (signature %s: %s -> %s)",
                 os.path.basename(checkpoint_path), target, SIGNATURE, inputs,
                 ", ".join(OUTPUTS))
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


def _write(tmp: str, checkpoint_path: str, config: TrainConfig, data: data_lib.DataSet) -> bool:
    """Writes the SavedModel of `checkpoint_path` into `tmp`; False (logged) if the model
    is over `MAX_EXPORT_BYTES`."""
    graph = tf.Graph()
    with graph.as_default():
        v1.train.get_or_create_global_step()
        inputs, outputs = (_ctr_signature(config, data, checkpoint_path) if is_ctr(data)
                           else _image_signature(config, data))
        # The checkpoint's names; dynamic embedding shards are saved by their snapshots.
        variables = checkpoints.saved_names(graph.get_collection(v1.GraphKeys.GLOBAL_VARIABLES))
        held = _variable_bytes(graph.get_collection(v1.GraphKeys.GLOBAL_VARIABLES))
        if held > MAX_EXPORT_BYTES:
            logging.warning("not exporting %s: its variables hold %.1f GB, over the %.1f GB "
                            "one process restores for an export; the checkpoints hold the "
                            "model", os.path.basename(checkpoint_path), held / 1e9,
                            MAX_EXPORT_BYTES / 1e9)
            return False
        checkpoints.check_compatible(os.path.dirname(checkpoint_path), variables,
                                     checkpoint_path)
        saver = v1.train.Saver(variables)
        signature = v1.saved_model.predict_signature_def(inputs=inputs, outputs=outputs)
        session_config = v1.ConfigProto(intra_op_parallelism_threads=1,
                                        inter_op_parallelism_threads=1)
        with v1.Session(graph=graph, config=session_config) as sess:
            saver.restore(sess, checkpoint_path)
            # Python objects the meta graph cannot hold (a shard's `name` would be read as a
            # node's): the saver has the shards' snapshots.
            for key in (dynamic_embeddings.SHARDS, dynamic_embeddings.TABLE_REGISTRY):
                graph.clear_collection(key)
            builder = v1.saved_model.Builder(tmp)
            builder.add_meta_graph_and_variables(
                sess, [v1.saved_model.tag_constants.SERVING],
                signature_def_map={SIGNATURE: signature}, clear_devices=True,
                strip_default_attrs=True, saver=saver)
            builder.save()
    return True


def _image_signature(config: TrainConfig, data) -> tuple[dict, dict]:
    """({input name: placeholder}, {output name: tensor}) of an image model."""
    images = v1.placeholder(tf.float32, [None, *data.image_shape], name=INPUT)
    logits = models.build(config.model, images / data.max_value, data.num_classes,
                          config.hidden_units, config.seed)
    probabilities = tf.nn.softmax(logits, name=OUTPUTS[0])
    classes = tf.argmax(logits, axis=1, output_type=tf.int64, name=OUTPUTS[1])
    return {INPUT: images}, {OUTPUTS[0]: probabilities, OUTPUTS[1]: classes}


def _ctr_signature(config: TrainConfig, data, checkpoint_path: str) -> tuple[dict, dict]:
    """The same for a click-through model: its dynamic tables (if any) get one shard each
    per shard in the checkpoint, all in this process, and are only read."""
    features = {
        "dense": v1.placeholder(tf.float32, [None, data.num_dense], name="dense"),
        "categorical": v1.placeholder(tf.int64, [None, len(data.field_sizes)],
                                      name="categorical"),
        "crosses": v1.placeholder(tf.int64, [None, len(data.cross_names)], name="crosses")}
    shards = (dynamic_embeddings.shards_in(checkpoint_path) if config.embedding == "dynamic"
              else 0)
    with dynamic_embeddings.reading():
        logits = models.for_config(config, data, local_shards=shards)(features)
    probabilities = tf.sigmoid(logits, name=OUTPUTS[0])
    classes = tf.cast(logits > 0, tf.int64, name=OUTPUTS[1])
    return features, {OUTPUTS[0]: probabilities, OUTPUTS[1]: classes}


def _variable_bytes(variables) -> int:
    """Bytes of `variables` (a partitioned one's shards each count; unknown shapes 0)."""
    return sum(v.shape.num_elements() * v.dtype.size for v in variables
               if v.shape.is_fully_defined())


def _write_metadata(tmp: str, step: int, checkpoint_path: str, config: TrainConfig,
                    data: data_lib.DataSet) -> None:
    path = os.path.join(tmp, METADATA)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if is_ctr(data):
        shape = dict(field_names=list(data.field_names), cross_names=list(data.cross_names),
                     num_dense=data.num_dense, embedding=config.embedding,
                     inputs={"dense": "float32", "categorical": "int64", "crosses": "int64"})
    else:
        shape = dict(image_shape=list(data.image_shape), inputs={INPUT: "float32"})
    with open(path, "w") as f:
        json.dump(dict(global_step=step, checkpoint=os.path.basename(checkpoint_path),
                       model=config.model, hidden_units=list(config.hidden_units),
                       dataset=data.name, data_dir=config.data_dir,
                       num_classes=data.num_classes, max_value=data.max_value,
                       signature=SIGNATURE, **shape,
                       outputs={OUTPUTS[0]: "float32", OUTPUTS[1]: "int64"}), f, indent=2)


def read_metadata(export_dir: str) -> dict:
    """The `lowlevel_export.json` of an export; {} when it has none (not made by lowlevel)."""
    try:
        with open(os.path.join(export_dir, METADATA)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}
