"""`lowlevel-make-tf-configs --format=tfjob|k8s`: every generated document validated offline,
the Kubernetes ones against the API schemas kubernetes-validate bundles (pinned version),
the TFJob against the training operator's published API (the kubeflow-training SDK's
models); the TF_CONFIG of each replica as the operator computes it."""

import json
import subprocess
import sys

import kubernetes_validate
import pytest
import yaml
from kubeflow.training import ApiClient

import clusters
from lowlevel.ops import k8s

KUBERNETES_VERSION = "1.35.0"  # pinned: a current release kubernetes-validate bundles
LAYOUT = ["--name=mnist", "--namespace=ml", "--image=registry.example.com/lowlevel:0.1.0",
          "--num_ps=2", "--num_workers=2", "--chief_job", "--evaluator",
          "--output_dir=/output", "--pvc=mnist-output", "--cpu=ps=1,worker=2,chief=2",
          "--memory=2Gi", "--worker_gpus=1"]
TRAINER_FLAGS = ["--train_steps=500", "--save_checkpoint_steps=100"]


def generate(fmt, *flags):
    return subprocess.run([sys.executable, "-m", "lowlevel.tf_configs", f"--format={fmt}",
                           *flags], cwd=clusters.ROOT, env=clusters.ENV, capture_output=True,
                          text=True, timeout=60)


def documents(fmt, *flags):
    result = generate(fmt, *LAYOUT, *flags, "--", *TRAINER_FLAGS)
    assert result.returncode == 0, result.stderr
    return list(yaml.safe_load_all(result.stdout))


def validate_tfjob(doc):
    """Round trip through the SDK's KubeflowOrgV1TFJob: a field the API does not know is
    dropped, so the result differs; each pod template also passes the Kubernetes schema."""
    class Response:
        data = json.dumps(doc)

    client = ApiClient()
    model = client.deserialize(Response, "KubeflowOrgV1TFJob")
    assert client.sanitize_for_serialization(model) == doc
    for rtype, spec in doc["spec"]["tfReplicaSpecs"].items():
        assert rtype in k8s.REPLICA_TYPES
        assert spec["restartPolicy"] in ("Always", "OnFailure", "Never", "ExitCode")
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate",
                                      "metadata": {"name": f"mnist-{rtype.lower()}"},
                                      "template": spec["template"]},
                                     KUBERNETES_VERSION, strict=True)


def test_tfjob_validates_and_has_the_operator_contract():
    docs = documents("tfjob")
    assert [d["kind"] for d in docs] == ["TFJob", "NetworkPolicy"]
    tfjob, policy = docs
    validate_tfjob(tfjob)
    kubernetes_validate.validate(policy, KUBERNETES_VERSION, strict=True)
    specs = tfjob["spec"]["tfReplicaSpecs"]
    assert {r: s["replicas"] for r, s in specs.items()} == {"Chief": 1, "Worker": 2, "PS": 2,
                                                            "Evaluator": 1}
    assert tfjob["spec"]["runPolicy"] == {"cleanPodPolicy": "Running", "backoffLimit": 10}
    for rtype, spec in specs.items():
        assert spec["restartPolicy"] == "ExitCode"
        container = spec["template"]["spec"]["containers"][0]
        assert container["name"] == "tensorflow"
        assert container["ports"][0] == {"name": "tfjob-port", "containerPort": 2222,
                                         "protocol": "TCP"}
        assert container["args"] == ["--output_dir=/output", *TRAINER_FLAGS]
        assert spec["template"]["metadata"]["labels"]["lowlevel/run"] == "mnist"
        gpus = container["resources"].get("limits", {}).get("nvidia.com/gpu")
        assert gpus == ("1" if rtype in ("Chief", "Worker") else None)
    assert specs["PS"]["template"]["spec"]["containers"][0]["resources"]["requests"] == {
        "cpu": "1", "memory": "2Gi"}


