"""The churn benchmark's figures from a run's event records (`benchmarks.elastic`).

Pure functions of the records (`lowlevel.events.read_all`) and the schedule's acts, so
`tests/test_churn_figures.py` checks them on records it writes; `benchmarks.elastic`'s
module doc says what each figure means.
"""

from __future__ import annotations


def progress_of(records: list) -> list:
    """[(unix time, global step)] of the `progress` records, by time."""
    return sorted((r["unix_time"], r["global_step"]) for r in records
                  if r["event"] == "progress")


def kill_figures(records: list, kills: list) -> list:
    """Each kill with its resume_secs and (workers) rescale_secs, from the run's `records`
    (`lowlevel.events.read_all`); `kills`: the schedule's acts, {"task", "what",
    "unix_time", "global_step"}, updated in place and returned."""
    progress = progress_of(records)
    for kill in kills:
        since = kill["unix_time"]
        if kill["what"] == "leave":
            left = [r["unix_time"] for r in records if r["task"] == kill["task"]
                    and r["event"] == "left" and r["unix_time"] > since]
            kill["left_secs"] = round(left[0] - since, 2) if left else None
        if kill["task"].startswith("ps"):  # steps resume once the sessions are recovered
            recovered = [r for r in records if r["event"] == "recovered"
                         and since < r["unix_time"] < since + 60]
            since = max([r["unix_time"] for r in recovered] or [since])
            kill["rolled_back_steps"] = kill["global_step"] - min(
                [r["restored_step"] or kill["global_step"] for r in recovered]
                or [kill["global_step"]])
        after = [t for t, _ in progress if t > since]
        kill["resume_secs"] = round(after[0] - kill["unix_time"], 2) if after else None
        if kill["task"].startswith("worker") and kill["what"] != "leave":
            started = [r["unix_time"] for r in records if r["task"] == kill["task"]
                       and r["event"] == "started" and r["unix_time"] > kill["unix_time"]]
            first = [r for r in records if r["task"] == kill["task"]
                     and r["event"] == "progress" and started and r["unix_time"] > started[0]]
            kill["rescale_secs"] = (round(first[0]["unix_time"] - started[0], 2)
                                    if first else None)
            kill["rescale_cpu_secs"] = first[0].get("cpu_secs") if first else None
    return kills


def live_worker_secs(records: list, since: float, until: float, kills: list) -> float:
    """Seconds of live workers in [since, until): each from a session (`session_ready`, or
    `recovered` after a lost one) to its next kill, the intervals of a worker merged."""
    total = 0.0
    for name in sorted({r["task"] for r in records if r["task"].startswith("worker")}):
        starts = sorted(r["unix_time"] for r in records if r["task"] == name
                        and r["event"] in ("session_ready", "recovered"))
        ends = sorted(k["unix_time"] for k in kills if k["task"] == name
                      and k["what"] != "join")
        live_until = since  # the end of the intervals counted so far
        for start in starts:
            end = min([e for e in ends if e > start] or [until])
            begin = max(start, since, live_until)
            total += max(0.0, min(end, until) - begin)
            live_until = max(live_until, end)
    return total


def rates(records: list, kills: list, batch_size: int, applied: "int | None" = None) -> dict:
    """Examples/s per worker before the first kill (2 workers) and, with a leave, after it
    (2 workers again, from 1 s after its `left`); from the first kill to the end, per
    worker (`per_worker`: the reference run, 2 workers throughout) and per live worker.

    `batch_size`: examples a worker batch. A global step applies 1 worker batch in async
    training; in sync, as many as it aggregated: 2 in the windows with 2 live workers, and
    over the churn window
    `applied` - 2 x the step at the first kill, where `applied` is the final checkpoint's
    `sync_queue/aggregated` (worker batches in the model; None: async). Before the first
    kill a step aggregated at most 2, so this counts no batch the window did not apply."""
    progress = progress_of(records)
    first_kill, k = kills[0]["unix_time"], (1 if applied is None else 2)
    before = [(t, s) for t, s in progress if t < first_kill and s >= 200]
    after = [(t, s) for t, s in progress if t >= first_kill]
    steady = _per_worker(before, batch_size * k)
    batches = (after[-1][1] - kills[0]["global_step"] if applied is None
               else applied - k * kills[0]["global_step"])
    examples = batches * batch_size
    per_live = examples / live_worker_secs(records, first_kill, after[-1][0], kills)
    figures = {"steady_per_worker": round(steady, 1),
               "per_worker": round(examples / (after[-1][0] - first_kill) / 2, 1),
               "churn_per_live_worker": round(per_live, 1),
               "churn_ratio_in_run": round(per_live / steady, 3)}
    left = _left_at(records, kills)
    tail = [(t, s) for t, s in progress if left is not None and t >= left + 1.0]
    if len(tail) > 1 and tail[-1][0] - tail[0][0] >= 5.0:
        figures["steady_after_per_worker"] = round(_per_worker(tail, batch_size * k), 1)
        figures["churn_ratio_bracketed"] = round(
            per_live / ((steady + figures["steady_after_per_worker"]) / 2), 3)
    return figures


def _left_at(records: list, kills: list) -> "float | None":
    """The unix time of the `left` event that answered the schedule's leave (None: none)."""
    for kill in kills:
        if kill["what"] == "leave":
            return min([r["unix_time"] for r in records if r["task"] == kill["task"]
                        and r["event"] == "left" and r["unix_time"] > kill["unix_time"]],
                       default=None)
    return None


def _per_worker(window: list, examples_per_step: float) -> float:
    """Examples/s per worker of 2 over `window` [(unix time, global step)]."""
    return ((window[-1][1] - window[0][1]) * examples_per_step
            / (window[-1][0] - window[0][0]) / 2)
