"""The data queue (`lowlevel.data.spans`, `--data_sharding=queue`): spans handed out on
a real ps server by fewest passes, a dead worker's span resumed by it or taken over
after its lease, stale batches refused; across a launcher's cluster with a worker and
then the ps SIGKILLed, and with workers joining and leaving a sparseCluster job, every
training line's update is in the final model exactly once per pass of its file (counted
in the checkpoint, `--count_examples`); a checkpoint without the queue resumes with a
fresh one and says so; where the queue does not apply, one line."""

import json
import os
import re
import signal
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

import clusters
from lowlevel import errors, events
from lowlevel.config import TrainConfig
from lowlevel.data import spans
from lowlevel.outputs import checkpoints

v1 = tf.compat.v1



class _Queue:
    """A queue of `num_spans` on a real ps server; its ops run as any worker through feeds."""

    def __init__(self, num_spans: int, lease_secs: float):
        ps, worker = f"127.0.0.1:{clusters.free_port()}", f"127.0.0.1:{clusters.free_port()}"
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
            # the end byte: 10 bytes a line (the resume hint's)
            where = tf.stack([tf.cast(self.span, tf.int64), self.first, self.n,
                              (self.first + self.n) * 10])
            self._check = self.queue.check(self.worker, where)
            self._commit = self.queue.commit(where)
            self._release = self.queue.release(self.worker)
            self._enter = self.queue.enter(self.worker)
            self._commit_by = self.queue.commit(where, self.worker)
            self.pause, self.in_flight, self.resume = self.queue.gate_ops(60.0)
            self.sess = v1.Session(self._servers[1].target)
            self.sess.run(v1.global_variables_initializer())
            self.sess.run(self.queue.local_init())

    def claim(self, worker, finished=-1, lines=0):
        """(span, first line, epoch); `self.taken_over`: whether the claim took it over;
        `self.hint`: the span's resume hint (line, byte)."""
        *claimed, taken_over, line, byte = (int(x) for x in self.sess.run(self._claim, {
            self.worker: worker, self.span: finished, self.n: lines}))
        self.taken_over, self.hint = bool(taken_over), (line, byte)
        return tuple(claimed)

    def check(self, worker, span, first):
        self.sess.run(self._check, {self.worker: worker, self.span: span, self.first: first})

    def commit(self, span, first, n) -> bool:
        return bool(self.sess.run(self._commit, {self.span: span, self.first: first,
                                                 self.n: n}))

    def enter(self, worker):
        self.sess.run(self._enter, {self.worker: worker})

    def commit_by(self, worker, span, first, n) -> bool:
        return bool(self.sess.run(self._commit_by, {self.worker: worker, self.span: span,
                                                    self.first: first, self.n: n}))

    def release(self, worker) -> int:
        return int(self.sess.run(self._release, {self.worker: worker}))

    def state(self, name):
        return self.sess.run(getattr(self.queue, name))


@pytest.mark.timeout(60)
def test_the_save_gate_holds_new_steps_and_waits_for_those_begun():
    """Async consistent cut (`spans.SaveHold`): a step that began before the pause is in
    flight until its commit; one that tries to begin during it is refused (nothing read)
    and leaves no mark; a leaving worker's mark goes with it."""
    q = _Queue(2, lease_secs=3600.0)
    a, first, _ = q.claim(0)
    q.enter(0)
    q.enter(1)  # worker 1 began a step, and died (or left) before its commit
    q.sess.run(q.pause)
    assert list(q.sess.run(q.in_flight)) == [2, 0]
    with pytest.raises(tf.errors.InvalidArgumentError, match=spans.PAUSED):
        q.enter(2)
    assert list(q.sess.run(q.in_flight)) == [2, 0]  # the refused step left no mark
    assert q.commit_by(0, a, first, 5)
    assert q.release(1) == 0 and list(q.sess.run(q.in_flight)) == [0, 0]
    q.sess.run(q.resume)
    q.enter(2)
    assert list(q.sess.run(q.in_flight)) == [1, 0]


@pytest.mark.timeout(60)
def test_a_leaving_workers_span_is_freed_at_once_and_resumes_where_the_model_is():
    q = _Queue(2, lease_secs=3600.0)  # no lease runs out here
    a, _, _ = q.claim(0)
    b, _, _ = q.claim(1)
    assert q.commit(a, 0, 7)
    assert q.claim(2)[0] == -1  # both held
    assert q.release(0) == 1 and q.release(0) == 0  # worker 1's is kept
    assert q.state("owner")[a] == spans.FREE and q.state("owner")[b] == 1
    assert q.claim(2) == (a, 7, 0) and not q.taken_over  # from its committed lines on
    assert q.hint == (7, 70)  # line 7 begins at byte 70: read from there


