"""Predicting with a `ModelFnModel` from a checkpoint: tensorflow_estimator 2.15's `Estimator.predict` core.

`predict(model, input_fn, predict_keys, hooks, checkpoint_path,
yield_single_examples)` is a generator: it builds the PREDICT graph in a
fresh `tf.Graph()` (seed, global_step, input_fn's features — labels, if the
input_fn returns any, are ignored as 2.15 does — and model_fn in PREDICT
mode), restores `checkpoint_path` (default the latest in model_dir; none:
initialises, as 2.15 logs), and runs the predictions until the input ends,
yielding per example ({key: np value} or a value when predictions is one
Tensor) or per batch. The graph and session live while the generator is
being consumed.
"""

from __future__ import annotations

from typing import Optional, Sequence

import tensorflow as tf

from lowlevel.models import input_fns
from lowlevel.models import spec as spec_lib
from lowlevel.models import warm_start as warm_start_lib
from lowlevel.models.model_fn_model import ModelFnModel

logging = tf.compat.v1.logging  # the 'tensorflow' logger, as tensorflow_estimator 2.15 logs

v1 = tf.compat.v1


def extract_keys(predictions, predict_keys):
    """The predictions restricted to `predict_keys` (all when empty), as 2.15.

    Raises ValueError for keys on a single-Tensor prediction ("predict_keys
    argument is not valid in case of non-dict predictions.") and when no key
    matches ("Expected to run at least one output from ..., provided ...").
    """
    if not predict_keys:
        return predictions
    if not isinstance(predictions, dict):
        raise ValueError("predict_keys argument is not valid in case of non-dict predictions.")
    existing = predictions.keys()
    chosen = {k: v for k, v in predictions.items() if k in predict_keys}
    if not chosen:
        raise ValueError("Expected to run at least one output from %s, provided %s." %
                         (existing, predict_keys))
    return chosen


def batch_length(values: dict) -> int:
    """The common first dimension of a batch of predictions; ValueError if they differ."""
    length = None
    for key, value in values.items():
        length = length or value.shape[0]
        if value.shape[0] != length:
            raise ValueError("Batch length of predictions should be same. %s has different "
                             "batch length than others." % key)
    return length


def _split(values, is_dict, yield_single_examples):
    if not yield_single_examples:
        yield values
    elif not is_dict:
        yield from values
    else:
        for i in range(batch_length(values)):
            yield {key: value[i] for key, value in values.items()}


def predict(model: ModelFnModel, input_fn, predict_keys: Optional[Sequence[str]] = None,
            hooks: Sequence = (), checkpoint_path: Optional[str] = None,
            yield_single_examples: bool = True):
    """Yields `model`'s predictions for `input_fn`'s features (see the module docstring).

    Raises (when iterated) ValueError for bad predict_keys or unequal batch
    lengths, and the model_fn/input_fn errors of `lowlevel.models.spec`.
    """
    config = model.run_config
    if not checkpoint_path:
        checkpoint_path = tf.train.latest_checkpoint(model.model_dir)
    if not checkpoint_path:
        logging.info("Could not find trained model in model_dir: %s, running initialization "
                     "to predict.", model.model_dir)
    with tf.Graph().as_default() as graph:
        v1.random.set_random_seed(config.tf_random_seed)
        v1.train.create_global_step(graph)
        result = input_fns.call_input_fn(input_fn, spec_lib.ModeKeys.PREDICT, model.params,
                                         config)
        features, _, input_hooks = input_fns.features_and_labels(result)
        if not input_fns.has_dataset_or_queue_runner(features):
            logging.warning("Input graph does not use tf.data.Dataset or contain a QueueRunner. "
                            "That means predict yields forever. This is probably a mistake.")
        spec = spec_lib.call_model_fn(model.model_fn, features, None, spec_lib.ModeKeys.PREDICT,
                                      model.params, config)
        if not checkpoint_path and model.warm_start:
            warm_start_lib.warm_start(model.warm_start)
        predictions = extract_keys(spec.predictions, predict_keys)
        all_hooks = list(input_hooks) + list(hooks) + list(spec.prediction_hooks)
        creator = v1.train.ChiefSessionCreator(
            checkpoint_filename_with_path=checkpoint_path, master=config.master,
            scaffold=spec.scaffold, config=config.session_config)
        with v1.train.MonitoredSession(session_creator=creator, hooks=all_hooks) as session:
            while not session.should_stop():
                values = session.run(predictions)
                yield from _split(values, isinstance(predictions, dict), yield_single_examples)
