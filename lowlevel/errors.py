"""Every error of lowlevel, the exit-status table, and the one place TensorFlow's errors are classified.

Errors: `UsageError` (a bad flag or `TF_CONFIG`: exit 2), `RuntimeFailure` (something
outside the configuration failed: exit 1) and its retryable kind `TransientFailure`
(exit 200); each concrete error below names the one of them it is.

The exit-status table: what a status means and whether a restart can help.

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

TensorFlow's own errors (`tf.errors.*`) are classified here and nowhere else
(`lost_session`, `peer_unreachable`, `run_cancelled`, `storage_error`, `status_of`), by class name, so
this module imports no TensorFlow: the launcher and the CLIs import it before
(or without) TensorFlow's multi-second import.
"""

from __future__ import annotations

import os
import signal
from typing import Optional

SUCCESS = 0
FAILURE = 1
USAGE = 2
TRANSIENT = 200
SIGNAL_BASE = 128  # a process stopped by signal N exits SIGNAL_BASE + N


class UsageError(ValueError):
    """A configuration value is wrong. The message names the value and what is expected.

    Exit status 2 (`USAGE`): fix the command line.
    """


class LegacyKerasMissing(UsageError):
    """A script run by `python -m lowlevel.estimator` used `tf.compat.v1.layers` without tf-keras.

    Keras 3 (TensorFlow 2.21's default) has no TF1 layers; the message is the one
    line naming the extra that brings Keras 2 (`pip install 'lowlevel[legacy-keras]'`).
    Exit status 2 (`USAGE`).
    """


class RuntimeFailure(RuntimeError):
    """Something outside the configuration failed (a task never came up, no checkpoint came).

    The message says what, and where to look. Exit status 1 (`FAILURE`), unless it is
    a `TransientFailure`.
    """


class TransientFailure(RuntimeFailure):
    """A failure that a restart of the task can fix (a peer that never answered, a host
    name that never resolved, no new checkpoint in time). The trainer exits `TRANSIENT`."""


# Permanent failures (exit status 1): a restart meets the same files.

class DataError(RuntimeFailure):
    """The data files are missing, truncated or not what they claim to be
    (`lowlevel.data.images`). A restart reads the same files."""


class MovieLensError(RuntimeFailure):
    """The MovieLens files are missing, truncated or malformed; the message names the file
    (`lowlevel.data.movielens`)."""


class CheckpointMismatch(RuntimeFailure):
    """The checkpoint in `--output_dir` does not fit the model being built
    (`lowlevel.outputs.checkpoints.check_compatible`). A restart finds the same checkpoint."""


class NoReadableCheckpoint(RuntimeFailure):
    """`--output_dir` lists checkpoints but none of them can be read."""


class ModelFnError(RuntimeFailure):
    """A user's model_fn or input_fn failed, or returned what the Estimator contract does not
    allow (`lowlevel.models.user.calling`): the message names the function; a restart runs the
    same code."""


class StorageFailure(RuntimeFailure):
    """`--max_checkpoint_failures` checkpoint saves in a row failed (`lowlevel.outputs.storage`):
    a restart would hit the same full or read-only disk."""


class ContribUnavailable(RuntimeFailure, ImportError):
    """A script in TF1's own namespace used a `tf.contrib` name that TensorFlow 2.21 has not
    and lowlevel does not map (`lowlevel.tf1_namespace`): the message names it and its
    replacement where one is known. A restart runs the same script. Also an `ImportError`,
    so that a script's `except ImportError:` fallback (to `tf_slim`, say) takes it."""


class RestartsSpent(RuntimeFailure):
    """This task has been restarted `--max_restarts` times in this run (`lowlevel.runtime.restarts`):
    a crash loop turned into a permanent exit (1)."""


# Retryable failures (exit status 200).

class StartupError(TransientFailure):
    """The cluster did not come together: a task never answered, or its host name never
    resolved, within the start-up timeout (`lowlevel.cluster.probes`)."""


class NetworkFault(TransientFailure):
    """Peers did not answer for longer than `--fault_timeout_secs` (`lowlevel.runtime.faults`)."""


class EvalTimeout(TransientFailure):
    """No new checkpoint appeared within `--eval_timeout_secs` before the final one
    (`lowlevel.runtime.evaluator`): the chief may be down or restarting; a restarted
    evaluator picks up where it was."""


class TrainingFinished(Exception):
    """The newest checkpoint has reached `--train_steps`: there is nothing left to train.

    Not a failure: the trainer ends the run (`runtime.finish.finished_run`) and exits 0.

    Attributes:
      path: the checkpoint's path prefix.
      step: its global step.
    """

    def __init__(self, path: str, step: int):
        super().__init__(f"checkpoint {os.path.basename(path)} is at global step {step}")
        self.path, self.step = path, step


class StorageTimeout(TransientFailure):
    """A read or write in `--output_dir` did not complete in time (storage that stopped
    answering: a hung network file system; `lowlevel.runtime.evaluator`). A restarted task
    reads the same files again."""


class NoLiveSession(Exception):
    """The monitored session has no live `tf.Session`: it is being recreated after a failure.

    Raised and caught inside the training loop (`lowlevel.runtime.loop`); never ends a task.
    """


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


