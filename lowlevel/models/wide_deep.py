"""The wide & deep click-through model (Cheng et al., "Wide & Deep Learning for Recommender
Systems", DLRS 2016), from `tf.compat.v1` primitives.

For features as `lowlevel.data.ctr` gives them (`dense` float32 `[B, D]`,
`categorical` int64 `[B, F]`, `crosses` int64 `[B, C]`):

- wide: a linear model over the categorical ids and the hashed crosses (a
  weight per id of each field and each cross: one `[rows, 1]` table) and the
  dense features;
- deep: an `[rows, embedding_dim]` embedding per id of each categorical field
  (one table), the rows of the example's ids concatenated field by field with
  the dense features, then ReLU layers of `hidden_units` and a linear unit;
- one logit, their sum; the loss is sigmoid cross-entropy.

Tables are `lowlevel.models.embeddings.FieldTable`s: the fields share one table per part,
partitioned by rows over the ps tasks, looked up with deduplicated ids, trained with
sparse gradients. With `Spec.dynamic` (`--embedding=dynamic`) they are
`lowlevel.models.dynamic_embeddings.FieldTables` instead: raw ids, rows made on
admission in hash tables on the ps, evicted when stale; the field sizes are then unused.
"""

from __future__ import annotations

import dataclasses
import math

import tensorflow as tf

from lowlevel.models import dynamic_embeddings, embeddings

v1 = tf.compat.v1


def _l2_rows(rows, weight: float):
    """Identity on looked-up rows `[B, d]` whose gradient adds `weight / B * rows`.

    That is the gradient of an L2 penalty `weight / 2 * mean_b ||rows_b||^2`
    (frequency-weighted, on the rows a batch touches: the gradient stays sparse).
    """
    if not weight:
        return rows

    @tf.custom_gradient
    def penalised(x):
        def grad(dy):
            return dy + weight / tf.cast(tf.shape(x)[0], x.dtype) * x
        return tf.identity(x), grad
    return penalised(rows)


@dataclasses.dataclass(frozen=True)
class Spec:
    """The shape of the sparse input: rows per categorical field, crosses, embedding width."""

    field_sizes: tuple[int, ...]
    num_crosses: int
    hash_buckets: int
    embedding_dim: int
    l2: float = 0.0  # L2 weight on the embedding rows a batch touches (`_l2_rows`)
    dynamic: dynamic_embeddings.Options | None = None  # dynamic tables (raw ids) if set

    @classmethod
    def of(cls, data, embedding_dim: int, l2: float = 0.0, dynamic=None) -> "Spec":
        return cls(tuple(data.field_sizes), len(data.cross_names), data.hash_buckets,
                   embedding_dim, l2, dynamic)

    def table(self, name: str, sizes, dim: int, stddev: float, seed: int):
        """The fields' table: a static `FieldTable` of `sizes` rows, or dynamic `FieldTables`."""
        if self.dynamic is not None:
            return dynamic_embeddings.FieldTables(name, len(sizes), dim, stddev, seed,
                                                  self.dynamic)
        return embeddings.FieldTable(name, sizes, dim, stddev, seed)


def logits(features: dict, spec: Spec, hidden_units, seed: int, dense_layer):
    """float32 `[B]` logits. `dense_layer(x, units, name, seed, activation)` as `models.dense`."""
    dense = features["dense"]
    categorical, crosses = features["categorical"], features["crosses"]
    num_fields, num_wide = len(spec.field_sizes), len(spec.field_sizes) + spec.num_crosses
    with v1.variable_scope("wide"):
        weights = spec.table(
            "weights", [*spec.field_sizes, *[spec.hash_buckets] * spec.num_crosses], 1, 1e-3,
            seed)
        terms = weights.lookup(tf.concat([categorical, crosses], axis=1))  # [B, F + C, 1]
        wide = (tf.reduce_sum(tf.reshape(terms, [-1, num_wide]), axis=1, keepdims=True)
                + dense_layer(dense, 1, "dense", seed))
    with v1.variable_scope("deep"):
        table = spec.table("embeddings", spec.field_sizes, spec.embedding_dim,
                                      1.0 / math.sqrt(spec.embedding_dim), seed + 200)
        rows = tf.reshape(table.lookup(categorical), [-1, num_fields * spec.embedding_dim])
        deep_inputs = [dense, _l2_rows(rows, spec.l2)]  # field by field, as a concat would
        x = tf.concat(deep_inputs, axis=1)
        for i, units in enumerate(hidden_units):
            x = dense_layer(x, units, f"hidden{i}", seed + 300 + i, tf.nn.relu)
        deep = dense_layer(x, 1, "logit", seed + 400)
    return tf.reshape(wide + deep, [-1])


def loss_and_accuracy(logit, labels):
    """Mean sigmoid cross-entropy and accuracy (logit > 0), float32 scalars; labels int64 `[B]`."""
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
        labels=tf.cast(labels, tf.float32), logits=logit))
    correct = tf.equal(tf.cast(logit > 0, tf.int64), labels)
    return loss, tf.reduce_mean(tf.cast(correct, tf.float32))
