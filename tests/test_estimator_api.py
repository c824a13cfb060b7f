"""lowlevel.estimator's API side by side with tensorflow_estimator 2.15: no training here.

RunConfig (every row of run_config.json), numpy_input_fn (numpy_input_fn.json),
model_fn argument rules (model_fn_args.json), EstimatorSpec validation,
export outputs and their SignatureDefs, input_fn result parsing.
"""

import functools
import json
import os

import numpy as np
import pytest
import tensorflow as tf
from estimator_support import fixture

from lowlevel.estimator import inputs
from lowlevel.models import export_outputs, input_fns
from lowlevel.models.run_config import RunConfig
from lowlevel.models.spec import (
    EstimatorSpec,
    ModeKeys,
    call_model_fn,
    fn_args,
    verify_model_fn_args,
)

v1 = tf.compat.v1
RUN_CONFIG = fixture("run_config.json")


def _error_type(error):
    return f"{type(error).__module__}.{type(error).__name__}"


def _describe(c):
    sc = c.session_config
    return {
        "cluster_spec": c.cluster_spec.as_dict() if c.cluster_spec else {},
        "task_type": c.task_type, "task_id": c.task_id, "is_chief": c.is_chief,
        "master": c.master, "evaluation_master": c.evaluation_master,
        "num_ps_replicas": c.num_ps_replicas, "num_worker_replicas": c.num_worker_replicas,
        "global_id_in_cluster": c.global_id_in_cluster, "model_dir": c.model_dir,
        "session_config": str(sc) if sc is not None else None, "service": c.service,
    }


@pytest.mark.parametrize("row", RUN_CONFIG["table"], ids=[r["case"] for r in RUN_CONFIG["table"]])
def test_run_config_reads_tf_config_as_2_15(row, monkeypatch):
    if row["TF_CONFIG"] is None:
        monkeypatch.delenv("TF_CONFIG", raising=False)
    else:
        monkeypatch.setenv("TF_CONFIG", json.dumps(row["TF_CONFIG"]))
    if "error" in row:
        with pytest.raises(Exception) as raised:
            RunConfig()
        assert _error_type(raised.value) == row["error"]["type"]
        assert str(raised.value) == row["error"]["message"]
    else:
        assert _describe(RunConfig()) == row["run_config"]


def test_run_config_table_covers_every_rule():
    cases = {r["case"] for r in RUN_CONFIG["table"]}
    assert len(cases) == 32 and sum("error" in r for r in RUN_CONFIG["table"]) >= 12


