"""Model_fn variants side by side with tensorflow_estimator 2.15, in-process and small.

Feature columns with an embedding column under a fixed_size_partitioner (the
partitioned variables saved under their full names and shapes, the
ClassificationOutput export fed by serialized tf.Examples), the digits model_fn
without params, warm_start_from (from 2.15's own checkpoint and export), the
BestExporter's bookkeeping, the export_outputs="all" signature rule, and the
export errors (checkpoint_variables.json, export_signatures.json,
warm_start.json).
"""

import os
import shutil

import numpy as np
import pytest
import tensorflow as tf
from estimator_support import FIXTURES, estimator_alias, fixture, load_script, script_flags

from lowlevel.runtime import evaluation

v1 = tf.compat.v1
SIGNATURES = fixture("export_signatures.json")


@pytest.fixture(scope="module")
def est():
    """lowlevel.estimator, aliased as tf.estimator for the scripts while the module runs."""
    with estimator_alias() as estimator:
        yield estimator


@pytest.fixture(scope="module")
def digits(est):
    """The digits script's globals."""
    return load_script("digits_estimator.py")


def _signatures(export_dir):
    from tensorflow.core.protobuf import saved_model_pb2
    proto = saved_model_pb2.SavedModel()
    with open(os.path.join(export_dir, "saved_model.pb"), "rb") as f:
        proto.ParseFromString(f.read())
    out = {}
    for key, sig in proto.meta_graphs[0].signature_def.items():
        def tensors(infos):
            return {k: (v.dtype,
                        [None if d.size < 0 else d.size for d in v.tensor_shape.dim])
                    for k, v in infos.items()}
        out[key] = (sig.method_name, tensors(sig.inputs), tensors(sig.outputs))
    return out


def _theirs(description):
    """The signatures of make_fixtures.py's saved_model_description, in _signatures' form."""
    from tensorflow.core.framework import types_pb2
    out = {}
    for key, sig in description["meta_graphs"][0]["signature_defs"].items():
        def tensors(infos):
            return {k: (types_pb2.DataType.Value(v["dtype"]), v["shape"])
                    for k, v in infos.items()}
        out[key] = (sig["method_name"], tensors(sig["inputs"]), tensors(sig["outputs"]))
    return out


def test_feature_columns_partitioned_variables_and_classify_export(est, tmp_path):
    script = load_script("feature_columns_estimator.py")
    model_dir = str(tmp_path / "fc")
    estimator = script["build_estimator"](script["parse_args"]([f"--model_dir={model_dir}"]))
    estimator.train(script["train_input_fn"], steps=2)
    assert estimator.get_variable_value("global_step") == 2
    theirs = fixture("checkpoint_variables.json")["feature_columns_estimator.py"]["variables"]
    assert [(n, s) for n, s in tf.train.list_variables(model_dir)] == \
        [(v["name"], v["shape"]) for v in theirs]
    with tf.Graph().as_default():
        v1.train.import_meta_graph(tf.train.latest_checkpoint(model_dir) + ".meta")
        in_graph = sorted([v.op.name, v.shape.as_list()] for v in v1.global_variables())
    assert in_graph == [list(v) for v in fixture(
        "checkpoint_variables.json")["feature_columns_estimator.py"][
        "partitioned_variables_in_graph"]]
    final = estimator.export_saved_model(str(tmp_path / "export"),
                                         script["serving_input_receiver_fn"]).decode()
    expected = SIGNATURES["feature_columns_exports"]["export/final/<timestamp>"]
    assert _signatures(final) == _theirs(expected)


def test_model_fn_without_params(digits, tmp_path):
    flags = script_flags(digits, str(tmp_path / "noparams"), "--model_fn_args")
    estimator = digits["build_estimator"](flags)
    assert estimator.params == {}
    estimator.train(lambda: digits["train_input_fn"](digits["hparams_from_flags"](None)),
                    steps=3)
    assert estimator.get_variable_value("global_step") == 3


def _first_checkpoint_kinds(model_dir, source):
    """2.15's warm-start probe: per variable, copied from `source` or freshly initialised."""
    first = min(int(f.split("-")[1].split(".")[0]) for f in os.listdir(model_dir)
                if f.startswith("model.ckpt-") and f.endswith(".index"))
    reader = v1.train.NewCheckpointReader(os.path.join(model_dir, f"model.ckpt-{first}"))
    src = v1.train.NewCheckpointReader(source)
    kinds = {}
    for name, _ in tf.train.list_variables(os.path.join(model_dir, f"model.ckpt-{first}")):
        a = reader.get_tensor(name)
        if src.has_tensor(name) and np.array_equal(a, src.get_tensor(name)):
            kinds[name] = "from_warm_start"
        else:
            kinds[name] = "fresh_init (value %s)" % (int(a) if a.ndim == 0 else "differs")
    return first, kinds


WARM_CASES = {
    "warm_start_from=<src model_dir> (string)": lambda src: src,
    "WarmStartSettings(<src>, vars_to_warm_start='mlp/hidden.*')":
        lambda src: ("settings", dict(vars_to_warm_start="mlp/hidden.*")),
    "WarmStartSettings(<src>, vars_to_warm_start=['.*'])  (list form)":
        lambda src: ("settings", dict(vars_to_warm_start=[".*"])),
    "WarmStartSettings(<src>, vars_to_warm_start=None)":
        lambda src: ("settings", dict(vars_to_warm_start=None)),
}


