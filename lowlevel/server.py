"""Starting a task's server, session configs, and cluster-wide shutdown.

A `tf.compat.v1.train.Server` cannot be stopped, and `server.join()` never
returns (tensorflow/tensorflow#4713, tensorflow/ecosystem#19), so the classic
ps task runs until somebody kills it. Here the shutdown goes through the
cluster itself, with two queues that live in the ps tasks' resource managers
(shared by name, so every session that builds them gets the same queue):

- `lowlevel/workers_done` on ps 0: each non-chief worker enqueues its
  replica index when its training loop has ended (`WorkersDoneHook.end`);
- `lowlevel/stop_ps<K>` on ps K: the chief enqueues one element when it has
  saved the final checkpoint, evaluated and heard from every worker (a
  worker whose server has gone counts as done; `shutdown_timeout_secs` bounds
  the wait). ps K waits on it and exits 0.

Every session a training task creates, the ones that recover from a failed
ps included, is preceded by `wait_for_ps`, a bounded TCP poll.

Note: a Server listens on all interfaces whatever host the cluster names, with
no authentication; keep clusters on trusted networks.
"""

from __future__ import annotations

import errno
import functools
import os
import socket
import threading
import time
from typing import Callable, Iterable, Optional

import tensorflow as tf
from absl import logging

from lowlevel.cluster import CHIEF, PS, WORKER, Cluster, Task
from lowlevel.config import UsageError
from lowlevel.exit_codes import TransientFailure

v1 = tf.compat.v1

# The job name a training task's server boots under with a sparseCluster.
SPARSE_MASTER_JOB = "lowlevel_master"
POLL_SECS = 0.5  # how often a waiting loop checks for signals and deadlines
# How long a worker's port must refuse connections before the chief, at the end
# of training, stops waiting for that worker's report.
GONE_SECS = 2.0
# After the chief's stop signal a ps keeps serving this long, so that the
# clean-up calls of sessions closing at that moment (the chief's among them)
# still reach it instead of logging "Cleanup partition error: UNAVAILABLE".
LINGER_SECS = 0.5


def session_config(cluster: Cluster, task: Task, intra_op_threads: int = 0,
                   inter_op_threads: int = 0):
    """The `ConfigProto` for a task's server and sessions.

    Thread pools (0 means "choose"): the cores of a machine go to the training
    tasks on it, cores // (training tasks on this host) intra-op threads each;
    a ps beside them gets 1, since it does little arithmetic (it adds updates)
    and works mostly while its workers wait for it; a ps alone on its machine
    shares the cores with the other ps tasks there. Inter-op: at least 2 (a ps
    runs blocking queue and accumulator ops in its inter-op pool). Three tasks
    on two cores otherwise each start two full pools and fight over the cores;
    and a fair 1 thread each leaves a lone worker at half the speed of
    in-process training while its ps idles (benchmarks/NOTES.md).

    When the host has more tasks than cores, idle pool threads sleep at once
    instead of spinning first (`disable_thread_spinning`).

    `device_filters` keep a worker from waiting for, or talking to, the other
    workers: it sees only the ps job and itself; a ps sees only itself.
    """
    cores = os.cpu_count() or 1
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
        allow_soft_placement=True,
        device_filters=filters)
    # More tasks than cores: an idle pool thread that spins before it sleeps
    # burns a core another task on the host needs (+5 % exact 1 ps + 2 workers,
    # benchmarks/NOTES.md).
    config.experimental.disable_thread_spinning = here() > cores
    if cluster.sparse and task.job_name != PS:
        # A sparseCluster ps knows only itself: the worker's sessions tell it the
        # cluster they need (TensorFlow's ClusterSpec propagation), else the ps
        # cannot reach the worker ("No worker known as /job:worker/...").
        config.cluster_def.CopyFrom(
            v1.train.ClusterSpec(cluster.as_dict()).as_cluster_def())
        # ...and shares the ps tasks' variables and queues with every other session.
        config.experimental.share_session_state_in_clusterspec_propagation = True
    return config


