"""Scores inputs with an exported model: `python -m lowlevel.predict --export_dir=DIR`.

    python -m lowlevel.predict --export_dir=/tmp/run1/export           # newest export, test split
    python -m lowlevel.predict --export_dir=/tmp/run1/export/2000 --input=images.npy \\
        --output=/tmp/predictions.csv

`--export_dir` is a SavedModel written by `lowlevel.outputs.export`, a directory of
them (`<output_dir>/export`: the newest is used) or a run's `--output_dir`.
Without `--input` it scores the test split of the data set the model was
trained on (named in the export's `assets.extra/lowlevel_export.json`), the
split the chief's final evaluation uses, and reports the same accuracy. With
`--input` it scores a file of images float32-convertible, in the data set's
own pixel scale (digits 0-16, mnist 0-255):

- `.npy`: one array `[N, H, W, C]`, `[N, H, W]` or `[N, H*W*C]`;
- `.npz`: the array `images` (or `x`, or its only array), and optionally
  `labels` (or `y`) int `[N]`, which adds the accuracy;
- `.csv` (or `.csv.gz`): one image per line, H*W*C numbers, row by row; an
  optional header line.

It writes one line per input to `--output` (CSV: `class`, `probability` of
that class, then `p0`..`p<classes-1>`, and `label` when known) and prints one
JSON line: export_dir, global_step, num_examples, accuracy (with labels),
output. Exit status: 0; 2 for a usage error (a flag, a missing export, an
input of the wrong shape or dtype: one line on stderr naming the file, its
shape and the shape expected); 1 for a runtime failure.
"""

from __future__ import annotations

import csv
import gzip
import json
import os

import numpy as np
from absl import app, flags

from lowlevel import cli, output_layout
from lowlevel.errors import UsageError

FLAGS = flags.FLAGS
PROG = "lowlevel.predict"

flags.DEFINE_string("export_dir", None, "A SavedModel exported by lowlevel, a directory of "
                    "them (<output_dir>/export: the newest is used) or a run's --output_dir.")
flags.DEFINE_string("input", None, "A .npy, .npz or .csv(.gz) file of images in the data "
                    "set's pixel scale (see --help). Default: the data set's test split.")
flags.DEFINE_string("output", "predictions.csv", "Where the predictions go (CSV).")
flags.DEFINE_string("data_dir", None, "mnist only: the --data_dir the model was trained with "
                    "(default: the one recorded in the export).")
flags.DEFINE_integer("batch_size", 1000, "Images per session.run.")


def find_export(path: str) -> str:
    """The SavedModel directory `path` names (itself, the newest under it, or under its export/).

    Raises:
      UsageError: none there.
    """
    from lowlevel.outputs import export as export_lib
    for candidate in (path, output_layout.export_base(path)):
        if os.path.isfile(os.path.join(candidate, "saved_model.pb")):
            return candidate
        found = export_lib.exports(candidate)
        if found:
            return found[-1]
    raise UsageError(f"--export_dir={path}: no SavedModel there (saved_model.pb), nor "
                     "numbered exports under it or under its export/")


def read_input(path: str, image_shape: tuple) -> tuple[np.ndarray, np.ndarray | None]:
    """(images float32 `[N, *image_shape]`, labels int64 `[N]` or None) from a file.

    Raises:
      UsageError: unreadable file, unknown extension, non-numeric values, or
        a shape that is not `[N, *image_shape]`, `[N, H, W]` or `[N, H*W*C]`.
    """
    where = f"--input={path}"
    labels = None
    try:
        if path.endswith(".npy"):
            images = np.load(path, allow_pickle=False)
        elif path.endswith(".npz"):
            with np.load(path, allow_pickle=False) as f:
                names = list(f.keys())
                key = next((k for k in ("images", "x") if k in names),
                           names[0] if len(names) == 1 else None)
                if key is None:
                    raise UsageError(f"{where}: holds {', '.join(names)}; expected an array "
                                     "named images (and optionally labels)")
                images = f[key]
                label_key = next((k for k in ("labels", "y") if k in names), None)
                labels = f[label_key] if label_key else None
        elif path.endswith((".csv", ".csv.gz")):
            images = _read_csv(path)
        else:
            raise UsageError(f"{where}: unknown file type; expected .npy, .npz, .csv or .csv.gz")
    except (OSError, ValueError, EOFError) as e:
        if isinstance(e, UsageError):
            raise
        raise UsageError(f"{where}: cannot read it ({e})") from None
    return _check_images(images, image_shape, where), _check_labels(labels, len(images), where)


def _read_csv(path: str) -> np.ndarray:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", newline="") as f:
        rows = list(csv.reader(f))
    rows = [r for r in rows if r]
    if rows and not _numeric(rows[0]):
        rows = rows[1:]  # a header line
    widths = {len(r) for r in rows}
    if len(widths) > 1:
        raise UsageError(f"--input={path}: lines of {sorted(widths)} values; expected the same "
                         "number (one image) on every line")
    try:
        return np.array(rows, dtype=np.float64).reshape(len(rows), -1)
    except ValueError as e:
        raise UsageError(f"--input={path}: a value is not a number ({e})") from None


def _numeric(row) -> bool:
    try:
        [float(x) for x in row]
        return True
    except ValueError:
        return False


