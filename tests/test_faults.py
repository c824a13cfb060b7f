"""lowlevel/runtime/faults.py and probes.answers, in-process: the deadline's retry, its limit, its
words; and the chief's end-of-training wait with ps 0 gone (`shutdown.wait_for_workers`)."""

import socket
import threading
import time

import pytest
import tensorflow as tf

import clusters
from lowlevel import errors
from lowlevel.cluster import probes
from lowlevel.config import TrainConfig
from lowlevel.runtime import faults, shutdown


def listener(reply: bytes | None):
    """A TCP server on loopback that accepts and sends `reply` (None: never a byte)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    held = []

    def serve():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            held.append(conn)
            if reply is not None:
                conn.recv(64)
                conn.sendall(reply)
    threading.Thread(target=serve, daemon=True).start()
    return server, f"127.0.0.1:{server.getsockname()[1]}"


def test_answers_tells_a_frozen_server_from_a_live_one():
    frozen, frozen_addr = listener(None)  # accepts (the kernel does) but never replies
    live, live_addr = listener(b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
    try:
        assert probes.reachable(frozen_addr)
        assert not probes.answers(frozen_addr, 0.3)
        assert probes.answers(live_addr, 2.0)
    finally:
        frozen.close()
        live.close()
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    address = f"127.0.0.1:{closed.getsockname()[1]}"
    closed.close()
    assert not probes.answers(address, 0.3)


def test_answers_a_real_tensorflow_server(ports):
    """The HTTP/2 preface gets a reply from TensorFlow's own gRPC server (not only a fake)."""
    address = f"127.0.0.1:{ports(1)[0]}"
    tf.compat.v1.train.Server(tf.compat.v1.train.ClusterSpec({"ps": [address]}),
                              job_name="ps", task_index=0, start=True)
    assert probes.answers(address, 5.0)


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def deadline():
    return tf.errors.DeadlineExceededError(None, None, "Operation timed out.")


def test_watch_retries_until_the_run_completes_and_clears_the_outage():
    clock = Clock()
    watch = faults.FaultWatch("worker1", [], 5.0, 30.0, clock)
    calls = []

    def run(options):
        calls.append(options.timeout_in_ms)
        if len(calls) < 3:
            clock.now += 5.0
            raise deadline()
        return 7

    assert watch.run(run) == 7
    assert calls == [5000, 5000, 5000]
    assert watch.outage.since is None


def test_watch_gives_up_past_the_limit_naming_who_does_not_answer(monkeypatch):
    # Each expiry probes the frozen ps, which never answers: a short probe says so as well
    # as the default 1 s (3 expiries here).
    monkeypatch.setattr(faults, "PROBE_TIMEOUT_SECS", 0.2)
    frozen, address = listener(None)
    try:
        clock = Clock()
        watch = faults.FaultWatch("worker1", [("ps0", address)], 5.0, 12.0, clock)

        def run(options):
            clock.now += 5.0
            raise deadline()

        with pytest.raises(errors.NetworkFault, match=rf"worker1: no step completed for 15 s "
                           rf"\(--fault_timeout_secs=12\); not answering: ps0 at {address}"):
            watch.run(run)
    finally:
        frozen.close()


def test_other_errors_pass_through():
    watch = faults.FaultWatch("worker0", [], 1.0, 10.0, Clock())
    with pytest.raises(tf.errors.UnavailableError):
        watch.run(lambda options: (_ for _ in ()).throw(
            tf.errors.UnavailableError(None, None, "gone")))


