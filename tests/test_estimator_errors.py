"""Bad input to lowlevel.estimator: 2.15's exception types and messages (errors.json).

Each case builds what tensorflow_estimator 2.15's probe built (make_fixtures.py
`probe_errors`) with the digits script's model_fn, and expects the recorded
exception type and message (object addresses, class paths and directories
normalised). Cases that train do a few steps.
"""

import os
import re

import pytest
import tensorflow as tf
from estimator_support import estimator_alias, fixture, load_script

v1 = tf.compat.v1
ERRORS = fixture("errors.json")


@pytest.fixture(scope="module")
def est():
    """lowlevel.estimator, aliased as tf.estimator for the script while the module runs."""
    with estimator_alias() as estimator:
        yield estimator


@pytest.fixture(scope="module")
def de(est):
    """The digits script's globals, its FLAGS parsed from defaults."""
    script = load_script("digits_estimator.py")
    script["FLAGS"] = script["parse_args"]([])
    return script


def _normalise(text):
    text = re.sub(r" at 0x[0-9a-f.]+>", " at 0x...>", text)
    text = re.sub(r"<class '[\w.<>]*?(\w+)'>", r"<class '\1'>", text)
    text = re.sub(r"<[\w.]*?(\w+) object at", r"<\1 object at", text)
    text = re.sub(r"[\w.<>]*\.<locals>\.", "", text)
    return re.sub(r"(<work>|/[^ ]*)/(m\d+|train)\b", "<dir>", text)


def _check(case, call):
    expected = ERRORS[case]
    assert expected["raised"], case
    with pytest.raises(Exception) as raised:
        call()
    observed = f"{type(raised.value).__module__}.{type(raised.value).__name__}"
    assert observed == expected["type"]
    assert _normalise(str(raised.value)) == _normalise(expected["message"])


def _spec_fn(est, de, **changes):
    def model_fn(features, labels, mode, params):
        spec = de["model_fn"](features, labels, mode, params)
        fields = dict(mode=spec.mode, predictions=spec.predictions, loss=spec.loss,
                      train_op=spec.train_op, eval_metric_ops=spec.eval_metric_ops)
        for key, value in changes.items():
            fields[key] = value(spec) if callable(value) else value
        return est.EstimatorSpec(**fields)
    return model_fn


@pytest.fixture
def train(est, de, tmp_path):
    """train(model_fn, input_fn=the script's, steps=1) in a fresh model_dir; the Estimator."""
    params = de["hparams_from_flags"](None)

    def run(model_fn, input_fn=None, steps=1):
        estimator = est.Estimator(model_fn, model_dir=str(tmp_path / "train"), params=params)
        estimator.train(input_fn or de["train_input_fn"], steps=steps)
        return estimator
    run.params = params
    return run


SPEC_CASES = {
    "TRAIN EstimatorSpec without train_op": dict(train_op=None),
    "TRAIN EstimatorSpec without loss": dict(loss=None),
    "loss not scalar (shape [batch])": dict(loss=lambda s: tf.fill([2, 3], s.loss)),
    "train_op is not an Operation/Tensor (a string)": dict(train_op="nope"),
    "predictions not a tensor (a python list)": dict(predictions=[1, 2]),
    "eval_metric_ops value not a tuple (a Tensor)":
        dict(eval_metric_ops=lambda s: {"acc": tf.constant(1.0)}),
    "eval_metric_ops not a dict (a list)": dict(eval_metric_ops=lambda s: [tf.constant(1.0)]),
}


@pytest.mark.parametrize("case", sorted(SPEC_CASES))
def test_bad_estimator_spec(case, est, de, train):
    _check(case, lambda: train(_spec_fn(est, de, **SPEC_CASES[case])))


def test_loss_of_shape_1_is_accepted(est, de, train):
    assert ERRORS["loss of shape [1] (accepted, reshaped to [])"]["result"] == "trained"
    estimator = train(_spec_fn(est, de, loss=lambda s: tf.reshape(s.loss, [1])))
    assert estimator.get_variable_value("global_step") == 1


def _three(params):
    return tf.zeros([4, 64]), tf.zeros([4], tf.int32), tf.zeros([4])


INPUT_CASES = {
    "input_fn returns a tuple of 3 tensors": _three,
    "input_fn returns a list of 3 tensors": lambda params: list(_three(params)),
    "input_fn returns a Dataset of 3-tuples": lambda params: tf.data.Dataset.from_tensors(
        ({"x": tf.zeros([4, 64])}, tf.zeros([4], tf.int32), tf.zeros([4]))).repeat(),
    "TRAIN input_fn returns a Dataset of features dict only (model_fn needs labels)":
        lambda params: tf.data.Dataset.from_tensors({"x": tf.zeros([4, 64])}).repeat(),
}


@pytest.mark.parametrize("case", sorted(INPUT_CASES))
def test_bad_input_fn_result(case, de, train):
    _check(case, lambda: train(de["model_fn"], INPUT_CASES[case]))


