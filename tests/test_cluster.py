import json
import re

import pytest

from lowlevel.cluster import spec as cluster_lib
from lowlevel.cluster.spec import Cluster, ClusterFlags, Task, from_flags, parse_hosts
from lowlevel.cluster.tf_config import from_tf_config, resolve
from lowlevel.config import TrainConfig, check_schedule
from lowlevel.errors import UsageError


def test_parse_hosts_keeps_order_and_strips_spaces():
    assert parse_hosts("127.0.0.1:2222, localhost:2223", "ps_hosts") == (
        "127.0.0.1:2222", "localhost:2223")
    assert parse_hosts("", "ps_hosts") == ()


@pytest.mark.parametrize("value,needle", [
    ("127.0.0.1", "not host:port"),
    (":2222", "not host:port"),
    ("host:port", "not host:port"),
    ("127.0.0.1:0", "out of range"),
    ("127.0.0.1:70000", "out of range"),
])
def test_parse_hosts_rejects_bad_addresses(value, needle):
    with pytest.raises(UsageError, match=needle):
        parse_hosts(value, "--worker_hosts")


def test_from_flags_builds_cluster_and_task():
    cluster, task = from_flags(ClusterFlags("127.0.0.1:1", "127.0.0.1:2,127.0.0.1:3",
                                            "worker", 1))
    assert cluster.as_dict() == {"ps": ["127.0.0.1:1"], "worker": ["127.0.0.1:2", "127.0.0.1:3"]}
    assert (cluster.num_ps, cluster.num_workers) == (1, 2)
    assert task == Task("worker", 1) and not task.is_chief
    assert Task("worker", 0).is_chief and not Task("ps", 0).is_chief
    assert task.device == "/job:worker/task:1" and task.name == "worker1"
    assert task.replica_index == 1 and Task("ps", 0).replica_index is None


def test_no_cluster_flags_means_in_process():
    assert from_flags(ClusterFlags()) == (None, None)
    assert from_flags(ClusterFlags(job_name="evaluator")) == (None, Task("evaluator", 0))


@pytest.mark.parametrize("args,needle", [
    (("127.0.0.1:1", "127.0.0.1:2", None, 0), "--job_name is required"),
    (("127.0.0.1:1", "127.0.0.1:2", "chef", 0), "--job_name=chef"),
    (("127.0.0.1:1", "127.0.0.1:2", "worker", 1), "expected 0 to 0"),
    (("127.0.0.1:1", "127.0.0.1:2", "ps", -1), "--task_index=-1"),
    (("127.0.0.1:1", "127.0.0.1:1", "ps", 0), "given twice"),
    (("", "127.0.0.1:2", "worker", 0), "at least one ps"),
    (("127.0.0.1:1", "", "ps", 0), "at least one worker"),
    (("", "", "ps", 0), "needs --ps_hosts"),
    (("", "", "evaluator", 1), "one evaluator"),
])
def test_from_flags_errors_name_the_value(args, needle):
    with pytest.raises(UsageError, match=needle):
        from_flags(ClusterFlags(*args))


def test_tasks_on_host_counts_loopback_as_one_machine():
    c = Cluster(("127.0.0.1:1",), ("localhost:2", "127.0.0.2:3", "10.9.9.9:4"))
    assert c.tasks_on_host_of("ps", 0) == 3
    assert c.tasks_on_host_of("worker", 2) == 1
    assert c.tasks_on_host_of("ps", 0, ("worker",)) == 2


@pytest.mark.parametrize("kwargs,needle", [
    ({"batch_size": 0}, "--batch_size=0"),
    ({"train_steps": -5}, "--train_steps=-5"),
    ({"model": "resnet"}, "--model=resnet"),
    ({"dataset": "cifar"}, "--dataset=cifar"),
    ({"optimizer": "lbfgs"}, "--optimizer=lbfgs"),
    ({"replicas_to_aggregate": 3}, "expected 1 to 2"),
    ({"hidden_units": (128, 0)}, "--hidden_units=128,0"),
])
def test_config_validation(kwargs, needle):
    with pytest.raises(UsageError, match=needle):
        TrainConfig(**kwargs).validate(num_workers=2)


