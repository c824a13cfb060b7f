"""`lowlevel-make-tf-configs --format=tfjob|k8s`: every generated document validated offline,
strictly, on every Kubernetes minor from 1.29 to the newest that kubernetes-validate bundles
(its API schemas), the TFJob against the training operator's v1 CRD schema
(tests/schemas/tfjob-v1-crd-schema.json) and its SDK's model; the pods against the Pod
Security "restricted" profile and checkov (a manifest scanner: no failed check, each skip
in the manifest with its reason); the TF_CONFIG of each replica as the operator computes
it; the generator's refusals; the tasks of both layouts run to the end."""

import copy
import functools
import json
import os
import re
import shutil
import subprocess
import sys

import jsonschema
import kubernetes_validate
import pytest
import yaml
from kubeflow.training import ApiClient

import clusters
from lowlevel.ops import k8s

# Every minor kubernetes-validate bundles from 1.29 on (1.29-1.34 are most clusters in use).
KUBERNETES_VERSIONS = sorted({v for v in kubernetes_validate.utils.all_versions()
                              if tuple(map(int, v.split(".")[:2])) >= (1, 29)},
                             key=lambda v: tuple(map(int, v.split("."))))
LAYOUT = ["--name=mnist", "--namespace=ml", "--image=registry.example.com/lowlevel:0.1.0",
          "--num_ps=2", "--num_workers=2", "--chief_job", "--evaluator",
          "--output_dir=/output", "--pvc=mnist-output", "--cpu=ps=1,worker=2,chief=2",
          "--memory=2Gi", "--worker_gpus=1", "--pod_monitor"]
TRAINER_FLAGS = ["--train_steps=500", "--save_checkpoint_steps=100"]
CRD_SCHEMA = os.path.join(os.path.dirname(__file__), "schemas", "tfjob-v1-crd-schema.json")


def generate(fmt, *flags):
    return clusters.run([sys.executable, "-m", "lowlevel.tf_configs", f"--format={fmt}",
                         *flags], timeout=60)


def documents(fmt, *flags, layout=LAYOUT):
    """The generator's documents for `layout` + `flags`, a copy of their own for each call
    (the generator runs once per format and flags in a test process: ~0.2 s each)."""
    return copy.deepcopy(list(_generated(fmt, (*layout, *flags, "--", *TRAINER_FLAGS))))


@functools.lru_cache(maxsize=None)
def _generated(fmt, argv: tuple) -> tuple:
    result = generate(fmt, *argv)
    assert result.returncode == 0, result.stderr
    return tuple(yaml.safe_load_all(result.stdout))


def _strict(schema):
    """A CRD's structural schema as the API server applies it with strict field validation
    (kubectl --validate=strict): an object's unknown fields are errors."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items()}
    if ("properties" in out and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


def validate_tfjob_crd(doc):
    with open(CRD_SCHEMA) as f:
        schema = _strict(json.load(f))
    jsonschema.Draft7Validator(schema).validate(doc)


def validate_tfjob(doc, version):
    """The CRD's schema; a round trip through the SDK's KubeflowOrgV1TFJob (a field the API
    does not know is dropped, so the result differs); each pod template against the
    Kubernetes schema of `version`."""
    validate_tfjob_crd(doc)

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
                                      "template": spec["template"]}, version, strict=True)


def test_the_versions_cover_1_29_to_the_newest_bundled():
    assert KUBERNETES_VERSIONS[0] == "1.29.0"
    assert KUBERNETES_VERSIONS[-1] == kubernetes_validate.utils.latest_version()
    assert len(KUBERNETES_VERSIONS) >= 9  # 1.29 ... 1.37 at least


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_tfjob_validates_on_every_version(version):
    tfjob, policy, monitor = documents("tfjob")
    validate_tfjob(tfjob, version)
    kubernetes_validate.validate(policy, version, strict=True)
    assert monitor["kind"] == "PodMonitor"


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_plain_kubernetes_set_validates_on_every_version(version):
    for doc in documents("k8s")[:-1]:  # the PodMonitor is a CRD's: below
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_crd_schema_is_strict_enough_to_catch_a_misspelt_field():
    tfjob = documents("tfjob")[0]
    validate_tfjob_crd(tfjob)
    for path, bad in ((("spec", "runPolicy"), {"cleanPodPolicy": "None", "backofLimit": 3}),
                      (("spec",), {"tfReplicaSpecs": {}, "runPolicy": {}, "sucessPolicy": ""})):
        broken = copy.deepcopy(tfjob)
        target = broken
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = bad
        with pytest.raises(jsonschema.ValidationError, match="Additional properties"):
            validate_tfjob_crd(broken)


def test_the_old_pod_failure_policy_fails_before_1_35_and_ours_passes():
    """The issue's finding: onPodConditions without `status` is refused by 1.29-1.34."""
    job = documents("k8s")[1]
    kubernetes_validate.validate(job, "1.33.0", strict=True)
    old = copy.deepcopy(job)
    old["spec"]["podFailurePolicy"]["rules"][1]["onPodConditions"][0].pop("status")
    with pytest.raises(kubernetes_validate.ValidationError, match="'status' is a required"):
        kubernetes_validate.validate(old, "1.33.0", strict=True)


