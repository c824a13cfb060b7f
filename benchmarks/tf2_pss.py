"""TensorFlow 2's ParameterServerStrategy + ClusterCoordinator: the `tf2_pss` reference.

The same model, data, batch and optimiser as `benchmarks/classic.py`, written the TF2 way
(after the "Parameter server training with ParameterServerStrategy" tutorial on
tensorflow.org): eager stays ON; a chief (the coordinator) holds the Python program and
dispatches `tf.function` steps to the workers, whose variables live on the ps tasks.

- Roles: `--job_name=ps|worker` run `tf.distribute.Server(...).join()` (they never
  return: the driver kills them by PID when the chief is done); `--job_name=chief` builds
  `tf.distribute.ParameterServerStrategy` from a `SimpleClusterResolver`, wraps it in a
  `tf.distribute.coordinator.ClusterCoordinator`, and trains.
- Model: an MLP of plain `tf.Variable`s (Glorot-uniform kernels, zero biases) created in
  `strategy.scope()`, so they are placed round-robin on the ps tasks.
- Optimiser: Adagrad (lr 0.1, initial accumulator 0.1, no epsilon), exactly TF1's
  `AdagradOptimizer`, as one `tf.raw_ops.ResourceApplyAdagradV2` per variable: the op
  takes the variable's handle, so it runs on the ps holding the variable and only the
  gradient crosses the wire, as in the TF1 trainer. Keras 3's optimisers are not used:
  Keras 3 does not support `ParameterServerStrategy`, and `tf.keras.optimizers` on
  TF 2.21 is Keras 3.
- Input: `coordinator.create_per_worker_dataset(dataset_fn)`, a `tf.data` pipeline on
  each worker over the synthetic data of `benchmarks/_reference.py` (uint8 pixels shipped
  once inside the dataset function, reshuffled every epoch, batched, scaled to [0, 1],
  prefetched).
- Threads: each task calls `tf.config.threading` before anything else runs (and passes
  the same counts in its server's config), as `lowlevel` chooses them
  (`_reference.thread_counts`): the workers share the cores of their host; the ps and
  the chief (the coordinator, which dispatches but does not compute) get 1 intra-op
  thread beside them; inter-op >= 2.

What it measures (chief only; --out_json, also printed): the chief schedules 1 step and
joins (`first_step_unix`), then the rest of `--warmup_steps`, joins, and then schedules
the `--train_steps - --warmup_steps` measured steps in chunks of `--join_every`, joining
after each chunk. `examples_per_sec` = measured steps * batch / (wall time from the end of
the warm-up join to the end of the last join), over all workers; `local_steps` = measured
steps, all workers together (the coordinator does not say which worker ran a step).
`step_ms_p50/p90` are over chunks: chunk wall time * num_workers / steps in the chunk,
i.e. the mean time a worker spent per step, comparable with the classic trainer's
per-step time; each join drains the queue, which costs the workers about one step of
idleness per chunk.

Run (from the repository root; ps and workers first, in any order, then the chief, which
waits until their ports accept connections):

    python -m benchmarks.tf2_pss --ps_hosts=127.0.0.1:2222 --worker_hosts=127.0.0.1:2223 \\
        --chief_host=127.0.0.1:2224 --job_name=ps --task_index=0
    python -m benchmarks.tf2_pss ... --job_name=worker --task_index=0
    python -m benchmarks.tf2_pss ... --job_name=chief --train_steps=3000 --out_json=/tmp/pss.json
"""

from __future__ import annotations

from absl import app, flags, logging

from benchmarks import _reference as ref
from lowlevel import cli
from lowlevel.ops import lifetime

FLAGS = flags.FLAGS

flags.DEFINE_string("ps_hosts", "", "Comma-separated host:port of the ps tasks.")
flags.DEFINE_string("worker_hosts", "", "Comma-separated host:port of the workers.")
flags.DEFINE_string("chief_host", "", "host:port of the chief (the coordinator).")
flags.DEFINE_enum("job_name", None, ["ps", "worker", "chief"], "This task's role.")
flags.DEFINE_integer("task_index", 0, "Index of this task within its job.")
flags.DEFINE_list("hidden_units", ["512", "512"], "Widths of the ReLU hidden layers.")
flags.DEFINE_integer("batch_size", 128, "Examples per worker step.")
flags.DEFINE_integer("train_steps", 2000, "Steps scheduled in all (all workers together).")
flags.DEFINE_integer("warmup_steps", 100, "First steps (all workers together), not measured.")
flags.DEFINE_integer("join_every", 100, "Measured steps scheduled between two joins.")
flags.DEFINE_float("learning_rate", 0.1, "Adagrad learning rate.")
flags.DEFINE_integer("intra_op_threads", 0, "Intra-op threads of this task (0: as lowlevel "
                     "would choose them from the hosts, `_reference.thread_counts`).")
