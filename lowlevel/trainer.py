"""The trainer CLI: one task of a ps/worker cluster, or in-process training.

    python -m lowlevel.trainer --ps_hosts=127.0.0.1:2222 \\
        --worker_hosts=127.0.0.1:2223,127.0.0.1:2224 --job_name=ps --task_index=0
    python -m lowlevel.trainer --ps_hosts=... --worker_hosts=... --job_name=worker --task_index=0
    python -m lowlevel.trainer --ps_hosts=... --worker_hosts=... --job_name=worker --task_index=1

With no --ps_hosts/--worker_hosts it trains in one process (no servers).
Worker 0 is the chief; it prints the final metrics JSON as its last line of
stdout. A ps task exits 0 once the chief signals the end of training.

Flags are parsed here, and only here, into a `TrainConfig`. Exit status: 0 on
success, 2 for a usage error (one line on stderr naming the bad value), 1 for a
runtime failure.
"""

from __future__ import annotations

import json
import os
import sys

from absl import app, flags, logging

from lowlevel import cluster as cluster_lib
from lowlevel.config import DATASETS, MODELS, OPTIMIZERS, TrainConfig, UsageError

FLAGS = flags.FLAGS

# Cluster.
flags.DEFINE_string("ps_hosts", "", "Comma-separated host:port of the ps tasks.")
flags.DEFINE_string("worker_hosts", "", "Comma-separated host:port of the worker tasks; "
                    "worker 0 is the chief.")
flags.DEFINE_string("job_name", None, "This task's job: ps or worker.")
flags.DEFINE_integer("task_index", 0, "This task's index within its job.")
# Model and data.
flags.DEFINE_string("model", "mlp", f"Model: {' | '.join(MODELS)}.")
flags.DEFINE_list("hidden_units", ["128", "128"], "Hidden layer widths (mlp: every layer; "
                  "cnn: the dense layer after the convolutions uses the first).")
flags.DEFINE_string("dataset", "digits", f"Data set: {' | '.join(DATASETS)}. digits is "
                    "scikit-learn's bundled 8x8 handwritten digits (no download); "
                    "synthetic is learnable random data of MNIST shape.")
flags.DEFINE_string("data_dir", None, "Directory with mnist.npz or the four MNIST IDX "
                    "files (.gz or not); default: Keras' cache.")
# Optimisation.
flags.DEFINE_string("optimizer", "adagrad", f"Optimizer: {' | '.join(OPTIMIZERS)}.")
flags.DEFINE_float("learning_rate", None, "Learning rate; default: adagrad 0.1, sgd 0.1, "
                   "momentum 0.05, adam 0.001.")
flags.DEFINE_integer("batch_size", 64, "Examples per worker step.")
flags.DEFINE_integer("train_steps", 2000, "The global step to stop at.")
flags.DEFINE_boolean("sync", False, "Synchronous training with SyncReplicasOptimizer "
                     "(default: asynchronous; each worker applies its own updates).")
flags.DEFINE_integer("replicas_to_aggregate", None, "Sync mode: gradients averaged per "
                     "step; fewer than the number of workers leaves backup workers. "
                     "Default: the number of workers.")
flags.DEFINE_integer("seed", 0, "Seed for initialisation and shuffling.")
# Output.
flags.DEFINE_string("output_dir", None, "Checkpoints, TensorBoard summaries and "
                    "final_metrics.json; shared by all tasks. A run on a directory "
                    "with a checkpoint resumes from it.")
flags.DEFINE_integer("save_checkpoint_steps", None, "Checkpoint every this many global "
                     "steps (overrides --save_checkpoint_secs).")
flags.DEFINE_float("save_checkpoint_secs", 60.0, "Checkpoint every this many seconds.")
flags.DEFINE_integer("keep_checkpoint_max", 5, "Checkpoints to keep.")
flags.DEFINE_float("log_every_secs", 2.0, "Seconds between progress lines.")
# Resources and timeouts.
flags.DEFINE_integer("worker_gpu", None, "GPUs per worker (worker I computes on GPU I mod "
                     "worker_gpu); default: the GPUs TensorFlow sees. Variables always "
                     "stay on the ps CPUs.")
flags.DEFINE_integer("intra_op_threads", 0, "TensorFlow intra-op threads per task; 0 shares "
                     "the cores among the cluster's tasks on this machine.")
flags.DEFINE_integer("inter_op_threads", 0, "TensorFlow inter-op threads per task; 0: auto "
                     "(at least 2).")