# TensorFlow's errors (`tf.errors.*`), by class name. A run that lost its ps, or its
# session (replaced after a failure): the ps went away, it came back without the
# model, or the session was closed under the run.
LOST_SESSION = frozenset({"UnavailableError", "AbortedError", "CancelledError",
                          "NotFoundError", "FailedPreconditionError"})
# A peer that cannot be reached now: gone, restarting, or silent past a deadline.
PEER_UNREACHABLE = frozenset({"UnavailableError", "DeadlineExceededError", "AbortedError",
                              "CancelledError"})
# What escaped session recovery and ends a task as retryable (`TRANSIENT`): the
# cluster, not this task, failed (a ps or the chief went away and did not come back).
TRANSIENT_TF = PEER_UNREACHABLE
# A write to `--output_dir` that failed: full (ResourceExhausted), read-only
# (PermissionDenied), the directory gone (NotFound, FailedPrecondition), a write cut
# short (DataLoss, Unknown).
STORAGE = frozenset({"ResourceExhaustedError", "PermissionDeniedError",
                     "FailedPreconditionError", "NotFoundError", "UnknownError",
                     "DataLossError"})


def tf_error_name(error: BaseException) -> Optional[str]:
    """The class name of a TensorFlow `tf.errors.OpError` ("UnavailableError", ...), else None.

    Found through the class's bases (TensorFlow's `OpError` lives in a private module),
    so TensorFlow need not be imported to ask.
    """
    for cls in type(error).__mro__:
        if cls.__name__ == "OpError" and cls.__module__.startswith("tensorflow"):
            return type(error).__name__
    return None


def lost_session(error: BaseException) -> bool:
    """Whether `error` is what a run on a lost session raises (not a bug to surface).

    A TensorFlow error of `LOST_SESSION`, `NoLiveSession`, and the `RuntimeError`
    of a `tf.Session` closed under the run ("Attempted to use a closed
    Session."); any other `RuntimeError` is a bug.
    """
    if isinstance(error, NoLiveSession) or tf_error_name(error) in LOST_SESSION:
        return True
    return isinstance(error, RuntimeError) and "closed Session" in str(error)


def peer_unreachable(error: BaseException) -> bool:
    """Whether `error` is a TensorFlow error of a peer that cannot be reached now
    (`PEER_UNREACHABLE`): a best-effort signal to it is given up, not raised."""
    return tf_error_name(error) in PEER_UNREACHABLE


def run_cancelled(error: BaseException) -> bool:
    """Whether `error` ends a background loop quietly: its run was cancelled (its session is
    closing) or ran past the end of its queue (`CancelledError`, `OutOfRangeError`)."""
    return tf_error_name(error) in ("CancelledError", "OutOfRangeError")


def step_refused(error: BaseException) -> bool:
    """Whether a training step's `error` may be the runtime's own refusal, not a failure:
    `OutOfRangeError` (no step left, `exact.counted_update`; or the end of a data-queue
    span's file) or `InvalidArgumentError` (the data queue's check refused the batch,
    `lowlevel.data.spans`). The loop sorts them further by message."""
    return tf_error_name(error) in ("OutOfRangeError", "InvalidArgumentError")


def storage_error(error: BaseException) -> bool:
    """Whether `error` is a failed write to `--output_dir`: an `OSError`, a `ValueError` of
    TensorFlow's saver, or a TensorFlow error of `STORAGE`."""
    return isinstance(error, (OSError, ValueError)) or tf_error_name(error) in STORAGE


def is_runtime_failure(error: BaseException) -> bool:
    """Failures of the cluster or the files (a `RuntimeFailure`, an `OSError`, any TensorFlow
    error), as opposed to bugs, which keep their traceback."""
    return isinstance(error, (RuntimeFailure, OSError)) or tf_error_name(error) is not None


def one_line(error: BaseException) -> str:
    """One line for a failure: ours carry their message; TensorFlow's and others get their
    type and the first line of theirs."""
    if isinstance(error, RuntimeFailure):
        return str(error)
    message = getattr(error, "message", None) or str(error)
    return f"{type(error).__name__}: {message.strip().splitlines()[0] if message else ''}"


def status_of(error: BaseException) -> int:
    """The exit status for an exception that ended a task (see the table above).

    `UsageError` -> `USAGE`; `TransientFailure` and a TensorFlow error of
    `TRANSIENT_TF` that escaped session recovery -> `TRANSIENT`; anything else
    (a `RuntimeFailure`, another TensorFlow error, a bug) -> `FAILURE`.
    """
    if isinstance(error, UsageError):
        return USAGE
    if isinstance(error, TransientFailure) or tf_error_name(error) in TRANSIENT_TF:
        return TRANSIENT
    return FAILURE


FINISHED, RESTART, FAILED = "finished", "restart", "failed"


def decide(code: int, restarts: int, max_restarts: int, chief_finished: bool = False,
           stopping: bool = False) -> str:
    """What a supervisor does with a task that ended with `code` (a Popen return code).

    The launcher's policy (`lowlevel.ops.supervisor.Supervisor`); pure, so it is tested as a table.

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
