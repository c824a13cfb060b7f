"""`tf.estimator.experimental`: tensorflow_estimator 2.15's experimental names.

Early stopping (`lowlevel.estimator.early_stopping`): make_early_stopping_hook,
stop_if_higher_hook, stop_if_lower_hook, stop_if_no_increase_hook,
stop_if_no_decrease_hook, make_stop_at_checkpoint_step_hook. On lowlevel's
runtime (a TF_CONFIG cluster) the chief's early stop ends every task.
InMemoryEvaluatorHook (`lowlevel.estimator.in_memory_evaluator`): evaluation in
the training process every N iterations, single machine only.
RNNClassifier, RNNEstimator (`lowlevel.estimator.canned.rnn`): 2.15's RNN estimators.
LinearSDCA (`lowlevel.estimator.canned.sdca`): 2.15's SDCA optimizer for LinearClassifier
(binary) and LinearRegressor.
call_logit_fn, dnn_logit_fn_builder, linear_logit_fn_builder (`lowlevel.estimator.logit_fn`):
tf.compat.v1.estimator.experimental's builders of the canned models' logits.
"""

from __future__ import annotations

from lowlevel.estimator.canned.rnn import RNNClassifier, RNNEstimator
from lowlevel.estimator.canned.sdca import LinearSDCA
from lowlevel.estimator.early_stopping import (
                                               make_early_stopping_hook,
                                               make_stop_at_checkpoint_step_hook,
                                               stop_if_higher_hook,
                                               stop_if_lower_hook,
                                               stop_if_no_decrease_hook,
                                               stop_if_no_increase_hook,
)
from lowlevel.estimator.in_memory_evaluator import InMemoryEvaluatorHook
from lowlevel.estimator.logit_fn import (
                                         call_logit_fn,
                                         dnn_logit_fn_builder,
                                         linear_logit_fn_builder,
)
from lowlevel.estimator.receivers import build_raw_supervised_input_receiver_fn

__all__ = ["make_early_stopping_hook", "make_stop_at_checkpoint_step_hook",
           "stop_if_higher_hook", "stop_if_lower_hook", "stop_if_no_decrease_hook",
           "stop_if_no_increase_hook", "InMemoryEvaluatorHook", "RNNClassifier", "RNNEstimator",
           "LinearSDCA", "dnn_logit_fn_builder", "linear_logit_fn_builder", "call_logit_fn",
           "build_raw_supervised_input_receiver_fn"]