@pytest.mark.timeout(60)
def test_spans_go_by_fewest_passes_and_a_dead_workers_span_is_resumed_or_taken_over():
    q = _Queue(3, lease_secs=1.0)
    a, first_a, epoch = q.claim(0)
    b, _, _ = q.claim(1)
    assert a != b and first_a == 0 and epoch == 0
    assert q.commit(a, 0, 10) and q.state("offset")[a] == 10
    # a batch whose lines are already in (or that is not the owner's) is refused before
    # its step reserves anything; a commit that slipped past the check is counted
    for worker, first in ((0, 5), (1, 10)):
        with pytest.raises(tf.errors.InvalidArgumentError, match=spans.MOVED_ON):
            q.check(worker, a, first)
    q.check(0, a, 10)
    assert not q.commit(a, 0, 10) and q.state("duplicated")[()] == 1
    assert q.state("offset")[a] == 10
    # read to its end (10 lines): a's pass is complete; the next is the span with fewest
    c, first_c, epoch = q.claim(0, finished=a, lines=10)
    assert c not in (a, b) and (first_c, epoch) == (0, 0)
    assert q.state("passes")[a] == 1 and q.state("owner")[a] == spans.FREE
    # worker 1 dies 4 lines into b; restarted, it takes b back where the model is
    assert q.commit(b, 0, 4)
    assert q.claim(1) == (b, 4, 0) and not q.taken_over
    # worker 0 finishes c and goes on to a second pass at once (no wait for b)
    assert q.commit(c, 0, 6)
    x, first, epoch = q.claim(0, finished=c, lines=6)
    assert x in (a, c) and (first, epoch) == (0, 1)
    assert q.claim(2)[0] == ({a, c} - {x}).pop()
    assert q.claim(3)[0] == -1  # every span held, every lease fresh: wait ...
    time.sleep(1.2)  # ... until their owners have not committed for the lease
    assert q.claim(3) == (b, 4, 0) and q.taken_over  # the fewest passes of the expired
    # the old owner, woken between its check and its commit: its lines go in once, and
    # the new owner's first batch is refused; it claims again and resumes after them
    assert q.commit(b, 4, 3) and q.state("offset")[b] == 7
    with pytest.raises(tf.errors.InvalidArgumentError, match=spans.MOVED_ON):
        q.check(3, b, 4)
    assert q.claim(3) == (b, 7, 0) and not q.taken_over
    # two commits of the same lines (both past the check): the second is counted
    assert q.commit(b, 7, 2) and not q.commit(b, 7, 2)
    assert q.state("duplicated")[()] == 2 and q.state("committed")[()] == 7
    # a refused commit leaves the resume hint at the last batch that went in
    assert not q.commit(b, 2, 1) and q.claim(3) == (b, 9, 0) and q.hint == (9, 90)


def test_line_counts_are_kept_by_size_and_mtime_and_counted_again_when_a_file_changes(
        tmp_path):
    paths = [tmp_path / "a.tsv", tmp_path / "b.tsv"]
    for path, lines in zip(paths, (3, 5)):
        path.write_text("x\n" * lines)
    cache = tmp_path / "line_counts.json"
    assert spans.line_counts([str(p) for p in paths], str(cache)) == [3, 5]
    kept = json.loads(cache.read_text())
    assert [kept[str(p)][2] for p in paths] == [3, 5]
    kept[str(paths[0])][2] = 99  # the cache is believed while size and mtime match ...
    cache.write_text(json.dumps(kept))
    assert spans.line_counts([str(p) for p in paths], str(cache)) == [99, 5]
    with open(paths[0], "a") as f:  # ... and not once the file changed
        f.write("x\n")
    assert spans.line_counts([str(p) for p in paths], str(cache)) == [4, 5]
    assert spans.line_counts([str(p) for p in paths], None) == [4, 5]


def test_the_queue_is_refused_where_it_does_not_apply():
    base = dict(model="wide_deep", dataset="criteo_files", train_files="a", eval_files="b",
                data_sharding="queue")
    for extra, says in (({"sync": True, "embedding": "dynamic"}, "--embedding=dynamic"),
                        ({"communication_period": 4}, "--communication_period"),
                        ({"towers": 2}, "--towers")):
        with pytest.raises(errors.UsageError, match=says):
            TrainConfig(**base, **extra).validate(2)
    with pytest.raises(errors.UsageError, match="criteo_files"):
        TrainConfig(model="wide_deep", dataset="synthetic_ctr", data_sharding="queue").validate()
    TrainConfig(**base, sync=True).validate(2)
    config = TrainConfig(**{**base, "data_sharding": "auto"})
    assert config.span_queue(True, False) and config.span_queue(True, True)
    assert not config.span_queue(False, False)
    dynamic = TrainConfig(**{**base, "data_sharding": "auto", "embedding": "dynamic"})
    assert dynamic.span_queue(True, False) and not dynamic.span_queue(True, True)


