"""RNNClassifier and RNNEstimator (tensorflow_estimator 2.15's rnn.py, `tf.estimator.experimental`).

The model (2.15's `RNNModel`): the sequence feature columns' dense input
(`[batch, time, depth]`, columns sorted by name, as Keras' `SequenceFeatures`),
the context columns' dense input tiled over time and appended
(`concatenate_context_input`), then one recurrent layer (one cell per entry of
`units`, stacked), masked by the sequence lengths (a padded step keeps the
previous output and state, as Keras' RNN), its last output, then a linear
`logits` layer of the head's `logits_dimension`. With `return_sequences=True` the
output of every step (`[batch, time, units]`, a padded step repeats the previous
output, as Keras' RNN) goes through the logits layer (`[batch, time,
logits_dimension]`) and the head must be a sequential head
(`canned.sequential_head.SequentialHeadWrapper`, 2.15's): RNNClassifier wraps its
head so, with the mask under `sequence_mask` (a bool `[batch, time]` of the steps
within each sequence's length, unless the features already hold one) and the
weight column flattened per step; the loss and metrics are then over the valid
steps, predict() gives every step's predictions and the mask.

The cells are Keras 2's, written in TF1 ops (no Keras needed; their math and
initialisers: `SimpleRNNCell` tanh; `LSTMCell` gates i, f, c, o, sigmoid
recurrent activation, forget-gate bias 1; `GRUCell` gates z, r, h with
`reset_after=True`, bias `[2, 3 * units]`; kernels Glorot-uniform, recurrent
kernels orthogonal). Variables are named as 2.15's checkpoints
(tests/fixtures/canned215/rnn_sdca.json): `sequence_features/<column>/embedding_weights`,
`rnn_model/<layer>/<cell>/{kernel,recurrent_kernel,bias}` (`units` a list:
layer `rnn`, one cell `<type>_cell`, several `stacked_rnn_cells/<type>_cell[_i]`;
`units` an int: layer `simple_rnn|lstm|gru`), `rnn_model/logits/{kernel,bias}`.
A string optimizer is 2.15's: at learning rate 0.05, each gradient clipped to norm 5.

`rnn_cell_fn` (a user's Keras cell, or a list of cells to stack) needs Keras 2
(tf-keras, the `legacy-keras` extra; without it LegacyKerasMissing names the
extra): its cells are built under 2.15's names and stepped by the same masked
loop (their dropout is not applied).
"""

from __future__ import annotations

import tensorflow as tf
from tensorflow.python.feature_column import feature_column_v2 as fc_v2
from tensorflow.python.feature_column import sequence_feature_column as sfc

from lowlevel.errors import LegacyKerasMissing
from lowlevel.estimator import alias
from lowlevel.estimator.canned import column_state
from lowlevel.estimator.canned import heads as heads_lib
from lowlevel.estimator.canned import optimizers
from lowlevel.estimator.canned import sequential_head as seq_head_lib
from lowlevel.estimator.estimator import Estimator
from lowlevel.models.spec import ModeKeys

v1 = tf.compat.v1
LEARNING_RATE = 0.05  # 2.15's rnn._DEFAULT_LEARNING_RATE
CLIP_NORM = 5.0  # 2.15's rnn._DEFAULT_CLIP_NORM (Keras' clipnorm: each gradient by its norm)
SIMPLE_RNN, LSTM, GRU = "simple_rnn", "lstm", "gru"
_GATES = {SIMPLE_RNN: 1, LSTM: 4, GRU: 3}
USE_DEFAULT = object()  # 2.15's marker of a cell_type not given
KERAS_HINT = ("RNNEstimator(rnn_cell_fn=...) runs Keras 2 cells: "
              "pip install -e '.[legacy-keras]' (tf-keras), or give units and cell_type")


