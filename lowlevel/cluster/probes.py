"""TCP probes of a cluster's addresses: is a port free, does a task answer, wait for the ps tasks.

A `tf.compat.v1.train.Server` gives no way to ask whether another task is up
without a session that may wait forever in CreateSession; a TCP connect to the
task's port answers in milliseconds. These probes need no TensorFlow.
"""

from __future__ import annotations

import errno
import socket
import threading
import time
from typing import Callable, Iterable, Optional

from absl import logging

from lowlevel.cluster.spec import PS, Cluster, Task
from lowlevel.errors import StartupError, UsageError

POLL_SECS = 0.5  # how often a waiting loop checks for signals and deadlines


def check_port_free(address: str, task: Task) -> None:
    """Raises UsageError if another process listens on the port of `address` ("host:port").

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


def silent_sync_peers(cluster: Optional[Cluster]) -> list[str]:
    """`silent_tasks` among those a sync step waits on: the ps tasks (their accumulators)
    and the training tasks other than the chief; [] in-process (`cluster` None)."""
    if cluster is None:
        return []
    waited_on = ([cluster.task(PS, k) for k in range(cluster.num_ps)] +
                 [t for t in cluster.training_tasks() if not t.is_chief])
    return silent_tasks(cluster, waited_on)


def silent_tasks(cluster: Cluster, tasks: Iterable[Task], timeout_secs: float = 1.0) -> list[str]:
    """"name at host:port" of each task in `tasks` whose server does not answer (`answering`:
    a frozen task's kernel still accepts connections)."""
    named = [(t.name, cluster.hosts(t.job_name)[t.task_index]) for t in tasks]
    answered = answering([a for _, a in named], timeout_secs)
    return [f"{name} at {address}" for name, address in named if not answered[address]]


def wait_for_ps(cluster: Cluster, timeout_secs: float, poll_secs: float = POLL_SECS,
                give_up: Optional[Callable[[], None]] = None,
                flag: str = "--startup_timeout_secs", answer: bool = False) -> None:
    """Polls until every ps task accepts TCP connections (with `answer`: until its server answers).

    A session on a cluster whose ps is down waits in CreateSession forever,
    logging "CreateSession still waiting for response from worker"; this
    bounded wait names the task instead. It runs before every session is
    created, the ones that recover from a ps failure included. A host name that
    does not resolve (yet: on Kubernetes, a new pod's Service name,
    kubeflow/training-operator#1458) is retried the same way, and named as such
    at the deadline.

    Args:
      timeout_secs: the longest wait, seconds.
      poll_secs: seconds between polls.
      give_up: called every poll; it may raise to end the wait (a worker
        whose run has finished meanwhile raises `errors.TrainingFinished`).
      flag: the flag `timeout_secs` comes from, for the message.
      answer: wait until each ps's server answers (`answering`), not only its
        kernel: a frozen ps accepts connections, and a session created
        against it waits in CreateSession with no deadline.

    Raises:
      StartupError: a ps did not answer (or its host name did not resolve)
        within `timeout_secs`; the message names its address. Exit status 200.
    """
    deadline = time.monotonic() + timeout_secs
    waiting = dict(enumerate(cluster.ps_hosts))
    logged = False
    while True:
        if answer:
            answered = answering(list(waiting.values()), 1.0)
            waiting = {k: a for k, a in waiting.items() if not answered[a]}
        else:
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
                    f"{timeout_secs:g} s ({flag}; on Kubernetes a new pod's "
                    "Service name can take seconds: kubeflow/training-operator#1458): is "
                    "the name in --ps_hosts / TF_CONFIG right?")
            raise StartupError(
                f"ps{k} at {address} did not answer within {timeout_secs:g} s "
                f"({flag}): is its process running, and is the address "
                "in --ps_hosts / TF_CONFIG right?")
        if not logged:
            logging.info("waiting for %s to %s", ", ".join(
                f"ps{k} at {a}" for k, a in waiting.items()), "answer" if answer else "come up")
            logged = True
        time.sleep(poll_secs)


# The client preface of HTTP/2 (RFC 9113 section 3.4) and an empty SETTINGS frame.
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def answers(address: str, timeout_secs: float = 1.0) -> bool:
    """Whether the gRPC server at `address` ("host:port") answers within `timeout_secs`.

    Stronger than `reachable`: the kernel of a host whose server process is
    frozen (SIGSTOP, a stalled VM, a hung process) still accepts TCP
    connections into the listen backlog, but only a running server replies to
    the HTTP/2 client preface with its SETTINGS frame (RFC 9113 section 3.4;
    TensorFlow's servers speak gRPC over HTTP/2). A partitioned host fails
    the connect itself. Never raises.
    """
    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + timeout_secs
    try:
        with socket.create_connection((host.strip("[]"), int(port)),
                                      timeout=timeout_secs) as sock:
            sock.sendall(_H2_PREFACE)
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            return len(sock.recv(9)) > 0
    except (OSError, ValueError):
        return False


def answering(addresses: list[str], timeout_secs: float = 1.0) -> dict[str, bool]:
    """{address: whether it `answers`} for every address, probed together in `timeout_secs`.

    Each probe runs in its own daemon thread, and the result is taken at the
    deadline whatever a probe is doing: `answers`'s socket timeout does not
    bound the name lookup before the connect (`getaddrinfo`; a DNS server that
    does not answer holds it for the resolver's own timeouts), so a probe still
    running then counts as not answering and is left to finish on its own.
    """
    results: dict[str, bool] = {}
    lock = threading.Lock()

    def probe(address: str) -> None:
        ok = answers(address, timeout_secs)
        with lock:
            results[address] = ok

    threads = [threading.Thread(target=probe, args=(a,), name="probe", daemon=True)
               for a in dict.fromkeys(addresses)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout_secs + 0.1
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    with lock:
        return {a: results.get(a, False) for a in addresses}
