"""Prints the `TF_CONFIG` and trainer flags of every task of a cluster.

    lowlevel-make-tf-configs --chief=10.0.0.1:2222 --workers=10.0.0.2:2222,10.0.0.3:2222 \\
        --ps=10.0.0.4:2222 --sync --evaluator --output_dir=/shared/run1 -- --train_steps=5000
    lowlevel-make-tf-configs --workers=h1:2222,h2:2222,h3:2222 --ps=h4:2222,h5:2222

Each line is one task, ready to paste on its machine:

    TF_CONFIG='{"cluster": {...}, "task": {"type": "worker", "index": 1}}' python -m lowlevel.trainer --schedule=train ...

The counterpart of tensor2tensor's `t2t-make-tf-configs`, whose `--masters`
and `--ps` mean different things in its sync and async layouts; here the
flags say what each address is. Both of its layouts are covered: sync
training with a single chief (`--chief` and `--workers`, `--sync`), and async
training with several workers and ps tasks (`--workers`, worker 0 being the
chief). Flags after `--` are passed to every task. `--format=json` prints a
JSON list of {job, task_index, tf_config, flags, command} for tools.

For Kubernetes the addresses are derived, not given (`lowlevel/ops/k8s.py`):

    lowlevel-make-tf-configs --format=tfjob --name=mnist --image=REGISTRY/lowlevel:0.1.0 \
        --num_ps=2 --num_workers=2 --chief_job --evaluator --output_dir=/output \
        --pvc=mnist-output -- --train_steps=20000 | kubectl apply -f -

prints a `TFJob` and a NetworkPolicy; `--format=k8s` a headless Service, one
Job per task and the NetworkPolicy, for clusters without the training operator.
"""

from __future__ import annotations

import json
import re
import shlex
import sys

from absl import app, flags

from lowlevel.ops import k8s
from lowlevel.cluster.spec import CHIEF, EVALUATOR, PS, WORKER, Cluster, parse_hosts
from lowlevel import cli
from lowlevel.config import check_schedule
from lowlevel.errors import UsageError

FLAGS = flags.FLAGS
flags.DEFINE_string("chief", "", "host:port of the chief (a job of its own). Without it, "
                    "worker 0 is the chief.")
flags.DEFINE_string("workers", "", "Comma-separated host:port of the workers.")
flags.DEFINE_string("ps", "", "Comma-separated host:port of the ps tasks.")
flags.DEFINE_boolean("sync", False, "Synchronous training (adds --sync to every task).")
flags.DEFINE_boolean("evaluator", False, "Add an evaluator task (continuous_eval); it needs "
                     "no address: it reads the checkpoints in --output_dir.")
flags.DEFINE_string("output_dir", None, "--output_dir of every task: a directory all tasks "
                    "share (required with --evaluator).")
flags.DEFINE_enum("format", "shell", ["shell", "json", "tfjob", "k8s"], "shell: one command "
                  "line per task; json: a list of objects; tfjob: a Kubeflow TFJob and a "
                  "NetworkPolicy (YAML); k8s: a headless Service, a Job per task and a "
                  "NetworkPolicy (YAML), for clusters without the training operator.")
flags.DEFINE_string("python", "python", "The Python command in the printed lines.")


def _kubernetes_flag(define, name: str, default, help_text: str) -> None:
    """Defines a flag of --format=tfjob and k8s only; its help says so ("tfjob/k8s: ...")."""
    define(name, default, f"tfjob/k8s: {help_text}")


# Kubernetes (--format=tfjob / k8s): the layout; addresses are derived from --name.
_kubernetes_flag(flags.DEFINE_integer, "num_ps", 1, "ps tasks.")
_kubernetes_flag(flags.DEFINE_integer, "num_workers", 2, "workers (worker 0 is the chief "
                 "unless --chief_job).")
_kubernetes_flag(flags.DEFINE_boolean, "chief_job", False, "a separate Chief replica.")
_kubernetes_flag(flags.DEFINE_string, "name", None, "the run's name (a DNS label: lowercase "
                 "letters, digits, '-'); pods are NAME-ROLE-I.")
