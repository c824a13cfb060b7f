"""lowlevel.ops.resources: the CPUs a task sizes its pools from (cgroup v2 and v1 quotas, the
pod's request, the affinity mask, the cores), its memory limit, Kubernetes quantities; and a
real trainer process in a CPU-limited cgroup of this machine, where it may make one."""

import os
import re
import subprocess
import sys
import time
import uuid

import portpicker
import pytest

import clusters
from lowlevel.ops import resources


def _tree(root, files: dict) -> str:
    for path, text in files.items():
        full = os.path.join(root, path.lstrip("/"))
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w") as f:
            f.write(text)
    return str(root)


V2_MOUNTS = "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
V1_MOUNTS = ("31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755\n"
             "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n"
             "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
             "40 31 0:37 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n")


def v2_tree(tmp_path, leaf_max="max 100000", parent_max="max 100000", memory="max"):
    """A pod's cgroup v2 as a container sees it without a cgroup namespace."""
    return _tree(tmp_path, {
        "/proc/self/mountinfo": V2_MOUNTS,
        "/proc/self/cgroup": "0::/kubepods/pod1/ctr\n",
        "/sys/fs/cgroup/kubepods/pod1/ctr/cpu.max": leaf_max,
        "/sys/fs/cgroup/kubepods/pod1/cpu.max": parent_max,
        "/sys/fs/cgroup/kubepods/cpu.max": "max 100000",
        "/sys/fs/cgroup/kubepods/pod1/ctr/memory.max": memory,
    })


def v1_tree(tmp_path, quota="-1", period="100000", memory="9223372036854771712"):
    return _tree(tmp_path, {
        "/proc/self/mountinfo": V1_MOUNTS,
        "/proc/self/cgroup": ("12:memory:/kubepods/pod1/ctr\n4:cpu,cpuacct:/kubepods/pod1/ctr\n"
                              "0::/\n"),
        "/sys/fs/cgroup/cpu,cpuacct/kubepods/pod1/ctr/cpu.cfs_quota_us": quota,
        "/sys/fs/cgroup/cpu,cpuacct/kubepods/pod1/ctr/cpu.cfs_period_us": period,
        "/sys/fs/cgroup/cpu,cpuacct/kubepods/cpu.cfs_quota_us": "-1",
        "/sys/fs/cgroup/cpu,cpuacct/kubepods/cpu.cfs_period_us": "100000",
        "/sys/fs/cgroup/memory/kubepods/pod1/ctr/memory.limit_in_bytes": memory,
    })


def figure(root, env=None, affinity=64, cores=64):
    return resources.cpu_figure(root, env or {}, affinity=affinity, cores=cores)


def test_cgroup_v2_quota_sizes_a_pod_on_a_big_node(tmp_path):
    root = v2_tree(tmp_path, leaf_max="200000 100000", memory="4294967296")
    fig = figure(root)
    assert (fig.cpus, fig.source, fig.quota) == (2, "cgroup quota", 2.0)
    assert "cgroup v2 cpu.max 200000/100000" in fig.describe()
    assert "64 cores on the machine" in fig.describe()
    assert resources.memory_limit(root) == 4 * 2 ** 30


def test_cgroup_v2_the_smallest_quota_above_the_container_applies(tmp_path):
    root = v2_tree(tmp_path, leaf_max="max 100000", parent_max="150000 100000")
    fig = figure(root)
    assert fig.cpus == 1 and fig.quota == 1.5  # 1.5 CPUs: one thread, not two throttled
    assert "/sys/fs/cgroup/kubepods/pod1 " in fig.detail + " "


def test_cgroup_v2_without_a_quota_falls_back_to_the_request_then_the_cores(tmp_path):
    root = v2_tree(tmp_path)
    assert figure(root).cpus == 64 and figure(root).source == "cores"
    fig = figure(root, {resources.CPU_REQUEST_ENV: "2500"})
    assert (fig.cpus, fig.source, fig.request) == (2, "cpu request", 2.5)
    assert figure(root, {resources.CPU_REQUEST_ENV: "500"}).cpus == 1  # never below 1
    assert figure(root, {resources.CPU_REQUEST_ENV: "junk"}).source == "cores"
    assert resources.memory_limit(root) is None  # "max"


def test_cgroup_v1_quota_and_memory_limit(tmp_path):
    root = v1_tree(tmp_path, quota="300000", memory=str(2 * 2 ** 30))
    fig = figure(root, {resources.CPU_REQUEST_ENV: "1000"})  # a limit beats the request
    assert (fig.cpus, fig.source) == (3, "cgroup quota")
    assert "cgroup v1 cpu.cfs_quota_us 300000/100000" in fig.detail
    assert resources.memory_limit(root) == 2 * 2 ** 30


