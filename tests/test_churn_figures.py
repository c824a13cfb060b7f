"""The churn benchmark's figures (`benchmarks._churn_figures`) on event records written here.

A run of 100 s at 10 global steps a second: worker1 killed at 40 s (its new session at
48 s), worker2 joining (session at 60 s) and leaving (its `left` at 80.5 s), the run ending
at 100 s. What each figure must be follows from those numbers; the sync case counts the
churn window's batches from the final `sync_queue/aggregated`, not from a run-wide mean.
"""

from __future__ import annotations

import pytest

from benchmarks import _churn_figures

BATCH = 256
KILLS = [{"task": "worker1", "what": "kill", "unix_time": 40.0, "global_step": 400},
         {"task": "worker2", "what": "join", "unix_time": 55.0, "global_step": 550},
         {"task": "worker2", "what": "leave", "unix_time": 80.0, "global_step": 800}]


def _records(after_leave_steps_per_sec: float = 10.0) -> list:
    records = [{"event": "session_ready", "task": "worker0", "unix_time": 0.0},
               {"event": "session_ready", "task": "worker1", "unix_time": 0.0},
               {"event": "started", "task": "worker1", "unix_time": 41.0},
               {"event": "session_ready", "task": "worker1", "unix_time": 48.0},
               {"event": "session_ready", "task": "worker2", "unix_time": 60.0},
               {"event": "left", "task": "worker2", "unix_time": 80.5}]
    step = 0.0
    for tenth in range(1001):  # a progress record every 0.1 s
        t = tenth / 10
        records.append({"event": "progress", "task": "worker0", "unix_time": t,
                        "global_step": round(step), "cpu_secs": 1.0})
        step += (after_leave_steps_per_sec if t >= 80.5 else 10.0) / 10
    records.append({"event": "progress", "task": "worker1", "unix_time": 50.0,
                    "global_step": 500, "cpu_secs": 2.5})
    return sorted(records, key=lambda r: r["unix_time"])


# live workers from the first kill (40 s) to the end (100 s): worker0 60 s, worker1 52 s
# (from its new session), worker2 20 s (its session to the leave)
LIVE_SECS = 60 + 52 + 20


def test_live_worker_seconds_count_each_session_to_its_kill():
    assert _churn_figures.live_worker_secs(_records(), 40.0, 100.0, KILLS) == pytest.approx(
        LIVE_SECS)


def test_async_rates_and_the_bracketed_ratio():
    figures = _churn_figures.rates(_records(), KILLS, BATCH)
    assert figures["steady_per_worker"] == pytest.approx(10 * BATCH / 2, rel=0.01)
    assert figures["churn_per_live_worker"] == pytest.approx(600 * BATCH / LIVE_SECS, rel=0.01)
    assert figures["steady_after_per_worker"] == pytest.approx(10 * BATCH / 2, rel=0.01)
    assert figures["churn_ratio_bracketed"] == pytest.approx(
        figures["churn_ratio_in_run"], rel=0.01)
    # a run that ends faster than it began: the bracket is the mean of both ends
    faster = _churn_figures.rates(_records(after_leave_steps_per_sec=20.0), KILLS, BATCH)
    assert faster["steady_after_per_worker"] == pytest.approx(20 * BATCH / 2, rel=0.02)
    assert faster["churn_ratio_bracketed"] == pytest.approx(
        faster["churn_per_live_worker"] / (15 * BATCH / 2), rel=0.02)


def test_sync_counts_the_churn_window_from_the_aggregated_batches():
    # 1,000 steps: 2 batches a step but the 250 with worker2 in (3 a step): 2,250 batches
    figures = _churn_figures.rates(_records(), KILLS, BATCH, applied=2250)
    assert figures["steady_per_worker"] == pytest.approx(10 * 2 * BATCH / 2, rel=0.01)
    assert figures["churn_per_live_worker"] == pytest.approx(
        (2250 - 2 * 400) * BATCH / LIVE_SECS, rel=0.01)


def test_kill_figures_rescale_and_leave():
    kills = _churn_figures.kill_figures(_records(), [dict(k) for k in KILLS])
    assert kills[0]["rescale_secs"] == pytest.approx(9.0)  # started 41 s, first progress 50 s
    assert kills[0]["rescale_cpu_secs"] == 2.5
    assert kills[2]["left_secs"] == pytest.approx(0.5)
    assert "rescale_secs" not in kills[2]
