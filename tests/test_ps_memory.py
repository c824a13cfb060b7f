"""A ps's memory near its state (issue 27): what a save and Adagrad's slots cost, measured.

Each case runs in a process of its own (`_MEASURE`): a 256 MiB `[4M, 16]` table, one sparse
Adagrad step (which puts the table in TensorFlow's copy-on-read mode, as training does),
then two saves and two restores; the process reports its resident memory in MiB (VmRSS
after the step; what the first save and restore left resident; the second save's and
restore's VmHWM after resetting it through /proc/self/clear_refs: the first save also runs
Grappler over the save's graph, ~50 MiB more once). The stock counterparts are measured too, so
each test shows the copy it removes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from lowlevel.models import optimizers
from lowlevel.outputs import checkpoints, chunked_save

v1 = tf.compat.v1
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROWS, DIM = 4 << 20, 16  # 256 MiB of float32
TABLE_MIB = ROWS * DIM * 4 / 2**20

_MEASURE = r"""
import json, os, sys
import tensorflow as tf
from lowlevel.models import optimizers
from lowlevel.outputs import checkpoints, chunked_save
v1 = tf.compat.v1
v1.disable_eager_execution()
rows, dim, stock_adagrad, stock_saver, out = (int(sys.argv[1]), int(sys.argv[2]),
                                              sys.argv[3] == "1", sys.argv[4] == "1", sys.argv[5])

def mib(key):
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith(key + ":")) / 1024

table = v1.get_variable("table", [rows, dim], initializer=v1.truncated_normal_initializer())
opt = (v1.train.AdagradOptimizer if stock_adagrad else optimizers.AdagradOptimizer)(0.1)
step = opt.apply_gradients([(tf.IndexedSlices(tf.ones([4, dim]), tf.constant([0, 5, 9, 11])),
                             table)])
builder = None if stock_saver else chunked_save.ChunkedSaverBuilder(4 << 20)
saver = v1.train.Saver(sharded=True, builder=builder)
with v1.Session() as sess:
    base = mib("VmRSS")
    sess.run(v1.global_variables_initializer())
    sess.run(step)
    trained = mib("VmRSS")
    saver.save(sess, os.path.join(out, "model.ckpt"))  # the first also optimises the graph
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    before_save = mib("VmRSS")
    path = saver.save(sess, os.path.join(out, "model.ckpt"))
    save_peak = mib("VmHWM") - before_save
    saver.restore(sess, path)  # the first also optimises the graph
    kept = mib("VmRSS") - trained
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before_restore = mib("VmRSS")
    saver.restore(sess, path)
    print(json.dumps({"trained": trained - base, "save_peak": save_peak, "kept": kept,
                      "restore_peak": mib("VmHWM") - before_restore}))
