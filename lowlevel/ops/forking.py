"""Starts the launcher's tasks by forking it after it has imported TensorFlow once.

A cold `python -m lowlevel.trainer` spends about 3 s of CPU importing TensorFlow
(2.21, Keras skipped: `lowlevel.tf_import`); a launcher that starts 1 ps + 2 workers
as three such processes pays it three times over, at once, on the same cores
(4.6-5.8 s from launch to the last task's first log line on 2 cores:
benchmarks/NOTES.md). The launcher imports it once (`lowlevel.launch.preload`);
`start()` then forks a task from the launcher (`multiprocessing`'s "fork" start method:
a direct child, so its exit status, signals and `PR_SET_PDEATHSIG` work as for
a `subprocess.Popen`) and runs the module `lowlevel.trainer` as `__main__` on the
task's own argv (`runpy`), as `python -m lowlevel.trainer` would.

Why forking here is safe:
- TensorFlow's import starts no runtime: no session, no device, no gRPC; CUDA
  is initialised by a task's first session (`cuInit`), in the task, so a forked
  GPU worker is as fresh as an exec'd one, and the variables a task sets before
  its first session (`CUDA_VISIBLE_DEVICES`, `TF_GRPC_DEFAULT_OPTIONS`) still act.
- The launcher forks from its only Python thread: it reads its tasks' output
  with a selector, not threads, and turns off tqdm's monitor thread. (numpy's
  OpenBLAS pool has its own fork handlers.)
- The child resets the launcher's signal handlers, points stdout and stderr at
  its pipe, closes the launcher's other pipes, takes the task's environment,
  forgets the launcher's parsed flags, and names itself as the command it stands
  for (`setproctitle`: `ps` and `psutil.Process.cmdline()` show
  `python -m lowlevel.trainer --job_name=ps ...`).
"""

from __future__ import annotations

import gc
import importlib.util
import multiprocessing
import os
import runpy
import signal
import subprocess
import sys
from typing import Optional

_FORK = multiprocessing.get_context("fork")


class ForkedTask:
    """A forked task (a `multiprocessing.Process`) with the part of `subprocess.Popen`'s
    interface the launcher and the tests' forked processes (tests/prefork.py) use.

    `returncode` follows Popen: the exit status, or -N when signal N ended it.
    """

    def __init__(self, process):
        self._process = process
        self.pid: int = process.pid
        self.returncode: Optional[int] = None

    def poll(self) -> Optional[int]:
        self.returncode = self._process.exitcode
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        """Raises `subprocess.TimeoutExpired` if still running after `timeout` seconds."""
        self._process.join(timeout)
        if self.poll() is None:
            raise subprocess.TimeoutExpired(self._process.name, timeout)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


# The modules a task may be forked as: the trainer, and the runner of a user's script
# (`python -m lowlevel SCRIPT.py`, which runs the script as `__main__` itself).
FORKABLE = ("lowlevel.trainer", "lowlevel")


# What a trainer's task imports after TensorFlow: its runtime (the schedules import training
# and evaluation lazily: a ps needs neither), and scikit-learn for the image data sets
# (`data.images`) and the AUC (`runtime.evaluation`). Imported once in the launcher
# (`lowlevel.launch.preload`), not once per forked task: scikit-learn alone is ~1.1 s of
# CPU per worker or evaluator after TensorFlow (`import sklearn.datasets,
# sklearn.model_selection` after `import_tensorflow()`, 2026-11-27); the training modules
# ~0.3 s more in a restarted chief without bytecode caches (`PYTHONDONTWRITEBYTECODE`,
# py-spy, 2026-11-29). Their import starts no thread.
TRAINER_MODULES = ("lowlevel.runtime.schedules", "lowlevel.runtime.training",
                   "lowlevel.runtime.finish", "lowlevel.runtime.evaluator",
                   "sklearn.datasets", "sklearn.model_selection", "sklearn.metrics")


def freeze_heap() -> None:
    """Moves every object this process holds (TensorFlow's ~340,000 after its import) into
    the collector's permanent generation (`gc.freeze`, the use Python's documentation
    gives for a process that forks workers): a forked task's collections then scan only
    what the task made, not the launcher's heap it inherited, and leave those pages
    shared. Measured: parsing MovieLens' 100,000 ratings into lists, 0.23 s of CPU after
    TensorFlow's import, 0.07 s after this (2026-11-27)."""
    gc.freeze()


RELEASE = b"g"  # written to a task's gate once it is in its cgroups (`start`)


