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

The flags are `lowlevel.cli`'s; what a task does is `lowlevel.runtime.schedules`'.
Exit status (`lowlevel.errors`): 0 when this task's part of the run is finished,
2 for a usage error, 1 for a permanent failure, 128 + N when stopped by signal N
at a safe point, 200 for a transient failure a restart can fix; every failure is
one line on stderr naming the value (`--verbosity=1` adds the traceback).
"""

from __future__ import annotations

import os

from absl import app, flags

from lowlevel import cli, events, output_layout
from lowlevel.cluster import channels
from lowlevel.cluster.spec import EVALUATOR, PS, Cluster, Task
from lowlevel.config import TrainConfig
from lowlevel.errors import UsageError

cli.define_trainer_flags()
FLAGS = flags.FLAGS


def main(argv, preemption) -> int:
    """Reads this task and its configuration from the flags, prepares the process, runs
    its schedule; returns the exit status."""
    if len(argv) > 1:
        raise UsageError(f"unexpected argument {argv[1]!r} (flags are --name=value)")
    cluster, task, schedule = cli.task_from_flags()
    preemption.task_name = task.name
    config = _config_for(cluster, task, schedule)
    _prepare_process(cluster, task, config)
    from lowlevel.runtime import metrics, schedules
    code = schedules.run(schedule, config, cluster, task, preemption,
                         verbose=FLAGS.verbosity >= 1)
    if metrics.current() is not None and config.metrics_linger_secs:
        from absl import logging
        logging.info("%s: waiting up to %g s for a last scrape of its metrics "
                     "(--metrics_linger_secs)", task.name, config.metrics_linger_secs)
        scraped = metrics.current().linger(config.metrics_linger_secs)
        logging.info("%s: %s", task.name, "scraped" if scraped else "no scrape came")
    return code


def _config_for(cluster, task: Task, schedule: str) -> TrainConfig:
    """The task's validated configuration.

    Raises:
      UsageError: a bad value, --sync on a sparseCluster, an evaluator without --output_dir.
    """
    evaluating = task.job_name == EVALUATOR
    config = cli.config_from_flags(cluster.num_workers if cluster else None if evaluating else 1)
    if cluster and cluster.sparse and config.sync and not evaluating and \
            not config.span_queue(True, True):  # the data queue's sync needs no addresses
        raise UsageError("--sync needs every worker's address, and TF_CONFIG has a "
                         "sparseCluster (the training operator's enableDynamicWorker gives a "
                         "worker only its own): train async, read --dataset=criteo_files from the "
                         "data queue, or turn enableDynamicWorker off")
    if evaluating and not config.output_dir:
        raise UsageError(f"--schedule={schedule} needs --output_dir: the directory the chief "
                         "writes its checkpoints to")
    return config


def _prepare_process(cluster: Cluster | None, task: Task, config: TrainConfig) -> None:
    """What must happen before TensorFlow is imported: channel options, devices, output."""
    if cluster:  # before TensorFlow makes a channel
        channels.use_channel_options()
    if task.job_name == PS:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # a ps holds variables on its CPU only
    if (task.is_chief or task.job_name == EVALUATOR) and config.output_dir:
        output_layout.ensure_writable(config.output_dir)
    try:
        events.open_log(config.output_dir, task.name)
    except OSError as e:
        from absl import logging
        logging.warning("%s: no events file in %s (%s); training goes on without it",
                        task.name, config.output_dir, e.strerror)
    _start_production(config, task)


def _start_production(config: TrainConfig, task: Task) -> None:
    """Before TensorFlow's import: the metrics and health server (--metrics_port), so that
    a probe sees a task that is starting; this start counted against --max_restarts.

    Raises:
      UsageError: the metrics port is in use.
      errors.RestartsSpent: no restart is left (exit 1).
    """
    from lowlevel.runtime import metrics, restarts
    if config.metrics_port:
        metrics.serve(config.metrics_port, task.name, task.job_name, task.task_index,
                      config.output_dir)
    budget = restarts.begin(config.output_dir, task.name, config.max_restarts)
    metrics.report_restarts(budget.restarts)


def _main(argv) -> int:
    from lowlevel.runtime.preemption import Preemption
    return main(argv, Preemption())  # first: before TensorFlow starts any thread


def _exit_status(code: int) -> int:
    """The status the task exits with: a retryable one with no restart left becomes 1
    (`runtime.restarts`, --max_restarts)."""
    from lowlevel.runtime import restarts
    return restarts.finish(code)


def run():
    """Console-script entry point."""
    from lowlevel.ops.lifetime import die_with_parent
    die_with_parent()  # first: a launcher that dies takes its tasks with it
    app.run(cli.task_main("lowlevel.trainer", _main, on_exit=_exit_status),
            flags_parser=cli.flags_parser("lowlevel.trainer", [cli.TRAINER]))


if __name__ == "__main__":
    run()
