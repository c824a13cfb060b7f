"""Hosts on one machine: one Linux network namespace per host, all on one bridge.

    with netns.Hosts({"ps0": ["run-ps-0.ml.svc"], "worker0": ["run-worker-0.ml.svc"]}) as hosts:
        proc = hosts.popen("ps0", [sys.executable, "-m", "lowlevel.trainer", ...])

A harness for tests and benchmarks of clusters whose tasks are on separate
hosts, found by name as on Kubernetes. Each host gets its own address in
198.18.0.0/15 (RFC 2544's range for benchmarking networks) on a veth to a
bridge that has no address itself, so nothing routes out of it; and every
host's `/etc/netns/NAMESPACE/hosts` maps every host's names to its address,
which `ip netns exec` mounts over `/etc/hosts` (TensorFlow's gRPC resolves
through it). Every namespace, bridge, veth and hosts file is named with
`PREFIX` (`llns`) and removed by `close()` (also on an exception inside the
`with`), after killing any process still in the namespaces.

Needs root and iproute2 (`ip`); `unavailable()` says why not, for a skip.
"""

from __future__ import annotations

import ctypes
import ipaddress
import os
import shutil
import signal
import subprocess
import time
from typing import Optional

PREFIX = "llns"
NETWORK = ipaddress.ip_network("198.18.0.0/15")
_made = 0  # Hosts instances made by this process


def unavailable() -> Optional[str]:
    """Why namespaces cannot be made here (not root, no `ip`), or None."""
    if os.geteuid() != 0:
        return "network namespaces need root (this process is not)"
    if shutil.which("ip") is None:
        return "network namespaces need iproute2's ip command"
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def leftovers() -> list[str]:
    """Namespaces and links named with `PREFIX` that exist now (from any `Hosts`)."""
    names = _ip("netns", "list", check=False).stdout.split()
    links = [line.split(":")[1].strip().split("@")[0]
             for line in _ip("-o", "link", "show", check=False).stdout.splitlines()
             if ":" in line]
    return [n for n in names + links if n.startswith(PREFIX)]


# <sched.h>, <sys/mount.h>
_CLONE_NEWNS, _CLONE_NEWNET = 0x00020000, 0x40000000
_MS_BIND, _MS_REC, _MS_SLAVE, _MNT_DETACH = 4096, 16384, 1 << 19, 2


