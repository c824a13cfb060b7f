"""What a task may use: its CPUs and memory as its cgroup says, and Kubernetes quantities.

A task sizes its TensorFlow thread pools from `cpu_figure()`, not from the
machine's core count: in a pod limited to 2 CPUs on a 64-core node,
`os.cpu_count()` is 64, and 64-thread pools on a 2-CPU quota spend their time
throttled. The figure is, in order:

1. the CPU quota of the task's cgroup and of every cgroup above it, the
   smallest (cgroup v2 `cpu.max`: "QUOTA PERIOD" or "max PERIOD"; cgroup v1
   `cpu.cfs_quota_us` / `cpu.cfs_period_us`, -1 for none): what a container's
   CPU limit sets;
2. else the pod's CPU request, when the manifests pass it in
   `LOWLEVEL_CPU_REQUEST` (millicores, from the downward API's
   `resourceFieldRef: requests.cpu` with divisor 1m): a pod with a request and
   no limit may burst, but the request is what it is promised;
3. the CPUs of the affinity mask (`taskset`, cpusets), when fewer;
4. the machine's cores.

A fractional quota rounds down (1.5 CPUs: 1 thread per pool), never below 1.
`memory_limit()` reads the memory limit the same way (v2 `memory.max`, v1
`memory.limit_in_bytes`). Nothing here imports TensorFlow.

`cpu_quantity` and `memory_quantity` check Kubernetes resource quantities
(`500m`, `2`, `4Gi`, `1.5G`) as the API server would, so that the manifest
generator refuses `--memory=2GB` in one line instead of printing a manifest
the API server rejects.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from decimal import Decimal, InvalidOperation
from typing import Mapping, Optional

CPU_REQUEST_ENV = "LOWLEVEL_CPU_REQUEST"  # millicores, from the downward API
# cgroup v1 reports "no limit" as a page-rounded LONG_MAX; anything above this is none.
_NO_MEMORY_LIMIT = 1 << 62


def _read(root: str, path: str) -> Optional[str]:
    try:
        with open(os.path.join(root, path.lstrip("/"))) as f:
            return f.read().strip()
    except OSError:
        return None


def _mounts(root: str) -> list[tuple[str, str, str, set]]:
    """(mount root, mount point, fstype, super options) of every cgroup mount."""
    out = []
    for line in (_read(root, "/proc/self/mountinfo") or "").splitlines():
        left, sep, right = line.partition(" - ")
        fields, rest = left.split(), right.split()
        if not sep or len(fields) < 5 or len(rest) < 3 or not rest[0].startswith("cgroup"):
            continue
        out.append((fields[3], fields[4], rest[0], set(rest[2].split(","))))
    return out


def _cgroup_dirs(root: str, controller: str) -> list[tuple[str, int]]:
    """The directories of this process's cgroup for `controller` and of every cgroup above
    it up to the mount point, innermost first, with the cgroup version (1 or 2).

    cgroup v1 (a hierarchy that has `controller`) is preferred where both are mounted
    (hybrid layout): that is the one whose limits apply.
    """
    lines = (_read(root, "/proc/self/cgroup") or "").splitlines()
    paths_v1, path_v2 = {}, None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hid, controllers, path = parts
        if hid == "0" and controllers == "":
            path_v2 = path
        for c in controllers.split(","):
            paths_v1[c] = path
    mounts = _mounts(root)
    candidates = []
    for mount_root, point, fstype, options in mounts:
        if fstype == "cgroup" and controller in options and controller in paths_v1:
            candidates.append((mount_root, point, paths_v1[controller], 1))
    if not candidates:
        candidates = [(mount_root, point, path_v2, 2) for mount_root, point, fstype, _ in mounts
                      if fstype == "cgroup2" and path_v2 is not None]
    for mount_root, point, path, version in candidates:
        # Without a cgroup namespace /proc/self/cgroup shows the full path, and a
        # container's mount root is its own cgroup: the part below the root is ours.
        if mount_root != "/" and (path == mount_root or path.startswith(mount_root + "/")):
            path = path[len(mount_root):]
        elif mount_root != "/":
            path = "/"
        dirs = []
        rel = path.strip("/")
        while True:
            dirs.append((os.path.join(point, rel) if rel else point, version))
            if not rel:
                break
            rel = os.path.dirname(rel)
        return dirs
    return []


def cpu_quota(root: str = "/") -> Optional[tuple[float, str]]:
    """(CPUs, where) of the smallest CPU quota on this process's cgroup path, or None."""
    best = None
    for directory, version in _cgroup_dirs(root, "cpu"):
        if version == 2:
            text = _read(root, os.path.join(directory, "cpu.max"))
            parts = (text or "").split()
            if len(parts) != 2 or parts[0] == "max":
                continue
            quota, period, name = parts[0], parts[1], "cpu.max"
        else:
            quota = _read(root, os.path.join(directory, "cpu.cfs_quota_us"))
            period = _read(root, os.path.join(directory, "cpu.cfs_period_us"))
            name = "cpu.cfs_quota_us"
        try:
            cpus = int(quota) / int(period)
        except (TypeError, ValueError, ZeroDivisionError):
            continue
        if cpus <= 0:  # v1's -1: no quota
            continue
        if best is None or cpus < best[0]:
            best = (cpus, f"cgroup v{version} {name} {quota}/{period} in {directory}")
    return best