def test_graph_rewrites_default_to_off_where_training_reads_from_the_queue():
    """`--graph_rewrites=auto` (the default): Grappler off for a data-queue job (its restarts
    and joins pay Grappler before their first step), TensorFlow's default elsewhere; a
    value given is kept. What each value does to a session: tests/test_cluster.py."""
    queue = TrainConfig(model="wide_deep", dataset="criteo_files", train_files="a",
                        eval_files="b")
    assert queue.graph_rewrites == "auto"
    assert queue.rewrites(True) == "off" and queue.rewrites(False) == "default"
    assert TrainConfig(model="wide_deep", dataset="criteo_files", train_files="a",
                       eval_files="b", sync=True).rewrites(True) == "off"
    static = TrainConfig(model="wide_deep", dataset="criteo_files", train_files="a",
                         eval_files="b", data_sharding="static")
    assert static.rewrites(True) == "default"
    assert TrainConfig(model="mlp").rewrites(True) == "default"
    assert TrainConfig(model="mlp", graph_rewrites="one").rewrites(True) == "one"
    assert TrainConfig(**{**queue.__dict__, "graph_rewrites": "default"}).rewrites(
        True) == "default"


def _make(tmp_path, files=8, rows=16000):
    make = [sys.executable, "-m", "lowlevel.data.make_criteo"]
    for name, flags in (("train", [f"--rows={rows}", f"--files={files}"]),
                        ("test", ["--rows=4000", "--seed=9"])):
        result = clusters.run(make + [f"--output_dir={tmp_path / name}", *flags], timeout=60)
        assert result.returncode == 0, result
    return [f"--train_files={tmp_path / 'train' / '*.tsv'}",
            f"--eval_files={tmp_path / 'test' / '*'}"]


def _assert_once_per_epoch(out, train_dir, passes=1, path=None):
    """The final checkpoint's (or `path`'s) `seen` is each span's passes, plus one on the
    lines of its current pass before its `offset`."""
    reader = tf.train.load_checkpoint(path or checkpoints.latest(str(out)))
    state = {n: reader.get_tensor(f"{spans.SCOPE}/{n}") for n in (
        "seen", "owner", "offset", "passes", "committed_steps", "duplicated_batches")}
    counts = spans.count_lines(sorted(str(p) for p in train_dir.glob("*.tsv")))
    expected, start = np.zeros(sum(counts), np.int64), 0
    for k, n in enumerate(counts):
        expected[start:start + n] = state["passes"][k]
        expected[start:start + state["offset"][k]] += 1
        start += n
    wrong = np.nonzero(state["seen"] != expected)[0]
    assert not len(wrong), (len(wrong), wrong[:10], state["seen"][wrong[:10]], state)
    assert state["passes"].min() >= passes and state["duplicated_batches"] == 0, state
    return state, int(reader.get_tensor("global_step"))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sparse", [False, True], ids=["cluster", "sparseCluster"])
def test_a_restarted_sync_worker_ends_its_predecessors_heartbeat_at_once(sparse):
    """`elastic_sync.end_lease`, from a graph of its own, on a real ps, with the servers and
    session config the runtime gives a worker (on a sparseCluster: a master booted apart,
    the cluster in the config): the worker's entry of the heartbeats the sync step counts
    live workers by is ended, the others' kept; with no heartbeats on the ps (a fresh
    job) it ends nothing and says so by returning False."""
    from lowlevel.cluster.spec import Cluster, Task
    from lowlevel.modes import elastic_sync
    from lowlevel.runtime import server as server_lib
    ps, worker = f"127.0.0.1:{clusters.free_port()}", f"127.0.0.1:{clusters.free_port()}"
    cluster = Cluster((ps,), (None, worker) if sparse else (f"127.0.0.1:1", worker),
                      sparse=sparse)
    ps_task, task = Task("ps", 0), Task("worker", 1)
    server_lib.start(cluster, ps_task, server_lib.session_config(cluster, ps_task))
    config = server_lib.session_config(cluster, task)
    target = server_lib.start(cluster, task, config).target
    devices = ("/job:ps/task:0", "/job:worker/task:1")
    assert not elastic_sync.end_lease(target, 1, *devices, session_config=config)  # none yet
    graph = tf.Graph()
    with graph.as_default(), tf.device(devices[0]), v1.variable_scope(elastic_sync.SCOPE):
        beat = v1.get_variable(elastic_sync.BEAT, initializer=tf.fill(
            [elastic_sync.MAX_WORKERS], tf.constant(1.7e9, tf.float64)), trainable=False,
            use_resource=True, collections=[])  # as `ElasticSync` makes it
        read = beat.read_value()
    with v1.Session(target, graph=graph, config=config) as sess:
        sess.run(beat.initializer)
        assert elastic_sync.end_lease(target, 1, *devices, session_config=config)
        beats = sess.run(read)
    assert beats[1] == 0.0 and beats[0] == beats[2] == 1.7e9, beats[:3]


