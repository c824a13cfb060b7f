"""The localhost launcher: a whole cluster in one command, no orphans ever."""

import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest

import clusters

pytestmark = pytest.mark.cluster  # every test here starts trainer processes


def _launch(out, *flags, timeout=240):
    return clusters.run([sys.executable, "-m", "lowlevel.launch", f"--output_dir={out}",
                         *flags], timeout=timeout)


@pytest.mark.timeout(400)
def test_launch_trains_then_a_second_run_resumes_from_the_checkpoint(tmp_path):
    out = tmp_path / "run"
    first = _launch(out, "--train_steps=400", "--save_checkpoint_steps=100", "--evaluator")
    assert first.returncode == 0, first.stdout[-4000:]
    assert "[ps0]" in first.stdout and "[worker1]" in first.stdout
    assert "launch: all 4 tasks exited 0" in first.stdout
    m1 = clusters.final_metrics(out)
    assert m1["start_global_step"] == 0 and m1["global_step"] >= 400
    evaluations = clusters.eval_metrics(out)  # the evaluator ended on the final checkpoint
    assert evaluations[-1]["global_step"] == m1["global_step"]
    assert evaluations[-1]["accuracy"] == pytest.approx(m1["accuracy"])

    second = _launch(out, "--train_steps=800", "--save_checkpoint_steps=100")
    assert second.returncode == 0, second.stdout[-4000:]
    m2 = clusters.final_metrics(out)
    assert m2["start_global_step"] >= m1["global_step"]  # restored, not started over
    assert m2["global_step"] >= 800
    ready = clusters.task_events(out, "worker0", "session_ready")
    assert len(ready) == 2 and ready[-1]["origin"] == "restored", ready
    assert ready[-1]["restored_step"] == m2["start_global_step"]

    third = _launch(out, "--train_steps=800")  # nothing left to train: every task ends at once
    assert third.returncode == 0, third.stdout[-4000:]
    assert "[worker0]" in third.stdout and "[worker1]" in third.stdout
    for task in ("worker0", "worker1"):  # no task built a session
        assert len(clusters.task_events(out, task, "session_ready")) == 2, task
    assert clusters.final_metrics(out) == m2
    assert not clusters.leftovers(out)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("flags,needle", [
    (["--batch_size=0"], "--batch_size=0"),
    (["--job_name=ps"], "--job_name is set by the launcher"),
    (["--num_workers=0"], "--num_workers must be at least 1"),
    (["--num_workers=2", "--sync", "--replicas_to_aggregate=3"], "expected 1 to 2"),
    (["--memory=2GB"], "'2GB' is not a memory quantity"),
    (["--memory=ps=1Gi,master=2Gi"], "roles ps, worker, chief, evaluator"),
    (["--cpu=0"], "--cpu: '0': expected more than 0 CPUs"),
    (["--cpu=ps=1,master=1"], "--cpu=ps=1,master=1: expected one value"),
    (["--dynamic_workers"], "--dynamic_workers: workers join and leave through the data "
                            "queue; use --dataset=criteo_files"),
    (["--resize=0"], "--resize=0: a job needs at least 1 worker"),
])
def test_launcher_usage_errors_start_nothing(tmp_path, flags, needle):
    result = _launch(tmp_path / "never", *flags, timeout=50)
    assert result.returncode == 2, result
    assert needle in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "never").exists()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("start", ["--fork", "--nofork"])
def test_a_failing_task_stops_the_others_and_the_launcher_fails(tmp_path, start):
    out = tmp_path / "fail"
    result = _launch(out, "--dataset=mnist", f"--data_dir={tmp_path / 'missing'}", start,
                     timeout=100)
    assert result.returncode == 1, result.stdout[-3000:]
    assert ("exited with status 1 (permanent failure); not restarting it; stopping the other "
            "tasks") in result.stdout
    assert "no such directory" in result.stdout
    assert not clusters.leftovers(out)


@pytest.mark.timeout(120)
def test_sigterm_stops_every_task(tmp_path):
    out = tmp_path / "term"
    # Cold, as a user starts it: what its tasks show in ps is part of what is checked.
    proc = clusters.start([sys.executable, "-m", "lowlevel.launch", f"--output_dir={out}",
                           "--train_steps=1000000"], os.devnull, cold=True)
    try:
        deadline = time.monotonic() + 90
        while not clusters.task_events(out, "worker0", "progress") and \
                time.monotonic() < deadline:  # training has begun
            time.sleep(0.1)
        assert clusters.task_events(out, "worker0", "progress")
        children = psutil.Process(proc.pid).children()
        assert len(children) == 3
        # Forked from the launcher (lowlevel.ops.forking), each still shows as its command.
        jobs = sorted(next(a for a in c.cmdline() if a.startswith("--job_name="))
                      for c in children)
        assert jobs == ["--job_name=ps", "--job_name=worker", "--job_name=worker"], jobs
        for child in children:
            assert child.cmdline()[1:3] == ["-m", "lowlevel.trainer"], child.cmdline()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
        gone, alive = psutil.wait_procs(children, timeout=10)
        assert not alive
        assert not clusters.leftovers(out)
    finally:
        if proc.poll() is None:
            proc.kill()
        for p in clusters.leftovers(out):
            p.kill()


