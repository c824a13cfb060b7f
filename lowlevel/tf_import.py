"""Imports TensorFlow once, in graph (TF1) mode, without its start-up noise.

TensorFlow 2.21 writes its oneDNN banner, "Could not find cuda drivers" and
cpu_feature_guard lines from C++ before absl logging is initialised, so
`TF_CPP_MIN_LOG_LEVEL` does not silence them; the import therefore runs with
file descriptor 2 pointed at a temporary file, which is replayed if the import
fails. `verbose=True` (the trainer's `--verbosity=1` or more) keeps it all.

It also skips Keras. `tensorflow/__init__.py` (2.21) imports Keras 3 eagerly
(`importlib.import_module("keras.src.optimizers")`, and Keras imports
scikit-learn for its wrappers): about half of the import, ~3 s of CPU per task
on a 2-core machine (benchmarks/NOTES.md), paid by every ps and worker, though
lowlevel builds its models from `tf.compat.v1` ops and uses no Keras. With
`TF_USE_LEGACY_KERAS=1` that import names `tf_keras` instead, and when
`tf_keras` is not installed it is skipped (TensorFlow catches the
`ImportError`). So the variable is set, before the first import, only if
`tf_keras` is absent (otherwise it would switch `tf.keras` to Keras 2) and the
user has not set it. In such a process `tf.keras` raises `ImportError` on
first use; set `TF_USE_LEGACY_KERAS=0` to keep Keras 3.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import tempfile


def import_tensorflow(verbose: bool = False, set_logger: bool = True):
    """Returns the `tensorflow` module with eager execution disabled.

    Args:
      verbose: keep TensorFlow's C++ and Python log output.
      set_logger: set TensorFlow's Python logger to INFO (verbose) or ERROR; False leaves
        it as the program set it (an Estimator script's `set_verbosity`).
    """
    tf = import_quietly(verbose)
    if tf.executing_eagerly():
        tf.compat.v1.disable_eager_execution()
    if set_logger:
        tf.get_logger().setLevel("INFO" if verbose else "ERROR")
    return tf


def import_quietly(verbose: bool = False):
    """Returns the `tensorflow` module, imported (the first time) as `import_tensorflow` does
    it, Keras skipped and start-up noise hidden, but otherwise left as a plain `import
    tensorflow` leaves it: eager, its logger untouched. (The tests' fork server imports it
    so, for processes that each set their own mode: tests/prefork.py.)

    Args:
      verbose: keep TensorFlow's C++ log output.
    """
    if "tensorflow" not in sys.modules:
        skip_keras()
        if not verbose:
            os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        with contextlib.nullcontext() if verbose else _quiet_stderr():
            import tensorflow  # noqa: F401
    import tensorflow as tf
    return tf


def skip_keras(env=None) -> bool:
    """Sets `TF_USE_LEGACY_KERAS=1` in `env` (default `os.environ`) if `tf_keras` is absent.

    Returns whether TensorFlow imported with `env` will skip Keras: the
    variable is "1" (set here or by the user) and `tf_keras` is not installed.
    A value the user set is kept. Effective only before TensorFlow is imported.
    """
    env = os.environ if env is None else env
    if importlib.util.find_spec("tf_keras") is not None:
        return False
    env.setdefault("TF_USE_LEGACY_KERAS", "1")
    return env["TF_USE_LEGACY_KERAS"] in ("1", "true", "True")


@contextlib.contextmanager
def _quiet_stderr():
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        ok = False
        try:
            yield
            ok = True
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            if not ok:
                capture.seek(0)
                sys.stderr.write(capture.read().decode(errors="replace"))