def start(argv: list, env: dict, output_fd: int, close_fds=(),
          gate: Optional[int] = None) -> ForkedTask:
    """Forks this process into the task `argv` (`[python, "-m", "lowlevel.trainer", ...]`).

    Args:
      argv: the command a cold start would run; its module must be one of `FORKABLE`.
      env: the task's whole environment.
      output_fd: where the task's stdout and stderr go (the write end of a pipe).
      close_fds: descriptors of this process the task must not keep (the other
        tasks' pipes, the selector, the write end of `gate`).
      gate: the read end of a pipe: the task waits until `RELEASE` comes through it
        (the launcher has put it into its cgroups, `--cpu`/`--memory`), and exits 1
        without running if the pipe closes first. None: it runs at once.

    Raises:
      ValueError: `argv` does not run `python -m` one of `FORKABLE`.
    """
    if len(argv) < 3 or argv[1] != "-m" or argv[2] not in FORKABLE:
        raise ValueError(f"only python -m {' or '.join(FORKABLE)} can be forked, not {argv[:3]}")
    for stream in (sys.stdout, sys.stderr):
        stream.flush()  # else the child would write the launcher's buffered output again
    process = _FORK.Process(target=_task,
                            args=(argv, env, output_fd, tuple(close_fds), gate),
                            name=" ".join(argv[2:3] + argv[-2:]), daemon=False)
    process.start()
    return ForkedTask(process)


def _task(argv, env, output_fd, close_fds, gate):
    """The child: becomes `python -m MODULE argv[3:]`; its exit status is the task's."""
    _default_signals()  # not the launcher's handlers, from the first moment
    for fd in close_fds:
        try:
            os.close(fd)
        except OSError:
            pass
    if gate is not None:
        released = os.read(gate, 1) == RELEASE
        os.close(gate)
        if not released:
            os._exit(1)  # the launcher could not place it, and says why
    redirect(output_fd, output_fd)
    run_as_main(argv, env)


def redirect(stdout_fd: int, stderr_fd: int) -> None:
    """Points this process's stdin at /dev/null and its stdout and stderr at the two
    descriptors (which may be the same; both are closed after), line-buffered."""
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(stdout_fd, 1)
    os.dup2(stderr_fd, 2)
    for fd in {stdout_fd, stderr_fd}:
        os.close(fd)
    sys.stdout.reconfigure(line_buffering=True)
    sys.stderr.reconfigure(line_buffering=True)


def run_as_main(argv: list, env: dict) -> None:
    """Becomes `python -m MODULE ARGS` (`argv` as a cold start would run it: `[python, "-m",
    MODULE, *ARGS]`) in a process forked after TensorFlow's import, with environment `env`.

    Resets the signal handlers a parent may have set, takes `env`, the command's name
    (`setproctitle`, absl's kernel name), absl's flag defaults (for `lowlevel`, the runner
    of a user's script: only absl's own flags, `_forget_flags`), then runs MODULE as
    `__main__` (`runpy`); returns or raises as that module does (`SystemExit` carries its
    exit status). Used by the launcher's tasks and by the tests' forked processes.
    """
    import setproctitle
    from absl import flags
    from absl.command_name import set_kernel_process_name

    _default_signals()
    # The title first: setproctitle takes its room from the environment's memory,
    # which it finds only while the parent's environment is still in place.
    setproctitle.setproctitle(" ".join(argv))
    os.environ.clear()
    os.environ.update(env)
    module = argv[2]
    set_kernel_process_name(module.rsplit(".", 1)[-1] + ".py")
    # absl.app.run sets --verbosity to 0 (INFO) when it is not given, but only in a
    # process's first run; the launcher's came first. Its default is -1 (WARNING).
    flags.FLAGS.set_default("verbosity", 0)
    if module == "lowlevel":  # a user's script, which defines flags of its own
        _forget_flags(flags.FLAGS)
    for name in flags.FLAGS:  # back to defaults, for the task's argv to be parsed
        flags.FLAGS[name].unparse()
    sys.argv = [importlib.util.find_spec(module).origin, *argv[3:]]
    # Exits: SystemExit carries the status to multiprocessing's exit.
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def _forget_flags(flag_values) -> None:
    """Removes from `flag_values` every flag lowlevel's modules defined (the trainer's and
    the launcher's), keeping absl's own: a script run by `python -m lowlevel` defines its
    own, and one named as the trainer's (`--data_dir`: TensorFlow's `mnist_replica.py`)
    would be a `DuplicateFlagError`, as it is not in a fresh process."""
    for module, defined in list(flag_values.flags_by_module_dict().items()):
        if module.split(".")[0] == "absl":
            continue
        for flag in list(defined):
            for name in {flag.name, flag.short_name} - {None}:
                if name in flag_values:
                    delattr(flag_values, name)


def _default_signals() -> None:
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
