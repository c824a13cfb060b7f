"""Writing files that other processes read while they are being written."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Optional


def write_json(path: str, value, indent: Optional[int] = 2) -> None:
    """Writes `value` as JSON to `path` atomically: a reader sees the old file or the new one.

    The text goes to a uniquely named file in the same directory (created if
    needed), which then replaces `path` (`os.replace`, atomic on POSIX), so
    writers in several processes never interleave either.

    Raises:
      OSError: the directory or the file cannot be written.
      TypeError: `value` is not JSON-serialisable (nothing is written).
    """
    text = json.dumps(value, indent=indent) + "\n"
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


_EVENT_WRITERS: dict = {}  # (pid, logdir) -> this process's FileWriter


def event_writer(logdir: str):
    """This process's `tf.compat.v1.summary.FileWriter` for `logdir` (made once per process).

    TF1's writer names its file by the second and the host alone
    (`events.out.tfevents.<seconds>.<host>`), and a second writer made in the same second
    opens the same name and truncates the first one's events: a resumed Estimator run
    evaluating within a second of the last run's first evaluation lost that run's eval
    history (seen in the suite: early stopping read `[202]` for steps 100, 200, 201, 202).
    This one's name ends in `.<pid>` as TF2's writers' do, so two processes never share a
    file; one process keeps one writer per directory.
    """
    import tensorflow as tf
    key = (os.getpid(), os.path.abspath(logdir))
    if key not in _EVENT_WRITERS:
        _EVENT_WRITERS[key] = tf.compat.v1.summary.FileWriter(
            logdir, graph=None, filename_suffix=f".{os.getpid()}")
    return _EVENT_WRITERS[key]