_kubernetes_flag(flags.DEFINE_string, "namespace", "default", "the Kubernetes namespace.")
_kubernetes_flag(flags.DEFINE_string, "image", None, "the container image "
                 "(scripts/Dockerfile).")
_kubernetes_flag(flags.DEFINE_string, "pvc", None, "the PersistentVolumeClaim (ReadWriteMany) "
                 "mounted at --output_dir in every pod.")
_kubernetes_flag(flags.DEFINE_string, "cpu", None, "CPU requests, one value for every role (2) "
                 "or per role (ps=1,worker=4,chief=4,evaluator=1).")
_kubernetes_flag(flags.DEFINE_string, "memory", None, "memory requests, as --cpu (e.g. 4Gi or "
                 "ps=2Gi,worker=8Gi).")
_kubernetes_flag(flags.DEFINE_integer, "worker_gpus", 0, "nvidia.com/gpu limit of each chief "
                 "and worker.")
_kubernetes_flag(flags.DEFINE_integer, "backoff_limit", 10, "retries before the run (TFJob) or "
                 "a task's Job fails; only retryable exit statuses are retried.")


def make_tasks(cluster: Cluster, sync: bool, evaluator: bool, output_dir: str | None,
               extra: list[str], python: str = "python") -> list[dict]:
    """One dict per task: job, task_index, tf_config (dict), flags (list), command (str)."""
    spec = cluster.as_dict()
    common = ([f"--output_dir={output_dir}"] if output_dir else []) + (
        ["--sync"] if sync else []) + list(extra)
    jobs = [(CHIEF, i) for i in range(len(cluster.chief_hosts))]
    jobs += [(WORKER, i) for i in range(len(cluster.worker_hosts))]
    jobs += [(PS, i) for i in range(cluster.num_ps)]
    jobs += [(EVALUATOR, 0)] if evaluator else []
    tasks = []
    for job, index in jobs:
        tf_config = {"cluster": spec, "task": {"type": job, "index": index}}
        argv = [f"--schedule={check_schedule(None, job)}", *common]
        command = (f"TF_CONFIG={shlex.quote(json.dumps(tf_config))} {python} -m "
                   f"lowlevel.trainer {' '.join(shlex.quote(a) for a in argv)}")
        tasks.append({"job": job, "task_index": index, "tf_config": tf_config, "flags": argv,
                      "command": command})
    return tasks


ROLES = (CHIEF, WORKER, PS, EVALUATOR)
DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def _per_role(value, flag: str) -> dict[str, str]:
    """"2" -> every role 2; "ps=1,worker=4" -> those roles."""
    if not value:
        return {}
    if "=" not in value:
        return {role: value for role in ROLES}
    out = {}
    for part in value.split(","):
        role, sep, amount = part.partition("=")
        if not sep or role not in ROLES or not amount:
            raise UsageError(f"--{flag}={value}: expected one value (e.g. 2) or role=value "
                             f"pairs with roles {', '.join(ROLES)} (e.g. ps=1,worker=4)")
        out[role] = amount
    return out


