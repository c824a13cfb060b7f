"""The heads' `metrics()` / `update_metrics()` and `LinearSDCA.get_train_step` against
tensorflow_estimator 2.15's, captured as fixtures.

tests/fixtures/canned215/head_metrics.py ran under the real 2.15 (its JSON beside it);
each test here runs the same function with lowlevel.estimator and compares: metric keys
(and their order), the metric objects' type names, `name`s and variables (short names,
shapes), the values after one update, EVAL `eval_metric_ops` keys and values, a user's
head subclass adding a metric, and SDCA's variables after 40 steps. Floats to a relative
1e-5: both sides run the same arithmetic (Keras 2.15's metric formulas) on the same
fixed logits; SDCA's kernel visits the examples in a random order, so its fixture runs
to convergence (3 runs on each side agreed to 1e-6) and is compared to 1e-4.
"""

import importlib.util
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from estimator_support import HERE

CANNED = os.path.join(HERE, "fixtures", "canned215")
REL = 1e-5
v1 = tf.compat.v1


def _fixture():
    spec = importlib.util.spec_from_file_location(
        "canned215_head_metrics", os.path.join(CANNED, "head_metrics.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with open(os.path.join(CANNED, "head_metrics.json")) as f:
        return module, json.load(f)


def _approx(value, rel=REL, abs_=1e-6):
    if isinstance(value, dict):
        return {k: _approx(v, rel, abs_) for k, v in value.items()}
    if isinstance(value, list):
        return [_approx(v, rel, abs_) for v in value]
    if isinstance(value, float):
        return pytest.approx(value, rel=rel, abs=abs_)
    return value


CASES = ["binary", "binary_named_weighted_reg", "multi_class", "multi_label",
         "regression_2d", "poisson", "logistic_regression", "multi_head"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", CASES)
def test_a_heads_metrics_and_update_metrics_are_2_15s(case):
    """metrics(): 2.15's keys in its order, its metric types (Mean, Accuracy, Precision,
    Recall, AUC, BinaryAccuracy), names and variables; update_metrics(): the same dict
    back, values after one update; create_estimator_spec(EVAL): the same keys and values."""
    module, theirs = _fixture()
    import lowlevel.estimator as E
    ours = module._one_case(E, *module._cases(E)[case])
    assert ours == _approx(theirs["cases"][case])
    assert ours["spec_values"] == _approx(ours["values"])
    assert ours["updated_is_same_dict"] is True


@pytest.mark.timeout(60)
def test_metric_keys_of_constructor_variants_are_2_15s():
    """A named head's suffixes, a vocabulary's class names, MultiHead without
    regularization, and metrics([]) (a regularization_loss metric, as 2.15)."""
    module, theirs = _fixture()
    import lowlevel.estimator as E
    assert module._key_variants(E) == theirs["key_variants"]


@pytest.mark.timeout(120)
def test_a_users_head_subclass_adding_a_metric_evaluates_as_2_15(tmp_path):
    """2.15's documented override (super().metrics() + a Mean; super().update_metrics()
    + its update_state) in a model_fn: Estimator.evaluate gives 2.15's dict."""
    module, theirs = _fixture()
    import lowlevel.estimator as E
    from lowlevel.estimator.canned import head_metrics
    ours = module._custom_evaluate(E, head_metrics.Mean)
    assert ours == _approx(theirs["custom_head_evaluate"])
    assert ours["logits/mean"] == pytest.approx(0.5)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("loss_type", ["squared_loss", "logistic_loss"])
def test_linear_sdca_get_train_step_trains_as_2_15(loss_type):
    """get_train_step(state_manager, weight_column_name, loss_type, feature_columns,
    features, targets, bias_var, global_step) -> (model, train_op): 40 steps with
    model.update_weights give 2.15's variables (names and values) and global step."""
    module, theirs = _fixture()
    import lowlevel.estimator as E
    ours = module.sdca_train_step(E, loss_type)
    want = theirs["sdca_train_step"][loss_type]
    assert sorted(ours["variables"]) == sorted(want["variables"])
    assert ours["variables"] == _approx(want["variables"], rel=1e-4, abs_=1e-4)
    assert ours["variables"]["global_step"] == [40]


@pytest.mark.timeout(60)
def test_the_public_methods_of_2_15s_heads_and_linear_sdca_exist():
    """Every head class, Head, MultiHead and experimental.LinearSDCA has the methods the
    real 2.15 lists (tests/fixtures/estimator215/public_names.json), with 2.15's
    parameter names for metrics, update_metrics and get_train_step."""
    import inspect

    import lowlevel.estimator as E
    with open(os.path.join(HERE, "fixtures", "estimator215", "public_names.json")) as f:
        classes = json.load(f)["classes"]["v2"]
    names = [n for n in classes if n.endswith("Head")] + ["experimental.LinearSDCA"]
    assert len(names) == 9
    for name in names:
        obj = E
        for part in name.split("."):
            obj = getattr(obj, part)
        missing = [m for m in classes[name]["methods"] if not callable(getattr(obj, m, None))]
        assert missing == [], name
    params = list(inspect.signature(E.experimental.LinearSDCA.get_train_step).parameters)
    assert params == ["self", "state_manager", "weight_column_name", "loss_type",
                      "feature_columns", "features", "targets", "bias_var", "global_step"]
    assert list(inspect.signature(E.BinaryClassHead.update_metrics).parameters) == [
        "self", "eval_metrics", "features", "logits", "labels", "regularization_losses"]
    with pytest.raises(NotImplementedError):
        E.Head().metrics()


def _session_values(fetches, updates):
    with v1.Session() as sess:
        sess.run(v1.local_variables_initializer())
        sess.run(updates)
        return sess.run(fetches)


@pytest.mark.timeout(60)
def test_the_graph_metrics_have_the_keras_interface():
    """update_state returns the op and records it in `updates`; the variables are local
    metric variables; result() after two updates accumulates; __call__ updates then
    reads; reset_state zeroes; AUC rejects a bad curve or threshold count (ValueError)."""
    from lowlevel.estimator.canned import head_metrics as hm
    with tf.Graph().as_default():
        mean, auc = hm.Mean(name="m"), hm.AUC(curve="PR")
        first = mean.update_state([1.0, 3.0], sample_weight=[1.0, 3.0])
        second = mean.update_state(tf.constant([[2.0]]))
        assert mean.updates == [first, second] and auc.name == "auc"
        local = v1.get_collection(v1.GraphKeys.METRIC_VARIABLES)
        assert [v.name for v in mean.variables] == ["m/total:0", "m/count:0"]
        assert all(any(v is x for x in local) for v in mean.variables + auc.variables)
        called = hm.Recall(thresholds=[0.3, 0.6])([1, 1, 0], [0.5, 0.9, 0.7])
        with v1.Session() as sess:
            sess.run(v1.local_variables_initializer())
            sess.run([first, second])
            assert sess.run(mean.result()) == pytest.approx((1 + 9 + 2) / 5)
            assert sess.run(called) == pytest.approx([1.0, 0.5])
            sess.run(mean.reset_states())
            assert sess.run([mean.total, mean.count, mean.result()]) == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="num_thresholds"):
        hm.AUC(num_thresholds=1)
    with pytest.raises(ValueError, match="curve"):
        hm.AUC(curve="XY")


@pytest.mark.timeout(60)
def test_a_head_written_from_scratch_gets_its_own_metrics_in_eval():
    """A `Head` subclass implementing metrics/update_metrics (one metric object, one
    tf.compat.v1.metrics tuple): create_estimator_spec(EVAL) uses exactly those."""
    import lowlevel.estimator as E
    from lowlevel.estimator.canned import head_metrics as hm

    class Doubling(E.RegressionHead):
        def metrics(self, regularization_losses=None):
            return {"twice": hm.Mean(name="twice")}

        def update_metrics(self, eval_metrics, features, logits, labels,
                           regularization_losses=None):
            eval_metrics["twice"].update_state(2.0 * logits)
            eval_metrics["max"] = v1.metrics.mean(tf.reduce_max(logits))
            return eval_metrics

    with tf.Graph().as_default():
        spec = Doubling().create_estimator_spec(
            features={}, mode=E.ModeKeys.EVAL, logits=tf.constant([[1.0], [2.0]]),
            labels=tf.constant([[0.0], [0.0]]))
        assert sorted(spec.eval_metric_ops) == ["max", "twice"]
        values = {k: v[0] for k, v in spec.eval_metric_ops.items()}
        got = _session_values(values, [v[1] for v in spec.eval_metric_ops.values()])
    assert got == {"max": pytest.approx(2.0), "twice": pytest.approx(3.0)}
    assert np.isfinite(list(got.values())).all()
