import pytest

from lowlevel import cluster as cluster_lib
from lowlevel.cluster import Cluster, Task, from_flags, parse_hosts
from lowlevel.config import TrainConfig, UsageError


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
        parse_hosts(value, "worker_hosts")


def test_from_flags_builds_cluster_and_task():
    cluster, task = from_flags("127.0.0.1:1", "127.0.0.1:2,127.0.0.1:3", "worker", 1)
    assert cluster.as_dict() == {"ps": ["127.0.0.1:1"], "worker": ["127.0.0.1:2", "127.0.0.1:3"]}
    assert (cluster.num_ps, cluster.num_workers) == (1, 2)
    assert task == Task("worker", 1) and not task.is_chief
    assert Task("worker", 0).is_chief and not Task("ps", 0).is_chief
    assert task.device == "/job:worker/task:1" and task.name == "worker1"


def test_no_cluster_flags_means_in_process_chief():
    cluster, task = from_flags("", "", None, 0)
    assert cluster is None and task.is_chief


@pytest.mark.parametrize("args,needle", [
    (("127.0.0.1:1", "127.0.0.1:2", None, 0), "--job_name is required"),
    (("127.0.0.1:1", "127.0.0.1:2", "chef", 0), "--job_name=chef"),
    (("127.0.0.1:1", "127.0.0.1:2", "worker", 1), "expected 0 to 0"),
    (("127.0.0.1:1", "127.0.0.1:2", "ps", -1), "--task_index=-1"),
    (("127.0.0.1:1", "127.0.0.1:1", "ps", 0), "given twice"),
    (("", "127.0.0.1:2", "worker", 0), "at least one ps"),
    (("127.0.0.1:1", "", "ps", 0), "at least one worker"),
    (("", "", "ps", 0), "needs --ps_hosts"),
])
def test_from_flags_errors_name_the_value(args, needle):
    with pytest.raises(UsageError, match=needle):
        from_flags(*args)


def test_tasks_on_host_counts_loopback_as_one_machine():
    c = Cluster(("127.0.0.1:1",), ("localhost:2", "127.0.0.2:3", "10.9.9.9:4"))
    assert c.tasks_on_host_of("ps", 0) == 3
    assert c.tasks_on_host_of("worker", 2) == 1


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
    assert cluster_lib.JOBS == ("ps", "worker")
