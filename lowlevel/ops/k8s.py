"""Kubernetes manifests for a lowlevel run: a `TFJob`, or plain Jobs; `TF_CONFIG` as the
training operator writes it; a NetworkPolicy.

Two layouts, both ready for `kubectl apply -f`:

- `tfjob(...)`: one `TFJob` (`kubeflow.org/v1`) for Kubeflow's training
  operator, which creates a pod and a headless Service per replica and sets
  each pod's `TF_CONFIG` (`operator_tf_config` computes the same value).
  Replica specs Chief / Worker / PS / Evaluator, container `tensorflow`, port
  `tfjob-port` 2222, `restartPolicy: ExitCode` (the operator restarts a pod
  that exits 128-255 and fails on 1-127: `lowlevel.errors`), `runPolicy`
  with `cleanPodPolicy: Running` and `backoffLimit`.
- `plain(...)`: no operator. One headless Service `NAME` for the run and one
  `batch/v1` Job per task whose pod sets `hostname: NAME-ROLE-I` and
  `subdomain: NAME`, so `NAME-ROLE-I.NAME.NAMESPACE.svc` resolves; `TF_CONFIG`
  in the operator's form with those host names; a `podFailurePolicy` that
  fails the Job on the permanent statuses 1-127, does not count a pod evicted
  by a disruption (preemption, node drain) against `backoffLimit`, and
  otherwise (128-255: signals, 200) lets the Job start a new pod.

Both add a `NetworkPolicy`: ingress to the training port only from the pods
of the same run (label `lowlevel/run: NAME`), because a TensorFlow server runs
any graph anyone sends it, with no authentication.

Host names follow the operator's `genClusterSpec`
(kubeflow/training-operator, pkg/controller.v1/tensorflow/tensorflow.go):
`NAME-ROLE-I.NAMESPACE.svc:PORT`, the evaluator inside the cluster map
(current operator versions), `"environment": "cloud"`, and with
`enableDynamicWorker` a `"sparseCluster"` (a worker sees the ps tasks and
itself, a ps only itself, a chief or evaluator nothing).
"""

from __future__ import annotations

import json
from typing import Optional

import yaml

PORT = 2222
PORT_NAME = "tfjob-port"
CONTAINER = "tensorflow"
RUN_LABEL = "lowlevel/run"
ROLE_LABEL = "lowlevel/role"
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


def _labels(name: str, job: Optional[str] = None) -> dict:
    return {RUN_LABEL: name, **({ROLE_LABEL: job} if job else {})}


def _container(image: str, args: list[str], resources: dict, output_dir: str,
               env: Optional[list] = None) -> dict:
    container = {
        "name": CONTAINER,
        "image": image,
        "args": list(args),
        "ports": [{"name": PORT_NAME, "containerPort": PORT, "protocol": "TCP"}],
        "volumeMounts": [{"name": "output", "mountPath": output_dir}],
    }
    if resources:
        container["resources"] = resources
    if env:
        container["env"] = env
    return container


def _pod_spec(container: dict, pvc: str, restart_policy: Optional[str] = None) -> dict:
    spec = {
        "containers": [container],
        "volumes": [{"name": "output", "persistentVolumeClaim": {"claimName": pvc}}],
        # The image runs as a non-root user; fsGroup lets it write the volume.
        "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "fsGroup": 1000},
    }
    if restart_policy:
        spec["restartPolicy"] = restart_policy
    return spec


def network_policy(name: str, namespace: str) -> dict:
    """Ingress to the run's pods only on the training port, only from pods of the same run."""
    return {
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


def tfjob(name: str, namespace: str, image: str, replicas: dict[str, int], args: list[str],
          output_dir: str, pvc: str, resources: dict[str, dict], backoff_limit: int) -> dict:
    """The `TFJob` of a run.

    Args:
      replicas: {job type: count}, job types as in `REPLICA_TYPES`' values.
      args: the trainer flags, the same for every replica (the job type comes
        from `TF_CONFIG`).
      resources: {job type: a container `resources` dict}.
    """
    specs = {}
    for rtype, job in REPLICA_TYPES.items():
        if not replicas.get(job):
            continue
        container = _container(image, args, resources.get(job, {}), output_dir)
        specs[rtype] = {
            "replicas": replicas[job],
            "restartPolicy": "ExitCode",
            "template": {"metadata": {"labels": _labels(name, job)},
                         "spec": _pod_spec(container, pvc)},
        }
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": name, "namespace": namespace, "labels": _labels(name)},
        "spec": {"runPolicy": {"cleanPodPolicy": "Running", "backoffLimit": backoff_limit},
                 "tfReplicaSpecs": specs},
    }


def plain(name: str, namespace: str, image: str, replicas: dict[str, int], args: list[str],
          output_dir: str, pvc: str, resources: dict[str, dict],
          backoff_limit: int) -> list[dict]:
    """A headless Service and one `batch/v1` Job per task (see the module docstring)."""
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
            container = _container(image, args, resources.get(job, {}), output_dir,
                                   env=[{"name": "TF_CONFIG", "value": tf_config}])
            pod = _pod_spec(container, pvc, restart_policy="Never")
            pod["hostname"] = f"{name}-{job}-{index}"
            pod["subdomain"] = name
            docs.append({
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": f"{name}-{job}-{index}", "namespace": namespace,
                             "labels": _labels(name, job)},
                "spec": {
                    "completions": 1,
                    "parallelism": 1,
                    "backoffLimit": backoff_limit,
                    "podFailurePolicy": {"rules": [
                        {"action": "FailJob",
                         "onExitCodes": {"containerName": CONTAINER, "operator": "In",
                                         "values": PERMANENT_STATUSES}},
                        {"action": "Ignore",
                         "onPodConditions": [{"type": "DisruptionTarget"}]},
                    ]},
                    "template": {"metadata": {"labels": _labels(name, job)}, "spec": pod},
                },
            })
    return docs
