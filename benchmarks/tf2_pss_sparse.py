"""TF2 ParameterServerStrategy with sharded variables on the wide & deep model: `--suite=sparse`'s
second reference.

The sparse counterpart of `benchmarks/tf2_pss.py` (same roles, flags, threads, record and
measurement; see there), on the model and data of `benchmarks/classic_sparse.py`
(lowlevel's `--model=wide_deep` on `lowlevel.data.ctr.synthetic_ctr`), written the TF2
way after the "Parameter server training with ParameterServerStrategy" tutorial:

- `ParameterServerStrategy(resolver, variable_partitioner=
  tf.distribute.experimental.partitioners.FixedShardsPartitioner(--num_partitions))`:
  every variable with at least 2 rows becomes a `ShardedVariable` of that many shards,
  placed round-robin on the ps tasks; initial values are computed shard by shard on
  the ps (`initial_value` is a callable taking `partition_shape`/`partition_offset`),
  so no 10 M-row tensor is built on the coordinator.
- Lookups: `tf.nn.embedding_lookup(sharded_table, ids)` on the raw ids (the
  `ShardedVariable` override gathers each shard's rows on its ps; no deduplication).
- Adagrad (lr, initial accumulator 0.1, no epsilon: TF1's `AdagradOptimizer`): one
  accumulator per shard, colocated with it (`strategy.extended.colocate_vars_with`),
  applied with `ResourceSparseApplyAdagradV2` for the `IndexedSlices` gradients of the
  tables and `ResourceApplyAdagradV2` for the dense ones, so updates run on the ps and
  only gradients cross the wire (Keras 3's optimisers do not support this strategy).
- Input: `coordinator.create_per_worker_dataset` over the training split's arrays.

Run: as `benchmarks/tf2_pss.py`, with `python -m benchmarks.tf2_pss_sparse`.
"""

from __future__ import annotations

import math

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
flags.DEFINE_integer("vocab_size", 10_000_000, "Rows of the 26 field tables in all.")
flags.DEFINE_integer("hash_buckets", 10000, "Rows of each cross's wide table.")
flags.DEFINE_integer("embedding_dim", 16, "Width of each field's embedding.")
flags.DEFINE_integer("num_partitions", 2, "FixedShardsPartitioner's shards per variable.")
flags.DEFINE_list("hidden_units", ["128", "128"], "Widths of the deep part's ReLU layers.")
flags.DEFINE_integer("batch_size", 256, "Examples per worker step.")
flags.DEFINE_integer("train_steps", 600, "Steps scheduled in all (all workers together).")
flags.DEFINE_integer("warmup_steps", 40, "First steps (all workers together), not measured.")
flags.DEFINE_integer("join_every", 50, "Measured steps scheduled between two joins.")
flags.DEFINE_float("learning_rate", 0.1, "Adagrad learning rate.")
flags.DEFINE_string("out_json", None, "Where the chief writes the throughput record.")


def build_model(tf, strategy, field_sizes, num_crosses, num_dense):
    """(shards, accumulators, forward) of the wide & deep model; call in `strategy.scope()`.

    `forward(dense, categorical, crosses)` -> float32 `[B]` logits, as classic_sparse's.
    """
    def table(name, rows, dim, stddev, seed):
        def init(partition_shape=None, partition_offset=None):  # one shard's rows, on its ps
            offset = partition_offset[0] if partition_offset else 0
            return tf.random.stateless_truncated_normal(
                partition_shape or (rows, dim), seed=[seed, offset], stddev=stddev)
        return tf.Variable(init, shape=[rows, dim], dtype=tf.float32, name=name)

    def dense_vars(name, fan_in, units, seed):
        limit = math.sqrt(6.0 / (fan_in + units))
        return (tf.Variable(tf.random.stateless_uniform([fan_in, units], [seed, 0], -limit, limit),
                            name=f"{name}_w"),
                tf.Variable(tf.zeros([units]), name=f"{name}_b"))

    dim, hidden = FLAGS.embedding_dim, [int(h) for h in FLAGS.hidden_units]
    wide_fields = [table(f"wide_field{f}", r, 1, 1e-3, f) for f, r in enumerate(field_sizes)]
    wide_crosses = [table(f"wide_cross{c}", FLAGS.hash_buckets, 1, 1e-3, 100 + c)
                    for c in range(num_crosses)]
    deep_tables = [table(f"embedding{f}", r, dim, 1.0 / math.sqrt(dim), 200 + f)
                   for f, r in enumerate(field_sizes)]
    wide_dense = dense_vars("wide_dense", num_dense, 1, 0)
    layers, fan_in = [], num_dense + dim * len(field_sizes)
    for i, units in enumerate(hidden + [1]):
        layers.append(dense_vars(f"hidden{i}" if i < len(hidden) else "logit", fan_in,
                                 units, 300 + i))
        fan_in = units
    model_vars = (wide_fields + wide_crosses + deep_tables + [wide_dense[0], wide_dense[1]] +
                  [v for layer in layers for v in layer])
    shards = [s for v in model_vars for s in getattr(v, "variables", [v])]
    accumulators = []
    for s in shards:
        with strategy.extended.colocate_vars_with(s):
            accumulators.append(tf.Variable(tf.fill(s.shape, 0.1), name=f"acc_{len(accumulators)}"))

    def forward(dense, categorical, crosses):
        wide = [tf.matmul(dense, wide_dense[0]) + wide_dense[1]]
        wide += [tf.nn.embedding_lookup(t, categorical[:, f]) for f, t in enumerate(wide_fields)]
        wide += [tf.nn.embedding_lookup(t, crosses[:, c]) for c, t in enumerate(wide_crosses)]
        deep = [dense] + [tf.nn.embedding_lookup(t, categorical[:, f])
                          for f, t in enumerate(deep_tables)]
        x = tf.concat(deep, axis=1)
        for i, (w, b) in enumerate(layers):
            x = tf.matmul(x, w) + b
            if i + 1 < len(layers):
                x = tf.nn.relu(x)
        return tf.reshape(tf.add_n(wide) + x, [-1])

    return shards, accumulators, forward