@pytest.mark.parametrize("expression", sorted(RUN_CONFIG["constructor"]))
def test_run_config_constructor_defaults_and_errors(expression, monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    expected = RUN_CONFIG["constructor"][expression]
    if "message" in expected:
        with pytest.raises(Exception) as raised:
            eval(expression, {"RunConfig": RunConfig})  # noqa: S307 (fixture keys are calls)
        assert (_error_type(raised.value), str(raised.value)) == \
            (expected["type"], expected["message"])
    else:
        config = eval(expression, {"RunConfig": RunConfig})  # noqa: S307
        assert {k: getattr(config, k) for k in expected} == expected


@pytest.mark.parametrize("expression", sorted(RUN_CONFIG["replace"]))
def test_run_config_replace(expression, monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    base = RunConfig(model_dir="/tmp/a", save_checkpoints_steps=7)
    expected = RUN_CONFIG["replace"][expression]
    call = "base." + expression
    if "message" in expected:
        with pytest.raises(Exception) as raised:
            eval(call, {"base": base})  # noqa: S307
        assert (_error_type(raised.value), str(raised.value)) == \
            (expected["type"], expected["message"])
        return
    new = eval(call, {"base": base})  # noqa: S307
    observed = {k: getattr(new, k) for k in expected
                if k not in ("original_unchanged", "returns_new_object")}
    observed["original_unchanged"] = base.model_dir == "/tmp/a" and \
        base.save_checkpoints_steps == 7
    observed["returns_new_object"] = new is not base
    assert observed == expected


def test_run_config_defaults(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    config = RunConfig()
    for name, value in RUN_CONFIG["default_properties"].items():
        assert getattr(config, name) == value, name
    assert sorted(vars(config)) == sorted(RUN_CONFIG["defaults_vars"])


# ---------------------------------------------------------------- numpy_input_fn

NUMPY = fixture("numpy_input_fn.json")


def _numpy_data():
    x = {"a": np.arange(10, dtype=np.float32),
         "b": np.arange(20, dtype=np.int64).reshape(10, 2),
         "s": np.array([b"r%d" % i for i in range(10)])}
    y = np.arange(100, 110, dtype=np.int32)
    return x, y


def _read_all(result, limit=None):
    """Runs an input_fn's tensors until OutOfRange (or `limit` batches)."""
    batches, stopped = [], False
    with v1.Session() as session:
        session.run(v1.local_variables_initializer())
        while limit is None or len(batches) < limit:
            try:
                batches.append(session.run(result))
            except tf.errors.OutOfRangeError:
                stopped = True
                break
    return batches, stopped


def _labels_of(batch):
    labels = batch[1] if isinstance(batch, tuple) else None
    if isinstance(labels, dict):
        return {k: v.tolist() for k, v in labels.items()}
    return None if labels is None else labels.tolist()


CASES = {
    "num_epochs=1, shuffle=False": dict(batch_size=4, num_epochs=1, shuffle=False),
    "num_epochs=2, shuffle=False": dict(batch_size=4, num_epochs=2, shuffle=False),
    "default batch_size=128 > 10 rows, num_epochs=1, shuffle=False":
        dict(num_epochs=1, shuffle=False),
    "num_threads=2, num_epochs=1, shuffle=False":
        dict(batch_size=4, num_epochs=1, shuffle=False, num_threads=2),
    "num_epochs=None, shuffle=False (forever: first 6 batches)":
        dict(batch_size=4, num_epochs=None, shuffle=False),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_numpy_input_fn_batches_as_2_15(case):
    expected = NUMPY[case]
    x, y = _numpy_data()
    with tf.Graph().as_default():
        result = inputs.numpy_input_fn(x, y, **CASES[case])()
        assert isinstance(result, tuple) and sorted(result[0]) == ["a", "b", "s"]
        labels_shape = result[1].shape.as_list()
        assert labels_shape == expected["labels"]["static_shape"]
        assert result[0]["b"].shape.as_list() == expected["features"]["b"]["static_shape"]
        limit = len(expected["batches"]) if not expected["stopped_by_out_of_range"] else None
        batches, stopped = _read_all(result, limit)
    assert stopped == expected["stopped_by_out_of_range"]
    assert [(len(b[1]), _labels_of(b)) for b in batches] == \
        [(e["size"], e["labels"]) for e in expected["batches"]]
    assert [b[0]["s"].tolist() for b in batches] == \
        [[s.encode() for s in e["s"]] for e in expected["batches"]]


def test_numpy_input_fn_shuffle_keeps_every_row_once_per_epoch():
    expected = NUMPY["num_epochs=1, shuffle=True"]
    x, y = _numpy_data()
    with tf.Graph().as_default():
        batches, stopped = _read_all(inputs.numpy_input_fn(x, y, batch_size=4, num_epochs=1,
                                                           shuffle=True)())
    assert stopped and [len(b[1]) for b in batches] == [e["size"] for e in expected["batches"]]
    assert sorted(sum((_labels_of(b) for b in batches), [])) == list(range(100, 110))


def test_numpy_input_fn_returns_features_only_or_label_dicts_as_2_15():
    x, y = _numpy_data()
    with tf.Graph().as_default():
        only = inputs.numpy_input_fn(x, batch_size=4, shuffle=False)()
        assert isinstance(only, dict) and NUMPY["y=None, num_epochs=1, shuffle=False"][
            "returns"] == "dict"
        array = inputs.numpy_input_fn(np.ones([10, 3], np.float32), batch_size=4,
                                      shuffle=False)()
        assert isinstance(array, tf.Tensor) and array.shape.as_list() == [None, 3]
        both = inputs.numpy_input_fn(x, {"y1": y, "y2": y * 2}, batch_size=4,
                                     shuffle=False)()
        batches, _ = _read_all(both)
    assert [_labels_of(b) for b in batches] == \
        [e["labels"] for e in NUMPY["y = dict {'y1', 'y2'}"]["batches"]]


@pytest.mark.parametrize("case", sorted(NUMPY["errors"]))
def test_numpy_input_fn_errors_as_2_15(case):
    x, y = _numpy_data()
    calls = {
        "shuffle omitted (default None)": lambda: inputs.numpy_input_fn(x, y),
        "shuffle=0 (int, not bool)": lambda: inputs.numpy_input_fn(x, y, shuffle=0),
        "x = list": lambda: inputs.numpy_input_fn([1, 2], y, shuffle=False)(),
        "x = {} (empty dict)": lambda: inputs.numpy_input_fn({}, y, shuffle=False)(),
        "x and y lengths differ": lambda: inputs.numpy_input_fn(x, y[:3], shuffle=False)(),
        "y = {} (empty dict)": lambda: inputs.numpy_input_fn(x, {}, shuffle=False)(),
        "y dict sharing a key with x":
            lambda: inputs.numpy_input_fn(x, {"a": y}, shuffle=False)(),
    }
    expected = NUMPY["errors"][case]
    with tf.Graph().as_default(), pytest.raises(Exception) as raised:
        calls[case]()
    assert (_error_type(raised.value), str(raised.value)) == \
        (expected["type"], expected["message"])


# ---------------------------------------------------------------- model_fn arguments

MODEL_FN_ARGS = fixture("model_fn_args.json")
PARAMS = {"hidden_units": 16, "learning_rate": 0.1, "batch_size": 32, "seed": 42, "sync": False,
          "sync_hook_in": "training_chief_hooks", "is_chief": True, "num_workers": 1}


def _recorder(received):
    def model_fn(**kwargs):
        received.update(kwargs)
        loss = tf.constant(1.0)
        return EstimatorSpec(ModeKeys.TRAIN, loss=loss, train_op=tf.no_op())
    return model_fn


class _Model:
    def __init__(self, received):
        self.received = received

    def model_fn(self, features, labels, mode, config):
        return _recorder(self.received)(features=features, labels=labels, mode=mode,
                                        config=config)

    def __call__(self, features, labels, mode, params):
        return _recorder(self.received)(features=features, labels=labels, mode=mode,
                                        params=params)


def _variants(received):
    rec = _recorder(received)

    def partial_positional(hidden, features, labels, mode):
        return rec(features=features, labels=labels, mode=mode, hidden=hidden)

    def partial_keyword(features, labels, mode, hidden):
        return rec(features=features, labels=labels, mode=mode, hidden=hidden)
    return {
        "(feats, labels, mode)  renamed first arg": (lambda feats, labels, mode: None, None),
        "(features, labels)": (lambda features, labels: rec(features=features, labels=labels),
                               None),
        "(features, labels, *, mode, params)  keyword-only":
            (lambda features, labels, *, mode, params: None, PARAMS),
        "(features, labels, mode)": (lambda features, labels, mode: rec(
            features=features, labels=labels, mode=mode), None),
        "(features, labels, mode), params passed": (lambda features, labels, mode: None, PARAMS),
        "(features, labels, mode, **kwargs), no params": (lambda features, labels, mode, **kw: rec(
            features=features, labels=labels, mode=mode, **kw), None),
        "(features, labels, mode, **kwargs), params passed":
            (lambda features, labels, mode, **kw: None, PARAMS),
        "(features, labels, mode, config)": (lambda features, labels, mode, config: rec(
            features=features, labels=labels, mode=mode, config=config), None),
        "(features, labels, mode, params, config)": (
            lambda features, labels, mode, params, config: rec(
                features=features, labels=labels, mode=mode, params=params, config=config),
            PARAMS),
        "(features, labels, mode, params, foo)  unknown arg":
            (lambda features, labels, mode, params, foo: None, PARAMS),
        "(features, mode)  (input_fn returns labels)": (lambda features, mode: rec(
            features=features, mode=mode), None),
        "bound method model_fn(self, features, labels, mode, config)":
            (_Model(received).model_fn, None),
        "callable object __call__(self, features, labels, mode, params)":
            (_Model(received), PARAMS),
        "functools.partial(model_fn, 16)  (model_fn(hidden, features, labels, mode))":
            (functools.partial(partial_positional, 16), None),
        "functools.partial(model_fn, hidden=16)  (model_fn(features, labels, mode, hidden))":
            (functools.partial(partial_keyword, hidden=16), None),
        "lambda features, labels, mode: ...": (lambda features, labels, mode: rec(
            features=features, labels=labels, mode=mode), None),
    }


def _normalise(message):
    import re
    return re.sub(r"model_fn \(<.*? at 0x[0-9a-f.]+>\)|model_fn \(<.*?>\)", "model_fn (<fn>)",
                  message)


@pytest.mark.parametrize("case", sorted(_variants({})))
def test_model_fn_argument_rules_as_2_15(case):
    received = {}
    model_fn, params = _variants(received)[case]
    expected = MODEL_FN_ARGS["model_fn"][case]
    if "constructor" in expected:
        with pytest.raises(ValueError) as raised:
            verify_model_fn_args(model_fn, params)
        assert _normalise(str(raised.value)) == _normalise(expected["constructor"]["message"])
        return
    verify_model_fn_args(model_fn, params)
    assert list(fn_args(model_fn)) == expected["fn_args"]
    with tf.Graph().as_default():
        features, labels = {"x": tf.zeros([2, 3])}, tf.zeros([2], tf.int32)
        if isinstance(expected["train"], dict):
            with pytest.raises(ValueError) as raised:
                call_model_fn(model_fn, features, labels, ModeKeys.TRAIN, params or {}, "cfg")
            assert str(raised.value) == expected["train"]["message"]
            return
        call_model_fn(model_fn, features, labels, ModeKeys.TRAIN, params or {}, "cfg")
    assert sorted(received) == sorted(expected["received_kwargs"].keys() - {"params_value"})
    assert received["mode"] == "train" if "mode" in received else True


def test_valid_model_fn_args_and_mode_keys():
    assert sorted(MODEL_FN_ARGS["valid_model_fn_args"]) == \
        ["config", "features", "labels", "mode", "params", "self"]
    assert (ModeKeys.TRAIN, ModeKeys.EVAL, ModeKeys.PREDICT) == ("train", "eval", "infer")
    with pytest.raises(ValueError, match="model_fn should return an EstimatorSpec."):
        call_model_fn(lambda features: None, {}, None, ModeKeys.TRAIN, {}, None)


# ---------------------------------------------------------------- input_fn results, specs, outputs

def test_features_and_labels_reads_2_15s_input_fn_results():
    with tf.Graph().as_default():
        features, labels, hooks = input_fns.features_and_labels(
            tf.data.Dataset.from_tensors(({"x": tf.zeros([2, 3])}, tf.zeros([2]))))
        assert sorted(features) == ["x"] and labels.shape.as_list() == [2] and len(hooks) == 1
        assert features["x"].op.type == "IteratorGetNext"
        features, labels, hooks = input_fns.features_and_labels(
            tf.data.Dataset.from_tensors({"x": tf.zeros([2, 3])}))
        assert labels is None and len(hooks) == 1
        plain = {"x": tf.zeros([2, 3])}
        assert input_fns.features_and_labels(plain) == (plain, None, [])
        with pytest.raises(ValueError, match=r"^input_fn should return \(features, labels\) as "
                                             r"a len 2 tuple.$"):
            input_fns.features_and_labels((plain, plain, plain))


def test_call_input_fn_passes_the_arguments_it_names():
    seen = {}
    input_fns.call_input_fn(lambda params, config, mode: seen.update(
        params=params, config=config, mode=mode), "eval", {"a": 1}, "cfg")
    assert seen == {"params": {"a": 1}, "config": "cfg", "mode": "eval"}
    assert input_fns.call_input_fn(lambda input_context=None: input_context, "train", {}, None,
                                   input_context="ctx") == "ctx"


def test_estimator_spec_defaults_and_replace():
    with tf.Graph().as_default():
        loss = tf.reshape(tf.constant(1.0), [1])
        spec = EstimatorSpec(ModeKeys.TRAIN, loss=loss, train_op=tf.no_op())
        assert spec.loss.shape.as_list() == [] and spec.predictions == {}
        assert spec.training_hooks == () and isinstance(spec.scaffold, v1.train.Scaffold)
        with pytest.raises(ValueError, match="^mode of EstimatorSpec cannot be changed.$"):
            spec._replace(mode=ModeKeys.EVAL)
        assert spec._replace(loss=tf.constant(2.0)).loss.shape.as_list() == []
        with pytest.raises(ValueError, match="^Missing predictions.$"):
            EstimatorSpec(ModeKeys.PREDICT)
        predict = EstimatorSpec(ModeKeys.PREDICT, predictions={"p": tf.zeros([2])})
        assert list(predict.export_outputs) == ["serving_default"]
        assert isinstance(predict.export_outputs["serving_default"],
                          export_outputs.PredictOutput)
    with tf.Graph().as_default(), pytest.raises(ValueError, match="must be from the default"):
        EstimatorSpec(ModeKeys.EVAL, loss=loss)


def test_export_output_rules_and_signatures():
    with tf.Graph().as_default():
        examples = v1.placeholder(tf.string, [None], name="examples")
        scores, floats = tf.zeros([2, 3]), v1.placeholder(tf.float32, [None, 3], name="x")
        classes = tf.as_string(tf.zeros([2, 3], tf.int64))
        assert list(export_outputs.PredictOutput(scores).outputs) == ["output"]
        with pytest.raises(ValueError, match="^Prediction output key must be a string; got 1.$"):
            export_outputs.PredictOutput({1: scores})
        with pytest.raises(ValueError, match="^Classification classes must be a string Tensor"):
            export_outputs.ClassificationOutput(classes=scores)
        with pytest.raises(ValueError, match="^Cannot create a ClassificationOutput with empty"):
            export_outputs.ClassificationOutput()
        outputs = export_outputs.get_export_outputs({
            "serving_default": export_outputs.ClassificationOutput(scores, classes),
            "regress": export_outputs.RegressionOutput(tf.zeros([2])),
            "predict": export_outputs.PredictOutput({"s": scores})}, None)
        on_strings = export_outputs.build_all_signature_defs({"examples": examples}, outputs)
        on_floats = export_outputs.build_all_signature_defs({"x": floats}, outputs)
    assert {k: (s.method_name, sorted(s.inputs), sorted(s.outputs))
            for k, s in on_strings.items()} == {
        "serving_default": ("tensorflow/serving/classify", ["inputs"], ["classes", "scores"]),
        "regress": ("tensorflow/serving/regress", ["inputs"], ["outputs"]),
        "predict": ("tensorflow/serving/predict", ["examples"], ["s"])}
    assert sorted(on_floats) == ["predict"]


def test_a_single_export_output_is_also_serving_default():
    with tf.Graph().as_default():
        outputs = export_outputs.get_export_outputs(
            {"classify": export_outputs.PredictOutput(tf.zeros([2]))}, None)
    assert sorted(outputs) == ["classify", "serving_default"]
    assert outputs["classify"] is outputs["serving_default"]


def test_serving_input_receivers():
    from lowlevel.outputs import serving
    with tf.Graph().as_default():
        x = v1.placeholder(tf.float32, [None, 4], name="pixels")
        receiver = serving.ServingInputReceiver(x, x)
        assert list(receiver.features) == ["feature"] and list(receiver.receiver_tensors) == \
            ["input"]
        assert serving.TensorServingInputReceiver(x, {"x": x}).features is x
        with pytest.raises(ValueError, match="^features must be defined.$"):
            serving.TensorServingInputReceiver(None, x)
        with pytest.raises(ValueError, match="^receiver_tensor keys must be strings: 1.$"):
            serving.ServingInputReceiver({"a": x}, {1: x})
        with pytest.raises(ValueError, match="^feature a must be a Tensor, SparseTensor, or "
                                             "RaggedTensor.$"):
            serving.ServingInputReceiver({"a": 3}, x)
        raw = serving.build_raw_serving_input_receiver_fn({"x": x}, default_batch_size=5)()
        assert raw.receiver_tensors["x"].shape.as_list() == [5, 4]
        assert raw.receiver_tensors["x"].op.name.startswith("pixels")
        parsed = serving.build_parsing_serving_input_receiver_fn(
            {"f": tf.io.FixedLenFeature([2], tf.float32)})()
        assert list(parsed.receiver_tensors) == ["examples"]
        assert parsed.receiver_tensors["examples"].op.name == "input_example_tensor"
        assert parsed.features["f"].shape.as_list() == [None, 2]


def test_estimator_fills_session_config_and_a_temporary_model_dir(monkeypatch):
    import tempfile

    from lowlevel.estimator import Estimator
    expected = RUN_CONFIG["estimator_config"]
    monkeypatch.delenv("TF_CONFIG", raising=False)
    estimator = Estimator(lambda features, labels, mode: None)
    assert str(estimator.config.session_config) == expected["session_config"]
    assert estimator.config is not estimator.config and expected["config_is_copy"]
    assert estimator.model_dir.startswith(tempfile.gettempdir()) == \
        expected["model_dir_is_temp"] is True
    os.rmdir(estimator.model_dir)
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": RUN_CONFIG["cluster_used"],
                                                "task": {"type": "worker", "index": 1}}))
    worker = Estimator(lambda features, labels, mode: None, model_dir="/tmp/unused-w24")
    assert str(worker.config.session_config) == expected["worker1_session_config"]