def enter(namespace: str) -> None:
    """Moves this process onto the host `namespace` as `ip netns exec NAMESPACE` would
    (iproute2's `netns_switch`): into its network namespace, into a mount namespace of its
    own (mounts not propagated back) with /sys remounted for that network and every file
    of `/etc/netns/NAMESPACE/` bound over its namesake in `/etc` (the hosts file).

    For a process forked from one that imported TensorFlow, onto a host, before it
    starts any thread (threads made afterwards share its namespaces). Python 3.11 has no
    `os.setns`/`os.unshare`: through libc.

    Raises:
      OSError: a call failed (not root, no such namespace, a threaded process).
    """
    libc = ctypes.CDLL(None, use_errno=True)

    def check(result: int, what: str) -> None:
        if result != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"netns.enter({namespace!r}): {what}: {os.strerror(err)}")

    fd = os.open(f"/var/run/netns/{namespace}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        check(libc.setns(fd, _CLONE_NEWNET), "setns")
    finally:
        os.close(fd)
    check(libc.unshare(_CLONE_NEWNS), "unshare")
    check(libc.mount(b"", b"/", b"none", _MS_SLAVE | _MS_REC, None), "mount / slave")
    check(libc.umount2(b"/sys", _MNT_DETACH), "umount /sys")
    check(libc.mount(namespace.encode(), b"/sys", b"sysfs", 0, None), "mount /sys")
    etc = f"/etc/netns/{namespace}"
    for name in sorted(os.listdir(etc)) if os.path.isdir(etc) else ():
        check(libc.mount(os.path.join(etc, name).encode(), f"/etc/{name}".encode(), b"none",
                         _MS_BIND, None), f"bind {etc}/{name}")


class Hosts:
    """Hosts as network namespaces on one bridge.

    Args:
      hosts: {host: [names that resolve to it]}, in order; host k gets the
        (k+1)-th address of this instance's /24 in 198.18.0.0/15.

    Attributes:
      addresses: {host: its IPv4 address (str)}.
      namespaces: {host: its namespace name}.
    """

    def __init__(self, hosts: dict[str, list[str]]):
        if len(hosts) > 250:
            raise ValueError(f"{len(hosts)} hosts: at most 250 fit a /24")
        self.namespaces: dict[str, str] = {}
        self._bridge = None
        global _made
        _made += 1
        # Unique among live instances (pid and a counter); interface names fit 15 bytes.
        tag = f"{os.getpid() % 10000}{_made % 100:02d}"
        self._bridge = f"{PREFIX}{tag}br"
        # Each instance has its own bridge, so subnets may repeat across instances.
        subnet = list(NETWORK.subnets(new_prefix=24))[int(tag) % 512]
        self.namespaces = {h: f"{PREFIX}{tag}h{k}" for k, h in enumerate(hosts)}
        self.addresses = {h: str(subnet[k + 1]) for k, h in enumerate(hosts)}
        self._prefixlen = subnet.prefixlen
        self._names = {h: list(names) for h, names in hosts.items()}
        self._procs: list[subprocess.Popen] = []
        try:
            self._create()
        except BaseException:
            self.close()
            raise

    def _create(self) -> None:
        _ip("link", "add", self._bridge, "type", "bridge")
        _ip("link", "set", self._bridge, "up")
        lines = "".join(f"{self.addresses[h]}\t{' '.join(names)}\n"
                        for h, names in self._names.items() if names)
        for k, (host, ns) in enumerate(self.namespaces.items()):
            outside, inside = f"{ns}o", f"{ns}i"
            _ip("netns", "add", ns)
            _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
            _ip("link", "set", outside, "master", self._bridge, "up")
            _ip("link", "set", inside, "netns", ns)
            _ip("-n", ns, "addr", "add", f"{self.addresses[host]}/{self._prefixlen}",
                "dev", inside)
            _ip("-n", ns, "link", "set", inside, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            os.makedirs(f"/etc/netns/{ns}", exist_ok=True)
            with open(f"/etc/netns/{ns}/hosts", "w") as f:
                f.write(f"127.0.0.1\tlocalhost\n{lines}")

    def popen(self, host: str, argv: list[str], **kwargs) -> subprocess.Popen:
        """Starts `argv` on `host` (`ip netns exec`: the process keeps its pid)."""
        proc = subprocess.Popen(["ip", "netns", "exec", self.namespaces[host], *argv],
                                **kwargs)
        self._procs.append(proc)
        return proc

    def track(self, proc):
        """Counts `proc` (started on one of these hosts another way, e.g. forked into its
        namespace with `enter`) among the processes `close()` kills; returns it."""
        self._procs.append(proc)
        return proc

    def run(self, host: str, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
        """Runs `argv` on `host` to the end."""
        return subprocess.run(["ip", "netns", "exec", self.namespaces[host], *argv], **kwargs)

    def partition(self, host: str) -> None:
        """Cuts `host` off: its bridge port goes down, frames are dropped, no RST is sent."""
        _ip("link", "set", f"{self.namespaces[host]}o", "down")

    def heal(self, host: str) -> None:
        """Puts `host` back on the bridge after `partition`."""
        _ip("link", "set", f"{self.namespaces[host]}o", "up")

    def pids(self, host: str) -> list[int]:
        """The pids of the processes running on `host` now (`ip netns pids`)."""
        return [int(p) for p in _ip("netns", "pids", self.namespaces[host],
                                    check=False).stdout.split()]

    def hosts_file(self, host: str) -> str:
        """The hosts file `host`'s processes resolve names with (edit it to break a name)."""
        return f"/etc/netns/{self.namespaces[host]}/hosts"

    def close(self) -> None:
        """Kills what still runs in the namespaces and removes every namespace, link and file."""
        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for ns in self.namespaces.values():
            pids = _ip("netns", "pids", ns, check=False).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
        for ns in self.namespaces.values():
            deadline = time.monotonic() + 5
            while _ip("netns", "pids", ns, check=False).stdout.split() and \
                    time.monotonic() < deadline:
                time.sleep(0.05)
            _ip("link", "del", f"{ns}o", check=False)  # its peer inside goes with it
            _ip("netns", "del", ns, check=False)
            shutil.rmtree(f"/etc/netns/{ns}", ignore_errors=True)
        if self._bridge:
            _ip("link", "del", self._bridge, check=False)

    def __enter__(self) -> "Hosts":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
