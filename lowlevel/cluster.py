"""The cluster and this process's task in it: parsing, roles and validation.

A cluster has a `ps` job (parameter servers, which hold the variables) and a
`worker` job (which compute). Worker 0 is the chief: it initialises or
restores the model, saves checkpoints and summaries, evaluates at the end and
tells the ps tasks to exit. No TensorFlow import here: `Cluster.as_dict()` is
what `tf.train.ClusterSpec` takes.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import socket
from typing import Optional

from lowlevel.config import UsageError

PS, WORKER = "ps", "worker"
JOBS = (PS, WORKER)


def parse_hosts(value: str, flag: str) -> tuple[str, ...]:
    """Parses a comma-separated `host:port` list, e.g. "127.0.0.1:2222,127.0.0.1:2223".

    Raises:
      UsageError: an entry is not host:port, the port is not 1-65535, or an
        address appears twice.
    """
    hosts = tuple(h.strip() for h in value.split(",") if h.strip())
    for host in hosts:
        name, sep, port = host.rpartition(":")
        if not sep or not name or not port.isdigit():
            raise UsageError(f"--{flag}: '{host}' is not host:port (e.g. 127.0.0.1:2222)")
        if not 1 <= int(port) <= 65535:
            raise UsageError(f"--{flag}: port {port} in '{host}' is out of range 1-65535")
    return hosts


@dataclasses.dataclass(frozen=True)
class Cluster:
    """The addresses of every task, by job.

    Attributes:
      ps_hosts: `host:port` of each ps task, in task_index order.
      worker_hosts: `host:port` of each worker task; worker 0 is the chief.
    """

    ps_hosts: tuple[str, ...]
    worker_hosts: tuple[str, ...]

    def __post_init__(self):
        if not self.worker_hosts:
            raise UsageError("--worker_hosts: a cluster needs at least one worker")
        if not self.ps_hosts:
            raise UsageError("--ps_hosts: a cluster needs at least one ps task to hold "
                             "the variables (omit both host flags to train in-process)")
        seen = {}
        for job, hosts in ((PS, self.ps_hosts), (WORKER, self.worker_hosts)):
            for i, host in enumerate(hosts):
                if host in seen:
                    raise UsageError(
                        f"address {host} is given twice ({seen[host]} and {job}{i}); "
                        "every task needs its own port")
                seen[host] = f"{job}{i}"

    @property
    def num_ps(self) -> int:
        return len(self.ps_hosts)

    @property
    def num_workers(self) -> int:
        return len(self.worker_hosts)

    def hosts(self, job_name: str) -> tuple[str, ...]:
        return self.ps_hosts if job_name == PS else self.worker_hosts

    def as_dict(self) -> dict[str, list[str]]:
        """The `{"ps": [...], "worker": [...]}` mapping `tf.train.ClusterSpec` takes."""
        spec = {WORKER: list(self.worker_hosts)}
        if self.ps_hosts:
            spec[PS] = list(self.ps_hosts)
        return spec

    def tasks_on_host_of(self, job_name: str, task_index: int) -> int:
        """How many tasks of the cluster share the machine of the given task.

        Loopback names (localhost, 127.0.0.0/8, ::1) and this machine's own
        hostname count as one machine. Used to share the cores fairly.
        """
        mine = _machine(self.hosts(job_name)[task_index].rpartition(":")[0])
        return sum(_machine(h.rpartition(":")[0]) == mine
                   for h in self.ps_hosts + self.worker_hosts)


@dataclasses.dataclass(frozen=True)
class Task:
    """This process's place in the cluster.

    Attributes:
      job_name: "ps" or "worker".
      task_index: index within the job, from 0.
    """

    job_name: str
    task_index: int

    @property
    def is_chief(self) -> bool:
        return self.job_name == WORKER and self.task_index == 0

    @property
    def name(self) -> str:
        """Short name used in logs, e.g. "worker1"."""
        return f"{self.job_name}{self.task_index}"

    @property
    def device(self) -> str:
        """The task's device prefix, e.g. "/job:worker/task:1"."""
        return f"/job:{self.job_name}/task:{self.task_index}"


def from_flags(ps_hosts: str, worker_hosts: str, job_name: Optional[str],
               task_index: int) -> tuple[Optional[Cluster], Task]:
    """Builds the cluster and this task from the classic flags.

    With neither `ps_hosts` nor `worker_hosts` the result is (None, chief):
    in-process training with no servers.

    Raises:
      UsageError: a malformed address, a job not in the cluster, a task_index
        out of range, or a missing --job_name.
    """
    if not ps_hosts and not worker_hosts:
        if job_name == PS:
            raise UsageError("--job_name=ps needs --ps_hosts and --worker_hosts")
        return None, Task(WORKER, 0)
    cluster = Cluster(parse_hosts(ps_hosts or "", "ps_hosts"),
                      parse_hosts(worker_hosts or "", "worker_hosts"))
    if not job_name:
        raise UsageError("--job_name is required with --ps_hosts/--worker_hosts: "
                         f"expected one of {', '.join(JOBS)}")
    if job_name not in JOBS:
        raise UsageError(f"--job_name={job_name}: expected one of {', '.join(JOBS)}")
    hosts = cluster.hosts(job_name)
    if not hosts:
        raise UsageError(f"--job_name={job_name}: the cluster has no {job_name} tasks "
                         f"(--{job_name}_hosts is empty)")
    if not 0 <= task_index < len(hosts):
        raise UsageError(f"--task_index={task_index}: job '{job_name}' has "
                         f"{len(hosts)} task(s), so expected 0 to {len(hosts) - 1}")
    return cluster, Task(job_name, task_index)


def _machine(host: str) -> str:
    host = host.strip("[]")
    try:
        if ipaddress.ip_address(host).is_loopback:
            return "localhost"
    except ValueError:
        if host in ("localhost", socket.gethostname(), os.uname().nodename):
            return "localhost"
    return host