def test_config_default_learning_rate_follows_optimizer():
    assert TrainConfig(optimizer="adam").lr == 0.001
    assert TrainConfig(optimizer="adagrad", learning_rate=0.3).lr == 0.3
    assert cluster_lib.JOBS == ("chief", "worker", "ps", "evaluator")


CHIEF_CLUSTER = {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2", "127.0.0.1:3"],
                 "ps": ["127.0.0.1:4"]}


def _tf_config(task_type, index=0, cluster=None, **extra):
    return json.dumps({"cluster": cluster or CHIEF_CLUSTER,
                       "task": {"type": task_type, "index": index}, **extra})


def test_tf_config_with_a_chief_job():
    cluster, chief = from_tf_config(_tf_config("chief", environment="cloud"))
    assert cluster.as_dict() == CHIEF_CLUSTER and cluster.num_workers == 3
    assert chief.is_chief and chief.replica_index == 0 and chief.device == "/job:chief/task:0"
    _, worker0 = from_tf_config(_tf_config("worker", 0))
    assert not worker0.is_chief and worker0.replica_index == 1
    assert [t.name for t in cluster.training_tasks()] == ["chief0", "worker0", "worker1"]


def test_tf_config_master_is_the_chief_and_evaluator_is_not_in_the_cluster():
    spec = {"master": ["127.0.0.1:1"], "ps": ["127.0.0.1:4"], "evaluator": ["127.0.0.1:9"]}
    cluster, task = from_tf_config(_tf_config("master", cluster=spec))
    assert task.is_chief and task.job_name == "chief"
    assert cluster.as_dict() == {"chief": ["127.0.0.1:1"], "ps": ["127.0.0.1:4"]}
    _, evaluator = from_tf_config(_tf_config("evaluator", cluster=spec))
    assert evaluator == Task("evaluator", 0) and evaluator.replica_index is None


def test_tf_config_without_chief_job_makes_worker0_chief():
    spec = {"worker": ["127.0.0.1:2", "127.0.0.1:3"], "ps": ["127.0.0.1:4"]}
    _, task = from_tf_config(_tf_config("worker", 0, cluster=spec))
    assert task.is_chief and task.replica_index == 0


@pytest.mark.parametrize("text,needle", [
    ("{not json", "TF_CONFIG is not JSON"),
    ("[1, 2]", "expected a JSON object"),
    ('{"task": {"type": "worker", "index": 0}}', 'lacks "cluster"'),
    ('{"cluster": {"ps": ["127.0.0.1:4"], "worker": ["127.0.0.1:2"]}}', 'lacks "task"'),
    (_tf_config("worker", 2), "expected 0 to 1"),
    (_tf_config("gardener"), "task.type='gardener'"),
    (_tf_config("worker", cluster={"ps": ["127.0.0.1:4"], "wrker": ["127.0.0.1:2"]}),
     "job 'wrker' is unknown"),
    (_tf_config("worker", cluster={"ps": ["127.0.0.1:4"], "worker": ["127.0.0.1"]}),
     "TF_CONFIG cluster.worker: '127.0.0.1' is not host:port"),
    (_tf_config("worker", cluster={"ps": ["127.0.0.1:4"], "worker": ["127.0.0.1:4"]}),
     "given twice"),
    (_tf_config("chief", cluster={"chief": ["127.0.0.1:1", "127.0.0.1:2"],
                                  "ps": ["127.0.0.1:4"]}), "expected one"),
    (_tf_config("worker", "1"), "task.index='1'"),
])
def test_bad_tf_config_names_what_is_wrong(text, needle):
    with pytest.raises(UsageError, match=re.escape(needle)):
        from_tf_config(text)


def test_flags_must_agree_with_tf_config():
    text = _tf_config("worker", 1)
    assert resolve(ClusterFlags(job_name="worker", task_index=1,
                                ps_hosts="127.0.0.1:4"), text)[1] == Task("worker", 1, True)
    for flags, needle in [
        (ClusterFlags(job_name="ps"), "--job_name=ps disagrees with TF_CONFIG task.type=worker"),
        (ClusterFlags(task_index=0), "--task_index=0 disagrees with TF_CONFIG task.index=1"),
        (ClusterFlags(ps_hosts="127.0.0.1:5"),
         "--ps_hosts=127.0.0.1:5 disagrees with TF_CONFIG cluster.ps=127.0.0.1:4"),
    ]:
        with pytest.raises(UsageError, match=re.escape(needle)):
            resolve(flags, text)
    assert resolve(ClusterFlags(), "") == (None, None)  # empty TF_CONFIG: flags decide


