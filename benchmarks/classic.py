"""The textbook TF1 between-graph trainer: the `classic` reference of `benchmarks.throughput`.

Modelled on TensorFlow's tools/dist_test/python/mnist_replica.py and the "Distributed
TensorFlow" how-to of the TF1 era, kept as users wrote it:

- `tf.compat.v1.train.Server` per task; a ps task calls `server.join()` and never returns
  (tensorflow/tensorflow#4713): the driver kills it by PID;
- stock `replica_device_setter` (round-robin over the ps tasks, by variable creation order);
- an MLP from `get_variable` / `tf.matmul` / `tf.nn` (`tf.compat.v1.layers` is gone under
  Keras 3), softmax cross-entropy, `AdagradOptimizer` (async), or `SyncReplicasOptimizer`
  around it with its session hook (`--sync`);
- input through `feed_dict` of numpy batches (as `mnist.train.next_batch` did): the
  synthetic MNIST-shaped data of `benchmarks/_reference.py`, which equal
  `lowlevel.data.images.synthetic()`'s training split, reshuffled per epoch with the task's seed;
- stock `MonitoredTrainingSession` + `StopAtStepHook(last_step=--train_steps)`.

Only two things differ from the textbook, for a fair comparison with `lowlevel`: the
session config has the same thread counts `lowlevel` would choose (the cores shared
by the workers on a host, 1 intra-op thread for a ps beside them; inter-op >= 2;
`_reference.thread_counts`) and
`device_filters=["/job:ps", "/job:worker/task:I"]` on workers (a ps sees only itself).

What it measures: each worker times every `session.run` of its training loop after its
own first `--warmup_steps` steps, and when the loop ends writes one JSON record to
`--out_json` (also printed): {"task": "worker0", "local_steps": n, "examples_per_sec":
n * batch / (start of the first measured step .. end of the last, loop overhead
included), "step_ms_p50", "step_ms_p90" (of the `session.run` wall times),
"first_step_unix" (end of this worker's first step, warm-up included),
"last_step_unix" (end of its last step), ...}. The record is written before the
`MonitoredTrainingSession` closes, so a close that hangs (sync mode,
tensorflow/tensorflow#2386) does not lose it.

`--start_file` (not textbook; off by default): a non-chief worker waits for the chief's
session before creating its own (`_reference.wait_for_chief`: no 30 s recovery wait, see
below), and each worker, once its session is ready, creates `<start_file>.<task>.ready`
(`_reference.ready_file`) and waits until the start file exists; so a driver can start
every task at once and still have all workers train side by side (`benchmarks.throughput`
does), without reading their logs.

Stock behaviour the driver must allow for (not fixed here on purpose):
- A non-chief worker that starts before the chief has initialised the variables sleeps
  30 s (`SessionManager`'s `recovery_wait_secs`, tensorflow/tensorflow#10679). Start the
  chief first and the other workers once it has logged "worker0: session ready" (the
  variables are initialised by then), or use `--start_file`, and measure only after
  warm-up. Otherwise the chief may run many global steps alone meanwhile
  (`--train_steps` is the global step to stop at): seen with 2 workers and 600 steps,
  worker 1 ran 1 step.
- In sync mode the chief may not exit after its last step (its `stop_grace_period_secs`
  is 120 s): read the record, then kill the process by PID.

Run (from the repository root; ps first, then the chief, then other workers):

    python -m benchmarks.classic --ps_hosts=127.0.0.1:2222 --worker_hosts=127.0.0.1:2223 \\
        --job_name=ps --task_index=0
    python -m benchmarks.classic --ps_hosts=127.0.0.1:2222 --worker_hosts=127.0.0.1:2223 \\
        --job_name=worker --task_index=0 --train_steps=3000 --out_json=/tmp/classic_w0.json

With no --ps_hosts/--worker_hosts it trains in one session with no servers (a sanity check).
"""

from __future__ import annotations

import os
import time

import numpy as np
import tensorflow as tf
from absl import app, flags, logging

from benchmarks import _reference as ref
from lowlevel import cli
from lowlevel.ops import lifetime

