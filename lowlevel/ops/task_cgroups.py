"""A cgroup of its own for each of the launcher's tasks: what `--memory` and `--cpu` share.

Each task's cgroup is `<the launcher's cgroup for the controller>/lowlevel-launch-<pid>/
<task>` (cgroup v1: in that controller's hierarchy; v2: the unified one, the controller
enabled for the children with `cgroup.subtree_control`). A task is moved in as it starts
and again at every restart; a worker that joins a running job gets its role's limit
(a worker's, else the chief's). When the run ends the launcher removes the cgroups.

Making cgroups needs root or a delegated subtree (cgroup v2 lets a cgroup that has
processes give no controller to its children, so there the launcher must run in a
delegated cgroup of its own: `systemd-run --user --scope -p Delegate=yes ...`). A
launcher killed by SIGKILL leaves its empty cgroups behind (`rmdir` them).
The limits themselves are the subclasses': `memory_limits.TaskCgroups`,
`cpu_limits.TaskCgroups`.
"""

from __future__ import annotations

import os
import time
from typing import Optional

from lowlevel.ops import resources

PREFIX = "lowlevel-launch-"
RMDIR_WAIT_SECS = 5.0  # a killed task's cgroup empties once the kernel has reaped it
CHIEF = "worker0"  # the launcher's clusters have no chief job: worker 0 is the chief


class TaskCgroupsBase:
    """One cgroup per task for `CONTROLLER`, under a cgroup of the launcher's own.

    Args:
      limits: {task name: limit, in the subclass's unit}; tasks not in it get no cgroup.
      root: the file system root (tests pass a fake one).

    Raises:
      `ERROR`: no hierarchy for the controller, or this process may not create cgroups
        in it (not root, no delegation).
    """

    CONTROLLER = ""  # "memory", "cpu"
    FLAG = ""  # the launcher's flag, for messages
    ERROR: type = OSError

    def __init__(self, limits: dict, root: str = "/"):
        self.limits = dict(limits)
        found = resources.own_cgroup(self.CONTROLLER, root)
        if found is None:
            raise self.ERROR(f"{self.FLAG}: this machine has no {self.CONTROLLER} cgroup "
                             f"hierarchy (/proc/self/cgroup); run without {self.FLAG}")
        own, self.version = found
        own = os.path.join(root, own.lstrip("/"))  # own_cgroup's paths are within `root`
        self.base = os.path.join(own, f"{PREFIX}{os.getpid()}")
        try:
            os.makedirs(self.base, exist_ok=True)
            if self.version == 2:
                write(os.path.join(own, "cgroup.subtree_control"), f"+{self.CONTROLLER}")
                write(os.path.join(self.base, "cgroup.subtree_control"), f"+{self.CONTROLLER}")
        except OSError as e:
            self._remove(self.base)
            raise self.ERROR(
                f"{self.FLAG}: cannot make a {self.CONTROLLER} cgroup under {own} "
                f"({e.strerror}): run as root, or inside a delegated cgroup (systemd-run "
                f"--user --scope -p Delegate=yes python -m lowlevel.launch ...), or without "
                f"{self.FLAG}") from None

    def _set_limit(self, path: str, limit) -> None:
        raise NotImplementedError

    def _on_start(self, name: str) -> None:
        """Called as task `name` (re)starts, before its process is moved in."""

    def add(self, name: str, pid: Optional[int]) -> None:
        """Moves task `name`'s process `pid` into its cgroup (made, with its limit, the first
        time; `pid` None: only made); no-op for a task without a limit."""
        if name not in self.limits:
            return
        path = os.path.join(self.base, name)
        if not os.path.isdir(path):
            os.mkdir(path)
            self._set_limit(path, self.limits[name])
        self._on_start(name)
        if pid is not None:
            write(os.path.join(path, "cgroup.procs"), str(pid))

    def inherit(self, name: str) -> None:
        """Gives a task new to the job (a worker that joins) its role's limit: a worker's,
        else the chief's; no-op if it has one, or its role has none."""
        if name in self.limits:
            return
        role = name.rstrip("0123456789")
        same = sorted((n != CHIEF, n) for n in self.limits if n.rstrip("0123456789") == role)
        if same:
            self.limits[name] = self.limits[same[-1][1]]

    def read(self, name: str, file: str) -> Optional[str]:
        """The text of `file` in task `name`'s cgroup, or None."""
        return read(os.path.join(self.base, name, file))

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


def limits_for(tasks, value: Optional[str], flag: str, parse) -> dict:
    """{task name: parse(quantity)} from a per-role flag ("4Gi" for every task, or
    "ps=12Gi,worker=4Gi,evaluator=2Gi"; "chief" is worker0, the launcher's chief); {}
    without a value.

    Raises:
      resources.QuantityError: a malformed value (naming the flag), or one `parse` refuses.
    """
    per_role = resources.per_role(value, flag.lstrip("-"), ("ps", "worker", "chief",
                                                            "evaluator"))
    out = {}
    for name in tasks:
        role = "chief" if name == CHIEF and "chief" in per_role else name.rstrip("0123456789")
        if role in per_role:
            try:
                out[name] = parse(per_role[role])
            except resources.QuantityError as e:
                raise resources.QuantityError(f"{flag}: {e}") from None
    return out


def read(path: str) -> Optional[str]:
    """The stripped text of a cgroup file, or None if it cannot be read."""
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def write(path: str, text: str) -> None:
    """Writes `text` to a cgroup file (OSError: the kernel refused it)."""
    with open(path, "w") as f:
        f.write(text)


def write_if_there(path: str, text: str) -> None:
    """`write`, for a file the kernel may not have (`memory.memsw.*` without swap accounting)."""
    if os.path.exists(path):
        write(path, text)