@pytest.mark.parametrize("schedule,job,expected", [
    (None, "worker", "train"), (None, "chief", "train"), (None, "ps", "run_std_server"),
    (None, "evaluator", "continuous_eval"),
    ("continuous_eval_on_train_data", "evaluator", "continuous_eval_on_train_data"),
])
def test_schedule_defaults_follow_the_job(schedule, job, expected):
    assert check_schedule(schedule, job) == expected


@pytest.mark.parametrize("schedule,job,needle", [
    ("train", "ps", "cannot run on a ps task"),
    ("continuous_eval", "worker", "cannot run on a worker task"),
    ("dance", "worker", "expected one of"),
])
def test_schedule_errors(schedule, job, needle):
    with pytest.raises(UsageError, match=needle):
        check_schedule(schedule, job)


def test_session_config_gives_the_cores_to_the_training_tasks(monkeypatch):
    from lowlevel.runtime import server
    monkeypatch.setattr(server.resources, "cpus", lambda: 2)  # the cgroup's figure

    def threads(cluster, job, index):
        c = server.session_config(cluster, Task(job, index))
        return c.intra_op_parallelism_threads, c.inter_op_parallelism_threads

    one = Cluster(("127.0.0.1:1",), ("127.0.0.1:2",))
    assert threads(one, "worker", 0) == (2, 2)  # the lone worker has both cores
    assert threads(one, "ps", 0) == (1, 2)
    two = Cluster(("127.0.0.1:1",), ("127.0.0.1:2", "127.0.0.1:3"))
    assert threads(two, "worker", 1) == (1, 2)
    remote_ps = Cluster(("10.0.0.9:1", "10.0.0.9:2"), ("127.0.0.1:2",))
    assert threads(remote_ps, "ps", 0) == (1, 2)  # two ps share their machine's cores
    c = server.session_config(one, Task("worker", 0), intra_op_threads=3)
    assert c.intra_op_parallelism_threads == 3 and list(c.device_filters) == [
        "/job:ps", "/job:worker/task:0"]


@pytest.mark.parametrize("rewrites, identities", [("default", 0), ("one", 0), ("off", 3)])
def test_graph_rewrites_reach_the_sessions_graph(rewrites, identities):
    """`--graph_rewrites` (`server.session_config`): what a session runs, read back from its
    partition graph. TensorFlow's default and one pass remove a chain of Identity ops
    (Grappler); off leaves the graph as built."""
    import tensorflow as tf
    from lowlevel.runtime import server
    v1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, [3])
        out = tf.identity(tf.identity(tf.identity(x * 2.0))) + 1.0
    config = server.session_config(Cluster(("127.0.0.1:1",), ("127.0.0.1:2",)),
                                   Task("worker", 0), graph_rewrites=rewrites)
    config.ClearField("device_filters")  # an in-process session: no /job:worker
    metadata = v1.RunMetadata()
    with v1.Session(graph=graph, config=config) as sess:
        assert list(sess.run(out, {x: [1, 2, 3]}, run_metadata=metadata, options=v1.RunOptions(
            output_partition_graphs=True))) == [3, 5, 7]
    ops = [n.op for g in metadata.partition_graphs for n in g.node]
    assert ops.count("Identity") == identities, ops


def test_session_config_lets_only_the_computing_tasks_spin(monkeypatch):
    """Idle pool threads spin before they sleep only where that takes no core a worker
    needs: not with more tasks than cores, not in a ps beside training tasks."""
    from lowlevel.runtime import server
    monkeypatch.setattr(server.resources, "cpus", lambda: 2)  # the cgroup's figure

    def spins(cluster, job, index):
        return not server.session_config(
            cluster, Task(job, index)).experimental.disable_thread_spinning

    one = Cluster(("127.0.0.1:1",), ("127.0.0.1:2",))
    assert spins(one, "worker", 0) and not spins(one, "ps", 0)
    two = Cluster(("127.0.0.1:1",), ("127.0.0.1:2", "127.0.0.1:3"))  # 3 tasks, 2 cores
    assert not spins(two, "worker", 0) and not spins(two, "ps", 0)
    remote_ps = Cluster(("10.0.0.9:1",), ("127.0.0.1:2",))
    assert spins(remote_ps, "ps", 0)  # alone on its machine