v1 = tf.compat.v1
FLAGS = flags.FLAGS

flags.DEFINE_string("ps_hosts", "", "Comma-separated host:port of the ps tasks.")
flags.DEFINE_string("worker_hosts", "", "Comma-separated host:port of the workers; "
                    "worker 0 is the chief.")
flags.DEFINE_string("job_name", None, "ps or worker (ignored in-process).")
flags.DEFINE_integer("task_index", 0, "Index of this task within its job.")
flags.DEFINE_list("hidden_units", ["512", "512"], "Widths of the ReLU hidden layers.")
flags.DEFINE_integer("batch_size", 128, "Examples per worker step.")
flags.DEFINE_integer("train_steps", 2000, "The global step to stop at.")
flags.DEFINE_integer("warmup_steps", 100, "Each worker's own first steps, not measured.")
flags.DEFINE_float("learning_rate", 0.1, "Adagrad learning rate.")
flags.DEFINE_boolean("sync", False, "SyncReplicasOptimizer, aggregating one gradient per "
                     "worker per step (default: asynchronous).")
flags.DEFINE_string("checkpoint_dir", None, "Passed to MonitoredTrainingSession (checkpoints "
                    "and summaries); default none, as a pure throughput run.")
flags.DEFINE_string("out_json", None, "Where a worker writes its throughput record.")
flags.DEFINE_integer("intra_op_threads", 0, "Intra-op threads of this task (0: as lowlevel "
                     "would choose them from the hosts, `_reference.thread_counts`).")
flags.DEFINE_integer("inter_op_threads", 0, "Inter-op threads of this task (0: choose).")
flags.DEFINE_string("start_file", None, "If set, a non-chief worker waits for the chief's "
                    "session before creating its own, and a worker whose session is ready "
                    "waits until this file exists before its first step (a driver creates "
                    "it once every worker's session is ready, so that the workers train side "
                    "by side and the chief does not run the first global steps alone).")


def mlp(images, hidden_units):
    """images float32 `[B, 784]` -> logits `[B, 10]`; Glorot-uniform kernels, zero biases."""
    x = images
    widths = list(hidden_units) + [ref.NUM_CLASSES]
    for i, units in enumerate(widths):
        name = f"hid{i}" if i < len(hidden_units) else "sm"
        w = v1.get_variable(f"{name}_w", [x.shape[-1], units], tf.float32,
                            v1.glorot_uniform_initializer(seed=i))
        b = v1.get_variable(f"{name}_b", [units], tf.float32, v1.zeros_initializer())
        x = tf.nn.bias_add(tf.matmul(x, w), b)
        if i < len(hidden_units):
            x = tf.nn.relu(x)
    return x


def next_batches(images, labels, batch_size, seed):
    """Yields (images, labels) batches forever, reshuffled each epoch (like `next_batch`)."""
    rng = np.random.default_rng(seed)
    while True:
        perm = rng.permutation(len(labels))
        for lo in range(0, len(perm) - batch_size + 1, batch_size):
            idx = perm[lo:lo + batch_size]
            yield images[idx], labels[idx]


def check_task_flags(ps_hosts, worker_hosts):
    """Validates --job_name and --task_index against the host lists (lists of "host:port"
    strings, empty in-process); returns None, raises `app.UsageError` (absl prints the
    help and the message, exit status 1) when a distributed run names no job or a task
    index out of range."""
    distributed = bool(worker_hosts)
    if distributed and FLAGS.job_name not in ("ps", "worker"):
        raise app.UsageError("--job_name must be ps or worker with --worker_hosts")
    if distributed and not 0 <= FLAGS.task_index < len(
            ps_hosts if FLAGS.job_name == "ps" else worker_hosts):
        raise app.UsageError(f"--task_index={FLAGS.task_index} out of range")