class _StateManager(column_state.ColumnResources):
    """Makes the columns' variables with `tf.compat.v1.get_variable` under
    `<scope>/<column name>/` (Keras' feature layers' names) and keeps their lookup tables."""

    def __init__(self, scope, trainable=True):
        super().__init__()
        self._scope, self._trainable = scope, trainable

    def get_variable(self, feature_column, name):
        if not isinstance(feature_column, fc_v2.EmbeddingColumn):
            raise ValueError(f"RNN feature columns: {type(feature_column).__name__} "
                             f"({feature_column.name}) is not supported; use embedding, "
                             "indicator or numeric columns")
        shape = (feature_column.categorical_column.num_buckets, feature_column.dimension)
        with v1.variable_scope(f"{self._scope}/{feature_column.name}",
                               auxiliary_name_scope=False):
            return v1.get_variable(name, shape, tf.float32, feature_column.initializer,
                                   trainable=self._trainable and feature_column.trainable,
                                   use_resource=True)


def _by_name(columns):
    return sorted(columns, key=lambda c: c.name)


def sequence_input(features, sequence_columns, context_columns=None):
    """The RNN's input: float32 `[batch, time, depth]` and int64 `[batch]` lengths.

    As 2.15's `SequenceFeatures` (+ `DenseFeatures` for the context, tiled over
    time and appended last). Raises ValueError for no sequence columns or
    sequence lengths that differ between columns (at run time:
    InvalidArgumentError).
    """
    if not sequence_columns:
        raise ValueError("sequence_feature_columns must not be empty.")
    cache = fc_v2.FeatureTransformationCache(features)
    manager = _StateManager("sequence_features")
    dense, lengths = [], []
    for column in _by_name(sequence_columns):
        pair = column.get_sequence_dense_tensor(cache, manager)
        dense.append(pair.dense_tensor)
        lengths.append(pair.sequence_length)
    with tf.name_scope("sequence_input_layer"):
        inputs = tf.concat(dense, axis=-1)
        length = sfc._assert_all_equal_and_return(lengths)
        v1.summary.histogram("sequence_length", length)
        if context_columns:
            context_manager = _StateManager("dense_features")
            context = [tf.reshape(c.get_dense_tensor(cache, context_manager),
                                  [-1, c.variable_shape.num_elements()])
                       for c in _by_name(context_columns)]
            inputs = sfc.concatenate_context_input(tf.concat(context, axis=-1), inputs)
    return inputs, length


def _cell_variables(cell_type, input_depth, units):
    """One cell's (kernel, recurrent_kernel, bias) in the current variable scope."""
    gates = _GATES[cell_type] * units
    kernel = v1.get_variable("kernel", [input_depth, gates], tf.float32,
                             v1.glorot_uniform_initializer(), use_resource=True)
    recurrent = v1.get_variable("recurrent_kernel", [units, gates], tf.float32,
                                v1.orthogonal_initializer(), use_resource=True)
    if cell_type == LSTM:  # Keras' unit_forget_bias
        init = tf.constant_initializer([0.0] * units + [1.0] * units + [0.0] * 2 * units)
        bias = v1.get_variable("bias", [gates], tf.float32, init, use_resource=True)
    elif cell_type == GRU:  # reset_after=True: an input bias and a recurrent bias
        bias = v1.get_variable("bias", [2, gates], tf.float32, v1.zeros_initializer(),
                               use_resource=True)
    else:
        bias = v1.get_variable("bias", [gates], tf.float32, v1.zeros_initializer(),
                               use_resource=True)
    return cell_type, kernel.read_value(), recurrent.read_value(), bias.read_value()


def _step(cell, x, states):
    """One time step of a Keras 2 cell: (output `[batch, units]`, new states)."""
    cell_type, kernel, recurrent, bias = cell
    h = states[0]
    if cell_type == SIMPLE_RNN:
        out = tf.tanh(tf.matmul(x, kernel) + bias + tf.matmul(h, recurrent))
        return out, (out,)
    if cell_type == LSTM:
        z = tf.matmul(x, kernel) + tf.matmul(h, recurrent) + bias
        i, f, c_hat, o = tf.split(z, 4, axis=1)
        c = tf.sigmoid(f) * states[1] + tf.sigmoid(i) * tf.tanh(c_hat)
        out = tf.sigmoid(o) * tf.tanh(c)
        return out, (out, c)
    x_z, x_r, x_h = tf.split(tf.matmul(x, kernel) + bias[0], 3, axis=1)
    h_z, h_r, h_h = tf.split(tf.matmul(h, recurrent) + bias[1], 3, axis=1)
    z, r = tf.sigmoid(x_z + h_z), tf.sigmoid(x_r + h_r)
    out = z * h + (1.0 - z) * tf.tanh(x_h + r * h_h)
    return out, (out,)