class _SyncWorker:
    """One worker's sync step (`elastic_sync.ElasticSync`) on a real ps: its graph and its
    session on its own server, a gradient and its batch fed; the span input's part is a
    fed batch position (the queue and the step are the runtime's own)."""

    LINES = 4  # a batch

    def __init__(self, spec, index: int, last_step: int = 100):
        from types import SimpleNamespace
        from lowlevel.modes import elastic_sync
        self.index, self.server = index, v1.train.Server(spec, "worker", index, start=True)
        self.graph = tf.Graph()
        with self.graph.as_default():
            with v1.device("/job:ps/task:0"):
                self.gs = v1.train.get_or_create_global_step()
                self.queue = spans.SpanQueue(2, "/job:ps/task:0", 60.0, seed=7, sync=True)
                self.w = v1.get_variable("w", initializer=tf.zeros([2]), use_resource=True)
            with v1.device(f"/job:worker/task:{index}"):
                self.g = v1.placeholder(tf.float32, [2])
                self.local = v1.placeholder(tf.int64, [])
                self.where = v1.placeholder(tf.int64, [4])
            span_input = SimpleNamespace(queue=self.queue, marked=lambda: self.where)
            self.sync = elastic_sync.ElasticSync(
                span_input, v1.train.GradientDescentOptimizer(1.0), [(self.g, self.w)],
                self.gs, self.local, last_step, cap=None, floor=1, live_secs=60.0,
                worker=index)
            self.push_op, self.tick_op = self.sync.push(), self.sync.tick()
            self.reset_op = self.sync.reset()
            self.claim_op = self.queue.claim(tf.constant(index), tf.constant(-1),
                                             tf.constant(0, tf.int64))
            self.stray = v1.placeholder(tf.int64, [])
            self.leave_token = self.sync.tokens.enqueue(self.stray)
            self.set_accepted = self.sync.accepted.assign(1)
            init = [v1.global_variables_initializer()] if index == 0 else []
            self.init = init + [self.queue.local_init(), self.sync.local_init()]
            self.sess = v1.Session(self.server.target)
        self.span, self.first = -1, 0

    def start(self):
        for op in self.init:
            self.sess.run(op)
        self.span, self.first = (int(x) for x in self.sess.run(self.claim_op)[:2])
        self.tick_op(self.sess)  # live from here (--sync_live_secs 60)

    def push(self, gradient, results: list):
        """Pushes for the global step it reads now; appends the step's result."""
        local = int(self.sess.run(self.gs))
        where = [self.span, self.first, self.LINES, 0]
        results.append(int(self.sess.run(self.push_op, {
            self.g: gradient, self.local: local, self.where: where},
            options=v1.RunOptions(timeout_in_ms=60_000))))
        self.first += self.LINES


def _two_sync_workers():
    """A real ps server and two started `_SyncWorker`s: (the ps server, [worker 0, 1])."""
    ps = f"127.0.0.1:{clusters.free_port()}"
    workers = [f"127.0.0.1:{clusters.free_port()}" for _ in range(2)]
    spec = v1.train.ClusterSpec({"ps": [ps], "worker": workers})
    ps_server = v1.train.Server(spec, "ps", 0, start=True)
    pair = [_SyncWorker(spec, 0), _SyncWorker(spec, 1)]
    for w in pair:
        w.start()
    return ps_server, pair


