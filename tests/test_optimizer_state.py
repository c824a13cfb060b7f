"""lowlevel/modes/optimizer_state.py in-process: the twins load after the local init."""

import numpy as np
import pytest
import tensorflow as tf

from lowlevel.modes import optimizer_state

v1 = tf.compat.v1


def _ancestors(op) -> set:
    seen, todo = set(), [op]
    while todo:
        node = todo.pop()
        for parent in [t.op for t in node.inputs] + list(node.control_inputs):
            if parent not in seen:
                seen.add(parent)
                todo.append(parent)
    return seen


def test_the_loaded_slots_are_assigned_after_the_local_init_and_keep_the_twins_values():
    """Before, the loads and the local variables' initializer ran in one group with no order
    between them: the initializer could overwrite a loaded Adagrad accumulator with 0.1 (a
    resumed communication-reduced run saved fresh accumulators, in the clean-clone suite)."""
    with tf.Graph().as_default():
        slots = [v1.get_variable(f"model/w{i}/local/Adagrad", [256], use_resource=True,
                                 initializer=v1.constant_initializer(0.1),
                                 collections=[v1.GraphKeys.LOCAL_VARIABLES]) for i in range(8)]
        copies = {f"model/w{i}/local": (f"model/w{i}", "") for i in range(8)}
        mirrors = optimizer_state.Mirrors(slots, copies, "")
        init = tf.group(v1.local_variables_initializer())
        load = mirrors.load_state(after=init)
        initializers = {s.initializer for s in slots}
        handles = {s.handle.op for s in slots}
        assigns = [op for op in _ancestors(load) if op.type == "AssignVariableOp"
                   and op.inputs[0].op in handles and op not in initializers]
        assert len(assigns) == 8, [op.name for op in assigns]
        for op in assigns:
            assert initializers & _ancestors(op), op.name  # ordered after the init
        assert sorted(mirrors.names) == sorted(f"model/w{i}/Adagrad" for i in range(8))
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            sess.run([twin.assign(tf.fill([256], 7.0)) for twin in mirrors.names.values()])
            for _ in range(20):
                sess.run(load)
                assert all(np.all(value == 7.0) for value in sess.run(slots))


def test_keras_named_slots_of_a_copy_are_saved_under_the_model_variables_name():
    """A canned estimator's slot of a copy, `training/Adagrad/<copy>/accumulator`, is 2.15's
    `training/Adagrad/<model variable>/accumulator` in checkpoints, placed beside it (before,
    only "<copy>/<slot>" was renamed: a communication-reduced checkpoint of a canned estimator
    would not have resumed 2.15's, nor 2.15's it)."""
    copies = {"dnn/logits/kernel/local": ("dnn/logits/kernel", "/job:ps/task:1")}
    name = "training/Adagrad/dnn/logits/kernel/local/accumulator"
    assert optimizer_state._checkpoint_name(name, copies) == \
        "training/Adagrad/dnn/logits/kernel/accumulator"
    assert optimizer_state._checkpoint_name("dnn/logits/kernel/local/Adagrad", copies) == \
        "dnn/logits/kernel/Adagrad"
    assert optimizer_state._checkpoint_name("training/Adagrad/learning_rate", copies) == \
        "training/Adagrad/learning_rate"
    with tf.Graph().as_default():
        slot = v1.get_variable(name, [3], use_resource=True,
                               collections=[v1.GraphKeys.LOCAL_VARIABLES])
        mirrors = optimizer_state.Mirrors([slot], copies, "/job:ps/task:0")
        assert mirrors.names["training/Adagrad/dnn/logits/kernel/accumulator"].device == \
            "/job:ps/task:1"


def test_additive_slots_by_optimizer():
    """Adagrad's and FTRL's accumulating slots are shared; Momentum's and Adam's decay and are
    not (`local_sgd.ADDITIVE_SLOTS`); a canned wide & deep's `Combined` answers per part."""
    from lowlevel.estimator.canned import optimizers as canned
    from lowlevel.modes import local_sgd
    with tf.Graph().as_default():
        var = v1.get_variable("w", [2], use_resource=True)
        other = v1.get_variable("b", [2], use_resource=True)
        assert local_sgd.additive_slot_names(v1.train.AdagradOptimizer(0.1), var) == \
            ("accumulator",)
        assert local_sgd.additive_slot_names(v1.train.FtrlOptimizer(0.1), var) == \
            ("accum", "linear")
        assert local_sgd.additive_slot_names(v1.train.MomentumOptimizer(0.1, 0.9), var) == ()
        assert local_sgd.additive_slot_names(v1.train.AdamOptimizer(0.1), var) == ()
        combined = canned.Combined([(canned.Ftrl(0.1), [var]), (canned.Adam(0.1), [other])])
        assert combined.additive_slot_names(var) == ("accumulator", "linear")
        assert combined.additive_slot_names(other) == ()


