"""Dynamic embedding tables (`lowlevel.models.dynamic_embeddings`): admission, eviction,
collision-free rows, consistent checkpoints under concurrent updates, restore."""

import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

from clusters import ROOT, final_metrics, run, task_events
from lowlevel.data import ctr as ctr_data
from lowlevel.models import dynamic_embeddings as de

v1 = tf.compat.v1
LR, ACC0 = 0.1, 0.1  # the tables' Adagrad learning rate and initial accumulator here
MOVIELENS = os.path.join(ROOT, "data", "ml-100k")


class Harness:
    """A graph with one `DynamicTable`, fed ids and a step, trained on loss = sum of rows."""

    def __init__(self, num_shards=1, dim=4, capacity=16, **options):
        self.graph = tf.Graph()
        with self.graph.as_default():
            self.ids = v1.placeholder(tf.int64, [None])
            self.step = v1.placeholder(tf.int64, [])
            self.table = de.DynamicTable("dyn", dim, [None] * num_shards, capacity, LR,
                                         **options)
            self.rows = self.table.lookup(self.ids, self.step)
            # d loss / d row = 1 per occurrence: each update's gradient is known exactly.
            loss = tf.reduce_sum(self.rows)
            self.train = v1.train.GradientDescentOptimizer(0.1).minimize(loss)
            self.sizes = self.table.sizes()
            self.refused = tf.add_n([s.refused.read_value() for s in self.table.shards])
            self.pending = tf.add_n([s.pending.size() for s in self.table.shards])
            self.exports = [s.export() for s in self.table.shards]
            self.saver = v1.train.Saver(
                de.variables_to_save(v1.global_variables()) + de.saveables(), sharded=True)
            self.init = v1.global_variables_initializer()
        self.session = v1.Session(graph=self.graph, config=v1.ConfigProto(
            intra_op_parallelism_threads=1, inter_op_parallelism_threads=2))
        self.session.run(self.init)

    def step_on(self, ids, step):
        """Looks `ids` up at `step` and trains on them; returns the rows read."""
        rows, _ = self.session.run([self.rows, self.train], {self.ids: ids, self.step: step})
        return rows

    def counts(self):
        sizes, refused, pending = self.session.run([self.sizes, self.refused, self.pending])
        return sizes.tolist(), int(refused), int(pending)

    def snapshot(self) -> dict:
        """{id: (row, accumulator, count, last_seen)} over every shard."""
        found = {}
        for part in self.session.run(self.exports):
            for k, r, a, c, s in zip(part["keys"], part["rows"], part["accumulators"],
                                     part["counts"], part["last_seen"]):
                found[int(k)] = (r, a, int(c), int(s))
        return found


@pytest.fixture
def harness_factory():
    made = []

    def make(**kwargs):
        made.append(Harness(**kwargs))
        return made[-1]
    yield make
    for h in made:
        h.session.close()


@pytest.mark.timeout(120)
def test_admission_and_eviction_counts_on_a_scripted_stream(harness_factory):
    h = harness_factory(admit_after=2, evict_after_steps=3, capacity=3)
    # step: ids -> (live rows, refused, pending) after the step
    script = [
        ([1, 2, 3], ([0], 0, 3)),      # all seen once: pending
        ([1, 2], ([2], 0, 1)),         # 1, 2 reach 2 sightings: rows; 3 still pending
        ([1, 5, 5], ([3], 0, 1)),      # 5 twice in one batch: admitted at once
        ([6, 6, 7, 7], ([3], 2, 3)),   # no free row (capacity 3): 6 and 7 wait, refused
        ([8], ([3], 2, 3)),            # step 4: 3 (seen at 0) unseen for 4 > 3 steps: forgotten
        ([9], ([2], 2, 4)),            # step 5: 2 (seen at 1) unseen for 4 steps: evicted
        ([6], ([1], 2, 3)),            # 6 takes 2's freed row; 1 and 5 (seen at 2) evicted
        ([7], ([2], 2, 2)),            # 7 admitted into a freed row; 8, 9 still pending
    ]
    for step, (ids, expected) in enumerate(script):
        rows = h.step_on(ids, step)
        if step == 0:
            assert (rows == 0).all()  # before admission: the shared default row
        assert h.counts() == expected, (step, ids)
    live = h.snapshot()
    assert sorted(live) == [6, 7]
    assert live[6][2] == 3 and live[7][2] == 3  # sightings, including those while pending
    assert live[6][3] == 6 and live[7][3] == 7  # last seen
    # 7's row was written at admission and updated once (gradient 1 per occurrence).
    init = _initial([7], 4)[0]
    np.testing.assert_allclose(live[7][1], ACC0 + 1.0, rtol=1e-6)
    np.testing.assert_allclose(live[7][0], init - LR / np.sqrt(ACC0 + 1.0), rtol=1e-5)


