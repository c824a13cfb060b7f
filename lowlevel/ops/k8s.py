"""Kubernetes manifests for a lowlevel run: a `TFJob`, or plain Jobs; `TF_CONFIG` as the
training operator writes it; a NetworkPolicy.

Two layouts, both ready for `kubectl apply -f` (docs/kubernetes.md):

- `tfjob(...)`: one `TFJob` (`kubeflow.org/v1`, the training operator v1.x;
  Kubeflow Trainer v2 has no TFJob) for Kubeflow's training operator, which
  creates a pod and a headless Service per replica and sets each pod's
  `TF_CONFIG` (`operator_tf_config` computes the same value). Replica specs
  Chief / Worker / PS / Evaluator, container `tensorflow`, port `tfjob-port`
  2222, `restartPolicy: ExitCode` (the operator replaces a pod that exits
  128-255 and fails on 1-127: `lowlevel.errors`), `runPolicy` with
  `cleanPodPolicy: None` (an evaluator still writing its last record is not
  deleted when the chief succeeds), `backoffLimit` and `activeDeadlineSeconds`.
  The operator's backoffLimit sums its running pods' restartCounts, which stay
  0 under ExitCode: the bound that fires is each task's `--max_restarts`
  (`lowlevel.runtime.restarts`), counted per run (`LOWLEVEL_RUN_ID`).
- `plain(...)`: no operator. One headless Service `NAME` for the run and one
  `batch/v1` Job per task whose pod sets `hostname: NAME-ROLE-I` and
  `subdomain: NAME`, so `NAME-ROLE-I.NAME.NAMESPACE.svc` resolves; `TF_CONFIG`
  in the operator's form with those host names; a `podFailurePolicy` that
  fails the Job on the permanent statuses 1-127, does not count a pod evicted
  by a disruption (preemption, node drain) against `backoffLimit`, and
  otherwise (128-255: signals, 200) lets the Job start a new pod.

Every pod meets the Pod Security "restricted" profile (`PodOptions`): non-root
with no fixed UID unless asked, no privilege escalation, no capabilities, the
runtime's seccomp profile, a read-only root filesystem with an `emptyDir` at
/tmp, no service account token; `fsGroup` makes the volume writable where its
type supports it. Each container has memory requests equal to its limits, CPU
requests (its CPU request in `LOWLEVEL_CPU_REQUEST`, from which the task sizes
its thread pools: `lowlevel.ops.resources`), and, with a metrics port, Prometheus
annotations and startup, liveness and readiness probes on the trainer's
`/healthz` (`lowlevel.runtime.metrics`). The checks of `checkov` the pods fail by
design are skipped in the manifest, each with its reason (`scanner_skips`).

A user's script in place of the trainer (`lowlevel.tf_configs --script`): the containers'
`command` is `python -m lowlevel` (`PodOptions.command`), with no metrics port or probes;
`plain(cluster_flags=True)` gives each task the Distributed TensorFlow guide's cluster
flags (`guide_flags`) in place of `TF_CONFIG`.

Both add a `NetworkPolicy`: ingress to the training port only from the pods
of the same run (label `lowlevel/run: NAME`), because a TensorFlow server runs
any graph anyone sends it, with no authentication; and to the metrics port
from any pod (Prometheus). `pod_monitor` is a Prometheus Operator `PodMonitor`
for the run.

Host names follow the operator's `genClusterSpec`
(kubeflow/training-operator, pkg/controller.v1/tensorflow/tensorflow.go):
`NAME-ROLE-I.NAMESPACE.svc:PORT`, the evaluator inside the cluster map
(current operator versions), `"environment": "cloud"`, and with
`enableDynamicWorker` a `"sparseCluster"` (a worker sees the ps tasks and
itself, a ps only itself, a chief or evaluator nothing).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Optional

import yaml

PORT = 2222
PORT_NAME = "tfjob-port"
CONTAINER = "tensorflow"
RUN_LABEL = "lowlevel/run"
ROLE_LABEL = "lowlevel/role"
METRICS_PORT = 9095  # the trainer's --metrics_port in the manifests: /metrics and /healthz
METRICS_PORT_NAME = "metrics"
RUN_ID_ENV = "LOWLEVEL_RUN_ID"  # lowlevel.runtime.restarts: one restart budget per run
CPU_REQUEST_ENV = "LOWLEVEL_CPU_REQUEST"  # lowlevel.ops.resources: the pod's CPU request
# A plain Job's pods carry their Job's uid in this label (Kubernetes 1.27+): a new Job,
# a new restart budget.
JOB_UID_LABEL = "batch.kubernetes.io/controller-uid"
# Replica types of a TFJob, in the order the manifests list them, and the
# TF_CONFIG job type of each (the operator lower-cases the replica type).
REPLICA_TYPES = {"Chief": "chief", "Worker": "worker", "PS": "ps", "Evaluator": "evaluator"}


class FlowList(list):
    """A list `dump_all` writes on one line ([1, 2, 3]), e.g. the 127 permanent statuses."""


PERMANENT_STATUSES = FlowList(range(1, 128))  # lowlevel.errors: 1-127 are never retried


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(FlowList, lambda dumper, data: dumper.represent_sequence(
    "tag:yaml.org,2002:seq", data, flow_style=True))


def dump_all(docs: list[dict]) -> str:
    """Multi-document YAML of `docs`, keys in the order built, for `kubectl apply -f`."""
    return yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False, width=100)


def host(name: str, namespace: str, job: str, index: int, subdomain: Optional[str] = None,
         port: int = PORT) -> str:
    """`NAME-JOB-I.NAMESPACE.svc:PORT` (the operator's per-replica Service), or with
    `subdomain` `NAME-JOB-I.SUBDOMAIN.NAMESPACE.svc:PORT` (a pod's hostname under a
    headless Service)."""
    pod = f"{name}-{job}-{index}".replace("/", "-")
    return f"{pod}.{subdomain + '.' if subdomain else ''}{namespace}.svc:{port}"


def operator_cluster(name: str, namespace: str, replicas: dict[str, int],
                     evaluator_in_cluster: bool = True, subdomain: Optional[str] = None,
                     port: int = PORT) -> dict[str, list[str]]:
    """The cluster map the training operator builds: {job: [host:port, ...]}.

    Args:
      replicas: {TF_CONFIG job type ("chief", "worker", "ps", "evaluator"): count}.
      evaluator_in_cluster: current operator versions list the evaluator in the
        map; older ones left it out ("evaluator is not part of training cluster").
    """
    return {job: [host(name, namespace, job, i, subdomain, port) for i in range(count)]
            for job, count in replicas.items()
            if count and (job != "evaluator" or evaluator_in_cluster)}


def operator_tf_config(cluster: dict[str, list[str]], job: str, index: int,
                       sparse: bool = False) -> dict:
    """The `TF_CONFIG` of replica `job`/`index`, as the training operator writes it.

    `sparse` (the TFJob's `enableDynamicWorker`): `{"sparseCluster": {"worker":
    {"I": own address}, "ps": [every ps]}}` for a worker, `{"ps": [own]}` for a
    ps, empty for other types, and no "environment".
    """
    task = {"type": job, "index": index}
    if not sparse:
        return {"cluster": cluster, "task": task, "environment": "cloud"}
    spec = {"worker": {}, "ps": []}
    if job == "ps":
        spec["ps"] = [cluster["ps"][index]]
    elif job == "worker":
        spec["ps"] = list(cluster.get("ps", []))
        spec["worker"] = {str(index): cluster["worker"][index]}
    return {"sparseCluster": spec, "task": task}


def tfjob_tf_configs(tfjob: dict, sparse: Optional[bool] = None) -> dict[tuple[str, int], dict]:
    """{(job, index): TF_CONFIG} of every replica of a `TFJob` manifest, as the operator sets it.

    The port is the container port named `tfjob-port` of each replica's
    `tensorflow` container (2222 if none). `sparse` defaults to the TFJob's
    `enableDynamicWorker`.
    """
    meta, spec = tfjob["metadata"], tfjob["spec"]
    if sparse is None:
        sparse = bool(spec.get("enableDynamicWorker"))
    replicas, ports = {}, {}
    for rtype, rspec in spec["tfReplicaSpecs"].items():
        job = rtype.lower()
        replicas[job] = int(rspec.get("replicas", 1))
        container = next(c for c in rspec["template"]["spec"]["containers"]
                         if c["name"] == CONTAINER)
        ports[job] = next((p["containerPort"] for p in container.get("ports", [])
                           if p.get("name") == PORT_NAME), PORT)
    cluster = {job: [host(meta["name"], meta.get("namespace", "default"), job, i,
                          port=ports[job]) for i in range(count)]
               for job, count in replicas.items() if count}
    return {(job, i): operator_tf_config(cluster, job, i, sparse)
            for job, count in replicas.items() for i in range(count)}


def guide_flags(cluster: dict[str, list[str]], job: str, index: int) -> list[str]:
    """The Distributed TensorFlow guide's cluster flags of task `job`/`index` of `cluster`
    ({"ps": [host:port, ...], "worker": [...]}): `--ps_hosts --worker_hosts --job_name
    --task_index`, as its skeleton trainer reads them."""
    return [f"--ps_hosts={','.join(cluster.get('ps', []))}",
            f"--worker_hosts={','.join(cluster.get('worker', []))}",
            f"--job_name={job}", f"--task_index={index}"]


def _labels(name: str, job: Optional[str] = None) -> dict:
    return {RUN_LABEL: name, **({ROLE_LABEL: job} if job else {})}


@dataclasses.dataclass(frozen=True)
class PodOptions:
    """How every pod of a run is set up, beyond its image, args and resources.

    Attributes:
      run_as_user: the UID to run as; None: the image's (1000), or the platform's
        (OpenShift's restricted-v2 assigns one and refuses a fixed one).
      fs_group: the group the volume is made writable for (Kubernetes changes the
        group of a volume that supports it: most block and CSI volumes, not NFS);
        None: the platform's (OpenShift assigns one).
      metrics_port: the trainer's `--metrics_port` (Prometheus metrics, and
        `/healthz` for the probes); None: no metrics and no probes.
      tmp_size: the size limit of the `emptyDir` at /tmp (the root filesystem is
        read-only; TensorFlow and Python write temporary files there).
      run_id: `LOWLEVEL_RUN_ID` of every task (`lowlevel.runtime.restarts`); None: the
        pod's Job's uid (plain Jobs).
      command: the container's `command` in place of the image's entrypoint (the
        trainer): `("python", "-m", "lowlevel")` for a script; None: the entrypoint.
    """

    run_as_user: Optional[int] = None
    fs_group: Optional[int] = 1000
    metrics_port: Optional[int] = METRICS_PORT
    tmp_size: str = "1Gi"
    run_id: Optional[str] = None
    scanner_skips: tuple = ()  # (check id, reason) of checkov's checks the pods do not meet
    command: Optional[tuple] = None  # the container's command (a script's: python -m lowlevel)


def scanner_skips(image, run_as_user: Optional[int], cpu_limits: bool,
                  probes: bool = True) -> tuple:
    """The checks of `checkov` (a manifest scanner) the pods fail by design, each with its
    reason, as `checkov.io/skipN` annotations record them in the manifest (`probes` False:
    the pods have no liveness and readiness probes)."""
    images = image.values() if isinstance(image, dict) else [image]
    skips = []
    if not probes:
        skips += [(check, f"no {kind} probe: the task serves no /healthz to probe (a script "
                   "under python -m lowlevel; the trainer with --metrics_port 0); a task that "
                   "fails exits, and its exit status decides its restart")
                  for check, kind in (("CKV_K8S_8", "liveness"), ("CKV_K8S_9", "readiness"))]
    if not cpu_limits:
        skips.append(("CKV_K8S_11", "CPU requests without a limit: a CFS quota throttles a "
                      "training step mid-computation; --cpu_limits sets limits"))
    if any("@sha256:" not in i for i in images):
        skips.append(("CKV_K8S_43", "the image is given by tag (--image); pin it by digest, "
                      "REGISTRY/lowlevel@sha256:..., to meet this"))
    if run_as_user is None or run_as_user < 10000:
        skips.append(("CKV_K8S_40", "the UID is the image's (1000) or the platform's "
                      "(OpenShift assigns one); --run_as_user 10001 sets a high one"))
    return tuple(skips)


def note_default_namespace(docs: list[dict]) -> list[dict]:
    """Records in each document in the namespace `default` why checkov's CKV_K8S_21 ("the
    default namespace should not be used") is skipped: it was asked for."""
    for doc in docs:
        if doc["metadata"].get("namespace") == "default":
            doc["metadata"].setdefault("annotations", {})["checkov.io/skip-namespace"] = (
                "CKV_K8S_21=--namespace default was given or left as it is; give the "
                "namespace of your team")
    return docs


def _skip_annotations(options: PodOptions) -> dict:
    return {f"checkov.io/skip{i}": f"{check}={reason}"
            for i, (check, reason) in enumerate(options.scanner_skips, 1)}


# Probes on the trainer's /healthz (lowlevel.runtime.metrics): 200 while its gRPC server answers.
# Startup: TensorFlow's import and the data (tens of seconds on a slow node) within 5 min.
# Liveness: a frozen task (SIGSTOP, a hung process: the kernel still accepts connections,
# so a TCP probe would pass) fails 3 checks 10 s apart and is restarted.
STARTUP_PROBE = {"periodSeconds": 5, "timeoutSeconds": 5, "failureThreshold": 60}
LIVENESS_PROBE = {"periodSeconds": 10, "timeoutSeconds": 5, "failureThreshold": 3}
READINESS_PROBE = {"periodSeconds": 10, "timeoutSeconds": 5, "failureThreshold": 3}


def _probe(port: int, timing: dict) -> dict:
    return {"httpGet": {"path": "/healthz", "port": port}, **timing}


def _container(image: str, args: list[str], resources: dict, output_dir: str,
               env: Optional[list] = None, options: Optional[PodOptions] = None) -> dict:
    options = options or PodOptions()
    container = {
        "name": CONTAINER,
        "image": image,
        # Nodes check the registry for the tag at each start (a digest: never pulled twice).
        "imagePullPolicy": "Always",
        **({"command": list(options.command)} if options.command else {}),
        "args": list(args),
        "ports": [{"name": PORT_NAME, "containerPort": PORT, "protocol": "TCP"}],
        "volumeMounts": [{"name": "output", "mountPath": output_dir},
                         {"name": "tmp", "mountPath": "/tmp"}],
        # Pod Security "restricted": no escalation, no capabilities, a read-only root.
        "securityContext": {"allowPrivilegeEscalation": False,
                            "capabilities": {"drop": ["ALL"]},
                            "readOnlyRootFilesystem": True, "runAsNonRoot": True},
    }
    if options.run_as_user is not None:
        container["securityContext"]["runAsUser"] = options.run_as_user
    if resources:
        container["resources"] = resources
    env = list(env or [])
    # The CPUs the task sizes its thread pools from when it has no CPU limit
    # (lowlevel.ops.resources), in millicores.
    env.append({"name": CPU_REQUEST_ENV, "valueFrom": {"resourceFieldRef": {
        "containerName": CONTAINER, "resource": "requests.cpu", "divisor": "1m"}}})
    if options.run_id is not None:
        env.append({"name": RUN_ID_ENV, "value": options.run_id})
    else:
        env.append({"name": RUN_ID_ENV, "valueFrom": {"fieldRef": {
            "fieldPath": f"metadata.labels['{JOB_UID_LABEL}']"}}})
    container["env"] = env
    if options.metrics_port:
        container["ports"].append({"name": METRICS_PORT_NAME,
                                   "containerPort": options.metrics_port, "protocol": "TCP"})
        container["startupProbe"] = _probe(options.metrics_port, STARTUP_PROBE)
        container["livenessProbe"] = _probe(options.metrics_port, LIVENESS_PROBE)
        container["readinessProbe"] = _probe(options.metrics_port, READINESS_PROBE)
    return container


def _pod_spec(container: dict, pvc: str, restart_policy: Optional[str] = None,
              options: Optional[PodOptions] = None) -> dict:
    options = options or PodOptions()
    security = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    if options.run_as_user is not None:
        security["runAsUser"] = options.run_as_user
    if options.fs_group is not None:
        # The volume's files get this group (where the volume type supports it), so that
        # the task, whatever its UID, can write --output_dir; only the top directory is
        # checked when it already matches (large volumes mount fast).
        security["fsGroup"] = options.fs_group
        security["fsGroupChangePolicy"] = "OnRootMismatch"
    spec = {
        "automountServiceAccountToken": False,  # a task never calls the Kubernetes API
        "securityContext": security,
        "containers": [container],
        "volumes": [{"name": "output", "persistentVolumeClaim": {"claimName": pvc}},
                    {"name": "tmp", "emptyDir": {"sizeLimit": options.tmp_size}}],
    }
    if restart_policy:
        spec["restartPolicy"] = restart_policy
    return spec


def _template_metadata(name: str, job: str, options: PodOptions) -> dict:
    metadata = {"labels": _labels(name, job)}
    annotations = _skip_annotations(options)
    if options.metrics_port:  # for a Prometheus that discovers pods by annotation
        annotations.update({"prometheus.io/scrape": "true",
                            "prometheus.io/port": str(options.metrics_port),
                            "prometheus.io/path": "/metrics"})
    if annotations:
        metadata["annotations"] = annotations
    return metadata


def network_policy(name: str, namespace: str, metrics_port: Optional[int] = None) -> dict:
    """Ingress to the run's pods only on the training port, only from pods of the same run;
    and on `metrics_port` (read-only metrics and health) from any pod, Prometheus' too."""
    policy = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": f"{name}-training-port", "namespace": namespace,
                     "labels": _labels(name)},
        "spec": {
            "podSelector": {"matchLabels": _labels(name)},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": {"matchLabels": _labels(name)}}],
                         "ports": [{"protocol": "TCP", "port": PORT}]}],
        },
    }
    if metrics_port:
        policy["spec"]["ingress"].append({"from": [{"namespaceSelector": {}}],
                                          "ports": [{"protocol": "TCP", "port": metrics_port}]})
    return policy


def pod_monitor(name: str, namespace: str) -> dict:
    """A Prometheus Operator `PodMonitor` scraping every pod of the run on its metrics port,
    with the pods' run and role labels on every series (`lowlevel_run`, `lowlevel_role`)."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": {"name": name, "namespace": namespace, "labels": _labels(name)},
        "spec": {
            "selector": {"matchLabels": _labels(name)},
            "podMetricsEndpoints": [{"port": METRICS_PORT_NAME, "path": "/metrics",
                                     "interval": "15s"}],
            "podTargetLabels": [RUN_LABEL, ROLE_LABEL],
        },
    }


def _image(image, job: str) -> str:
    """`image` may be {job type: image} (the GPU image for the chief and workers)."""
    return image.get(job, image.get("default")) if isinstance(image, dict) else image


def tfjob(name: str, namespace: str, image, replicas: dict[str, int], args: list[str],
          output_dir: str, pvc: str, resources: dict[str, dict], backoff_limit: int,
          options: Optional[PodOptions] = None,
          active_deadline_secs: Optional[int] = None, dynamic_workers: bool = False) -> dict:
    """The `TFJob` of a run.

    Args:
      image: the container image, or {job type (or "default"): image}.
      replicas: {job type: count}, job types as in `REPLICA_TYPES`' values.
      args: the trainer flags, the same for every replica (the job type comes
        from `TF_CONFIG`).
      resources: {job type: a container `resources` dict}.
      backoff_limit: `runPolicy.backoffLimit`. The operator compares it with the
        restartCount of its running pods' containers, which stays 0 with
        `restartPolicy: ExitCode` (a failed pod is replaced, not restarted): the
        restart bound that fires is each task's `--max_restarts`.
      options: the pods' `PodOptions`; its `run_id` should be set (a TFJob's pods
        have no label holding a uid of the run).
      active_deadline_secs: `runPolicy.activeDeadlineSeconds`: the run fails after
        this long, whatever happens (None: no bound).
      dynamic_workers: `enableDynamicWorker: true`: each pod gets a `sparseCluster`
        TF_CONFIG, so the Worker replicas may change while the job runs (the operator
        creates the pods of new indices and deletes those at or above the new count).
    """
    options = options or PodOptions()
    specs = {}
    for rtype, job in REPLICA_TYPES.items():
        if not replicas.get(job):
            continue
        container = _container(_image(image, job), args, resources.get(job, {}), output_dir,
                               options=options)
        specs[rtype] = {
            "replicas": replicas[job],
            "restartPolicy": "ExitCode",
            "template": {"metadata": _template_metadata(name, job, options),
                         "spec": _pod_spec(container, pvc, options=options)},
        }
    # cleanPodPolicy None: when the chief succeeds the operator deletes nothing, so an
    # evaluator still evaluating the last checkpoint ends by itself (Running would
    # delete it mid-record); the ps tasks exit 0 at the chief's word.
    run_policy = {"cleanPodPolicy": "None", "backoffLimit": backoff_limit}
    if active_deadline_secs:
        run_policy["activeDeadlineSeconds"] = active_deadline_secs
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": name, "namespace": namespace, "labels": _labels(name)},
        "spec": {"runPolicy": run_policy, "tfReplicaSpecs": specs,
                 **({"enableDynamicWorker": True} if dynamic_workers else {})},
    }


def plain(name: str, namespace: str, image, replicas: dict[str, int], args: list[str],
          output_dir: str, pvc: str, resources: dict[str, dict],
          backoff_limit: int, options: Optional[PodOptions] = None,
          active_deadline_secs: Optional[int] = None,
          cluster_flags: bool = False) -> list[dict]:
    """A headless Service and one `batch/v1` Job per task (see the module docstring);
    arguments as `tfjob`'s (`options.run_id` None: each task's budget is its Job's uid).
    `cluster_flags`: each task gets the guide's cluster flags (`guide_flags`) after `args`
    in place of `TF_CONFIG` (a script that reads them; jobs ps and worker only)."""
    options = options or PodOptions()
    docs = [{
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace, "labels": _labels(name)},
        "spec": {"clusterIP": "None", "selector": _labels(name),
                 # DNS records before the pods are ready: tasks find each other at once.
                 "publishNotReadyAddresses": True,
                 "ports": [{"name": PORT_NAME, "port": PORT, "targetPort": PORT,
                            "protocol": "TCP"}]},
    }]
    cluster = operator_cluster(name, namespace, replicas, subdomain=name)
    for job in REPLICA_TYPES.values():
        for index in range(replicas.get(job, 0)):
            tf_config = json.dumps(operator_tf_config(cluster, job, index), sort_keys=True)
            env = [] if cluster_flags else [{"name": "TF_CONFIG", "value": tf_config}]
            task_args = [*args, *guide_flags(cluster, job, index)] if cluster_flags else args
            container = _container(_image(image, job), task_args, resources.get(job, {}),
                                   output_dir, env=env, options=options)
            pod = _pod_spec(container, pvc, restart_policy="Never", options=options)
            pod["hostname"] = f"{name}-{job}-{index}"
            pod["subdomain"] = name
            docs.append({
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": f"{name}-{job}-{index}", "namespace": namespace,
                             "labels": _labels(name, job),
                             **({"annotations": _skip_annotations(options)}
                                if options.scanner_skips else {})},
                "spec": {
                    "completions": 1,
                    "parallelism": 1,
                    "backoffLimit": backoff_limit,
                    **({"activeDeadlineSeconds": active_deadline_secs}
                       if active_deadline_secs else {}),
                    "podFailurePolicy": {"rules": [
                        {"action": "FailJob",
                         "onExitCodes": {"containerName": CONTAINER, "operator": "In",
                                         "values": PERMANENT_STATUSES}},
                        # status is required by the API before Kubernetes 1.35.
                        {"action": "Ignore",
                         "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
                    ]},
                    "template": {"metadata": _template_metadata(name, job, options),
                                 "spec": pod},
                },
            })
    return docs