def test_a_lost_connection_is_run_again_reported_once_per_interval_until_the_limit(
        monkeypatch):
    """`lost` errors (a script's own session: gRPC's keepalive closed the channel to a
    frozen ps, or a dead ps refuses at once) are run again on the outage clock, one line
    per `REPORT_EVERY_SECS`, and end in NetworkFault at the limit; a run that completes
    ends the outage."""
    lines = []
    monkeypatch.setattr(faults.logging, "warning", lambda *a: lines.append(a[0] % a[1:]))
    clock = Clock()
    watch = faults.FaultWatch("worker1", [], 60.0, 30.0, clock)
    failures = []

    def run(options):
        clock.now += 2.0
        failures.append(clock.now)
        if len(failures) == 8:
            return "ran"
        raise tf.errors.UnavailableError(None, None, "Socket closed\nmore")

    assert watch.run(run, lost=(tf.errors.UnavailableError,)) == "ran"
    assert watch.outage.since is None
    assert len(lines) == 2, lines  # 2 and 12 s into the outage (7 failures)
    assert "step failed (UnavailableError: Socket closed); every peer answers" in lines[0]

    def always_lost(options):
        clock.now += 2.0
        raise tf.errors.UnavailableError(None, None, "ping timeout")

    with pytest.raises(errors.NetworkFault, match=r"no step completed for 30 s"):
        watch.run(always_lost, lost=(tf.errors.UnavailableError,))
    assert len(lines) == 5, lines  # then 2, 12 and 22 s into the second outage


def test_an_input_end_counts_as_lost_only_in_an_outage():
    """`lost_in_outage`: an `OutOfRangeError` after a run the deadline cancelled (an input
    iterator's read was cut) is run again; with no outage under way it is the input's
    end and passes through."""
    clock = Clock()
    watch = faults.FaultWatch("worker0", [], 5.0, 30.0, clock)
    calls = []

    def run(options):
        calls.append(clock.now)
        if len(calls) == 1:
            clock.now += 5.0
            raise deadline()
        if len(calls) == 2:
            raise tf.errors.OutOfRangeError(None, None, "End of sequence")
        return "ran"

    kinds = dict(lost=(tf.errors.UnavailableError,), lost_in_outage=(tf.errors.OutOfRangeError,))
    assert watch.run(run, **kinds) == "ran" and len(calls) == 3
    with pytest.raises(tf.errors.OutOfRangeError):
        watch.run(lambda options: (_ for _ in ()).throw(
            tf.errors.OutOfRangeError(None, None, "End of sequence")), **kinds)


def test_a_retry_deadline_is_what_is_left_of_the_outage_and_it_gives_up_at_the_limit():
    clock = Clock()
    watch = faults.FaultWatch("worker1", [], 5.0, 12.0, clock)
    deadlines = []

    def run(options):  # a silent peer: every run waits its whole deadline
        deadlines.append(options.timeout_in_ms)
        clock.now += options.timeout_in_ms / 1000
        raise deadline()

    with pytest.raises(errors.NetworkFault, match=r"no step completed for 12 s"):
        watch.run(run)
    assert deadlines == [5000, 5000, 2000]  # the outage began with the first run, at 100


def test_a_lost_session_begins_the_outage_at_the_start_of_the_run_that_failed():
    clock = Clock()
    outage = faults.Outage("worker0", [], 30.0, clock)
    watch = faults.FaultWatch("worker0", [], 60.0, 30.0, clock, outage=outage)

    def run(options):  # fails 20 s in; the session's replacement begins the outage
        clock.now += 20.0
        outage.begin()
        assert outage.since == 100.0 and outage.remaining() == 10.0
        clock.now += 10.0
        outage.check()  # the replacement's wait, at the limit

    with pytest.raises(errors.NetworkFault, match=r"worker0: no step completed for 30 s"):
        watch.run(run)
    assert outage.run_started is None


def test_a_session_lost_between_runs_begins_the_outage_when_the_last_run_completed():
    """The loss surfaced outside a run (`should_stop`) or in the next run: the peer stopped
    answering after the last completion, not when that next run began (the clean-clone
    suite saw a worker give up 32 s after the loss, 97 s into the outage, instead of at once)."""
    clock = Clock()
    outage = faults.Outage("worker1", [], 30.0, clock)
    watch = faults.FaultWatch("worker1", [], 600.0, 30.0, clock, outage=outage)
    watch.run(lambda options: 1)  # completes at 100
    clock.now += 65.0  # keepalive closes the channel; the next run replaces the session

    def run(options):
        outage.begin()
        assert outage.since == 100.0
        outage.check()  # 65 s into the outage: past the limit at once

    with pytest.raises(errors.NetworkFault, match=r"worker1: no step completed for 65 s"):
        watch.run(run)