@pytest.mark.timeout(120)
@pytest.mark.parametrize("left_by", ["a_dead_waiter", "a_restore"])
def test_a_sync_token_nobody_took_does_not_let_one_worker_complete_a_step_alone(left_by):
    """The sync step's tokens (`elastic_sync`, step 4), on a real ps with two workers' graphs
    and sessions: a token left in the queue (a_dead_waiter: a completion's token whose
    worker died waiting; a_restore: a restore's wake-up for an accepted push whose worker
    had died with a ps) must not wake the next worker's push. Before tokens carried their
    step, it did: that push returned at once, the worker pushed again for the same step
    and completed it without the other live worker, whose push was then refused as stale,
    again every step (seen with Grappler off: benchmarks/NOTES.md, twenty-fifth stop).
    Here worker 0's push waits until worker 1's comes, and the step is their mean."""
    import threading
    ps_server, (w0, w1) = _two_sync_workers()  # noqa: F841 - the server serves the test
    if left_by == "a_dead_waiter":  # its step (0) ended with global_step 0 + ... = 0
        w0.sess.run(w0.leave_token, {w0.stray: 0})
    else:  # one push accepted, its worker gone: the restore wakes it (and nobody is there)
        w0.sess.run(w0.set_accepted)
        w0.sess.run(w0.reset_op)  # which also clears the heartbeats: worker 1's next tick
        w1.tick_op(w1.sess)
    results0, results1 = [], []
    pushing = threading.Thread(target=w0.push, args=([1.0, 0.0], results0), daemon=True)
    pushing.start()
    pushing.join(3.0)  # long enough for the push to take a token and return, if it could
    assert results0 == [], ("worker 0's push returned before worker 1 pushed", results0)
    assert int(w0.sess.run(w0.gs)) == 0
    w1.push([0.0, 3.0], results1)
    pushing.join(30.0)
    assert results0 == results1 == [1], (results0, results1)
    # the step is the mean of both gradients (learning rate 1), from these two pushes only
    np.testing.assert_allclose(w0.sess.run(w0.w), [-0.5, -1.5])
    assert int(w0.sess.run(w0.sync.aggregated)) == 2
    for w in (w0, w1):
        w.sess.close()


@pytest.mark.timeout(120)
def test_a_restore_wakes_the_sync_pushes_it_dropped():
    """`elastic_sync.ElasticSync.reset` (a restore's `StepStateReset`), on a real ps: a push
    accepted and waiting for its step is woken (its gradient dropped with the step under
    way), returns the global step unchanged and pushes again; the next step aggregates
    only the pushes made after the restore. Before, the reset's reads raced the step
    state's initializers and could wake nobody (0 tokens for 1 accepted push)."""
    import threading
    ps_server, (w0, w1) = _two_sync_workers()  # noqa: F841 - the server serves the test
    results1 = []
    waiting = threading.Thread(target=w1.push, args=([0.0, 8.0], results1), daemon=True)
    waiting.start()
    deadline = time.monotonic() + 30
    with w0.graph.as_default():
        accepted = w0.sync.accepted.read_value()
    while int(w0.sess.run(accepted)) != 1:  # worker 1's push is in, waiting for worker 0
        assert time.monotonic() < deadline, "worker 1's push was not accepted"
        time.sleep(0.05)
    w0.sess.run(w0.reset_op)
    waiting.join(30.0)
    assert results1 == [0], results1  # woken, the step not taken
    assert int(w0.sess.run(accepted)) == 0 and int(w0.sess.run(w0.gs)) == 0
    for w in (w0, w1):  # the heartbeats went with the step state: each worker's next tick
        w.tick_op(w.sess)
    w1.first -= w1.LINES  # the dropped batch is read again
    pushes = [threading.Thread(target=w.push, args=(g, r), daemon=True)
              for w, g, r in ((w0, [2.0, 0.0], []), (w1, [0.0, 4.0], results1))]
    for t in pushes:
        t.start()
    for t in pushes:
        t.join(30.0)
    assert results1 == [0, 1], results1
    np.testing.assert_allclose(w0.sess.run(w0.w), [-1.0, -2.0])  # without the dropped 8
    assert int(w0.sess.run(w0.sync.aggregated)) == 2
    for w in (w0, w1):
        w.sess.close()