def session_config(ps_hosts, worker_hosts):
    """This task's `ConfigProto` from the host lists ("host:port" strings; no workers:
    in-process): returns (config, intra-op threads, inter-op threads). Distributed, the
    thread counts are lowlevel's (`_reference.thread_counts`) unless --intra_op_threads /
    --inter_op_threads override them, and `device_filters` let a ps see only itself and a
    worker only the ps tasks and itself; in-process, every core and no filters."""
    if not worker_hosts:
        intra, inter = ref.thread_counts([], None)
        return v1.ConfigProto(intra_op_parallelism_threads=intra,
                              inter_op_parallelism_threads=inter), intra, inter
    me = (ps_hosts if FLAGS.job_name == "ps" else worker_hosts)[FLAGS.task_index]
    intra, inter = ref.thread_counts(worker_hosts, me, FLAGS.job_name == "worker", ps_hosts)
    intra, inter = FLAGS.intra_op_threads or intra, FLAGS.inter_op_threads or inter
    filters = ([f"/job:ps/task:{FLAGS.task_index}"] if FLAGS.job_name == "ps"
               else ["/job:ps", f"/job:worker/task:{FLAGS.task_index}"])
    config = v1.ConfigProto(intra_op_parallelism_threads=intra,
                            inter_op_parallelism_threads=inter, device_filters=filters)
    return config, intra, inter


def build_graph(hidden, num_workers, is_chief):
    """The training graph, built in the caller's device scope (the replica device setter):
    takes the hidden widths (ints), the number of workers and whether this is the chief;
    returns (x float32 `[B, 784]` and y int64 `[B]` placeholders, global_step, mean
    softmax cross-entropy loss, train_op, hooks): Adagrad, async, or wrapped in
    `SyncReplicasOptimizer` with its hook (--sync); a `StopAtStepHook` at --train_steps."""
    global_step = v1.train.get_or_create_global_step()
    x = v1.placeholder(tf.float32, [None, ref.NUM_INPUTS], name="x")
    y = v1.placeholder(tf.int64, [None], name="y")
    logits = mlp(x, hidden)
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=y, logits=logits))
    opt = v1.train.AdagradOptimizer(FLAGS.learning_rate)
    hooks = [v1.train.StopAtStepHook(last_step=FLAGS.train_steps)]
    if FLAGS.sync:
        opt = v1.train.SyncReplicasOptimizer(opt, replicas_to_aggregate=num_workers,
                                             total_num_replicas=num_workers)
        hooks.append(opt.make_session_run_hook(is_chief))
    train_op = opt.minimize(loss, global_step=global_step)
    return x, y, global_step, loss, train_op, hooks


def training_batches():
    """The synthetic MNIST-shaped training split (`_reference.synthetic_train`) scaled to
    [0, 1] as `input_data.read_data_sets` gave it: returns the `next_batches` generator of
    (images float32 `[--batch_size, 784]`, labels int64 `[--batch_size]`), seeded with
    --task_index."""
    raw_images, labels = ref.synthetic_train()
    images = raw_images.astype(np.float32) / 255.0  # what input_data.read_data_sets gave
    return next_batches(images, labels, FLAGS.batch_size, seed=FLAGS.task_index)


def wait_for_start_file(task):
    """With --start_file: creates this worker's ready file (`_reference.ready_file`, for
    task name `task`, e.g. "worker1") and polls every 50 ms until the start file exists;
    without it, returns at once. Returns None."""
    if FLAGS.start_file:
        open(ref.ready_file(FLAGS.start_file, task), "w").close()
    while FLAGS.start_file and not os.path.exists(FLAGS.start_file):
        time.sleep(0.05)


