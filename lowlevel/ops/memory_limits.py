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

The cgroups themselves (where, who makes and removes them, what that needs) are
`task_cgroups`'; where they cannot be made, `TaskCgroups` raises `MemoryLimitError`
saying what to do instead. Pages a forked task shares with
the launcher (TensorFlow's import, `lowlevel.ops.forking`) stay charged to the
launcher's cgroup; the limit covers what the task allocates itself. A launcher killed
by SIGKILL leaves its empty cgroups behind (`rmdir` them; they hold no process).
"""

from __future__ import annotations

import os
from typing import Optional

from lowlevel.errors import UsageError
from lowlevel.ops import resources, task_cgroups
from lowlevel.ops.task_cgroups import PREFIX, write, write_if_there

__all__ = ["PREFIX", "MemoryLimitError", "TaskCgroups", "gib", "limits_for"]


class MemoryLimitError(UsageError):
    """A memory limit cannot be applied here (no cgroup this process may create)."""


def gib(n: Optional[int]) -> str:
    """Bytes in words: "600 MiB", "12.0 GiB" ("?" for None)."""
    if n is None:
        return "?"
    return f"{n / 2 ** 30:.1f} GiB" if n >= 2 ** 30 else f"{n / 2 ** 20:.0f} MiB"


class TaskCgroups(task_cgroups.TaskCgroupsBase):
    """One memory cgroup per task, under a cgroup of the launcher's own.

    Args:
      limits: {task name: limit in bytes}; tasks not in it get no cgroup.
      root: the file system root (tests pass a fake one).

    Raises:
      MemoryLimitError: no memory cgroup hierarchy, or this process may not create
        cgroups in it (not root, no delegation).
    """

    CONTROLLER, FLAG, ERROR = "memory", "--memory", MemoryLimitError

    def __init__(self, limits: dict[str, int], root: str = "/"):
        super().__init__(limits, root)
        self._oom_at_start: dict[str, int] = {}

    def _on_start(self, name: str) -> None:
        self._oom_at_start[name] = self.oom_kills(name)

    def _set_limit(self, path: str, limit: int) -> None:
        if self.version == 2:
            write(os.path.join(path, "memory.max"), str(limit))
            write_if_there(os.path.join(path, "memory.swap.max"), "0")
            return
        write(os.path.join(path, "memory.limit_in_bytes"), str(limit))
        write_if_there(os.path.join(path, "memory.memsw.limit_in_bytes"), str(limit))

    def oom_kills(self, name: str) -> int:
        """How many processes the kernel has killed in task `name`'s cgroup for its limit."""
        text = self.read(name, "memory.events" if self.version == 2 else "memory.oom_control")
        for line in (text or "").splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def peak(self, name: str) -> Optional[int]:
        """The most memory (bytes) task `name`'s cgroup has used, or None if unknown."""
        text = self.read(name, "memory.peak" if self.version == 2
                         else "memory.max_usage_in_bytes")
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


def limits_for(tasks, value: Optional[str], minimum: int = 0) -> dict[str, int]:
    """{task name: bytes} from `--memory` ("4Gi" for every task, or "ps=12Gi,worker=4Gi,
    evaluator=2Gi"; "chief" is worker0, the launcher's chief); {} without a value.

    Raises:
      UsageError: a malformed value or a quantity below `minimum` bytes.
    """
    try:
        return task_cgroups.limits_for(
            tasks, value, "--memory", lambda text: resources.memory_quantity(text, minimum))
    except resources.QuantityError as e:
        raise UsageError(str(e)) from None