def test_after_the_loop_a_lost_session_begins_its_outage_when_noticed():
    clock = Clock()
    outage = faults.Outage("worker0", [], 30.0, clock)
    watch = faults.FaultWatch("worker0", [], 60.0, 30.0, clock, outage=outage)
    watch.run(lambda options: 1)
    watch.stopped()  # the final save and evaluation run outside the loop
    clock.now += 40.0
    outage.begin()
    assert outage.since == 140.0
    outage.check()


def test_a_completed_run_ends_the_outage_whoever_began_it():
    clock = Clock()
    outage = faults.Outage("worker0", [], 30.0, clock)
    watch = faults.FaultWatch("worker0", [], 60.0, 30.0, clock, outage=outage)
    outage.begin()
    clock.now += 29.0
    assert watch.run(lambda options: 3) == 3
    assert outage.since is None and outage.remaining() == float("inf")
    clock.now += 100.0
    outage.check()  # no outage: nothing to give up on


def test_a_save_inside_a_run_extends_its_allowance_and_only_while_it_lasts():
    """A checkpoint save within a step's run (100 M rows: 13.6 GB) may outlast the step's
    deadline without the watchdog counting the run as overdue."""
    clock = Clock()
    outage = faults.Outage("worker0", [], 30.0, clock)
    watch = faults.FaultWatch("worker0", [], 60.0, 30.0, clock, outage=outage)

    def run(options):
        clock.now += 5.0
        with outage.extended(700.0):
            clock.now += 600.0  # the save, 545 s past the step's deadline
            assert outage.overdue_since(grace_secs=30.0) is None
        assert outage.run_timeout_secs == 60.0  # back to the step's
        assert outage.overdue_since(grace_secs=30.0) == 160.0  # started 100, deadline 60
        return 1

    assert watch.run(run) == 1
    with outage.extended(10.0):  # between runs: nothing to extend
        assert outage.run_timeout_secs is None


