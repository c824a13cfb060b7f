"""Watching benchmark processes from outside: peak memory, bytes on the wire, exits.

Nothing here imports TensorFlow or knows a trainer; `Watcher` is told which processes
are ps tasks and which are workers (and may be told more as they appear).

- Peak RSS: `VmHWM` (the kernel's high-water mark of resident memory, kB) read from
  `/proc/PID/status` every `interval` seconds; the largest value seen before the
  process went away is its peak (reported in MiB).
- Bytes: the kernel's TCP counters of every established loopback connection between
  a worker process and a ps process (`ss -tieH`: `bytes_acked` = bytes this socket
  sent that the peer acknowledged, `bytes_received`), read every `interval` seconds.
  A socket is a worker's if its inode is among the worker's open fds; its peer is a
  ps's if the peer port is a port a ps process listens on or has a socket on. Both
  directions count, whichever side opened the connection: TensorFlow's ps *pulls* the
  gradients from the worker (RecvTensor over a connection the ps opened to the worker's
  server), while the worker pulls the variables over its own connection to the ps.
- Exits: the first time a process is seen gone (or a zombie), Unix seconds.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from typing import Optional

import psutil

_INODE = re.compile(r"\bino:(\d+)")
_ACKED = re.compile(r"\bbytes_acked:(\d+)")
_RECEIVED = re.compile(r"\bbytes_received:(\d+)")


def _port(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def tcp_sockets(ports) -> list[dict]:
    """Established TCP sockets with a local or remote port in `ports`.

    Returns:
      [{"inode", "lport", "rport", "sent" (bytes_acked), "received" (bytes_received)}].
    """
    ports = sorted(set(ports))
    if not ports:
        return []
    expr = ["("]
    for i, p in enumerate(ports):
        expr += (["or"] if i else []) + ["sport", "=", f":{p}", "or", "dport", "=", f":{p}"]
    expr.append(")")
    try:
        out = subprocess.run(["ss", "-tieH", "state", "established", *expr],
                             capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    sockets, current = [], None
    for line in out.splitlines():
        if not line.strip():
            continue
        if not line[0].isspace():  # a socket's first line: Recv-Q Send-Q local peer ...
            fields = line.split()
            try:
                current = {"lport": _port(fields[2]), "rport": _port(fields[3]),
                           "inode": None, "sent": 0, "received": 0}
            except (IndexError, ValueError):
                current = None
                continue
            sockets.append(current)
        target = line
        if current is not None:
            for regex, key in ((_INODE, "inode"), (_ACKED, "sent"), (_RECEIVED, "received")):
                m = regex.search(target)
                if m:
                    current[key] = int(m.group(1))
    return sockets


def socket_inodes(pid: int) -> set[int]:
    """Inodes of the sockets process `pid` has open (empty if it is gone)."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(int(link[8:-1]))
    except OSError:
        pass
    return inodes


def vm_hwm_kb(pid: int) -> Optional[int]:
    """The process's peak resident set size (VmHWM, kB), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def gone(proc: psutil.Process) -> bool:
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


class Watcher(threading.Thread):
    """Polls the registered processes every `interval` seconds until `stop()`.

    Register processes with `add(name, pid, role, ports)`; role "ps", "worker" or
    "other" (e.g. a launcher or a coordinator: memory and exit only). `ports` are the
    ports the task's server listens on.

    Attributes (read after `stop()`):
      peak_kb: {name: largest VmHWM seen, kB}.
      exit_unix: {name: Unix seconds when first seen gone}.
      samples: [(Unix seconds, {(worker name, ps name): bytes both ways so far})].
    """

    def __init__(self, interval: float = 0.25, measure_bytes: bool = True):
        super().__init__(name="watcher", daemon=True)
        self.interval = interval
        self.measure_bytes = measure_bytes
        self.procs: dict[str, psutil.Process] = {}
        self.roles: dict[str, str] = {}
        self.ports: dict[str, set] = {}
        self.peak_kb: dict[str, int] = {}
        self.exit_unix: dict[str, float] = {}
        self.samples: list = []
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self._inodes: dict[str, set] = {}

    def add(self, name: str, pid: int, role: str = "other", ports=()) -> None:
        try:
            proc = psutil.Process(pid)
        except psutil.NoSuchProcess:
            self.exit_unix.setdefault(name, time.time())
            return
        with self._lock:
            self.procs[name] = proc
            self.roles[name] = role
            self.ports[name] = set(ports)

    def names(self, role: str) -> list[str]:
        return [n for n, r in self.roles.items() if r == role]

    def all_gone(self) -> bool:
        with self._lock:
            return all(n in self.exit_unix for n in self.procs)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=10)

    def run(self) -> None:
        while not self._halt.is_set():
            t0 = time.monotonic()
            self.poll()
            self._halt.wait(max(0.0, self.interval - (time.monotonic() - t0)))
        self.poll()

    def poll(self) -> None:
        with self._lock:
            procs = dict(self.procs)
        now = time.time()
        for name, proc in procs.items():
            if name in self.exit_unix:
                continue
            if gone(proc):
                self.exit_unix[name] = now
                continue
            kb = vm_hwm_kb(proc.pid)
            if kb is not None:
                self.peak_kb[name] = max(kb, self.peak_kb.get(name, 0))
        if self.measure_bytes:
            self._sample_bytes(procs, now)

    def _sample_bytes(self, procs, now) -> None:
        ps = [n for n in procs if self.roles[n] == "ps" and n not in self.exit_unix]
        workers = [n for n in procs if self.roles[n] == "worker" and n not in self.exit_unix]
        if not ps or not workers:
            return
        ports = set().union(*(self.ports[n] for n in ps + workers))
        sockets = tcp_sockets(ports)
        for name in ps + workers:  # fds change while a process connects: refresh each time
            self._inodes[name] = socket_inodes(procs[name].pid)
        owner = {}
        for s in sockets:
            for name in ps + workers:
                if s["inode"] in self._inodes[name]:
                    owner[s["lport"]] = name
        for name in ps:
            for p in self.ports[name]:
                owner.setdefault(p, name)
        totals = {}
        for s in sockets:
            w = owner.get(s["lport"])
            p = owner.get(s["rport"])
            if w in workers and p in ps and s["inode"] in self._inodes[w]:
                totals[(w, p)] = totals.get((w, p), 0) + s["sent"] + s["received"]
        self.samples.append((now, totals))

    def bytes_in_window(self, start_unix: float, end_unix: float, workers=None):
        """Bytes moved between the given workers and each ps in the samples within the window.

        Returns:
          (seconds between the first and last sample inside [start, end],
          {ps name: bytes}), or (0, {}) with fewer than two samples inside. Only socket
          pairs present in both samples count (a connection opened or closed in between
          would otherwise count as a jump).
        """
        inside = [(t, d) for t, d in self.samples if start_unix <= t <= end_unix]
        if len(inside) < 2:
            return 0.0, {}
        (ta, a), (tb, b) = inside[0], inside[-1]
        per_ps: dict[str, int] = {}
        for key, value in b.items():
            if key in a and (workers is None or key[0] in workers):
                per_ps[key[1]] = per_ps.get(key[1], 0) + max(0, value - a[key])
        return tb - ta, per_ps


def kill_tree(procs) -> None:
    """Kills, by PID, each given psutil process and every child of theirs still running."""
    handles = []
    for p in procs:
        try:
            handles.append(p)
            handles.extend(p.children(recursive=True))
        except psutil.NoSuchProcess:
            pass
    for h in handles:
        try:
            h.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(handles, timeout=10)
