"""LinearSDCA: tensorflow_estimator 2.15's `tf.estimator.experimental.LinearSDCA` on TF 2.21.

Stochastic dual coordinate ascent (Shalev-Shwartz & Zhang, JMLR 14, 2013; the L1
proximal step, arXiv:1309.2375; the distributed variant, arXiv:1502.03508) for
`LinearClassifier` (binary, logistic loss) and `LinearRegressor` (one label,
squared loss), as 2.15's `linear.py` `_sdca_model_fn` and
`linear_optimizer/python/utils/sdca_ops.py`: TensorFlow 2.21's own kernels
(`SdcaOptimizerV2`, `SdcaFprint`, `MutableDenseHashTableV2`) do the work.

Checkpoint names are 2.15's (tests/fixtures/canned215/rnn_sdca.json): the model
`linear/linear_model/<column>/weights`, `.../bias_weights`, each with an
`..._unshrunk` copy (the solver's weights before the L1 shrink), and the
per-example dual state `ShardedMutableHashTable-<i>-of-<n>-{keys,values}`
(int64 `[buckets, 2]` fingerprints, float32 `[buckets, 4]`). A training step
runs the solver on the batch (`train_op`, +1 global step); the chief's hook then
copies (and shrinks) the unshrunk weights into the model's. `LinearSDCA.get_train_step`
(2.15's signature) builds that step; `sdca_model_fn` calls it with a `LinearModelState`.
"""

from __future__ import annotations

import tensorflow as tf
from tensorflow.python.feature_column import feature_column_v2 as fc_v2

from lowlevel.estimator.canned import column_state
from lowlevel.estimator.canned import heads as heads_lib
from lowlevel.outputs import checkpoints
from lowlevel.models.spec import ModeKeys

v1 = tf.compat.v1
_raw = tf.raw_ops
_STATE = 4  # the dual state per example: dual, primal loss, dual loss, example weight


class LinearSDCA:
    """tf.estimator.experimental.LinearSDCA (2.15): give it as `optimizer=` of
    LinearClassifier (binary) or LinearRegressor (label_dimension 1).

    Args:
      example_id_column: str, the feature holding each example's id (string
        `[batch]`; the same id must mean the same example in every epoch).
      num_loss_partitions: int >= 1, the number of workers training at once.
      num_table_shards: int or None (1), shards of the dual-state table.
      symmetric_l1_regularization: float >= 0.
      symmetric_l2_regularization: float > 0 (typically > 1).
      adaptive: bool, adaptive sampling.

    The checks are 2.15's, when the model is built: ValueError for L2 <= 0,
    L1 < 0, an unsupported column or head.
    """

    def __init__(self, example_id_column, num_loss_partitions=1, num_table_shards=None,
                 symmetric_l1_regularization=0.0, symmetric_l2_regularization=1.0,
                 adaptive=False):
        self._example_id_column = example_id_column
        self._num_loss_partitions = num_loss_partitions
        self._num_table_shards = num_table_shards
        self._symmetric_l1_regularization = symmetric_l1_regularization
        self._symmetric_l2_regularization = symmetric_l2_regularization
        self._adaptive = adaptive

    def check(self):
        """2.15's `_SDCAModel` checks: ValueError for L2 <= 0 or L1 < 0."""
        if self._symmetric_l2_regularization <= 0.0:
            raise ValueError("symmetric_l2_regularization should be positive.")
        if self._symmetric_l2_regularization <= 1.0:
            v1.logging.warn("symmetric_l2_regularization for SDCA should typically be larger "
                            "than for online optimization methods. Recommended value is of the "
                            "order of the average L2 norm of the training examples.")
        if self._symmetric_l1_regularization < 0.0:
            raise ValueError("symmetric_l1_regularization should be non-negative.")

    def get_train_step(self, state_manager, weight_column_name, loss_type, feature_columns,
                       features, targets, bias_var, global_step):
        """(sdca_model, train_op) of one SDCA step on a batch, as 2.15's
        `LinearSDCA.get_train_step` (canned/linear.py).

        state_manager: gives the columns' lookup tables and, by `get_variable(column,
        "weights")`, each column's model weights (float32 `[dimension, 1]`);
        `LinearModelState()` finds them by 2.15's names
        `linear/linear_model/<column>/weights`. weight_column_name: a feature key (or
        a numeric column: its key) of example weights `[B]`/`[B, 1]`, or None (1 each).
        loss_type: 'logistic_loss' (labels 0/1) or 'squared_loss'. feature_columns:
        v2 categorical or rank-1 dense columns. features: dict of Tensors holding
        them and the example-id column (string `[B]`). targets: labels `[B]`/`[B, 1]`.
        bias_var: the bias variable (float32 `[1]`). global_step: incremented by one
        per run of train_op. Returns the `SDCAModel` (its `update_weights(train_op)`
        copies and L1-shrinks the solver's weights into the model's) and the op.
        ValueError (2.15's messages) for an unsupported column, a dense column of rank
        > 1, L2 <= 0 or L1 < 0.
        """
        columns = _columns(features, feature_columns, state_manager)
        if weight_column_name is not None:
            key = getattr(weight_column_name, "key", weight_column_name)
            weights = tf.reshape(tf.cast(features[key], tf.float32), [-1])
        else:
            weights = tf.ones([tf.shape(targets)[0]])
        examples = {"ids": features[self._example_id_column], "weights": weights,
                    "labels": tf.reshape(tf.cast(targets, tf.float32), [-1])}
        model = SDCAModel(self, loss_type, columns, bias_var, examples)
        return model, model.minimize(global_step)