def test_input_fn_returning_a_list_of_features_and_labels_trains(de, train):
    assert ERRORS["input_fn returns a list [features, labels]"]["result"] == "trained"
    estimator = train(de["model_fn"], lambda params: [
        {"x": tf.zeros([4, 64])}, tf.zeros([4], tf.int32)])
    assert estimator.get_variable_value("global_step") == 1


def test_bad_model_fns(de, train):
    _check("model_fn returns a dict, not an EstimatorSpec",
           lambda: train(lambda features, labels, mode, params: {"loss": tf.constant(1.0)}))

    def bad_hooks(features, labels, mode, params):
        return de["model_fn"](features, labels, mode, params)._replace(
            training_hooks=["not a hook"])
    _check("training_hooks with a non-SessionRunHook", lambda: train(bad_hooks))
    _check("model_fn without labels arg, input_fn returns labels",
           lambda: train(lambda features, mode, params: de["model_fn"](
               features, None, mode, params)))


def test_reserved_metric_names(est, de, train):
    def metric_named(name):
        def model_fn(features, labels, mode, params):
            spec = de["model_fn"](features, labels, mode, params)
            if mode == est.ModeKeys.EVAL:
                return spec._replace(eval_metric_ops={name: v1.metrics.mean(spec.loss)})
            return spec
        return model_fn
    estimator = train(metric_named("loss"))
    _check('eval_metric_ops has a "loss" key',
           lambda: estimator.evaluate(de["eval_input_fn"], steps=1))
    other = est.Estimator(metric_named("global_step"), model_dir=estimator.model_dir,
                          params=train.params)
    _check('eval_metric_ops has a "global_step" key',
           lambda: other.evaluate(de["eval_input_fn"], steps=1))


def test_train_argument_errors(est, de, tmp_path, monkeypatch):
    estimator = est.Estimator(de["model_fn"], model_dir=str(tmp_path / "m23"), params={})
    fn = de["train_input_fn"]
    _check("train(steps=5, max_steps=5)", lambda: estimator.train(fn, steps=5, max_steps=5))
    _check("train(steps=0)", lambda: estimator.train(fn, steps=0))
    _check("train(max_steps=-1)", lambda: estimator.train(fn, max_steps=-1))
    _check("train(hooks=[object()])", lambda: estimator.train(fn, steps=1, hooks=[object()]))
    _check("train(saving_listeners=[object()])",
           lambda: estimator.train(fn, steps=1, saving_listeners=[object()]))
    _check("evaluate(steps=0)", lambda: estimator.evaluate(de["eval_input_fn"], steps=0))
    _check("get_variable_value with no checkpoint",
           lambda: estimator.get_variable_value("global_step"))
    for task in ("evaluator", "ps"):
        monkeypatch.setenv("TF_CONFIG", '{"cluster": {"chief": ["h:1"], "ps": ["h:2"]}, '
                           f'"task": {{"type": "{task}", "index": 0}}}}')
        remote = est.Estimator(de["model_fn"], model_dir=str(tmp_path), params={})
        _check(f"train() with TF_CONFIG task {task}/0", lambda: remote.train(fn, steps=1))


def test_constructor_and_spec_errors(est, de):
    fn, receiver = de["train_input_fn"], de["serving_input_receiver_fn"]
    _check("Estimator(model_fn=None)", lambda: est.Estimator(None))
    _check("Estimator(config=dict)", lambda: est.Estimator(de["model_fn"], config={}))
    _check("Estimator(model_dir=a, config=RunConfig(model_dir=b))", lambda: est.Estimator(
        de["model_fn"], model_dir="/tmp/a", config=est.RunConfig(model_dir="/tmp/b")))
    _check("Estimator(warm_start_from=3)",
           lambda: est.Estimator(de["model_fn"], params={}, warm_start_from=3))

    class MyEstimator(est.Estimator):
        def train(self, *a, **k):
            pass
    _check("subclass overriding Estimator.train", lambda: MyEstimator(de["model_fn"], params={}))
    _check("TrainSpec(max_steps=0)", lambda: est.TrainSpec(fn, max_steps=0))
    _check("TrainSpec(input_fn=None)", lambda: est.TrainSpec(None, max_steps=1))
    _check("EvalSpec(steps=0)", lambda: est.EvalSpec(fn, steps=0))
    _check("EvalSpec(throttle_secs=-1)", lambda: est.EvalSpec(fn, throttle_secs=-1))
    _check("EvalSpec(start_delay_secs=-1)", lambda: est.EvalSpec(fn, start_delay_secs=-1))
    _check("EvalSpec(name=3)", lambda: est.EvalSpec(fn, name=3))
    _check('EvalSpec(exporters=[two LatestExporter named "x"])', lambda: est.EvalSpec(
        fn, exporters=[est.LatestExporter("x", receiver), est.LatestExporter("x", receiver)]))
    _check('EvalSpec(exporters="x")', lambda: est.EvalSpec(fn, exporters="x"))
    _check("LatestExporter(exports_to_keep=0)",
           lambda: est.LatestExporter("x", receiver, exports_to_keep=0))
    _check("BestExporter(compare_fn=lambda a, b: True)", lambda: est.BestExporter(
        compare_fn=lambda a, b: True, serving_input_receiver_fn=receiver))