"""


def _measure(tmp_path, stock_adagrad: bool, stock_saver: bool) -> dict:
    out = tmp_path / f"ckpt-{int(stock_adagrad)}{int(stock_saver)}"
    out.mkdir()
    proc = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(ROWS), str(DIM), str(int(stock_adagrad)),
         str(int(stock_saver)), str(out)],
        cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2"),
        capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.cluster  # two processes of their own, each ~800 MiB (not an in-process test)
@pytest.mark.timeout(300)
def test_adagrad_slots_hold_one_copy_and_a_save_at_most_one_slice(tmp_path):
    ours = _measure(tmp_path, stock_adagrad=False, stock_saver=False)
    stock = _measure(tmp_path, stock_adagrad=True, stock_saver=True)
    # table + accumulator after a sparse step: 2 x 256 MiB (stock: a third, the dead
    # copy its Const kernel keeps of the accumulator's initial value)
    assert ours["trained"] < 2.3 * TABLE_MIB, ours
    assert stock["trained"] > 2.7 * TABLE_MIB, stock
    # a save: 4 MiB slices one at a time (measured 24 MiB above RSS); stock: the table
    # and accumulator copied whole (2 x 256 MiB). Stock's copy shows either as the second
    # save's peak (as this test first measured it) or, where the first save's copy stays
    # resident, in "kept" (2026-11-27, kernel 6.18: save_peak 8 and kept 809 MiB in three
    # runs out of three), so the two are asserted together.
    assert ours["save_peak"] < 0.25 * TABLE_MIB, ours
    assert stock["save_peak"] + stock["kept"] > 1.5 * TABLE_MIB, stock
    # what a save and a restore leave behind (the first of each, graph optimisation
    # included): measured 69 MiB; 197 with the slices' index ranges folded into kept
    # constants (`chunked_save._opaque`)
    assert ours["kept"] < 0.4 * TABLE_MIB, ours
    # a restore into the trained variables: a slice at a time in place; stock: both read
    # whole before they are assigned (into new memory, or into the resident copy "kept"
    # holds: measured restore peaks of 512, 256 and 0 MiB with kept ~809)
    assert ours["restore_peak"] < 0.25 * TABLE_MIB, ours
    assert stock["restore_peak"] + stock["kept"] > 1.5 * TABLE_MIB, stock


def test_no_full_shape_constant_in_adagrads_slot_initialisers():
    with tf.Graph().as_default() as graph:
        table = v1.get_variable("t", [100000, 16], initializer=v1.zeros_initializer())
        optimizers.make_optimizer("adagrad", 0.1).apply_gradients(
            [(tf.IndexedSlices(tf.ones([2, 16]), tf.constant([1, 2])), table)])
        consts = [op for op in graph.get_operations() if op.type == "Const"]
        assert max(tf.TensorShape(op.get_attr("value").tensor_shape).num_elements()
                   for op in consts) < 1000
        acc = [v for v in v1.global_variables() if v.op.name == "t/Adagrad"]
        assert len(acc) == 1  # the slot keeps TF1's name: checkpoints stay portable
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            assert np.all(sess.run(acc[0]) == np.float32(0.1))


def test_sliced_save_restores_whole_by_slices_and_with_another_partitioning(tmp_path):
    rng = np.random.default_rng(0)
    want = rng.normal(size=(1000, 4)).astype(np.float32)
    with tf.Graph().as_default():
        with v1.variable_scope("m", partitioner=v1.fixed_size_partitioner(2)):
            table = v1.get_variable("t", [1000, 4], initializer=v1.zeros_initializer())
        small = v1.get_variable("s", initializer=np.arange(3.0, dtype=np.float32))
        saver = checkpoints.StateSaver(checkpoints.saved_names(v1.global_variables()),
                                       sharded=True,
                                       builder=chunked_save.ChunkedSaverBuilder(1000))
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            first = np.cumsum([0] + [p.shape[0] for p in table])
            sess.run([p.assign(want[a:b]) for p, a, b in zip(table, first, first[1:])])
            path = saver.save(sess, str(tmp_path / "model.ckpt"))
            sess.run([v.assign(tf.zeros_like(v)) for v in [*table, small]])
            saver.restore(sess, path)
            assert np.array_equal(sess.run(tf.concat(list(table), 0)), want)
    # 2 shards of 500 x 4 floats, 50 rows a slice (800 bytes and 200 of int32 indices):
    # 10 slices each, + the small one
    assert len(list(tmp_path.glob("model.ckpt.data-*"))) == 21
    assert np.array_equal(tf.train.load_variable(path, "m/t"), want)
    with tf.Graph().as_default():  # restored by slices into variables never initialised
        with v1.variable_scope("m", partitioner=v1.fixed_size_partitioner(2)):
            table = v1.get_variable("t", [1000, 4])
        v1.get_variable("s", [3])
        saver = checkpoints.StateSaver(checkpoints.saved_names(v1.global_variables()),
                                       sharded=True,
                                       builder=chunked_save.ChunkedSaverBuilder(1000))
        with v1.Session() as sess:
            saver.restore(sess, path)
            assert np.array_equal(sess.run(tf.concat(list(table), 0)), want)
    with tf.Graph().as_default():
        with v1.variable_scope("m", partitioner=v1.fixed_size_partitioner(3)):
            table = v1.get_variable("t", [1000, 4])
        v1.get_variable("s", [3])
        with v1.Session() as sess:
            v1.train.Saver(checkpoints.saved_names(v1.global_variables())).restore(sess, path)
            assert np.array_equal(sess.run(tf.concat(list(table), 0)), want)


def test_a_checkpoint_is_checked_whole_without_loading_its_large_tensors(tmp_path, monkeypatch):
    """`read_step` reads the small tensors, sizes the large ones' data: a file cut short
    by one byte is found either way, and no large tensor is loaded."""
    monkeypatch.setattr(checkpoints, "WHOLE_READ_MAX_BYTES", 1000)
    with tf.Graph().as_default():
        table = v1.get_variable("t", [1000, 4], initializer=v1.ones_initializer())
        step = v1.train.create_global_step()
        saver = checkpoints.StateSaver(checkpoints.saved_names(v1.global_variables()),
                                       sharded=True,
                                       builder=chunked_save.ChunkedSaverBuilder(1000))
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(step.assign(7))
            path = saver.save(sess, str(tmp_path / "model.ckpt"), global_step=7)
    loaded = []
    real = tf.compat.v1.train.NewCheckpointReader
    monkeypatch.setattr(tf.train, "load_checkpoint", lambda p: _Spy(real(p), loaded))
    assert checkpoints.read_step(path) == 7
    assert "t" not in loaded and "global_step" in loaded  # 16,000 bytes: not loaded
    assert table.shape.num_elements() * 4 > checkpoints.WHOLE_READ_MAX_BYTES
    biggest = max(tmp_path.glob("model.ckpt-7.data-*"), key=lambda f: f.stat().st_size)
    os.truncate(biggest, biggest.stat().st_size - 1)
    with pytest.raises(ValueError, match="hold"):
        checkpoints.read_step(path)


class _Spy:
    """A checkpoint reader that records the names of the tensors read."""

    def __init__(self, reader, loaded: list):
        self._reader, self._loaded = reader, loaded

    def get_tensor(self, name):
        self._loaded.append(name)
        return self._reader.get_tensor(name)

    def __getattr__(self, name):
        return getattr(self._reader, name)


def test_a_save_runs_with_its_own_deadline_not_the_sessions(tmp_path):
    """`StateSaver.save(timeout_secs=...)`: the session's operation timeout (a step's,
    `--step_timeout_secs`) cancelled 100 M-row saves; a save's own deadline does not."""
    with tf.Graph().as_default():
        v1.get_variable("t", [2_000_000, 16], initializer=v1.ones_initializer())  # 128 MB
        saver = checkpoints.StateSaver(checkpoints.saved_names(v1.global_variables()),
                                       sharded=True)
        config = v1.ConfigProto(operation_timeout_in_ms=1)
        (tmp_path / "a").mkdir()
        (tmp_path / "b").mkdir()
        with v1.Session(config=config) as sess:
            sess.run(v1.global_variables_initializer(),
                     options=v1.RunOptions(timeout_in_ms=60_000))
            with pytest.raises(tf.errors.DeadlineExceededError):
                saver.save(sess, str(tmp_path / "a" / "model.ckpt"))
            path = saver.save(sess, str(tmp_path / "b" / "model.ckpt"), timeout_secs=60.0)
    assert tf.train.load_variable(path, "t").sum() == 2_000_000 * 16