def test_tfjob_has_the_operator_contract():
    tfjob, policy, monitor = documents("tfjob")
    specs = tfjob["spec"]["tfReplicaSpecs"]
    assert {r: s["replicas"] for r, s in specs.items()} == {"Chief": 1, "Worker": 2, "PS": 2,
                                                            "Evaluator": 1}
    # cleanPodPolicy None: the evaluator outlives the chief's success to its last record;
    # the restart bound that fires is the tasks' --max_restarts, and the deadline.
    assert tfjob["spec"]["runPolicy"] == {"cleanPodPolicy": "None", "backoffLimit": 10,
                                          "activeDeadlineSeconds": 7 * 24 * 3600}
    run_ids = set()
    for rtype, spec in specs.items():
        assert spec["restartPolicy"] == "ExitCode"
        container = spec["template"]["spec"]["containers"][0]
        assert container["name"] == "tensorflow"
        assert container["ports"] == [
            {"name": "tfjob-port", "containerPort": 2222, "protocol": "TCP"},
            {"name": "metrics", "containerPort": 9095, "protocol": "TCP"}]
        assert container["args"] == ["--output_dir=/output", "--metrics_port=9095",
                                     "--max_restarts=10", *TRAINER_FLAGS]
        env = {e["name"]: e for e in container["env"]}
        run_ids.add(env["LOWLEVEL_RUN_ID"]["value"])
        assert env["LOWLEVEL_CPU_REQUEST"]["valueFrom"]["resourceFieldRef"] == {
            "containerName": "tensorflow", "resource": "requests.cpu", "divisor": "1m"}
        assert spec["template"]["metadata"]["labels"]["lowlevel/run"] == "mnist"
        assert spec["template"]["metadata"]["annotations"]["prometheus.io/port"] == "9095"
        resources = container["resources"]
        assert resources["limits"]["memory"] == resources["requests"]["memory"] == "2Gi"
        gpus = resources["limits"].get("nvidia.com/gpu")
        assert gpus == ("1" if rtype in ("Chief", "Worker") else None)
        # The GPU image for the replicas with GPUs (scripts/build_image gpu).
        assert container["image"] == ("registry.example.com/lowlevel:0.1.0-gpu" if gpus
                                      else "registry.example.com/lowlevel:0.1.0")
        assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": 9095}
    assert len(run_ids) == 1 and next(iter(run_ids)).startswith("mnist-")
    ps = specs["PS"]["template"]["spec"]["containers"][0]["resources"]
    assert ps == {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "2Gi"}}
    assert monitor["spec"]["podMetricsEndpoints"] == [{"port": "metrics", "path": "/metrics",
                                                       "interval": "15s"}]
    assert monitor["spec"]["selector"] == {"matchLabels": {"lowlevel/run": "mnist"}}


