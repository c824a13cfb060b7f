"""What a task does, by its schedule (`--schedule`, as in tensor2tensor): one function each.

- `serve` (`run_std_server`, a ps): holds variables until the chief says the run is over;
- `train` (`train`, the chief and the workers): trains to `--train_steps`, or finds the
  run finished and ends it (`finish.finished_run`);
- `evaluate` (`continuous_eval[_on_train_data]`, an evaluator): evaluates each new
  checkpoint until the final one.

`run` imports TensorFlow (graph mode, quiet: `lowlevel.tf_import`) and picks one.
Each returns the task's exit status (`lowlevel.errors`).
"""

from __future__ import annotations

import json
import os
from typing import Optional

from absl import logging

from lowlevel import config as config_lib
from lowlevel import events
from lowlevel.cluster.spec import EVALUATOR, Cluster, Task
from lowlevel.config import TrainConfig
from lowlevel.tf_import import import_tensorflow


def run(schedule: str, config: TrainConfig, cluster: Optional[Cluster], task: Task,
        preemption, verbose: bool = False, trainable=None, set_logger: bool = True) -> int:
    """Runs `schedule` for `task`; returns the exit status.

    Args:
      preemption: the task's `preemption.Preemption` (SIGTERM/SIGINT at a safe point).
      verbose: keep TensorFlow's own log output (`--verbosity=1`).
      trainable: what a training task trains (`trainables`); default: what `config`
        names (`trainables.for_config`).
      set_logger: False leaves TensorFlow's Python logger at the level the program set
        (an Estimator script's); True sets it per `verbose` (`import_tensorflow`).
    """
    import_tensorflow(verbose=verbose, set_logger=set_logger)
    events.emit("started", None, schedule=schedule, pid=os.getpid())
    if schedule == config_lib.RUN_STD_SERVER:
        return serve(cluster, task, config)
    if task.job_name == EVALUATOR:
        return evaluate(config, task, schedule == config_lib.CONTINUOUS_EVAL_ON_TRAIN_DATA)
    return train(config, cluster, task, preemption, trainable)


def serve(cluster: Cluster, task: Task, config: TrainConfig) -> int:
    """A ps: serves the variables until the chief's stop signal (`shutdown.run_std_server`)."""
    from lowlevel.runtime import server as server_lib
    from lowlevel.runtime import shutdown
    session_config = server_lib.session_config(cluster, task, config.intra_op_threads,
                                               config.inter_op_threads)
    _log_cpus(task, session_config)
    server = server_lib.start(cluster, task, session_config)
    _serving(cluster, task)
    return shutdown.run_std_server(server, task, session_config)


def evaluate(config: TrainConfig, task: Task, on_train_data: bool) -> int:
    """An evaluator: each new checkpoint until the final one; prints the last record."""
    import tensorflow as tf

    from lowlevel.runtime import evaluator, trainables
    _log_cpus(task, None)
    _serving(None, task)
    trainable = trainables.for_config(config, None, task)
    record = evaluator.continuous_eval(
        config, trainable, on_train_data,
        tf.compat.v1.ConfigProto(intra_op_parallelism_threads=config.intra_op_threads or 1,
                                 inter_op_parallelism_threads=config.inter_op_threads or 1))
    print(json.dumps(record), flush=True)
    return 0


def train(config: TrainConfig, cluster: Optional[Cluster], task: Task, preemption,
          trainable=None) -> int:
    """The chief or a worker: trains to `--train_steps` (`training.train`), or, on a finished
    run, ends it (`finish.finished_run`); then reports (`finish.report`)."""
    from lowlevel.errors import TrainingFinished
    from lowlevel.outputs import checkpoints
    from lowlevel.runtime import finish, trainables, training
    from lowlevel.runtime import server as server_lib

    session_config = server = None
    if cluster:
        session_config = server_lib.session_config(
            cluster, task, config.intra_op_threads, config.inter_op_threads,
            cpu_devices=_cpu_devices(config), graph_rewrites=config.rewrites(True))
    _log_cpus(task, session_config)
    if cluster:
        server = server_lib.start(cluster, task, session_config)
        training.end_predecessor_lease(config, cluster, task, server, session_config)
    _serving(cluster, task)
    try:
        checkpoints.check_finished(config.output_dir, config.train_steps)
        trainable = trainable or trainables.for_config(config, cluster, task)
        worker_gpu = _worker_gpu(config)
        shape = (f"{cluster.num_ps} ps + {cluster.num_workers or 'dynamic'} workers, "
                 f"{'sync' if config.sync else 'async'}" if cluster else "in-process")
        logging.info("%s: %s, %s", task.name, trainable.description, shape)
        metrics = training.train(config, trainable, cluster, task, server, session_config,
                                 worker_gpu, preemption)
    except TrainingFinished as done:
        metrics = finish.finished_run(config, cluster, task, server, session_config, done)
    return finish.report(metrics, preemption)


def _worker_gpu(config: TrainConfig) -> int:
    """GPUs per worker: `--worker_gpu`, else the GPUs TensorFlow sees."""
    import tensorflow as tf
    if config.worker_gpu is not None:
        return config.worker_gpu
    return len(tf.config.list_physical_devices("GPU"))


def _cpu_devices(config: TrainConfig) -> int:
    """The CPU devices of a training task's server: `--towers` > 1 on a machine without
    GPUs (`lowlevel.modes.towers`), else 1. GPUs are looked for only then: the default
    path starts its server before TensorFlow enumerates devices, as it always did."""
    return config.towers if config.towers > 1 and not _worker_gpu(config) else 1


def _log_cpus(task: Task, session_config) -> None:
    """Logs the CPUs this task sizes its thread pools from (`lowlevel.ops.resources`) and
    reports them as metrics."""
    from lowlevel.ops import resources
    from lowlevel.runtime import metrics
    pools = (f": intra-op {session_config.intra_op_parallelism_threads}, inter-op "
             f"{session_config.inter_op_parallelism_threads} threads" if session_config else "")
    logging.info("%s: %s%s", task.name, resources.figure().describe(), pools)
    metrics.report_cpus(resources.figure(), session_config)


def _serving(cluster: Optional[Cluster], task: Task) -> None:
    """This task is up (its server started, or it needs none): healthy from now on."""
    from lowlevel.runtime import metrics
    address = cluster.hosts(task.job_name)[task.task_index] if cluster else None
    metrics.serving(address, cluster, task)
