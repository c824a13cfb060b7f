"""A private network namespace for a local cluster: nothing outside it can reach the tasks.

A `tf.compat.v1.train.Server` listens on every interface, whatever address the
cluster names, and runs any graph anyone sends it (no authentication). The
launcher's cluster only ever talks over loopback, so `confine()` moves the
launcher, before it starts any task, into a new network namespace whose only
interface is its own loopback; every task it starts inherits it. Nothing on
the machine's network, another namespace or the host's own loopback can
connect to a task's port.

How, in order:

1. `unshare(CLONE_NEWNET)`: needs CAP_SYS_ADMIN (root);
2. `unshare(CLONE_NEWUSER | CLONE_NEWNET)` with this user mapped to itself:
   works without root where the kernel allows unprivileged user namespaces
   (most distributions; not where `kernel.unprivileged_userns_clone=0` or
   `user.max_user_namespaces=0`, nor inside many containers);
3. neither: `confine` says why, and the caller warns and goes on unconfined.

The namespace has no name and no file: it disappears when the last process
in it ends, so nothing is left behind on Ctrl-C, SIGKILL or a failure. Linux
only (`unshare(2)`, `user_namespaces(7)`).
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import socket
import struct
from typing import Optional

CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1

PRIVATE, USER_NAMESPACE = "private network namespace", "private network namespace (user namespace)"


def _unshare(flags: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(ctypes.c_int(flags)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _loopback_up() -> None:
    """Brings `lo` up in the current namespace (a new one starts with it down)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | _IFF_UP))


def _map_self() -> None:
    """Maps this user and group to themselves in the new user namespace (as `unshare -r`
    does, without becoming root in it)."""
    uid, gid = os.geteuid(), os.getegid()
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"{uid} {uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"{gid} {gid} 1")


def confine() -> tuple[Optional[str], str]:
    """Moves this process into a new network namespace with only loopback, up.

    Call it before starting any thread (a user namespace needs a
    single-threaded process) and before picking ports.

    Returns:
      (how, detail): `how` is `PRIVATE` or `USER_NAMESPACE` when confined,
      None when neither way worked; `detail` then says why (one line).
    """
    try:
        _unshare(CLONE_NEWNET)
    except OSError as e:
        root_error = e
    else:
        _loopback_up()  # in our own new namespace with CAP_NET_ADMIN: cannot be refused
        return PRIVATE, "root"
    try:
        _unshare(CLONE_NEWUSER | CLONE_NEWNET)
        _map_self()
        _loopback_up()
        return USER_NAMESPACE, "user namespace"
    except OSError as e:
        return None, (f"unshare(CLONE_NEWNET): {root_error.strerror}; with a user namespace: "
                      f"{e.strerror} (not root, and unprivileged user namespaces are not "
                      "allowed here)")


def namespace_id(pid: Optional[int] = None) -> str:
    """The network namespace of `pid` (default: this process), as "net:[4026531840]"."""
    return os.readlink(f"/proc/{pid or 'self'}/ns/net")
