"""lowlevel/testing/netns.py: hosts as network namespaces on one bridge, names resolving through
/etc/netns/NAME/hosts, everything removed afterwards, also when the body raises."""

import os
import subprocess
import sys

import pytest

from lowlevel.testing import netns

pytestmark = pytest.mark.skipif(netns.unavailable() is not None,
                                reason=str(netns.unavailable()))

SERVE = ("import socket; s = socket.socket(); s.bind(('0.0.0.0', 2222)); s.listen(); "
         "print('up', flush=True); c, peer = s.accept(); c.sendall(peer[0].encode()); c.close()")
FETCH = ("import socket; print(socket.gethostbyname('run-ps-0.ml.svc')); "
         "print(socket.create_connection(('run-ps-0.ml.svc', 2222), timeout=5).recv(64).decode())")


@pytest.mark.timeout(60)
def test_hosts_reach_each_other_by_name_and_are_removed():
    with netns.Hosts({"ps0": ["run-ps-0.ml.svc"], "worker0": ["run-worker-0.ml.svc"]}) as hosts:
        names = list(hosts.namespaces.values())
        assert all(n.startswith(netns.PREFIX) for n in names)
        assert hosts.addresses["ps0"].startswith("198.1")
        server = hosts.popen("ps0", [sys.executable, "-c", SERVE], stdout=subprocess.PIPE,
                             text=True)
        assert server.stdout.readline().strip() == "up"
        got = hosts.run("worker0", [sys.executable, "-c", FETCH], capture_output=True,
                        text=True, timeout=30)
        # the name resolves to ps0's address, and ps0 sees worker0's address
        assert got.stdout.split() == [hosts.addresses["ps0"], hosts.addresses["worker0"]], got
        assert server.wait(10) == 0
        # this machine's own /etc/hosts is untouched
        with open("/etc/hosts") as f:
            assert "run-ps-0.ml.svc" not in f.read()
    assert not [n for n in netns.leftovers() if n.startswith(tuple(names))]
    assert not any(os.path.exists(f"/etc/netns/{n}") for n in names)


@pytest.mark.timeout(60)
def test_everything_is_removed_when_the_body_fails():
    with pytest.raises(RuntimeError):
        with netns.Hosts({"a": ["a.svc"]}) as hosts:
            names = list(hosts.namespaces.values())
            sleeper = hosts.popen("a", ["sleep", "300"])
            raise RuntimeError("a failing test")
    assert sleeper.poll() is not None
    assert not [n for n in netns.leftovers() if n.startswith(tuple(names))]


def _fetch_entered(namespace, write_fd):
    """In a forked child: onto the host as `netns.enter` puts it, then FETCH's two lines."""
    import socket
    netns.enter(namespace)
    ip = socket.gethostbyname("run-ps-0.ml.svc")
    peer = socket.create_connection(("run-ps-0.ml.svc", 2222), timeout=5).recv(64).decode()
    with open("/etc/hosts") as f:
        sees = "run-ps-0.ml.svc" in f.read()
    os.write(write_fd, f"{ip} {peer} {sees} {os.readlink('/proc/self/ns/net')}".encode())


@pytest.mark.timeout(60)
def test_a_forked_process_entered_onto_a_host_is_there_as_with_ip_netns_exec():
    """`netns.enter` (what the tests' forked tasks use): the name resolves through the
    host's hosts file, the peer sees the host's address, the network namespace is the
    host's; the parent's own namespaces and /etc/hosts are untouched, and `track`ed
    processes are killed by `close()`."""
    import multiprocessing
    own_net = os.readlink("/proc/self/ns/net")
    with netns.Hosts({"ps0": ["run-ps-0.ml.svc"], "worker0": ["run-worker-0.ml.svc"]}) as hosts:
        server = hosts.popen("ps0", [sys.executable, "-c", SERVE], stdout=subprocess.PIPE,
                             text=True)
        assert server.stdout.readline().strip() == "up"
        ns_of_worker0 = hosts.run("worker0", ["readlink", "/proc/self/ns/net"],
                                  capture_output=True, text=True).stdout.strip()
        read_fd, write_fd = os.pipe()
        child = multiprocessing.get_context("fork").Process(
            target=_fetch_entered, args=(hosts.namespaces["worker0"], write_fd))
        child.start()
        child.join(30)
        os.close(write_fd)
        got = os.read(read_fd, 4096).decode().split()
        os.close(read_fd)
        assert child.exitcode == 0
        assert got == [hosts.addresses["ps0"], hosts.addresses["worker0"], "True",
                       ns_of_worker0], got
        assert server.wait(10) == 0
        sleeper = hosts.track(subprocess.Popen(["sleep", "300"]))
    assert os.readlink("/proc/self/ns/net") == own_net
    with open("/etc/hosts") as f:
        assert "run-ps-0.ml.svc" not in f.read()
    assert sleeper.poll() is not None  # killed by close()