@pytest.mark.cluster
@pytest.mark.timeout(420)
@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
def test_every_line_is_in_the_model_once_per_epoch_across_worker_chief_and_ps_kills(tmp_path,
                                                                                    sync):
    """worker1 SIGKILLed mid-span, then the chief (worker0), then ps0 past a checkpoint: the
    launcher restarts each; every line's updates are in the final model once per epoch."""
    from test_recovery import TRAIN_STEPS, Launch
    files = _make(tmp_path)
    out = tmp_path / "run"
    launch = Launch(out, "--num_ps=1", "--num_workers=2", "--no_isolation", "--model=wide_deep",
                    "--dataset=criteo_files", "--batch_size=64", "--count_examples", *files,
                    *(["--sync"] if sync else []))
    try:
        launch.wait_for_step(600, 150)
        launch.task("worker1").send_signal(signal.SIGKILL)
        launch.wait_for_step(900, 150)
        launch.task("worker0").send_signal(signal.SIGKILL)  # the chief
        launch.wait_for_step(1300, 150)  # past the checkpoint at 1000 the ps restores
        launch.task("ps0").send_signal(signal.SIGKILL)
        code = launch.finish(300)
    finally:
        launch.kill()
    text = launch.text()
    assert code == 0, text[-5000:]
    for task in ("worker1", "worker0", "ps0"):
        assert f"launch: {task} was killed by SIGKILL; restarting it" in text, text[-3000:]
    # sync: each restarted worker ended its own predecessor's heartbeat before building its
    # graph (the variable found by its name in the real graph), and nothing else did
    ended = re.findall(r"\[(worker\d)\] .*sync: worker (\d)'s earlier heartbeat ended", text)
    assert sorted(ended) == ([("worker0", "0"), ("worker1", "1")] if sync else []), ended
    state, step = _assert_once_per_epoch(out, tmp_path / "train")
    assert step == TRAIN_STEPS
    assert "data queue: span" in text and not clusters.leftovers(out)
    # every kept checkpoint is a consistent cut (async: the save gate, `spans.SaveHold`;
    # sync: no step completes while one is written)
    for path in tf.train.get_checkpoint_state(str(out)).all_model_checkpoint_paths:
        kept, kept_step = _assert_once_per_epoch(out, tmp_path / "train", 0, path)
        assert kept_step - 2 <= kept["committed_steps"] <= kept_step, (path, kept)
    if not sync:  # every step was trained from the queue; one a worker died in may not
        assert TRAIN_STEPS - 2 <= state["committed_steps"] <= TRAIN_STEPS, state  # commit
        return
    # sync: each step's update and commit are one; the steps after the restore are in the
    # model, and most aggregated both workers (alone: before the other started, and
    # while a dead worker's heartbeat was within --sync_live_secs, or it restarted)
    reader = tf.train.load_checkpoint(checkpoints.latest(str(out)))
    assert state["committed_steps"] == TRAIN_STEPS, state
    for path in tf.train.get_checkpoint_state(str(out)).all_model_checkpoint_paths:
        kept, kept_step = _assert_once_per_epoch(out, tmp_path / "train", 0, path)
        assert kept["committed_steps"] == kept_step, (path, kept)
    aggregated = int(reader.get_tensor("sync_queue/aggregated"))
    assert 1.5 * TRAIN_STEPS <= aggregated <= 2 * TRAIN_STEPS, aggregated


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
    # a new day of logs: one more file; the model resumes, the queue starts afresh
    result = clusters.run([sys.executable, "-m", "lowlevel.data.make_criteo",
                           f"--output_dir={tmp_path / 'train'}", "--rows=2000", "--seed=5",
                           "--prefix=later"], timeout=60)
    assert result.returncode == 0, result
    third = clusters.run(launch + ["--train_steps=400", "--count_examples"], timeout=150)
    text = third.stdout + third.stderr
    assert third.returncode == 0 and "resuming with a fresh queue" in text, text[-3000:]
    state, step = _assert_once_per_epoch(out, tmp_path / "train", passes=0)
    assert step == 400 and len(state["passes"]) == 5 and state["committed_steps"] == 100


def _sparse(job: str, index: int, address: str, ps: str) -> str:
    """enableDynamicWorker's TF_CONFIG: a task knows the ps and itself only."""
    workers = {str(index): address} if job == "worker" else {}
    return json.dumps({"sparseCluster": {"worker": workers, "ps": [ps]},
                       "task": {"type": job, "index": index}})


def _claims(out, task) -> list:
    return [r for r in events.read_all(str(out)) if r["event"] == "span_claimed"
            and r["task"] == task]


# The join-and-leave run's length: worker1 is killed at step ~650, and its span must
# outlive its 3 s lease before the run ends for another worker to take it over. At
# 1,500 steps an unloaded machine (250-300 async steps/s) ended the run 2.97 s after the
# kill, with the span still worker1's (2026-12-07); 2,500 leave it 6 s at that rate.
JOIN_LEAVE_STEPS = 2500