def _zero_states(cells, batch):
    return tuple(tuple(tf.zeros(tf.stack([batch, c[2].shape[0]]))
                       for _ in range(2 if c[0] == LSTM else 1)) for c in cells)


def run_cells(cells, inputs, length, return_sequences=False):
    """Runs the stacked `cells` over `inputs` (`[batch, time, depth]`) masked by `length`.

    Returns the last cell's outputs: `[batch, units]` (the last unmasked step's;
    zeros for a length 0), or `[batch, time, units]` with `return_sequences`.
    """
    batch = tf.shape(inputs)[0]
    mask = tf.sequence_mask(length, tf.shape(inputs)[1])
    elems = (tf.transpose(inputs, [1, 0, 2]), tf.transpose(mask))
    last_units = cells[-1][2].shape[0]
    initial = (tf.zeros(tf.stack([batch, last_units])), _zero_states(cells, batch))

    def step(previous, elem):
        out_prev, states_prev = previous
        x, keep = elem
        new_states = []
        for cell, states in zip(cells, states_prev):
            x, states = _step(cell, x, states)
            new_states.append(states)
        keep = keep[:, None]
        out = tf.where(keep, x, out_prev)
        kept = tuple(tuple(tf.where(keep, n, p) for n, p in zip(ns, ps))
                     for ns, ps in zip(new_states, states_prev))
        return out, kept

    outputs, _ = tf.scan(step, elems, initializer=initial)
    return tf.transpose(outputs, [1, 0, 2]) if return_sequences else outputs[-1]


def _cell_scopes(units, cell_type):
    """(layer scope, [(cell scope, units)]) as 2.15's Keras layers name them."""
    if isinstance(units, int) and cell_type in _GATES:
        return cell_type, [(f"{cell_type}_cell", units)]
    cell_type = SIMPLE_RNN if cell_type is USE_DEFAULT else cell_type
    units = list(units)  # an int without cell_type: 2.15's TypeError
    if len(units) == 1:
        return "rnn", [(f"{cell_type}_cell", int(units[0]))]
    return "rnn", [(f"stacked_rnn_cells/{cell_type}_cell" + (f"_{i}" if i else ""), int(n))
                   for i, n in enumerate(units)]


def _builtin_layer(inputs, length, units, cell_type, return_sequences=False):
    """The `units` / `cell_type` layer's outputs `[batch, units[-1]]` (in `rnn_model`;
    `[batch, time, units[-1]]` with `return_sequences`)."""
    layer, scopes = _cell_scopes(units, cell_type)
    kind = SIMPLE_RNN if cell_type is USE_DEFAULT else cell_type
    cells, depth = [], inputs.shape[-1]
    for scope, n in scopes:
        with v1.variable_scope(f"{layer}/{scope}", auxiliary_name_scope=False):
            cells.append(_cell_variables(kind, depth, n))
        depth = n
    return run_cells(cells, inputs, length, return_sequences)


def _keras_layer(inputs, length, rnn_cell_fn, return_sequences=False):
    """`rnn_cell_fn()`'s Keras 2 cell (or list of cells, stacked) over `inputs`, masked as
    run_cells (and its outputs shaped so); its variables
    `rnn_model/rnn/[stacked_rnn_cells/]<cell name>/...` (2.15's).
    Dropout inside the cells is not applied. LegacyKerasMissing without tf-keras."""
    if not alias.legacy_keras_installed():
        raise LegacyKerasMissing(KERAS_HINT)
    import tf_keras  # noqa: PLC0415 (Keras 2, only for a user's cells)
    cell = rnn_cell_fn()
    if isinstance(cell, (list, tuple)):
        cell = tf_keras.layers.StackedRNNCells(list(cell))
        scope = "rnn_model/rnn/stacked_rnn_cells/"
    else:
        scope = f"rnn_model/rnn/{cell.name}/"
    if not hasattr(cell, "call") or not hasattr(cell, "state_size"):
        raise ValueError("RNN cell should have a `call` and `state_size` method.")
    with tf.name_scope(scope):
        cell.build(tf.TensorShape([None, inputs.shape[-1]]))
    batch = tf.shape(inputs)[0]
    sizes = [int(n) for n in tf.nest.flatten(cell.state_size)]
    initial = (tf.zeros(tf.stack([batch, int(cell.output_size)])),
               [tf.zeros(tf.stack([batch, n])) for n in sizes])
    mask = tf.transpose(tf.sequence_mask(length, tf.shape(inputs)[1]))

    def step(previous, elem):
        x, keep = elem[0], elem[1][:, None]
        out, states = cell.call(x, list(previous[1]))
        states = tf.nest.flatten(states)
        return (tf.where(keep, out, previous[0]),
                [tf.where(keep, n, p) for n, p in zip(states, previous[1])])
    outputs, _ = tf.scan(step, (tf.transpose(inputs, [1, 0, 2]), mask), initializer=initial)
    return tf.transpose(outputs, [1, 0, 2]) if return_sequences else outputs[-1]


