"""The textbook TF1 trainer on the wide & deep click-through model: `--suite=sparse`'s reference.

The sparse counterpart of `benchmarks/classic.py`, written as TF1-era recommendation code
was (the "Distributed TensorFlow" how-to plus `tf.nn.embedding_lookup` on a partitioned
variable, as in TensorFlow's word2vec and wide & deep tutorials):

- `tf.compat.v1.train.Server` per task; a ps calls `server.join()` forever (the driver
  kills it by PID);
- stock `replica_device_setter` (round-robin over the ps tasks, by variable creation
  order), with every embedding table created with
  `partitioner=tf.compat.v1.fixed_size_partitioner(--num_partitions)` (2: one shard per
  ps) and read with `tf.compat.v1.nn.embedding_lookup` (its default "mod" strategy) on the
  raw ids: no deduplication, so a hot id is sent, gathered and updated once per
  occurrence (the gradient `IndexedSlices` carries one row per occurrence);
- the same model as lowlevel's `--model=wide_deep` (`lowlevel/models/wide_deep.py`): wide part =
  a `[rows, 1]` weight table per categorical field and per hashed cross plus a linear
  unit on the dense features; deep part = a `[rows, --embedding_dim]` table per field,
  concatenated with the dense features, ReLU layers of `--hidden_units`, one linear unit;
  logit = wide + deep; sigmoid cross-entropy; `AdagradOptimizer` (async);
- the same data: `lowlevel.data.ctr.synthetic_ctr(--vocab_size, --hash_buckets)`'s
  training split, fed as numpy batches through `feed_dict`, reshuffled per epoch with the
  task's seed;
- stock `MonitoredTrainingSession` + `StopAtStepHook(last_step=--train_steps)`.

As in `classic.py` (for a fair comparison): lowlevel's thread counts, `device_filters`
on the workers, and `--start_file` so that the workers train side by side. The record
(`--out_json`) is `_reference.record`'s, as `classic.py` writes it.

Run (ps first, then the chief, then the other workers):

    python -m benchmarks.classic_sparse --ps_hosts=127.0.0.1:2222,127.0.0.1:2223 \\
        --worker_hosts=127.0.0.1:2224,127.0.0.1:2225 --job_name=ps --task_index=0
    python -m benchmarks.classic_sparse ... --job_name=worker --task_index=0 \\
        --train_steps=600 --out_json=/tmp/classic_sparse_w0.json
"""

from __future__ import annotations

import math
import os
import time

import numpy as np
import tensorflow as tf
from absl import app, flags, logging

from benchmarks import _reference as ref
from lowlevel import cli
from lowlevel.data import ctr as ctr_data
from lowlevel.ops import lifetime

v1 = tf.compat.v1
FLAGS = flags.FLAGS

flags.DEFINE_string("ps_hosts", "", "Comma-separated host:port of the ps tasks.")
flags.DEFINE_string("worker_hosts", "", "Comma-separated host:port of the workers; "
                    "worker 0 is the chief.")
flags.DEFINE_string("job_name", None, "ps or worker.")
flags.DEFINE_integer("task_index", 0, "Index of this task within its job.")
flags.DEFINE_integer("vocab_size", 10_000_000, "Rows of the 26 field tables in all "
                     "(`lowlevel.data.ctr.synthetic_ctr`).")
flags.DEFINE_integer("hash_buckets", 10000, "Rows of each cross's wide table.")
flags.DEFINE_integer("embedding_dim", 16, "Width of each field's embedding.")
flags.DEFINE_integer("num_partitions", 2, "Shards of every table (fixed_size_partitioner).")
flags.DEFINE_list("hidden_units", ["128", "128"], "Widths of the deep part's ReLU layers.")
flags.DEFINE_integer("batch_size", 256, "Examples per worker step.")
flags.DEFINE_integer("train_steps", 600, "The global step to stop at.")
flags.DEFINE_integer("warmup_steps", 20, "Each worker's own first steps, not measured.")
flags.DEFINE_float("learning_rate", 0.1, "Adagrad learning rate.")
flags.DEFINE_string("out_json", None, "Where a worker writes its throughput record.")
flags.DEFINE_string("start_file", None, "If set, a non-chief worker waits for the chief's "
                    "session before creating its own, and a worker whose session is ready "
                    "waits until this file exists before its first step (see "
                    "benchmarks/classic.py).")


def _dense(x, units, name, seed, activation=None):
    w = v1.get_variable(f"{name}_w", [x.shape[-1], units], tf.float32,
                        v1.glorot_uniform_initializer(seed=seed))
    b = v1.get_variable(f"{name}_b", [units], tf.float32, v1.zeros_initializer())
    y = tf.nn.bias_add(tf.matmul(x, w), b)
    return activation(y) if activation else y


