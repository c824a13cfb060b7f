"""This task's cluster and place in it from `TF_CONFIG`, or from the flags beside it.

`TF_CONFIG` is read in every form Kubeflow's training operator writes
(pkg/controller.v1/tensorflow/tensorflow.go): `"environment": "cloud"`; an
`evaluator` job inside the cluster map (current versions) or not (older
ones); and, with the `TFJob`'s `enableDynamicWorker`, `"sparseCluster"`
instead of `"cluster"`: a worker sees only the ps tasks and itself
(`{"worker": {"1": host}, "ps": [...]}`), a ps only itself (`{"ps": [own],
"worker": {}}`), a chief or evaluator nothing. Such a `Cluster` is *sparse*:
the other workers' addresses (and, for a ps, the other ps) are None, and the
number of workers is unknown.

No TensorFlow import here.
"""

from __future__ import annotations

import json
from typing import Optional

from lowlevel.cluster.spec import (
    ALIASES,
    CHIEF,
    EVALUATOR,
    JOBS,
    PS,
    WORKER,
    Cluster,
    ClusterFlags,
    Task,
    checked_task,
    evaluator_task,
    from_flags,
    parse_hosts,
)
from lowlevel.errors import UsageError


def from_tf_config(text: str) -> tuple[Optional[Cluster], Task]:
    """Parses a `TF_CONFIG` value: `{"cluster": {job: [host:port, ...]}, "task": {"type", "index"}}`.

    Job types: chief (or master), worker, ps, evaluator. "environment" (the
    training operator writes "cloud") is accepted and ignored. An "evaluator"
    job in "cluster" is dropped from the `Cluster` (an evaluator talks to no
    task). `"sparseCluster"` in place of "cluster" (`enableDynamicWorker`)
    gives a sparse `Cluster`; an evaluator then gets no cluster (None).

    Raises:
      UsageError: not JSON, "cluster" or "task" missing or malformed, an
        unknown job type, a bad address, or a task not in the cluster.
    """
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(f"TF_CONFIG is not JSON ({e.msg} at character {e.pos}): {text[:80]!r}")
    if not isinstance(value, dict):
        raise UsageError(f"TF_CONFIG: expected a JSON object with \"cluster\" and \"task\", "
                         f"got {text[:80]!r}")
    task = value.get("task")
    if not isinstance(task, dict) or "type" not in task:
        raise UsageError('TF_CONFIG lacks "task": expected e.g. "task": {"type": "worker", '
                         '"index": 0}')
    job = ALIASES.get(task["type"], task["type"])
    index = task.get("index", 0)
    if not isinstance(index, int) or isinstance(index, bool):
        raise UsageError(f"TF_CONFIG: task.index={index!r}: expected a whole number")
    if job not in JOBS:
        raise UsageError(f"TF_CONFIG: task.type={task['type']!r}: expected one of "
                         f"{', '.join(JOBS)} or master")
    if "sparseCluster" in value and "cluster" not in value:
        return _from_sparse(value["sparseCluster"], job, index)
    spec = value.get("cluster")
    if not isinstance(spec, dict) or not spec:
        raise UsageError('TF_CONFIG lacks "cluster": expected e.g. {"cluster": {"ps": '
                         '["host:2222"], "worker": ["host:2223"]}, "task": {...}}')
    hosts = {}
    for name, addresses in spec.items():
        hosts[_job(name)] = _addresses(addresses, f"cluster.{name}")
    cluster = Cluster(hosts.get(PS, ()), hosts.get(WORKER, ()), hosts.get(CHIEF, ()))
    if job == EVALUATOR:
        return cluster, evaluator_task(index, "TF_CONFIG task.index")
    return cluster, checked_task(cluster, job, index, "TF_CONFIG task.type", "TF_CONFIG task.index")


def _job(name: str) -> str:
    job = ALIASES.get(name, name)
    if job not in JOBS:
        raise UsageError(f"TF_CONFIG: cluster job '{name}' is unknown; expected "
                         f"{', '.join(JOBS)} or master")
    return job