class StartupError(TransientFailure):
    """The cluster did not come together: a task never answered, or its host name never
    resolved, within the start-up timeout. Retryable (exit status 200)."""


def check_port_free(address: str, task: Task) -> None:
    """Raises UsageError if another process listens on the port of `address`.

    The check binds the port on all interfaces, as the server will. It is
    needed because gRPC sets SO_REUSEPORT: a second server on a port in use
    may start without error and share the connections of the first.
    """
    port = int(address.rpartition(":")[2])
    for family, any_addr in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:  # no IPv6 on this machine
            continue
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((any_addr, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise UsageError(f"{task.name}'s address {address}: port {port} is already "
                                 "in use on this machine; give the task a free port") from None
        finally:
            sock.close()


def reachable(address: str, timeout_secs: float = 1.0) -> bool:
    """Whether a TCP connection to `address` ("host:port") is accepted within `timeout_secs`."""
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_secs).close()
        return True
    except OSError:
        return False


def resolves(host: str) -> bool:
    """Whether `host` (a name or an IP address) resolves to an address now."""
    try:
        return bool(socket.getaddrinfo(host, None, type=socket.SOCK_STREAM))
    except (OSError, UnicodeError):
        return False


def unreachable_tasks(cluster: Cluster, tasks: Iterable[Task]) -> list[str]:
    """"name at host:port" of each task in `tasks` whose server does not accept connections."""
    return [f"{t.name} at {cluster.hosts(t.job_name)[t.task_index]}" for t in tasks
            if not reachable(cluster.hosts(t.job_name)[t.task_index], 0.5)]


def wait_for_ps(cluster: Cluster, timeout_secs: float, poll_secs: float = POLL_SECS,
                give_up: Optional[Callable[[], None]] = None) -> None:
    """Polls until every ps task accepts TCP connections.

    A session on a cluster whose ps is down waits in CreateSession forever,
    logging "CreateSession still waiting for response from worker"; this
    bounded wait names the task instead. A host name that does not resolve
    (yet: on Kubernetes, a new pod's Service name, kubeflow/training-operator#1458)
    is retried the same way, and named as such at the deadline. It runs before every session is
    created, the ones that recover from a ps failure included.

    Args:
      give_up: called every poll; it may raise to end the wait (a worker
        whose run has finished meanwhile raises `checkpoints.TrainingFinished`).

    Raises:
      StartupError: a ps did not answer (or its host name did not resolve)
        within `timeout_secs`; the message names its address. Exit status 200.
    """
    deadline = time.monotonic() + timeout_secs
    waiting = dict(enumerate(cluster.ps_hosts))
    logged = False
    while True:
        waiting = {k: a for k, a in waiting.items() if not reachable(a)}
        if not waiting:
            return
        if give_up is not None:
            give_up()
        if time.monotonic() >= deadline:
            k, address = next(iter(waiting.items()))
            host = address.rpartition(":")[0].strip("[]")
            if not resolves(host):
                raise StartupError(
                    f"ps{k} at {address}: host name {host} did not resolve within "
                    f"{timeout_secs:g} s (--startup_timeout_secs; on Kubernetes a new pod's "
                    "Service name can take seconds: kubeflow/training-operator#1458): is "
                    "the name in --ps_hosts / TF_CONFIG right?")
            raise StartupError(
                f"ps{k} at {address} did not answer within {timeout_secs:g} s "
                "(--startup_timeout_secs): is its process running, and is the address "
                "in --ps_hosts / TF_CONFIG right?")
        if not logged:
            logging.info("waiting for %s to come up", ", ".join(
                f"ps{k} at {a}" for k, a in waiting.items()))
            logged = True
        time.sleep(poll_secs)


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


def _queue(name: str, device: str, capacity: int = 1024):
    with v1.device(device):
        return v1.FIFOQueue(capacity, [tf.int32], shapes=[[]], shared_name=name,
                            name=name.replace("/", "_"))


class ShutdownChannel:
    """The shutdown queues, built into the current graph (before it is finalised)."""

    def __init__(self, num_ps: int):
        self.num_ps = num_ps
        self._task_index = v1.placeholder(tf.int32, [], name="shutdown_task_index")
        done = _queue("lowlevel/workers_done", "/job:ps/task:0/device:CPU:0")
        self._report_done = done.enqueue(self._task_index)
        self._next_done = done.dequeue()
        self._stop_ps = [_queue(f"lowlevel/stop_ps{k}", f"/job:ps/task:{k}/device:CPU:0")
                         .enqueue(0) for k in range(num_ps)]

    def report_done(self, sess, task_index: int) -> None:
        """Tells the chief that training task `task_index` (its replica index) has finished.

        Best effort: if ps 0 cannot be reached (it is being restarted), the
        chief notices this worker's exit instead (`wait_for_workers`).
        """
        try:
            sess.run(self._report_done, {self._task_index: task_index},
                     options=v1.RunOptions(timeout_in_ms=10_000))
        except (tf.errors.UnavailableError, tf.errors.DeadlineExceededError,
                tf.errors.AbortedError, tf.errors.CancelledError) as e:
            logging.warning("could not report the end of training to ps0: %s", e.message)

    def wait_for_workers(self, sess, workers: dict[int, str], timeout_secs: float,
                         stop: Optional[threading.Event] = None) -> dict[int, str]:
        """Waits until every worker has reported done or is gone; returns the ones still missing.

        A worker counts as gone once its server has refused connections for
        `GONE_SECS`: it exited (or died) after its last step, or its report
        was lost with a restarted ps 0. A worker restarted after this point
        finds the final checkpoint and exits at once.

        Args:
          workers: {replica index: "host:port"} of the workers to hear from.
          timeout_secs: the longest wait.
          stop: ends the wait early when set (the chief is being preempted).
        """
        missing = dict(workers)
        refused_since: dict[int, float] = {}
        deadline = time.monotonic() + timeout_secs
        while missing and time.monotonic() < deadline and not (stop and stop.is_set()):
            ms = int(min(POLL_SECS, max(0.0, deadline - time.monotonic())) * 1000) + 1
            try:
                missing.pop(int(sess.run(self._next_done,
                                         options=v1.RunOptions(timeout_in_ms=ms))), None)
                continue
            except tf.errors.DeadlineExceededError:
                pass
            now = time.monotonic()
            for i, address in list(missing.items()):
                if reachable(address, 0.2):
                    refused_since.pop(i, None)
                elif now - refused_since.setdefault(i, now) >= GONE_SECS:
                    logging.info("chief: the worker at %s has exited; not waiting for its "
                                 "report", address)
                    del missing[i]
        return missing

    def stop_ps(self, sess) -> None:
        """Tells every ps task to exit. A ps that is already gone is logged and skipped."""
        for k, op in enumerate(self._stop_ps):
            try:
                sess.run(op, options=v1.RunOptions(timeout_in_ms=10_000))
            except (tf.errors.UnavailableError, tf.errors.DeadlineExceededError,
                    tf.errors.AbortedError) as e:
                logging.warning("could not reach ps%d to stop it: %s", k, e.message)


def stop_cluster(server, cluster: Cluster, config, timeout_secs: float) -> None:
    """Tells every ps task to exit, from a session of its own (a chief with nothing to train).

    A ps that does not answer within `timeout_secs` is taken to have exited
    already (logged, not an error).
    """
    try:
        wait_for_ps(cluster, timeout_secs)
    except StartupError as e:
        logging.warning("chief: not stopping the ps tasks: %s", e)
        return
    with tf.Graph().as_default():
        channel = ShutdownChannel(cluster.num_ps)
        with v1.Session(server.target, config=config) as sess:
            channel.stop_ps(sess)
    logging.info("chief: told %d ps task(s) to exit", cluster.num_ps)


class WorkersDoneHook(v1.train.SessionRunHook):
    """The end-of-training handshake's first half, in the worker's own session, at its end.

    A non-chief worker reports that it is done. The chief waits for those
    reports (a worker whose server has gone counts as done), so that the hooks
    after this one — the final checkpoint and evaluation — see every worker's
    last update. Put it first among the hooks. Nothing is done when the task
    is being preempted: it will be back, and the run is not over.

    Running inside the session, before it is closed, means no new session is
    needed (creating one can wait seconds behind the closing one's clean-up,
    tensorflow/tensorflow#21745).

    Args:
      channel: the `ShutdownChannel` in the graph.
      task: this worker.
      cluster: the cluster (for the other training tasks).
      timeout_secs: how long the chief waits for the other workers' reports.
      preempted: set when the task is being preempted.
    """

    def __init__(self, channel: ShutdownChannel, task: Task, cluster: Cluster,
                 timeout_secs: float, preempted: Optional[threading.Event] = None):
        self._channel = channel
        self._task = task
        self._cluster = cluster
        self._timeout_secs = timeout_secs
        self._preempted = preempted or threading.Event()

    def end(self, session):
        if self._preempted.is_set():
            return
        if not self._task.is_chief:
            self._channel.report_done(session, self._task.replica_index)
            return
        others = {t.replica_index: self._cluster.hosts(t.job_name)[t.task_index]
                  for t in self._cluster.training_tasks() if not t.is_chief}
        missing = self._channel.wait_for_workers(session, others, self._timeout_secs,
                                                 self._preempted)
        if missing and not self._preempted.is_set():
            logging.warning("chief: no end-of-training report from the workers at %s within "
                            "%.0f s; going on without them", ", ".join(missing.values()),
                            self._timeout_secs)


class StopPsHook(v1.train.SessionRunHook):
    """The handshake's second half: the chief tells every ps task to exit. Put it last.

    Args:
      channel: the `ShutdownChannel` in the graph.
      preempted: set when the chief is being preempted (then nothing is done).
    """

    def __init__(self, channel: ShutdownChannel, preempted: Optional[threading.Event] = None):
        self._channel = channel
        self._preempted = preempted or threading.Event()

    def end(self, session):
        if self._preempted.is_set():
            return
        self._channel.stop_ps(session)
        logging.info("chief: told %d ps task(s) to exit", self._channel.num_ps)


def run_std_server(server, task: Task, config=None) -> int:
    """Serves as ps `task.task_index` until the chief's stop signal; returns an exit status.

    The wait for the signal is one blocking dequeue in a helper thread (a
    polling dequeue with a deadline makes the ps cancel a step every poll).
    SIGTERM and SIGINT are handled by `preemption.Preemption`, which ends the
    process at once (a ps has nothing to save: the chief's checkpoints are the
    state that survives it).

    Returns:
      0 after the chief's stop signal.
    """
    start_time = time.monotonic()
    stopped = threading.Event()
    with tf.Graph().as_default():
        wait = _queue(f"lowlevel/stop_ps{task.task_index}",
                      f"{task.device}/device:CPU:0").dequeue()
        sess = v1.Session(server.target, config=config)

    def wait_for_chief():
        sess.run(wait)
        stopped.set()

    threading.Thread(target=wait_for_chief, name="wait_for_chief", daemon=True).start()
    logging.info("%s: serving variables; will exit when the chief signals the end of "
                 "training", task.name)
    stopped.wait()
    logging.info("%s: the chief signalled the end of training after %.1f s; exiting",
                 task.name, time.monotonic() - start_time)
    time.sleep(LINGER_SECS)
    return 0