class LinearModelState(column_state.ColumnResources):
    """A feature-column state manager for `LinearSDCA.get_train_step`: keeps the
    columns' lookup tables, and `get_variable(column, "weights")` returns the global
    variable `linear/linear_model/<column name>/weights` (2.15's linear model's;
    ValueError when there is none). It creates no variables."""

    def get_variable(self, feature_column, name):
        """The model's `name` ("weights") variable of `feature_column`."""
        return _model_variable(feature_column, name)


def _unique_sparse(id_weight_pair):
    """2.15's `_prune_and_unique_sparse_ids`: (example indices, feature ids, values), int64,
    int64, float32 `[n]`, without negative (out-of-vocabulary) ids, duplicates summed."""
    ids = id_weight_pair.id_tensor
    if id_weight_pair.weight_tensor is not None:
        weights = id_weight_pair.weight_tensor.values
    else:
        weights = tf.ones([tf.shape(ids.indices)[0]], tf.float32)
    examples = tf.reshape(ids.indices[:, 0], [-1])
    flat = tf.cast(tf.reshape(ids.values, [-1]), tf.int64)
    valid = flat >= 0
    flat, examples = tf.boolean_mask(flat, valid), tf.boolean_mask(examples, valid)
    weights = tf.boolean_mask(weights, valid)
    width = tf.reduce_max(flat) + 1
    unique, idx = tf.unique(width * examples + flat)
    count = tf.shape(unique)[0]
    first = tf.math.unsorted_segment_min(examples, idx, count)
    return first, unique - width * first, tf.reshape(
        tf.math.unsorted_segment_sum(weights, idx, count), [-1])


def _model_variable(column, kind="weights"):
    name = f"linear/linear_model/{column.name}/{kind}"
    found = [v for v in v1.global_variables() if v.op.name == name]
    if not found:
        raise ValueError(f"LinearSDCA: no variable {name}")
    return found[0]


def _columns(features, feature_columns, tables):
    """(sparse triples + their weights, dense tensors + their weights), columns by name;
    `tables` the state manager (lookup tables, `get_variable(column, "weights")`)."""
    cache = fc_v2.FeatureTransformationCache(features)
    sparse, sparse_w, dense, dense_w = [], [], [], []
    for column in sorted(feature_columns, key=lambda c: c.name):
        if isinstance(column, fc_v2.CategoricalColumn):
            sparse.append(_unique_sparse(column.get_sparse_tensors(cache, tables)))
            sparse_w.append(tables.get_variable(column, "weights"))
        elif isinstance(column, fc_v2.DenseColumn):
            if column.variable_shape.ndims != 1:
                raise ValueError(f"Column {type(column).__name__} has rank "
                                 f"{column.variable_shape.ndims}, larger than 1.")
            dense.append(column.get_dense_tensor(cache, tables))
            dense_w.append(tables.get_variable(column, "weights"))
        else:
            raise ValueError(f"LinearSDCA does not support column type "
                             f"{type(column).__name__}.")
    return sparse, sparse_w, dense, dense_w