@pytest.mark.timeout(120)
def test_pending_ids_get_no_update_and_admitted_ones_do(harness_factory):
    h = harness_factory(admit_after=3, num_shards=2)
    first = h.step_on([10, 11], 0)
    second = h.step_on([10, 11], 1)
    np.testing.assert_array_equal(first, 0)
    np.testing.assert_array_equal(second, 0)  # no row yet, nothing learnt on the default
    third = h.step_on([10], 2)  # admitted now: its own row, fresh
    init = _initial([10], 4)
    np.testing.assert_allclose(third, init, rtol=1e-6)
    assert h.counts() == ([1, 0] if de_shard(10, 2) == 0 else [0, 1], 0, 1)


def _initial(ids, dim: int):
    """`de.initial_rows` of `ids` (stddev 0.1, seed 0) as numpy."""
    with tf.Graph().as_default(), v1.Session() as s:
        return s.run(de.initial_rows(tf.constant(ids, tf.int64), dim, 0.1, 0))


def de_shard(i: int, n: int) -> int:
    with tf.Graph().as_default(), v1.Session() as s:
        return int(s.run(de.shard_of(tf.constant([i], tf.int64), n))[0])


@pytest.mark.timeout(300)
def test_a_million_distinct_64_bit_ids_get_a_million_rows(harness_factory):
    n, batch = 1_000_000, 125_000
    rng = np.random.default_rng(27)
    ids = np.unique(rng.integers(-2 ** 63, 2 ** 63 - 1, size=n + 1000, dtype=np.int64))[:n]
    ids = rng.permutation(ids)
    assert ids.size == n
    h = harness_factory(num_shards=2, dim=2, capacity=560_000)
    start = time.monotonic()
    for b in range(0, n, batch):
        h.session.run(h.rows, {h.ids: ids[b:b + batch], h.step: b // batch})
    seconds = time.monotonic() - start
    sizes, refused, pending = h.counts()
    assert sum(sizes) == n and refused == 0 and pending == 0
    assert min(sizes) > 0.49 * n  # the 64-bit mix spreads them evenly
    keys = np.concatenate([p["keys"] for p in h.session.run(h.exports)])
    assert keys.size == n and np.array_equal(np.sort(keys), np.sort(ids))
    print(f"{n} ids admitted in {seconds:.1f} s")


def _expected_row(init, acc):
    """The row after k = round(acc - ACC0) Adagrad updates with gradient 1 from `init`."""
    k = round(float(acc[0]) - ACC0)
    steps = LR / np.sqrt(ACC0 + np.arange(1, k + 1, dtype=np.float64))
    return init - steps.sum(), k


def _inconsistent(keys, rows, accumulators, inits) -> list:
    """Ids whose row is not what its accumulator says it was trained to."""
    bad = []
    for key, row, acc, init in zip(keys, rows, accumulators, inits):
        expected, _ = _expected_row(init.astype(np.float64), acc)
        if not np.allclose(row, expected, atol=1e-4) or not np.allclose(acc, acc[0]):
            bad.append(int(key))
    return bad


def _read_checkpoint(path: str):
    reader = tf.train.load_checkpoint(path)
    parts = {}
    for name in reader.get_variable_to_shape_map():
        if "/-" in name:
            shard, part = name.rsplit("/-", 1)
            parts.setdefault(shard, {})[part] = reader.get_tensor(name)
    return parts


def _train_concurrently(h, stop, errors, seed):
    rng = np.random.default_rng(seed)
    step = 0
    while not stop.is_set():
        try:
            h.step_on(rng.choice(300, size=64, replace=False), step)  # gradient 1 per id
        except Exception as e:  # noqa: BLE001 - reported by the test
            errors.append(e)
            return
        step += 1


@pytest.mark.timeout(300)
def test_checkpoints_under_concurrent_updates_hold_rows_with_their_slots(harness_factory, tmp_path):
    h = harness_factory(num_shards=2, dim=3, capacity=200, admit_after=2, evict_after_steps=20,
                        sweep_every_steps=5)
    stop, errors = threading.Event(), []
    threads = [threading.Thread(target=_train_concurrently, args=(h, stop, errors, s))
               for s in range(2)]
    for t in threads:
        t.start()
    paths = []
    try:
        deadline = time.monotonic() + 60
        while min(h.counts()[0]) < 20 and time.monotonic() < deadline and not errors:
            time.sleep(0.05)  # rows in every shard before the first save
        while len(paths) < 5 and time.monotonic() < deadline and not errors:
            time.sleep(0.15)  # the two threads update hundreds of times meanwhile
            paths.append(h.saver.save(h.session, str(tmp_path / f"ckpt-{len(paths)}")))
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert not errors and not any(t.is_alive() for t in threads)
    assert len(paths) == 5
    with tf.Graph().as_default(), v1.Session() as s:
        ids = v1.placeholder(tf.int64, [None])
        init_of = de.initial_rows(ids, 3, 0.1, 0)
        trained = 0
        for path in paths:
            for shard, part in _read_checkpoint(path).items():
                n = part["keys"].size
                assert n > 0 and len(set(part["keys"].tolist())) == n, shard
                assert all(part[k].shape[0] == n for k in ("rows", "accumulators", "counts",
                                                           "last_seen"))
                inits = s.run(init_of, {ids: part["keys"]})
                assert _inconsistent(part["keys"], part["rows"], part["accumulators"],
                                     inits) == [], (path, shard)
                trained += int((part["accumulators"][:, 0] > ACC0 + 2).sum())
                # the check can fail: rows paired with another snapshot's slots do
        assert trained > 0
        first, last = _read_checkpoint(paths[0]), _read_checkpoint(paths[-1])
        shard = min(first)
        common, i, j = np.intersect1d(first[shard]["keys"], last[shard]["keys"],
                                      return_indices=True)
        mixed = _inconsistent(common, first[shard]["rows"][i], last[shard]["accumulators"][j],
                              s.run(init_of, {ids: common}))
        assert mixed, "rows and slots from different moments should not pass the check"


@pytest.mark.timeout(120)
def test_a_checkpoint_restores_every_part(harness_factory, tmp_path):
    h = harness_factory(num_shards=2, capacity=8, admit_after=2, evict_after_steps=5)
    for step, ids in enumerate([[1, 2, 3, 4], [1, 2, 3], [1, 9], [2, 3, 2]]):
        h.step_on(ids, step)
    before, counts = h.snapshot(), h.counts()
    path = h.saver.save(h.session, str(tmp_path / "ckpt"))
    h.step_on([1, 2, 3, 4, 9, 11], 4)  # changes every part after the save
    assert h.snapshot() != before
    again = harness_factory(num_shards=2, capacity=8, admit_after=2, evict_after_steps=5)
    again.saver.restore(again.session, path)
    after = again.snapshot()
    assert sorted(after) == sorted(before) == [1, 2, 3]
    for key, (row, acc, count, seen) in before.items():
        np.testing.assert_array_equal(after[key][0], row)
        np.testing.assert_array_equal(after[key][1], acc)
        assert after[key][2:] == (count, seen)
    assert again.counts() == counts  # pending ids (4, 9) and their sightings came back
    again.step_on([4], 5)  # 4's second sighting: admitted, as before the save
    assert sum(again.counts()[0]) == 4


@pytest.mark.timeout(120)
def test_free_rows_are_handed_out_once_reused_and_rebuilt_by_a_restore(harness_factory, tmp_path):
    h = harness_factory(capacity=4, evict_after_steps=1)
    h.step_on([1, 2, 3], 0)
    assert h.counts() == ([3], 0, 0)
    h.step_on([3], 2)  # the sweep at step 2: 1 and 2 (seen at 0) evicted, their rows freed
    assert h.counts() == ([1], 0, 0)
    h.step_on([3, 4, 5, 6], 3)  # three free rows for three new ids
    assert h.counts() == ([4], 0, 0)
    h.step_on([3, 4, 5, 6, 7], 3)  # no row left: 7 is refused
    assert h.counts() == ([4], 1, 1)
    rows = sorted(int(r) for r in h.session.run(h.exports)[0]["keys"])
    assert rows == [3, 4, 5, 6]
    path = h.saver.save(h.session, str(tmp_path / "ckpt"))
    again = harness_factory(capacity=5, evict_after_steps=1)
    again.saver.restore(again.session, path)
    again.step_on([3, 4, 5, 6, 8], 4)  # rows 0-3 restored: one free row (of 5), for 8
    assert again.counts() == ([5], 0, 1)  # 7 still pending; the refusals are not saved
    snapshot = again.snapshot()
    assert sorted(snapshot) == [3, 4, 5, 6, 8]
    assert len({r.tobytes() for r, *_ in snapshot.values()}) == 5  # five rows of their own
    again.step_on([9], 4)
    assert again.counts() == ([5], 1, 2)  # full: 9 is refused and waits, no row given twice


def test_string_ids_are_64_bit_and_not_folded():
    with tf.Graph().as_default(), v1.Session() as s:
        words = [f"user-{i}" for i in range(20000)]
        ids = s.run(de.string_ids(tf.constant(words)))
    assert len(set(ids.tolist())) == len(words)
    assert ids.max() > 2 ** 62  # spread over 63 bits, not a small bucket range


@pytest.mark.timeout(120)
def test_lazy_adam_rows_count_their_own_updates(harness_factory):
    h = harness_factory(dim=2, optimizer="adam")
    h.step_on([5], 0)  # admitted and updated (gradient 1)
    h.step_on([5, 5], 1)  # gradient 2 (two occurrences, summed)
    (part,) = h.session.run(h.exports)
    assert part["updates"].tolist() == [2.0]
    m, v, row = 0.0, 0.0, _initial([5], 2)[0].astype(np.float64)
    for t, g in ((1, 1.0), (2, 2.0)):
        m, v = 0.9 * m + 0.1 * g, 0.999 * v + 0.001 * g * g
        row -= LR * np.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t) * m / (np.sqrt(v) + 1e-8)
    np.testing.assert_allclose(part["m"][0], m, rtol=1e-5)
    np.testing.assert_allclose(part["v"][0], v, rtol=1e-5)
    np.testing.assert_allclose(part["rows"][0], row, atol=1e-5)  # float32


@pytest.mark.timeout(120)
def test_two_workers_graphs_reach_the_same_shard_on_a_server():
    """Between-graph replication: graphs that differ (the chief builds more) share one
    shard on the server, so an id admitted by one is found by the other."""
    server = v1.train.Server.create_local_server()
    graphs, outputs = [], []
    for extra in (0, 3):
        graph = tf.Graph()
        with graph.as_default():
            for i in range(extra):  # shifts the node names of what follows
                tf.constant(i, name="MutableHashTable")
            ids = v1.placeholder(tf.int64, [None])
            table = de.DynamicTable("shared", 2, ["/job:localhost/task:0"], 8, LR)
            rows = table.lookup(ids, tf.constant(0, tf.int64))
            graphs.append(graph)
            outputs.append((ids, rows, table.shards[0].export()["keys"],
                            v1.global_variables_initializer()))
    first = v1.Session(server.target, graph=graphs[0])
    second = v1.Session(server.target, graph=graphs[1])
    try:
        first.run(outputs[0][3])
        got = first.run(outputs[0][1], {outputs[0][0]: [42]})
        again = second.run(outputs[1][1], {outputs[1][0]: [42]})
        np.testing.assert_array_equal(got, again)
        assert second.run(outputs[1][2]).tolist() == [42]  # one row, not one per graph
    finally:
        first.close()
        second.close()


def _launch(out, *flags, timeout=900):
    """`python -m lowlevel.launch` (1 ps + 2 workers) to the end; the launcher ends its tasks."""
    return run([sys.executable, "-m", "lowlevel.launch", f"--output_dir={out}",
                *flags], timeout=timeout)


def _checkpoint_shards(out) -> dict:
    """{shard scope: {part: array}} of the newest checkpoint in `out`."""
    return _read_checkpoint(tf.train.latest_checkpoint(str(out)))


@pytest.mark.cluster
@pytest.mark.timeout(600)
def test_dynamic_synthetic_ctr_on_a_cluster_admits_evicts_checkpoints_and_resumes(tmp_path):
    out = tmp_path / "run"
    common = ["--model=wide_deep", "--dataset=synthetic_ctr", "--vocab_size=200000",
              "--embedding=dynamic", "--admit_after=2", "--evict_after_steps=100",
              "--dynamic_capacity=60000", "--save_checkpoint_steps=100", "--hidden_units=32"]
    first = _launch(out, *common, "--train_steps=200", "--log_every_secs=0.25", timeout=400)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    metrics = final_metrics(out)
    rows = metrics["dynamic_rows"]
    assert set(rows) == {"model/wide/weights/shard0", "model/deep/embeddings/shard0"}, rows
    # every worker's progress events, by step: a loaded machine may leave one worker a
    # single event (its first step) while the other runs most of the 200 steps
    progress = sorted((r for task in ("worker0", "worker1")
                       for r in task_events(out, task, "progress")), key=lambda r: r["global_step"])
    assert progress and set(progress[-1]["dynamic_rows"]) == set(rows), progress[-1:]
    first = progress[0]["dynamic_rows"]["model/deep/embeddings/shard0"]
    assert first < rows["model/deep/embeddings/shard0"], (first, rows)  # admitted as it runs
    assert 1000 < rows["model/deep/embeddings/shard0"] <= 60000, rows
    shards = _checkpoint_shards(out)
    for scope, part in shards.items():
        n = part["keys"].size
        assert n > 0 and all(part[k].shape[0] == n for k in ("rows", "accumulators",
                                                             "counts", "last_seen")), scope
        assert (part["counts"] >= 2).all()  # admitted at their 2nd sighting
        assert (part["last_seen"] >= 200 - 100 - 2 * 10).all()  # stale rows were evicted
        assert part["pending_keys"].size > 0  # ids seen once wait
    second = _launch(out, *common, "--train_steps=300", timeout=400)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    resumed = final_metrics(out)
    assert resumed["start_global_step"] == 200 and resumed["global_step"] == 300
    assert resumed["auc"] > 0.55, resumed


@pytest.mark.cluster
@pytest.mark.timeout(900)
def test_dynamic_movielens_with_raw_ids_reaches_auc_078(tmp_path):
    """The static run's target (tests/test_wide_deep.py), with dynamic tables on 1 ps + 2
    workers: the launcher's default MovieLens run, every id admitted at once."""
    got = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "get_movielens"),
                          MOVIELENS], check=False, capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stderr
    out = tmp_path / "run"
    done = _launch(out, "--model=wide_deep", "--dataset=movielens", f"--data_dir={MOVIELENS}",
                   "--embedding=dynamic")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    metrics = final_metrics(out)
    assert metrics["auc"] >= 0.78, metrics
    # every (field, id) of the training split has its row, once; no test id was admitted
    train = ctr_data.load_movielens(MOVIELENS, 100000).train
    distinct = [len(np.unique(column)) for column in (*train.categorical.T, *train.crosses.T)]
    fields = train.categorical.shape[1]
    assert metrics["dynamic_rows"] == {"model/deep/embeddings/shard0": sum(distinct[:fields]),
                                       "model/wide/weights/shard0": sum(distinct)}, metrics


