"""Exporters run by `train_and_evaluate` after evaluations: Latest, Best and Final (2.15's rules).

Each writes through `Estimator.export_saved_model` into the export path
`train_and_evaluate` gives it: `<model_dir>/export/<exporter name>/`, one
`<unix seconds>/` SavedModel per export.

- `LatestExporter(name, serving_input_receiver_fn, assets_extra, as_text,
  exports_to_keep=5)`: exports after every evaluation, then deletes all but
  the `exports_to_keep` newest 10-digit version directories (None keeps all).
- `BestExporter(name="best_exporter", serving_input_receiver_fn,
  event_file_pattern="eval/*.tfevents.*", compare_fn=loss smaller, ...,
  exports_to_keep=5)`: on its first export in a model_dir it reads the best
  result so far from the evaluation event files (scalar summaries, by
  compare_fn); it exports when it has not exported yet in this process or
  compare_fn(best, current) is true, then garbage-collects like Latest.
- `FinalExporter(name, serving_input_receiver_fn, ...)`: exports only the
  final evaluation's model.

Errors (ValueError) and messages as tensorflow_estimator 2.15 `exporter.py`.
"""

from __future__ import annotations

import abc
import os

import tensorflow as tf

from lowlevel.models.spec import fn_args

logging = tf.compat.v1.logging  # the 'tensorflow' logger, as tensorflow_estimator 2.15 logs


class Exporter(abc.ABC):
    """An exporter: a `name` (its directory under `export/`) and `export(...)`."""

    @property
    @abc.abstractmethod
    def name(self):
        """The directory name under `<model_dir>/export/` (str); None: export/ itself."""

    @abc.abstractmethod
    def export(self, estimator, export_path, checkpoint_path, eval_result, is_the_final_export):
        """Exports (or not) `checkpoint_path`; returns the export directory (bytes) or None."""


class _SavedModelExporter(Exporter):
    def __init__(self, name, serving_input_receiver_fn, assets_extra=None, as_text=False):
        self._name = name
        self._serving_input_receiver_fn = serving_input_receiver_fn
        self._assets_extra = assets_extra
        self._as_text = as_text

    @property
    def name(self):
        return self._name

    def export(self, estimator, export_path, checkpoint_path, eval_result, is_the_final_export):
        del eval_result, is_the_final_export
        return estimator.export_saved_model(
            export_path, self._serving_input_receiver_fn, assets_extra=self._assets_extra,
            as_text=self._as_text, checkpoint_path=checkpoint_path)


def _loss_smaller(best_eval_result, current_eval_result):
    """The default compare_fn: True when the current loss is smaller than the best one."""
    if not best_eval_result or "loss" not in best_eval_result:
        raise ValueError("best_eval_result cannot be empty or no loss is found in it.")
    if not current_eval_result or "loss" not in current_eval_result:
        raise ValueError("current_eval_result cannot be empty or no loss is found in it.")
    return best_eval_result["loss"] > current_eval_result["loss"]


def _verify_compare_fn_args(compare_fn):
    args = set(fn_args(compare_fn))
    if "best_eval_result" not in args:
        raise ValueError(f"compare_fn ({compare_fn}) must include best_eval_result argument.")
    if "current_eval_result" not in args:
        raise ValueError(
            f"compare_fn ({compare_fn}) must include current_eval_result argument.")
    invalid = list(args - {"best_eval_result", "current_eval_result"})
    if invalid:
        raise ValueError(f"compare_fn ({compare_fn}) has following not expected args: {invalid}")


def garbage_collect_exports(export_dir_base, exports_to_keep) -> None:
    """Deletes all but the `exports_to_keep` largest 10-digit version directories."""
    if exports_to_keep is None or not tf.io.gfile.isdir(export_dir_base):
        return
    versions = sorted(int(name.rstrip("/")) for name in tf.io.gfile.listdir(export_dir_base)
                      if len(name.rstrip("/")) == 10 and name.rstrip("/").isdigit())
    for version in versions[:max(0, len(versions) - exports_to_keep)]:
        path = os.path.join(tf.compat.as_str(export_dir_base), str(version))
        try:
            tf.io.gfile.rmtree(path)
        except tf.errors.NotFoundError as e:
            logging.warning("Can not delete %s recursively: %s", path, e)


