"""Structured events: what each task did, one JSON object per line, for tools to read.

The human log lines are for humans and may change; tools (the launcher's
progress display, the tests, `benchmarks/chaos.py`, `benchmarks/_runners.py`)
read these instead. Every task appends to `<output_dir>/events/<task>.jsonl`
(`worker0.jsonl`, `ps0.jsonl`, `evaluator0.jsonl`; in-process training:
`worker0.jsonl`). A restarted task appends to the same file.

Every record has:

- `event`: one of the names below;
- `task`: the task's name ("worker1", "ps0");
- `unix_time`: when it happened, Unix seconds (float, this machine's clock);
- `global_step`: the global step then (int), or null where the task does not
  know it (a ps; a worker before its session);
- `cpu_secs`: the task's process's CPU time so far (float seconds, user + system, all
  its threads: `time.process_time()`); a task the launcher forked counts from its
  fork, one started as its own program includes its TensorFlow import.

and, per event (fields after the colon):

- `started`: TensorFlow is imported; the task starts its server or graph:
  `schedule` (str), `pid` (int: the task's process, for tools that signal it).
- `serving`: a ps waits for the chief's stop signal.
- `session_ready`: a training task has its first session: `origin` (chief:
  "initialised", "restored" or "adopted"; worker: "ready"), `restored_step`
  (int, when restored, else null); the chief's also `phases` (seconds of the
  set-up's parts: `ready_check`, `restore_run`, `total`;
  `runtime.sessions.ChiefSessionCreator`).
- `start_barrier`: the chief of a fresh communication-reduced async run
  waited for the other workers to be ready (`lowlevel.runtime.start`):
  `waited_secs` (float), `missing` (list of "worker1 at host:port" that were
  not ready within `--start_wait_secs`: they join late).
- `progress`: every `--log_every_secs`, from a step: `loss` (float, the
  batch's), `examples_per_sec` and `steps_per_sec` (floats, all workers,
  since the previous one), `train_steps` (int); with dynamic embedding tables
  also `dynamic_rows` ({shard scope: live rows}).
- `checkpoint_saved`: the chief saved a checkpoint: `path` (file name,
  "model.ckpt-<step>"), `emergency` (bool: saved from the signal thread).
- `checkpoint_failed`: a checkpoint save failed (a full or read-only
  `--output_dir`; `lowlevel.outputs.storage`): `directory` (str), `error` (str, the
  OS error: "No space left on device (ENOSPC)"), `failures` (int, in a row),
  `removed` (list of the partial files removed), `final` (bool: the save at
  the end of training). Written only if the events file can still be
  written (a full disk may have room for a line, not for a checkpoint).
- `fault_noticed`: a session was lost (a task failed), an exchange with the
  ps failed, a run passed `--step_timeout_secs` (`lowlevel.runtime.faults`), a sync
  step waited `--sync_timeout_secs`, or the task gives up after
  `--fault_timeout_secs` (`error` ends with "giving up"): `error` (str),
  `missing` (sync, timed-out runs and the give-up: list of "name at
  host:port" that do not answer), `waited_secs` (timed-out runs and the
  give-up: the outage so far, float seconds).
- `fault_cleared`: a run completed after an outage (runs that passed their
  deadline, or a lost session replaced): `outage_secs` (float).
- `recovered`: a new session replaced one lost to a fault: `origin`,
  `restored_step` (and the chief's `phases`), as for `session_ready`.
- `preempted`: SIGTERM or SIGINT: `signal` ("SIGTERM"/"SIGINT"),
  `checkpoint` (the chief: the checkpoint it saved, else null); from the
  signal thread of a stuck task also `stuck` (true) and `safe` (bool).
- `done`: a training task's loop reached the last step: `local_steps` (int).
- `span_claimed`: a worker took its next span from the data queue
  (`--data_sharding=queue`, `lowlevel.data.spans`): `span` (int, the file's index),
  `first_line` (int, 1-based: where it resumes), `epoch` (int: the span's passes before
  this one), `taken_over` (bool: from
  a worker that had not committed a step for `--span_lease_secs`).
- `left`: a worker stopped by SIGTERM/SIGINT left the data queue
  (`runtime.hooks.LeaveHook`): `spans_freed` (int: the spans it held, now free; in sync
  its heartbeat is cleared too).
- `stopped`: a ps got the chief's stop signal: `served_secs` (float).

Appends are safe with several processes reading: each record is one
`os.write` of a whole line to a file opened with `O_APPEND`, so a reader sees
whole lines (a last line without its newline is still being written: skip it).
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Optional

from lowlevel import output_layout

_lock = threading.Lock()
_sink: Optional[dict] = None  # {"fd": int, "task": str} once `open_log` was called
_failing = False  # the last write failed (a full or read-only disk): warned once
_listeners: list = []  # called with (event, global_step, fields) on every emit


def add_listener(listener) -> None:
    """Calls `listener(event, global_step, fields)` on every `emit` from now on, events file
    or not (`lowlevel.runtime.metrics` counts them; `lowlevel.runtime.restarts` notes a preemption)."""
    _listeners.append(listener)


def open_log(output_dir: Optional[str], task_name: str) -> None:
    """Makes `emit` append to this task's event file from now on (no file without `output_dir`).

    Raises:
      OSError: the events directory cannot be created or the file opened.
    """
    global _sink
    if not output_dir:
        return
    os.makedirs(output_layout.events_dir(output_dir), exist_ok=True)
    fd = os.open(output_layout.events_file(output_dir, task_name), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    with _lock:
        _sink = {"fd": fd, "task": task_name}


def is_open() -> bool:
    """Whether `open_log` has given `emit` a file."""
    return _sink is not None


def emit(event: str, global_step: Optional[int] = None, **fields) -> None:
    """Appends one record; does nothing before `open_log`. Never raises.

    A write that fails (a full or read-only disk) is one warning line, and
    another when writes work again; the records in between are lost.
    """
    global _failing
    for listener in list(_listeners):
        try:
            listener(event, global_step, fields)
        except Exception:  # noqa: BLE001 - a listener never costs the event
            pass
    with _lock:
        if _sink is None:
            return
        record = {"event": event, "task": _sink["task"], "unix_time": round(time.time(), 6),
                  "global_step": None if global_step is None else int(global_step),
                  "cpu_secs": round(time.process_time(), 3), **fields}
        try:
            os.write(_sink["fd"], (json.dumps(record) + "\n").encode())
        except OSError as e:
            if not _failing:
                from absl import logging
                logging.warning("could not write the %s event: %s; events are lost until "
                                "writes work again", event, e)
            _failing = True
            return
        if _failing:
            from absl import logging
            logging.info("writing events works again")
        _failing = False


def read(file_path: str) -> list[dict]:
    """The whole records in one task's event file, oldest first ([] if there is none yet)."""
    try:
        with open(file_path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return []
    records = []
    for line in data.split(b"\n")[:-1]:  # the part after the last newline is unfinished
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records


def read_all(output_dir: str) -> list[dict]:
    """Every task's records, sorted by `unix_time`."""
    directory = output_layout.events_dir(output_dir)
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(".jsonl"))
    except FileNotFoundError:
        return []
    records = [r for n in names for r in read(os.path.join(directory, n))]
    return sorted(records, key=lambda r: r["unix_time"])


class Follower:
    """Reads the records appended to one task's file (or all) since the last call.

    `new()` returns the records that have arrived whole since it was last
    called; it keeps a byte offset per file, so a long run is read once.
    """

    def __init__(self, output_dir: str):
        self._dir = output_layout.events_dir(output_dir)
        self._offsets: dict[str, int] = {}

    def new(self) -> list[dict]:
        try:
            names = sorted(n for n in os.listdir(self._dir) if n.endswith(".jsonl"))
        except FileNotFoundError:
            return []
        out = []
        for name in names:
            file_path = os.path.join(self._dir, name)
            try:
                with open(file_path, "rb") as f:
                    f.seek(self._offsets.get(name, 0))
                    data = f.read()
            except OSError:
                continue
            whole = data[:data.rfind(b"\n") + 1]
            self._offsets[name] = self._offsets.get(name, 0) + len(whole)
            for line in whole.splitlines():
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
        return sorted(out, key=lambda r: r["unix_time"])
