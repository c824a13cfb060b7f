"""A model given as an Estimator `model_fn`: what lowlevel's runtime needs to train it.

`ModelFnModel` is the argument of `lowlevel.runtime.model_training.train`
and of the evaluation and prediction cores: it carries no graph and no
session, only what a task needs to build one (`model_fn` is called in a
fresh graph through `lowlevel.models.spec.call_model_fn`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional


@dataclasses.dataclass(frozen=True)
class ModelFnModel:
    """A model_fn and what it is called with.

    model_fn: `model_fn(features, labels, mode, params, config)` (any subset
      but features) returning a `lowlevel.models.spec.EstimatorSpec`.
    params: the dict passed as `params` (the Estimator's own copy).
    run_config: passed as `config` to model_fn and input_fn; read by the
      runtime for the attributes of a tf.estimator.RunConfig it uses
      (save_checkpoints_steps/secs, keep_checkpoint_max,
      keep_checkpoint_every_n_hours, save_summary_steps, log_step_count_steps,
      tf_random_seed, session_config, master, is_chief, task_type, task_id,
      cluster_spec); otherwise opaque.
    model_dir: where checkpoints, `graph.pbtxt` and summaries go (a path).
    warm_start: a WarmStartSettings-like tuple (ckpt_to_initialize_from,
      vars_to_warm_start, var_name_to_vocab_info, var_name_to_prev_var_name)
      applied when model_dir has no checkpoint yet, or None.
    input_fn: the training input_fn (called with the arguments it names:
      mode, params, config, input_context).
    hooks: more `SessionRunHook`s for every training task (a TrainSpec's hooks).
    """

    model_fn: Callable
    params: dict
    run_config: Any
    model_dir: str
    warm_start: Optional[tuple] = None
    input_fn: Optional[Callable] = None
    hooks: tuple = ()
