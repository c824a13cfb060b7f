"""lowlevel/modes/optimizer_state.py in-process: the twins load after the local init."""

import numpy as np
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
