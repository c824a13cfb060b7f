"""The tests' `python -m lowlevel...` processes, forked from one TensorFlow import.

A cold `python -m lowlevel.trainer` spends ~3.5 s of CPU importing TensorFlow before
its first line; a 3-task cluster pays it three times, at once, on 2 cores. The
launcher already forks its tasks after one import (`lowlevel.ops.forking`); the
tests do the same through the standard library: multiprocessing's "forkserver"
start method, with a server process that has imported TensorFlow as a task does
(`lowlevel.tf_import`) and the runtime's modules, and forks each process the test
asks for from that state (`lowlevel.ops.forking.run_as_main`: the module run as
`__main__` on its own argv and environment, its name in `ps` the command's).

What a forked process has that a cold one has not: modules already imported with
the server's environment. So only the entry points below are forked, and a test
whose environment must act at import time (`TF_USE_LEGACY_KERAS`, `TF_CPP_*`,
`PYTHONPATH`, ...) gets a cold start: see `_IMPORT_TIME_ENV`. Anything else
(`python -c`, a script, another module) is started cold, as before.

A forked process's title (`setproctitle`) lies in the server's argument area, which is
longer than most titles: `/proc/PID/cmdline` then ends in NULs and `psutil` reads it as
one argument followed by empty ones (`clusters.argv_of` reads it either way).

The forked process is a child of the server, not of pytest: its exit status comes
back through multiprocessing (`forking.ForkedTask`: `poll`, `wait`), signals go by PID.
`close_all()` (conftest, at the session's end) kills any the tests left running.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from typing import Optional

from lowlevel.ops import forking

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The commands forked rather than started cold: those that import TensorFlow. Not
# `lowlevel.tf_configs`, which never does (a cold start is ~0.25 s, and its 60 runs in the
# in-process tier were what started a fork server there: ~5 s of CPU per pytest worker).
FORKED_MODULES = ("lowlevel", "lowlevel.trainer", "lowlevel.launch", "lowlevel.estimator",
                  "lowlevel.predict")
# Environment variables read while TensorFlow or lowlevel is imported: a process whose
# environment sets one to a value other than the server's is started cold.
_IMPORT_TIME_ENV = ("TF_USE_LEGACY_KERAS", "TF_CPP_MIN_LOG_LEVEL", "TF_CPP_MAX_VLOG_LEVEL",
                    "TF_ENABLE_ONEDNN_OPTS", "PYTHONPATH", "PYTHONHASHSEED",
                    "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                    "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "MKL_NUM_THREADS",
                    "TF_NUM_INTEROP_THREADS", "TF_NUM_INTRAOP_THREADS")
_PRELOAD = ["lowlevel.tf_import", "prefork_preload"]
_CONTEXT = multiprocessing.get_context("forkserver")
_CONTEXT.set_forkserver_preload(_PRELOAD)
_started: list = []
counts = {"forked": 0, "cold": 0}  # the processes `start` made each way in this process


def forkable(argv: list, env: dict) -> bool:
    """Whether `argv` (a cold command line) may be forked with environment `env`.

    Never with `LOWLEVEL_TESTS_COLD=1` in the tests' environment (every process cold, as
    before: to compare the two, or to rule the fork server out of a failure)."""
    if os.environ.get("LOWLEVEL_TESTS_COLD") == "1":
        return False
    if len(argv) < 3 or argv[0] != sys.executable or argv[1] != "-m":
        return False
    if argv[2] not in FORKED_MODULES:
        return False
    return all(env.get(k) == _SERVER_ENV.get(k) for k in _IMPORT_TIME_ENV)


def start(argv: list, stdout_path, stderr_path=None, env: Optional[dict] = None,
          cwd: str = ROOT, append: bool = False, cold: bool = False,
          netns: Optional[str] = None):
    """Starts `argv` with its stdout (and stderr, unless `stderr_path`) written to a file
    (appended to with `append`; a FIFO is opened for writing, as a shell would).

    Forked when `forkable`, else `subprocess.Popen`; either way returns an object with
    `pid`, `poll()`, `wait(timeout)`, `returncode`, `send_signal()`, `terminate()`,
    `kill()`. `cold`: never forked (a test of what a cold process shows). `netns`: on
    that host (`lowlevel.testing.netns`): the forked process enters its namespaces as
    `ip netns exec` would (`netns.enter`), a cold one is started by `ip netns exec`.
    """
    env = dict(os.environ if env is None else env)
    if cold or not forkable(argv, env):
        counts["cold"] += 1
        out = open(stdout_path, "a" if append else "w")
        err = open(stderr_path, "a" if append else "w") if stderr_path else subprocess.STDOUT
        command = ["ip", "netns", "exec", netns, *argv] if netns else argv
        return subprocess.Popen(command, stdout=out, stderr=err, cwd=cwd, env=env,
                                stdin=subprocess.DEVNULL)
    _ensure_server()
    for path in filter(None, (stdout_path, stderr_path)):  # there on return, as with Popen
        if not os.path.exists(path) or os.path.isfile(path):  # not a FIFO, not /dev/null
            open(path, "a" if append else "w").close()
    process = _CONTEXT.Process(target=_child, name=" ".join(argv[2:3] + argv[-2:]),
                               args=(list(argv), env, cwd, str(stdout_path),
                                     str(stderr_path) if stderr_path else None, append, netns))
    process.start()
    _started.append(process)
    counts["forked"] += 1
    return forking.ForkedTask(process)


def run(argv: list, env: Optional[dict] = None, cwd: str = ROOT,
        timeout: Optional[float] = None, cold: bool = False) -> subprocess.CompletedProcess:
    """`subprocess.run(argv, capture_output=True, text=True, timeout=...)`, forked when it can
    (never with `cold`: e.g. a usage error, which exits before TensorFlow's import, so
    that an in-process test starts no fork server).

    Raises:
      subprocess.TimeoutExpired: still running after `timeout` seconds (then killed).
    """
    env = dict(os.environ if env is None else env)
    if cold or not forkable(argv, env):
        counts["cold"] += 1
        return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
    with tempfile.TemporaryDirectory(prefix="prefork-") as tmp:
        out, err = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
        task = start(argv, out, err, env=env, cwd=cwd)
        try:
            task.wait(timeout)
        except subprocess.TimeoutExpired:
            task.kill()
            task.wait(30)
            raise
        with open(out, errors="replace") as o, open(err, errors="replace") as e:
            return subprocess.CompletedProcess(argv, task.returncode, o.read(), e.read())


def close_all(grace_secs: float = 5.0) -> list:
    """Kills (SIGKILL, by PID) the forked processes still running; returns their PIDs.

    Called at the end of the session, so that multiprocessing's exit does not wait for
    a process a test left behind.
    """
    left = [p for p in _started if p.exitcode is None]
    deadline = time.monotonic() + grace_secs
    for p in left:
        p.join(max(0.0, deadline - time.monotonic()))
    left = [p for p in left if p.exitcode is None]
    for p in left:
        p.kill()
        p.join(10)
    return [p.pid for p in left]


def _ensure_server() -> None:
    """Starts the fork server once, with this folder on its path for `prefork_preload`.

    Python 3.11's fork server is started with `python -c` in this process's working
    directory and does not take this process's `sys.path` (it is passed, then unused), so
    the folder goes in through `PYTHONPATH`, for that one process start only.
    """
    from multiprocessing import forkserver
    saved = os.environ.get("PYTHONPATH")
    here = os.path.dirname(os.path.abspath(__file__))
    os.environ["PYTHONPATH"] = os.pathsep.join([here] + ([saved] if saved else []))
    try:
        forkserver.ensure_running()
    finally:
        if saved is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = saved


def _child(argv, env, cwd, stdout_path, stderr_path, append, netns=None):
    """In the forked process: onto its host, output to the files, then `python -m MODULE
    ARGS`."""
    if netns:
        from lowlevel.testing import netns as namespaces
        namespaces.enter(netns)
    mode = os.O_WRONLY | os.O_CREAT | os.O_APPEND  # emptied by `start` unless `append`
    out = os.open(stdout_path, mode, 0o644)
    err = os.open(stderr_path, mode, 0o644) if stderr_path else out
    forking.redirect(out, err)
    os.chdir(cwd)
    forking.run_as_main(argv, env)


def _server_env() -> dict:
    """The import-time environment the server imports TensorFlow with: this process's,
    as `lowlevel.tf_import` sets it before the import."""
    env = dict(os.environ)
    from lowlevel.tf_import import skip_keras
    skip_keras(env)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return {k: env.get(k) for k in _IMPORT_TIME_ENV}


_SERVER_ENV = _server_env()