def test_plain_kubernetes_set_has_its_contract():
    docs = documents("k8s")
    assert [d["kind"] for d in docs] == (["Service"] + ["Job"] * 6 + ["NetworkPolicy",
                                                                     "PodMonitor"])
    service = docs[0]
    assert service["spec"]["clusterIP"] == "None" and service["metadata"]["name"] == "mnist"
    cluster = k8s.operator_cluster("mnist", "ml", {"chief": 1, "worker": 2, "ps": 2,
                                                    "evaluator": 1}, subdomain="mnist")
    assert cluster["ps"] == ["mnist-ps-0.mnist.ml.svc:2222", "mnist-ps-1.mnist.ml.svc:2222"]
    seen = set()
    for job in docs[1:-2]:
        pod = job["spec"]["template"]["spec"]
        env = {e["name"]: e for e in pod["containers"][0]["env"]}
        tf_config = json.loads(env["TF_CONFIG"]["value"])
        task = tf_config["task"]
        seen.add((task["type"], task["index"]))
        assert tf_config == {"cluster": cluster, "task": task, "environment": "cloud"}
        assert pod["hostname"] == f"mnist-{task['type']}-{task['index']}"
        assert pod["subdomain"] == "mnist" and pod["restartPolicy"] == "Never"
        # Each Job's own uid: a new Job is a new run for the tasks' restart budgets.
        assert env["LOWLEVEL_RUN_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == (
            "metadata.labels['batch.kubernetes.io/controller-uid']")
        assert job["spec"]["template"]["metadata"]["labels"]["lowlevel/run"] == "mnist"
        assert job["spec"]["activeDeadlineSeconds"] == 7 * 24 * 3600
        fail, ignore = job["spec"]["podFailurePolicy"]["rules"]
        assert fail["action"] == "FailJob" and fail["onExitCodes"]["values"] == list(range(1, 128))
        assert ignore == {"action": "Ignore",
                          "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    assert seen == {("chief", 0), ("worker", 0), ("worker", 1), ("ps", 0), ("ps", 1),
                    ("evaluator", 0)}


def test_network_policy_admits_only_the_run_on_the_training_port():
    policy = k8s.network_policy("mnist", "ml", 9095)
    spec = policy["spec"]
    assert spec["podSelector"] == {"matchLabels": {"lowlevel/run": "mnist"}}
    assert spec["policyTypes"] == ["Ingress"]
    assert spec["ingress"] == [
        {"from": [{"podSelector": {"matchLabels": {"lowlevel/run": "mnist"}}}],
         "ports": [{"protocol": "TCP", "port": 2222}]},
        {"from": [{"namespaceSelector": {}}], "ports": [{"protocol": "TCP", "port": 9095}]}]


# The Pod Security Standards' "restricted" profile (kubernetes.io/docs/concepts/security/
# pod-security-standards), every control of baseline and restricted that a pod spec shows.
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                      "persistentVolumeClaim", "projected", "secret"}


def restricted_violations(pod: dict) -> list[str]:
    found = []
    pod_sc = pod.get("securityContext", {})
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(key):
            found.append(key)
    for volume in pod.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            found.append(f"volume {volume['name']}: {kinds}")
    if pod_sc.get("runAsUser") == 0:
        found.append("pod runAsUser 0")
    pod_seccomp = pod_sc.get("seccompProfile", {}).get("type")
    for c in pod.get("initContainers", []) + pod["containers"]:
        sc = c.get("securityContext", {})
        name = c["name"]
        if sc.get("privileged"):
            found.append(f"{name}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            found.append(f"{name}: allowPrivilegeEscalation not false")
        if not (sc.get("runAsNonRoot") or pod_sc.get("runAsNonRoot")) or \
                sc.get("runAsNonRoot") is False:
            found.append(f"{name}: runAsNonRoot")
        if sc.get("runAsUser") == 0:
            found.append(f"{name}: runAsUser 0")
        seccomp = sc.get("seccompProfile", {}).get("type") or pod_seccomp
        if seccomp not in ("RuntimeDefault", "Localhost"):
            found.append(f"{name}: seccompProfile {seccomp}")
        caps = sc.get("capabilities", {})
        if "ALL" not in caps.get("drop", []):
            found.append(f"{name}: capabilities not dropped")
        if set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            found.append(f"{name}: capabilities added {caps['add']}")
        if any(p.get("hostPort") for p in c.get("ports", [])):
            found.append(f"{name}: hostPort")
    return found


def _pods(fmt, *flags):
    docs = documents(fmt, *flags)
    if fmt == "tfjob":
        return [s["template"]["spec"] for s in docs[0]["spec"]["tfReplicaSpecs"].values()]
    return [d["spec"]["template"]["spec"] for d in docs if d["kind"] == "Job"]


@pytest.mark.parametrize("fmt", ["tfjob", "k8s"])
def test_pods_meet_the_restricted_profile_with_a_writable_tmp_and_no_fixed_uid(fmt):
    for pod in _pods(fmt):
        assert restricted_violations(pod) == []
        container = pod["containers"][0]
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
        assert {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}} in pod["volumes"]
        assert "runAsUser" not in pod["securityContext"]  # OpenShift's restricted-v2 assigns
        assert "runAsUser" not in container["securityContext"]
        assert pod["securityContext"]["fsGroup"] == 1000
        assert pod["automountServiceAccountToken"] is False
    for pod in _pods(fmt, "--run_as_user=10001", "--fs_group=none"):
        assert restricted_violations(pod) == []
        assert pod["securityContext"]["runAsUser"] == 10001
        assert "fsGroup" not in pod["securityContext"]
    assert restricted_violations({"containers": [{"name": "c"}]})  # the checker can fail