flags.DEFINE_float("shutdown_timeout_secs", 60.0, "How long the chief waits after its last "
                   "step for the other workers to finish before stopping the ps tasks.")
flags.DEFINE_float("startup_timeout_secs", 600.0, "How long a worker waits for the cluster "
                   "and the chief's model before giving up.")


def config_from_flags(num_workers: int) -> TrainConfig:
    """The validated `TrainConfig` of the parsed flags.

    Raises:
      UsageError: a value is out of range or unknown.
    """
    try:
        hidden = tuple(int(u) for u in FLAGS.hidden_units)
    except ValueError:
        raise UsageError(f"--hidden_units={','.join(FLAGS.hidden_units)}: expected "
                         "comma-separated whole numbers, e.g. 128,128")
    return TrainConfig(
        model=FLAGS.model, hidden_units=hidden, dataset=FLAGS.dataset,
        data_dir=FLAGS.data_dir, optimizer=FLAGS.optimizer,
        learning_rate=FLAGS.learning_rate, batch_size=FLAGS.batch_size,
        train_steps=FLAGS.train_steps, output_dir=FLAGS.output_dir,
        save_checkpoint_steps=FLAGS.save_checkpoint_steps,
        save_checkpoint_secs=FLAGS.save_checkpoint_secs,
        keep_checkpoint_max=FLAGS.keep_checkpoint_max, sync=FLAGS.sync,
        replicas_to_aggregate=FLAGS.replicas_to_aggregate, worker_gpu=FLAGS.worker_gpu,
        seed=FLAGS.seed, log_every_secs=FLAGS.log_every_secs,
        intra_op_threads=FLAGS.intra_op_threads, inter_op_threads=FLAGS.inter_op_threads,
        shutdown_timeout_secs=FLAGS.shutdown_timeout_secs,
        startup_timeout_secs=FLAGS.startup_timeout_secs,
    ).validate(num_workers)


def main(argv) -> int:
    if len(argv) > 1:
        raise UsageError(f"unexpected argument {argv[1]!r} (flags are --name=value)")
    cluster, task = cluster_lib.from_flags(FLAGS.ps_hosts, FLAGS.worker_hosts,
                                           FLAGS.job_name, FLAGS.task_index)
    config = config_from_flags(cluster.num_workers if cluster else 1)
    if task.job_name == cluster_lib.PS:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # a ps holds variables on its CPU only
    if task.is_chief and config.output_dir:
        os.makedirs(config.output_dir, exist_ok=True)

    from lowlevel._tf import import_tensorflow
    tf = import_tensorflow(verbose=FLAGS.verbosity >= 1)
    from lowlevel import data as data_lib
    from lowlevel import server as server_lib
    from lowlevel import training

    session_config = None
    server = None
    if cluster:
        session_config = server_lib.session_config(cluster, task, config.intra_op_threads,
                                                   config.inter_op_threads)
        server = server_lib.start(cluster, task, session_config)
        if task.job_name == cluster_lib.PS:
            return server_lib.run_std_server(server, task, session_config)
    data = data_lib.load(config.dataset, config.data_dir)
    worker_gpu = config.worker_gpu
    if worker_gpu is None:
        worker_gpu = len(tf.config.list_physical_devices("GPU"))
    shape = (f"{cluster.num_ps} ps + {cluster.num_workers} workers, "
             f"{'sync' if config.sync else 'async'}" if cluster else "in-process")
    logging.info("%s: %s on %s (%d train / %d test examples), %s", task.name, config.model,
                 data.name, len(data.train), len(data.test), shape)
    metrics = training.train(config, data, cluster, task, server, session_config, worker_gpu)
    if metrics is not None:
        line = json.dumps(metrics)
        logging.info("final metrics: %s", line)
        print(line, flush=True)
    return 0


def _main_or_exit(argv):
    try:
        code = main(argv)
    except UsageError as e:
        sys.stderr.write(f"lowlevel.trainer: error: {e}\n")
        code = 2
    sys.stdout.flush()
    sys.stderr.flush()
    # A tf.train.Server has no working Stop(); leave without running its
    # destructors so the process cannot hang on them.
    os._exit(code or 0)


def _parse_flags(argv):
    try:
        return FLAGS(argv)
    except flags.Error as e:
        sys.stderr.write(f"lowlevel.trainer: error: {e}\n"
                         "(python -m lowlevel.trainer --help lists the flags)\n")
        sys.exit(2)


def run():
    """Console-script entry point."""
    app.run(_main_or_exit, flags_parser=_parse_flags)


if __name__ == "__main__":
    run()