def test_train_and_evaluate_argument_errors(est, de, tmp_path, monkeypatch):
    estimator = est.Estimator(de["model_fn"], model_dir=str(tmp_path), params={})
    train_spec = est.TrainSpec(de["train_input_fn"], max_steps=1)
    eval_spec = est.EvalSpec(de["eval_input_fn"])
    _check("train_and_evaluate(est, train_spec, eval_spec=None)",
           lambda: est.train_and_evaluate(estimator, train_spec, None))
    _check("train_and_evaluate(estimator=object())",
           lambda: est.train_and_evaluate(object(), train_spec, eval_spec))
    cluster = '"cluster": {"chief": ["h:1"], "foo": ["h:3"]}'
    for case, task, index in [
            ("train_and_evaluate with TF_CONFIG task evaluator/1", "evaluator", 1),
            ("train_and_evaluate with TF_CONFIG task foo/0 (cluster has job foo)", "foo", 0)]:
        monkeypatch.setenv("TF_CONFIG",
                           f'{{{cluster}, "task": {{"type": "{task}", "index": {index}}}}}')
        remote = est.Estimator(de["model_fn"], model_dir=str(tmp_path), params={})
        _check(case, lambda: est.train_and_evaluate(remote, train_spec, eval_spec))


def test_train_steps_and_max_steps_bookkeeping(est, de, tmp_path):
    estimator = est.Estimator(de["model_fn"], model_dir=str(tmp_path),
                              params=de["hparams_from_flags"](None))
    estimator.train(de["train_input_fn"], steps=3)
    estimator.train(de["train_input_fn"], steps=3)
    assert estimator.train(de["train_input_fn"], max_steps=2) is estimator
    assert estimator.train(de["train_input_fn"], max_steps=10) is estimator
    expected = ERRORS["train(steps=3) twice then train(max_steps=10)"]["result"]
    assert estimator.get_variable_value("global_step") == expected["global_step"]
    assert sorted(f for f in os.listdir(tmp_path) if f.endswith(".index")) == \
        expected["checkpoints"]


def test_no_checkpoint_finite_and_empty_inputs(est, de, tmp_path):
    params = de["hparams_from_flags"](None)
    fresh = est.Estimator(de["model_fn"], model_dir=str(tmp_path / "fresh"), params=params)
    result = fresh.evaluate(de["eval_input_fn"])
    expected = ERRORS["evaluate with no checkpoint in model_dir (runs on fresh init)"]["result"]
    assert {k: type(v).__name__ for k, v in result.items()} == \
        {k: v["type"].split(".")[-1] for k, v in expected.items()}
    assert result["global_step"] == expected["global_step"]["value"] == 0
    assert sorted(next(fresh.predict(de["predict_input_fn"]))) == \
        ERRORS["predict with no checkpoint in model_dir"]["result"]
    finite = est.Estimator(de["model_fn"], model_dir=str(tmp_path / "finite"), params=params)
    finite.train(de["eval_input_fn"], max_steps=1000)
    assert finite.get_variable_value("global_step") == ERRORS[
        "train on a finite Dataset (10 batches) with max_steps=1000: stops at OutOfRange"][
        "result"]["global_step"]
    empty_dir = tmp_path / "empty"
    empty = est.Estimator(de["model_fn"], model_dir=str(empty_dir), params=params)
    empty.train(lambda: de["eval_input_fn"](params).take(0), steps=5)
    expected = ERRORS["train on an empty Dataset"]["result"]
    assert empty.get_variable_value("global_step") == expected["global_step"]
    assert sorted(re.sub(r"tfevents\..*", "tfevents.*", f) for f in os.listdir(empty_dir)) == \
        sorted(re.sub(r"tfevents\..*", "tfevents.*", f) for f in expected["files"])


def test_the_training_mode_from_the_environment(monkeypatch):
    """`LOWLEVEL_SYNC`, `LOWLEVEL_REPLICAS_TO_AGGREGATE`, `LOWLEVEL_COMMUNICATION_PERIOD`: the
    trainer's flags for a script that has none; a value that is not one is a usage error
    naming the variable (one line, exit 2 from `python -m lowlevel.estimator`)."""
    from lowlevel.errors import UsageError
    from lowlevel.estimator import distributed
    monkeypatch.setenv("LOWLEVEL_SYNC", "1")
    monkeypatch.setenv("LOWLEVEL_COMMUNICATION_PERIOD", "8")
    assert distributed._mode_from_environment() == {"sync": True, "communication_period": 8}
    monkeypatch.setenv("LOWLEVEL_COMMUNICATION_PERIOD", "0")
    with pytest.raises(UsageError, match="LOWLEVEL_COMMUNICATION_PERIOD='0': expected a "
                       "positive integer .the trainer's --communication_period"):
        distributed._mode_from_environment()