def own_cgroup(controller: str, root: str = "/") -> Optional[tuple[str, int]]:
    """(directory, cgroup version) of this process's cgroup for `controller`, or None."""
    dirs = _cgroup_dirs(root, controller)
    return dirs[0] if dirs else None


def memory_limit(root: str = "/") -> Optional[int]:
    """The smallest memory limit (bytes) on this process's cgroup path, or None."""
    best = None
    for directory, version in _cgroup_dirs(root, "memory"):
        name = "memory.max" if version == 2 else "memory.limit_in_bytes"
        text = _read(root, os.path.join(directory, name))
        try:
            limit = int(text)
        except (TypeError, ValueError):
            continue
        if 0 < limit < _NO_MEMORY_LIMIT and (best is None or limit < best):
            best = limit
    return best


@dataclasses.dataclass(frozen=True)
class CpuFigure:
    """The CPUs a task sizes its thread pools from, and where the figure came from.

    Attributes:
      cpus: whole CPUs, at least 1.
      source: "cgroup quota", "cpu request", "affinity" or "cores".
      detail: the file or value it was read from.
      quota, request: CPUs of the cgroup quota and of LOWLEVEL_CPU_REQUEST (None if
        absent); affinity, cores: CPUs of the affinity mask and of the machine.
    """

    cpus: int
    source: str
    detail: str
    quota: Optional[float]
    request: Optional[float]
    affinity: int
    cores: int

    def describe(self) -> str:
        """"2 CPUs (cgroup quota: cgroup v1 cpu.cfs_quota_us 200000/100000 in ...; 8 cores
        on the machine, 8 in the affinity mask)"."""
        return (f"{self.cpus} CPU{'s' if self.cpus != 1 else ''} ({self.source}: "
                f"{self.detail}; {self.cores} cores on the machine, {self.affinity} in the "
                "affinity mask)")


def _affinity() -> int:
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def cpu_figure(root: str = "/", environ: Optional[Mapping[str, str]] = None,
               affinity: Optional[int] = None, cores: Optional[int] = None) -> CpuFigure:
    """The CPUs this task may use (see the module docstring for the order)."""
    environ = os.environ if environ is None else environ
    cores = cores or os.cpu_count() or 1
    affinity = affinity or _affinity()
    quota = cpu_quota(root)
    request = None
    raw = environ.get(CPU_REQUEST_ENV, "").strip()
    if raw:
        try:
            request = int(raw) / 1000 if int(raw) > 0 else None
        except ValueError:
            request = None
    if quota is not None:
        cpus, source, detail = quota[0], "cgroup quota", quota[1]
    elif request is not None:
        cpus, source, detail = request, "cpu request", f"{CPU_REQUEST_ENV}={raw} millicores"
    else:
        cpus, source, detail = cores, "cores", f"os.cpu_count() = {cores}"
    if affinity < cpus:
        cpus, source, detail = affinity, "affinity", f"sched_getaffinity: {affinity} CPUs"
    return CpuFigure(max(1, math.floor(cpus)), source, detail,
                     quota[0] if quota else None, request, affinity, cores)


_cached: Optional[CpuFigure] = None