def test_cgroup_v1_without_a_quota_and_no_limit(tmp_path):
    root = v1_tree(tmp_path)
    assert figure(root).source == "cores" and resources.memory_limit(root) is None


def test_the_affinity_mask_caps_every_other_figure(tmp_path):
    root = v1_tree(tmp_path, quota="800000")
    fig = figure(root, affinity=4)
    assert (fig.cpus, fig.source) == (4, "affinity")
    assert figure(v2_tree(tmp_path / "b"), affinity=3).cpus == 3


def test_no_cgroup_files_at_all(tmp_path):
    fig = figure(str(tmp_path), cores=8, affinity=8)
    assert (fig.cpus, fig.source) == (8, "cores")
    assert resources.memory_limit(str(tmp_path)) is None


@pytest.mark.parametrize("text,value", [("500m", "0.5"), ("2", "2"), ("1.5", "1.5"),
                                        ("0.25", "0.25"), ("1e3m", None)])
def test_cpu_quantities(text, value):
    if value is None:
        with pytest.raises(resources.QuantityError):
            resources.cpu_quantity(text)
    else:
        assert str(resources.cpu_quantity(text).normalize()) == value


@pytest.mark.parametrize("text,needle", [("two", "not a CPU quantity"), ("0", "more than 0"),
                                         ("-1", "more than 0"), ("0.0005", "millicores"),
                                         ("2 cpus", "not a CPU quantity")])
def test_bad_cpu_quantities(text, needle):
    with pytest.raises(resources.QuantityError, match=needle):
        resources.cpu_quantity(text)


@pytest.mark.parametrize("text,value", [("4Gi", 4 * 2 ** 30), ("512Mi", 512 * 2 ** 20),
                                        ("2G", 2 * 10 ** 9), ("1.5Gi", 3 * 2 ** 29),
                                        ("1e9", 10 ** 9), ("2147483648", 2 ** 31)])
def test_memory_quantities(text, value):
    assert resources.memory_quantity(text) == value


@pytest.mark.parametrize("text,needle", [("2GB", "not 2GB"), ("4gi", "not a memory quantity"),
                                         ("1.5", "whole number of bytes"),
                                         ("100Mi", "at least 512 MiB")])
def test_bad_memory_quantities(text, needle):
    with pytest.raises(resources.QuantityError, match=needle):
        resources.memory_quantity(text, minimum=512 * 2 ** 20)


# A real process in a real cgroup: this machine's cgroups are v1 and writable as root.
CPU_ROOT = "/sys/fs/cgroup/cpu"


def _can_make_cpu_cgroup() -> bool:
    return (os.geteuid() == 0 and os.path.isfile(os.path.join(CPU_ROOT, "cpu.cfs_quota_us"))
            and os.access(CPU_ROOT, os.W_OK))


@pytest.fixture
def cpu_cgroup():
    """A cgroup v1 CPU group of this test's own, removed afterwards (its processes first)."""
    if not _can_make_cpu_cgroup():
        pytest.skip("needs root and a writable cgroup v1 cpu hierarchy (this machine's "
                    "hybrid layout has one)")
    path = os.path.join(CPU_ROOT, f"lowlevel-test-{uuid.uuid4().hex[:8]}")
    os.mkdir(path)
    try:
        yield path
    finally:
        deadline = time.monotonic() + 30
        while True:
            with open(os.path.join(path, "cgroup.procs")) as f:
                if not f.read().split():
                    break
            assert time.monotonic() < deadline, "a process stayed in the test's cgroup"
            time.sleep(0.2)
        os.rmdir(path)


def _sizing_line(cgroup, tmp_path, extra_env=None, preexec=None):
    """Starts a worker (1 ps + 1 worker on loopback; the ps never comes) inside `cgroup`,
    returns its log line naming the CPUs and its pools, then ends it."""
    log = tmp_path / "worker.log"
    argv = [sys.executable, "-m", "lowlevel.trainer", "--ps_hosts=127.0.0.1:1",
            f"--worker_hosts=127.0.0.1:{portpicker.pick_unused_port()}", "--job_name=worker",
            "--task_index=0", "--startup_timeout_secs=60"]

    def enter():
        with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
        if preexec:
            preexec()

    with open(log, "w") as out:
        proc = subprocess.Popen(argv, cwd=clusters.ROOT,
                                env=dict(clusters.ENV, **(extra_env or {})), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                preexec_fn=enter)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            m = re.search(r"worker0: (\d+) CPUs? \(([^:]+): .*intra-op (\d+), inter-op (\d+)",
                          log.read_text())
            if m:
                return int(m.group(1)), m.group(2), int(m.group(3)), int(m.group(4))
            assert proc.poll() is None, log.read_text()[-2000:]
            time.sleep(0.2)
        raise AssertionError(f"no sizing line in 120 s:\n{log.read_text()[-2000:]}")
    finally:
        proc.kill()
        proc.wait(timeout=30)


