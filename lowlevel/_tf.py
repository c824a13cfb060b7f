"""Imports TensorFlow once, in graph (TF1) mode, without its start-up noise.

TensorFlow 2.21 writes its oneDNN banner, "Could not find cuda drivers" and
cpu_feature_guard lines from C++ before absl logging is initialised, so
`TF_CPP_MIN_LOG_LEVEL` does not silence them; the import therefore runs with
file descriptor 2 pointed at a temporary file, which is replayed if the import
fails. `verbose=True` (the trainer's `--verbosity=1` or more) keeps it all.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile


def import_tensorflow(verbose: bool = False):
    """Returns the `tensorflow` module with eager execution disabled.

    Args:
      verbose: keep TensorFlow's C++ and Python log output.
    """
    if "tensorflow" not in sys.modules:
        if not verbose:
            os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        with contextlib.nullcontext() if verbose else _quiet_stderr():
            import tensorflow  # noqa: F401
    import tensorflow as tf

    if tf.executing_eagerly():
        tf.compat.v1.disable_eager_execution()
    tf.get_logger().setLevel("INFO" if verbose else "ERROR")
    return tf


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
