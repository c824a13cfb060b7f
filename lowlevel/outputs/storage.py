"""Writing to `--output_dir` when the disk is full or read-only: a line, not a crash.

A checkpoint save that fails (`SaveV2` raises `ResourceExhaustedError: Graph
execution error:` on a full disk, `PermissionDeniedError` on a read-only one)
used to end the chief with that bare line and leave `model.ckpt-N_temp/`
behind. `CheckpointSaves` turns each failure into one log line naming the
directory and the OS error (`No space left on device (ENOSPC)`), a
`checkpoint_failed` event, and the removal of the save's temporary files; the
previous checkpoint is untouched (TensorFlow writes to temporary names and
renames only after every shard is written), training goes on and the next save
is tried at the next interval.

`--max_checkpoint_failures` saves in a row (default 3) that fail end the run
with `errors.FAILURE` (1, permanent), not `TRANSIENT`: a restarted chief
would restore the last good checkpoint, train the same intervals again and hit
the same full or read-only disk, so an orchestrator restarting it (a `TFJob`'s
`restartPolicy: ExitCode`, the launcher's `--max_restarts`) burns compute and
loses work each time. The fix is outside the job (free space, remount), after
which the same command resumes from the newest checkpoint. Retrying inside the
run, a few intervals, covers what does heal by itself (an old run's files
deleted meanwhile, a snapshot released).

Summaries, `tasks/*.json`, `final_metrics.json` and events go through `Writes`
(or `events.emit`): a failed write is one warning line per streak of failures
and the run goes on.
"""

from __future__ import annotations

import errno
import glob
import os
import re
import shutil
from typing import Callable, Optional

from absl import logging

from lowlevel import events, output_layout
from lowlevel.errors import StorageFailure, storage_error

# The OS's messages for every errno, as TensorFlow's file system layer prints them.
_ERRNO_OF = {os.strerror(n): name for n, name in errno.errorcode.items()}
_TF_OS_ERROR = re.compile(r"^(/\S*?); ([^\n]+?)\s*$", re.MULTILINE)


def os_error(error: BaseException) -> str:
    """"No space left on device (ENOSPC)" for an `OSError` or a TensorFlow error from a write.

    TensorFlow's errors carry the OS message after the file name
    ("/out/model.ckpt-10.data-00000-of-00001.tempstate123; No space left on
    device"); anything else is given by its type and first line.
    """
    if isinstance(error, OSError) and error.errno:
        return f"{os.strerror(error.errno)} ({errno.errorcode.get(error.errno, error.errno)})"
    message = getattr(error, "message", None) or str(error)
    for _, text in _TF_OS_ERROR.findall(message):
        if text in _ERRNO_OF:
            return f"{text} ({_ERRNO_OF[text]})"
    for text, name in _ERRNO_OF.items():  # the message may name the OS error elsewhere
        if text and text in message:
            return f"{text} ({name})"
    first = next((line for line in message.splitlines() if line.strip()), "")
    return f"{type(error).__name__}: {first.strip()}"


def remove_partial(output_dir: str, prefix: str = output_layout.CHECKPOINT_PREFIX) -> list[str]:
    """Removes what a failed save left in `output_dir`; returns what it removed.

    A sharded save writes `<prefix>-N_temp/` (one part per ps), an unsharded
    one `*.tempstate<random>` files; neither is ever a checkpoint. Removal is
    best effort (a read-only directory keeps them: they are logged once).
    """
    patterns = [f"{prefix}-*_temp", f"{prefix}-*_temp_*", f"{prefix}-*.tempstate*",
                "checkpoint.tmp*"]
    removed = []
    for pattern in patterns:
        for path in glob.glob(os.path.join(glob.escape(output_dir), pattern)):
            try:
                if os.path.isdir(path):
                    shutil.rmtree(path)
                else:
                    os.unlink(path)
                removed.append(os.path.basename(path))
            except OSError as e:
                logging.warning("could not remove the partial checkpoint %s: %s", path,
                                os_error(e))
    return removed


