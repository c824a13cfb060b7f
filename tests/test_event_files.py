"""Eval summaries of two runs on one directory in one second (`outputs.files.event_writer`);
the graph written once per graph (`outputs.files.write_graph`)."""

import glob
import os
import time

import pytest
import tensorflow as tf

from lowlevel.outputs import files

pytestmark = pytest.mark.timeout(60)


def _summary(value: float):
    return tf.compat.v1.Summary(value=[tf.compat.v1.Summary.Value(tag="loss",
                                                                  simple_value=value)])


def _steps(directory) -> list:
    return sorted(e.step for path in glob.glob(os.path.join(directory, "events.out.tfevents.*"))
                  for e in tf.compat.v1.train.summary_iterator(path) if e.HasField("summary"))


def _fresh_second():
    """Waits until a new second has just begun, so what follows shares it."""
    while time.time() % 1.0 > 0.2:
        time.sleep(0.01)


def test_two_tf1_writers_in_one_second_keep_only_the_second_ones_events(tmp_path):
    """The hazard itself: TensorFlow 1's FileWriter names its file by the second and host."""
    _fresh_second()
    for step in (100, 202):
        writer = tf.compat.v1.summary.FileWriter(str(tmp_path), graph=None)
        writer.add_summary(_summary(1.0), step)
        writer.close()
    assert _steps(tmp_path) == [202]


def test_event_writers_of_two_processes_in_one_second_keep_both_runs_events(tmp_path,
                                                                           monkeypatch):
    _fresh_second()
    pid = os.getpid()
    first = files.event_writer(str(tmp_path))
    assert files.event_writer(str(tmp_path)) is first  # one per process and directory
    first.add_summary(_summary(1.0), 100)
    first.flush()
    monkeypatch.setattr(os, "getpid", lambda: pid + 1)  # the next run's process
    second = files.event_writer(str(tmp_path))
    second.add_summary(_summary(0.5), 202)
    second.flush()
    assert second is not first
    assert _steps(tmp_path) == [100, 202]
    names = sorted(os.path.basename(p) for p in glob.glob(str(tmp_path / "events.*")))
    assert [n.rsplit(".", 1)[-1] for n in names] == sorted([str(pid), str(pid + 1)])


def _graph(units: int) -> tf.Graph:
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 4], name="x")
        w = tf.compat.v1.get_variable("w", [4, units])
        tf.matmul(x, w, name="y")
    return graph


def _graphs_in_events(directory) -> int:
    return sum(e.HasField("graph_def")
               for path in glob.glob(os.path.join(directory, "events.out.tfevents.*"))
               for e in tf.compat.v1.train.summary_iterator(path))


def test_the_graph_is_written_once_and_again_only_when_it_changes(tmp_path):
    from google.protobuf import text_format
    path = tmp_path / files.GRAPH_FILE
    assert files.write_graph(_graph(3), str(tmp_path)) is True
    first = path.read_text()
    parsed = text_format.Parse(first, tf.compat.v1.GraphDef())  # the header is a comment
    assert parsed == _graph(3).as_graph_def(add_shapes=True)
    assert {n.name for n in parsed.node} >= {"x", "w", "y"}
    mtime = path.stat().st_mtime_ns
    # A restarted chief: the same graph built again in a new tf.Graph
    assert files.write_graph(_graph(3), str(tmp_path)) is False
    assert path.read_text() == first and path.stat().st_mtime_ns == mtime
    assert files.write_graph(_graph(5), str(tmp_path)) is True  # another graph: rewritten
    assert path.read_text() != first
    assert not list(tmp_path.glob("*.tmp"))
    files.close_event_writers()
    assert _graphs_in_events(tmp_path) == 2  # TensorBoard's graph: once per write
