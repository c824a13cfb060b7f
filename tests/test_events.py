"""lowlevel.events: records are whole JSON lines, appended safely by several processes while
others read (no processes of the trainer: plain forked writers)."""

import multiprocessing
import time

import pytest

from lowlevel import events, output_layout

WRITERS, RECORDS = 4, 400


def _write(output_dir, index):
    events.open_log(output_dir, "worker0")  # all writers on one file: the worst case
    for i in range(RECORDS):
        events.emit("progress", i, writer=index, padding="x" * (i % 50))


def test_records_carry_the_common_fields(tmp_path):
    events.open_log(str(tmp_path), "ps3")
    try:
        before, cpu = time.time(), time.process_time()
        events.emit("serving")
        sum(i * i for i in range(300_000))  # some CPU between the two records
        events.emit("progress", 7, loss=0.5)
        records = events.read(output_layout.events_file(str(tmp_path), "ps3"))
    finally:
        events._sink = None  # noqa: SLF001 - leave no sink to later tests
    assert [r["event"] for r in records] == ["serving", "progress"]
    assert all(r["task"] == "ps3" and before <= r["unix_time"] <= time.time() for r in records)
    assert records[0]["global_step"] is None and records[1]["global_step"] == 7
    assert records[1]["loss"] == 0.5
    # cpu_secs is rounded to 1 ms, either way
    assert cpu - 0.001 <= records[0]["cpu_secs"] < records[1]["cpu_secs"] \
        <= time.process_time() + 0.001


def test_emit_without_a_log_does_nothing(tmp_path):
    events.emit("progress", 1)  # no open_log in this process: no file, no error
    assert events.read_all(str(tmp_path)) == []


@pytest.mark.timeout(60)
def test_concurrent_writers_and_a_follower_see_only_whole_lines(tmp_path):
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_write, args=(str(tmp_path), k)) for k in range(WRITERS)]
    follower, seen = events.Follower(str(tmp_path)), []
    for p in procs:
        p.start()
    deadline = time.monotonic() + 50
    while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
        seen += follower.new()  # reads while the writers append
        time.sleep(0.001)
    for p in procs:
        p.join(5)
        assert p.exitcode == 0
    seen += follower.new()
    assert len(seen) == WRITERS * RECORDS  # every line whole, none read twice
    for k in range(WRITERS):
        steps = [r["global_step"] for r in seen if r["writer"] == k]
        assert sorted(steps) == list(range(RECORDS))
    assert len(events.read_all(str(tmp_path))) == WRITERS * RECORDS
