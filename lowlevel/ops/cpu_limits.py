"""A CPU limit per task: each of the launcher's tasks in a CPU cgroup of its own.

`python -m lowlevel.launch --cpu=500m` (or per role: `--cpu=ps=250m,worker=1`) runs
each task in a cgroup of its own with a CFS quota of that many CPUs, as a pod with
`resources.limits.cpu` runs on Kubernetes: a task gets at most its limit, whatever the
others do, and a task that joins a running job (`--dynamic_workers`) brings its own
limit instead of taking from the others'. So a localhost cluster behaves as one whose
tasks each have their own machine of that size, on a machine with at least their sum of
cores (the launcher warns when the limits add up to more). Each task sizes its
TensorFlow thread pools from its quota (`resources.cpu_figure`: "cgroup quota").

cgroup v1 (the `cpu` hierarchy): `cpu.cfs_quota_us` = CPUs x `cpu.cfs_period_us`
(100,000 us); v2: `cpu.max` "QUOTA 100000". At the end the launcher prints each task's
CPU time and the time the quota held it back (`cpuacct.usage` / `cpu.stat`'s
`throttled_time`; v2 `cpu.stat`'s `usage_usec`, `throttled_usec`). Where cgroups cannot
be made, `TaskCgroups` raises `CpuLimitError` saying what to do
(`task_cgroups` has the rest: where the cgroups are, what making them needs).
"""

from __future__ import annotations

import os
import re
from decimal import Decimal
from typing import Optional

from lowlevel.errors import UsageError
from lowlevel.ops import resources, task_cgroups
from lowlevel.ops.task_cgroups import write

PERIOD_US = 100_000  # the CFS period: the kernel's default (cgroup v1 and v2)
PS_HELD_BACK_SHARE = 0.5  # a ps held back in more of its periods: the launcher warns


class CpuLimitError(UsageError):
    """A CPU limit cannot be applied here (no cgroup this process may create)."""


class TaskCgroups(task_cgroups.TaskCgroupsBase):
    """One CPU cgroup per task, under a cgroup of the launcher's own.

    Args:
      limits: {task name: CPUs (`Decimal`, millicore precision)}; tasks not in it get no
        cgroup.
      root: the file system root (tests pass a fake one).

    Raises:
      CpuLimitError: no cpu cgroup hierarchy, or this process may not create cgroups in
        it (not root, no delegation).
    """

    CONTROLLER, FLAG, ERROR = "cpu", "--cpu", CpuLimitError

    def _set_limit(self, path: str, limit: Decimal) -> None:
        quota = int(limit * PERIOD_US)
        if self.version == 2:
            write(os.path.join(path, "cpu.max"), f"{quota} {PERIOD_US}")
            return
        write(os.path.join(path, "cpu.cfs_period_us"), str(PERIOD_US))
        write(os.path.join(path, "cpu.cfs_quota_us"), str(quota))

    def used(self, name: str) -> dict:
        """Task `name`'s cgroup's counts since it was made (`cpu.stat`): "periods" (CFS
        periods in which it ran under its quota: none without one), "throttled_periods"
        (those in which the quota stopped it), "throttled_secs" (how long it was held
        back), and "cpu_secs" where the kernel counts CPU time in the same cgroup (cgroup
        v2, or v1 with cpu and cpuacct mounted together); a count it does not give: None."""
        stat = dict(line.split(" ", 1) for line in
                    (self.read(name, "cpu.stat") or "").splitlines() if " " in line)
        count = lambda key, scale=None: (  # noqa: E731
            (int(stat[key]) if scale is None else int(stat[key]) / scale)
            if stat.get(key, "").isdigit() else None)
        usage = self.read(name, "cpuacct.usage") if self.version == 1 else None
        return {"periods": count("nr_periods"), "throttled_periods": count("nr_throttled"),
                "throttled_secs": (count("throttled_usec", 1e6) if self.version == 2
                                   else count("throttled_time", 1e9)),
                "cpu_secs": (count("usage_usec", 1e6) if self.version == 2 else
                             int(usage) / 1e9 if usage and usage.isdigit() else None)}

    def summary(self) -> str:
        """"ps0 12.3 CPU-s, held back 0.4 s in 5 of 120 periods at 500m, ...": each
        limited task's use of its quota (`parse_summary` reads it back)."""
        parts = []
        for name, limit in self.limits.items():
            if not os.path.isdir(os.path.join(self.base, name)):
                continue
            used = self.used(name)
            cpu = f"{used['cpu_secs']:.1f} CPU-s, " if used["cpu_secs"] is not None else ""
            held = (f"{used['throttled_secs']:.1f}" if used["throttled_secs"] is not None
                    else "?")
            parts.append(f"{name} {cpu}held back {held} s in {used['throttled_periods']} of "
                         f"{used['periods']} periods at {quantity(limit)}")
        return ", ".join(parts)