def run_chief(tf, cluster_spec, num_workers):
    from lowlevel.data import ctr as ctr_data
    ref.wait_for_ports(cluster_spec.as_dict()["ps"] + cluster_spec.as_dict()["worker"])
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        cluster_spec, task_type="chief", task_id=0, rpc_layer="grpc")
    strategy = tf.distribute.experimental.ParameterServerStrategy(
        resolver, variable_partitioner=tf.distribute.experimental.partitioners
        .FixedShardsPartitioner(FLAGS.num_partitions))
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    data = ctr_data.synthetic_ctr(FLAGS.vocab_size, FLAGS.hash_buckets)
    with strategy.scope():
        shards, accumulators, forward = build_model(
            tf, strategy, data.field_sizes, len(data.cross_names), data.num_dense)
    logging.info("chief: %d shards on %s", len(shards), sorted({s.device for s in shards}))
    train = data.train
    batch_size, lr = FLAGS.batch_size, FLAGS.learning_rate

    def dataset_fn():
        ds = tf.data.Dataset.from_tensor_slices(
            (train.dense, train.categorical, train.crosses, train.labels))
        ds = ds.shuffle(len(train.labels), reshuffle_each_iteration=True).repeat()
        return ds.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)

    @tf.function
    def train_step(iterator):
        def replica_fn(dense, categorical, crosses, labels):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
                    labels=tf.cast(labels, tf.float32),
                    logits=forward(dense, categorical, crosses)))
            grads = tape.gradient(loss, shards)
            lr_t, eps = tf.constant(lr, tf.float32), tf.constant(0.0, tf.float32)
            for v, acc, g in zip(shards, accumulators, grads):
                if isinstance(g, tf.IndexedSlices):
                    tf.raw_ops.ResourceSparseApplyAdagradV2(
                        var=v.handle, accum=acc.handle, lr=lr_t, epsilon=eps, grad=g.values,
                        indices=g.indices, use_locking=False)
                else:
                    tf.raw_ops.ResourceApplyAdagradV2(var=v.handle, accum=acc.handle, lr=lr_t,
                                                      epsilon=eps, grad=g, use_locking=False)
            return loss

        return strategy.run(replica_fn, args=next(iterator))

    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
    warmup = max(1, min(FLAGS.warmup_steps, FLAGS.train_steps))
    run = ref.drive_coordinator(coordinator, train_step, iterator, FLAGS.train_steps, warmup,
                                FLAGS.join_every, num_workers, batch_size)
    rec = ref.record("chief", batch_size, [], None, run.pop("first_step_unix"),
                     run.pop("last_unix"), trainer="tf2_pss_sparse", sync=False,
                     num_ps=len(cluster_spec.as_dict()["ps"]), num_workers=num_workers,
                     hidden_units=[int(h) for h in FLAGS.hidden_units], warmup_steps=warmup,
                     final_loss=run.pop("final_loss"), vocab_size=FLAGS.vocab_size,
                     embedding_dim=FLAGS.embedding_dim)
    rec.update(run)
    return rec


def main(_):
    lifetime.die_with_parent()  # first: a harness that dies takes this task with it
    ref.tf2_pss_task(FLAGS, run_chief)


if __name__ == "__main__":
    app.run(main, flags_parser=cli.flags_parser("benchmarks.tf2_pss_sparse"))