class _StateTable:
    """2.15's `_ShardedMutableDenseHashTable`: example fingerprint (int64 `[2]`) -> dual
    state (float32 `[4]`), `num_shards` dense hash tables by fingerprint modulo."""

    def __init__(self, num_shards):
        made = len(v1.get_collection(v1.GraphKeys.SAVEABLE_OBJECTS))
        self.shards = [tf.lookup.experimental.DenseHashTable(
            tf.int64, tf.float32, default_value=[0.0] * _STATE, empty_key=[0, 0],
            deleted_key=[1, 1], name=f"ShardedMutableHashTable-{i + 1}-of-{num_shards}")
            for i in range(num_shards)]
        # each table's saveable (added by its constructor in graph mode): the runtime's
        # saver writes them too, so a cluster's checkpoints keep the dual state, as 2.15's
        for saveable in v1.get_collection(v1.GraphKeys.SAVEABLE_OBJECTS)[made:]:
            v1.add_to_collection(checkpoints.EXTRA_SAVEABLES, saveable)

    def _split(self, keys):
        return tf.cast(tf.math.floormod(tf.abs(keys[:, 0]), len(self.shards)), tf.int32)

    def lookup(self, keys):
        if len(self.shards) == 1:
            return self.shards[0].lookup(keys)
        where, n = self._split(keys), len(self.shards)
        parts = tf.dynamic_partition(keys, where, n)
        values = [s.lookup(p) for s, p in zip(self.shards, parts)]
        return tf.dynamic_stitch(tf.dynamic_partition(tf.range(tf.shape(keys)[0]), where, n),
                                 values)

    def insert(self, keys, values):
        if len(self.shards) == 1:
            return self.shards[0].insert(keys, values)
        where, n = self._split(keys), len(self.shards)
        return tf.group(*[s.insert(k, v) for s, k, v in zip(
            self.shards, tf.dynamic_partition(keys, where, n),
            tf.dynamic_partition(values, where, n))])

    def size(self):
        return tf.add_n([s.size() for s in self.shards])

    def values(self):
        return [s.export()[1] for s in self.shards]


def _unshrunk(var):
    with v1.colocate_with(var):
        return v1.Variable(tf.zeros(var.shape, tf.float32), name=var.op.name + "_unshrunk",
                           use_resource=True, trainable=False)


class SDCAModel:
    """2.15's `_SDCAModel` for one batch: `minimize()` (the train op) and
    `update_weights(train_op)` (the copy + L1 shrink its chief hook runs)."""

    def __init__(self, options: LinearSDCA, loss_type, columns, bias, examples):
        options.check()
        self.options, self.loss_type = options, loss_type
        self.sparse, sparse_w, self.dense, dense_w = columns
        self.dense = self.dense + [tf.ones([tf.shape(examples["labels"])[0], 1])]
        self.weights = {"sparse": sparse_w, "dense": dense_w + [bias]}
        self.slots = {k: [_unshrunk(v) for v in vs] for k, vs in self.weights.items()}
        self.examples = examples
        self.table = _StateTable(options._num_table_shards or 1)
        v1.summary.scalar("approximate_duality_gap", self.approximate_duality_gap())
        v1.summary.scalar("examples_seen", self.table.size())

    def _all_weights(self):
        return self.weights["sparse"] + self.weights["dense"]

    def approximate_duality_gap(self):
        """float64 scalar: (primal + dual loss + L1 + L2 terms) / example weight, over every
        example seen (2.15's)."""
        with tf.name_scope("sdca/approximate_duality_gap"):
            sums = tf.add_n([tf.reduce_sum(tf.cast(v, tf.float64), 0)
                             for v in self.table.values()])
            l1 = tf.add_n([tf.reduce_sum(tf.abs(tf.cast(w, tf.float64)))
                           for w in self._all_weights()])
            l2 = tf.add_n([tf.reduce_sum(tf.square(tf.cast(w, tf.float64)))
                           for w in self._all_weights()])
            opts = self.options
            return (sums[1] + sums[2] + opts._symmetric_l1_regularization * l1
                    + opts._symmetric_l2_regularization * l2) / sums[3]

    def minimize(self, global_step):
        """The train op: one SDCA pass over the batch, then global_step += 1."""
        with tf.name_scope("sdca/minimize"):
            ids = _raw.SdcaFprint(input=self.examples["ids"])
            state = self.table.lookup(ids)
            unique = [tf.cast(tf.unique(tf.cast(f, tf.int32))[0], tf.int64)
                      for _, f, _ in self.sparse]
            gathered = [tf.gather(w, i) for w, i in zip(self.slots["sparse"], unique)]
            opts = self.options
            esu, sfw, dfw = _raw.SdcaOptimizerV2(
                sparse_example_indices=[e for e, _, _ in self.sparse],
                sparse_feature_indices=[f for _, f, _ in self.sparse],
                sparse_feature_values=[v for _, _, v in self.sparse],
                dense_features=self.dense, example_weights=self.examples["weights"],
                example_labels=self.examples["labels"], sparse_indices=unique,
                sparse_weights=gathered,
                dense_weights=[w.read_value() for w in self.slots["dense"]],
                example_state_data=state, loss_type=self.loss_type,
                l1=float(opts._symmetric_l1_regularization),
                l2=float(opts._symmetric_l2_regularization),
                num_loss_partitions=int(opts._num_loss_partitions), num_inner_iterations=1,
                adaptive=bool(opts._adaptive))
            with tf.control_dependencies([esu]):
                updates = [self.table.insert(ids, esu)]
                updates += [v1.scatter_add(w, i, u)
                            for w, i, u in zip(self.slots["sparse"], unique, sfw)]
                updates += [w.assign_add(u) for w, u in zip(self.slots["dense"], dfw)]
            with tf.control_dependencies(updates):
                return v1.assign_add(global_step, 1).op

    def update_weights(self, train_op):
        """After `train_op`: the model's weights <- the unshrunk ones, shrunk by L1 / L2."""
        pairs = [(w, s) for k in ("sparse", "dense")
                 for w, s in zip(self.weights[k], self.slots[k])]
        with tf.control_dependencies([train_op]):
            updates = [w.assign(s) for w, s in pairs]
        opts = self.options
        if opts._symmetric_l1_regularization <= 0:
            return tf.group(*updates)
        shrink = opts._symmetric_l1_regularization / opts._symmetric_l2_regularization
        with tf.control_dependencies(updates):
            return tf.group(*[w.assign(tf.sign(w) * tf.maximum(0.0, tf.abs(w) - shrink))
                              for w, _ in pairs])


