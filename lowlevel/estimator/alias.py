"""Makes TensorFlow <= 2.15's Estimator imports resolve to `lowlevel.estimator` on TensorFlow 2.21.

`prepare_environment()` runs before TensorFlow is imported: when the
`legacy-keras` extra (`tf-keras`) is installed it sets
`TF_USE_LEGACY_KERAS=1` (unless the user set it), so `tf.keras` and
`tf.compat.v1.layers` are Keras 2 and build graph-mode layers as in 2.15.
Without tf-keras it leaves Keras 3 in place (a script may still use
`tf.keras.datasets` or `tf.keras.utils`).

`install()` imports TensorFlow (eager execution stays on, as the script
expects; the Estimator builds its own graphs) and makes `tf.estimator`,
`tf.compat.v1.estimator`, `import tensorflow.estimator`, `from tensorflow
import estimator`, `import tensorflow_estimator` (its `.estimator`) and
`import tensorflow_estimator.estimator` resolve to `lowlevel.estimator`.
Without tf-keras it also replaces `tf.compat.v1.layers` by a stand-in whose
every attribute raises `lowlevel.errors.LegacyKerasMissing` naming the
extra, instead of Keras 3's "`dense` is not available with Keras 3."
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types

from lowlevel.errors import LegacyKerasMissing

EXTRA_HINT = ("tf.compat.v1.layers needs Keras 2 on TensorFlow 2.16+: "
              "pip install 'lowlevel[legacy-keras]' (tf-keras)")


def legacy_keras_installed() -> bool:
    """Whether `tf_keras` (the legacy-keras extra) can be imported."""
    return importlib.util.find_spec("tf_keras") is not None


def prepare_environment(env=None) -> None:
    """Sets TF_USE_LEGACY_KERAS=1 in `env` (os.environ) when tf-keras is installed.

    Effective only before TensorFlow's first import; a value the user set is
    kept.
    """
    env = os.environ if env is None else env
    if legacy_keras_installed():
        env.setdefault("TF_USE_LEGACY_KERAS", "1")


class _MissingLegacyLayers(types.ModuleType):
    """Stands in for `tf.compat.v1.layers` when Keras 2 is not installed."""

    def __getattr__(self, item):
        if item.startswith("__"):
            raise AttributeError(item)
        raise LegacyKerasMissing(f"tf.compat.v1.layers.{item}: {EXTRA_HINT}")


def install(estimator):
    """Points TensorFlow's estimator names at `estimator` (the lowlevel.estimator module); returns tf.

    Imports TensorFlow if it is not imported yet (eager execution untouched).
    """
    import tensorflow as tf

    tf.estimator = estimator
    tf.compat.v1.estimator = estimator
    if hasattr(tf.compat, "v2"):
        tf.compat.v2.estimator = estimator
    sys.modules["tensorflow.estimator"] = estimator
    shim = types.ModuleType("tensorflow_estimator",
                            "lowlevel.estimator standing in for tensorflow_estimator.")
    shim.estimator = estimator
    shim.__path__ = []  # a package, so `import tensorflow_estimator.estimator` works
    sys.modules["tensorflow_estimator"] = shim
    sys.modules["tensorflow_estimator.estimator"] = estimator
    if not legacy_keras_installed():
        tf.compat.v1.layers = _MissingLegacyLayers("tensorflow.compat.v1.layers")
    return tf