def train_loop(sess, fetches, x, y, batches, task):
    """Runs `fetches` ([train_op, global_step, loss]) feeding `batches` into placeholders
    x, y until `sess.should_stop()`, timing each `session.run` after this worker's first
    --warmup_steps; logs every 500 local steps. Returns a dict: step_secs (seconds of each
    measured run), window (seconds from the start of the first measured step to the end of
    the last, or None), first_step_unix / last_step_unix (end of the first / last step,
    Unix seconds), local (local steps), gstep (last global step), loss_value (last loss)."""
    step_secs, local = [], 0
    first_step_unix = last_step_unix = window_start = None
    gstep, loss_value = 0, float("nan")
    while not sess.should_stop():
        bx, by = next(batches)
        if local == FLAGS.warmup_steps:
            window_start = time.time()
        t0 = time.perf_counter()
        _, gstep, loss_value = sess.run(fetches, {x: bx, y: by})
        dt = time.perf_counter() - t0
        last_step_unix = time.time()
        local += 1
        if first_step_unix is None:
            first_step_unix = last_step_unix
        if local > FLAGS.warmup_steps:
            step_secs.append(dt)
        if local % 500 == 0:
            logging.info("%s: local step %d, global step %d, loss %.4f",
                         task, local, gstep, loss_value)
    window = (last_step_unix - window_start) if window_start and step_secs else None
    return dict(step_secs=step_secs, window=window, first_step_unix=first_step_unix,
                last_step_unix=last_step_unix, local=local, gstep=gstep,
                loss_value=loss_value)


def write_record(task, measured, num_ps, num_workers, hidden, intra, inter):
    """Writes this worker's throughput record (`_reference.record`) to --out_json and prints
    it: takes the task name, `train_loop`'s dict (seconds, Unix seconds, step counts), the
    cluster's ps and worker counts, the hidden widths and the session's intra-/inter-op
    thread counts. Returns None."""
    rec = ref.record(task, FLAGS.batch_size, measured["step_secs"], measured["window"],
                     measured["first_step_unix"], measured["last_step_unix"],
                     trainer="classic", sync=FLAGS.sync, num_ps=num_ps,
                     num_workers=num_workers, hidden_units=hidden,
                     warmup_steps=FLAGS.warmup_steps, total_local_steps=measured["local"],
                     global_step=int(measured["gstep"]),
                     final_loss=float(measured["loss_value"]) if measured["local"] else None,
                     intra_op_threads=intra, inter_op_threads=inter)
    ref.write_json(FLAGS.out_json, rec)


def main(_):
    lifetime.die_with_parent()  # first: a harness that dies takes this task with it
    v1.disable_eager_execution()
    ps_hosts, worker_hosts = ref.hosts(FLAGS.ps_hosts), ref.hosts(FLAGS.worker_hosts)
    hidden = [int(h) for h in FLAGS.hidden_units]
    check_task_flags(ps_hosts, worker_hosts)
    distributed = bool(worker_hosts)
    config, intra, inter = session_config(ps_hosts, worker_hosts)
    if distributed:
        cluster = v1.train.ClusterSpec({"ps": ps_hosts, "worker": worker_hosts})
        server = v1.train.Server(cluster, job_name=FLAGS.job_name,
                                 task_index=FLAGS.task_index, config=config)
        if FLAGS.job_name == "ps":
            logging.info("ps %d: serving on %s; join() forever", FLAGS.task_index,
                         ps_hosts[FLAGS.task_index])
            server.join()
            return
        target = server.target
        device_fn = v1.train.replica_device_setter(
            worker_device=f"/job:worker/task:{FLAGS.task_index}", cluster=cluster)
        num_workers = len(worker_hosts)
    else:
        target, device_fn, num_workers = "", None, 1
    is_chief = FLAGS.task_index == 0
    task = f"worker{FLAGS.task_index}" if distributed else "local"

    with v1.device(device_fn):
        x, y, global_step, loss, train_op, hooks = build_graph(hidden, num_workers, is_chief)
    batches = training_batches()

    ref.wait_for_chief(FLAGS.start_file, is_chief)
    logging.info("%s: creating the session (chief: %s)", task, is_chief)
    with v1.train.MonitoredTrainingSession(master=target, is_chief=is_chief,
                                           checkpoint_dir=FLAGS.checkpoint_dir,
                                           hooks=hooks, config=config) as sess:
        logging.info("%s: session ready", task)
        wait_for_start_file(task)
        measured = train_loop(sess, [train_op, global_step, loss], x, y, batches, task)
        # written before the session closes: a sync close may hang (tensorflow#2386)
        write_record(task, measured, len(ps_hosts), num_workers, hidden, intra, inter)
    logging.info("%s: session closed", task)


if __name__ == "__main__":
    app.run(main, flags_parser=cli.flags_parser("benchmarks.classic"))