class SDCAUpdateWeightsHook(v1.train.SessionRunHook):
    """2.15's `_SDCAUpdateWeightsHook`: runs `update_weights` with every training step."""

    def __init__(self, model: SDCAModel, train_op):
        self._model, self._train_op, self._update = model, train_op, None

    def begin(self):
        self._update = self._model.update_weights(self._train_op)

    def before_run(self, run_context):
        return v1.train.SessionRunArgs(self._update)


def loss_type(head):
    """'logistic_loss' for a BinaryClassHead, 'squared_loss' for a one-dimensional
    RegressionHead; ValueError otherwise (2.15's message)."""
    if isinstance(head, heads_lib.BinaryClassHead):
        return "logistic_loss"
    if isinstance(head, heads_lib.RegressionHead) and head.logits_dimension == 1:
        return "squared_loss"
    raise ValueError(f"Unsupported head type: {head}")


def sdca_model_fn(features, labels, mode, head, feature_columns, optimizer):
    """2.15's `_sdca_model_fn`: the linear model (units 1, 'sum' combiner, no partitioner)
    trained by `optimizer` (a LinearSDCA) through `head`."""
    kind = loss_type(head)
    with v1.variable_scope("linear", values=tuple(features.values()), use_resource=True):
        logits = v1.feature_column.linear_model(features, list(feature_columns), units=1,
                                                sparse_combiner="sum")
    bias = [v for v in v1.global_variables()
            if v.op.name == "linear/linear_model/bias_weights"][0]
    v1.summary.scalar("bias", bias[0])
    if mode != ModeKeys.TRAIN:
        return head.create_estimator_spec(features=features, mode=mode, labels=labels,
                                          logits=logits)
    model, train_op = optimizer.get_train_step(
        LinearModelState(), head.weight_column, kind, feature_columns, features, labels, bias,
        v1.train.get_global_step())
    spec = head.create_estimator_spec(features=features, mode=mode, labels=labels,
                                      train_op_fn=lambda _: train_op, logits=logits)
    return spec._replace(training_chief_hooks=tuple(spec.training_chief_hooks)
                         + (SDCAUpdateWeightsHook(model, train_op),))


def check_estimator(optimizer, feature_columns, sparse_combiner, n_classes=2,
                    label_dimension=1):
    """2.15's constructor checks with a LinearSDCA optimizer: ValueError for a combiner
    other than 'sum', v1 feature columns, more than 2 classes or label dimensions > 1."""
    if not isinstance(optimizer, LinearSDCA):
        return
    if sparse_combiner != "sum":
        raise ValueError('sparse_combiner must be "sum" when optimizer is a LinearSDCA '
                         'object.')
    if not fc_v2.is_feature_column_v2(feature_columns):
        raise ValueError("V2 feature columns required when optimizer is a LinearSDCA object.")
    if n_classes > 2:
        raise ValueError("LinearSDCA cannot be used in a multi-class setting.")
    if label_dimension > 1:
        raise ValueError("LinearSDCA can only be used with one-dimensional label.")