def test_a_wait_for_the_restore_with_every_peer_answering_gets_its_allowance_once():
    """Past `--fault_timeout_secs`, a task whose peers all answer is waiting for the chief's
    restore (100 M rows: ~75 s of a 90 s limit): the outage may last the restore's bytes'
    part longer, once; a peer that does not answer, or a small model, gets nothing."""
    live, live_addr = listener(b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
    frozen, frozen_addr = listener(None)
    try:
        clock = Clock()
        outage = faults.Outage("worker1", [("ps0", live_addr), ("worker0", live_addr)], 90.0,
                               clock)
        assert not outage.allow_restore(680.0)  # no outage under way
        outage.begin()
        clock.now += 90.0
        assert outage.remaining() == 0.0
        assert not outage.allow_restore(0.5)  # a model under 20 MB: no allowance
        assert outage.allow_restore(680.0)
        assert outage.limit_secs == 770.0 and outage.remaining() == 680.0
        assert not outage.allow_restore(680.0)  # once per outage
        clock.now += 679.0
        outage.check()
        clock.now += 1.0
        with pytest.raises(errors.NetworkFault, match=r"for 770 s \(--fault_timeout_secs=90, "
                                                      r"\+680 s for a restore\)"):
            outage.check()
        outage.end()  # the next outage starts at the plain limit
        assert outage.limit_secs == 90.0
        stuck = faults.Outage("worker1", [("ps0", live_addr), ("ps1", frozen_addr)], 90.0,
                              clock)
        stuck.begin()
        clock.now += 90.0
        assert not stuck.allow_restore(680.0)  # ps1 frozen: a fault, not a restore
        with pytest.raises(errors.NetworkFault, match=r"not answering: ps1 at "):
            stuck.check()
    finally:
        live.close()
        frozen.close()


def test_abandonable_returns_raises_and_abandons_a_call_that_does_not_return():
    assert faults.abandonable(lambda: 5, lambda: None) == 5
    with pytest.raises(KeyError):
        faults.abandonable(lambda: {}["missing"], lambda: None)
    release = threading.Event()
    limit = time.monotonic() + 0.5

    def guard():
        if time.monotonic() > limit:
            raise errors.NetworkFault("gave up")

    started = time.monotonic()
    try:
        with pytest.raises(errors.NetworkFault, match="gave up"):
            faults.abandonable(release.wait, guard, "blocked")
        assert time.monotonic() - started < 2.0
        assert [t for t in threading.enumerate() if t.name == "blocked"]  # left running
    finally:
        release.set()


def test_abandonable_makes_its_call_in_the_callers_graph():
    graph = tf.Graph()
    with graph.as_default():
        assert faults.abandonable(tf.compat.v1.get_default_graph, lambda: None) is graph


def test_answering_probes_every_address_together_within_its_bound():
    frozen, frozen_addr = listener(None)
    live, live_addr = listener(b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
    try:
        started = time.monotonic()
        result = probes.answering([frozen_addr, live_addr, frozen_addr], 0.5)
        assert time.monotonic() - started < 1.5  # not one bound per address
        assert result == {frozen_addr: False, live_addr: True}
    finally:
        frozen.close()
        live.close()


WATCHDOG_SCRIPT = """
import time
from lowlevel.runtime import faults
outage = faults.Outage("worker1", [], 1.0)
outage.begin()
outage.watchdog(poll_secs=0.1, grace_secs=0.5)
time.sleep(60)  # the main thread stuck in a call with no deadline (it lets go of the GIL)
"""


@pytest.mark.cluster  # a process of its own (TensorFlow's import: seconds)
@pytest.mark.timeout(120)
def test_the_watchdog_ends_a_task_stuck_past_the_limit_with_200_and_its_line():
    _ends_with_200_naming(WATCHDOG_SCRIPT, "worker1")


def _ends_with_200_naming(script: str, task: str) -> None:
    """Runs `script` in a Python process of its own: it must exit 200 well before its 60 s
    sleep, its last line the trainer's for `task`'s NetworkFault."""
    import subprocess
    import sys

    import clusters
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-c", script], cwd=clusters.ROOT,
                            env=clusters.ENV, capture_output=True, text=True, timeout=100)
    assert result.returncode == 200, result.stderr[-2000:]
    assert time.monotonic() - started < 50  # not the 60 s sleep
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"lowlevel.trainer: error: {task}: no step completed for ") and \
        "(exit status 200; retryable: restart this task)" in last, last


STUCK_RUN_SCRIPT = """
import time
from lowlevel.runtime import faults
watch = faults.FaultWatch("worker0", [], step_timeout_secs=0.5, fault_timeout_secs=1.0)
watch.outage.watchdog(poll_secs=0.1, grace_secs=0.5)
watch.run(lambda options: time.sleep(60))  # a run TensorFlow does not end at its deadline
"""


def test_a_run_in_flight_past_its_deadline_is_an_outage_from_the_deadline():
    now = [100.0]
    outage = faults.Outage("worker0", [], 90.0, clock=lambda: now[0])
    assert outage.overdue_since(10.0) is None  # no run, no outage
    outage.run_started, outage.run_timeout_secs = 100.0, 60.0
    now[0] = 170.0  # 70 s in flight: the deadline plus the grace, not past it
    assert outage.overdue_since(10.0) is None
    now[0] = 170.5
    assert outage.overdue_since(10.0) == 160.0
    outage.begin(150.0)  # an outage under way wins
    assert outage.overdue_since(10.0) == 150.0


@pytest.mark.cluster  # a process of its own (TensorFlow's import: seconds)
@pytest.mark.timeout(120)
def test_the_watchdog_ends_a_run_stuck_past_its_deadline_with_200():
    """After a ps restart a step cancelled at its deadline returned only 60 s later
    (TensorFlow's "RunStep still blocked"): no outage had begun, and the chief gave up
    190 s after its last step, past the deadline + --fault_timeout_secs + the grace."""
    _ends_with_200_naming(STUCK_RUN_SCRIPT, "worker0")