def checkov():
    """The checkov scanner that scripts/test installs into .venv/checkov (its own venv: its
    pinned dependencies stay out of the project's)."""
    here = os.path.join(os.path.dirname(sys.executable), "..", "checkov", "bin", "checkov")
    found = here if os.path.exists(here) else shutil.which("checkov")
    assert found, ("checkov is not installed: scripts/test installs it into .venv/checkov "
                   "(python -m venv .venv/checkov && .venv/checkov/bin/pip install checkov)")
    return found


def run_checkov(tmp_path, named_docs: dict) -> dict:
    """Runs checkov on each {file name: documents}, offline (--skip-download: it contacts
    nothing); returns its summary and results, merged."""
    argv = [checkov(), "--framework", "kubernetes", "-o", "json", "--skip-download"]
    for name, docs in named_docs.items():
        path = tmp_path / name
        path.write_text(k8s.dump_all(docs))
        argv += ["-f", str(path)]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=240, cwd=tmp_path,
                            env=dict(os.environ, HOME=str(tmp_path)))
    assert result.returncode in (0, 1), result.stderr[-3000:]
    reports = json.loads(result.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    merged = {"failed": [], "skipped": [], "passed": 0, "resources": 0}
    for report in reports:
        if "results" not in report:  # no resource of a kind checkov scans
            continue
        merged["failed"] += report["results"].get("failed_checks", [])
        merged["skipped"] += report["results"].get("skipped_checks", [])
        merged["passed"] += report["summary"]["passed"]
        merged["resources"] += report["summary"]["resource_count"]
    return merged


def _as_pods(tfjob):
    """The pods the operator makes from a TFJob (checkov does not know the TFJob kind)."""
    return [{"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": f"mnist-{rtype.lower()}-0", "namespace": "ml",
                          **copy.deepcopy(spec["template"]["metadata"])},
             "spec": copy.deepcopy(spec["template"]["spec"])}
            for rtype, spec in tfjob["spec"]["tfReplicaSpecs"].items()]


@pytest.mark.cluster  # runs checkov (its own process, ~10-20 s)
@pytest.mark.timeout(300)
def test_checkov_fails_no_check_and_each_skip_is_in_the_manifest_with_its_reason(tmp_path):
    hardened = ["--image=registry.example.com/lowlevel@sha256:" + "0" * 64, "--cpu_limits",
                "--run_as_user=10001"]
    report = run_checkov(tmp_path, {
        "k8s.yaml": documents("k8s"),
        "tfjob-pods.yaml": _as_pods(documents("tfjob")[0]),
        "k8s-hardened.yaml": documents("k8s", *hardened, "--worker_gpus=0"),
        "default-namespace.yaml": documents(
            "k8s", layout=[a for a in LAYOUT if not a.startswith("--namespace")]),
    })
    assert report["resources"] >= 14 + 4 and report["passed"] > 500
    assert report["failed"] == [], sorted({(f["check_id"], f["resource"])
                                           for f in report["failed"]})
    skipped = {(s["check_id"], s["file_path"].lstrip("/")) for s in report["skipped"]}
    # A skip only where a flag asked for what the check forbids, with the reason written.
    assert {c for c, f in skipped if f == "k8s.yaml"} == {"CKV_K8S_11", "CKV_K8S_40",
                                                          "CKV_K8S_43"}
    assert not {c for c, f in skipped if f == "k8s-hardened.yaml"}
    assert {c for c, f in skipped if f == "default-namespace.yaml"} == {
        "CKV_K8S_11", "CKV_K8S_40", "CKV_K8S_43", "CKV_K8S_21"}
    for s in report["skipped"]:
        assert len(s["check_result"].get("suppress_comment", "")) > 20, s


def test_skip_reasons_survive_checkovs_parser():
    """checkov splits `CHECK=reason` at '='; a reason may hold none."""
    for doc in documents("k8s"):
        for key, text in doc["metadata"].get("annotations", {}).items():
            if key.startswith("checkov.io/skip"):
                assert re.fullmatch(r"CKV_K8S_\d+=[^=]{20,}", text), text


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