class LatestExporter(Exporter):
    """Exports after every evaluation and keeps the newest `exports_to_keep` (see module doc)."""

    def __init__(self, name, serving_input_receiver_fn, assets_extra=None, as_text=False,
                 exports_to_keep=5):
        self._saved_model_exporter = _SavedModelExporter(name, serving_input_receiver_fn,
                                                         assets_extra, as_text)
        self._exports_to_keep = exports_to_keep
        if exports_to_keep is not None and exports_to_keep <= 0:
            raise ValueError("`exports_to_keep`, if provided, must be positive number")

    @property
    def name(self):
        """The exporter's name."""
        return self._saved_model_exporter.name

    def export(self, estimator, export_path, checkpoint_path, eval_result, is_the_final_export):
        """Exports `checkpoint_path`, then garbage-collects older versions."""
        result = self._saved_model_exporter.export(estimator, export_path, checkpoint_path,
                                                   eval_result, is_the_final_export)
        garbage_collect_exports(export_path, self._exports_to_keep)
        return result


class FinalExporter(Exporter):
    """Exports once, for the final evaluation of `train_and_evaluate`."""

    def __init__(self, name, serving_input_receiver_fn, assets_extra=None, as_text=False):
        self._saved_model_exporter = _SavedModelExporter(name, serving_input_receiver_fn,
                                                         assets_extra, as_text)

    @property
    def name(self):
        """The exporter's name."""
        return self._saved_model_exporter.name

    def export(self, estimator, export_path, checkpoint_path, eval_result, is_the_final_export):
        """Exports only when `is_the_final_export`; returns None otherwise."""
        if not is_the_final_export:
            return None
        logging.info("Performing the final export in the end of training.")
        return self._saved_model_exporter.export(estimator, export_path, checkpoint_path,
                                                 eval_result, is_the_final_export)


class BestExporter(Exporter):
    """Exports when an evaluation beats the best so far (`compare_fn`); see the module doc."""

    def __init__(self, name="best_exporter", serving_input_receiver_fn=None,
                 event_file_pattern="eval/*.tfevents.*", compare_fn=_loss_smaller,
                 assets_extra=None, as_text=False, exports_to_keep=5):
        if compare_fn is None:
            raise ValueError("`compare_fn` must not be None.")
        _verify_compare_fn_args(compare_fn)
        self._compare_fn = compare_fn
        self._saved_model_exporter = _SavedModelExporter(name, serving_input_receiver_fn,
                                                         assets_extra, as_text)
        self._event_file_pattern = event_file_pattern
        self._model_dir = None
        self._best_eval_result = None
        self._has_exported = False
        self._exports_to_keep = exports_to_keep
        if exports_to_keep is not None and exports_to_keep <= 0:
            raise ValueError("`exports_to_keep`, if provided, must be a positive number. Got "
                             f"{exports_to_keep}")

    @property
    def name(self):
        """The exporter's name."""
        return self._saved_model_exporter.name

    def export(self, estimator, export_path, checkpoint_path, eval_result, is_the_final_export):
        """Exports if `eval_result` is the best so far; returns the directory or None."""
        if self._model_dir != estimator.model_dir and self._event_file_pattern:
            logging.info("Loading best metric from event files.")
            self._model_dir = estimator.model_dir
            self._best_eval_result = self._get_best_eval_result(
                os.path.join(self._model_dir, self._event_file_pattern))
        if (self._best_eval_result is None or not self._has_exported or
                self._compare_fn(best_eval_result=self._best_eval_result,
                                 current_eval_result=eval_result)):
            logging.info("Performing best model export.")
            self._best_eval_result = eval_result
            result = self._saved_model_exporter.export(estimator, export_path, checkpoint_path,
                                                       eval_result, is_the_final_export)
            garbage_collect_exports(export_path, self._exports_to_keep)
            self._has_exported = True
            return result
        return None

    def _get_best_eval_result(self, event_files):
        if not event_files:
            return None
        best = None
        for event_file in tf.io.gfile.glob(event_files):
            for event in tf.compat.v1.train.summary_iterator(event_file):
                if not event.HasField("summary"):
                    continue
                result = {v.tag: v.simple_value for v in event.summary.value
                          if v.HasField("simple_value")}
                if result and (best is None or self._compare_fn(best, result)):
                    best = result
        return best
