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


def close_event_writers() -> None:
    """Flushes and closes this process's `event_writer`s (the end of training)."""
    for key in [k for k in _EVENT_WRITERS if k[0] == os.getpid()]:
        _EVENT_WRITERS.pop(key).close()


GRAPH_FILE = "graph.pbtxt"


def write_graph(graph, logdir: str) -> bool:
    """Writes `graph` (a `tf.Graph`) as `<logdir>/graph.pbtxt`, a text `GraphDef` with
    shapes as TF's `CheckpointSaverHook` writes it, and into this process's events file
    (TensorBoard's graph), unless graph.pbtxt already holds this same graph.

    The file's first line is a comment with the SHA-256 of the graph's deterministic
    serialization, which `text_format` parsers skip. A restarted chief builds the graph
    its predecessor wrote, and finds it there: writing it again cost ~20 % of a
    restarted chief's CPU before its first step (py-spy, 2 ps + 2 workers, wide_deep,
    sync, 0.3 CPU per worker; benchmarks/NOTES.md 2026-11-29). The text comes from
    protobuf's own encoder (`str`), ~8x faster than `text_format.MessageToString`'s
    Python for the same parsed result (a node's attrs in the encoder's order, not sorted).

    Returns:
      True when written, False when graph.pbtxt already held this graph.

    Raises:
      tf.errors.OpError, OSError: the directory cannot be written (`storage.Writes`
        turns a full disk into a line).
    """
    import hashlib

    import tensorflow as tf
    digest = hashlib.sha256(graph.as_graph_def().SerializeToString(deterministic=True))
    digest = digest.hexdigest()
    header = f"# graph sha256 {digest}\n"
    path = os.path.join(logdir, GRAPH_FILE)
    if tf.io.gfile.exists(path):
        with tf.io.gfile.GFile(path) as f:
            if f.readline() == header:
                return False
    tf.io.gfile.makedirs(logdir)
    with tf.io.gfile.GFile(path + ".tmp", "w") as f:
        f.write(header + str(graph.as_graph_def(add_shapes=True)))
    tf.io.gfile.rename(path + ".tmp", path, overwrite=True)
    event_writer(logdir).add_graph(graph)
    return True