@pytest.mark.cluster  # starts a trainer process
@pytest.mark.timeout(300)
def test_a_worker_in_a_cgroup_with_a_1_cpu_quota_sizes_its_pools_for_1_cpu(cpu_cgroup, tmp_path):
    with open(os.path.join(cpu_cgroup, "cpu.cfs_period_us")) as f:
        period = int(f.read())
    with open(os.path.join(cpu_cgroup, "cpu.cfs_quota_us"), "w") as f:
        f.write(str(period))  # 1 CPU
    cpus, source, intra, inter = _sizing_line(cpu_cgroup, tmp_path)
    assert (cpus, source, intra, inter) == (1, "cgroup quota", 1, 2)
    # The same cgroup without a quota: the machine's cores (or the mask), as before.
    with open(os.path.join(cpu_cgroup, "cpu.cfs_quota_us"), "w") as f:
        f.write("-1")
    cpus, source, intra, _ = _sizing_line(cpu_cgroup, tmp_path)
    expected = min(os.cpu_count(), len(os.sched_getaffinity(0)))
    assert cpus == intra == expected and source in ("cores", "affinity")


@pytest.mark.cluster  # starts a trainer process
@pytest.mark.timeout(300)
def test_a_worker_pinned_to_one_cpu_sizes_its_pools_for_it(cpu_cgroup, tmp_path):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 CPUs to pin to fewer")
    first = min(os.sched_getaffinity(0))
    cpus, source, intra, _ = _sizing_line(
        cpu_cgroup, tmp_path, preexec=lambda: os.sched_setaffinity(0, {first}))
    assert (cpus, source, intra) == (1, "affinity", 1)


def test_per_task_memory_limits_from_one_value_or_per_role():
    from lowlevel.errors import UsageError
    from lowlevel.ops import memory_limits
    tasks = ["ps0", "ps1", "worker0", "worker1", "evaluator0"]
    assert memory_limits.limits_for(tasks, None) == {}
    assert memory_limits.limits_for(tasks, "4Gi") == {name: 4 * 2 ** 30 for name in tasks}
    assert memory_limits.limits_for(tasks, "ps=12Gi,chief=3Gi,worker=512Mi") == {
        "ps0": 12 * 2 ** 30, "ps1": 12 * 2 ** 30, "worker0": 3 * 2 ** 30,
        "worker1": 512 * 2 ** 20}
    assert memory_limits.limits_for(tasks, "worker=1Gi")["worker0"] == 2 ** 30  # chief: a worker
    with pytest.raises(UsageError, match=r"--memory: '2GB' is not a memory quantity"):
        memory_limits.limits_for(tasks, "ps=2GB")
    with pytest.raises(UsageError, match=r"roles ps, worker, chief, evaluator"):
        memory_limits.limits_for(tasks, "master=2Gi")
    assert memory_limits.gib(600 * 2 ** 20) == "600 MiB" and memory_limits.gib(None) == "?"
    assert memory_limits.gib(12 * 2 ** 30) == "12.0 GiB"


def test_per_task_cpu_limits_from_one_value_or_per_role():
    from decimal import Decimal

    from lowlevel.errors import UsageError
    from lowlevel.ops import cpu_limits
    tasks = ["ps0", "worker0", "worker1"]
    assert cpu_limits.limits_for(tasks, None) == {}
    assert cpu_limits.limits_for(tasks, "500m") == {name: Decimal("0.5") for name in tasks}
    assert cpu_limits.limits_for(tasks, "ps=250m,chief=2,worker=1.5") == {
        "ps0": Decimal("0.25"), "worker0": 2, "worker1": Decimal("1.5")}
    with pytest.raises(UsageError, match=r"--cpu: '0': expected more than 0 CPUs"):
        cpu_limits.limits_for(tasks, "ps=0")
    with pytest.raises(UsageError, match=r"--cpu=master=1: expected one value"):
        cpu_limits.limits_for(tasks, "master=1")
    assert [cpu_limits.quantity(Decimal(x)) for x in ("0.25", "1", "1.5")] == [
        "250m", "1", "1500m"]