def test_plain_kubernetes_set_validates():
    docs = documents("k8s")
    assert [d["kind"] for d in docs] == ["Service"] + ["Job"] * 6 + ["NetworkPolicy"]
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    service = docs[0]
    assert service["spec"]["clusterIP"] == "None" and service["metadata"]["name"] == "mnist"
    cluster = k8s.operator_cluster("mnist", "ml", {"chief": 1, "worker": 2, "ps": 2,
                                                    "evaluator": 1}, subdomain="mnist")
    assert cluster["ps"] == ["mnist-ps-0.mnist.ml.svc:2222", "mnist-ps-1.mnist.ml.svc:2222"]
    seen = set()
    for job in docs[1:-1]:
        pod = job["spec"]["template"]["spec"]
        tf_config = json.loads(pod["containers"][0]["env"][0]["value"])
        task = tf_config["task"]
        seen.add((task["type"], task["index"]))
        assert tf_config == {"cluster": cluster, "task": task, "environment": "cloud"}
        assert pod["hostname"] == f"mnist-{task['type']}-{task['index']}"
        assert pod["subdomain"] == "mnist" and pod["restartPolicy"] == "Never"
        assert job["spec"]["template"]["metadata"]["labels"]["lowlevel/run"] == "mnist"
        fail, ignore = job["spec"]["podFailurePolicy"]["rules"]
        assert fail["action"] == "FailJob" and fail["onExitCodes"]["values"] == list(range(1, 128))
        assert ignore == {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}
    assert seen == {("chief", 0), ("worker", 0), ("worker", 1), ("ps", 0), ("ps", 1),
                    ("evaluator", 0)}


def test_network_policy_admits_only_the_run_on_the_training_port():
    policy = k8s.network_policy("mnist", "ml")
    spec = policy["spec"]
    assert spec["podSelector"] == {"matchLabels": {"lowlevel/run": "mnist"}}
    assert spec["policyTypes"] == ["Ingress"]
    assert spec["ingress"] == [{"from": [{"podSelector": {"matchLabels": {
        "lowlevel/run": "mnist"}}}], "ports": [{"protocol": "TCP", "port": 2222}]}]


def test_tf_config_of_each_replica_as_the_operator_writes_it():
    tfjob = documents("tfjob")[0]
    configs = k8s.tfjob_tf_configs(tfjob)
    assert len(configs) == 6
    worker1 = configs[("worker", 1)]
    assert worker1["environment"] == "cloud" and worker1["task"] == {"type": "worker",
                                                                      "index": 1}
    assert worker1["cluster"]["worker"] == ["mnist-worker-0.ml.svc:2222",
                                            "mnist-worker-1.ml.svc:2222"]
    assert worker1["cluster"]["evaluator"] == ["mnist-evaluator-0.ml.svc:2222"]
    sparse = k8s.tfjob_tf_configs(tfjob, sparse=True)
    assert sparse[("worker", 1)] == {"sparseCluster": {
        "worker": {"1": "mnist-worker-1.ml.svc:2222"},
        "ps": ["mnist-ps-0.ml.svc:2222", "mnist-ps-1.ml.svc:2222"]},
        "task": {"type": "worker", "index": 1}}
    assert sparse[("ps", 1)]["sparseCluster"] == {"worker": {}, "ps": ["mnist-ps-1.ml.svc:2222"]}
    assert sparse[("chief", 0)]["sparseCluster"] == {"worker": {}, "ps": []}


@pytest.mark.parametrize("flags,needle", [
    (["--image=i", "--pvc=p", "--output_dir=/o"], "--name=None: expected a DNS label"),
    (["--name=Bad_Name", "--image=i", "--pvc=p", "--output_dir=/o"], "--name=Bad_Name"),
    (["--name=r", "--pvc=p", "--output_dir=/o"], "--image is required"),
    (["--name=r", "--image=i"], "--pvc and --output_dir are required"),
    (["--name=r", "--image=i", "--pvc=p", "--output_dir=/o", "--cpu=gpu=1"],
     "--cpu=gpu=1: expected one value"),
    (["--name=r", "--image=i", "--pvc=p", "--output_dir=/o", "--ps=h:1"],
     "--ps gives addresses"),
])
def test_generator_usage_errors(flags, needle):
    result = generate("tfjob", *flags)
    assert result.returncode == 2 and not result.stdout
    assert needle in result.stderr and "Traceback" not in result.stderr


# hosts_factory: tests/conftest.py


STEPS = 300
E2E_FLAGS = ["--", f"--train_steps={STEPS}", "--save_checkpoint_steps=100",
             "--intra_op_threads=1", "--inter_op_threads=2", "--log_every_secs=1",
             "--startup_timeout_secs=120"]


