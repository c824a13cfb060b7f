"""The trainer CLI: one task of a ps/worker cluster, or in-process training.

    python -m lowlevel.trainer --ps_hosts=127.0.0.1:2222 \\
        --worker_hosts=127.0.0.1:2223,127.0.0.1:2224 --job_name=ps --task_index=0
    python -m lowlevel.trainer --ps_hosts=... --worker_hosts=... --job_name=worker --task_index=0
    python -m lowlevel.trainer --ps_hosts=... --worker_hosts=... --job_name=worker --task_index=1
    TF_CONFIG='{"cluster": {...}, "task": {"type": "worker", "index": 1}}' \\
        python -m lowlevel.trainer

The cluster and this task come from the flags or from `TF_CONFIG` (which may
also have a `chief`/`master` job and names an `evaluator`); given both, they
must agree. With neither, it trains in one process (no servers). The chief
(worker 0 without a chief job) prints the final metrics JSON as its last line
of stdout; an evaluator prints its last evaluation. A ps task exits 0 once the
chief signals the end of training.

Flags are parsed here, and only here, into a `TrainConfig`. Exit status
(`lowlevel.exit_codes`): 0 when this task's part of the run is finished, 2 for
a usage error, 1 for a permanent failure, 128 + N when stopped by signal N at a
safe point, 200 for a transient failure a restart can fix; every failure is one
line on stderr naming the value (`--verbosity=1` adds the traceback).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import traceback
from typing import Optional

from absl import app, flags, logging

from lowlevel import cluster as cluster_lib
from lowlevel import config as config_lib
from lowlevel import exit_codes
from lowlevel import tf_config as tf_config_lib
from lowlevel.config import SCHEDULES, RuntimeFailure, TrainConfig, UsageError

FLAGS = flags.FLAGS

# A chief that finds the run finished tells the ps tasks to exit. They may be
# starting (the whole cluster was restarted) or long gone (only the chief was
# restarted, after the end-of-training handshake); it waits this long for them.
FINISHED_PS_WAIT_SECS = 30.0

# gRPC keepalive on the channels between tasks (TensorFlow reads channel
# arguments from TF_GRPC_DEFAULT_OPTIONS; a value the user sets wins). After a
# partition longer than ~30 s, a connection whose other end has given up is
# otherwise found dead only at the next TCP retransmission, which Linux's
# exponential backoff can put a minute or more after the heal: every run times
# out meanwhile. A ping unanswered for 5 s (sent while a call waits, at most
# every 10 s) closes it, and gRPC reconnects at once. A channel that cannot
# connect retries with exponential backoff (1 s x 1.6 per attempt, up to 120 s):
# after a 60 s partition its next attempt could come 20 s after the heal (a test
# measured 22 s); capped at 5 s, training resumes within seconds. And each attempt
# waits at least gRPC's minimum connect timeout (20 s, grpc/doc/connection-backoff.md)
# for its SYN to be answered: one begun during the partition could hold the channel
# until 20 s after the heal (a test measured 22.3 s with the cap); 5 s here too.
GRPC_KEEPALIVE = ("grpc.keepalive_time_ms=10000,grpc.keepalive_timeout_ms=5000,"
                  "grpc.max_reconnect_backoff_ms=5000,grpc.min_reconnect_backoff_ms=5000")

# Cluster.
flags.DEFINE_string("ps_hosts", "", "Comma-separated host:port of the ps tasks.")
flags.DEFINE_string("worker_hosts", "", "Comma-separated host:port of the worker tasks; "
                    "worker 0 is the chief. (A separate chief job: TF_CONFIG.)")
flags.DEFINE_string("job_name", None, "This task's job: worker, ps, evaluator (or chief/"
                    "master with TF_CONFIG). Default: from TF_CONFIG.")
flags.DEFINE_integer("task_index", 0, "This task's index within its job.")
flags.DEFINE_enum("schedule", None, SCHEDULES, "What this task does. Default by job: "
                  "train (chief, worker), run_std_server (ps), continuous_eval (evaluator: "
                  "evaluates each new checkpoint in --output_dir on the test split until "
                  "the one of --train_steps; continuous_eval_on_train_data: on the "
                  "training split).")


# Named as absl names the module that defines a flag (the script's path for __main__).
config_lib.define_flags(FLAGS, sys.argv[0] if __name__ == "__main__" else __name__)


def config_from_flags(num_workers: Optional[int]) -> TrainConfig:
    """The validated `TrainConfig` of the parsed flags.

    Raises:
      UsageError: a value is out of range or unknown.
    """
    return config_lib.from_flags(FLAGS, num_workers)


def task_from_flags():
    """(cluster or None, task, schedule) from the flags and `TF_CONFIG`.

    Raises:
      UsageError: bad or conflicting cluster flags, TF_CONFIG or --schedule.
    """
    given = cluster_lib.ClusterFlags(
        FLAGS.ps_hosts, FLAGS.worker_hosts, FLAGS.job_name,
        FLAGS.task_index if FLAGS["task_index"].present else None)
    cluster, task = tf_config_lib.resolve(given, os.environ.get("TF_CONFIG"))
    if task is None:  # no cluster: in-process training, or an evaluator
        evaluating = FLAGS.schedule in (config_lib.CONTINUOUS_EVAL,
                                        config_lib.CONTINUOUS_EVAL_ON_TRAIN_DATA)
        task = cluster_lib.Task(cluster_lib.EVALUATOR if evaluating else cluster_lib.WORKER, 0)
    return cluster, task, config_lib.check_schedule(FLAGS.schedule, task.job_name)


def ensure_writable(output_dir: str) -> None:
    """Creates `output_dir` if needed and checks that a file can be written in it.

    Raises:
      UsageError: it cannot be created or written.
    """
    try:
        os.makedirs(output_dir, exist_ok=True)
        with tempfile.TemporaryFile(dir=output_dir):
            pass
    except OSError as e:
        raise UsageError(f"--output_dir={output_dir}: cannot write there ({e.strerror}); "
                         "give a writable directory") from None


def main(argv, preemption) -> int:
    if len(argv) > 1:
        raise UsageError(f"unexpected argument {argv[1]!r} (flags are --name=value)")
    cluster, task, schedule = task_from_flags()
    preemption.task_name = task.name
    evaluating = task.job_name == cluster_lib.EVALUATOR
    config = config_from_flags(cluster.num_workers if cluster else None if evaluating else 1)
    if cluster and cluster.sparse and config.sync and not evaluating:
        raise UsageError("--sync needs every worker's address, and TF_CONFIG has a "
                         "sparseCluster (the training operator's enableDynamicWorker gives a "
                         "worker only its own): train async, or turn enableDynamicWorker off")
    if evaluating and not config.output_dir:
        raise UsageError(f"--schedule={schedule} needs --output_dir: the directory the chief "
                         "writes its checkpoints to")
    if cluster:  # before TensorFlow makes a channel: see GRPC_KEEPALIVE
        os.environ.setdefault("TF_GRPC_DEFAULT_OPTIONS", GRPC_KEEPALIVE)
    if task.job_name == cluster_lib.PS:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # a ps holds variables on its CPU only
    if (task.is_chief or evaluating) and config.output_dir:
        ensure_writable(config.output_dir)
    _open_events(config.output_dir, task.name)
    _start_production(config, task)

    from lowlevel._tf import import_tensorflow
    tf = import_tensorflow(verbose=FLAGS.verbosity >= 1)
    from lowlevel import events
    events.emit("started", None, schedule=schedule)
    from lowlevel import checkpoints
    from lowlevel import data as data_lib
    from lowlevel import server as server_lib
    from lowlevel import shutdown, training

    session_config = server = None
    if cluster and not evaluating:
        session_config = server_lib.session_config(cluster, task, config.intra_op_threads,
                                                   config.inter_op_threads)
    _log_cpus(task, session_config)
    if schedule == config_lib.RUN_STD_SERVER:
        server = server_lib.start(cluster, task, session_config)
        _serving(cluster, task)
        return shutdown.run_std_server(server, task, session_config)
    if evaluating:
        _serving(None, task)
        data = data_lib.load_for(config)
        from lowlevel import evaluation
        record = evaluation.continuous_eval(
            config, data, schedule == config_lib.CONTINUOUS_EVAL_ON_TRAIN_DATA,
            tf.compat.v1.ConfigProto(intra_op_parallelism_threads=config.intra_op_threads or 1,
                                     inter_op_parallelism_threads=config.inter_op_threads or 1))
        print(json.dumps(record), flush=True)
        return 0
    if cluster:
        server = server_lib.start(cluster, task, session_config)
    _serving(cluster, task)
    try:
        checkpoints.check_finished(config.output_dir, config.train_steps)
        data = data_lib.load_for(config)
        worker_gpu = config.worker_gpu
        if worker_gpu is None:
            worker_gpu = len(tf.config.list_physical_devices("GPU"))
        shape = (f"{cluster.num_ps} ps + {cluster.num_workers or 'dynamic'} workers, "
                 f"{'sync' if config.sync else 'async'}" if cluster else "in-process")
        logging.info("%s: %s on %s (%d train / %d test examples), %s", task.name,
                     config.model, data.name, len(data.train), len(data.test), shape)
        metrics = training.train(config, data, cluster, task, server, session_config,
                                 worker_gpu, preemption)
    except checkpoints.TrainingFinished as done:
        logging.info("%s: nothing to train: %s, and --train_steps=%d", task.name, done,
                     config.train_steps)
        metrics = None
        if task.is_chief:
            if cluster:  # the ps tasks of this (re)started cluster wait for the chief's word
                shutdown.stop_cluster(server, cluster, session_config,
                                      min(config.startup_timeout_secs, FINISHED_PS_WAIT_SECS))
            metrics = _previous_metrics(config.output_dir, done.step)
            from lowlevel import export
            export_dir = export.ensure_exported(done.path, done.step, config)
            if export_dir:
                metrics["export_dir"] = export_dir
    if preemption.signum is not None:  # stopped at a safe point: retryable
        return exit_codes.signal_status(preemption.signum)
    if metrics is not None:
        line = json.dumps(metrics)
        logging.info("final metrics: %s", line)
        print(line, flush=True)
    return 0


def _log_cpus(task, session_config) -> None:
    """Logs the CPUs this task sizes its thread pools from (`lowlevel.resources`)."""
    from lowlevel import resources
    pools = (f": intra-op {session_config.intra_op_parallelism_threads}, inter-op "
             f"{session_config.inter_op_parallelism_threads} threads" if session_config else "")
    logging.info("%s: %s%s", task.name, resources.figure().describe(), pools)
    from lowlevel import metrics
    metrics.report_cpus(resources.figure(), session_config)


def _start_production(config: TrainConfig, task) -> None:
    """Before TensorFlow's import: the metrics and health server (--metrics_port), so that
    a probe sees a task that is starting; this start counted against --max_restarts.

    Raises:
      UsageError: the metrics port is in use.
      restarts.RestartsSpent: no restart is left (exit 1).
    """
    from lowlevel import metrics, restarts
    if config.metrics_port:
        metrics.serve(config.metrics_port, task.name, task.job_name, task.task_index,
                      config.output_dir)
    budget = restarts.begin(config.output_dir, task.name, config.max_restarts)
    metrics.report_restarts(budget.restarts)


def _serving(cluster, task) -> None:
    """This task is up (its server started, or it needs none): healthy from now on."""
    from lowlevel import metrics
    address = cluster.hosts(task.job_name)[task.task_index] if cluster else None
    metrics.serving(address, cluster, task)


def _open_events(output_dir: Optional[str], task_name: str) -> None:
    """Starts this task's event file (`lowlevel.events`); a failure costs the events only."""
    from lowlevel import events
    try:
        events.open_log(output_dir, task_name)
    except OSError as e:
        logging.warning("%s: no events file in %s (%s); training goes on without it",
                        task_name, output_dir, e.strerror)


