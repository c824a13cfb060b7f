"""Shared fixtures: TensorFlow imported quietly, free loopback ports, cluster processes."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))


def pytest_configure(config):
    """TensorFlow imported quietly, in graph mode, before any test module (they import it
    at the top): in a test process, not in pytest-xdist's controller, which runs no test
    (its import, ~4 s of CPU, would come before the workers start)."""
    if not getattr(config.option, "numprocesses", None) or hasattr(config, "workerinput"):
        from lowlevel.tf_import import import_tensorflow
        import_tensorflow()


# scripts/test runs the suite on pytest-xdist workers (`-n`). The tests of each of these
# groups of files run on one worker, one after another (`pytest_xdist_make_scheduler`
# below); every other test is a unit of its own, sent to whichever worker is free:
XDIST_GROUPS = {
    # launcher memory cgroups: test_launch compares the cgroups before and after a run.
    "memory_cgroups": ("test_launch.py", "test_sparse_bench.py"),
}

# The groups go out first, the largest first (xdist's scope reordering); then the other
# files' tests, these first, longest first (seconds summed over their tests, serial,
# docs/testing.md): a worker that takes a long test late leaves the other idle at the end.
SLOW_FIRST = ("test_network_faults.py", "test_chaos.py", "test_recovery.py", "test_image.py",
              "test_tf1_programs.py", "test_k8s.py", "test_launch_script.py",
              "test_dynamic_embeddings.py", "test_liveness.py", "test_wide_deep.py",
              "test_ctr_export.py",
              "test_portable_checkpoints.py", "test_storage.py", "test_trainer.py",
              # the in-process tier's longest (1-4 s tests), ahead of its many short ones
              "test_estimator_bench.py", "test_estimator_rnn_sdca.py", "test_placement.py",
              "test_estimator_head_metrics.py", "test_ps_products.py", "test_models.py")


def pytest_collection_modifyitems(config, items):
    """Puts the tests of `SLOW_FIRST` first, in its order (the same on every worker)."""
    rank = {name: k for k, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


def pytest_collection_finish(session):
    """What is loaded by now (TensorFlow, every test module: ~410,000 objects) goes into the
    collector's permanent generation (`gc.freeze`, `lowlevel.ops.forking.freeze_heap`), so
    that the tests' own garbage collections, many in graph building, do not scan it again
    each time."""
    from lowlevel.ops.forking import freeze_heap
    freeze_heap()


# With three or more workers (scripts/test runs three) the last is the waiting lane: it
# takes only the tests of these files and these tests ("file::name"), which mostly wait
# on fault timers and outages (~940 s of wall at ~0.5 of a core, runs 5 and 11's per-test
# CPU, docs/testing.md), one at a time, while the others take the CPU-bound rest on the
# two cores; a CPU lane takes waiting tests too once no other test is left. Each group of
# `XDIST_GROUPS` is a lane's too, the lane of its files.
WAITING = ("test_network_faults.py", "test_chaos.py", "test_links.py", "test_liveness.py",
           "test_across_hosts.py",
           # ~100 s of a frozen ps at the default limits, 10 s of CPU
           "test_tf1_programs.py::test_a_frozen_ps_ends_the_scripts_workers_with_200_naming_"
           "it_at_the_default_limits")


def waits(nodeid: str) -> bool:
    """Whether the test `nodeid` belongs in the waiting lane (`WAITING`)."""
    name = nodeid.rsplit("/", 1)[-1]
    return any(name == w or name.startswith(w + "::") or name.startswith(w + "[")
               for w in WAITING)


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """xdist's scheduling by scope, a scope being a group of `XDIST_GROUPS` or one test,
    each scope in its lane (`WAITING`).

    (Not `--dist loadgroup` with `xdist_group` marks: xdist 3.8 names a group by renaming
    the test's `_nodeid`, which pytest 9.2 no longer reads, so every group came apart.)
    """
    from xdist.scheduler import LoadScopeScheduling

    def file_of(nodeid: str) -> str:
        return nodeid.split("::", 1)[0].rsplit("/", 1)[-1]

    class LaneScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            name = file_of(nodeid)
            return next((g for g, files in XDIST_GROUPS.items() if name in files), nodeid)

        def _next_scope(self, node):
            """The first queued scope of `node`'s lane; else, on a CPU lane, any; else None."""
            waiting = {s: waits(next(iter(unit)))
                       for s, unit in self.workqueue.items()}
            if len(self.nodes) < 3:
                return next(iter(self.workqueue), None)
            if node.gateway.id == f"gw{len(self.nodes) - 1}":
                return next((s for s, w in waiting.items() if w), None)
            return next((s for s, w in waiting.items() if not w), next(iter(waiting), None))

        def _assign_work_unit(self, node) -> None:
            scope = self._next_scope(node)
            if scope is None:
                node.shutdown()
                return
            work_unit = self.workqueue.pop(scope)
            self.assigned_work.setdefault(node, {})[scope] = work_unit
            collection = self.registered_collections[node]
            node.send_runtest_some([collection.index(nodeid)
                                    for nodeid, done in work_unit.items() if not done])

        def _reschedule(self, node) -> None:
            if node.shutting_down:
                return
            if not self.workqueue:
                node.shutdown()
            elif self._pending_of(self.assigned_work[node]) <= 2:
                self._assign_work_unit(node)

    return LaneScheduling(config, log)


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
