"""The restart budget of a task: its restarts in one run, counted in the run's directory.

Kubernetes' own bounds do not stop a task that keeps failing in a way a restart
cannot fix (a ps whose node keeps losing it, a peer that never answers: exit
200, again and again). The training operator's `backoffLimit` sums the
`restartCount` of its *running* pods' containers, and with `restartPolicy:
ExitCode` it deletes a failed pod and creates a new one, whose count starts at
0: the limit never fires (kubeflow/training-operator v1.9, pkg/core/job.go
`PastBackoffLimit`). So every task counts its own restarts in
`<output_dir>/restarts/<task>.json` and, past `--max_restarts`, exits 1: a
permanent status, on which the operator fails the TFJob and the plain Jobs'
`podFailurePolicy` fails the Job.

What counts as a restart: a start after the task's previous start ended in
anything but success or a preemption (SIGTERM/SIGINT: a drain, a spot
reclaim, a higher-priority pod, which say nothing about the task): a
retryable exit (200), a kill (SIGKILL, an OOM kill, a lost node: the previous
start recorded no end at all). A start of another run does not: the record
holds the run's id (`LOWLEVEL_RUN_ID`: the manifests set it to their Job's uid
or to an id of the generated TFJob, the launcher to its own), and a record of
another run is started afresh; so is the record of a task that finished (exit
0).

A task that ends with a retryable status with no restart left exits 1
instead, saying so; one started with its restarts already spent (the last
start was killed) exits 1 before importing TensorFlow.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Mapping, Optional

from absl import logging

from lowlevel import errors, output_layout
from lowlevel.errors import RestartsSpent

RUN_ID_ENV = "LOWLEVEL_RUN_ID"
PREEMPTED = "preempted"


def path(output_dir: str, task_name: str) -> str:
    """`<output_dir>/restarts/<task_name>.json` (`output_layout.restarts_file`)."""
    return output_layout.restarts_file(output_dir, task_name)


class Budget:
    """One task's record: {"run", "starts", "restarts", "last_end"}.

    `last_end` is null while a start runs (and stays so if it is killed), then its
    exit status, or "preempted".

    Args:
      output_dir: the run's directory; None: nothing is counted.
      task_name: the task's name.
      max_restarts: restarts allowed in one run; None: no bound, and nothing is
        counted or written.
      environ: where `LOWLEVEL_RUN_ID` is read.
    """

    def __init__(self, output_dir: Optional[str], task_name: str,
                 max_restarts: Optional[int], environ: Optional[Mapping[str, str]] = None):
        self.task_name = task_name
        self.max_restarts = max_restarts
        self.path = (path(output_dir, task_name)
                     if output_dir and max_restarts is not None else None)
        self.run_id = (os.environ if environ is None else environ).get(RUN_ID_ENV, "")
        self.record = {"run": self.run_id, "starts": 0, "restarts": 0, "last_end": None}

    @property
    def restarts(self) -> int:
        return self.record["restarts"]

    def _read(self) -> dict:
        try:
            with open(self.path) as f:
                record = json.load(f)
            if isinstance(record, dict) and record.get("run") == self.run_id:
                return {"run": self.run_id, "starts": int(record.get("starts", 0)),
                        "restarts": int(record.get("restarts", 0)),
                        "last_end": record.get("last_end")}
        except (OSError, ValueError, TypeError):
            pass
        return {"run": self.run_id, "starts": 0, "restarts": 0, "last_end": None}

    def _write(self) -> None:
        from lowlevel.outputs import files
        try:
            files.write_json(self.path, self.record)
        except OSError as e:  # a full disk costs the count, not the task
            logging.warning("%s: could not record its restarts in %s: %s", self.task_name,
                            self.path, e.strerror)

    def start(self) -> None:
        """Counts this start.

        Raises:
          RestartsSpent: this start is a restart beyond `max_restarts`.
        """
        if self.path is None:
            return
        record = self._read()
        previous = record["last_end"]
        if record["starts"] and previous not in (0, PREEMPTED):
            record["restarts"] += 1
        record["starts"] += 1
        record["last_end"] = None
        self.record = record
        self._write()
        if self.max_restarts is not None and record["restarts"] > self.max_restarts:
            how = ("its last start was killed (no exit status: SIGKILL, an OOM kill, a lost "
                   "node)" if previous is None else f"its last start exited {previous}")
            raise RestartsSpent(self._spent(how))

    def _spent(self, how: str) -> str:
        return (f"{self.task_name}: restarted {self.restarts} times in this run (--max_restarts="
                f"{self.max_restarts}; {self.path}) and {how}: giving up (permanent: fix the "
                "cause, then delete that file or start a new run)")

    def preempted(self, event: str, global_step=None, fields=None) -> None:
        """An `events` listener: a `preempted` event marks this start's end as a preemption."""
        if event == "preempted" and self.path is not None:
            self.record["last_end"] = PREEMPTED
            self._write()

    def end(self, code: int) -> int:
        """Records this start's exit status; returns the status to exit with: `code`, or 1
        when it is retryable but no restart is left (a preemption always keeps its own)."""
        if self.path is None:
            return code
        if self.record["last_end"] == PREEMPTED and errors.is_retryable(code):
            self._write()
            return code
        if (errors.is_retryable(code) and self.max_restarts is not None
                and self.restarts >= self.max_restarts):
            sys.stderr.write(f"lowlevel.trainer: error: "
                             f"{self._spent(f'now ended with status {code}')}\n")
            code = errors.FAILURE
        self.record["last_end"] = code
        if code == errors.SUCCESS:  # the task's part is done: a later run starts afresh
            self.record = {"run": self.run_id, "starts": 0, "restarts": 0, "last_end": 0}
        self._write()
        return code


_current: Optional[Budget] = None


def begin(output_dir: Optional[str], task_name: str, max_restarts: Optional[int]) -> Budget:
    """Counts this task's start (`Budget.start`) and watches for its preemption.

    Raises:
      RestartsSpent: no restart was left.
    """
    global _current
    from lowlevel import events
    _current = Budget(output_dir, task_name, max_restarts)
    events.add_listener(_current.preempted)
    _current.start()
    return _current


def finish(code: int) -> int:
    """The status this task exits with (`Budget.end`); `code` if no budget was begun."""
    return _current.end(code) if _current is not None else code