@pytest.mark.parametrize("case", sorted(WARM_CASES))
def test_warm_start_from_a_2_15_checkpoint(case, est, digits, tmp_path):
    src = str(tmp_path / "src")
    shutil.copytree(os.path.join(FIXTURES, "ckpt_digits"), src)
    how = WARM_CASES[case](src)
    warm = how if isinstance(how, str) else est.WarmStartSettings(src, **how[1])
    model_dir = str(tmp_path / "ws")
    estimator = est.Estimator(digits["model_fn"], model_dir=model_dir,
                              params={"hidden_units": 16, "learning_rate": 0.1},
                              config=est.RunConfig(tf_random_seed=7, save_checkpoints_steps=100),
                              warm_start_from=warm)
    estimator.train(lambda: digits["train_input_fn"]({"batch_size": 32}), steps=5)
    first, kinds = _first_checkpoint_kinds(model_dir, tf.train.latest_checkpoint(src))
    expected = fixture("warm_start.json")[case]
    assert kinds == expected["variables_in_first_checkpoint"]
    source_step = 300  # ckpt_digits (2.15's probe started from step 100)
    assert first == (source_step if expected["first_checkpoint_step"] else 0)
    assert estimator.get_variable_value("global_step") == first + 5


def test_warm_start_from_a_2_15_saved_model(est, digits, tmp_path):
    export = os.path.join(FIXTURES, "export_digits")
    model_dir = str(tmp_path / "ws")
    estimator = est.Estimator(digits["model_fn"], model_dir=model_dir,
                              params={"hidden_units": 16, "learning_rate": 0.1},
                              config=est.RunConfig(tf_random_seed=7, save_checkpoints_steps=100),
                              warm_start_from=export)
    estimator.train(lambda: digits["train_input_fn"]({"batch_size": 32}), steps=5)
    _, kinds = _first_checkpoint_kinds(model_dir,
                                       os.path.join(export, "variables", "variables"))
    expected = fixture("warm_start.json")["warm_start_from=<SavedModel export dir>"]
    assert kinds == expected["variables_in_first_checkpoint"]


def test_best_exporter_bookkeeping(est, digits, tmp_path):
    model_dir = str(tmp_path / "best")
    estimator = digits["build_estimator"](script_flags(digits, model_dir))
    estimator.train(digits["train_input_fn"], steps=2)
    checkpoint = estimator.latest_checkpoint()
    with tf.Graph().as_default():
        evaluation.write_dict_to_summary(estimator.eval_dir(), {"loss": np.float32(0.5)}, 2)
    best = est.BestExporter(serving_input_receiver_fn=digits["serving_input_receiver_fn"],
                            exports_to_keep=1)
    path = os.path.join(model_dir, "export", best.name)
    first = best.export(estimator, path, checkpoint, {"loss": 0.7}, False)
    assert first is not None  # the first export of a process always happens (as 2.15)
    assert best.export(estimator, path, checkpoint, {"loss": 0.9}, False) is None
    import time
    time.sleep(1.1)
    third = best.export(estimator, path, checkpoint, {"loss": 0.3}, False)
    assert third is not None and os.listdir(path) == [os.path.basename(third.decode())]
    assert best._best_eval_result == {"loss": 0.3}


def test_export_outputs_all_keeps_2_15s_signatures(est, digits, tmp_path):
    model_dir = str(tmp_path / "all")
    shutil.copytree(os.path.join(FIXTURES, "ckpt_digits"), model_dir)
    flags = script_flags(digits, model_dir, "--export_outputs=all", "--serving=handwritten")
    estimator = digits["build_estimator"](flags)
    export = estimator.export_saved_model(str(tmp_path / "exp"),
                                          digits["serving_input_receiver_fn"])
    name = ("export_outputs=all (PredictOutput classify + serving_default, "
            "ClassificationOutput, RegressionOutput), raw float receiver")
    theirs = _theirs(SIGNATURES["export_saved_model"][name])
    assert sorted(_signatures(export.decode())) == sorted(theirs) == ["classify",
                                                                      "serving_default"]
    assert {k: v[0] for k, v in _signatures(export.decode()).items()} == \
        {k: v[0] for k, v in theirs.items()}


def test_export_errors(est, digits, tmp_path):
    errors = SIGNATURES["errors"]
    estimator = digits["build_estimator"](script_flags(digits, str(tmp_path / "empty")))
    with pytest.raises(ValueError) as raised:
        estimator.export_saved_model(str(tmp_path / "e"), None)
    assert str(raised.value) == errors["serving_input_receiver_fn=None"]["message"]
    with pytest.raises(ValueError) as raised:
        estimator.export_saved_model(str(tmp_path / "e"), digits["serving_input_receiver_fn"])
    assert str(raised.value) == errors["no checkpoint in model_dir"]["message"].replace(
        "<work>/empty_model_dir", estimator.model_dir)
    with tf.Graph().as_default(), pytest.raises(ValueError) as raised:
        est.EstimatorSpec(est.ModeKeys.PREDICT, predictions={"p": tf.constant([1.0])},
                          export_outputs={"a": est.export.PredictOutput(tf.constant([1.0])),
                                          "b": est.export.PredictOutput(tf.constant([2.0]))})
    assert str(raised.value) == errors["two export_outputs, none serving_default"]["message"]
