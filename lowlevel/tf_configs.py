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

prints a `TFJob` and a NetworkPolicy (and with `--pod_monitor` a PodMonitor);
`--format=k8s` a headless Service, one Job per task and the NetworkPolicy, for
clusters without the training operator (docs/kubernetes.md).

Your own TF1 program (or Estimator script) in place of the trainer, `--script=PATH` (the
path as the tasks see it) with the script's arguments after `--`: every task runs
`python -m lowlevel PATH ARGS`, given its cluster as the Distributed TensorFlow guide's
`--ps_hosts --worker_hosts --job_name --task_index` after ARGS (`--script_cluster=flags`,
the default but with a TFJob; in a TFJob, whose replicas share one pod template, the
runner reads them from the operator's `TF_CONFIG`: `python -m lowlevel
--cluster_flags_from_tf_config PATH ARGS`) or as `TF_CONFIG` (`tf_config`, the default with
`--format=tfjob`: the operator sets it). The pods then have no metrics port or probes
(a script serves none) and no `--max_restarts` (docs/tf1-programs.md).
"""

from __future__ import annotations

import dataclasses
import json
import re
import secrets
import shlex
import sys

from absl import app, flags

from lowlevel import cli
from lowlevel.cluster.spec import CHIEF, EVALUATOR, PS, WORKER, Cluster, parse_hosts
from lowlevel.config import check_schedule
from lowlevel.errors import UsageError
from lowlevel.ops import k8s
from lowlevel.ops import resources as resources_lib

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
flags.DEFINE_string("python", "python", "The Python command in the printed lines (and in "
                    "the containers with --script).")
flags.DEFINE_string("script", None, "Your own TF1 program (or Estimator script) in place of "
                    "the trainer: its path as every task sees it (in the image, or on the "
                    "volume); each task runs python -m lowlevel SCRIPT ARGS (ARGS: everything "
                    "after --, the script's own) with its cluster (--script_cluster). Not "
                    "with --sync or trainer flags; tfjob/k8s: no metrics port or probes (a "
                    "script serves none) and no --max_restarts (--backoff_limit and "
                    "--active_deadline_secs bound the restarts).")
flags.DEFINE_enum("script_cluster", None, ["flags", "tf_config"], "With --script: flags: the "
                  "Distributed TensorFlow guide's --ps_hosts --worker_hosts --job_name "
                  "--task_index after ARGS (ps and worker jobs only; with --format=tfjob, whose "
                  "replicas share one pod template, the runner reads them from the "
                  "operator's TF_CONFIG: --cluster_flags_from_tf_config); tf_config: "
                  "TF_CONFIG in each "
                  "task's environment. Default: tf_config with --format=tfjob (the training "
                  "operator sets it), else flags.")


def _kubernetes_flag(define, name: str, default, help_text: str) -> None:
    """Defines a flag of --format=tfjob and k8s only; its help says so ("tfjob/k8s: ...")."""
    define(name, default, f"tfjob/k8s: {help_text}")


# Kubernetes (--format=tfjob / k8s): the layout; addresses are derived from --name.
_kubernetes_flag(flags.DEFINE_integer, "num_ps", 1, "ps tasks.")
_kubernetes_flag(flags.DEFINE_integer, "num_workers", 2, "workers (worker 0 is the chief "
                 "unless --chief_job).")
_kubernetes_flag(flags.DEFINE_boolean, "chief_job", False, "a separate Chief replica.")
_kubernetes_flag(flags.DEFINE_boolean, "dynamic_workers", False, "TFJob only: "
                 "enableDynamicWorker, so the Worker replicas may be changed on the running "
                 "job (kubectl patch tfjob NAME --type=merge -p '{\"spec\": "
                 "{\"tfReplicaSpecs\": {\"Worker\": {\"replicas\": N}}}}'); the "
                 "trainer's workers then take their work from the data queue "
                 "(--dataset=criteo_files). Not with --chief_job or --script.")
_kubernetes_flag(flags.DEFINE_string, "name", None, "the run's name (a DNS label: lowercase "
                 "letters, digits, '-'); pods are NAME-ROLE-I.")
_kubernetes_flag(flags.DEFINE_string, "namespace", "default", "the Kubernetes namespace.")
_kubernetes_flag(flags.DEFINE_string, "image", None, "the container image "
                 "(scripts/build_image: its CPU variant).")
_kubernetes_flag(flags.DEFINE_string, "gpu_image", None, "the image of the chief and workers "
                 "when --worker_gpus > 0 (scripts/build_image gpu: TensorFlow with its CUDA "
                 "libraries); default: --image with -gpu after its tag (lowlevel:0.1.0 -> "
                 "lowlevel:0.1.0-gpu).")
_kubernetes_flag(flags.DEFINE_string, "pvc", None, "the PersistentVolumeClaim (ReadWriteMany) "
                 "mounted at --output_dir in every pod.")
_kubernetes_flag(flags.DEFINE_string, "cpu", None, "CPU requests (Kubernetes quantities), one "
                 "value for every role (2) or per role (ps=1,worker=4,chief=4,evaluator=500m); "
                 "default ps=1,worker=2,chief=2,evaluator=1. Each task sizes its thread pools "
                 "from it.")
_kubernetes_flag(flags.DEFINE_string, "memory", None, "memory requests and limits (equal: the "
                 "pod is never killed for memory another pod needs), as --cpu (e.g. 4Gi or "
                 "ps=2Gi,worker=8Gi); default 2Gi; at least 1Gi.")
_kubernetes_flag(flags.DEFINE_boolean, "cpu_limits", False, "also limit the CPUs to the "
                 "requests (Guaranteed QoS; the CFS quota may throttle a step).")
_kubernetes_flag(flags.DEFINE_integer, "worker_gpus", 0, "nvidia.com/gpu limit of each chief "
                 "and worker.")
_kubernetes_flag(flags.DEFINE_integer, "backoff_limit", 10, "the TFJob's runPolicy.backoffLimit "
                 "(which the operator does not apply to ExitCode restarts) or each Job's "
                 "backoffLimit (failed pods, evictions not counted).")
_kubernetes_flag(flags.DEFINE_integer, "max_restarts", 10, "each task's --max_restarts: "
                 "restarts after a failure (not a preemption) before it exits 1 and the run "
                 "fails: the bound that fires under the training operator.")
_kubernetes_flag(flags.DEFINE_integer, "active_deadline_secs", 7 * 24 * 3600, "the run "
                 "(TFJob) or each task's Job fails after this many seconds, whatever happens; "
                 "0: no bound.")
_kubernetes_flag(flags.DEFINE_integer, "metrics_port", k8s.METRICS_PORT, "each task's "
                 "--metrics_port: Prometheus metrics and /healthz, which the startup, liveness "
                 "and readiness probes use; 0: neither.")
_kubernetes_flag(flags.DEFINE_boolean, "pod_monitor", False, "also print a Prometheus "
                 "Operator PodMonitor for the run (the pods are annotated prometheus.io/scrape "
                 "either way).")
_kubernetes_flag(flags.DEFINE_integer, "run_as_user", None, "the UID every container runs as; "
                 "default: the image's (1000), or the platform's (OpenShift assigns one).")
_kubernetes_flag(flags.DEFINE_string, "fs_group", "1000", "the pods' fsGroup, which makes the "
                 "volume writable for them where its type supports it (not NFS: see "
                 "docs/kubernetes.md); none: leave it to the platform (OpenShift).")
_kubernetes_flag(flags.DEFINE_string, "run_id", None, "TFJob: the run's id for the tasks' "
                 "restart budgets (LOWLEVEL_RUN_ID); default: a new one each time this runs. "
                 "The plain Jobs use each Job's uid.")


def _jobs(cluster: Cluster, evaluator: bool) -> list[tuple[str, int]]:
    """(job, task_index) of every task: chief, workers, ps tasks, then the evaluator."""
    jobs = [(CHIEF, i) for i in range(len(cluster.chief_hosts))]
    jobs += [(WORKER, i) for i in range(len(cluster.worker_hosts))]
    jobs += [(PS, i) for i in range(cluster.num_ps)]
    return jobs + ([(EVALUATOR, 0)] if evaluator else [])


def make_tasks(cluster: Cluster, sync: bool, evaluator: bool, output_dir: str | None,
               extra: list[str], python: str = "python") -> list[dict]:
    """One dict per task: job, task_index, tf_config (dict), flags (list), command (str)."""
    spec = cluster.as_dict()
    common = ([f"--output_dir={output_dir}"] if output_dir else []) + (
        ["--sync"] if sync else []) + list(extra)
    jobs = _jobs(cluster, evaluator)
    tasks = []
    for job, index in jobs:
        tf_config = {"cluster": spec, "task": {"type": job, "index": index}}
        argv = [f"--schedule={check_schedule(None, job)}", *common]
        command = (f"TF_CONFIG={shlex.quote(json.dumps(tf_config))} {python} -m "
                   f"lowlevel.trainer {' '.join(shlex.quote(a) for a in argv)}")
        tasks.append({"job": job, "task_index": index, "tf_config": tf_config, "flags": argv,
                      "command": command})
    return tasks


def make_script_tasks(cluster: Cluster, script: str, args: list[str], cluster_as: str,
                      evaluator: bool = False, python: str = "python") -> list[dict]:
    """One dict per task of `python -m lowlevel SCRIPT ARGS`, as `make_tasks`' (`flags`: the
    runner's arguments): with `cluster_as` "flags" the guide's cluster flags after ARGS
    (`tf_config` None), with "tf_config" the `TF_CONFIG` before the command."""
    spec = cluster.as_dict()
    jobs = _jobs(cluster, evaluator)
    tasks = []
    for job, index in jobs:
        tf_config = {"cluster": spec, "task": {"type": job, "index": index}}
        argv = [script, *args]
        if cluster_as == "flags":
            argv += k8s.guide_flags(spec, job, index)
            tf_config = None
        words = " ".join(shlex.quote(a) for a in argv)
        env = f"TF_CONFIG={shlex.quote(json.dumps(tf_config))} " if tf_config else ""
        tasks.append({"job": job, "task_index": index, "tf_config": tf_config, "flags": argv,
                      "command": f"{env}{python} -m lowlevel {words}"})
    return tasks


def script_cluster() -> str:
    """`--script_cluster`, or its default for `--format`: tf_config for a TFJob, else flags."""
    return FLAGS.script_cluster or ("tf_config" if FLAGS.format == "tfjob" else "flags")


def check_script_flags(args: list[str]) -> None:
    """Refuses, in one line, what does not apply to `--script` (`args`: the script's).

    Raises:
      UsageError: --sync, a trainer-only Kubernetes flag (--max_restarts, --metrics_port,
        --pod_monitor); with the guide's flags: a chief, an evaluator, a TFJob, or one of
        those flags after `--`.
    """
    for flag in ("sync", "max_restarts", "metrics_port", "pod_monitor"):
        if FLAGS[flag].present:
            raise UsageError(f"--{flag} is the trainer's and does not apply to --script (a "
                             "script's own flags go after '--')")
    if FLAGS.format not in ("tfjob", "k8s") and FLAGS.output_dir:
        raise UsageError(f"--output_dir is the trainer's with --format={FLAGS.format}; give "
                         "the script its own flags after '--'")
    if script_cluster() != "flags":
        return
    if FLAGS.chief or FLAGS.chief_job or FLAGS.evaluator:
        raise UsageError("--script_cluster=flags: the guide's flags name ps and worker tasks "
                         "only (worker 0 is the chief); for a chief or an evaluator use "
                         "--script_cluster=tf_config")
    for arg in args:
        if arg.split("=")[0] in ("--ps_hosts", "--worker_hosts", "--job_name", "--task_index"):
            raise UsageError(f"{arg}: set by this tool for each task; drop it")


ROLES = (CHIEF, WORKER, PS, EVALUATOR)
DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DEFAULT_CPU = {PS: "1", WORKER: "2", CHIEF: "2", EVALUATOR: "1"}
DEFAULT_MEMORY = "2Gi"
# A task measured 620-760 MiB resident (TensorFlow, the digits MLP): less cannot work.
MIN_MEMORY = 2 ** 30
# Trainer flags the Kubernetes formats set themselves.
MANAGED_FLAGS = ("--output_dir", "--metrics_port", "--max_restarts")


def _per_role(value, flag: str) -> dict[str, str]:
    """"2" -> every role 2; "ps=1,worker=4" -> those roles (`resources.per_role`)."""
    try:
        return resources_lib.per_role(value, flag, ROLES)
    except resources_lib.QuantityError as e:
        raise UsageError(str(e)) from None


def kubernetes_docs(extra: list[str]) -> list[dict]:
    """The manifests of --format=tfjob or k8s, from the flags (`extra`: the trainer's flags
    after `--`, or with --script the script's arguments).

    Raises:
      UsageError: a missing or malformed --name, --image, --pvc, --output_dir,
        or a layout with no ps or no training task.
    """
    _check_kubernetes_flags(extra)
    name = FLAGS.name
    replicas = {CHIEF: int(FLAGS.chief_job), WORKER: FLAGS.num_workers, PS: FLAGS.num_ps,
                EVALUATOR: int(FLAGS.evaluator)}
    resources = _resources()
    image = _images()
    script = FLAGS.script is not None
    metrics_port = None if script else FLAGS.metrics_port or None
    options = dataclasses.replace(_pod_options(), scanner_skips=k8s.scanner_skips(
        image, FLAGS.run_as_user, FLAGS.cpu_limits, probes=bool(metrics_port)))
    if script:  # python -m lowlevel SCRIPT ARGS: no metrics, no restart budget of its own
        # A TFJob's replicas share one pod template: the runner turns the operator's
        # TF_CONFIG into each pod's --task_index and the rest of the guide's flags.
        from_tf_config = FLAGS.format == "tfjob" and script_cluster() == "flags"
        options = dataclasses.replace(options, metrics_port=None, command=(
            FLAGS.python, "-m", "lowlevel",
            *(["--cluster_flags_from_tf_config"] if from_tf_config else [])))
        args = [FLAGS.script, *extra]
    else:
        args = ([f"--output_dir={FLAGS.output_dir}"] + (["--sync"] if FLAGS.sync else [])
                + ([f"--metrics_port={metrics_port}"] if metrics_port else [])
                + [f"--max_restarts={FLAGS.max_restarts}"] + extra)
    build_args = (name, FLAGS.namespace, image, replicas, args, FLAGS.output_dir,
                  FLAGS.pvc, resources, FLAGS.backoff_limit, options,
                  FLAGS.active_deadline_secs or None)
    if FLAGS.format == "tfjob":
        docs = [k8s.tfjob(*build_args, dynamic_workers=FLAGS.dynamic_workers)]
    else:
        docs = k8s.plain(*build_args, cluster_flags=script and script_cluster() == "flags")
    docs.append(k8s.network_policy(name, FLAGS.namespace, metrics_port))
    if FLAGS.pod_monitor:
        if not metrics_port:
            raise UsageError("--pod_monitor needs --metrics_port (the port it scrapes)")
        docs.append(k8s.pod_monitor(name, FLAGS.namespace))
    return k8s.note_default_namespace(docs)


def _check_kubernetes_flags(extra: list[str]) -> None:
    """Checks the flags of --format=tfjob or k8s (see `kubernetes_docs`).

    Raises:
      UsageError: addresses given; a missing or malformed --name, --image, --pvc,
        --output_dir; no ps or no training task; a flag after `--` this tool sets.
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
    if FLAGS.dynamic_workers and (FLAGS.format != "tfjob" or FLAGS.chief_job or
                                  FLAGS.script is not None):
        raise UsageError("--dynamic_workers: a TFJob's enableDynamicWorker (--format=tfjob) "
                         "of the trainer, with worker 0 as the chief (no --chief_job: the "
                         "operator gives a Chief no ps addresses; no --script)")
    if not FLAGS.output_dir.startswith("/"):
        raise UsageError(f"--output_dir={FLAGS.output_dir}: expected an absolute path (where "
                         "the claim is mounted in every pod), e.g. /output")
    for arg in extra if FLAGS.script is None else []:  # a script's flags are its own
        if arg.split("=")[0] in MANAGED_FLAGS:
            raise UsageError(f"{arg} after '--': give it to this tool (--{arg[2:]}), which "
                             "sets it in every pod")


def _resources() -> dict[str, dict]:
    """{role: container resources}: CPU requests (and limits with --cpu_limits), memory
    requests equal to the limits, the GPUs of the chief and workers.

    Raises:
      UsageError: a value that is not a Kubernetes quantity, or too little memory.
    """
    cpu = {**DEFAULT_CPU, **_per_role(FLAGS.cpu, "cpu")}
    memory = {role: DEFAULT_MEMORY for role in ROLES} | _per_role(FLAGS.memory, "memory")
    resources = {}
    for role in ROLES:
        for flag, check in (("cpu", resources_lib.cpu_quantity),
                            ("memory", lambda v: resources_lib.memory_quantity(v, MIN_MEMORY))):
            try:
                check((cpu if flag == "cpu" else memory)[role])
            except resources_lib.QuantityError as e:
                given = FLAGS[flag].value
                where = f"{role}: " if given and "=" in given else ""
                raise UsageError(f"--{flag}={given}: {where}{e}") from None
        requests = {"cpu": cpu[role], "memory": memory[role]}
        limits = {"memory": memory[role]}
        if FLAGS.cpu_limits:
            limits["cpu"] = cpu[role]
        if FLAGS.worker_gpus and role in (CHIEF, WORKER):
            limits["nvidia.com/gpu"] = str(FLAGS.worker_gpus)
        resources[role] = {"requests": requests, "limits": limits}
    return resources


def _pod_options() -> k8s.PodOptions:
    """The pods' `k8s.PodOptions` from the flags.

    Raises:
      UsageError: a bad --fs_group, --run_as_user, --run_id or --metrics_port.
    """
    fs_group = FLAGS.fs_group
    if fs_group is not None and fs_group.lower() != "none":
        if not fs_group.isdigit():
            raise UsageError(f"--fs_group={fs_group}: expected a group id (e.g. 1000) or none")
        fs_group = int(fs_group)
    else:
        fs_group = None
    if FLAGS.run_as_user is not None and FLAGS.run_as_user < 1:
        raise UsageError(f"--run_as_user={FLAGS.run_as_user}: expected a UID above 0 (the "
                         "pods run as non-root)")
    if not 0 <= FLAGS.metrics_port <= 65535 or FLAGS.metrics_port == k8s.PORT:
        raise UsageError(f"--metrics_port={FLAGS.metrics_port}: expected a port other than "
                         f"the training port {k8s.PORT} (0: no metrics and no probes)")
    run_id = None
    if FLAGS.format == "tfjob":
        run_id = FLAGS.run_id or f"{FLAGS.name}-{secrets.token_hex(4)}"
        if not re.fullmatch(r"[A-Za-z0-9._-]{1,100}", run_id):
            raise UsageError(f"--run_id={run_id}: expected letters, digits, '.', '_', '-'")
    return k8s.PodOptions(run_as_user=FLAGS.run_as_user, fs_group=fs_group,
                          metrics_port=FLAGS.metrics_port or None, run_id=run_id)


def _images():
    """--image, or {"default": CPU image, chief and worker: the GPU image} with GPUs.

    Raises:
      UsageError: GPUs with an image pinned by digest and no --gpu_image.
    """
    if not FLAGS.worker_gpus:
        return FLAGS.image
    gpu = FLAGS.gpu_image
    if not gpu:
        if "@" in FLAGS.image:
            raise UsageError(f"--worker_gpus={FLAGS.worker_gpus} needs the GPU image "
                             "(TensorFlow with its CUDA libraries: scripts/build_image gpu), "
                             f"and --image={FLAGS.image} is pinned by digest: give "
                             "--gpu_image")
        repo, _, tag = FLAGS.image.rpartition(":")
        if not repo or "/" in tag:  # no tag: "registry:5000/lowlevel" has a port, not a tag
            repo, tag = FLAGS.image, "latest"
        gpu = f"{repo}:{tag}-gpu"
    sys.stderr.write(f"# the chief and workers ({FLAGS.worker_gpus} GPU each) run {gpu}, the "
                     f"GPU image (scripts/build_image gpu); the ps tasks and the evaluator "
                     f"{FLAGS.image}\n")
    return {"default": FLAGS.image, CHIEF: gpu, WORKER: gpu}


def check_trainer_flags(extra: list[str]) -> None:
    """Checks the trainer flags given after `--` as every task will (`config.from_flags`), so a
    bad value is one line here, not a crash loop of every pod.

    Raises:
      UsageError: an unknown flag, or a value the trainer refuses.
    """
    from absl import flags as absl_flags

    from lowlevel import config as config_lib
    trainer = absl_flags.FlagValues()
    cli.define_trainer_flags(trainer)
    try:
        trainer(["trainer", *extra])
    except absl_flags.Error as e:
        raise UsageError(f"after --: {e}") from None
    config_lib.from_flags(trainer, None)


def _check_args(extra: list[str]) -> None:
    """Checks what follows `--`: the trainer's flags, or with --script the script's.

    Raises:
      UsageError: see `check_script_flags` and `check_trainer_flags`; a positional
        argument or a cluster flag for the trainer.
    """
    if FLAGS.script is not None:
        check_script_flags(extra)
        return
    if FLAGS.script_cluster is not None:
        raise UsageError("--script_cluster applies only with --script=SCRIPT.py")
    for arg in extra:
        if not arg.startswith("--"):
            raise UsageError(f"unexpected argument {arg!r}: trainer flags go after '--' "
                             "as --name=value")
        if arg.split("=")[0] in ("--job_name", "--task_index", "--ps_hosts", "--worker_hosts",
                                 "--schedule"):
            raise UsageError(f"{arg}: set by TF_CONFIG and this tool; drop it")
    check_trainer_flags(extra)


def main(argv) -> int:
    """Prints every task's TF_CONFIG and command, or the Kubernetes manifests; returns 0.

    Raises:
      UsageError: a flag, address or argument this tool or the trainer refuses.
    """
    extra = argv[1:]
    _check_args(extra)
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
    if FLAGS.script is not None:
        tasks = make_script_tasks(cluster, FLAGS.script, extra, script_cluster(),
                                  FLAGS.evaluator, FLAGS.python)
        what = f"{FLAGS.script} (python -m lowlevel), given the cluster by {script_cluster()}"
    else:
        if FLAGS.evaluator and not FLAGS.output_dir:
            raise UsageError("--evaluator needs --output_dir: the evaluator reads the "
                             "checkpoints the chief writes there")
        tasks = make_tasks(cluster, FLAGS.sync, FLAGS.evaluator, FLAGS.output_dir, extra,
                           FLAGS.python)
        what = "sync training" if FLAGS.sync else "async training"
    chief_note = "a chief job" if chief else "worker 0 as the chief"
    sys.stderr.write(f"# {what}, {chief_note}: {cluster.num_workers} training "
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
