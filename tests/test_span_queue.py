"""The data queue (`lowlevel.data.spans`, `--data_sharding=queue`): spans handed out on
a real ps server, each once an epoch, a dead worker's span resumed by it or taken over
after its lease, stale batches refused; across a launcher's cluster with a worker and
then the ps SIGKILLed, every training line's update is in the final model exactly once
per epoch (counted in the checkpoint, `--count_examples`); a checkpoint without the
queue resumes with a fresh one and says so; where the queue does not apply, one line."""

import socket
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

import clusters
from lowlevel import errors
from lowlevel.config import TrainConfig
from lowlevel.data import spans
from lowlevel.outputs import checkpoints

v1 = tf.compat.v1


def _port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class _Queue:
    """A queue of `num_spans` on a real ps server; its ops run as any worker through feeds."""

    def __init__(self, num_spans: int, lease_secs: float):
        ps, worker = f"127.0.0.1:{_port()}", f"127.0.0.1:{_port()}"
        spec = v1.train.ClusterSpec({"ps": [ps], "worker": [worker]})
        self._servers = [v1.train.Server(spec, "ps", 0, start=True),
                         v1.train.Server(spec, "worker", 0, start=True)]
        self.graph = tf.Graph()
        with self.graph.as_default():
            self.queue = spans.SpanQueue(num_spans, "/job:ps/task:0", lease_secs, seed=7)
            p = v1.placeholder
            self.worker, self.span = p(tf.int32, []), p(tf.int32, [])
            self.first, self.n = p(tf.int64, []), p(tf.int64, [])
            self._claim = self.queue.claim(self.worker, self.span, self.n)
            self._check = self.queue.check(self.worker, tf.cast(self.span, tf.int64), self.first)
            self._commit = self.queue.commit(self.worker, self.span, self.first, self.n)
            self.sess = v1.Session(self._servers[1].target)
            self.sess.run(v1.global_variables_initializer())

    def claim(self, worker, finished=-1, lines=0):
        return tuple(int(x) for x in self.sess.run(self._claim, {
            self.worker: worker, self.span: finished, self.n: lines}))

    def check(self, worker, span, first):
        self.sess.run(self._check, {self.worker: worker, self.span: span, self.first: first})

    def commit(self, worker, span, first, n) -> bool:
        return bool(self.sess.run(self._commit, {self.worker: worker, self.span: span,
                                                 self.first: first, self.n: n}))

    def state(self, name):
        return self.sess.run(getattr(self.queue, name))


@pytest.mark.timeout(60)
def test_spans_go_once_an_epoch_and_a_dead_workers_span_is_resumed_or_taken_over():
    q = _Queue(3, lease_secs=1.0)
    a, first_a, epoch = q.claim(0)
    b, _, _ = q.claim(1)
    assert a != b and first_a == 0 and epoch == 0
    assert q.commit(0, a, 0, 10) and q.state("offset")[a] == 10
    # a batch whose lines are already in (or that is not the owner's) is refused before
    # its step reserves anything; a commit that slipped past the check is counted
    for worker, first in ((0, 5), (1, 10)):
        with pytest.raises(tf.errors.InvalidArgumentError, match=spans.MOVED_ON):
            q.check(worker, a, first)
    q.check(0, a, 10)
    assert not q.commit(0, a, 0, 10) and q.state("duplicated")[()] == 1
    assert q.state("offset")[a] == 10
    # read to its end (10 lines): DONE; the next is the only free one
    c, first_c, _ = q.claim(0, finished=a, lines=10)
    assert c not in (a, b) and first_c == 0 and q.state("owner")[a] == spans.DONE
    # worker 1 dies 4 lines into b; restarted, it takes b back where the model is
    assert q.commit(1, b, 0, 4)
    assert q.claim(1) == (b, 4, 0)
    # worker 0 finishes c: none free, b in flight and its lease fresh: wait ...
    assert q.commit(0, c, 0, 6)
    assert q.claim(0, finished=c, lines=6)[0] == -1
    time.sleep(1.2)  # ... until b's owner has not committed for the lease
    assert q.claim(0) == (b, 4, 0)
    assert not q.commit(1, b, 4, 3)  # the old owner, woken: counted, not applied
    assert q.state("duplicated")[()] == 2 and q.state("offset")[b] == 4
    assert q.commit(0, b, 4, 5)
    # every span DONE: the next claim opens epoch 1, every span unread again
    span, first, epoch = q.claim(0, finished=b, lines=9)
    assert (first, epoch) == (0, 1) and 0 <= span < 3
    assert list(q.state("offset")) == [0, 0, 0]
    assert sorted(q.state("owner")) == sorted([spans.FREE, spans.FREE, 0])
    assert q.state("committed")[()] == 6