@pytest.mark.cluster
@pytest.mark.timeout(400)
def test_a_killed_ps_comes_back_with_its_shards_from_the_checkpoint(tmp_path):
    """SIGKILL of the only ps after global step `FAULT_AT` (checkpoints every
    `CHECKPOINT_EVERY`, test_recovery's): the launcher restarts it, the chief restores the
    newest checkpoint into the fresh ps (the shards' snapshots: hash tables and rows), and
    the run ends at `TRAIN_STEPS`."""
    import signal

    from test_recovery import FAULT_AT, TRAIN_STEPS, Launch  # its cluster harness
    out = tmp_path / "run"
    launch = Launch(out, "--model=wide_deep", "--dataset=synthetic_ctr", "--vocab_size=20000",
                    "--embedding=dynamic", "--admit_after=2", "--dynamic_capacity=20000",
                    "--hidden_units=16")
    try:
        launch.wait_for_step(FAULT_AT, 200)
        fault_time = time.time()
        launch.task("ps0").send_signal(signal.SIGKILL)
        code = launch.finish(300)
    finally:
        launch.kill()
    assert code == 0, launch.text()[-5000:]
    recovered = launch.events("recovered", "worker0", since=fault_time)
    assert recovered and recovered[0]["origin"] == "restored", launch.events(
        task="worker0", since=fault_time)
    metrics = final_metrics(out)
    assert metrics["global_step"] == TRAIN_STEPS and metrics["auc"] > 0.6, metrics
    for scope, part in _checkpoint_shards(out).items():
        keys = part["keys"]
        assert keys.size == len(set(keys.tolist())) > 0, scope  # one row per id
        assert (part["counts"] >= 2).all(), scope


