"""The exit-status table (lowlevel/errors.py), row by row: the launcher's restart
policy as a pure function, and SIGTERM / SIGINT to each role of a real cluster mid-run
(ps, chief, worker, evaluator) ending with 128 + N. The other rows (a peer that never
answers or never resolves: 200; a bad flag: 2; a checkpoint of another model, bad data:
1) are cases of tests/test_bad_input.py."""

import re
import signal
import time

import pytest
import tensorflow as tf

import clusters
from lowlevel import errors
from lowlevel.errors import FAILED, FINISHED, RESTART, RuntimeFailure, UsageError, decide

STEP = re.compile(r"step (\d+)/\d+ \|")


@pytest.mark.parametrize("code,retryable", [
    (0, False), (1, False), (2, False), (127, False),
    (128 + signal.SIGTERM, True), (128 + signal.SIGINT, True), (137, True),
    (errors.TRANSIENT, True), (-signal.SIGKILL, True), (-signal.SIGTERM, True),
])
def test_is_retryable(code, retryable):
    assert errors.is_retryable(code) is retryable


def test_transient_status_reads_as_no_signal():
    # Linux signal numbers stop at 64: 128 + N <= 192 < TRANSIENT <= 255.
    assert 128 + signal.SIGRTMAX < errors.TRANSIENT <= 255
    assert errors.signal_status(signal.SIGTERM) == 143
    assert errors.signal_status(signal.SIGINT) == 130


@pytest.mark.parametrize("error,code", [
    (UsageError("--batch_size=0"), 2),
    (RuntimeFailure("checkpoint of another model"), 1),
    (errors.TransientFailure("ps0 did not answer"), 200),
    (tf.errors.UnavailableError(None, None, "ps gone"), 200),
    (tf.errors.AbortedError(None, None, "session lost"), 200),
    (tf.errors.DeadlineExceededError(None, None, "no reply"), 200),
    (tf.errors.InvalidArgumentError(None, None, "a bug"), 1),
    (ValueError("a bug"), 1),
])
def test_status_of_an_exception(error, code):
    assert errors.status_of(error) == code


def _tf_error(name: str):
    return getattr(tf.errors, name)(None, None, name)


def test_tensorflows_errors_are_classified_by_kind_without_importing_their_module():
    assert errors.tf_error_name(_tf_error("UnavailableError")) == "UnavailableError"
    assert errors.tf_error_name(ValueError("not TensorFlow's")) is None
    assert all(errors.lost_session(_tf_error(n)) for n in errors.LOST_SESSION)
    assert errors.lost_session(errors.NoLiveSession("being recreated"))
    assert not errors.lost_session(_tf_error("InvalidArgumentError"))
    assert all(errors.peer_unreachable(_tf_error(n)) for n in errors.PEER_UNREACHABLE)
    assert not errors.peer_unreachable(_tf_error("ResourceExhaustedError"))
    assert errors.storage_error(_tf_error("ResourceExhaustedError"))
    assert errors.storage_error(OSError(28, "No space left on device"))
    assert not errors.storage_error(_tf_error("UnavailableError"))
    assert errors.run_cancelled(_tf_error("CancelledError"))
    assert errors.run_cancelled(_tf_error("OutOfRangeError"))
    assert not errors.run_cancelled(_tf_error("AbortedError"))
    assert errors.is_runtime_failure(_tf_error("InvalidArgumentError"))
    assert not errors.is_runtime_failure(KeyError("a bug"))
    assert errors.one_line(_tf_error("UnavailableError")) == "UnavailableError: UnavailableError"


@pytest.mark.parametrize("code,restarts,max_restarts,chief_finished,stopping,expected", [
    (0, 0, 0, False, False, FINISHED),
    (143, 0, 2, False, False, RESTART),       # preempted: restart
    (130, 0, 2, False, False, RESTART),
    (-9, 1, 2, False, False, RESTART),        # killed (Popen's -N)
    (200, 0, 1, False, False, RESTART),       # transient failure
    (143, 2, 2, False, False, FAILED),        # restarts used up
    (143, 0, 0, False, False, FAILED),        # no restarts allowed
    (1, 0, 5, False, False, FAILED),          # permanent: never restarted
    (2, 0, 5, False, False, FAILED),          # usage error: never restarted
    (127, 0, 5, False, False, FAILED),
    (143, 0, 0, True, False, FINISHED),       # the run is over: nothing to restart for
    (1, 0, 0, False, True, FINISHED),         # the launcher is stopping every task
])
def test_launcher_restart_policy(code, restarts, max_restarts, chief_finished, stopping,
                                 expected):
    assert decide(code, restarts, max_restarts, chief_finished, stopping) == expected


def _wait_for(path, pattern, timeout_secs, procs):
    deadline = time.monotonic() + timeout_secs
    while time.monotonic() < deadline:
        with open(path) as f:
            if re.search(pattern, f.read()):
                return
        dead = {n: p.returncode for n, p in procs.items() if p.poll() is not None}
        assert not dead, f"exited early: {dead}\n{clusters.tail(path)}"
        time.sleep(0.1)
    pytest.fail(f"no {pattern!r} in {path} within {timeout_secs} s:\n{clusters.tail(path)}")


@pytest.mark.cluster  # starts trainer processes
@pytest.mark.timeout(240)
@pytest.mark.parametrize("first,second", [(signal.SIGTERM, signal.SIGINT),
                                          (signal.SIGINT, signal.SIGTERM)],
                         ids=["worker-chief-SIGTERM_evaluator-ps-SIGINT",
                              "worker-chief-SIGINT_evaluator-ps-SIGTERM"])
def test_a_signal_mid_run_ends_each_role_with_128_plus_n(tmp_path, ports, first, second):
    """worker1, the evaluator, the chief and the ps, in that order, each stopped mid-run."""
    p = ports(3)
    ps, workers = [f"127.0.0.1:{p[0]}"], [f"127.0.0.1:{p[1]}", f"127.0.0.1:{p[2]}"]
    out = tmp_path / "out"
    common = [f"--output_dir={out}", "--train_steps=1000000", "--save_checkpoint_steps=100",
              "--log_every_secs=0.25"]
    roles = {"ps0": ("ps", 0), "worker0": ("worker", 0), "worker1": ("worker", 1),
             "evaluator0": ("evaluator", 0)}
    procs, logs = {}, {}
    try:
        for name, (job, index) in roles.items():
            logs[name] = str(tmp_path / f"{name}.log")
            procs[name] = clusters.start(clusters.trainer_argv(ps, workers, job, index, *common),
                                         logs[name])
        _wait_for(logs["worker1"], STEP.pattern, 150, procs)
        _wait_for(logs["evaluator0"], r"evaluator: step \d+ \|", 120, procs)
        for name, signum in (("worker1", first), ("evaluator0", second), ("worker0", first),
                             ("ps0", second)):
            sent = time.monotonic()
            procs[name].send_signal(signum)
            code = procs[name].wait(timeout=15)
            assert code == 128 + signum, f"{name}: {code}\n{clusters.tail(logs[name])}"
            assert time.monotonic() - sent <= 8.0, name
            if name == "worker0":  # the chief saved a checkpoint of where it stopped
                assert re.search(r"preempted at global step \d+; saved model\.ckpt-\d+",
                                 open(logs[name]).read()), clusters.tail(logs[name])
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert not clusters.leftovers(out)
