"""Calling an Estimator `input_fn` and reading its result, as tensorflow_estimator 2.15.

`call_input_fn` passes the subset of (mode, params, config, input_context)
that the input_fn names (2.15's `Estimator._call_input_fn`, on `/cpu:0`);
`features_and_labels` reads what it returned (2.15's
`util.parse_input_fn_result`): a `tf.data.Dataset` (of (features, labels)
tuples or of features alone) is read through an initializable iterator whose
initializer a returned hook runs in `after_create_session`; a tuple or list
must have 2 items (features, labels); anything else is the features and the
labels are None.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from lowlevel.models.spec import fn_args, named_kwargs

logging = tf.compat.v1.logging  # the 'tensorflow' logger, as tensorflow_estimator 2.15 logs


class DatasetInitializerHook(tf.compat.v1.train.SessionRunHook):
    """Runs an initializable iterator's initializer once each session is created."""

    def __init__(self, iterator):
        self._iterator = iterator
        self._initializer = None

    def begin(self):
        """Reads the initializer op (the graph is still open)."""
        self._initializer = self._iterator.initializer

    def after_create_session(self, session, coord):
        """Initializes the iterator: the dataset starts from its first element."""
        del coord
        session.run(self._initializer)


def call_input_fn(input_fn, mode, params, config, input_context=None):
    """Calls `input_fn` under `/cpu:0` with the arguments it names; returns its result.

    `mode`: a ModeKeys string; `params`: a dict (the Estimator's, a copy);
    `config`: the RunConfig; `input_context`: a `tf.distribute.InputContext`,
    passed only when given and named.
    """
    names = fn_args(input_fn)
    kwargs = named_kwargs(input_fn, mode=mode, params=params, config=config)
    if input_context is not None and "input_context" in names:
        logging.info("The `input_fn` accepts an `input_context` which will be given by "
                     "DistributionStrategy")
        kwargs["input_context"] = input_context
    with tf.compat.v1.device("/cpu:0"):
        return input_fn(**kwargs)


def parse_iterator_result(result):
    """(features, labels) of one element: a 2-item tuple/list, else (result, None).

    Raises ValueError "input_fn should return (features, labels) as a len 2
    tuple." for a tuple or list of another length (2.15's message).
    """
    if isinstance(result, (list, tuple)):
        if len(result) != 2:
            raise ValueError("input_fn should return (features, labels) as a len 2 tuple.")
        return result[0], result[1]
    return result, None


def features_and_labels(result):
    """(features, labels, input_hooks) from an input_fn's result, as 2.15.

    A Dataset is read through `tf.compat.v1.data.make_initializable_iterator`
    in the default graph (so features are tensors of the next batch) and a
    `DatasetInitializerHook` is returned; otherwise `input_hooks` is [].
    """
    hooks = []
    if isinstance(result, tf.data.Dataset):
        iterator = tf.compat.v1.data.make_initializable_iterator(result)
        hooks.append(DatasetInitializerHook(iterator))
        result = iterator.get_next()
    features, labels = parse_iterator_result(result)
    return features, labels, hooks


def has_dataset_or_queue_runner(features) -> bool:
    """Whether the features come from a Dataset iterator or the graph has queue runners.

    2.15's `predict` warns otherwise ("... predict yields forever").
    """
    tensors = [t for t in tf.nest.flatten(features) if isinstance(t, tf.Tensor)]
    if any(t.op.type == "IteratorGetNext" for t in tensors):
        return True
    return bool(tf.compat.v1.get_default_graph().get_collection(
        tf.compat.v1.GraphKeys.QUEUE_RUNNERS))


def index_batches(rows, batch_size, num_epochs, shuffle):
    """Yields int64 arrays of row indices `[batch_size]` (the last may be shorter): epochs of
    `range(rows)` (each permuted when `shuffle`) concatenated, cut into batches; `num_epochs`
    None: without end. As 2.15's numpy_input_fn and pandas_input_fn batch across epochs."""
    rng = np.random.default_rng()
    pending = np.zeros([0], np.int64)
    epoch = 0
    while num_epochs is None or epoch < num_epochs:
        order = rng.permutation(rows) if shuffle else np.arange(rows)
        pending = np.concatenate([pending, order])
        epoch += 1
        while len(pending) >= batch_size:
            yield pending[:batch_size]
            pending = pending[batch_size:]
    if len(pending):
        yield pending