@pytest.mark.timeout(120)
def test_an_update_goes_to_the_row_its_lookup_read_only_while_the_id_holds_it():
    """The update takes the rows the lookup read (no second search of the index): a row
    given to another id since then, or evicted, is left alone; -1 (no row) gets nothing."""
    with tf.Graph().as_default(), v1.Session() as s:
        shard = de.DynamicShard("s", 2, 2, evict_after_steps=1)
        ids, step = v1.placeholder(tf.int64, [None]), v1.placeholder(tf.int64, [])
        values, rows = shard.lookup(ids, tf.ones_like(ids), step)
        given = v1.placeholder(tf.int64, [None])
        update = shard.apply_gradients(ids, tf.ones([tf.size(ids), 2]), given)
        s.run(v1.global_variables_initializer())

        def table():
            part = s.run(shard.export())
            return {int(k): r.tolist() for k, r in zip(part["keys"], part["rows"])}

        _, (row_a,) = s.run([values, rows], {ids: [7], step: 0})
        before = table()
        s.run(update, {ids: [7], given: [row_a]})  # still 7's: updated
        assert table()[7] != before[7]
        s.run([values, rows], {ids: [8], step: 5})  # 7 unseen for 5 steps: evicted, row free
        after_eviction = table()
        assert 7 not in after_eviction
        s.run(update, {ids: [7], given: [row_a]})  # 7's old row: not its own any more
        assert table() == after_eviction
        _, (row_9,) = s.run([values, rows], {ids: [9], step: 6})  # takes a free row
        held = table()
        s.run(update, {ids: [7, 9], given: [row_9, -1]})  # another id's row; no row
        assert table() == held
