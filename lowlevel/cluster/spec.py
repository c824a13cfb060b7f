"""The cluster and this process's task in it, from flags or `TF_CONFIG`.

A cluster has a `ps` job (parameter servers, which hold the variables) and
the training tasks: a `worker` job and, optionally, a `chief` job of one task
(`master` in tensor2tensor's and Estimator's `TF_CONFIG`). The chief
initialises or restores the model, saves checkpoints and summaries, evaluates
at the end and tells the ps tasks to exit; without a `chief` job, worker 0 is
the chief. An `evaluator` task is not part of the cluster a server is built
with: it runs locally and talks to no other task.

`TF_CONFIG` is read by `lowlevel.cluster.tf_config`.

No TensorFlow import here: `Cluster.as_dict()` is what
`tf.train.ClusterSpec` takes.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import socket
from typing import Optional

from lowlevel.errors import UsageError

PS, WORKER, CHIEF, EVALUATOR = "ps", "worker", "chief", "evaluator"
JOBS = (CHIEF, WORKER, PS, EVALUATOR)
ALIASES = {"master": CHIEF}  # tensor2tensor's and Estimator's name for the chief


def parse_hosts(value: str, flag: str) -> tuple[str, ...]:
    """Parses a comma-separated `host:port` list, e.g. "127.0.0.1:2222,127.0.0.1:2223".

    Raises:
      UsageError: an entry is not host:port or its port is not 1-65535.
    """
    hosts = tuple(h.strip() for h in value.split(",") if h.strip())
    for host in hosts:
        name, sep, port = host.rpartition(":")
        if not sep or not name or not port.isdigit():
            raise UsageError(f"{flag}: '{host}' is not host:port (e.g. 127.0.0.1:2222)")
        if not 1 <= int(port) <= 65535:
            raise UsageError(f"{flag}: port {port} in '{host}' is out of range 1-65535")
    return hosts


@dataclasses.dataclass(frozen=True)
class Task:
    """This process's place in the cluster.

    Attributes:
      job_name: "chief", "worker", "ps" or "evaluator".
      task_index: index within the job, from 0.
      chief_job: whether the cluster has a separate `chief` job (then worker 0
        is an ordinary worker).
    """

    job_name: str
    task_index: int
    chief_job: bool = False

    @property
    def is_chief(self) -> bool:
        return self.job_name == CHIEF or (
            self.job_name == WORKER and self.task_index == 0 and not self.chief_job)

    @property
    def replica_index(self) -> Optional[int]:
        """Position among the training tasks (chief first), for data shards; None if none."""
        if self.job_name == CHIEF:
            return 0
        if self.job_name == WORKER:
            return self.task_index + int(self.chief_job)
        return None

    @property
    def name(self) -> str:
        """Short name used in logs, e.g. "worker1"."""
        return f"{self.job_name}{self.task_index}"

    @property
    def device(self) -> str:
        """The task's device prefix, e.g. "/job:worker/task:1"."""
        return f"/job:{self.job_name}/task:{self.task_index}"