@pytest.mark.cluster
@pytest.mark.timeout(360)
@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
def test_a_worker_joins_and_another_leaves_a_running_job_and_every_line_is_in_once(tmp_path,
                                                                                   sync):
    """sparseCluster workers (no worker list): worker2 joins mid-run; worker1 is SIGKILLed
    for good right after it claimed a span, which another worker takes over after the
    lease and reads from where the model is. Sync: the steps aggregate the live workers
    (3, then 2 once worker1's heartbeat is older than the default --sync_live_secs)."""
    files = _make(tmp_path)
    out = tmp_path / "out"
    ps = f"127.0.0.1:{clusters.free_port()}"
    flags = ["--model=wide_deep", "--dataset=criteo_files", "--batch_size=64",
             f"--train_steps={JOIN_LEAVE_STEPS}", "--count_examples", "--span_lease_secs=3",
             "--log_every_secs=1", f"--output_dir={out}", *files,
             *(["--sync"] if sync else [])]
    procs = {}

    def start(job, index):
        address = f"127.0.0.1:{clusters.free_port()}" if job == "worker" else ps
        procs[f"{job}{index}"] = clusters.start(
            [sys.executable, "-m", "lowlevel.trainer", *flags], tmp_path / f"{job}{index}.log",
            env={"TF_CONFIG": _sparse(job, index, address, ps)})

    try:
        for job, index in (("ps", 0), ("worker", 0), ("worker", 1)):
            start(job, index)
        _wait_for(lambda: _step(out) >= 300, 150, procs)
        start("worker", 2)  # joins: no task was told of it
        _wait_for(lambda: _step(out) >= 600 and _claims(out, "worker2"), 150, procs)
        held = len(_claims(out, "worker1"))
        _wait_for(lambda: len(_claims(out, "worker1")) > held, 60, procs)
        procs["worker1"].kill()  # leaves, right after it claimed a span
        left, killed, at_kill = _claims(out, "worker1")[-1], time.time(), _step(out)
        # no step waits for it longer than its heartbeat's limit (sync), with room for
        # the step in flight and the progress line's interval. A few steps, not a rate:
        # on a loaded machine the chief's timed save (pausing sync steps' completion) fell
        # in this window once, and steps crawled at 0.4 a second (CI, 2026-11-29).
        others = {n: p for n, p in procs.items() if n != "worker1"}
        _wait_for(lambda: _step(out) > at_kill + 3, 25, others)
        statuses = clusters.wait_all(others, 240)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
    for name, (code, _) in statuses.items():
        assert code == 0, f"{name} exited {code}:\n{clusters.tail(tmp_path / f'{name}.log')}"
    state, step = _assert_once_per_epoch(out, tmp_path / "train")
    assert step == JOIN_LEAVE_STEPS and state["owner"].max() != 1, state  # worker1 holds nothing
    taken = [r for w in ("worker0", "worker2") for r in _claims(out, w)
             if (r["span"], r["epoch"]) == (left["span"], left["epoch"])
             and r["unix_time"] > killed]
    assert taken and taken[0]["taken_over"], (left, taken)
    assert len(_claims(out, "worker2")) >= 2
    if sync:  # 2 or 3 live workers a step (alone only at the start)
        aggregated = tf.train.load_checkpoint(checkpoints.latest(str(out))).get_tensor(
            "sync_queue/aggregated")
        assert 1.8 * step <= aggregated <= 3 * step, aggregated


def _step(out) -> int:
    steps = [r["global_step"] for r in events.read_all(str(out))
             if r["event"] == "progress"]
    return max(steps, default=0)


def _wait_for(condition, timeout_secs: float, procs: dict) -> None:
    deadline = time.monotonic() + timeout_secs
    while time.monotonic() < deadline:
        if condition():
            return
        dead = {n: p.poll() for n, p in procs.items() if p.poll() not in (None, 0)}
        assert not dead, dead
        time.sleep(0.1)
    pytest.fail(f"not within {timeout_secs} s")


@pytest.mark.cluster
@pytest.mark.timeout(420)
@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
def test_the_launcher_resizes_a_running_job_and_every_line_is_in_once(tmp_path, sync):
    """`lowlevel.launch --dynamic_workers`, 1 ps + 1 worker: grown to 3 by the command
    (`--resize=3`), shrunk to 2 by SIGTTOU to the launcher. worker2 stops at a safe point
    and leaves the queue: its span goes to the next claim at once, not after the default
    --span_lease_secs (60 s), and (sync) no step waits the default --sync_live_secs
    (10 s) for it. Every task exits 0; every line is in once per pass."""
    from test_recovery import TRAIN_STEPS, Launch
    files = _make(tmp_path)
    out = tmp_path / "run"
    launch = Launch(out, "--dynamic_workers", "--num_ps=1", "--num_workers=1",
                    "--no_isolation", "--model=wide_deep", "--dataset=criteo_files",
                    "--batch_size=64", "--count_examples", *files,
                    *(["--sync"] if sync else []))
    try:
        launch.wait_for_step(300, 150)
        resized = clusters.run([sys.executable, "-m", "lowlevel.launch", f"--output_dir={out}",
                                "--resize=3"], timeout=150)
        assert resized.returncode == 0, resized
        assert "3 workers (worker0, worker1, worker2)" in resized.stdout, resized
        _wait_for(lambda: _claims(out, "worker2"), 120, {})
        os.kill(launch.proc.pid, signal.SIGTTOU)
        _wait_for(lambda: launch.events("left", "worker2"), 60, {})
        left = launch.events("left", "worker2")[0]
        at = max(r["global_step"] for r in launch.events("progress", until=left["unix_time"]))
        _wait_for(lambda: launch.events("progress", since=left["unix_time"]) and max(
            r["global_step"] for r in launch.events("progress")) > at + 10, 60, {})
        code = launch.finish(300)
    finally:
        launch.kill()
    text = launch.text()
    assert code == 0, text[-5000:]
    for line in ("launch: worker1 joins the job (resize to 3)",
                 "launch: worker2 leaves the job (resize to 2)",
                 "launch: worker2 left the job: exited with status 143 (stopped by SIGTERM)"):
        assert line in text, (line, [t for t in text.splitlines() if "launch:" in t])
    resumed = min(r["unix_time"] for r in launch.events("progress", since=left["unix_time"])
                  if r["global_step"] > at + 10)
    assert resumed - left["unix_time"] < 8.0, (resumed - left["unix_time"])  # < 10 s
    held = _claims(out, "worker2")[-1]
    assert left["spans_freed"] == 1, left
    taken = [r for w in ("worker0", "worker1") for r in _claims(out, w)
             if (r["span"], r["epoch"]) == (held["span"], held["epoch"])
             and r["unix_time"] > left["unix_time"]]
    assert taken and not taken[0]["taken_over"], (held, taken)  # freed, not past a lease
    state, step = _assert_once_per_epoch(out, tmp_path / "train")
    assert step == TRAIN_STEPS and state["owner"].max() < 2, state
    assert not clusters.leftovers(out)