def _run_tasks(tmp_path, hosts_factory, tasks):
    """Runs {task name: (host names, TF_CONFIG, container args)} each on its own host, to
    the end: every task exits 0, the final step is exact, the evaluator reports the last
    checkpoint, the ps tasks were told to exit by the chief."""
    out = tmp_path / "out"
    hosts = hosts_factory({name: names for name, (names, _, _) in tasks.items()})
    procs, logs = {}, {}
    for name, (_, tf_config, args) in tasks.items():
        logs[name] = tmp_path / f"{name}.log"
        with open(logs[name], "w") as log:
            procs[name] = hosts.popen(
                name, [sys.executable, "-m", "lowlevel.trainer", *args], cwd=clusters.ROOT,
                env=dict(clusters.ENV, TF_CONFIG=tf_config), stdout=log,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    statuses = clusters.wait_all(procs, 360)
    for name, (code, _) in statuses.items():
        assert code == 0, f"{name} exited {code}:\n{clusters.tail(logs[name])}"
    assert clusters.final_metrics(out)["global_step"] == STEPS
    assert clusters.eval_metrics(out)[-1]["global_step"] == STEPS
    ps_log = logs["ps0"].read_text()
    assert "the chief signalled the end of training" in ps_log, ps_log[-2000:]


@pytest.mark.cluster  # starts trainer processes
@pytest.mark.timeout(420)
@pytest.mark.parametrize("layout", ["chief_job", "sparse"])
def test_tasks_built_from_a_generated_tfjob_train_to_the_end(tmp_path, hosts_factory, layout):
    """Each replica on its own host (network namespace) where the operator's host names
    resolve, with the TF_CONFIG the operator would give it. `sparse`: enableDynamicWorker's
    sparseCluster, worker 0 the chief (a Chief replica gets no ps in that form)."""
    layout_flags = ["--chief_job"] if layout == "chief_job" else []
    result = generate("tfjob", "--name=mnist", "--namespace=ml", "--image=lowlevel:test",
                      "--num_ps=2", "--num_workers=2", *layout_flags, "--evaluator",
                      f"--output_dir={tmp_path / 'out'}", "--pvc=unused", *E2E_FLAGS)
    assert result.returncode == 0, result.stderr
    tfjob = next(yaml.safe_load_all(result.stdout))
    configs = k8s.tfjob_tf_configs(tfjob, sparse=layout == "sparse")
    assert len(configs) == (6 if layout == "chief_job" else 5)
    tasks = {}
    for (job, i), tf_config in configs.items():
        rtype = next(r for r, j in k8s.REPLICA_TYPES.items() if j == job)
        pod = tfjob["spec"]["tfReplicaSpecs"][rtype]["template"]["spec"]
        tasks[f"{job}{i}"] = ([f"mnist-{job}-{i}.ml.svc"], json.dumps(tf_config),
                              pod["containers"][0]["args"])
    _run_tasks(tmp_path, hosts_factory, tasks)


@pytest.mark.cluster  # starts trainer processes
@pytest.mark.timeout(420)
def test_tasks_of_the_generated_plain_kubernetes_jobs_train_to_the_end(tmp_path, hosts_factory):
    """The same from `--format=k8s`: each Job's pod runs with its own TF_CONFIG and args,
    on a host named as its hostname.subdomain.namespace.svc would resolve."""
    result = generate("k8s", "--name=mnist", "--namespace=ml", "--image=lowlevel:test",
                      "--num_ps=2", "--num_workers=2", "--chief_job", "--evaluator",
                      f"--output_dir={tmp_path / 'out'}", "--pvc=unused", *E2E_FLAGS)
    assert result.returncode == 0, result.stderr
    tasks = {}
    for job in yaml.safe_load_all(result.stdout):
        if job["kind"] != "Job":
            continue
        pod = job["spec"]["template"]["spec"]
        container = pod["containers"][0]
        tf_config = next(e["value"] for e in container["env"] if e["name"] == "TF_CONFIG")
        task = json.loads(tf_config)["task"]
        tasks[f"{task['type']}{task['index']}"] = (
            [f"{pod['hostname']}.{pod['subdomain']}.ml.svc"], tf_config, container["args"])
    assert len(tasks) == 6
    _run_tasks(tmp_path, hosts_factory, tasks)


def test_container_recipe_runs_the_trainer_as_a_non_root_user():
    """scripts/Dockerfile is not built here (no container daemon); its contract is checked."""
    import os
    import re
    import tomllib
    with open(os.path.join(clusters.ROOT, "scripts", "Dockerfile")) as f:
        recipe = f.read()
    with open(os.path.join(clusters.ROOT, "pyproject.toml"), "rb") as f:
        scripts = tomllib.load(f)["project"]["scripts"]
    assert re.search(r"^FROM python:3\.\d+-slim$", recipe, re.M)
    assert re.search(r"^RUN pip install \. ", recipe, re.M)
    entrypoint = json.loads(re.search(r"^ENTRYPOINT (.+)$", recipe, re.M).group(1))
    assert scripts[entrypoint[0]] == "lowlevel.trainer:run"
    user = re.findall(r"^USER (\d+)$", recipe, re.M)
    assert user and int(user[-1]) != 0  # numeric, so runAsNonRoot can check it
    pod = k8s._pod_spec({}, "pvc")
    assert pod["securityContext"]["runAsUser"] == int(user[-1])
