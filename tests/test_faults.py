"""lowlevel/faults.py and probes.answers, in-process: the deadline's retry, its limit, its words."""

import socket
import threading

import pytest
import tensorflow as tf

from lowlevel import faults, probes


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

        with pytest.raises(faults.NetworkFault, match=rf"worker1: no step completed for 15 s "
                           rf"\(--fault_timeout_secs=12\); not answering: ps0 at {address}"):
            watch.run(run)
    finally:
        frozen.close()


def test_other_errors_pass_through():
    watch = faults.FaultWatch("worker0", [], 1.0, 10.0, Clock())
    with pytest.raises(tf.errors.UnavailableError):
        watch.run(lambda options: (_ for _ in ()).throw(
            tf.errors.UnavailableError(None, None, "gone")))
