"""A pytest plugin: the CPU seconds each test spent, its processes' included (root, cgroup v1).

    .venv/bin/python -m pytest -p tests.cpu_per_test -n 2 --junitxml=r.xml

Each pytest process (an xdist worker) moves itself into a `cpuacct` cgroup of its own at
start; the processes a test starts (forked or cold, in network namespaces too) inherit it.
A test's `cpu_s` is the group's `cpuacct.usage` (nanoseconds, all its processes) over the
test's set-up, call and tear-down, recorded as a property of the test's report (in the
junit XML). The group is removed at the end. With two workers on two busy cores a test's
wall time also counts the other worker's load; its CPU does not.
"""
import os

import pytest

ROOT = "/sys/fs/cgroup/cpuacct"
_group = {}


def pytest_configure(config):
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    path = os.path.join(ROOT, f"lowlevel-tests-{worker}-{os.getpid()}")
    try:
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    except OSError as e:
        raise pytest.UsageError(f"cpu_per_test: cannot use {ROOT} ({e}): root and cgroup v1 "
                                "with cpuacct are needed") from None
    _group["path"] = path


def pytest_unconfigure(config):
    path = _group.pop("path", None)
    if path:  # every process still in the group (this one, prefork's server) moves out
        with open(os.path.join(path, "cgroup.procs")) as f:
            pids = f.read().split()
        for pid in pids:
            try:
                with open(os.path.join(ROOT, "cgroup.procs"), "w") as f:
                    f.write(pid)
            except OSError:  # it exited meanwhile
                pass
        os.rmdir(path)


def _usage_secs() -> float:
    with open(os.path.join(_group["path"], "cpuacct.usage")) as f:
        return int(f.read()) / 1e9


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_logstart(nodeid, location):
    _group[nodeid] = _usage_secs()  # before the test's set-up


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if call.when == "teardown":
        spent = _usage_secs() - _group.pop(item.nodeid)
        outcome.get_result().user_properties.append(("cpu_s", round(spent, 2)))
