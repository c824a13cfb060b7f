"""Shared fixtures: TensorFlow imported quietly, free loopback ports, cluster processes."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from lowlevel.tf_import import import_tensorflow  # noqa: E402

import_tensorflow()


def pytest_sessionfinish(session, exitstatus):
    """Kills the forked processes a test left running (by PID), so that the session ends."""
    import prefork
    left = prefork.close_all()
    if left:
        print(f"\nprefork: killed {len(left)} forked process(es) left running: {left}")


@pytest.fixture
def ports():
    """A function returning n distinct free loopback ports."""
    import portpicker

    def pick(n):
        return [portpicker.pick_unused_port() for _ in range(n)]

    return pick


@pytest.fixture
def hosts_factory():
    """Makes `netns.Hosts` (`make({host: [names]})`); removes them after the test.

    Skips where namespaces cannot be made (not root, no iproute2).
    """
    from lowlevel.testing import netns
    reason = netns.unavailable()
    if reason:
        pytest.skip(reason)
    made = []

    def make(hosts):
        made.append(netns.Hosts(hosts))
        return made[-1]

    yield make
    for hosts in made:
        hosts.close()
    assert not [n for n in netns.leftovers() if any(n.startswith(ns) for h in made
                                                    for ns in h.namespaces.values())]


@pytest.fixture
def collect_graphs_quietly():
    """After the test, collects the graphs it built, with TensorFlow's logger silenced.

    SyncReplicasOptimizer makes a ready op that a graph never run leaves unused;
    tf_should_use reports it (a page of ERROR lines) when the graph is collected,
    which would otherwise happen in a later test or at exit, outside pytest's capture.
    """
    import gc

    import tensorflow as tf
    yield
    logger = tf.get_logger()
    level = logger.level
    logger.setLevel("CRITICAL")
    try:
        gc.collect()
    finally:
        logger.setLevel(level)