def _start_ps(ps: str, workers: list, tmp_path):
    """ps 0 of a cluster of `ps` and `workers` as a real trainer process, once it answers."""
    ps_task = clusters.start(clusters.trainer_argv([ps], workers, "ps", 0), tmp_path / "ps0.log")
    deadline = time.monotonic() + 60
    while not probes.answers(ps, 0.3):
        if time.monotonic() >= deadline or ps_task.poll() is not None:
            ps_task.kill()
            ps_task.wait(10)
            raise AssertionError(clusters.tail(tmp_path / "ps0.log"))
        time.sleep(0.2)
    return ps_task


@pytest.mark.timeout(90)
def test_the_chiefs_end_wait_goes_on_past_a_ps0_that_cannot_be_reached(ports, tmp_path):
    """Protocol step 3 with ps 0 gone (its runs fail with UnavailableError, as right after a
    session recovered from an outage): the chief does not fail the run; it watches the
    workers' exits instead, and a worker that has exited stops being waited for."""
    ps, chief, gone = (f"127.0.0.1:{p}" for p in ports(3))
    ps_task = _start_ps(ps, [chief, gone], tmp_path)
    try:
        spec = tf.compat.v1.train.ClusterSpec({"ps": [ps], "worker": [chief, gone]})
        config = tf.compat.v1.ConfigProto(device_filters=["/job:ps", "/job:worker/task:0"])
        server = tf.compat.v1.train.Server(spec, "worker", 0, config=config, start=True)
        with tf.Graph().as_default():
            channel = shutdown.ShutdownChannel(1)
            with tf.compat.v1.Session(server.target, config=config) as sess:
                sess.run(channel.ended_early)  # the session reaches ps0
                ps_task.kill()
                ps_task.wait(10)
                started = time.monotonic()
                missing = channel.wait_for_workers(  # at the default --shutdown_timeout_secs
                    sess, {1: gone}, TrainConfig().shutdown_timeout_secs)
                waited = time.monotonic() - started
    finally:
        if ps_task.poll() is None:
            ps_task.kill()
            ps_task.wait(10)
    assert missing == {}  # the worker that had exited is not waited for...
    assert waited < 25, waited  # ...once its port refused for GONE_SECS, not to the 60 s


@pytest.mark.timeout(120)
def test_a_report_queue_read_at_short_deadlines_loses_no_report(ports, tmp_path):
    """`shutdown.ReportQueue.take` against a real ps, read in 5 ms waits while another
    session reports 400 indices: every one arrives once. (A dequeue with a 5 ms
    `timeout_in_ms` lost 170 of 2,000 this way: the ps hands the element over, then the
    run is cancelled; at the start barrier's 500 ms it lost a worker's report in CI.)"""
    ps, chief = (f"127.0.0.1:{p}" for p in ports(2))
    ps_task = _start_ps(ps, [chief], tmp_path)
    reports, got = 400, []
    try:
        spec = tf.compat.v1.train.ClusterSpec({"ps": [ps], "worker": [chief]})
        server = tf.compat.v1.train.Server(spec, "worker", 0, start=True)
        with tf.Graph().as_default():
            queue = shutdown.ReportQueue("lowlevel/test_reports", shutdown.ps_device(0))
            with tf.compat.v1.Session(server.target) as reader, \
                    tf.compat.v1.Session(server.target) as writer:
                def report_all():
                    for i in range(reports):
                        queue.report(writer, i)
                        time.sleep(0.001 * (i % 7))
                thread = threading.Thread(target=report_all)
                thread.start()
                until = time.monotonic() + 60
                while len(got) < reports and time.monotonic() < until:
                    got += queue.take(reader, 0.005)
                thread.join(30)
                got += queue.take(reader, 0.5)
    finally:
        ps_task.kill()
        ps_task.wait(10)
    assert sorted(got) == list(range(reports)), (len(got), len(set(got)))
