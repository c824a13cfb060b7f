"""A memory cgroup around one benchmark run: a trainer that does not fit fails alone.

The sparse suite at 100 M rows runs trainers that may need more memory than the machine
has (the textbook trainer and TF2's `ParameterServerStrategy` initialise whole tables
and keep copies of them, issue 27). Without a limit the kernel's OOM killer picks the
largest process on the machine, which may be the suite's or CI's. `limited(bytes)` makes a
memory cgroup (`lowlevel.ops.memory_limits.TaskCgroups`, cgroup v1 or a delegated v2)
that every process `_runners.Procs.start` starts during the block joins before it
execs (`join_argv`); their children inherit it, so the run's tasks together get the limit
and the kernel kills within them. This process stays out of it: the OOM killer chooses by
resident size, not by cgroup charge, and would pick a harness that holds TensorFlow (it did,
in a test). Once the kernel has killed a process for the limit, the run cannot finish (the
textbook trainer's workers wait for their dead ps forever): the rest of the cgroup's
processes get SIGKILL at once, and the runner reports the run's end. After the block
the cgroup is removed; `Box` says whether the limit killed anything and the cgroup's
peak (bytes, page cache included).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import threading
from typing import Optional

from lowlevel.ops import memory_limits


def default_limit_bytes(share: float = 0.85) -> int:
    """`share` of the machine's memory (/proc/meminfo MemTotal), bytes."""
    with open("/proc/meminfo") as f:
        total_kib = next(int(line.split()[1]) for line in f if line.startswith("MemTotal:"))
    return int(total_kib * 1024 * share)


@dataclasses.dataclass
class Box:
    """What a `limited` block's cgroup saw (all None without a limit)."""

    limit_bytes: Optional[int] = None
    peak_bytes: Optional[int] = None  # the cgroup's most memory used, page cache included
    oom_kills: Optional[int] = None  # processes the kernel killed for the limit
    cgroup: Optional[str] = None  # the cgroup's directory (removed when the block ends)

    def words(self) -> str:
        """"did not fit in 20.5 GiB: out of memory (2 killed), peak 20.5 GiB", or ""."""
        if not self.oom_kills:
            return ""
        return (f"did not fit in {memory_limits.gib(self.limit_bytes)}: out of memory "
                f"({self.oom_kills} killed), peak {memory_limits.gib(self.peak_bytes)}")


JOIN = {"procs": None}  # cgroup.procs of the `limited` block under way, else None


def join_argv(argv: list) -> list:
    """`argv` run so that it first joins the `limited` block's cgroup (unchanged outside one)."""
    procs = JOIN["procs"]
    if procs is None:
        return list(argv)
    return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', procs, *argv]


@contextlib.contextmanager
def limited(limit_bytes: Optional[int]):
    """Runs the block with every process `_runners` starts in a cgroup of `limit_bytes`;
    yields a `Box`, filled when the block ends.

    `limit_bytes` None or 0: no limit. Raises `memory_limits.MemoryLimitError` if no
    cgroup can be made here (not root, no delegation).
    """
    box = Box()
    if not limit_bytes:
        yield box
        return
    groups = memory_limits.TaskCgroups({"run": limit_bytes})
    box.limit_bytes, box.cgroup = limit_bytes, groups.base
    groups.add("run", None)
    JOIN["procs"] = os.path.join(groups.base, "run", "cgroup.procs")
    done = threading.Event()
    watcher = threading.Thread(target=_end_on_oom, args=(groups, JOIN["procs"], done),
                               daemon=True)
    watcher.start()
    try:
        yield box
    finally:
        JOIN["procs"] = None
        done.set()
        watcher.join()
        box.peak_bytes, box.oom_kills = groups.peak("run"), groups.oom_kills("run")
        groups.close()


def _end_on_oom(groups, procs_path: str, done: threading.Event, poll_secs: float = 0.5):
    """Until `done`: once the run's cgroup has an OOM kill, SIGKILL every process in it
    (all started by this harness: `join_argv`), by PID."""
    while not done.wait(poll_secs):
        if not groups.oom_kills("run"):
            continue
        try:
            with open(procs_path) as f:
                pids = [int(line) for line in f if line.strip()]
        except OSError:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
