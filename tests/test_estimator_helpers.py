"""tensorflow_estimator 2.15's helper names against the real 2.15's results on the same calls.

tests/fixtures/canned215/helpers.py ran under the real 2.15 (helpers.json beside it); each
test here runs the same probe with lowlevel.estimator aliased as tf.estimator, in this
process, and compares exactly: `experimental.call_logit_fn`,
`experimental.build_raw_supervised_input_receiver_fn`, export_lib's
`build_supervised_input_receiver_fn_from_input_fn`, `UnsupervisedInputReceiver`,
`SupervisedInputReceiver`, `export.EvalOutput` / `TrainOutput`,
`tf.compat.v1.estimator.inputs.pandas_input_fn`, and a Keras metric object (Keras 3
here, Keras 2 in 2.15) in `eval_metric_ops`. Values are compared exactly: every value
probed is a small sum, mean or maximum that float32 gives exactly on both sides.
"""

import importlib.util
import json
import os

import pytest

from estimator_support import HERE, estimator_alias

CANNED = os.path.join(HERE, "fixtures", "canned215")


def _probe(name):
    """(ours, 2.15's) for the part `name` of helpers.py (ours JSON round-tripped as theirs)."""
    spec = importlib.util.spec_from_file_location("canned215_helpers",
                                                  os.path.join(CANNED, "helpers.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with open(os.path.join(CANNED, "helpers.json")) as f:
        theirs = json.load(f)[name]
    with estimator_alias():
        ours = getattr(module, name)()
    return json.loads(json.dumps(ours, default=str)), theirs


@pytest.mark.timeout(60)
def test_call_logit_fn_passes_2_15s_arguments_and_raises_its_error():
    """mode, params, config only when named (a partial's bound params not again); a dict
    of Tensors is returned; a list, float, Variable, int key or float value: ValueError."""
    ours, theirs = _probe("call_logit_fn")
    assert ours == theirs
    assert theirs["kwargs"]["all"] == ["config", "mode", "params"]
    assert len(theirs["errors"]) == 5 and all(theirs["errors"].values())


@pytest.mark.timeout(60)
def test_raw_supervised_receiver_makes_2_15s_placeholders():
    """Placeholder names, dtypes, shapes (default_batch_size), receiver keys ("input",
    "label" for single tensors), eager tensors' default names, the overlapping-keys error."""
    ours, theirs = _probe("raw_supervised")
    assert "eager" not in ours  # eager execution is off in these tests (conftest)
    theirs = {k: v for k, v in theirs.items() if k != "eager"}
    assert ours == theirs
    assert theirs["batch_8"]["features"]["a"]["shape"] == [8, 3]


@pytest.mark.timeout(60)
def test_supervised_receiver_from_input_fn_reads_the_input_fn_in_a_scratch_graph():
    """A Dataset input_fn (with kwargs) and a tuple input_fn give 2.15's placeholders; the
    caller's graph is untouched until the receiver fn is called; 2.15's errors."""
    ours, theirs = _probe("from_input_fn")
    assert ours == theirs
    assert theirs["ops_before_call"] == 0


@pytest.mark.timeout(60)
def test_unsupervised_and_supervised_receivers_check_as_2_15():
    ours, theirs = _probe("receivers")
    assert ours == theirs
    assert theirs["unsupervised"]["is_serving"] is True


@pytest.mark.timeout(60)
def test_eval_and_train_outputs_give_2_15s_keys_signatures_and_metric_values():
    """Prefixed keys, the supervised signature (methods, output dtypes and shapes), a v1
    metric and a (value, update op) tuple, values after two updates, the errors."""
    ours, theirs = _probe("outputs")
    assert ours == theirs
    assert theirs["eval"]["values"]["metrics/v1_mean/value"] == 2.75


@pytest.mark.timeout(120)
def test_pandas_input_fn_gives_2_15s_batches_dtypes_and_errors():
    """Column order, dtypes, static shapes, epochs cut across boundaries, a Series or
    DataFrame y, every row once per epoch when shuffled or with two threads, the errors.
    One difference: a string column (pandas 3's str dtype) is fed as tf.string here;
    2.15 raised TypeError for it (it took `tf.as_dtype` of the column dtype)."""
    ours, theirs = _probe("pandas")
    assert theirs["string_column"]["type"] == "TypeError"
    assert ours.pop("string_column") is None
    theirs = dict(theirs)
    theirs.pop("string_column")
    assert ours == theirs


@pytest.mark.timeout(60)
def test_pandas_input_fn_feeds_a_string_column_as_tf_string():
    import numpy as np
    import pandas as pd
    import tensorflow as tf

    import lowlevel.estimator as estimator
    frame = pd.DataFrame({"s": np.array(["u", "v", "w"], dtype=object), "n": [1, 2, 3]})
    with tf.Graph().as_default():
        features = estimator.inputs.pandas_input_fn(frame, batch_size=2, shuffle=False)()
        assert features["s"].dtype == tf.string
        with tf.compat.v1.Session() as session:
            assert session.run(features)["s"].tolist() == [b"u", b"v"]


@pytest.mark.timeout(90)
def test_keras_3_metric_in_eval_metric_ops_counts_as_2_15s_keras_2_metric():
    """EstimatorSpec turns a Keras 3 Mean into (value, update op) with its variables local
    (not global: never restored from a checkpoint), and names an untouched metric; an
    EvalOutput takes it too. (Imports Keras 3 in this process: ~4 s, once.)"""
    ours, theirs = _probe("keras_metric_spec")
    assert ours == theirs
    assert theirs["collections"] == {"global": 0, "local": 2, "metric": 2}
    assert theirs["eval_output"]["values"] == {"metrics/keras_mean/value": 2.75}


@pytest.mark.reference
@pytest.mark.timeout(120)
def test_keras_3_metrics_in_an_estimator_evaluate_as_2_15s():
    """A model_fn returning Keras Mean and AUC objects: train 1 step, evaluate, 2.15's dict."""
    ours, theirs = _probe("keras_metric_evaluate")
    assert ours == theirs
    assert set(theirs) == {"auc", "global_step", "loss", "mean_prediction"}


@pytest.mark.reference
@pytest.mark.timeout(120)
def test_export_all_saved_models_writes_2_15s_train_eval_and_serve_graphs():
    """Train 3 steps, export TRAIN + EVAL + PREDICT: the same files, tags, signatures
    (methods, input and output keys), saved_model_train_op collection, variables, and the
    same loss, metric and predictions when each graph is loaded and fed; 2.15's errors."""
    ours, theirs = _probe("export_all")
    assert ours == theirs
    assert sorted(theirs["modes"]) == ["eval", "serve", "train"]
    assert theirs["modes"]["train"]["train_ops"] == 1
