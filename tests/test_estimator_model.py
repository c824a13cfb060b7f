"""lowlevel.estimator trains, evaluates, predicts and exports the reference model_fns in-process.

Side by side with tensorflow_estimator 2.15: the digits script's model_fn
(tests/estimator_scripts/digits_estimator.py, unmodified) gives the same
checkpoint variables as 2.15's checkpoint (ckpt_digits/), the same model_dir
layout (model_dir_layout.json), eval metric keys and types, export signatures
as 2.15's export (export_digits/), and only ops TF 2.15.1 knows
(tf215_ops.json.gz); 2.15's checkpoint restores and resumes; 2.15's export
loads and predicts in TF 2.21. Small runs (10 steps) keep this in the fast tier; the full-size run,
with exact counts and metrics, is tests/test_estimator_script.py's.
"""

import os
import re
import shutil

import numpy as np
import pytest
import tensorflow as tf
from estimator_support import FIXTURES, estimator_alias, fixture, load_script, script_flags
from tensorflow.core.protobuf import saved_model_pb2

v1 = tf.compat.v1
STEPS = 10


@pytest.fixture(scope="module")
def est():
    """lowlevel.estimator, aliased as tf.estimator for the scripts while the module runs."""
    with estimator_alias() as estimator:
        yield estimator


@pytest.fixture(scope="module")
def digits(est):
    """The digits script's globals (its model_fn, input_fns, receivers)."""
    return load_script("digits_estimator.py")


@pytest.fixture(scope="module")
def digits_run(digits, tmp_path_factory):
    """One train_and_evaluate of the digits script: 10 steps, checkpoints at 0 and 10."""
    model_dir = str(tmp_path_factory.mktemp("digits") / "model")
    out = digits["main"]([f"--model_dir={model_dir}", f"--max_steps={STEPS}",
                          "--save_checkpoints_steps=10", "--throttle_secs=0",
                          "--log_step_count_steps=10", "--save_summary_steps=10"])
    return model_dir, out


def _layout(model_dir):
    """Relative paths with step numbers and timestamps normalised, as make_fixtures.py's."""
    names = set()
    for root, _, files in os.walk(model_dir):
        for name in files:
            rel = os.path.relpath(os.path.join(root, name), model_dir)
            rel = re.sub(r"/\d{10}/", "/<timestamp>/", rel)
            rel = re.sub(r"events\.out\.tfevents\..*", "events.out.tfevents.*", rel)
            rel = re.sub(r"model\.ckpt-\d+", "model.ckpt-<N>", rel)
            names.add(rel)
    return names


def test_train_and_evaluate_returns_2_15s_result_shape(digits_run):
    model_dir, out = digits_run
    assert out["metric_types"] == {"accuracy": "float32", "global_step": "int64",
                                   "loss": "float32"}
    assert out["metrics"]["global_step"] == STEPS
    assert out["latest_checkpoint"] == os.path.join(model_dir, f"model.ckpt-{STEPS}")
    assert [p.split("/")[-2] for p in out["export_results"]] == \
        ["latest", "best_exporter", "final"]
    assert 0.1 < out["metrics"]["accuracy"] <= 1.0


def test_model_dir_layout_matches_2_15(digits_run):
    model_dir, _ = digits_run
    expected = fixture("model_dir_layout.json")["digits_estimator.py"]
    theirs = {re.sub(r"model\.ckpt-\d+", "model.ckpt-<N>", f) for f in expected["files"]}
    assert _layout(model_dir) == theirs
    steps = sorted(int(f.split("-")[1].split(".")[0]) for f in os.listdir(model_dir)
                   if f.startswith("model.ckpt-") and f.endswith(".index"))
    assert steps == [0, 10]
    assert sorted(os.listdir(os.path.join(model_dir, "export"))) == \
        sorted(expected["export_timestamp_dirs_per_exporter"])


def test_checkpoint_variables_match_2_15s_checkpoint(digits_run):
    model_dir, _ = digits_run
    ours = tf.train.list_variables(model_dir)
    theirs = tf.train.list_variables(os.path.join(FIXTURES, "ckpt_digits"))
    assert ours == theirs
    assert ("global_step", []) in ours and ("mlp/hidden/kernel/Adagrad", [64, 16]) in ours


def _saved_model(export_dir):
    proto = saved_model_pb2.SavedModel()
    with open(os.path.join(export_dir, "saved_model.pb"), "rb") as f:
        proto.ParseFromString(f.read())
    return proto


def _signatures(meta_graph):
    def tensors(infos):
        return {k: (v.dtype, [d.size for d in v.tensor_shape.dim]) for k, v in infos.items()}
    return {k: (s.method_name, tensors(s.inputs), tensors(s.outputs))
            for k, s in meta_graph.signature_def.items()}