def test_the_queue_is_refused_where_it_does_not_apply():
    base = dict(model="wide_deep", dataset="criteo_files", train_files="a", eval_files="b",
                data_sharding="queue")
    for extra, says in (({"sync": True}, "--sync"), ({"communication_period": 4},
                        "--communication_period"), ({"towers": 2}, "--towers")):
        with pytest.raises(errors.UsageError, match=says):
            TrainConfig(**base, **extra).validate(2)
    with pytest.raises(errors.UsageError, match="criteo_files"):
        TrainConfig(model="wide_deep", dataset="synthetic_ctr", data_sharding="queue").validate()
    config = TrainConfig(**{**base, "data_sharding": "auto"})
    assert config.span_queue(True, False) and not config.span_queue(True, True)
    assert not config.span_queue(False, False)


def _make(tmp_path, files=8, rows=16000):
    make = [sys.executable, "-m", "lowlevel.data.make_criteo"]
    for name, flags in (("train", [f"--rows={rows}", f"--files={files}"]),
                        ("test", ["--rows=4000", "--seed=9"])):
        result = clusters.run(make + [f"--output_dir={tmp_path / name}", *flags], timeout=60)
        assert result.returncode == 0, result
    return [f"--train_files={tmp_path / 'train' / '*.tsv'}",
            f"--eval_files={tmp_path / 'test' / '*'}"]


def _assert_once_per_epoch(out, train_dir):
    """The final checkpoint's `seen` is the epochs done, plus one on the lines of this
    epoch whose spans are DONE or before their `offset`."""
    reader = tf.train.load_checkpoint(checkpoints.latest(str(out)))
    state = {n: reader.get_tensor(f"{spans.SCOPE}/{n}") for n in (
        "seen", "owner", "offset", "epoch", "committed_steps", "duplicated_batches")}
    counts = spans.count_lines(sorted(str(p) for p in train_dir.glob("*.tsv")))
    expected, start = np.full(sum(counts), state["epoch"], np.int64), 0
    for k, n in enumerate(counts):
        expected[start:start + (n if state["owner"][k] == spans.DONE else state["offset"][k])] += 1
        start += n
    wrong = np.nonzero(state["seen"] != expected)[0]
    assert not len(wrong), (len(wrong), wrong[:10], state["seen"][wrong[:10]], state)
    assert state["epoch"] >= 1 and state["duplicated_batches"] == 0, state
    return state, int(reader.get_tensor("global_step"))


@pytest.mark.cluster
@pytest.mark.timeout(420)
def test_every_line_is_in_the_model_once_per_epoch_across_a_worker_and_a_ps_kill(tmp_path):
    from test_recovery import TRAIN_STEPS, Launch
    import signal
    files = _make(tmp_path)
    out = tmp_path / "run"
    launch = Launch(out, "--num_ps=1", "--num_workers=2", "--no_isolation", "--model=wide_deep",
                    "--dataset=criteo_files", "--batch_size=64", "--count_examples", *files)
    try:
        launch.wait_for_step(600, 150)
        launch.task("worker1").send_signal(signal.SIGKILL)
        launch.wait_for_step(1300, 150)  # past the checkpoint at 1000 the ps restores
        launch.task("ps0").send_signal(signal.SIGKILL)
        code = launch.finish(300)
    finally:
        launch.kill()
    text = launch.text()
    assert code == 0, text[-5000:]
    for task in ("worker1", "ps0"):
        assert f"launch: {task} was killed by SIGKILL; restarting it" in text, text[-3000:]
    state, step = _assert_once_per_epoch(out, tmp_path / "train")
    assert step == TRAIN_STEPS
    # every step was trained from the queue; one a worker died in may not have committed
    assert TRAIN_STEPS - 2 <= state["committed_steps"] <= TRAIN_STEPS, state
    assert "data queue: span" in text and not clusters.leftovers(out)


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_a_checkpoint_without_the_queue_resumes_with_a_fresh_one(tmp_path):
    files = _make(tmp_path, files=4, rows=8000)
    out = tmp_path / "out"
    launch = [sys.executable, "-m", "lowlevel.launch", "--num_ps=1", "--num_workers=1",
              "--no_isolation", "--model=wide_deep", "--dataset=criteo_files",
              "--batch_size=64", f"--output_dir={out}", *files]
    first = clusters.run(launch + ["--train_steps=150", "--data_sharding=static"], timeout=150)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-2000:]
    second = clusters.run(launch + ["--train_steps=300", "--count_examples"], timeout=150)
    text = second.stdout + second.stderr
    assert second.returncode == 0, text[-5000:]
    assert "has no data queue" in text and "resuming with a fresh queue" in text, text[-3000:]
    state, step = _assert_once_per_epoch(out, tmp_path / "train")
    assert step == 300 and state["committed_steps"] == 150, state  # counted since the resume
