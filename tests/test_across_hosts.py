"""Runs across hosts: every task on its own host (a network namespace, `lowlevel/testing/netns.py`).

The README's three-process flow (1 ps + 2 workers from `--ps_hosts`/`--worker_hosts`),
each task alone on its host, found by address and by host name, async and sync;
and chief + 2 workers + ps + evaluator from `TF_CONFIG` (sync). Every task listens
on port 2222 of its own address, as on separate machines. Every task exits 0, the
final global step is exactly `--train_steps`, the ps was stopped by the chief, and
the evaluator's last record is the last checkpoint. (tests/test_k8s.py runs the
tasks of a generated TFJob, async, the same way.)
"""

import json
import sys

import pytest

import clusters

pytestmark = pytest.mark.cluster

PORT = 2222
STEPS = 300
COMMON = [f"--train_steps={STEPS}", "--save_checkpoint_steps=100", "--intra_op_threads=1",
          "--inter_op_threads=2", "--log_every_secs=1", "--startup_timeout_secs=120"]


def _run(hosts, tmp_path, commands: dict, envs: dict | None = None, timeout_secs=360):
    procs, logs = {}, {}
    for name, argv in commands.items():
        logs[name] = tmp_path / f"{name}.log"
        procs[name] = clusters.start_on(hosts, name,
                                        [sys.executable, "-m", "lowlevel.trainer", *argv],
                                        logs[name], env=(envs or {}).get(name))
    statuses = clusters.wait_all(procs, timeout_secs)
    for name, (code, _) in statuses.items():
        assert code == 0, f"{name} exited {code}:\n{clusters.tail(logs[name])}"
    return logs


@pytest.mark.timeout(480)
@pytest.mark.parametrize("by,mode", [("address", "async"), ("name", "sync")])
def test_three_process_flow_with_each_task_on_its_own_host(tmp_path, hosts_factory, by, mode):
    names = {"ps0": ["run-ps-0.run.default.svc"], "worker0": ["run-worker-0.run.default.svc"],
             "worker1": ["run-worker-1.run.default.svc"]}
    hosts = hosts_factory(names)
    where = {h: (hosts.addresses[h] if by == "address" else names[h][0]) for h in names}
    out = tmp_path / "out"
    flags = [f"--ps_hosts={where['ps0']}:{PORT}",
             f"--worker_hosts={where['worker0']}:{PORT},{where['worker1']}:{PORT}",
             f"--output_dir={out}", *COMMON] + (["--sync"] if mode == "sync" else [])
    logs = _run(hosts, tmp_path, {
        "ps0": flags + ["--job_name=ps", "--task_index=0"],
        "worker0": flags + ["--job_name=worker", "--task_index=0"],
        "worker1": flags + ["--job_name=worker", "--task_index=1"]})
    metrics = clusters.final_metrics(out)
    assert metrics["global_step"] == STEPS and metrics["sync"] is (mode == "sync")
    assert metrics["num_workers"] == 2
    assert "the chief signalled the end of training" in logs["ps0"].read_text()
    # worker1 trained too: from its own host, through the ps's address or name
    assert clusters.task_events(out, "worker1", "done")


@pytest.mark.timeout(480)
def test_chief_workers_ps_and_evaluator_from_tf_config_sync(tmp_path, hosts_factory):
    jobs = {"chief": 1, "worker": 2, "ps": 1, "evaluator": 1}
    names = {f"{job}{i}": [f"ml-{job}-{i}.ml.svc"] for job, n in jobs.items() for i in range(n)}
    hosts = hosts_factory(names)
    cluster = {job: [f"ml-{job}-{i}.ml.svc:{PORT}" for i in range(n)]
               for job, n in jobs.items() if job != "evaluator"}
    out = tmp_path / "out"
    commands, envs = {}, {}
    for host in names:
        job, index = host.rstrip("0123456789"), int(host[-1])
        commands[host] = [f"--output_dir={out}", "--sync", *COMMON]
        envs[host] = {"TF_CONFIG": json.dumps({"cluster": cluster, "environment": "cloud",
                                               "task": {"type": job, "index": index}})}
    logs = _run(hosts, tmp_path, commands, envs)
    metrics = clusters.final_metrics(out)
    assert metrics["global_step"] == STEPS and metrics["sync"] is True
    assert metrics["num_workers"] == 3  # the chief and two workers
    evaluations = clusters.eval_metrics(out)
    assert evaluations[-1]["global_step"] == STEPS
    assert evaluations[-1]["accuracy"] == pytest.approx(metrics["accuracy"])
    assert "the chief signalled the end of training" in logs["ps0"].read_text()
