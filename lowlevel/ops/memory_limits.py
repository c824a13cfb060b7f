"""A memory limit per task: each of the launcher's tasks in a memory cgroup of its own.

A run that might not fit (a 100 M-row embedding table, a ps restarted while the old one's
pages are still being freed) must not take the machine with it: without a limit the
kernel's OOM killer picks the largest process on the machine, which may be another
task's, the test runner or the user's shell. With `python -m lowlevel.launch
--memory=ps=12Gi,worker=4Gi` each task runs in a cgroup of its own under the launcher's
(`<launcher's memory cgroup>/lowlevel-launch-<pid>/<task>`), with that limit: a task that
outgrows it is killed (SIGKILL) alone, and the launcher says so in one line, with the
task's peak ("ps0 was killed by SIGKILL: out of memory at its limit of 600 MiB
(--memory), peak 600 MiB"). A restarted task goes back into its cgroup. When the run
ends the launcher prints each task's peak against its limit and removes the cgroups.

cgroup v1 (the `memory` hierarchy; preferred where both are mounted, as
`resources.memory_limit` reads them): `memory.limit_in_bytes`, and
`memory.memsw.limit_in_bytes` where swap is accounted (so a task cannot swap past
it); the kill count is `memory.oom_control`'s `oom_kill` (Linux 4.13+), the peak
`memory.max_usage_in_bytes`. cgroup v2: `memory.max` and `memory.swap.max` = 0,
`memory.events`' `oom_kill`, `memory.peak` (Linux 5.19+); v2 lets a cgroup that has
processes give no controller to its children, so the launcher must run in a delegated
cgroup of its own (`systemd-run --user --scope -p Delegate=yes ...`).

Making cgroups needs root or a delegated subtree; where that fails, `TaskCgroups`
raises `MemoryLimitError` saying what to do instead. Pages a forked task shares with
the launcher (TensorFlow's import, `lowlevel.ops.forking`) stay charged to the
launcher's cgroup; the limit covers what the task allocates itself. A launcher killed
by SIGKILL leaves its empty cgroups behind (`rmdir` them; they hold no process).
"""

from __future__ import annotations

import os
import time
from typing import Optional

from lowlevel.errors import UsageError
from lowlevel.ops import resources

PREFIX = "lowlevel-launch-"
RMDIR_WAIT_SECS = 5.0  # a killed task's cgroup empties once the kernel has reaped it


class MemoryLimitError(UsageError):
    """A memory limit cannot be applied here (no cgroup this process may create)."""


def gib(n: Optional[int]) -> str:
    """Bytes in words: "600 MiB", "12.0 GiB" ("?" for None)."""
    if n is None:
        return "?"
    return f"{n / 2 ** 30:.1f} GiB" if n >= 2 ** 30 else f"{n / 2 ** 20:.0f} MiB"


