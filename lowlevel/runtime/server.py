"""Starting a task's server, and the session configs (thread policy, device filters).

Probing other tasks' addresses is `lowlevel.cluster.probes`; the end of training (the
ps tasks' exit included) is `lowlevel.runtime.shutdown`.

Note: a Server listens on all interfaces whatever host the cluster names, with
no authentication; keep clusters on trusted networks.
"""

from __future__ import annotations

import functools

import tensorflow as tf
from absl import logging

from lowlevel.cluster.probes import check_port_free
from lowlevel.cluster.spec import CHIEF, PS, WORKER, Cluster, Task
from lowlevel.ops import resources

v1 = tf.compat.v1

# The job name a training task's server boots under with a sparseCluster.
SPARSE_MASTER_JOB = "lowlevel_master"


def session_config(cluster: Cluster, task: Task, intra_op_threads: int = 0,
                   inter_op_threads: int = 0, cpu_devices: int = 1,
                   graph_rewrites: str = "default"):
    """The `ConfigProto` for a task's server and sessions.

    Thread pools (0 means "choose"): the CPUs this task may use (its cgroup's
    quota, else its pod's CPU request, its affinity mask, the machine's cores:
    `lowlevel.ops.resources`) go to the training tasks on its host, cores // (training tasks on this host) intra-op threads each;
    a ps beside them gets 1, since it does little arithmetic (it adds updates)
    and works mostly while its workers wait for it; a ps alone on its machine
    shares the cores with the other ps tasks there. Inter-op: at least 2 (a ps
    runs blocking queue and accumulator ops in its inter-op pool). Three tasks
    on two cores otherwise each start two full pools and fight over the cores;
    and a fair 1 thread each leaves a lone worker at half the speed of
    in-process training while its ps idles (benchmarks/NOTES.md).

    When the host has more tasks than cores, idle pool threads sleep at once
    instead of spinning first (`disable_thread_spinning`); so do a ps task's
    whenever training tasks share its host: a ps works in short bursts (an
    exchange, a step's variables), and its threads spinning after each burst
    take the core a worker computes on.

    `device_filters` keep a worker from waiting for, or talking to, the other
    workers: it sees only the ps job and itself; a ps sees only itself.

    `cpu_devices`: the CPU devices of a training task's server (its towers on a
    machine without GPUs, `lowlevel.modes.towers`); they share its thread pools.
    `graph_rewrites`: `--graph_rewrites` (`_set_graph_rewrites`).
    """
    cores = resources.cpus()
    here = functools.partial(cluster.tasks_on_host_of, task.job_name, task.task_index)
    training_here = here((CHIEF, WORKER))
    if task.job_name == PS:
        share = 1 if training_here else max(1, cores // here((PS,)))
        filters = [task.device]
    else:
        share = max(1, cores // training_here)
        filters = ["/job:ps", task.device]
    config = v1.ConfigProto(
        intra_op_parallelism_threads=intra_op_threads or share,
        inter_op_parallelism_threads=inter_op_threads or max(2, share),
        allow_soft_placement=True, device_filters=filters)
    if cpu_devices > 1 and task.job_name != PS:
        config.device_count["CPU"] = cpu_devices
    _set_graph_rewrites(config.graph_options.rewrite_options, graph_rewrites)
    # More tasks than cores: an idle pool thread that spins before it sleeps
    # burns a core another task on the host needs (+5 % exact 1 ps + 2 workers,
    # benchmarks/NOTES.md); a ps beside training tasks, likewise (communication-
    # reduced 1 ps + 1 worker over local: 0.83 -> 0.88, benchmarks/NOTES.md).
    config.experimental.disable_thread_spinning = here() > cores or (
        task.job_name == PS and bool(training_here))
    if cluster.sparse and task.job_name != PS:
        # A sparseCluster ps knows only itself: the worker's sessions tell it the
        # cluster they need (TensorFlow's ClusterSpec propagation), else the ps
        # cannot reach the worker ("No worker known as /job:worker/...").
        config.cluster_def.CopyFrom(
            v1.train.ClusterSpec(cluster.as_dict()).as_cluster_def())
        # ...and shares the ps tasks' variables and queues with every other session.
        config.experimental.share_session_state_in_clusterspec_propagation = True
    return config


def _set_graph_rewrites(rewrites, mode: str) -> None:
    """`RewriterConfig` `rewrites` for `--graph_rewrites` `mode`: Grappler's passes over each
    new run of a training task's sessions, TensorFlow's default (two), "one", or "off" (a
    ps runs no session of its own)."""
    if mode == "off":
        rewrites.disable_meta_optimizer = True
    elif mode == "one":
        rewrites.meta_optimizer_iterations = rewrites.ONE


def start(cluster: Cluster, task: Task, config) -> "v1.train.Server":
    """Starts this task's gRPC server (it serves until the process exits).

    Raises:
      UsageError: the port is already in use.
    """
    check_port_free(cluster.hosts(task.job_name)[task.task_index], task)
    spec, job, index = cluster.as_dict(), task.job_name, task.task_index
    if cluster.sparse and task.job_name != PS:
        # The sessions propagate the cluster (config.cluster_def), and TensorFlow
        # does not allow the master's own server to be booted under a name that
        # cluster lists: boot it as SPARSE_MASTER_JOB; the worker sessions the
        # master creates on it (through its own port) get this task's name.
        spec = {SPARSE_MASTER_JOB: [cluster.hosts(job)[index]]}
        job, index = SPARSE_MASTER_JOB, 0
    server = v1.train.Server(v1.train.ClusterSpec(spec), job_name=job, task_index=index,
                             config=config, start=True)
    logging.info("%s: server listening on %s (%s)", task.name,
                 cluster.hosts(task.job_name)[task.task_index], server.target)
    return server
