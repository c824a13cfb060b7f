"""lowlevel.estimator: tensorflow_estimator 2.15's tf.estimator API on TensorFlow 2.21.

tf.estimator was removed in TensorFlow 2.16; this package gives its
observable behaviour (checked side by side with 2.15 in
tests/test_estimator_*.py against tests/fixtures/estimator215/):

    Estimator, EstimatorSpec, ModeKeys, RunConfig, TrainSpec, EvalSpec,
    train_and_evaluate, WarmStartSettings, VocabInfo, Exporter,
    LatestExporter, BestExporter, FinalExporter,
    export (PredictOutput, ClassificationOutput, RegressionOutput,
            ServingInputReceiver, TensorServingInputReceiver, ...),
    inputs (numpy_input_fn),
    experimental (the early-stopping hooks, `lowlevel.estimator.early_stopping`),
    and the session-run hooks tf.estimator re-exported from
    tf.compat.v1.train (CheckpointSaverHook, StopAtStepHook, ...),
    the canned estimators and heads (`lowlevel.estimator.canned`: DNN, Linear,
    DNNLinearCombined and Baseline classifiers, regressors and head-based
    estimators; Binary-,
    MultiClass-, MultiLabel-, Regression-, PoissonRegression- and
    LogisticRegressionHead, and Head to subclass), add_metrics.

Run an unmodified TF <= 2.15 script with `python -m lowlevel.estimator
SCRIPT.py ARGS` (aliases tf.estimator and tensorflow_estimator). Not
provided: TPUEstimator, distribution strategies, keras model_to_estimator. The
distributed `train_and_evaluate` (a cluster in TF_CONFIG) runs every task
through lowlevel's runtime (`lowlevel.estimator.distributed`).

Importing this package before TensorFlow, with the legacy-keras extra
(tf-keras) installed, sets TF_USE_LEGACY_KERAS=1 unless it is set: tf.keras
and tf.compat.v1.layers are then Keras 2, as TF1-style model_fns expect
(`lowlevel.estimator.alias.prepare_environment`).
"""

from __future__ import annotations

from lowlevel.estimator import alias as _alias

_alias.prepare_environment()

import tensorflow as tf  # noqa: E402  (after the Keras environment is set)

from lowlevel.estimator import (
    experimental,  # noqa: F401,E402
    export,  # noqa: F401,E402
    inputs,  # noqa: F401,E402
)
from lowlevel.estimator import canned as _canned  # noqa: E402
from lowlevel.estimator.canned import *  # noqa: F403,E402 (its __all__: estimators, heads, ...)
from lowlevel.estimator.estimator import Estimator
from lowlevel.estimator.extenders import add_metrics
from lowlevel.estimator.exporters import BestExporter, Exporter, FinalExporter, LatestExporter
from lowlevel.estimator.training import EvalSpec, TrainSpec, train_and_evaluate
from lowlevel.estimator.warm_start import VocabInfo, WarmStartSettings
from lowlevel.models.run_config import RunConfig
from lowlevel.models.spec import EstimatorSpec, ModeKeys

_train = tf.compat.v1.train
CheckpointSaverHook = _train.CheckpointSaverHook
CheckpointSaverListener = _train.CheckpointSaverListener
FeedFnHook = _train.FeedFnHook
FinalOpsHook = _train.FinalOpsHook
GlobalStepWaiterHook = _train.GlobalStepWaiterHook
LoggingTensorHook = _train.LoggingTensorHook
NanLossDuringTrainingError = _train.NanLossDuringTrainingError
NanTensorHook = _train.NanTensorHook
ProfilerHook = _train.ProfilerHook
SecondOrStepTimer = _train.SecondOrStepTimer
SessionRunArgs = _train.SessionRunArgs
SessionRunContext = _train.SessionRunContext
SessionRunHook = _train.SessionRunHook
SessionRunValues = _train.SessionRunValues
StepCounterHook = _train.StepCounterHook
StopAtStepHook = _train.StopAtStepHook
SummarySaverHook = _train.SummarySaverHook
del _train

__all__ = [
    "Estimator", "EstimatorSpec", "ModeKeys", "RunConfig", "TrainSpec", "EvalSpec",
    "train_and_evaluate", "WarmStartSettings", "VocabInfo", "Exporter", "LatestExporter",
    "BestExporter", "FinalExporter", "experimental", "export", "inputs", "CheckpointSaverHook",
    "CheckpointSaverListener", "FeedFnHook", "FinalOpsHook", "GlobalStepWaiterHook",
    "LoggingTensorHook", "NanLossDuringTrainingError", "NanTensorHook", "ProfilerHook",
    "SecondOrStepTimer", "SessionRunArgs", "SessionRunContext", "SessionRunHook",
    "SessionRunValues", "StepCounterHook", "StopAtStepHook", "SummarySaverHook",
    "add_metrics", *_canned.__all__,
]
