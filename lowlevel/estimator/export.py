"""`tf.estimator.export`: serving outputs and serving input receivers (2.15's names).

PredictOutput, ClassificationOutput, RegressionOutput, ExportOutput, EvalOutput
(`lowlevel.models.export_outputs`); ServingInputReceiver,
TensorServingInputReceiver, SupervisedInputReceiver,
build_raw_serving_input_receiver_fn, build_parsing_serving_input_receiver_fn
(`lowlevel.outputs.serving`).
"""

from __future__ import annotations

from lowlevel.models.export_outputs import (
                                            ClassificationOutput,
                                            EvalOutput,
                                            ExportOutput,
                                            PredictOutput,
                                            RegressionOutput,
)
from lowlevel.outputs.serving import (
                                            ServingInputReceiver,
                                            SupervisedInputReceiver,
                                            TensorServingInputReceiver,
                                            build_parsing_serving_input_receiver_fn,
                                            build_raw_serving_input_receiver_fn,
)

__all__ = ["ClassificationOutput", "EvalOutput", "ExportOutput", "PredictOutput",
           "RegressionOutput",
           "ServingInputReceiver", "SupervisedInputReceiver", "TensorServingInputReceiver",
           "build_parsing_serving_input_receiver_fn", "build_raw_serving_input_receiver_fn"]
