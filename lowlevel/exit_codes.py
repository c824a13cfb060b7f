"""The exit-status table of a task: what it means and whether a restart can help.

One table for the trainer, the launcher, the Kubernetes manifests and any
cluster manager. Kubernetes Jobs and the training operator's `TFJob` read exit
0 as *succeeded*; the operator's `restartPolicy: ExitCode` treats 1-127 as
permanent failures and 128-255 as retryable (a container killed by signal N
exits 128 + N), and a Job's `podFailurePolicy` can say the same. So:

| status | meaning | restart? |
| --- | --- | --- |
| 0 (`SUCCESS`) | this task's part of the run is finished: the chief has finished the run; a ps was told to exit; the evaluator evaluated the last checkpoint; a worker started after the end had nothing to train | no |
| 1 (`FAILURE`) | permanent failure: a checkpoint of another model in `--output_dir`, data that is missing or unreadable, no readable checkpoint, a bug | no: the same command fails the same way |
| 2 (`USAGE`) | usage error: a bad flag or `TF_CONFIG` | no: fix the command line |
| 128 + N (`signal_status(N)`) | stopped by signal N at a safe point (SIGTERM: 143, SIGINT: 130), the chief after its checkpoint; a SIGKILL shows as 137 in Kubernetes (`-9` in `subprocess.Popen`) | yes |
| 200 (`TRANSIENT`) | a failure a restart can fix: a peer that did not answer within `--startup_timeout_secs` (mid-run: for `--fault_timeout_secs`), a host name that never resolved, a session lost to the cluster beyond recovery, an evaluator that saw no new checkpoint within `--eval_timeout_secs` (or whose read of `--output_dir` hung for `--fault_timeout_secs`) | yes |

200 is above every signal number Linux has (at most 64, so 128 + N <= 192),
so it never reads as "killed by a signal".

No TensorFlow import here: the launcher imports this module.
"""

from __future__ import annotations

import signal
import sys

from lowlevel.config import RuntimeFailure, UsageError

SUCCESS = 0
FAILURE = 1
USAGE = 2
TRANSIENT = 200
SIGNAL_BASE = 128  # a process stopped by signal N exits SIGNAL_BASE + N


class TransientFailure(RuntimeFailure):
    """A failure that a restart of the task can fix (a peer that never answered, a host
    name that never resolved, no new checkpoint in time). The trainer exits `TRANSIENT`."""


def signal_status(signum: int) -> int:
    """The exit status of a task stopped by signal `signum` at a safe point: 128 + signum."""
    return SIGNAL_BASE + int(signum)


def is_retryable(code: int) -> bool:
    """Whether a task that ended with `code` should be restarted.

    Args:
      code: an exit status (0-255), or a `subprocess.Popen.returncode`, which
        is -N for a process killed by signal N.

    Returns:
      True for a signal (negative codes, 128 and above) and for `TRANSIENT`;
      False for 0 (finished) and 1-127 (permanent failure or usage error).
    """
    return code < 0 or code >= SIGNAL_BASE


# TensorFlow errors that mean the cluster, not this task, failed: a ps or the
# chief went away and the session could not be recreated in time.
_TRANSIENT_TF_ERRORS = ("UnavailableError", "AbortedError", "DeadlineExceededError",
                        "CancelledError")


def status_of(error: BaseException) -> int:
    """The exit status for an exception that ended a task (see the table above).

    `UsageError` -> `USAGE`; `TransientFailure` and a TensorFlow
    `UnavailableError`, `AbortedError`, `DeadlineExceededError` or
    `CancelledError` that escaped session recovery -> `TRANSIENT`; anything
    else (a `RuntimeFailure`, another TensorFlow error, a bug) -> `FAILURE`.
    """
    if isinstance(error, UsageError):
        return USAGE
    if isinstance(error, TransientFailure):
        return TRANSIENT
    tf_errors = sys.modules.get("tensorflow.python.framework.errors_impl")
    if tf_errors is not None and isinstance(error, tf_errors.OpError):
        if type(error).__name__ in _TRANSIENT_TF_ERRORS:
            return TRANSIENT
    return FAILURE


FINISHED, RESTART, FAILED = "finished", "restart", "failed"


def decide(code: int, restarts: int, max_restarts: int, chief_finished: bool = False,
           stopping: bool = False) -> str:
    """What a supervisor does with a task that ended with `code` (a Popen return code).

    The launcher's policy (`lowlevel.supervisor.Supervisor`); pure, so it is tested as a table.

    Returns:
      FINISHED: exit 0; or any end once the chief has finished the run (there
        is nothing left for the task to do) or while the launcher is stopping
        every task.
      RESTART: a retryable status (`is_retryable`: a signal, 128 +
        N, or 200) with `restarts` < `max_restarts`.
      FAILED: 1-127 (a permanent failure or usage error: the same command
        would fail the same way), or a retryable status with no restart left.
    """
    if code == SUCCESS or chief_finished or stopping:
        return FINISHED
    if is_retryable(code) and restarts < max_restarts:
        return RESTART
    return FAILED


def describe(code: int) -> str:
    """"exited with status 1 (permanent failure)", "was killed by SIGKILL", ... for a
    return code (a Popen one: -N for signal N)."""
    if code < 0:
        return f"was killed by {_signal_name(-code)}"
    meaning = {SUCCESS: "finished", FAILURE: "permanent failure", USAGE: "usage error",
               TRANSIENT: "transient failure, retryable"}.get(code)
    if meaning is None and SIGNAL_BASE < code < TRANSIENT:
        meaning = f"stopped by {_signal_name(code - SIGNAL_BASE)}"
    return f"exited with status {code}" + (f" ({meaning})" if meaning else "")


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
