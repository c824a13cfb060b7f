"""Shared fixtures: TensorFlow imported quietly, free loopback ports, cluster processes."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from lowlevel.tf_import import import_tensorflow  # noqa: E402

import_tensorflow()


# scripts/test runs the suite on pytest-xdist workers (`-n`). The tests of each of these
# groups of files run on one worker, one after another (`pytest_xdist_make_scheduler`
# below); every other test is a unit of its own, sent to whichever worker is free:
XDIST_GROUPS = {
    # network namespaces on bridges, cut links, frozen peers: most of their time is spent
    # waiting on fault timers (test_network_faults alone: ~640 s, ~35 % of the serial
    # suite, at well under one core), so they run beside the CPU-bound tests of the
    # other worker rather than with each other. (Apart, on three workers: no faster, the
    # two cores were busy 80-100 % of the time, and a fault test failed on its timing,
    # docs/testing.md.)
    # test_tf1_programs joins them: its default-limit row waits ~100 s on a frozen ps.
    "netns": ("test_network_faults.py", "test_across_hosts.py", "test_chaos.py",
              "test_links.py", "test_netns.py", "test_k8s.py", "test_tf1_programs.py"),
    # launcher memory cgroups: test_launch compares the cgroups before and after a run.
    "memory_cgroups": ("test_launch.py", "test_sparse_bench.py"),
}

# The groups go out first, the largest first (xdist's scope reordering); then the other
# files' tests, these first, longest first (seconds summed over their tests, serial,
# docs/testing.md): a worker that takes a long test late leaves the other idle at the end.
SLOW_FIRST = ("test_recovery.py", "test_image.py",
              "test_dynamic_embeddings.py", "test_liveness.py", "test_wide_deep.py",
              "test_ctr_export.py",
              "test_portable_checkpoints.py", "test_storage.py", "test_trainer.py")


def pytest_collection_modifyitems(config, items):
    """Puts the tests of `SLOW_FIRST` first, in its order (the same on every worker)."""
    rank = {name: k for k, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """xdist's scheduling by scope, a scope being a group of `XDIST_GROUPS` or one test.

    (Not `--dist loadgroup` with `xdist_group` marks: xdist 3.8 names a group by renaming
    the test's `_nodeid`, which pytest 9.2 no longer reads, so every group came apart.)
    """
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            name = nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
            return next((g for g, files in XDIST_GROUPS.items() if name in files), nodeid)

    return GroupScheduling(config, log)


def pytest_sessionfinish(session, exitstatus):
    """Kills the forked processes a test left running (by PID), so that the session ends;
    an xdist worker hands its `prefork.counts` to the controller."""
    import prefork
    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput["prefork"] = dict(prefork.counts)
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


_worker_counts: list = []


def pytest_testnodedown(node, error):
    """(xdist controller) A worker's `prefork.counts`, kept for the summary."""
    _worker_counts.append(getattr(node, "workeroutput", {}).get("prefork", {}))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """One line: how many of the tests' processes were forked from one TensorFlow import."""
    import prefork
    counts = _worker_counts or [prefork.counts]
    forked = sum(c.get("forked", 0) for c in counts)
    cold = sum(c.get("cold", 0) for c in counts)
    if forked or cold:
        terminalreporter.write_line(
            f"prefork: {forked} test processes forked from one TensorFlow import, {cold} "
            "started cold by it (tests/prefork.py)")