def _table(name, rows, dim, stddev, seed, num_partitions):
    return v1.get_variable(name, [rows, dim], tf.float32,
                           v1.truncated_normal_initializer(stddev=stddev, seed=seed),
                           partitioner=v1.fixed_size_partitioner(num_partitions))


def wide_deep_logits(dense, categorical, crosses, field_sizes, hash_buckets, embedding_dim,
                     hidden_units, num_partitions):
    """float32 `[B]` logits: dense `[B, 13]` float32, categorical `[B, 26]` / crosses `[B, 3]` int64."""
    wide = [_dense(dense, 1, "wide_dense", 0)]
    deep = [dense]
    for f, rows in enumerate(field_sizes):
        w = _table(f"wide_field{f}", rows, 1, 1e-3, f, num_partitions)
        wide.append(v1.nn.embedding_lookup(w, categorical[:, f]))
    for c in range(crosses.shape[1]):
        w = _table(f"wide_cross{c}", hash_buckets, 1, 1e-3, 100 + c, num_partitions)
        wide.append(v1.nn.embedding_lookup(w, crosses[:, c]))
    for f, rows in enumerate(field_sizes):
        t = _table(f"embedding{f}", rows, embedding_dim, 1.0 / math.sqrt(embedding_dim),
                   200 + f, num_partitions)
        deep.append(v1.nn.embedding_lookup(t, categorical[:, f]))
    x = tf.concat(deep, axis=1)
    for i, units in enumerate(hidden_units):
        x = _dense(x, units, f"hidden{i}", 300 + i, tf.nn.relu)
    return tf.reshape(tf.add_n(wide) + _dense(x, 1, "logit", 400), [-1])


def next_batches(split, batch_size, seed):
    """Yields (dense, categorical, crosses, labels) batches forever, reshuffled each epoch."""
    rng = np.random.default_rng(seed)
    while True:
        perm = rng.permutation(len(split.labels))
        for lo in range(0, len(perm) - batch_size + 1, batch_size):
            idx = perm[lo:lo + batch_size]
            yield split.dense[idx], split.categorical[idx], split.crosses[idx], split.labels[idx]


def check_task_flags(ps_hosts, worker_hosts):
    """Validates the cluster flags against the host lists (lists of "host:port" strings):
    returns None, raises `app.UsageError` (absl prints the help and the message, exit
    status 1) without both lists and --job_name=ps|worker, or with a --task_index out of
    range for the job."""
    if not (ps_hosts and worker_hosts) or FLAGS.job_name not in ("ps", "worker"):
        raise app.UsageError("--ps_hosts, --worker_hosts and --job_name=ps|worker are required")
    if not 0 <= FLAGS.task_index < len(ps_hosts if FLAGS.job_name == "ps" else worker_hosts):
        raise app.UsageError(f"--task_index={FLAGS.task_index} out of range")


def session_config(ps_hosts, worker_hosts):
    """This task's `ConfigProto` from the host lists ("host:port" strings): returns
    (config, intra-op threads, inter-op threads), the thread counts lowlevel would choose
    (`_reference.thread_counts`) and `device_filters` by which a ps sees only itself and a
    worker only the ps tasks and itself."""
    me = (ps_hosts if FLAGS.job_name == "ps" else worker_hosts)[FLAGS.task_index]
    intra, inter = ref.thread_counts(worker_hosts, me, FLAGS.job_name == "worker", ps_hosts)
    filters = ([f"/job:ps/task:{FLAGS.task_index}"] if FLAGS.job_name == "ps"
               else ["/job:ps", f"/job:worker/task:{FLAGS.task_index}"])
    config = v1.ConfigProto(intra_op_parallelism_threads=intra,
                            inter_op_parallelism_threads=inter, device_filters=filters)
    return config, intra, inter


def build_graph(data, hidden):
    """The training graph, built in the caller's device scope (the replica device setter):
    takes the `synthetic_ctr` data (for its field sizes and feature counts) and the hidden
    widths (ints); returns ((dense float32 `[B, 13]`, categorical int64 `[B, 26]`, crosses
    int64 `[B, 3]`, labels int64 `[B]`) placeholders, global_step, mean sigmoid
    cross-entropy loss, train_op of an asynchronous Adagrad)."""
    global_step = v1.train.get_or_create_global_step()
    dense = v1.placeholder(tf.float32, [None, data.num_dense], name="dense")
    categorical = v1.placeholder(tf.int64, [None, len(data.field_sizes)], name="categorical")
    crosses = v1.placeholder(tf.int64, [None, len(data.cross_names)], name="crosses")
    labels = v1.placeholder(tf.int64, [None], name="labels")
    logits = wide_deep_logits(dense, categorical, crosses, data.field_sizes,
                              FLAGS.hash_buckets, FLAGS.embedding_dim, hidden,
                              FLAGS.num_partitions)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
        labels=tf.cast(labels, tf.float32), logits=logits))
    train_op = v1.train.AdagradOptimizer(FLAGS.learning_rate).minimize(
        loss, global_step=global_step)
    return (dense, categorical, crosses, labels), global_step, loss, train_op


