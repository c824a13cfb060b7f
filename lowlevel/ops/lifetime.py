"""A task's life bound to its launcher's: when the launcher dies, its tasks get SIGTERM.

`python -m lowlevel.launch` sets `LOWLEVEL_PARENT_PID` in each task's
environment to its own pid; the task (`lowlevel.trainer`), first thing,
asks Linux to send it SIGTERM when its parent dies (`prctl(PR_SET_PDEATHSIG)`).
The child sets this itself: through `subprocess.Popen(preexec_fn=...)` it
would run between fork and exec while the launcher's reader threads run,
which the Python documentation calls unsafe (the child can deadlock).
If the launcher died before the call, the parent pid no longer matches and
the task sends itself the signal at once.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PARENT_PID_ENV = "LOWLEVEL_PARENT_PID"
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def child_env(env: dict) -> dict:
    """`env` plus the variable that binds a task started from this process to its life."""
    return dict(env, **{PARENT_PID_ENV: str(os.getpid())})


def die_with_parent() -> bool:
    """Arranges SIGTERM on the parent's death if the launcher asked for it; returns whether set.

    Does nothing without `LOWLEVEL_PARENT_PID` or off Linux.
    """
    parent = os.environ.get(PARENT_PID_ENV)
    if not parent or not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM) != 0:
        return False
    if os.getppid() != int(parent):  # the launcher is already gone
        os.kill(os.getpid(), signal.SIGTERM)
    return True