class TaskCgroups:
    """One memory cgroup per task, under a cgroup of the launcher's own.

    Args:
      limits: {task name: limit in bytes}; tasks not in it get no cgroup.
      root: the file system root (tests pass a fake one).

    Raises:
      MemoryLimitError: no memory cgroup hierarchy, or this process may not create
        cgroups in it (not root, no delegation).
    """

    def __init__(self, limits: dict[str, int], root: str = "/"):
        self.limits = dict(limits)
        found = resources.own_cgroup("memory", root)
        if found is None:
            raise MemoryLimitError("--memory: this machine has no memory cgroup hierarchy "
                                   "(/proc/self/cgroup); run without --memory")
        own, self.version = found
        self.base = os.path.join(own, f"{PREFIX}{os.getpid()}")
        self._oom_at_start: dict[str, int] = {}
        try:
            os.makedirs(self.base, exist_ok=True)
            if self.version == 2:
                _write(os.path.join(own, "cgroup.subtree_control"), "+memory")
                _write(os.path.join(self.base, "cgroup.subtree_control"), "+memory")
        except OSError as e:
            self._remove(self.base)
            raise MemoryLimitError(
                f"--memory: cannot make a memory cgroup under {own} ({e.strerror}): run as "
                "root, or inside a delegated cgroup (systemd-run --user --scope -p "
                "Delegate=yes python -m lowlevel.launch ...), or without --memory") from None

    def add(self, name: str, pid: Optional[int]) -> None:
        """Moves task `name`'s process `pid` into its cgroup (made, with its limit, the first
        time; `pid` None: only made); no-op for a task without a limit."""
        if name not in self.limits:
            return
        path = os.path.join(self.base, name)
        if not os.path.isdir(path):
            os.mkdir(path)
            self._set_limit(path, self.limits[name])
        self._oom_at_start[name] = self.oom_kills(name)
        if pid is not None:
            _write(os.path.join(path, "cgroup.procs"), str(pid))

    def _set_limit(self, path: str, limit: int) -> None:
        if self.version == 2:
            _write(os.path.join(path, "memory.max"), str(limit))
            _write_if_there(os.path.join(path, "memory.swap.max"), "0")
            return
        _write(os.path.join(path, "memory.limit_in_bytes"), str(limit))
        _write_if_there(os.path.join(path, "memory.memsw.limit_in_bytes"), str(limit))

    def oom_kills(self, name: str) -> int:
        """How many processes the kernel has killed in task `name`'s cgroup for its limit."""
        text = _read(os.path.join(self.base, name, "memory.events" if self.version == 2
                                  else "memory.oom_control"))
        for line in (text or "").splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def peak(self, name: str) -> Optional[int]:
        """The most memory (bytes) task `name`'s cgroup has used, or None if unknown."""
        text = _read(os.path.join(self.base, name, "memory.peak" if self.version == 2
                                  else "memory.max_usage_in_bytes"))
        return int(text) if text and text.isdigit() else None

    def ended(self, name: str) -> str:
        """Words to add to a task's end: ": out of memory at its limit of 600 MiB (--memory),
        peak 600 MiB" if its limit killed it since it was (re)started, else ""."""
        if name not in self.limits or self.oom_kills(name) <= self._oom_at_start.get(name, 0):
            return ""
        return (f": out of memory at its limit of {gib(self.limits[name])} (--memory), peak "
                f"{gib(self.peak(name))}; give it more (--memory) or spread its variables "
                "over more ps tasks (--num_ps)")

    def summary(self) -> str:
        """"ps0 1.2 GiB of 2.0 GiB, worker0 ..." : each limited task's peak and limit."""
        return ", ".join(f"{name} {gib(self.peak(name))} of {gib(limit)}"
                         for name, limit in self.limits.items()
                         if os.path.isdir(os.path.join(self.base, name)))

    def close(self) -> list[str]:
        """Removes the cgroups (waiting up to `RMDIR_WAIT_SECS` for the last processes to
        be reaped); returns those it could not remove."""
        left = []
        for name in self.limits:
            path = os.path.join(self.base, name)
            if os.path.isdir(path) and not self._remove(path):
                left.append(path)
        if not left and not self._remove(self.base):
            left.append(self.base)
        return left

    @staticmethod
    def _remove(path: str) -> bool:
        deadline = time.monotonic() + RMDIR_WAIT_SECS
        while True:
            try:
                os.rmdir(path)
                return True
            except FileNotFoundError:
                return True
            except OSError:
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.1)


def limits_for(tasks, value: Optional[str], minimum: int = 0) -> dict[str, int]:
    """{task name: bytes} from `--memory` ("4Gi" for every task, or "ps=12Gi,worker=4Gi,
    evaluator=2Gi"; "chief" is worker0, the launcher's chief); {} without a value.

    Raises:
      UsageError: a malformed value or a quantity below `minimum` bytes.
    """
    try:
        per_role = resources.per_role(value, "memory", ("ps", "worker", "chief", "evaluator"))
    except resources.QuantityError as e:
        raise UsageError(str(e)) from None
    out = {}
    for name in tasks:
        role = "chief" if name == "worker0" and "chief" in per_role else name.rstrip("0123456789")
        if role in per_role:
            try:
                out[name] = resources.memory_quantity(per_role[role], minimum)
            except resources.QuantityError as e:
                raise UsageError(f"--memory: {e}") from None
    return out


def _read(path: str) -> Optional[str]:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _write_if_there(path: str, text: str) -> None:
    if os.path.exists(path):
        _write(path, text)
