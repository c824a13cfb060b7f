"""The arithmetic of the training steps, in one process (no servers): the exact step's
fused small variables give the plain graph's gradients, the counted update stops at the
last step, and local SGD's exchanges add, merge and resync as documented."""

import numpy as np
import one_process
import pytest
import tensorflow as tf

from lowlevel.data import images as data_lib
from lowlevel.models import catalogue as models
from lowlevel.modes import exact, fused_transfer, local_sgd

v1 = tf.compat.v1
CPU = "/device:CPU:0"


def _batch(n=32):
    digits = data_lib.load_digits()
    images = digits.train.images[:n].astype(np.float32) / digits.max_value
    return images, digits.train.labels[:n].astype(np.int64), digits


@pytest.mark.parametrize("model,hidden", [("mlp", (128, 128)), ("cnn", (32,))])
def test_fused_small_variables_give_the_plain_gradients(model, hidden):
    """The exact step's fused transfer of a built-in model (`runtime.step`: the reads
    rewired after the model is built, the gradients concatenated on the worker and split
    on the ps) computes the plain graph's loss and gradients (two graphs, same seed)."""
    images, labels, digits = _batch()
    plain, fused_graph = _gradients(model, hidden, images, labels, digits, fused=False), \
        _gradients(model, hidden, images, labels, digits, fused=True)
    assert set(plain) == set(fused_graph) and len(plain) >= 5
    for name, ga in plain.items():
        np.testing.assert_allclose(fused_graph[name], ga, atol=1e-6, rtol=0, err_msg=name)
        assert np.abs(ga).max() > 0, name  # a real gradient, not two zeros


def _gradients(model, hidden, images, labels, digits, fused: bool) -> dict:
    """{variable name: gradient} of one batch, the variables on a ps and the model on a
    worker; `fused`: read and pushed through `fused_transfer` as the exact step does."""
    ps, worker = "/job:ps/task:0/device:CPU:0", "/job:worker/task:0/device:CPU:0"
    with tf.Graph().as_default() as graph:
        x, y = tf.constant(images), tf.constant(labels)
        with tf.device(ps):  # the variables
            models.build(model, x, digits.num_classes, hidden, 0, None)
        with tf.device(worker):
            loss, _ = models.loss_and_accuracy(
                models.build(model, x, digits.num_classes, hidden, 0, None), y)
            variables = v1.trainable_variables()
            pairs = list(zip(tf.gradients(loss, variables), variables))
        if fused:
            fused_transfer.fuse_reads(graph, variables, worker)
            pairs = fused_transfer.fuse_gradients(pairs, worker)
            assert sum(c.type == "SplitV" for c in graph.get_operations()) >= 2  # fused
        init = v1.global_variables_initializer()
    with one_process.session_without_devices(graph) as sess:
        sess.run(init.name)
        values = sess.run([g.name for g, _ in pairs])
    return {v.op.name: value for (_, v), value in zip(pairs, values)}


def test_counted_update_stops_at_exactly_the_last_step():
    with tf.Graph().as_default():
        global_step = v1.train.get_or_create_global_step()
        w = v1.get_variable("w", initializer=tf.constant([1.0, 2.0]))
        loss = tf.reduce_sum(tf.square(w))
        opt = v1.train.GradientDescentOptimizer(0.1)
        step = exact.counted_update(opt, opt.compute_gradients(loss), global_step, 3)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            assert [int(sess.run(step)) for _ in range(3)] == [1, 2, 3]
            with pytest.raises(tf.errors.OutOfRangeError):
                sess.run(step)
            assert sess.run(global_step) == 3
            # three updates of w <- w - 0.1 * 2w, none after the last step
            np.testing.assert_allclose(sess.run(w), np.array([1.0, 2.0]) * 0.8 ** 3, rtol=1e-6)


class _LocalSGD:
    """One async local-SGD worker on w (2 floats, "on the ps"), loss sum((w - 3)^2)."""

    def __init__(self, period=4, last_step=10):
        self.graph = tf.Graph()
        with self.graph.as_default():
            self.global_step = v1.train.get_or_create_global_step()
            self.copies = local_sgd.LocalCopies(CPU)
            with v1.variable_scope("", custom_getter=self.copies):
                w_local = v1.get_variable("w", initializer=tf.constant([1.0, -1.0]))
            self.w = self.copies.copies[0].shards[0]
            loss = tf.reduce_sum(tf.square(w_local - 3.0))
            self.ops = local_sgd.build(v1.train.GradientDescentOptimizer(0.1),
                                       local_sgd.gradients(loss, self.copies), self.copies,
                                       self.global_step, period, last_step)
            self.other = tf.constant([0.25, 0.5])  # what another worker pushes meanwhile
            self.push_other = self.w.assign_add(self.other)
            self.sess = v1.Session()
            self.sess.run(v1.global_variables_initializer())
            self.sess.run(v1.local_variables_initializer())

    def value(self, name):
        c = self.copies.copies[0]
        return self.sess.run({"w": self.w, "copy": c.copy, "anchor": c.anchor,
                              "diff": c.diff}[name])