@pytest.mark.timeout(180)
def test_a_closed_output_ends_the_relaying_not_the_run_and_sigterm_still_stops_it(tmp_path):
    """The launcher's stdout a pipe whose reader exits after one line (`| head -1`, a `tee`
    that died): the run goes on, and a SIGTERM then stops every task with 143. Before, the
    BrokenPipeError ended the launcher's main thread, its tasks ran on, and the SIGTERM
    stopped none."""
    out, err = tmp_path / "closed", tmp_path / "launch.err"
    with open(err, "w") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "lowlevel.launch", f"--output_dir={out}",
                                 "--train_steps=1000000"],
                                cwd=clusters.ROOT, env=clusters.ENV, stdout=subprocess.PIPE,
                                stderr=stderr)
    try:
        assert proc.stdout.readline()
        proc.stdout.close()  # the reader is gone
        deadline = time.monotonic() + 120
        while "reader is gone" not in err.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "the tasks go on" in err.read_text(), err.read_text()[-3000:]
        seen = len(clusters.task_events(out, "worker0", "progress"))
        deadline = time.monotonic() + 60
        while (len(clusters.task_events(out, "worker0", "progress")) < seen + 3 and
               time.monotonic() < deadline):
            time.sleep(0.2)
        assert len(clusters.task_events(out, "worker0", "progress")) >= seen + 3
        assert proc.poll() is None
        children = psutil.Process(proc.pid).children()
        assert len(children) == 3
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
        gone, alive = psutil.wait_procs(children, timeout=10)
        assert not alive
    finally:
        if proc.poll() is None:
            proc.kill()
        for p in clusters.leftovers(out):
            p.kill()


@pytest.mark.timeout(60)
def test_the_supervisor_relays_every_line_in_order_and_a_last_unended_one():
    """Output is read with a selector, not threads (a fork from a threaded process can
    deadlock): lines split across reads, a final line with no newline, and a task's end
    after its last line."""
    from lowlevel.ops.supervisor import Supervisor
    script = ("import sys, time\n"
              "for i in range(3000): sys.stdout.write(f'line {i}\\n')\n"
              "sys.stdout.flush(); time.sleep(0.2); sys.stdout.write('no newline')")
    sup = Supervisor({"t": [sys.executable, "-c", script]}, fork=False)
    got, deadline = [], time.monotonic() + 30
    while time.monotonic() < deadline:
        item = sup.next_line(0.5)
        if item is not None:
            got.append(item[2])
            if item[2] is None:
                break
    assert got == [f"line {i}" for i in range(3000)] + ["no newline", None]
    assert sup.procs["t"].wait(10) == 0


@pytest.mark.timeout(60)
def test_a_forked_task_waits_for_its_release_and_without_it_exits_1_having_run_nothing():
    """`forking.start(gate=)`: a task starts only once the launcher has put it into its
    cgroups; a launcher that could not closes the gate, and the task exits 1."""
    from lowlevel.ops import forking
    gate_r, gate_w = os.pipe()
    out_r, out_w = os.pipe()
    task = forking.start([sys.executable, "-m", "lowlevel.trainer", "--helpfull"],
                         dict(os.environ), out_w, close_fds=[gate_w, out_r], gate=gate_r)
    os.close(gate_r)
    os.close(out_w)
    try:
        time.sleep(1.0)
        assert task.poll() is None  # held at the gate
        os.close(gate_w)  # closed, never released
        gate_w = None
        assert task.wait(timeout=30) == 1
        assert os.read(out_r, 1 << 16) == b""  # --helpfull never ran
    finally:
        if gate_w is not None:
            os.close(gate_w)
        if task.poll() is None:
            task.send_signal(signal.SIGKILL)
            task.wait(timeout=10)
        os.close(out_r)


def _launcher_cgroups() -> list[str]:
    """The launcher cgroups (`memory_limits.PREFIX`) under this process's memory cgroup."""
    from lowlevel.ops import memory_limits, resources
    own = resources.own_cgroup("memory")
    return [n for n in os.listdir(own[0]) if n.startswith(memory_limits.PREFIX)] if own else []


needs_cgroups = pytest.mark.skipif(os.geteuid() != 0, reason="making cgroups needs root")


@needs_cgroups
@pytest.mark.timeout(180)
def test_a_task_past_its_memory_limit_is_killed_alone_and_named(tmp_path):
    """One ps holding 10 M rows x 16 and their Adagrad accumulators (1.3 GB) under a 600 MiB
    limit: the kernel kills it in its own cgroup, the launcher names it and its limit, stops
    the others and removes the cgroups; nothing else on the machine is touched."""
    out = tmp_path / "oom"
    before = _launcher_cgroups()
    result = _launch(out, "--memory=ps=600Mi", "--num_workers=1", "--model=wide_deep",
                     "--dataset=synthetic_ctr", "--vocab_size=10000000", "--train_steps=200",
                     timeout=150)
    assert result.returncode == 1, result.stdout[-3000:]
    assert "launch: memory limits (--memory): ps0 600 MiB" in result.stdout
    assert ("launch: ps0 was killed by SIGKILL: out of memory at its limit of 600 MiB "
            "(--memory), peak 600 MiB") in result.stdout, result.stdout[-3000:]
    assert "launch: peak memory: ps0 600 MiB of 600 MiB" in result.stdout
    assert _launcher_cgroups() == before
    assert not clusters.leftovers(out)