@pytest.mark.parametrize("version", [1, 2])
def test_cpu_cgroups_get_their_quota_and_a_joining_worker_its_roles(tmp_path, version):
    """`cpu_limits.TaskCgroups` on a fake cgroup tree: each task's directory under the
    launcher's own, with its quota in the version's file; a worker new to the job gets a
    worker's limit (not the chief's); removed at the end."""
    from decimal import Decimal

    from lowlevel.ops import cpu_limits
    root = v1_tree(tmp_path) if version == 1 else v2_tree(tmp_path)
    own = ("/sys/fs/cgroup/cpu,cpuacct/kubepods/pod1/ctr" if version == 1
           else "/sys/fs/cgroup/kubepods/pod1/ctr")
    groups = cpu_limits.TaskCgroups({"ps0": Decimal("0.25"), "worker0": Decimal(2),
                                     "worker1": Decimal("0.5")}, root=root)
    assert groups.base == f"{root}{own}/lowlevel-launch-{os.getpid()}"
    groups.inherit("worker2")
    assert groups.limits["worker2"] == Decimal("0.5")
    for name in ("ps0", "worker2"):
        groups.add(name, None)

    def quota(name):
        if version == 2:
            with open(os.path.join(groups.base, name, "cpu.max")) as f:
                return f.read()
        with open(os.path.join(groups.base, name, "cpu.cfs_quota_us")) as f:
            return f.read()
    assert quota("ps0") == ("25000" if version == 1 else "25000 100000")
    assert quota("worker2") == ("50000" if version == 1 else "50000 100000")
    if version == 2:
        with open(os.path.join(groups.base, "cgroup.subtree_control")) as f:
            assert f.read() == "+cpu"
    for name in ("ps0", "worker2"):  # a fake tree's files: a real cgroup's vanish with it
        for file in os.listdir(os.path.join(groups.base, name)):
            os.remove(os.path.join(groups.base, name, file))
    os.remove(os.path.join(groups.base, "cgroup.subtree_control")) if version == 2 else None
    assert groups.close() == [] and not os.path.exists(groups.base)


@pytest.mark.parametrize("version", [1, 2])
def test_a_ps_held_back_in_most_periods_is_named_from_the_launchers_summary(tmp_path, version):
    """Each task's `cpu.stat` (a fake tree's) through `TaskCgroups.summary`, the line the
    launcher prints, read back by `parse_summary`; `ps_held_back` names the ps held back in
    more than half of its periods, not a worker that is (it is computing) nor a ps below."""
    from decimal import Decimal

    from lowlevel.ops import cpu_limits
    root = v1_tree(tmp_path) if version == 1 else v2_tree(tmp_path)
    limits = {"ps0": Decimal("0.4"), "ps1": Decimal("0.4"), "worker0": Decimal("0.3")}
    groups = cpu_limits.TaskCgroups(limits, root=root)
    stats = {"ps0": (602, 476, 12.8), "ps1": (596, 83, 0.5), "worker0": (627, 600, 9.2)}
    for name, (periods, throttled, held) in stats.items():
        groups.add(name, None)
        held_line = (f"throttled_usec {int(held * 1e6)}" if version == 2
                     else f"throttled_time {int(held * 1e9)}")
        with open(os.path.join(groups.base, name, "cpu.stat"), "w") as f:
            f.write(f"nr_periods {periods}\nnr_throttled {throttled}\n{held_line}\n")
    line = f"launch: CPU: {groups.summary()}"
    used = cpu_limits.parse_summary("launch: CPU limits (--cpu): ps0 400m\n" + line + "\n")
    assert {name: (u["periods"], u["throttled_periods"], u["held_back_secs"], u["limit"])
            for name, u in used.items()} == {
        name: (p, t, h, limits[name]) for name, (p, t, h) in stats.items()}
    assert cpu_limits.held_back_shares(used) == {
        name: round(t / p, 3) for name, (p, t, _) in stats.items()}
    assert cpu_limits.ps_held_back(used) == {"ps0": round(476 / 602, 3)}
    assert cpu_limits.parse_summary("launch: all 3 tasks exited 0") == {}
    for name in stats:
        for file in os.listdir(os.path.join(groups.base, name)):
            os.remove(os.path.join(groups.base, name, file))
    os.remove(os.path.join(groups.base, "cgroup.subtree_control")) if version == 2 else None
    assert groups.close() == [] and not os.path.exists(groups.base)