def test_local_sgd_send_merge_and_resync_arithmetic():
    s = _LocalSGD()
    w0 = s.value("w")
    np.testing.assert_allclose(s.value("copy"), w0)  # the copy starts from the ps value
    np.testing.assert_allclose(s.value("anchor"), w0)
    for _ in range(3):
        s.sess.run(s.ops.local_step)
    c1 = s.value("copy")
    np.testing.assert_allclose(s.value("w"), w0)  # local steps do not touch the ps
    s.sess.run(s.push_other)
    s.sess.run(s.ops.send)  # pushes c1 - anchor, takes the ps value back
    w1 = s.value("w")
    np.testing.assert_allclose(w1, w0 + np.array([0.25, 0.5]) + (c1 - w0), atol=1e-6)
    np.testing.assert_allclose(s.value("anchor"), w1, atol=1e-6)
    np.testing.assert_allclose(s.value("diff"), w1 - c1, atol=1e-6)  # the other push
    s.sess.run(s.ops.local_step)  # training goes on while the exchange is in flight
    c2 = s.value("copy")
    s.sess.run(s.ops.merge)  # copy + diff: the other worker's push, no step lost
    np.testing.assert_allclose(s.value("copy"), c2 + np.array([0.25, 0.5]), atol=1e-6)
    np.testing.assert_allclose(s.value("anchor"), w1, atol=1e-6)
    s.sess.run(s.ops.local_step)
    c3 = s.value("copy")
    s.sess.run(s.ops.send)  # pushes the two steps taken since the snapshot c1, no more
    np.testing.assert_allclose(s.value("w"), w1 + (c3 - c1 - np.array([0.25, 0.5])),
                               atol=1e-6)
    s.sess.run(s.push_other)
    s.sess.run(s.ops.resync)  # after a failed exchange: the ps value, as it is
    np.testing.assert_allclose(s.value("copy"), s.value("w"), atol=1e-6)
    np.testing.assert_allclose(s.value("anchor"), s.value("w"), atol=1e-6)


def test_local_sgd_claims_blocks_up_to_exactly_the_last_step():
    s = _LocalSGD(period=4, last_step=10)
    claims = [tuple(int(x) for x in s.sess.run(s.ops.claim)) for _ in range(5)]
    assert claims == [(0, 4), (4, 4), (8, 2), (10, 0), (10, 0)]
    assert s.sess.run(s.global_step) == 10


def test_local_sgd_packs_sharded_and_whole_variables_into_one_exchange():
    """Three variables, one of them in 3 shards: one packed push adds each delta to its
    shard and the pull brings back each whole value, in the right place and shape."""
    with tf.Graph().as_default():
        global_step = v1.train.get_or_create_global_step()
        copies = local_sgd.LocalCopies(CPU)
        with v1.variable_scope("", custom_getter=copies):
            k = v1.get_variable("k", initializer=tf.reshape(tf.range(14.0), [7, 2]),
                                partitioner=v1.fixed_size_partitioner(3))
            b = v1.get_variable("b", initializer=tf.constant([1.0, 2.0]))
            s = v1.get_variable("s", initializer=tf.constant(5.0))
        assert [len(c.shards) for c in copies.copies] == [3, 1, 1]
        loss = tf.reduce_sum(k * k) + tf.reduce_sum(b) + s * s
        ops = local_sgd.build(v1.train.GradientDescentOptimizer(0.1),
                              local_sgd.gradients(loss, copies), copies, global_step, 4, 10)
        shards = copies.copies[0].shards
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(v1.local_variables_initializer())
            before = sess.run([k, b, s])
            sess.run(ops.local_step)
            after = sess.run([k, b, s])
            assert sess.run(tf.concat(shards, 0)).tolist() == before[0].tolist()  # ps untouched
            sess.run(ops.send)
            ps_values = sess.run([tf.concat(shards, 0), copies.copies[1].shards[0],
                                  copies.copies[2].shards[0]])
            for got, want in zip(ps_values, after):
                np.testing.assert_allclose(got, want, rtol=1e-6)
            for c, want in zip(copies.copies, after):
                np.testing.assert_allclose(sess.run(c.anchor), want, rtol=1e-6)
                np.testing.assert_allclose(sess.run(c.diff), np.zeros_like(want), atol=1e-6)


def test_a_block_of_local_steps_is_that_many_single_steps():
    """`LocalSGDOps.block` (one run, a while_loop taking a batch per iteration) leaves the
    copy where `block_steps` runs of `local_step` on the same batches leave it."""
    batches = np.arange(40, dtype=np.float32).reshape(20, 2) / 10.0
    results = []
    for use_block in (True, False):
        with tf.Graph().as_default():
            global_step = v1.train.get_or_create_global_step()
            it = v1.data.make_one_shot_iterator(tf.data.Dataset.from_tensor_slices(batches))
            copies = local_sgd.LocalCopies(CPU)

            def loss_on(x):
                with v1.variable_scope("", custom_getter=copies, reuse=v1.AUTO_REUSE):
                    w = v1.get_variable("w", initializer=tf.constant([1.0, -1.0]))
                return tf.reduce_sum(tf.square(w - x))

            ops = local_sgd.build(
                v1.train.AdagradOptimizer(0.1), local_sgd.gradients(loss_on(it.get_next()),
                                                                    copies),
                copies, global_step, 4, 100,
                next_grads=lambda: local_sgd.gradients(loss_on(it.get_next()), copies))
            assert ops.block_steps == 4
            with v1.Session() as sess:
                sess.run(v1.global_variables_initializer())
                sess.run(v1.local_variables_initializer())  # the copy, from w
                if use_block:
                    assert sess.run(ops.block) == 4
                else:
                    for _ in range(4):
                        sess.run(ops.local_step)
                results.append(sess.run([copies.copies[0].copy, it.get_next()]))
    np.testing.assert_allclose(results[0][0], results[1][0], rtol=1e-6)
    np.testing.assert_array_equal(results[0][1], batches[4])  # 4 batches taken, no more
    assert not np.allclose(results[0][0], [1.0, -1.0])  # it trained