@needs_cgroups
@pytest.mark.timeout(180)
def test_tasks_within_their_limits_finish_and_their_peaks_are_reported(tmp_path):
    out = tmp_path / "fits"
    before = _launcher_cgroups()
    result = _launch(out, "--memory=ps=1Gi,worker=2Gi,chief=3Gi", "--train_steps=100",
                     timeout=150)
    assert result.returncode == 0, result.stdout[-3000:]
    assert ("launch: memory limits (--memory): ps0 1.0 GiB, worker0 3.0 GiB, worker1 2.0 GiB"
            in result.stdout)
    peaks = re.search(r"launch: peak memory: ps0 (\d+) MiB of 1.0 GiB, worker0 (\d+) MiB of "
                      r"3.0 GiB, worker1 (\d+) MiB of 2.0 GiB", result.stdout)
    assert peaks, result.stdout[-2000:]
    assert all(10 < int(p) < 1024 for p in peaks.groups()), peaks.groups()
    assert "launch: all 3 tasks exited 0" in result.stdout
    assert _launcher_cgroups() == before
    assert not clusters.leftovers(out)


def _cpu_launcher_cgroups() -> list[str]:
    """The launcher cgroups (`task_cgroups.PREFIX`) under this process's cpu cgroup."""
    from lowlevel.ops import resources, task_cgroups
    own = resources.own_cgroup("cpu")
    return [n for n in os.listdir(own[0]) if n.startswith(task_cgroups.PREFIX)] if own else []


@needs_cgroups
@pytest.mark.timeout(180)
def test_each_task_runs_within_its_cpu_limit_and_sizes_its_pools_for_it(tmp_path):
    """`--cpu`: each task in a CPU cgroup of its own with its role's quota, its thread
    pools sized from it, run under it by the scheduler, and the cgroups gone at the end."""
    out = tmp_path / "cpus"
    before = _cpu_launcher_cgroups()
    result = _launch(out, "--cpu=ps=250m,worker=500m", "--train_steps=400", timeout=150)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "launch: CPU limits (--cpu): ps0 250m, worker0 500m, worker1 500m" in result.stdout
    for task, quota in (("ps0", 25000), ("worker0", 50000), ("worker1", 50000)):
        sized = re.search(rf"\[{task}\] .*{task}: 1 CPU \(cgroup quota: cgroup v\d "
                          rf"cpu\S* {quota} ?/? ?100000 in \S*lowlevel-launch-\d+/{task};",
                          result.stdout)
        assert sized, (task, result.stdout[-3000:])
    # the scheduler ran each task under its quota (it counts periods only with one); how
    # often the quota stopped it depends on what else the machine runs
    used = dict(re.findall(r"(ps0|worker\d) (?:[\d.]+ CPU-s, )?held back [\d.]+ s in \d+ of "
                           r"(\d+) periods at (?:250|500)m", result.stdout))
    assert set(used) == {"ps0", "worker0", "worker1"}, result.stdout[-1500:]
    assert all(int(periods) > 0 for periods in used.values()), used
    # a ps held back in most of its periods is named in a warning, and only then
    from lowlevel.ops import cpu_limits
    parsed = cpu_limits.parse_summary(result.stdout)
    assert {name: u["periods"] for name, u in parsed.items()} == {
        name: int(periods) for name, periods in used.items()}
    warned = re.findall(r"launch: warning: (ps\d) was held back by its CPU limit \(250m\) in "
                        r"\d+% of its 100 ms periods", result.stdout)
    assert warned == list(cpu_limits.ps_held_back(parsed)), (warned, parsed)
    assert _cpu_launcher_cgroups() == before
    assert not clusters.leftovers(out)


@pytest.mark.timeout(30)
def test_an_unreadable_resize_request_is_said_and_the_worker_count_kept(tmp_path):
    """`--resize` writes its request and sends SIGHUP; a request the launcher cannot read
    (hand-edited, half-written) is one line from the launcher's loop, not a silent no-op."""
    from lowlevel.ops import resize
    said = []
    resizer = resize.Resizer(str(tmp_path), 2, new_worker=None, say=said.append)
    (tmp_path / resize.REQUEST_FILE).write_text("{not json")
    resizer._read_request()  # what the SIGHUP handler runs
    assert said == []  # nothing printed inside the handler

    class Running:  # the supervisor's state that `apply` reads before reconciling
        stopping, procs = False, {}
    resizer.apply(Running(), finished=set(), chief="worker0")
    assert len(said) == 1 and "unreadable" in said[0] and "keeping 2 worker(s)" in said[0], said
    assert resizer.target == 2
