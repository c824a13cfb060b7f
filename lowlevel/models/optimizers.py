"""The optimizers of `--optimizer`, and Adam made safe for sparse updates on a shared ps.

TF1's `AdamOptimizer` applies a sparse gradient (`IndexedSlices`: an embedding
table's rows) densely: it decays the whole `m` and `v` slots with an `assign`
(`m * beta1`), `scatter_add`s the batch's rows into them, then re-reads the
whole slots to update the whole table. On a ps that two async workers update
at once, that read-modify-write loses updates: one worker's `assign` of
`v * beta2` can overwrite the other's `scatter_add` into `v` while its `m`
survives, and the row then moves by `lr * m / (sqrt(v) + eps)` with `v` at 0,
up to `lr * m / 1e-8`. Measured on the default MovieLens run (1 ps + 2 workers,
async, 4,000 steps): every run left rows of the tables at 9-138 (the same
model trained in one process: at most 0.70), and one CI run ended at test AUC
0.716 with log loss 1.60 instead of 0.79 and 0.56. It also reads and writes
every row of the table three times a step, whatever the batch touched.

`LazyAdamOptimizer` is TF1 contrib's `LazyAdamOptimizer` (tf.contrib.opt,
removed with contrib), with one change: a row's update is computed from the
moment rows the op itself computed, never re-read from the slots, so a lost
update can only drop information, never pair one worker's `m` with another's
`v`. Dense gradients are Adam's own kernel (`ResourceApplyAdam`).

`AdagradOptimizer` is TF1's with one change: its accumulators start from
`Filled` (zeroed memory plus the value, in place) instead of a `Const` of
their full shape. A `Const` kernel keeps its
value for as long as the graph runs; the accumulator assigned from it shares
that buffer, and its first sparse update copies it (copy-on-write), so every
ps kept a second, dead copy of each accumulator: 305 MiB per ps in the sparse
benchmark at 10 M rows (benchmarks/NOTES.md). `Filled`'s output is a fresh
buffer the variable adopts (a `Fill`'s is copied: `Filled` says what was
measured).
"""

from __future__ import annotations

import tensorflow as tf

v1 = tf.compat.v1


def make_optimizer(name: str, learning_rate: float):
    """The optimizer called `name`: adagrad, sgd, momentum (0.9) or adam (`LazyAdamOptimizer`).

    Raises:
      ValueError: an unknown name (`config.OPTIMIZERS` lists the known ones).
    """
    if name == "adagrad":
        return AdagradOptimizer(learning_rate)
    if name == "sgd":
        return v1.train.GradientDescentOptimizer(learning_rate)
    if name == "momentum":
        return v1.train.MomentumOptimizer(learning_rate, momentum=0.9)
    if name == "adam":
        return LazyAdamOptimizer(learning_rate)
    raise ValueError(f"unknown optimizer {name!r}")


class Filled:
    """An initializer of a constant `value` that needs no full-size temporary.

    `Empty(init=True)` (zeroed memory) plus `value`, which the addition writes
    in place: the variable's assignment takes that buffer. Measured on a
    10 M x 16 variable (640 MB): `tf.fill`, `tf.zeros` and `broadcast_to` each
    peak at 2x (their output is copied into the variable), this at 1x. A
    `Const` of the full shape (the stock Adagrad slot's) stays alive in its
    kernel: one dead copy for as long as the graph runs. The value comes
    through a `PlaceholderWithDefault`, which Grappler cannot fold.
    """

    def __init__(self, value: float):
        self.value = value

    def __call__(self, shape, dtype=tf.float32, partition_info=None):
        zeros = tf.raw_ops.Empty(shape=tf.constant(list(shape), tf.int32), dtype=dtype,
                                 init=True)
        if not self.value:
            return zeros
        return zeros + tf.raw_ops.PlaceholderWithDefault(
            input=tf.constant(self.value, dtype), shape=[])


class AdagradOptimizer(v1.train.AdagradOptimizer):
    """TF1's Adagrad, its accumulators initialised by `Filled` (the module doc says why).

    Same slots, names and updates as `tf.compat.v1.train.AdagradOptimizer`.
    """

    def _create_slots(self, var_list):
        for v in var_list:
            if not v.get_shape().is_fully_defined():
                super()._create_slots([v])
                continue
            dtype = v.dtype.base_dtype
            self._get_or_make_slot_with_initializer(
                v, Filled(self._initial_accumulator_value), v.get_shape(), dtype,
                "accumulator", self._name)


class LazyAdamOptimizer(v1.train.AdamOptimizer):
    """Adam; a sparse gradient updates only its rows' moments and values ("lazy" Adam).

    For an `IndexedSlices` gradient `g` (`[U, ...]` rows at `indices` `[U]`,
    deduplicated by the base class), with `t` the step count of
    `beta1_power`/`beta2_power`:

        m[i] = beta1 * m[i] + (1 - beta1) * g          (rows i in indices only)
        v[i] = beta2 * v[i] + (1 - beta2) * g^2
        var[i] -= lr * sqrt(1 - beta2^t) / (1 - beta1^t) * m[i] / (sqrt(v[i]) + epsilon)

    Rows a batch does not touch keep their moments: unlike dense Adam, they do
    not keep moving on their momentum. Slots and names are Adam's (`Adam`,
    `Adam_1`, `beta1_power`, `beta2_power`): checkpoints of either load into
    the other. Work per step follows the rows touched, not the table's size.
    """

    def _apply_rows(self, grad, var, indices):
        dtype = var.dtype.base_dtype
        beta1_power, beta2_power = (tf.cast(p, dtype) for p in self._get_beta_accumulators())
        beta1, beta2, epsilon = (tf.cast(t, dtype)
                                 for t in (self._beta1_t, self._beta2_t, self._epsilon_t))
        lr = tf.cast(self._lr_t, dtype) * tf.sqrt(1 - beta2_power) / (1 - beta1_power)
        m, v = self.get_slot(var, "m"), self.get_slot(var, "v")
        m_rows = beta1 * tf.gather(m, indices) + (1 - beta1) * grad
        v_rows = beta2 * tf.gather(v, indices) + (1 - beta2) * tf.square(grad)
        step = lr * m_rows / (tf.sqrt(v_rows) + epsilon)
        return tf.group(m.scatter_update(tf.IndexedSlices(m_rows, indices)),
                        v.scatter_update(tf.IndexedSlices(v_rows, indices)),
                        var.scatter_sub(tf.IndexedSlices(step, indices)))

    def _apply_sparse(self, grad, var):
        return self._apply_rows(grad.values, var, grad.indices)

    def _resource_apply_sparse(self, grad, var, indices):
        return self._apply_rows(grad, var, indices)