def kubernetes_docs(extra: list[str]) -> list[dict]:
    """The manifests of --format=tfjob or k8s, from the flags.

    Raises:
      UsageError: a missing or malformed --name, --image, --pvc, --output_dir,
        or a layout with no ps or no training task.
    """
    for flag in ("chief", "workers", "ps"):
        if FLAGS[flag].present:
            raise UsageError(f"--{flag} gives addresses; with --format={FLAGS.format} they are "
                             "derived from --name: use --num_ps/--num_workers/--chief_job")
    name = FLAGS.name
    if not name or not DNS_LABEL.match(name) or len(name) > 40:
        raise UsageError(f"--name={name}: expected a DNS label of at most 40 characters "
                         "(lowercase letters, digits, '-'; a letter first), e.g. mnist-run1")
    if not FLAGS.image:
        raise UsageError("--image is required: the container image with lowlevel installed "
                         "(see scripts/Dockerfile), e.g. registry.example.com/lowlevel:0.1.0")
    if not FLAGS.pvc or not FLAGS.output_dir:
        raise UsageError("--pvc and --output_dir are required: the PersistentVolumeClaim "
                         "(ReadWriteMany) every task mounts at --output_dir, so checkpoints "
                         "outlive pods and the evaluator can read them")
    if FLAGS.num_ps < 1 or FLAGS.num_workers < (0 if FLAGS.chief_job else 1):
        raise UsageError(f"--num_ps={FLAGS.num_ps} --num_workers={FLAGS.num_workers}: expected "
                         "at least 1 ps and 1 worker (0 workers only with --chief_job)")
    replicas = {CHIEF: int(FLAGS.chief_job), WORKER: FLAGS.num_workers, PS: FLAGS.num_ps,
                EVALUATOR: int(FLAGS.evaluator)}
    cpu, memory = _per_role(FLAGS.cpu, "cpu"), _per_role(FLAGS.memory, "memory")
    resources = {}
    for role in ROLES:
        requests = {k: v for k, v in (("cpu", cpu.get(role)), ("memory", memory.get(role)))
                    if v}
        limits = ({"nvidia.com/gpu": str(FLAGS.worker_gpus)}
                  if FLAGS.worker_gpus and role in (CHIEF, WORKER) else {})
        resources[role] = {k: v for k, v in (("requests", requests), ("limits", limits)) if v}
    args = [f"--output_dir={FLAGS.output_dir}"] + (["--sync"] if FLAGS.sync else []) + extra
    build = k8s.tfjob if FLAGS.format == "tfjob" else k8s.plain
    docs = build(name, FLAGS.namespace, FLAGS.image, replicas, args, FLAGS.output_dir,
                 FLAGS.pvc, resources, FLAGS.backoff_limit)
    docs = [docs] if isinstance(docs, dict) else docs
    return docs + [k8s.network_policy(name, FLAGS.namespace)]


def main(argv) -> int:
    """Prints every task's TF_CONFIG and command, or the Kubernetes manifests; returns 0."""
    extra = argv[1:]
    for arg in extra:
        if not arg.startswith("--"):
            raise UsageError(f"unexpected argument {arg!r}: trainer flags go after '--' "
                                 "as --name=value")
        if arg.split("=")[0] in ("--job_name", "--task_index", "--ps_hosts", "--worker_hosts",
                                 "--schedule"):
            raise UsageError(f"{arg}: set by TF_CONFIG and this tool; drop it")
    if FLAGS.format in ("tfjob", "k8s"):
        docs = kubernetes_docs(extra)
        sys.stderr.write(f"# {FLAGS.format}: {len(docs)} documents for run {FLAGS.name} in "
                         f"namespace {FLAGS.namespace}; apply with: kubectl apply -f FILE\n")
        sys.stdout.write(k8s.dump_all(docs))
        return 0
    chief = parse_hosts(FLAGS.chief, "--chief")
    try:
        cluster = Cluster(parse_hosts(FLAGS.ps, "--ps"), parse_hosts(FLAGS.workers, "--workers"),
                          chief)
    except UsageError as e:
        raise UsageError(str(e).replace("--ps_hosts", "--ps").replace(
            "--worker_hosts", "--workers")) from None
    if FLAGS.evaluator and not FLAGS.output_dir:
        raise UsageError("--evaluator needs --output_dir: the evaluator reads the "
                             "checkpoints the chief writes there")
    tasks = make_tasks(cluster, FLAGS.sync, FLAGS.evaluator, FLAGS.output_dir, extra,
                       FLAGS.python)
    mode = "sync" if FLAGS.sync else "async"
    chief_note = "a chief job" if chief else "worker 0 as the chief"
    sys.stderr.write(f"# {mode} training, {chief_note}: {cluster.num_workers} training "
                     f"task(s), {cluster.num_ps} ps{', an evaluator' if FLAGS.evaluator else ''}"
                     "; run each line on its machine, in any order\n")
    if FLAGS.format == "json":
        print(json.dumps(tasks, indent=2))
    else:
        for task in tasks:
            print(task["command"])
    return 0


def run():
    """Console-script entry point (`lowlevel-make-tf-configs`)."""
    app.run(cli.exit_status_main("lowlevel-make-tf-configs", main),
            flags_parser=cli.flags_parser("lowlevel-make-tf-configs", hint="",
                                              module="lowlevel.tf_configs"))


if __name__ == "__main__":
    run()