# TF_CONFIG exactly as Kubeflow's training operator writes it (TFJob "run" in namespace "ml").
OPERATOR_SPEC = {"chief": ["run-chief-0.ml.svc:2222"],
                 "worker": ["run-worker-0.ml.svc:2222", "run-worker-1.ml.svc:2222"],
                 "ps": ["run-ps-0.ml.svc:2222", "run-ps-1.ml.svc:2222"]}


@pytest.mark.parametrize("with_evaluator", [True, False], ids=["current", "older_operator"])
def test_operator_tf_config_with_environment_and_evaluator_in_or_out(with_evaluator):
    spec = dict(OPERATOR_SPEC, **({"evaluator": ["run-evaluator-0.ml.svc:2222"]}
                                  if with_evaluator else {}))
    text = json.dumps({"cluster": spec, "task": {"type": "worker", "index": 1},
                       "environment": "cloud"})
    cluster, task = from_tf_config(text)
    assert cluster.as_dict() == OPERATOR_SPEC and cluster.num_workers == 3
    assert task == Task("worker", 1, chief_job=True) and task.replica_index == 2
    _, evaluator = from_tf_config(json.dumps({"cluster": spec, "environment": "cloud",
                                              "task": {"type": "evaluator", "index": 0}}))
    assert evaluator == Task("evaluator", 0)


def test_operator_sparse_cluster_of_a_worker_a_ps_and_an_evaluator():
    ps = ["run-ps-0.ml.svc:2222", "run-ps-1.ml.svc:2222"]
    worker = json.dumps({"sparseCluster": {"worker": {"1": "run-worker-1.ml.svc:2222"},
                                           "ps": ps}, "task": {"type": "worker", "index": 1}})
    cluster, task = from_tf_config(worker)
    assert cluster.sparse and cluster.num_workers is None and cluster.num_ps == 2
    assert cluster.as_dict() == {"ps": ps, "worker": {1: "run-worker-1.ml.svc:2222"}}
    assert task == Task("worker", 1) and not task.is_chief and task.replica_index == 1
    assert [t.name for t in cluster.training_tasks()] == ["worker1"]
    ps1 = json.dumps({"sparseCluster": {"worker": {}, "ps": [ps[1]]},
                      "task": {"type": "ps", "index": 1}})
    cluster, task = from_tf_config(ps1)
    assert cluster.as_dict() == {"ps": {1: ps[1]}} and task == Task("ps", 1)
    assert cluster.hosts("ps")[1] == ps[1]
    evaluator = json.dumps({"sparseCluster": {"worker": {}, "ps": []},
                            "task": {"type": "evaluator", "index": 0}})
    assert resolve(ClusterFlags(), evaluator) == (None, Task("evaluator", 0))
    chief0 = json.dumps({"sparseCluster": {"worker": {"0": "run-worker-0.ml.svc:2222"},
                                           "ps": ps}, "task": {"type": "worker", "index": 0}})
    assert from_tf_config(chief0)[1].is_chief


@pytest.mark.parametrize("spec,task,needle", [
    ({"worker": {}, "ps": []}, {"type": "chief", "index": 0}, "use no Chief replica"),
    ({"worker": {"0": "a:1"}, "ps": ["p:1"]}, {"type": "worker", "index": 1},
     "sparseCluster.worker has no entry for this task (index 1)"),
    ({"worker": {}, "ps": ["p:1", "q:1"]}, {"type": "ps", "index": 0}, "expected its own only"),
    ({"worker": {"x": "a:1"}, "ps": ["p:1"]}, {"type": "worker", "index": 0},
     "key 'x': expected a task index"),
])
def test_bad_sparse_cluster_names_what_is_wrong(spec, task, needle):
    with pytest.raises(UsageError, match=re.escape(needle)):
        from_tf_config(json.dumps({"sparseCluster": spec, "task": task}))
