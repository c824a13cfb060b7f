"""One training graph for every model (`lowlevel.runtime.graph.build`): a built-in model and the
same model_fn brought as a user's build the same step; a user's model_fn spread over the ps
tasks by bytes, each variable with its slots; the loss summary as estimator 2.15 adds it; save and
restore ops on the chief only."""

import collections

import pytest
import tensorflow as tf

from lowlevel.cluster.spec import Cluster, Task
from lowlevel.config import TrainConfig
from lowlevel.data import images as data_lib
from lowlevel.models import catalogue as models
from lowlevel.models.model_fn_model import ModelFnModel
from lowlevel.models.spec import EstimatorSpec
from lowlevel.runtime import graph as graph_lib
from lowlevel.runtime import trainables

v1 = tf.compat.v1
ONE_PS = Cluster(("127.0.0.1:1000",), ("127.0.0.1:2000", "127.0.0.1:2001"))
TWO_PS = Cluster(("127.0.0.1:1000", "127.0.0.1:1001"), ("127.0.0.1:2000", "127.0.0.1:2001"))


def _ps_ops(g) -> collections.Counter:
    """(type, device) of every op on a ps: the variables, their updates, the fused reads."""
    return collections.Counter((op.type, op.device) for op in g.graph.get_operations()
                               if op.device.startswith("/job:ps"))


def _digits_input_fn(data, batch_size):
    def input_fn(mode, params, config):
        images = data.train.images.astype("float32") / data.max_value
        ds = tf.data.Dataset.from_tensor_slices((images, data.train.labels.astype("int64")))
        return ds.repeat().batch(batch_size, drop_remainder=True)
    return input_fn


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sync", [False, True])
def test_the_builtin_mlp_as_a_user_model_fn_builds_the_builtin_step(sync):
    """On one ps (where the built-in model is not partitioned): the same ops on the ps."""
    data = data_lib.load_digits()
    config = TrainConfig(model="mlp", hidden_units=(32,), sync=sync, train_steps=10)
    task = Task("worker", 1)
    builtin = graph_lib.build(config, trainables.Builtin(config, data), ONE_PS, task)
    params = models.params_for(config, data, None, ONE_PS.num_ps)
    user = trainables.ModelFn(ModelFnModel(models.model_fn, params, None, "",
                                           input_fn=_digits_input_fn(data, config.batch_size)))
    mine = graph_lib.build(config, user, ONE_PS, task)
    assert _ps_ops(mine) == _ps_ops(builtin)
    assert sum(_ps_ops(mine).values()) > 20
    assert mine.examples_per_step == builtin.examples_per_step == config.batch_size * (
        2 if sync else 1)
    assert sorted(mine.saved) == sorted(builtin.saved)
    assert mine.optimizer_names == builtin.optimizer_names and mine.optimizer_names


@pytest.mark.timeout(120)
def test_a_model_fns_variables_are_spread_over_the_ps_tasks_with_their_slots():
    """The plan is made from the model measured in TRAIN mode, slots included: each slot goes
    with its variable, and the variables balance the ps tasks' bytes (the largest, 784 x 64
    floats and its accumulator, alone on one)."""
    from benchmarks import estimator_model
    params = {"hidden_units": [64, 64], "learning_rate": 0.1, "batch_size": 32}
    model = ModelFnModel(estimator_model.model_fn, params, None, "",
                         input_fn=estimator_model.input_fn)
    g = graph_lib.build(TrainConfig(train_steps=10), trainables.ModelFn(model), TWO_PS,
                        Task("worker", 1))
    variables = {v.op.name: v for v in g.graph.get_collection(v1.GraphKeys.GLOBAL_VARIABLES)}
    held = collections.Counter()
    for name, v in variables.items():
        owner = name.rsplit("/Adagrad", 1)[0]
        assert v.device == variables[owner].device, name
        held[v.device] += v.shape.num_elements() * 4
    assert len(held) == 2
    assert variables["hid0_w"].device != variables["hid1_w"].device


def _loss_model_fn(features, labels, mode, params):
    w = v1.get_variable("w", initializer=tf.constant(1.0))
    loss = tf.square(w - tf.reduce_mean(features))
    if params.get("own_summary"):
        v1.summary.scalar("loss", loss * 2.0)
    train_op = v1.train.GradientDescentOptimizer(0.1).minimize(
        loss, global_step=v1.train.get_global_step())
    return EstimatorSpec(mode, loss=loss, train_op=train_op)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("own", [False, True])
def test_a_model_fn_gets_a_loss_summary_unless_it_made_one(own):
    model = ModelFnModel(_loss_model_fn, {"own_summary": own}, None, "",
                         input_fn=lambda: (tf.ones([4, 1]), tf.zeros([4])))
    g = graph_lib.build(TrainConfig(train_steps=5), trainables.ModelFn(model), None,
                        Task("worker", 0))
    losses = [s for s in g.graph.get_collection(v1.GraphKeys.SUMMARIES) if s.op.name == "loss"]
    assert len(losses) == 1
    # the model's own (of 2 * loss) is kept; else the runtime's reads the spec's loss
    assert (losses[0].op.inputs[1].op.type == "Mul") == own


@pytest.mark.timeout(120)
def test_only_the_chief_builds_save_and_restore_ops():
    """A worker that is not the chief never saves or restores: its graph has no save or restore
    op of its own (`checkpoints.WorkerSaver`), the chief's one per ps, and both save the same
    names."""
    data = data_lib.load_digits()
    config = TrainConfig(model="mlp", hidden_units=(32,), train_steps=10)
    graphs = {}
    for index in (0, 1):
        g = graph_lib.build(config, trainables.Builtin(config, data), TWO_PS,
                            Task("worker", index))
        with g.graph.as_default():
            g.scaffold.finalize()
        graphs[index] = g
    ops = {i: collections.Counter(op.type for op in g.graph.get_operations())
           for i, g in graphs.items()}
    assert ops[0]["SaveV2"] == 2 and ops[0]["RestoreV2"] >= 2
    assert ops[1]["SaveV2"] == 0 and ops[1]["RestoreV2"] == 0
    assert sorted(graphs[0].saved) == sorted(graphs[1].saved)
    with pytest.raises(RuntimeError, match="does not save"):
        graphs[1].scaffold.saver.save(None, "/nonexistent/model.ckpt")