def rnn_logits(features, sequence_columns, context_columns, units, cell_type, logits_units,
               rnn_cell_fn=None, return_sequences=False):
    """2.15's `RNNModel` call: the logits, float32 `[batch, logits_units]`.

    With `return_sequences`: `(logits [batch, time, logits_units], mask)`, the mask a
    bool `[batch, time]` of the steps within each sequence's length (2.15's
    `tf.sequence_mask(sequence_length)`, here padded to the inputs' time dimension).
    ValueError if `features` is not a dict.
    """
    if not isinstance(features, dict):
        raise ValueError(f"inputs should be a dictionary of `Tensor`s. Given type: "
                         f"{type(features)}")
    inputs, length = sequence_input(features, sequence_columns, context_columns)
    if rnn_cell_fn is not None:
        outputs = _keras_layer(inputs, length, rnn_cell_fn, return_sequences)
    with v1.variable_scope("rnn_model", use_resource=True):
        if rnn_cell_fn is None:
            outputs = _builtin_layer(inputs, length, units, cell_type, return_sequences)
        with v1.variable_scope("logits"):
            kernel = v1.get_variable("kernel", [outputs.shape[-1], logits_units], tf.float32,
                                     v1.glorot_uniform_initializer())
            bias = v1.get_variable("bias", [logits_units], tf.float32,
                                   v1.zeros_initializer())
    if not return_sequences:
        return tf.matmul(outputs, kernel) + bias
    logits = tf.tensordot(outputs, kernel, [[2], [0]]) + bias  # Keras' Dense on 3-D
    logits.set_shape(outputs.shape[:2].concatenate([logits_units]))
    return logits, tf.sequence_mask(length, tf.shape(inputs)[1])


class _ClipNorm:
    """Keras' `clipnorm`: each gradient clipped to its own norm before it is applied
    (after aggregation across replicas, as Keras' `_transform_gradients`)."""

    clip_norm = CLIP_NORM

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        clipped = [(None if g is None else tf.clip_by_norm(g, self.clip_norm), v)
                   for g, v in grads_and_vars]
        return super().apply_gradients(clipped, global_step=global_step, name=name)


_CLIPPED = {}


def rnn_optimizer(optimizer):
    """2.15's: a name -> that optimizer at 0.05 with gradients clipped to norm 5; else as
    `optimizers.get_optimizer_instance` (no clipping). ValueError for an unknown name or
    object (its messages)."""
    if not isinstance(optimizer, str):
        return optimizers.get_optimizer_instance(optimizer)
    opt = optimizers.get_optimizer_instance(optimizer, LEARNING_RATE)
    base = type(opt)
    if base not in _CLIPPED:
        _CLIPPED[base] = type(f"ClipNorm{base.__name__}", (_ClipNorm, base), {})
    opt.__class__ = _CLIPPED[base]
    return opt


def _check_cell_args(head, rnn_cell_fn, units, cell_type, return_sequences):
    """2.15's argument checks, and lowlevel's limits (one line each)."""
    if return_sequences and not isinstance(head, seq_head_lib.SequentialHead):
        raise ValueError("Provided head must be a `_SequentialHead` object when "
                         "`return_sequences` is set to True.")
    if rnn_cell_fn and (units or cell_type is not USE_DEFAULT):
        raise ValueError("units and cell_type must not be specified when using rnn_cell_fn")
    if rnn_cell_fn and not alias.legacy_keras_installed():
        raise LegacyKerasMissing(KERAS_HINT)
    if cell_type is not USE_DEFAULT and cell_type not in _GATES:
        raise ValueError("`cell_type` should be a class producing a RNN cell, or a string "
                         f"specifying the cell type. Supported strings are: "
                         f"{[SIMPLE_RNN, LSTM, GRU]}.")
    if units is None and not rnn_cell_fn:
        raise ValueError("units must be given (an int or a list of ints) with cell_type")


