"""tensorflow_estimator 2.15's canned estimators and heads on lowlevel's runtime.

Estimators (the v2 API's, with 2.15's constructor arguments and defaults):
DNNClassifier, DNNRegressor (`dnn`), LinearClassifier, LinearRegressor
(`linear`), DNNLinearCombinedClassifier, DNNLinearCombinedRegressor
(`dnn_linear_combined`), BaselineClassifier, BaselineRegressor (`baseline`).
Heads (`heads`): BinaryClassHead, MultiClassHead, MultiLabelHead,
RegressionHead, PoissonRegressionHead, LogisticRegressionHead, and `Head`, the
base a user's head subclasses; `MultiHead` (`multi_head`) merges named heads.
Each estimator is an `Estimator` with a model_fn of its family: it trains,
evaluates, predicts and exports as every Estimator here does, locally and on a
cluster. Checkpoint names, metric and prediction keys and export signatures
are 2.15's (tests/fixtures/canned215/).
"""

from lowlevel.estimator.canned.baseline import (
    BaselineClassifier,
    BaselineEstimator,
    BaselineRegressor,
)
from lowlevel.estimator.canned.dnn import DNNClassifier, DNNEstimator, DNNRegressor
from lowlevel.estimator.canned.dnn_linear_combined import (
    DNNLinearCombinedClassifier,
    DNNLinearCombinedEstimator,
    DNNLinearCombinedRegressor,
)
from lowlevel.estimator.canned.heads import (
    BinaryClassHead,
    Head,
    LogisticRegressionHead,
    MultiClassHead,
    MultiLabelHead,
    PoissonRegressionHead,
    RegressionHead,
)
from lowlevel.estimator.canned.linear import LinearClassifier, LinearEstimator, LinearRegressor
from lowlevel.estimator.canned.multi_head import MultiHead
from lowlevel.estimator.canned.parsing import (
    classifier_parse_example_spec,
    regressor_parse_example_spec,
)

__all__ = [
    "BaselineClassifier", "BaselineRegressor", "DNNClassifier", "DNNRegressor",
    "DNNLinearCombinedClassifier", "DNNLinearCombinedRegressor", "LinearClassifier",
    "LinearRegressor", "BaselineEstimator", "DNNEstimator", "DNNLinearCombinedEstimator",
    "LinearEstimator", "BinaryClassHead", "Head", "LogisticRegressionHead", "MultiClassHead",
    "MultiLabelHead", "PoissonRegressionHead", "RegressionHead", "MultiHead",
    "classifier_parse_example_spec", "regressor_parse_example_spec",
]
