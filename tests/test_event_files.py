"""Eval summaries of two runs on one directory in one second (`outputs.files.event_writer`)."""

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
