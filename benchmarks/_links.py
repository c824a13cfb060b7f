"""Bandwidth-limited links between the hosts of `lowlevel/testing/netns.py`: rates, shaping, counters.

A link rate is written as `tc` writes it: a number and a unit, `10gbit`, `1gbit`,
`100mbit`, `500kbit` (bits per second; `bit`, `kbit`, `mbit`, `gbit`, decimal as
in `tc`, so `1gbit` = 10^9 bit/s). `shape(hosts, host, rate)` gives `host`'s link
that rate in both directions with a token-bucket filter (`tbf`; this kernel has no
`netem`, and tbf shapes egress only, so it goes on both ends of the host's veth):

- the host's own end, inside its namespace: what the host sends;
- the bridge's end of the same veth, in this namespace: what the host receives.

Token bucket settings (`tbf_settings`): `burst` = max(64 KiB, 1 ms at the rate): at
least one 64 KiB TSO/GSO segment passes at once (tbf splits larger packets), and a
bucket of 1 ms lets the kernel's timers keep up at 10 Gbit/s on a busy machine without
passing more than 1 ms of line rate early; `limit` (the queue in bytes) = 20 ms at the
rate + the burst, a switch port's buffer (2.5 MB at 1 Gbit/s): TCP fills it and backs
off rather than losing packets at every burst, and it adds at most 20 ms of queueing.

Bytes are counted by the kernel on the bridge's end of each host's veth
(`/sys/class/net/IF/statistics/{rx,tx}_bytes`, exact, Ethernet frames: the TCP/IP
headers, ~3-4 % at 1448-byte segments, included): `rx` = what the host sent, `tx` =
what it received. `LinkWatcher` samples them with the processes' memory and exits.
"""

from __future__ import annotations

import re
import subprocess
import time
from typing import Optional

from benchmarks._measure import Watcher

_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9}
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(bit|kbit|mbit|gbit)\s*$", re.IGNORECASE)
MIN_BURST_BYTES = 64 * 1024
BURST_SECS = 0.001
QUEUE_SECS = 0.020


def parse_rate(text: str) -> int:
    """`"1gbit"` -> 1_000_000_000 (bits per second).

    Raises:
      ValueError: not a number and one of bit, kbit, mbit, gbit, or below 100 kbit/s
        (tbf's timers and TensorFlow's RPC deadlines are not meant for less).
    """
    m = _RATE.match(text)
    if not m:
        raise ValueError(f"link rate {text!r}: expected a number and a unit of "
                         f"{', '.join(_UNITS)} (as tc writes it), e.g. 1gbit or 100mbit")
    bits = round(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if bits < 100_000:
        raise ValueError(f"link rate {text!r}: expected at least 100kbit")
    return bits


def format_rate(bits: int) -> str:
    """1_000_000_000 -> "1gbit", 100_000_000 -> "100mbit" (the largest unit that is whole)."""
    for unit in ("gbit", "mbit", "kbit"):
        if bits % _UNITS[unit] == 0:
            return f"{bits // _UNITS[unit]}{unit}"
    return f"{bits}bit"


def tbf_settings(bits: int) -> dict:
    """{"rate": bits/s, "burst": bytes, "limit": bytes} of the token bucket for a link rate."""
    per_sec = bits / 8
    burst = max(MIN_BURST_BYTES, round(per_sec * BURST_SECS))
    return {"rate": bits, "burst": burst, "limit": round(per_sec * QUEUE_SECS) + burst}


def _tc(*args: str) -> None:
    proc = subprocess.run(["tc", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        why = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[0]
        raise RuntimeError(f"tc {' '.join(args)}: {why}")


def shape(hosts, host: str, bits: int) -> None:
    """Limits `host`'s link to `bits`/s each way (tbf on both ends of its veth).

    `hosts` is a `lowlevel.testing.netns.Hosts`; its veth ends are NAMESPACE+"i" (inside) and
    NAMESPACE+"o" (on the bridge). Raises RuntimeError with tc's message if tc fails.
    """
    s = tbf_settings(bits)
    spec = ["root", "tbf", "rate", f"{s['rate']}bit", "burst", str(s["burst"]),
            "limit", str(s["limit"])]
    ns = hosts.namespaces[host]
    _tc("-n", ns, "qdisc", "replace", "dev", f"{ns}i", *spec)
    _tc("qdisc", "replace", "dev", f"{ns}o", *spec)


def counters(hosts, host: str) -> Optional[tuple[int, int]]:
    """(bytes `host` has sent, bytes it has received) on its link, or None if it is gone."""
    base = f"/sys/class/net/{hosts.namespaces[host]}o/statistics"
    try:
        with open(f"{base}/rx_bytes") as rx, open(f"{base}/tx_bytes") as tx:
            return int(rx.read()), int(tx.read())
    except (OSError, ValueError):
        return None


class LinkWatcher(Watcher):
    """A `_measure.Watcher` that counts bytes on the hosts' links instead of with `ss`.

    Args:
      hosts: the `lowlevel.testing.netns.Hosts` of the run.
      host_of: {process name: host}; a worker's samples count every byte of its host's
        link (its host runs nothing else).

    Attributes (besides Watcher's):
      samples: [(Unix seconds, {(worker name, "link"): bytes both ways so far})], so
        that `bytes_in_window` and `_runners.summarise` work as with `ss`.
      link_samples: [(Unix seconds, {host: (sent, received)})].
    """

    def __init__(self, hosts, host_of: dict, interval: float = 0.1):
        super().__init__(interval)
        self.hosts = hosts
        self.host_of = dict(host_of)
        self.link_samples: list = []

    def _sample_bytes(self, procs, now) -> None:
        found = {h: counters(self.hosts, h) for h in set(self.host_of.values())}
        found = {h: c for h, c in found.items() if c is not None}
        self.link_samples.append((now, found))
        self.samples.append((now, {(n, "link"): sum(found[h]) for n, h in self.host_of.items()
                                   if self.roles.get(n) == "worker" and h in found}))


def link_rates(samples: list, host: str, start_unix: float, end_unix: float,
               peak_secs: float = 1.0) -> Optional[dict]:
    """What `host`'s link carried between two times, from `LinkWatcher.link_samples`.

    Returns:
      {"sent_bits_per_sec", "received_bits_per_sec": means over the window;
       "peak_bits_per_sec": the largest rate either way over any `peak_secs` span of
       samples (at least `peak_secs` long) inside the window}, bits/s, or None with
      fewer than two samples of the host inside.
    """
    inside = [(t, d[host]) for t, d in samples if start_unix <= t <= end_unix and host in d]
    if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
        return None
    (ta, a), (tb, b) = inside[0], inside[-1]
    peak, j = 0.0, 0
    for i in range(len(inside)):
        while j < len(inside) and inside[j][0] - inside[i][0] < peak_secs:
            j += 1
        if j == len(inside):
            break
        dt = inside[j][0] - inside[i][0]
        peak = max(peak, *((inside[j][1][k] - inside[i][1][k]) * 8 / dt for k in (0, 1)))
    return {"sent_bits_per_sec": round((b[0] - a[0]) * 8 / (tb - ta)),
            "received_bits_per_sec": round((b[1] - a[1]) * 8 / (tb - ta)),
            "peak_bits_per_sec": round(peak) if peak else None}


def wait_until(pred, deadline: float, poll: float = 0.05) -> bool:
    """Polls `pred` until it is true or `deadline` (time.monotonic()) passes."""
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(poll)
    return bool(pred())