class RNNEstimator(Estimator):
    """tf.estimator.experimental.RNNEstimator (2.15): an RNN through any head.

    Args as 2.15's: `sequence_feature_columns` (sequence columns, or embedding
    / indicator columns of `sequence_categorical_column_*`), optional
    `context_feature_columns` (dense columns, repeated at every step), `units`
    (int or list of ints) and `cell_type` ('simple_rnn', 'lstm', 'gru'; default
    'simple_rnn' with a list), or `rnn_cell_fn` (returns a Keras 2 cell or a list of
    them), `optimizer` (default 'Adagrad' at 0.05, clipnorm 5).
    Raises ValueError (at construction) for `rnn_cell_fn` together with units or
    cell_type, an unknown `cell_type`, `return_sequences=True` with a head that is not a
    sequential head (`canned.sequential_head.SequentialHeadWrapper`); with one, the
    logits are `[batch, time, logits_dimension]` and the features get the sequence mask
    under its `input_sequence_mask_key` unless they hold it;
    `lowlevel.errors.LegacyKerasMissing` for `rnn_cell_fn` without tf-keras.
    """

    def __init__(self, head, sequence_feature_columns, context_feature_columns=None,
                 units=None, cell_type=USE_DEFAULT, rnn_cell_fn=None, return_sequences=False,
                 model_dir=None, optimizer="Adagrad", config=None):
        _check_cell_args(head, rnn_cell_fn, units, cell_type, return_sequences)
        sequence_columns = tuple(sequence_feature_columns or ())
        context_columns = tuple(context_feature_columns or ())

        def _model_fn(features, labels, mode, config):
            logits = rnn_logits(features, sequence_columns, context_columns, units, cell_type,
                                head.logits_dimension, rnn_cell_fn, return_sequences)
            if return_sequences:
                logits, mask = logits
                if head.input_sequence_mask_key not in features:
                    features = {**features, head.input_sequence_mask_key: mask}
            opt = rnn_optimizer(optimizer) if mode == ModeKeys.TRAIN else None
            return head.create_estimator_spec(features=features, mode=mode, labels=labels,
                                              optimizer=opt, logits=logits)
        super().__init__(model_fn=_model_fn, model_dir=model_dir, config=config)


class RNNClassifier(RNNEstimator):
    """tf.estimator.experimental.RNNClassifier (2.15): n_classes 2 -> BinaryClassHead,
    more -> MultiClassHead; RNNEstimator's arguments plus the heads'. With
    `return_sequences=True` the head is wrapped in a `SequentialHeadWrapper` with the
    mask key `sequence_mask` and `weight_column` (then a str: TypeError otherwise, as
    2.15) flattened per step: labels per step, int `[batch, time]` (dense or sparse)."""

    def __init__(self, sequence_feature_columns, context_feature_columns=None, units=None,
                 cell_type=USE_DEFAULT, rnn_cell_fn=None, return_sequences=False,
                 model_dir=None, n_classes=2, weight_column=None, label_vocabulary=None,
                 optimizer="Adagrad", loss_reduction=heads_lib.SUM_OVER_BATCH_SIZE,
                 sequence_mask="sequence_mask", config=None):
        head = heads_lib.binary_or_multi_class_head(n_classes, weight_column,
                                                    label_vocabulary, loss_reduction)
        if return_sequences:
            v1.logging.info("Converting head to sequential head with "
                            "`SequentialHeadWrapper` to allow sequential predictions.")
            head = seq_head_lib.SequentialHeadWrapper(head, sequence_length_mask=sequence_mask,
                                                      feature_columns=weight_column)
        super().__init__(head, sequence_feature_columns, context_feature_columns, units,
                         cell_type, rnn_cell_fn, return_sequences, model_dir, optimizer,
                         config)