def _check_images(images: np.ndarray, image_shape: tuple, where: str) -> np.ndarray:
    if images.dtype.kind not in "uif":
        raise UsageError(f"{where}: images of dtype {images.dtype}; expected numbers "
                         f"(float32, or integers) in the data set's pixel scale")
    n = images.shape[0] if images.ndim else 0
    shape = list(image_shape)
    accepted = [tuple(shape), tuple(shape[:-1]) if shape[-1] == 1 else None,
                (int(np.prod(shape)),)]
    if images.ndim == 0 or tuple(images.shape[1:]) not in accepted:
        raise UsageError(f"{where}: images of shape {list(images.shape)}; expected [N, "
                         f"{', '.join(map(str, shape))}] (or [N, {int(np.prod(shape))}] "
                         "flat) float32")
    images = images.reshape(n, *shape).astype(np.float32)
    if not np.isfinite(images).all():
        raise UsageError(f"{where}: images hold NaN or infinite values")
    return images


def _check_labels(labels, n: int, where: str):
    if labels is None:
        return None
    if labels.dtype.kind not in "ui" or labels.shape != (n,):
        raise UsageError(f"{where}: labels of shape {list(labels.shape)} and dtype "
                         f"{labels.dtype}; expected integers [{n}]")
    return labels.astype(np.int64)


class Model:
    """An export's `serving_default` signature, loaded into a session (graph mode, CPU).

    Attributes:
      image_shape: `(H, W, C)` of the images it takes.
    """

    def __init__(self, export_dir: str):
        from lowlevel.tf_import import import_tensorflow
        tf = import_tensorflow()
        from lowlevel.outputs import export as export_lib
        v1 = tf.compat.v1
        self._graph = tf.Graph()
        self._sess = v1.Session(graph=self._graph)
        with self._graph.as_default():
            meta = v1.saved_model.loader.load(
                self._sess, [v1.saved_model.tag_constants.SERVING], export_dir)
        signature = meta.signature_def[export_lib.SIGNATURE]
        images = signature.inputs[export_lib.INPUT]
        self.image_shape = tuple(d.size for d in images.tensor_shape.dim[1:])
        self._feed = images.name
        self._fetches = [signature.outputs[k].name for k in export_lib.OUTPUTS]

    def __call__(self, images: np.ndarray, batch_size: int = 1000):
        """(probabilities float32 `[N, classes]`, classes int64 `[N]`) of images `[N, H, W, C]`."""
        parts = [self._sess.run(self._fetches, {self._feed: images[i:i + batch_size]})
                 for i in range(0, len(images), batch_size)]
        if not parts:
            return np.zeros((0, 0), np.float32), np.zeros((0,), np.int64)
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def write_predictions(path: str, probabilities, classes, labels=None) -> None:
    """One CSV line per input: class, its probability, p0..p<k-1>, label (when known)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w", newline="") as f:
        writer = csv.writer(f)
        k = probabilities.shape[1] if probabilities.ndim == 2 else 0
        writer.writerow(["class", "probability", *(f"p{i}" for i in range(k)),
                         *(["label"] if labels is not None else [])])
        for i, (c, p) in enumerate(zip(classes, probabilities)):
            writer.writerow([int(c), f"{p[c]:.6g}", *(f"{x:.6g}" for x in p),
                             *([int(labels[i])] if labels is not None else [])])
    os.replace(tmp, path)


def main(argv) -> int:
    """Scores `--input` (or the test split) with the export; returns the exit status."""
    if len(argv) > 1:
        raise UsageError(f"unexpected argument {argv[1]!r} (flags are --name=value)")
    if not FLAGS.export_dir:
        raise UsageError("--export_dir is required: a SavedModel from lowlevel, or a run's "
                         "--output_dir")
    if FLAGS.batch_size <= 0:
        raise UsageError(f"--batch_size={FLAGS.batch_size}: expected a whole number > 0")
    from lowlevel.tf_import import import_tensorflow
    import_tensorflow(verbose=FLAGS.verbosity >= 1)  # first: quietly
    from lowlevel.outputs import export as export_lib
    export_dir = find_export(FLAGS.export_dir)
    meta = export_lib.read_metadata(export_dir)
    if "field_names" in meta:
        raise UsageError(f"--export_dir={export_dir}: a click-through model ({meta['dataset']}); "
                         "lowlevel.predict scores image models. Load it with TensorFlow "
                         "(tf.compat.v1.saved_model.loader.load, tag serve) and feed its "
                         "signature's dense, categorical and crosses (docs/models-and-data.md)")
    model = Model(export_dir)
    if FLAGS.input:
        images, labels = read_input(FLAGS.input, model.image_shape)
        source = FLAGS.input
    else:
        if not meta.get("dataset"):
            raise UsageError(f"--export_dir={export_dir}: no lowlevel_export.json names its "
                             "data set; give --input")
        from lowlevel.data import images as data_lib
        data = data_lib.load(meta["dataset"], FLAGS.data_dir or meta.get("data_dir"))
        images, labels = data.test.images.astype(np.float32), data.test.labels
        source = f"{data.name} test split"
    probabilities, classes = model(images, FLAGS.batch_size)
    write_predictions(FLAGS.output, probabilities, classes, labels)
    result = {"export_dir": export_dir, "global_step": meta.get("global_step"),
              "input": source, "num_examples": int(len(images))}
    if labels is not None:
        result["accuracy"] = float(np.mean(classes == labels)) if len(labels) else None
    result["output"] = os.path.abspath(FLAGS.output)
    print(json.dumps(result), flush=True)
    return 0


def run():
    """Console-script entry point."""
    app.run(cli.task_main(PROG, main, hard_exit=False), flags_parser=cli.flags_parser(PROG))


if __name__ == "__main__":
    run()