class CheckpointSaves:
    """Runs the chief's checkpoint saves, turning a failure into a line, an event and a retry;
    a save that works also removes what an earlier save cut short left (`remove_partial`).

    Args:
      output_dir: the `--output_dir` checkpoints go to.
      max_failures: saves in a row that may fail before `save` raises.
    """

    def __init__(self, output_dir: str, max_failures: int):
        self.output_dir = output_dir
        self.max_failures = max_failures
        self.failures = 0  # in a row
        self.last_failed = False

    def save(self, save: Callable[[], str], step: int, final: bool = False) -> Optional[str]:
        """Calls `save()` (returns the checkpoint's path prefix); the path, or None if it failed.

        Raises:
          StorageFailure: this is the `max_failures`-th failure in a row.
        """
        try:
            path = save()
        except Exception as e:  # noqa: BLE001 - OSError, tf OpError, ValueError of the saver
            if not storage_error(e):
                raise
            self._failed(e, step, final)
            return None
        if self.failures:
            logging.info("checkpoint saves work again in %s (%s after %d failed)",
                         self.output_dir, os.path.basename(path), self.failures)
        self.failures, self.last_failed = 0, False
        # A save cut short by a kill (the chief's, or a ps's mid-save) left its temporary
        # files; no process of this run writes them any more once a later save is done.
        leftovers = remove_partial(self.output_dir)
        if leftovers:
            logging.info("removed %s from %s: left by a save that a killed task cut short",
                         ", ".join(leftovers), self.output_dir)
        return path

    def _failed(self, error: BaseException, step: int, final: bool) -> None:
        self.failures += 1
        self.last_failed = True
        removed = remove_partial(self.output_dir)
        reason = os_error(error)
        events.emit("checkpoint_failed", step, directory=self.output_dir, error=reason,
                    failures=self.failures, removed=removed, final=final)
        newest = _newest_name(self.output_dir)
        keep = f"newest checkpoint stays {newest}" if newest else "no checkpoint yet"
        if self.failures >= self.max_failures:
            raise StorageFailure(
                f"checkpoint save at global step {step} failed in {self.output_dir}: {reason}; "
                f"{self.failures} saves in a row failed (--max_checkpoint_failures); {keep}: "
                "free space or make the directory writable, then run the same command again")
        then = ("the run ends without its final checkpoint" if final else
                "training goes on; retrying at the next interval")
        logging.error("checkpoint save at global step %d failed in %s: %s (failure %d of %d in "
                      "a row, --max_checkpoint_failures); %s; %s", step, self.output_dir,
                      reason, self.failures, self.max_failures, keep, then)


class Writes:
    """Best-effort writes of one kind of file (summaries, metrics): a failure is a warning line.

    One line when writes start failing, one when they work again; nothing raises.
    """

    def __init__(self, what: str):
        self.what = what
        self.failing = False

    def run(self, write: Callable[[], object], where: str) -> bool:
        """Calls `write()`; True if it worked."""
        try:
            write()
        except Exception as e:  # noqa: BLE001 - OSError or a TensorFlow error
            if not storage_error(e):
                raise
            if not self.failing:
                logging.warning("could not write %s to %s: %s; training goes on without them "
                                "until writes work again", self.what, where, os_error(e))
            self.failing = True
            return False
        if self.failing:
            logging.info("writing %s to %s works again", self.what, where)
        self.failing = False
        return True


def _newest_name(output_dir: str) -> Optional[str]:
    try:
        with open(os.path.join(output_dir, output_layout.CHECKPOINT_STATE)) as f:
            match = re.search(r'^model_checkpoint_path: "([^"]+)"', f.read(), re.MULTILINE)
    except OSError:
        return None
    return os.path.basename(match.group(1)) if match else None