def _worker_graph(task: int, grads: list, period: int, opt_fn):
    """Worker `task`'s graph of a model `w` [2] on the ps whose loss has the constant gradient
    `grads[task]`, in the communication-reduced mode (`local_sgd.build`, async)."""
    from lowlevel.modes import local_sgd
    graph = tf.Graph()
    device = f"/job:worker/task:{task}/device:CPU:0"
    with graph.as_default():
        with v1.device("/job:ps/task:0"):
            step = v1.train.get_or_create_global_step()
        copies = local_sgd.LocalCopies(device)
        with v1.device("/job:ps/task:0"), \
                v1.variable_scope("model", custom_getter=copies):
            w = v1.get_variable("w", [2], initializer=v1.zeros_initializer(), use_resource=True)
        with v1.device(device):
            loss = tf.reduce_sum(w * tf.constant(grads[task], tf.float32))
        ops = local_sgd.build(opt_fn(), local_sgd.gradients(loss, copies), copies, step,
                              period, last_step=1000)
        init = v1.local_variables_initializer()
        load = ops.state.load_state(after=init)
        global_init = v1.global_variables_initializer()
    return graph, ops, load, global_init


@pytest.mark.timeout(120)
@pytest.mark.parametrize("optimizer", ["adagrad", "ftrl"])
def test_two_workers_accumulate_one_shared_slot_on_the_ps(optimizer):
    """Two workers' graphs on a real ps (three servers on loopback), 4 blocks of 3 local steps
    each, the gradients constant (1, 2) and (3, -1): the ps twin of the accumulator holds its
    initial value plus every step's g^2 of both workers (24 steps), as one shared optimizer's
    would; per worker, as before, the chief's would have held only its own 12."""
    import clusters
    opt_fn = {"adagrad": lambda: v1.train.AdagradOptimizer(0.01, initial_accumulator_value=0.1),
              "ftrl": lambda: v1.train.FtrlOptimizer(0.01, initial_accumulator_value=0.1)}[
        optimizer]
    # the accumulator's name in checkpoints (TF1's slot names)
    saved_as = {"adagrad": "model/w/Adagrad", "ftrl": "model/w/Ftrl"}[optimizer]
    hosts = [f"127.0.0.1:{clusters.free_port()}" for _ in range(3)]
    spec = v1.train.ClusterSpec({"ps": hosts[:1], "worker": hosts[1:]})
    servers = [v1.train.Server(spec, "ps", 0, start=True)] + \
        [v1.train.Server(spec, "worker", i, start=True) for i in range(2)]
    grads = [[1.0, 2.0], [3.0, -1.0]]
    workers = [_worker_graph(i, grads, 3, opt_fn) for i in range(2)]
    sessions = [v1.Session(servers[1 + i].target, graph=g) for i, (g, *_) in enumerate(workers)]
    try:
        sessions[0].run(workers[0][3])  # the chief initialises the ps
        for sess, (_, ops, load, _) in zip(sessions, workers):
            sess.run(load)
        for _ in range(4):
            for sess, (_, ops, _, _) in zip(sessions, workers):
                for _ in range(3):
                    sess.run(ops.local_step)
                sess.run(ops.send)
                sess.run(ops.merge)
        graph, ops = workers[0][0], workers[0][1]
        twin = ops.state.names[saved_as]
        assert twin in [t for t, *_ in ops.state.shared_copies()]
        with graph.as_default():
            shared = sessions[0].run(twin)
        expected = 0.1 + 12 * np.square(grads[0]) + 12 * np.square(grads[1])
        np.testing.assert_allclose(shared, expected, rtol=1e-5)
    finally:
        for sess in sessions:
            sess.close()