def _addresses(addresses, key: str) -> tuple[str, ...]:
    if isinstance(addresses, str):
        addresses = [addresses]
    if not isinstance(addresses, list) or not all(isinstance(a, str) for a in addresses):
        raise UsageError(f"TF_CONFIG: {key} must be a list of \"host:port\" strings")
    return parse_hosts(",".join(addresses), f"TF_CONFIG {key}")


def _from_sparse(spec, job: str, index: int) -> tuple[Optional[Cluster], Task]:
    """The cluster and task of a `sparseCluster` TF_CONFIG (the operator's enableDynamicWorker)."""
    if not isinstance(spec, dict):
        raise UsageError('TF_CONFIG: "sparseCluster" must be an object {"ps": [...], '
                         '"worker": {"index": "host:port"}}')
    if job == EVALUATOR:  # the operator gives it an empty cluster; it needs none
        return None, evaluator_task(index, "TF_CONFIG task.index")
    if job == CHIEF:
        raise UsageError("TF_CONFIG: a chief gets no ps tasks in a sparseCluster (the training "
                         "operator's enableDynamicWorker gives only workers and ps their "
                         "addresses); with enableDynamicWorker use no Chief replica: worker 0 "
                         "is the chief")
    ps = _addresses(spec.get("ps") or [], "sparseCluster.ps")
    workers = spec.get("worker") or {}
    if not isinstance(workers, dict):
        raise UsageError('TF_CONFIG: sparseCluster.worker must be an object {"index": '
                         '"host:port"}')
    known = {}
    for key, address in workers.items():
        if not str(key).isdigit():
            raise UsageError(f"TF_CONFIG: sparseCluster.worker key {key!r}: expected a task "
                             "index")
        known[int(key)] = _addresses(address, f"sparseCluster.worker.{key}")[0]
    if job == PS:
        if len(ps) != 1:
            raise UsageError(f"TF_CONFIG: sparseCluster.ps of ps task {index} lists {len(ps)} "
                             "addresses; expected its own only")
        ps = (None,) * index + ps
    elif index not in known:
        raise UsageError(f"TF_CONFIG: sparseCluster.worker has no entry for this task "
                         f"(index {index}); expected {{\"{index}\": \"host:port\"}}")
    elif not ps:
        raise UsageError("TF_CONFIG: sparseCluster.ps is empty: a worker needs the ps "
                         "tasks' addresses")
    worker_hosts = tuple(known.get(i) for i in range(max(known, default=-1) + 1))
    cluster = Cluster(ps, worker_hosts, sparse=True)
    return cluster, cluster.task(job, index)


def resolve(flags: ClusterFlags, tf_config: Optional[str]) -> tuple[Optional[Cluster],
                                                                     Optional[Task]]:
    """The cluster and task from `TF_CONFIG` when set, else from the flags.

    Flags given beside `TF_CONFIG` must agree with it.

    Raises:
      UsageError: as `from_flags`/`from_tf_config`, or a flag that disagrees
        with `TF_CONFIG` (the message names both values).
    """
    if not tf_config or not tf_config.strip():
        return from_flags(flags)
    cluster, task = from_tf_config(tf_config)
    ps_hosts = cluster.ps_hosts if cluster else ()  # None: an evaluator of a sparseCluster
    worker_hosts = cluster.worker_hosts if cluster else ()
    given = {
        "--ps_hosts": (flags.ps_hosts and parse_hosts(flags.ps_hosts, "--ps_hosts"),
                       ps_hosts, "cluster.ps"),
        "--worker_hosts": (flags.worker_hosts and
                           parse_hosts(flags.worker_hosts, "--worker_hosts"),
                           worker_hosts, "cluster.worker"),
        "--job_name": (flags.job_name and ALIASES.get(flags.job_name, flags.job_name),
                       task.job_name, "task.type"),
        "--task_index": (flags.task_index, task.task_index, "task.index"),
    }
    for flag, (mine, theirs, key) in given.items():
        if mine not in (None, "") and mine != theirs:
            show = ",".join(mine) if isinstance(mine, tuple) else mine
            other = (",".join(h or "?" for h in theirs) if isinstance(theirs, tuple)
                     else theirs)
            raise UsageError(f"{flag}={show} disagrees with TF_CONFIG {key}={other}; "
                             "give the same value or drop the flag")
    return cluster, task
