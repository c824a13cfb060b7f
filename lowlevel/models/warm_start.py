"""Warm-starting a graph under construction from a checkpoint (`WarmStartSettings`).

`WarmStartSettings` is tensorflow_estimator 2.15's namedtuple
(ckpt_to_initialize_from, vars_to_warm_start=".*", var_name_to_vocab_info={},
var_name_to_prev_var_name={}); `warm_start(settings)` applies it to the
default graph with TensorFlow 2.21's `tf.compat.v1.train.warm_start` (still
present: it overrides the initializers of the matching variables, so it
must be called after the model's variables exist and before the session is
created). `default_settings(warm_start_from)` is 2.15's
`_get_default_warm_start_settings`: a path to a checkpoint (file or
directory) or to a SavedModel directory (its `variables/variables`), or
settings.
"""

from __future__ import annotations

import collections
import os

import tensorflow as tf

logging = tf.compat.v1.logging  # the 'tensorflow' logger, as tensorflow_estimator 2.15 logs


class WarmStartSettings(collections.namedtuple("WarmStartSettings", [
        "ckpt_to_initialize_from", "vars_to_warm_start", "var_name_to_vocab_info",
        "var_name_to_prev_var_name"])):
    """Which checkpoint and variables to warm-start from (2.15's fields and defaults).

    ckpt_to_initialize_from: a checkpoint file prefix or a directory with a
      `checkpoint` file; vars_to_warm_start: a regex (default ".*": every
      trainable variable), a list of names/regexes, or None (none);
    var_name_to_vocab_info: {name: tf.compat.v1.train.VocabInfo};
    var_name_to_prev_var_name: {new name: name in the checkpoint}.
    Raises ValueError "`ckpt_to_initialize_from` MUST be set in
    WarmStartSettings" if the first is empty.
    """

    def __new__(cls, ckpt_to_initialize_from, vars_to_warm_start=".*",
                var_name_to_vocab_info=None, var_name_to_prev_var_name=None):
        if not ckpt_to_initialize_from:
            raise ValueError("`ckpt_to_initialize_from` MUST be set in WarmStartSettings")
        return super().__new__(cls, ckpt_to_initialize_from, vars_to_warm_start,
                               var_name_to_vocab_info or {}, var_name_to_prev_var_name or {})


def default_settings(warm_start_from):
    """WarmStartSettings from the Estimator's `warm_start_from` argument (or None).

    A str/bytes path: a SavedModel directory (it has
    `variables/variables.index`) warm-starts from its variables, anything else
    is a checkpoint path. Raises ValueError "warm_start_from must be a string
    or a WarmStartSettings, instead got <type>" otherwise.
    """
    if warm_start_from is None:
        return None
    if isinstance(warm_start_from, (str, bytes)):
        path = tf.compat.as_text(warm_start_from)
        variables = os.path.join(path, "variables", "variables")
        if tf.io.gfile.exists(variables + ".index"):
            logging.info("Warm-starting from a SavedModel")
            return WarmStartSettings(ckpt_to_initialize_from=variables)
        return WarmStartSettings(ckpt_to_initialize_from=path)
    if isinstance(warm_start_from, WarmStartSettings):
        return warm_start_from
    raise ValueError("warm_start_from must be a string or a WarmStartSettings, instead got "
                     f"{type(warm_start_from)}")


def warm_start(settings) -> None:
    """Applies `settings` to the variables of the default graph (logs as 2.15 does)."""
    logging.info("Warm-starting with WarmStartSettings: %s", (settings,))
    tf.compat.v1.train.warm_start(*settings)