@dataclasses.dataclass(frozen=True)
class Cluster:
    """The addresses of every task, by job.

    Attributes:
      ps_hosts: `host:port` of each ps task, in task_index order.
      worker_hosts: `host:port` of each worker task.
      chief_hosts: `host:port` of the chief job's task, or () when worker 0 is
        the chief.
      sparse: from a `sparseCluster`: an address this task was not given is
        None, and `num_workers` is None (unknown).
    """

    ps_hosts: tuple[Optional[str], ...]
    worker_hosts: tuple[Optional[str], ...]
    chief_hosts: tuple[str, ...] = ()
    sparse: bool = False

    def __post_init__(self):
        if len(self.chief_hosts) > 1:
            raise UsageError(f"the chief job has {len(self.chief_hosts)} tasks "
                             f"({','.join(self.chief_hosts)}); expected one")
        if not self.worker_hosts and not self.chief_hosts and not self.sparse:
            raise UsageError("--worker_hosts: a cluster needs at least one worker")
        if not self.ps_hosts:
            raise UsageError("--ps_hosts: a cluster needs at least one ps task to hold "
                             "the variables (omit both host flags to train in-process)")
        seen = {}
        for job in (CHIEF, PS, WORKER):
            for i, host in enumerate(self.hosts(job)):
                if host is None:
                    continue
                if host in seen:
                    raise UsageError(
                        f"address {host} is given twice ({seen[host]} and {job}{i}); "
                        "every task needs its own port")
                seen[host] = f"{job}{i}"

    @property
    def num_ps(self) -> int:
        return len(self.ps_hosts)

    @property
    def num_workers(self) -> Optional[int]:
        """Training tasks: the workers, and the chief when it is a job of its own; None
        when sparse (the other workers are unknown)."""
        if self.sparse:
            return None
        return len(self.worker_hosts) + len(self.chief_hosts)

    def hosts(self, job_name: str) -> tuple[str, ...]:
        return {PS: self.ps_hosts, WORKER: self.worker_hosts,
                CHIEF: self.chief_hosts}.get(job_name, ())

    def task(self, job_name: str, task_index: int) -> Task:
        return Task(job_name, task_index, chief_job=bool(self.chief_hosts))

    def training_tasks(self) -> list[Task]:
        """The chief and workers in replica order (the chief first)."""
        return ([self.task(CHIEF, 0)] * len(self.chief_hosts)
                + [self.task(WORKER, i) for i, h in enumerate(self.worker_hosts)
                   if h is not None])

    def as_dict(self) -> dict:
        """The `{"chief": [...], "ps": [...], "worker": [...]}` mapping `ClusterSpec` takes.

        A job of which only some tasks are known (sparse) is a {task_index:
        host} dict, which `ClusterSpec` also takes.
        """
        spec = {}
        for job in (CHIEF, PS, WORKER):
            hosts = self.hosts(job)
            if None in hosts:
                spec[job] = {i: h for i, h in enumerate(hosts) if h is not None}
            elif hosts:
                spec[job] = list(hosts)
        return spec

    def tasks_on_host_of(self, job_name: str, task_index: int,
                         jobs: tuple[str, ...] = (CHIEF, PS, WORKER)) -> int:
        """How many tasks of `jobs` share the machine of the given task (itself included if of `jobs`).

        Loopback names (localhost, 127.0.0.0/8, ::1) and this machine's own
        hostname count as one machine. Used to share the cores fairly.
        """
        mine = _machine(self.hosts(job_name)[task_index].rpartition(":")[0])
        return sum(_machine(h.rpartition(":")[0]) == mine
                   for job in jobs for h in self.hosts(job) if h is not None)


@dataclasses.dataclass(frozen=True)
class ClusterFlags:
    """The cluster flags as given; None (or "") for a flag not on the command line."""

    ps_hosts: str = ""
    worker_hosts: str = ""
    job_name: Optional[str] = None
    task_index: Optional[int] = None


def from_flags(flags: ClusterFlags) -> tuple[Optional[Cluster], Optional[Task]]:
    """Builds the cluster and this task from the classic flags.

    Returns (None, None) with no host flags and no --job_name (in-process
    training), and (None, evaluator) for `--job_name=evaluator` alone.

    Raises:
      UsageError: a malformed address, a job not in the cluster, a task_index
        out of range, or a missing --job_name.
    """
    job = ALIASES.get(flags.job_name, flags.job_name)
    if job is not None and job not in JOBS:
        raise UsageError(f"--job_name={flags.job_name}: expected one of {', '.join(JOBS)}")
    if not flags.ps_hosts and not flags.worker_hosts:
        if job in (PS, WORKER, CHIEF):
            raise UsageError(f"--job_name={flags.job_name} needs --ps_hosts and --worker_hosts")
        return None, evaluator_task(flags.task_index, "--task_index") if job else None
    cluster = Cluster(parse_hosts(flags.ps_hosts, "--ps_hosts"),
                      parse_hosts(flags.worker_hosts, "--worker_hosts"))
    if not job:
        raise UsageError("--job_name is required with --ps_hosts/--worker_hosts: "
                         f"expected one of {', '.join(JOBS)}")
    if job == EVALUATOR:
        return cluster, evaluator_task(flags.task_index, "--task_index")
    return cluster, checked_task(cluster, job, flags.task_index or 0, "--job_name",
                                 "--task_index")


def checked_task(cluster: Cluster, job: str, index: int, job_src: str, index_src: str) -> Task:
    """Task `job`/`index` of `cluster`; UsageError naming `job_src`/`index_src` if absent."""
    hosts = cluster.hosts(job)
    if not hosts:
        raise UsageError(f"{job_src}={job}: the cluster has no {job} tasks")
    if not 0 <= index < len(hosts):
        raise UsageError(f"{index_src}={index}: job '{job}' has {len(hosts)} task(s), "
                         f"so expected 0 to {len(hosts) - 1}")
    return cluster.task(job, index)


def evaluator_task(index: Optional[int], index_src: str) -> Task:
    """The evaluator (there is one, index 0); UsageError naming `index_src` otherwise."""
    if index not in (None, 0):
        raise UsageError(f"{index_src}={index}: there is one evaluator, index 0")
    return Task(EVALUATOR, 0)


def _machine(host: str) -> str:
    host = host.strip("[]")
    try:
        if ipaddress.ip_address(host).is_loopback:
            return "localhost"
    except ValueError:
        if host in ("localhost", socket.gethostname(), os.uname().nodename):
            return "localhost"
    return host