def test_resize_without_a_running_launcher_is_one_line(tmp_path):
    result = clusters.run([sys.executable, "-m", "lowlevel.launch",
                           f"--output_dir={tmp_path}", "--resize=3"], timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result
    assert f"--resize: no launcher with --dynamic_workers is running on {tmp_path}" in \
        result.stderr, result.stderr


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_more_workers_than_files_the_one_left_waiting_ends_with_the_others(tmp_path):
    """3 workers, 2 files: one worker always finds both held (a worker finishing a file
    takes its next in the same claim) and waits; when the others take the last step it
    stops waiting. The lease is longer than the test's timeout: a worker that waited for
    a span to free would fail it."""
    files = _make(tmp_path, files=2, rows=4000)
    out = tmp_path / "out"
    result = clusters.run([sys.executable, "-m", "lowlevel.launch", "--num_ps=1",
                           "--num_workers=3", "--no_isolation", "--model=wide_deep",
                           "--dataset=criteo_files", "--batch_size=64", "--train_steps=300",
                           "--span_lease_secs=1000", f"--output_dir={out}", *files],
                          timeout=240)
    text = result.stdout + result.stderr
    assert result.returncode == 0, text[-4000:]
    assert "every span is being read by another worker" in text, text[-4000:]
    assert clusters.final_metrics(out)["global_step"] == 300


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_a_chief_killed_mid_save_leaves_no_pause_behind(tmp_path):
    """The async save gate stays closed until its save's deadline (110 s for a 1 GB state)
    should the chief die mid-save; the restarted chief's session lifts it
    (`StateSaver.lift`), so the workers train on once it is back, not at the deadline.
    The dead chief's pause is made here: SIGKILL, then the gate closed for 1,000 s; so are
    the files its cut save left (`model.ckpt-1_temp/`), which the new chief's next save
    removes (`storage.CheckpointSaves`)."""
    from test_recovery import TRAIN_STEPS, Launch
    files = _make(tmp_path, files=4, rows=8000)
    out = tmp_path / "run"
    launch = Launch(out, "--num_ps=1", "--num_workers=2", "--no_isolation", "--model=wide_deep",
                    "--dataset=criteo_files", "--batch_size=64", *files)
    try:
        launch.wait_for_step(300, 150)
        ps0 = re.search(r"ps0: server listening on (\S+) ", launch.text()).group(1)
        killed = time.time()
        launch.task("worker0").send_signal(signal.SIGKILL)
        cut = out / "model.ckpt-1_temp"  # what a save the kill cut short leaves
        cut.mkdir()
        (cut / "part-00000-of-00001.data-00000-of-00001").write_bytes(b"\0" * 4096)
        with tf.Graph().as_default(), v1.device("/job:ps/task:0"):
            paused = v1.get_variable(f"{spans.SCOPE}/paused_until", dtype=tf.float64,
                                     shape=[], use_resource=True, collections=[])
            with v1.Session(f"grpc://{ps0}") as sess:
                sess.run(paused.assign(tf.timestamp() + 1000.0))
        procs = {"launcher": launch.proc}
        _wait_for(lambda: launch.events("session_ready", "worker0", killed), 120, procs)
        ready = launch.events("session_ready", "worker0", killed)[0]["unix_time"]
        _wait_for(lambda: launch.events("progress", None, ready), 30, procs)  # not 1,000 s
        code = launch.finish(240)
    finally:
        launch.kill()
    assert code == 0, launch.text()[-5000:]
    assert clusters.final_metrics(out)["global_step"] == TRAIN_STEPS
    assert not cut.exists(), "the restarted chief's saves left a cut save's files"
    assert "left by a save that a killed task cut short" in launch.text()
    assert not clusters.leftovers(out)