flags.DEFINE_integer("inter_op_threads", 0, "Inter-op threads of this task (0: choose).")
flags.DEFINE_string("out_json", None, "Where the chief writes the throughput record.")


def build_model(tf, hidden_units):
    """(variables, accumulators, forward) for the MLP; call inside `strategy.scope()`."""
    widths = [ref.NUM_INPUTS] + list(hidden_units) + [ref.NUM_CLASSES]
    variables = []
    for i, (fan_in, fan_out) in enumerate(zip(widths[:-1], widths[1:])):
        limit = (6.0 / (fan_in + fan_out)) ** 0.5
        kernel = tf.random.stateless_uniform([fan_in, fan_out], seed=[i, 0],
                                             minval=-limit, maxval=limit)
        variables += [tf.Variable(kernel, name=f"hid{i}_w"),
                      tf.Variable(tf.zeros([fan_out]), name=f"hid{i}_b")]
    accumulators = [tf.Variable(tf.fill(v.shape, 0.1), name=v.name.split(":")[0] + "_acc")
                    for v in variables]

    def forward(x):
        for i in range(0, len(variables), 2):
            x = tf.nn.bias_add(tf.matmul(x, variables[i]), variables[i + 1])
            if i + 2 < len(variables):
                x = tf.nn.relu(x)
        return x

    return variables, accumulators, forward


def run_chief(tf, cluster_spec, num_workers, hidden):
    ref.wait_for_ports(cluster_spec.as_dict()["ps"] + cluster_spec.as_dict()["worker"])
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        cluster_spec, task_type="chief", task_id=0, rpc_layer="grpc")
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        variables, accumulators, forward = build_model(tf, hidden)
    logging.info("chief: variables on %s", sorted({v.device for v in variables + accumulators}))
    images, labels = ref.synthetic_train()
    batch_size, lr = FLAGS.batch_size, FLAGS.learning_rate

    def dataset_fn():
        ds = tf.data.Dataset.from_tensor_slices((images, labels))
        ds = ds.shuffle(len(labels), reshuffle_each_iteration=True).repeat()
        ds = ds.batch(batch_size, drop_remainder=True)
        ds = ds.map(lambda x, y: (tf.cast(x, tf.float32) / 255.0, y))
        return ds.prefetch(tf.data.AUTOTUNE)

    @tf.function
    def train_step(iterator):
        def replica_fn(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                    labels=y, logits=forward(x)))
            grads = tape.gradient(loss, variables)
            for v, acc, g in zip(variables, accumulators, grads):
                tf.raw_ops.ResourceApplyAdagradV2(
                    var=v.handle, accum=acc.handle, lr=tf.constant(lr, tf.float32),
                    epsilon=tf.constant(0.0, tf.float32), grad=g, use_locking=False)
            return loss

        x, y = next(iterator)
        return strategy.run(replica_fn, args=(x, y))

    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
    warmup = max(1, min(FLAGS.warmup_steps, FLAGS.train_steps))
    logging.info("chief: scheduling the first step; %d warm-up steps, then measuring", warmup)
    run = ref.drive_coordinator(coordinator, train_step, iterator, FLAGS.train_steps, warmup,
                                FLAGS.join_every, num_workers, batch_size)
    rec = ref.record("chief", batch_size, [], None, run.pop("first_step_unix"),
                     run.pop("last_unix"), trainer="tf2_pss", sync=False,
                     num_ps=len(cluster_spec.as_dict()["ps"]), num_workers=num_workers,
                     hidden_units=hidden, warmup_steps=warmup,
                     final_loss=run.pop("final_loss"))
    rec.update(run)
    return rec


def main(_):
    lifetime.die_with_parent()  # first: a harness that dies takes this task with it
    hidden = [int(h) for h in FLAGS.hidden_units]
    ref.tf2_pss_task(FLAGS, lambda tf, spec, workers: run_chief(tf, spec, workers, hidden))


if __name__ == "__main__":
    app.run(main, flags_parser=cli.flags_parser("benchmarks.tf2_pss"))