def test_a_dynamic_tfjob_resized_gives_the_new_worker_a_sparse_cluster_of_its_own():
    """--dynamic_workers: enableDynamicWorker, valid; after the Worker replicas are patched
    from 2 to 3 (kubectl patch, what `lowlevel.launch --resize` does on one machine), the
    operator's TF_CONFIG of the new worker names only the ps tasks and itself."""
    layout = [f for f in LAYOUT if f != "--chief_job"]
    tfjob = documents("tfjob", "--dynamic_workers", layout=layout)[0]
    assert tfjob["spec"]["enableDynamicWorker"] is True
    validate_tfjob(tfjob, KUBERNETES_VERSIONS[-1])
    tfjob["spec"]["tfReplicaSpecs"]["Worker"]["replicas"] = 3
    configs = k8s.tfjob_tf_configs(tfjob)
    assert configs[("worker", 2)] == {"sparseCluster": {
        "worker": {"2": "mnist-worker-2.ml.svc:2222"},
        "ps": ["mnist-ps-0.ml.svc:2222", "mnist-ps-1.ml.svc:2222"]},
        "task": {"type": "worker", "index": 2}}


BASE = ["--name=r", "--image=i:1", "--pvc=p", "--output_dir=/o"]


@pytest.mark.parametrize("flags,needle", [
    (["--image=i", "--pvc=p", "--output_dir=/o"], "--name=None: expected a DNS label"),
    (["--name=Bad_Name", "--image=i", "--pvc=p", "--output_dir=/o"], "--name=Bad_Name"),
    (["--name=r", "--pvc=p", "--output_dir=/o"], "--image is required"),
    (["--name=r", "--image=i"], "--pvc and --output_dir are required"),
    (BASE + ["--cpu=gpu=1"], "--cpu=gpu=1: expected one value"),
    (BASE + ["--ps=h:1"], "--ps gives addresses"),
    (BASE + ["--cpu=two"], "--cpu=two: 'two' is not a CPU quantity: expected CPUs such as "
                           "2, 0.5 or 500m"),
    (BASE + ["--cpu=ps=0"], "--cpu=ps=0: ps: '0': expected more than 0 CPUs"),
    (BASE + ["--memory=2GB"], "--memory=2GB: '2GB' is not a memory quantity: expected "
                              "bytes with a Kubernetes suffix such as 512Mi, 4Gi or 2G (not "
                              "2GB)"),
    (BASE + ["--memory=worker=256Mi"], "--memory=worker=256Mi: worker: '256Mi' is 256 MiB: a "
                                       "task needs at least 1024 MiB"),
    (["--name=r", "--image=i:1", "--pvc=p", "--output_dir=out"],
     "--output_dir=out: expected an absolute path"),
    (BASE + ["--fs_group=wheel"], "--fs_group=wheel: expected a group id"),
    (BASE + ["--run_as_user=0"], "--run_as_user=0: expected a UID above 0"),
    (BASE + ["--metrics_port=2222"], "--metrics_port=2222: expected a port other than"),
    (BASE + ["--metrics_port=0", "--pod_monitor"], "--pod_monitor needs --metrics_port"),
    (BASE + ["--worker_gpus=1", "--image=r/i@sha256:" + "0" * 64], "is pinned by digest: "
                                                                   "give --gpu_image"),
    (BASE + ["--", "--max_restarts=3"], "--max_restarts=3 after '--': give it to this tool"),
    (BASE + ["--dynamic_workers", "--chief_job"], "--dynamic_workers: a TFJob's "
                                                   "enableDynamicWorker"),
])
def test_generator_usage_errors(flags, needle):
    result = generate("tfjob", *flags)
    assert result.returncode == 2 and not result.stdout
    assert needle in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_help_lists_every_kubernetes_flag():
    result = clusters.run([sys.executable, "-m", "lowlevel.tf_configs", "--help"], timeout=60)
    for flag in ("--cpu", "--memory", "--cpu_limits", "--max_restarts", "--metrics_port",
                 "--pod_monitor", "--run_as_user", "--fs_group", "--gpu_image",
                 "--active_deadline_secs", "--run_id"):
        assert f"  {flag}:" in result.stdout or f"  --[no]{flag[2:]}:" in result.stdout, flag


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
        procs[name] = clusters.start_on(hosts, name,
                                        [sys.executable, "-m", "lowlevel.trainer", *args],
                                        logs[name], env={"TF_CONFIG": tf_config})
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