def wait_for_start_file(task):
    """With --start_file: creates this worker's ready file (`_reference.ready_file`, for
    task name `task`, e.g. "worker1") and polls every 50 ms until the start file exists;
    without it, returns at once. Returns None."""
    if FLAGS.start_file:
        open(ref.ready_file(FLAGS.start_file, task), "w").close()
    while FLAGS.start_file and not os.path.exists(FLAGS.start_file):
        time.sleep(0.05)


def train_loop(sess, fetches, placeholders, batches, task):
    """Runs `fetches` ([train_op, global_step, loss]) feeding `batches` into the (dense,
    categorical, crosses, labels) placeholders until `sess.should_stop()`, timing each
    `session.run` after this worker's first --warmup_steps; logs every 200 local steps.
    Returns a dict: step_secs (seconds of each measured run), window (seconds from the
    start of the first measured step to the end of the last, or None), first_step_unix /
    last_step_unix (end of the first / last step, Unix seconds), local (local steps),
    gstep (last global step), loss_value (last loss)."""
    dense, categorical, crosses, labels = placeholders
    step_secs, local = [], 0
    first_step_unix = last_step_unix = window_start = None
    gstep, loss_value = 0, float("nan")
    while not sess.should_stop():
        bd, bc, bx, by = next(batches)
        if local == FLAGS.warmup_steps:
            window_start = time.time()
        t0 = time.perf_counter()
        _, gstep, loss_value = sess.run(fetches, {
            dense: bd, categorical: bc, crosses: bx, labels: by})
        dt = time.perf_counter() - t0
        last_step_unix = time.time()
        local += 1
        first_step_unix = first_step_unix or last_step_unix
        if local > FLAGS.warmup_steps:
            step_secs.append(dt)
        if local % 200 == 0:
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
    ref.write_json(FLAGS.out_json, ref.record(
        task, FLAGS.batch_size, measured["step_secs"], measured["window"],
        measured["first_step_unix"], measured["last_step_unix"],
        trainer="classic_sparse", sync=False, num_ps=num_ps, num_workers=num_workers,
        hidden_units=hidden, warmup_steps=FLAGS.warmup_steps,
        total_local_steps=measured["local"], global_step=int(measured["gstep"]),
        final_loss=float(measured["loss_value"]) if measured["local"] else None,
        vocab_size=FLAGS.vocab_size, embedding_dim=FLAGS.embedding_dim,
        intra_op_threads=intra, inter_op_threads=inter))


def main(_):
    lifetime.die_with_parent()  # first: a harness that dies takes this task with it
    v1.disable_eager_execution()
    ps_hosts, worker_hosts = ref.hosts(FLAGS.ps_hosts), ref.hosts(FLAGS.worker_hosts)
    check_task_flags(ps_hosts, worker_hosts)
    config, intra, inter = session_config(ps_hosts, worker_hosts)
    cluster = v1.train.ClusterSpec({"ps": ps_hosts, "worker": worker_hosts})
    server = v1.train.Server(cluster, job_name=FLAGS.job_name, task_index=FLAGS.task_index,
                             config=config)
    if FLAGS.job_name == "ps":
        logging.info("ps %d: serving on %s; join() forever", FLAGS.task_index,
                     ps_hosts[FLAGS.task_index])
        server.join()
        return
    task, is_chief = f"worker{FLAGS.task_index}", FLAGS.task_index == 0
    data = ctr_data.synthetic_ctr(FLAGS.vocab_size, FLAGS.hash_buckets)
    hidden = [int(h) for h in FLAGS.hidden_units]
    with v1.device(v1.train.replica_device_setter(
            worker_device=f"/job:worker/task:{FLAGS.task_index}", cluster=cluster)):
        placeholders, global_step, loss, train_op = build_graph(data, hidden)
    batches = next_batches(data.train, FLAGS.batch_size, seed=FLAGS.task_index)
    hooks = [v1.train.StopAtStepHook(last_step=FLAGS.train_steps)]
    ref.wait_for_chief(FLAGS.start_file, is_chief)
    logging.info("%s: creating the session (chief: %s)", task, is_chief)
    with v1.train.MonitoredTrainingSession(master=server.target, is_chief=is_chief,
                                           hooks=hooks, config=config) as sess:
        logging.info("%s: session ready", task)
        wait_for_start_file(task)
        measured = train_loop(sess, [train_op, global_step, loss], placeholders, batches,
                              task)
        # written before the session closes, as in classic.py
        write_record(task, measured, len(ps_hosts), len(worker_hosts), hidden, intra, inter)
    logging.info("%s: session closed", task)


if __name__ == "__main__":
    app.run(main, flags_parser=cli.flags_parser("benchmarks.classic_sparse"))