def _previous_metrics(output_dir: str, step: int) -> dict:
    """The final metrics a finished run left in `output_dir`, or the step alone."""
    try:
        with open(os.path.join(output_dir, "final_metrics.json")) as f:
            metrics = json.load(f)
        if metrics.get("global_step") == step:
            return metrics
    except (OSError, ValueError):
        pass
    return {"global_step": step, "start_global_step": step}


def _error_line(e: BaseException) -> str:
    """One line for a runtime failure: ours carry a message; TensorFlow's get their type."""
    if isinstance(e, RuntimeFailure):
        return str(e)
    message = getattr(e, "message", None) or str(e)
    return f"{type(e).__name__}: {message.strip().splitlines()[0] if message else ''}"


def _main_or_exit(argv):
    from lowlevel.preemption import Preemption
    preemption = Preemption()  # first: before TensorFlow starts any thread
    try:
        code = main(argv, preemption)
    except UsageError as e:
        sys.stderr.write(f"lowlevel.trainer: error: {e}\n")
        code = exit_codes.USAGE
    except Exception as e:  # noqa: BLE001 - one line, not a traceback
        if FLAGS.verbosity >= 1 or not _is_runtime_failure(e):
            traceback.print_exc()
        code = exit_codes.status_of(e)
        retry = ("; retryable: restart this task" if exit_codes.is_retryable(code)
                 else "; restarting will not help")
        sys.stderr.write(f"lowlevel.trainer: error: {_error_line(e)} (exit status {code}"
                         f"{retry})\n")
    from lowlevel import restarts
    code = restarts.finish(code or 0)  # retryable with no restart left: 1
    sys.stdout.flush()
    sys.stderr.flush()
    # A tf.train.Server has no working Stop(); leave without running its
    # destructors so the process cannot hang on them.
    os._exit(code or 0)


def _is_runtime_failure(e: BaseException) -> bool:
    """Failures of the cluster or the files, as opposed to bugs (which keep their traceback)."""
    if isinstance(e, (RuntimeFailure, OSError)):
        return True
    tf_errors = sys.modules.get("tensorflow.python.framework.errors_impl")
    return tf_errors is not None and isinstance(e, tf_errors.OpError)


def run():
    """Console-script entry point."""
    from lowlevel.lifetime import die_with_parent
    die_with_parent()  # first: a launcher that dies takes its tasks with it
    app.run(_main_or_exit, flags_parser=config_lib.flags_parser("lowlevel.trainer"))


if __name__ == "__main__":
    run()