def cpus() -> int:
    """This process's CPU figure (`cpu_figure()`), read once."""
    global _cached
    if _cached is None:
        _cached = cpu_figure()
    return _cached.cpus


def figure() -> CpuFigure:
    """This process's `CpuFigure`, read once (the one `cpus()` returns)."""
    cpus()
    return _cached


# Kubernetes resource quantities (k8s.io/apimachinery/pkg/api/resource):
#   <quantity> ::= <signedNumber><suffix>; suffix: binary SI (Ki Mi Gi Ti Pi Ei),
#   decimal SI (n u m "" k M G T P E) or a decimal exponent (e3, E-2).
_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|"
                       r"[eE][+-]?\d+)?$")
_SCALE = {None: 1, "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"),
          "k": Decimal(10) ** 3, "M": Decimal(10) ** 6, "G": Decimal(10) ** 9,
          "T": Decimal(10) ** 12, "P": Decimal(10) ** 15, "E": Decimal(10) ** 18,
          "Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40, "Pi": 2 ** 50,
          "Ei": 2 ** 60}


class QuantityError(ValueError):
    """Not a Kubernetes quantity, or out of range; the message says what is expected."""


def quantity(text: str) -> Decimal:
    """The value of Kubernetes quantity `text` ("500m" -> 0.5, "2Gi" -> 2147483648).

    Raises:
      QuantityError: `text` is not a quantity.
    """
    m = _QUANTITY.match(text.strip()) if isinstance(text, str) else None
    if not m:
        raise QuantityError(f"{text!r} is not a Kubernetes quantity")
    number, suffix = m.groups()
    try:
        value = Decimal(number)
        if suffix and suffix[0] in "eE" and len(suffix) > 1:
            return value * Decimal(10) ** int(suffix[1:])
        return value * _SCALE[suffix]
    except (InvalidOperation, KeyError, ValueError):
        raise QuantityError(f"{text!r} is not a Kubernetes quantity") from None


def cpu_quantity(text: str) -> Decimal:
    """CPUs of a CPU quantity ("500m", "2", "1.5"): more than 0, at most millicore precision.

    Raises:
      QuantityError: naming what is expected.
    """
    try:
        value = quantity(text)
    except QuantityError:
        raise QuantityError(f"{text!r} is not a CPU quantity: expected CPUs such as 2, 0.5 "
                            "or 500m") from None
    if value <= 0:
        raise QuantityError(f"{text!r}: expected more than 0 CPUs (e.g. 500m or 2)")
    if value * 1000 != (value * 1000).to_integral_value():
        raise QuantityError(f"{text!r}: CPUs go down to millicores (1m) only")
    return value


def memory_quantity(text: str, minimum: int = 0) -> int:
    """Bytes of a memory quantity ("4Gi", "512Mi", "1.5G"): a whole number of bytes >= `minimum`.

    Raises:
      QuantityError: naming what is expected.
    """
    try:
        value = quantity(text)
    except QuantityError:
        raise QuantityError(f"{text!r} is not a memory quantity: expected bytes with a "
                            "Kubernetes suffix such as 512Mi, 4Gi or 2G (not 2GB)") from None
    if value != value.to_integral_value() or value <= 0:
        raise QuantityError(f"{text!r}: expected a whole number of bytes > 0 (e.g. 4Gi)")
    if value < minimum:
        raise QuantityError(f"{text!r} is {int(value) / 2 ** 20:.0f} MiB: a task needs at "
                            f"least {minimum // 2 ** 20} MiB (TensorFlow alone takes ~500)")
    return int(value)


def per_role(value: Optional[str], flag: str, roles) -> dict[str, str]:
    """A per-role flag's values: "2" -> every role in `roles` 2; "ps=1,worker=4" -> those
    roles; "" or None -> {}.

    Raises:
      QuantityError: a part that is not role=value with a role in `roles`.
    """
    if not value:
        return {}
    if "=" not in value:
        return {role: value for role in roles}
    out = {}
    for part in value.split(","):
        role, sep, amount = part.partition("=")
        if not sep or role not in roles or not amount:
            raise QuantityError(f"--{flag}={value}: expected one value (e.g. 2) or role=value "
                                f"pairs with roles {', '.join(roles)} (e.g. ps=1,worker=4)")
        out[role] = amount
    return out