def test_export_signatures_match_2_15s_export(digits_run):
    _, out = digits_run
    ours = _saved_model(out["export_results"][2]).meta_graphs
    theirs = _saved_model(os.path.join(FIXTURES, "export_digits")).meta_graphs
    assert len(ours) == len(theirs) == 1
    assert list(ours[0].meta_info_def.tags) == list(theirs[0].meta_info_def.tags) == ["serve"]
    assert _signatures(ours[0]) == _signatures(theirs[0])
    assert sorted(_signatures(ours[0])) == ["classify", "serving_default"]


def _graph_ops(meta_graph):
    nodes = list(meta_graph.graph_def.node)
    for function in meta_graph.graph_def.library.function:
        nodes.extend(function.node_def)
    return nodes


def test_export_uses_only_ops_and_attrs_tf_2_15_knows(digits_run):
    _, out = digits_run
    known = fixture("tf215_ops.json.gz")["ops"]
    unknown = []
    for export_dir in out["export_results"]:
        for node in _graph_ops(_saved_model(export_dir).meta_graphs[0]):
            if node.op not in known:
                unknown.append(node.op)
            else:
                unknown.extend(f"{node.op}.{a}" for a in node.attr
                               if a not in known[node.op]["attrs"] and not a.startswith("_"))
    assert unknown == []
    assert not any(n.device for n in _graph_ops(_saved_model(out["export_results"][0])
                                                 .meta_graphs[0]))


def test_2_15_export_loads_and_predicts_in_tf_2_21(digits):
    expected = fixture("ckpt_digits.json")["export_digits"]["expected_outputs"]
    _, (x, _) = digits["load_data"]()
    with tf.Graph().as_default(), v1.Session() as session:
        meta_graph = v1.saved_model.loader.load(session, ["serve"],
                                                os.path.join(FIXTURES, "export_digits"))
        signature = meta_graph.signature_def["serving_default"]
        values = session.run({k: v.name for k, v in signature.outputs.items()},
                             {signature.inputs["x"].name: x[:3]})
    assert values["classes"].tolist() == expected["classes"]
    np.testing.assert_allclose(values["probabilities"], expected["probabilities"], rtol=1e-5)


@pytest.fixture
def ckpt_copy(tmp_path):
    model_dir = str(tmp_path / "from215")
    shutil.copytree(os.path.join(FIXTURES, "ckpt_digits"), model_dir)
    return model_dir


def test_2_15_checkpoint_restores_and_training_resumes(digits, ckpt_copy):
    flags = script_flags(digits, ckpt_copy, "--save_checkpoints_steps=5")
    estimator = digits["build_estimator"](flags)
    expected = fixture("ckpt_digits.json")["expected_values"]
    for name, values in expected.items():
        value = estimator.get_variable_value(name)
        assert str(value.dtype) == values["dtype"] and list(np.shape(value)) == values["shape"]
        assert np.sum(value) == pytest.approx(values["sum"], rel=1e-6)
    assert sorted(estimator.get_variable_names())[0] == "global_step"
    assert estimator.train(digits["train_input_fn"], max_steps=300) is estimator
    assert estimator.latest_checkpoint().endswith("model.ckpt-300")
    estimator.train(digits["train_input_fn"], steps=5)
    assert estimator.latest_checkpoint().endswith("model.ckpt-305")
    assert estimator.get_variable_value("global_step") == 305


def test_evaluate_and_predict_after_training(digits, digits_run):
    model_dir, _ = digits_run
    estimator = digits["build_estimator"](script_flags(digits, model_dir))
    result = estimator.evaluate(digits["eval_input_fn"], steps=2, name="foo")
    assert sorted(result) == ["accuracy", "global_step", "loss"]
    assert (type(result["loss"]), type(result["global_step"])) == (np.float32, np.int64)
    assert os.listdir(os.path.join(model_dir, "eval_foo"))[0].startswith("events.out")
    predictions = list(estimator.predict(digits["predict_input_fn"]))
    assert len(predictions) == 297 and sorted(predictions[0]) == ["classes", "probabilities"]
    batches = list(estimator.predict(digits["predict_input_fn"], predict_keys=["classes"],
                                     yield_single_examples=False))
    assert len(batches) == 10 and list(batches[0]) == ["classes"]
    with pytest.raises(ValueError, match="Expected to run at least one output from"):
        next(estimator.predict(digits["predict_input_fn"], predict_keys=["nope"]))


def test_rerun_on_a_finished_model_dir_skips_training_as_2_15(digits, digits_run, caplog):
    model_dir, _ = digits_run
    theirs = fixture("train_and_evaluate.json")["rerun_on_finished_model_dir"]
    before = sorted(os.listdir(model_dir))
    with caplog.at_level("INFO", logger="tensorflow"):
        out = digits["main"]([f"--model_dir={model_dir}", f"--max_steps={STEPS}"])
    assert (out["metrics"], out["export_results"], out["return_is_none"]) == \
        (theirs["result"]["metrics"], theirs["result"]["export_results"], False)
    assert theirs["log_sequence"][0].split(":", 2)[2] in caplog.text
    assert sorted(os.listdir(model_dir)) == before