def parse_summary(text: str) -> dict[str, dict]:
    """The tasks' figures in the last `TaskCgroups.summary` line of `text` (a launcher's
    output): {task: {"cpu_secs" (None where not counted), "held_back_secs" (None where
    not counted), "throttled_periods", "periods", "limit" (CPUs, `Decimal`)}}; {} where
    `text` has no such line."""
    lines = [line for line in text.splitlines() if " periods at " in line]
    if not lines:
        return {}
    return {m["task"]: {"cpu_secs": float(m["cpu"]) if m["cpu"] else None,
                        "held_back_secs": None if m["held"] == "?" else float(m["held"]),
                        "throttled_periods": int(m["throttled"]), "periods": int(m["periods"]),
                        "limit": resources.cpu_quantity(m["limit"])}
            for m in _SUMMARY_PART.finditer(lines[-1])}


_SUMMARY_PART = re.compile(r"(?P<task>[a-z]+\d+) (?:(?P<cpu>[\d.]+) CPU-s, )?held back "
                           r"(?P<held>[\d.]+|\?) s in (?P<throttled>\d+) of (?P<periods>\d+) "
                           r"periods at (?P<limit>[\d.]+m?)")


def ps_held_back(used: dict[str, dict], share: float = PS_HELD_BACK_SHARE) -> dict[str, float]:
    """{ps task: share of its CFS periods in which its quota stopped it} for the ps tasks of
    `used` ({task: `TaskCgroups.used` or `parse_summary` figures}) held back in more than
    `share` of them: a ps whose limit the workers' steps may wait for.

    A ps works in bursts (a push, a step's reads): held back in most periods, a burst
    that arrives after its quota is spent waits for the next period (up to
    `PERIOD_US`), and the steps that need it with it. Measured (sync wide_deep, 2 ps, 2 or
    3 workers at 300m, the data queue on ps0; benchmarks/NOTES.md, thirtieth stop): ps0 at
    400m was held back in 79-87 % of its periods, at 500m in 6-7 % with 2 workers and
    43-47 % with 3; with 3 workers 15.8 and 25.0 steps/s at 400m, 28.3 and 27.0 at 500m.
    A worker held back in most periods is computing: not listed."""
    return {name: held for name, held in held_back_shares(used).items()
            if name.startswith("ps") and held > share}


def held_back_shares(used: dict[str, dict]) -> dict[str, float]:
    """{task: share of its CFS periods in which its quota stopped it, to 3 places} of
    `used` ({task: `TaskCgroups.used` or `parse_summary` figures}), for the tasks that ran
    under their quota in at least one period and whose throttled periods are counted."""
    return {name: round(u["throttled_periods"] / u["periods"], 3)
            for name, u in used.items()
            if u.get("periods") and u.get("throttled_periods") is not None}


def quantity(cpus: Decimal) -> str:
    """CPUs as Kubernetes writes them: "250m", "1", "1500m"."""
    return str(int(cpus)) if cpus == int(cpus) else f"{int(cpus * 1000)}m"


def limits_for(tasks, value: Optional[str]) -> dict[str, Decimal]:
    """{task name: CPUs} from `--cpu` ("500m" for every task, or "ps=250m,worker=1,
    evaluator=500m"; "chief" is worker0, the launcher's chief); {} without a value.

    Raises:
      UsageError: a malformed value, or one not above 0 CPUs.
    """
    try:
        return task_cgroups.limits_for(tasks, value, "--cpu", resources.cpu_quantity)
    except resources.QuantityError as e:
        raise UsageError(str(e)) from None
