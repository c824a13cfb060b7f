"""The canned estimators against tensorflow_estimator 2.15's, captured as fixtures.

tests/fixtures/canned215/make_fixtures.py ran every canned estimator of 2.15 (and the
variants: weight column, label vocabulary, dropout, batch norm, sparse combiner, label
dimension 2) on the same iris data, columns, seed and steps; each test here runs the
same variant on lowlevel.estimator, in this process, and compares what a user sees:
the checkpoint's variables (names, shapes, dtypes: a 2.15 model_dir must restore), the
evaluation's metric keys and values, the prediction keys, dtypes and shapes, and the
export's signatures. Values: 2.15 and lowlevel build the same graph from the same seed,
so most agree to float rounding; the tolerances say where they may not.
"""

import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import clusters
import prefork
from estimator_support import HERE, SCRIPTS, estimator_alias
from lowlevel.estimator.canned import optimizers as canned_optimizers

CANNED = os.path.join(HERE, "fixtures", "canned215")
ROOT = os.path.dirname(HERE)


def _reference():
    spec = importlib.util.spec_from_file_location(
        "canned215_make_fixtures", os.path.join(CANNED, "make_fixtures.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


REF = _reference()
FIXTURE = REF.load_json(os.path.join(CANNED, "canned.json"))["estimators"]
# Variants whose metric values may drift from 2.15's beyond float rounding: their random
# draws (dropout's masks) or batch statistics (batch norm's moving averages: 2.15's Keras
# layer updates the moving variance with the unbiased batch variance) differ.
LOOSE = {"dnn_classifier_3_dropout", "dnn_classifier_3_batch_norm"}


def _run(name, model_dir, export_base):
    """Trains, evaluates, predicts and exports the variant as make_fixtures did."""
    _, cls_name, kind, kwargs, _ = [v for v in REF.VARIANTS if v[0] == name][0]
    feats, labels = REF.iris_data(kind)
    kw = {k: REF.columns(tf, v) if k.endswith("feature_columns") else v
          for k, v in kwargs.items()}
    if cls_name.startswith("Baseline"):
        all_cols = REF.columns(tf, "one")
    else:
        all_cols = [c for k in sorted(kwargs) if k.endswith("feature_columns")
                    for c in REF.columns(tf, kwargs[k])]
    with estimator_alias() as estimator:
        est = getattr(estimator, cls_name)(
            model_dir=str(model_dir), config=estimator.RunConfig(tf_random_seed=REF.SEED), **kw)
        train_fn, eval_fn, predict_fn = REF.make_inputs(tf, feats, labels)
        est.train(train_fn, steps=REF.STEPS)
        evaluated = est.evaluate(eval_fn)
        predicted = list(est.predict(predict_fn))
        receiver = estimator.export.build_parsing_serving_input_receiver_fn(
            tf.feature_column.make_parse_example_spec(all_cols))
        exported = est.export_saved_model(str(export_base), receiver)
    return est, evaluated, predicted, exported


def _variables(model_dir):
    reader = tf.train.load_checkpoint(str(model_dir))
    dtypes = reader.get_variable_to_dtype_map()
    return sorted((n, s, dtypes[n].name) for n, s in reader.get_variable_to_shape_map().items())


def _close(name, key, ours, theirs):
    if name in LOOSE or key == "global_step":
        tolerance = 0.15 if key not in ("label/mean", "accuracy_baseline", "global_step") \
            else 1e-6
    else:
        tolerance = 2e-3
    return math.isclose(ours, theirs, rel_tol=tolerance, abs_tol=tolerance)


def _assert_results_like(name, ref, evaluated, predicted):
    """evaluate()'s keys and values, predict()'s keys, dtypes and shapes, as 2.15's `ref`."""
    assert sorted(evaluated) == ref["evaluate_keys"]
    far = {k: (float(evaluated[k]), v["value"]) for k, v in ref["evaluate"].items()
           if not _close(name, k, float(evaluated[k]), v["value"])}
    assert not far, far
    assert sorted(predicted[0]) == ref["predict"]["keys"]
    for key, want in ref["predict"]["per_key"].items():
        got = np.asarray(predicted[0][key])
        assert (got.dtype.name, list(got.shape)) == (want["dtype"], want["shape"]), key


@pytest.mark.reference
@pytest.mark.parametrize("name", REF.VARIANT_NAMES)
def test_a_canned_estimator_matches_2_15(name, tmp_path):
    ref = FIXTURE[name]
    est, evaluated, predicted, exported = _run(name, tmp_path / "model", tmp_path / "export")

    assert _variables(tmp_path / "model") == sorted(
        (v["name"], v["shape"], v["dtype"]) for v in ref["variables"])
    hypers = {f"training/{opt}/{k}": v for opt, values in
              ref["optimizer_hyper_parameters"].items() for k, v in values.items()}
    assert {k: float(tf.train.load_variable(str(tmp_path / "model"), k)) for k in hypers} == \
        pytest.approx(hypers)  # the default learning rates among them
    _assert_results_like(name, ref, evaluated, predicted)
    assert _summary_tags(tmp_path / "model") == ref["train_summary_tags"]
    assert _summary_tags(tmp_path / "model" / "eval") == ref["eval_summary_tags"]
    for ours, theirs in zip(predicted, ref["predict"]["first_3"]):
        for key in ("classes", "all_classes"):
            if key in theirs:
                assert [c.decode() for c in np.ravel(ours[key])] == theirs[key], key

    want = ref["export"]["loaded"]["saved_model"]["meta_graphs"][0]["signature_defs"]
    assert _signatures(exported) == {
        key: (sig["method_name"], {k: v["dtype"] for k, v in sig["inputs"].items()},
              {k: v["dtype"] for k, v in sig["outputs"].items()}) for key, sig in want.items()}


def _summary_tags(directory) -> dict:
    """{tag: "simple_value" | "histo" | "tensor"} of the summaries in `directory`'s event files
    (not its subdirectories), as make_fixtures records them."""
    tags = {}
    for path in directory.glob("events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                tags[value.tag] = value.WhichOneof("value")
    return tags


def _signatures(export_dir) -> dict:
    """{signature: (method name, {input: dtype}, {output: dtype})} of an export's
    saved_model.pb (read as a protocol buffer: loading the model costs a second here)."""
    from tensorflow.core.framework import types_pb2
    from tensorflow.core.protobuf import saved_model_pb2
    export_dir = export_dir.decode() if isinstance(export_dir, bytes) else export_dir
    model = saved_model_pb2.SavedModel()
    with open(os.path.join(export_dir, "saved_model.pb"), "rb") as f:
        model.ParseFromString(f.read())
    name = types_pb2.DataType.Name
    return {key: (sig.method_name, {k: name(v.dtype) for k, v in sig.inputs.items()},
                  {k: name(v.dtype) for k, v in sig.outputs.items()})
            for key, sig in model.meta_graphs[0].signature_def.items()}

HEADS = REF.load_json(os.path.join(CANNED, "heads.json"))["heads"]


def _head_model_fn(head, columns):
    """make_fixtures' `head_model_fn` on TensorFlow 2.21: a zero-initialised dense logits
    layer (its `tf.compat.v1.layers.dense` needs tf-keras here) and Adagrad(0.05) with 2.15's
    Keras names (its `tf.keras.optimizers.legacy.Adagrad` needs tf-keras too)."""
    def model_fn(features, labels, mode):
        net = tf.compat.v1.feature_column.input_layer(features, columns)
        with tf.compat.v1.variable_scope("logits"):
            kernel = tf.compat.v1.get_variable("kernel", [net.shape[-1], head.logits_dimension],
                                               initializer=tf.compat.v1.zeros_initializer())
            bias = tf.compat.v1.get_variable("bias", [head.logits_dimension],
                                             initializer=tf.compat.v1.zeros_initializer())
        return head.create_estimator_spec(
            features=features, mode=mode, logits=tf.matmul(net, kernel) + bias, labels=labels,
            optimizer=canned_optimizers.Adagrad(0.05),
            trainable_variables=tf.compat.v1.trainable_variables())
    return model_fn


@pytest.mark.reference
@pytest.mark.parametrize("name", sorted(HEADS))
def test_a_head_in_a_users_model_fn_matches_2_15(name, tmp_path):
    ref = HEADS[name]
    _, kwargs, kind = [h for h in REF.HEADS if h[0] == name][0]
    feats, labels = REF.head_data(kind)
    columns = [tf.feature_column.numeric_column(k) for k in sorted(feats)]
    with estimator_alias() as estimator:
        head = getattr(estimator, name)(**kwargs)
        est = estimator.Estimator(_head_model_fn(head, columns), model_dir=str(tmp_path),
                                  config=estimator.RunConfig(tf_random_seed=REF.SEED))
        train_fn, eval_fn, predict_fn = REF.make_inputs(tf, feats, labels)
        est.train(train_fn, steps=REF.HEAD_STEPS)
        evaluated = est.evaluate(eval_fn)
        predicted = list(est.predict(predict_fn))
    assert sorted(n for n, _, _ in _variables(tmp_path)) == sorted(
        v["name"] for v in ref["variables"])
    _assert_results_like(name, ref, evaluated, predicted)
    attributes = {k: repr(getattr(head, k)) for k in ref["attributes"]}
    assert attributes == ref["attributes"]


# Unmodified scripts under `python -m lowlevel.estimator`, as a user runs them (processes).
RUNS = REF.load_json(os.path.join(CANNED, "runs.json"))["scripts"]
MODEL_DIRS = os.path.join(CANNED, "model_dirs")
MOVIELENS = os.path.join(ROOT, "data", "ml-100k")


def _script(script, *args, timeout=300):
    """(exit status, RESULT dict or None, output) of SCRIPT under lowlevel.estimator."""
    env = dict(clusters.ENV)
    env.pop("TF_CONFIG", None)
    done = prefork.run([sys.executable, "-m", "lowlevel.estimator",
                        os.path.join(SCRIPTS, script), *args], env=env, timeout=timeout)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    result = json.loads(lines[-1][len("RESULT "):]) if lines else None
    return done.returncode, result, done.stdout + done.stderr


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_the_premade_estimator_tutorial_runs_unmodified_with_2_15s_results(tmp_path):
    """TensorFlow's premade-estimator tutorial (DNNClassifier on iris): the same accuracy,
    loss and predictions as 2.15's run of the same script (runs.json), to float rounding."""
    code, result, output = _script("premade_iris.py", f"--model_dir={tmp_path}")
    assert code == 0, output[-3000:]
    theirs = RUNS["premade_iris.py"]["runs"][0]["result"]
    assert result["eval"] == pytest.approx(theirs["eval"], rel=2e-3)
    assert result["predicted_class_ids"] == theirs["predicted_class_ids"]
    assert np.allclose(result["probabilities"], theirs["probabilities"], atol=2e-3)
    assert 'Prediction is "Setosa"' in output


@pytest.mark.cluster
@pytest.mark.timeout(300)
@pytest.mark.parametrize("script,model_dir,args", [
    ("premade_iris.py", "dnn_iris", ["--train_steps=100"]),
    ("wide_deep_movielens.py", "wide_deep",
     ["--max_steps=300", "--batch_size=64", f"--data_dir={MOVIELENS}"]),
])
def test_a_2_15_canned_model_dir_resumes(script, model_dir, args, tmp_path):
    """A model_dir 2.15 left at step 200 (its checkpoint only) trains on to the next step
    target: every variable of 2.15's checkpoint (weights, optimizer slots and
    hyper-parameters, FTRL's own step count) is restored, none is new."""
    if script.startswith("wide_deep"):
        got = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "get_movielens"),
                              MOVIELENS], check=False, capture_output=True, text=True,
                             timeout=300)
        assert got.returncode == 0, got.stderr
    shutil.copytree(os.path.join(MODEL_DIRS, model_dir), tmp_path / "model")
    code, result, output = _script(script, f"--model_dir={tmp_path / 'model'}", *args)
    assert code == 0, output[-3000:]
    assert "Restoring parameters from" in output and "model.ckpt-200" in output
    assert result["global_step"] == 300
    theirs = {v["name"] for v in REF.load_json(
        os.path.join(MODEL_DIRS, f"{model_dir}.json"))["variables"]}
    assert {n for n, _, _ in _variables(tmp_path / "model")} == theirs
    if script.startswith("wide_deep"):  # FTRL's own count went on from 2.15's
        assert tf.train.load_variable(str(tmp_path / "model"), "training/Ftrl/iter") == 300


@pytest.mark.cluster
@pytest.mark.timeout(120)
@pytest.mark.parametrize("case,flags,want", [
    ("unknown optimizer", ["--optimizer=Nope"], "Unsupported optimizer name: Nope."),
    ("n_classes 1", ["--n_classes=1"], "n_classes must be > 2: 1."),
    ("a categorical column in the DNN", ["--categorical_in_dnn"],
     "Items of feature_columns must be a"),
])
def test_bad_canned_arguments_end_the_script_with_one_line_and_status_1(case, flags, want,
                                                                        tmp_path):
    code, _, output = _script("canned_errors.py", f"--model_dir={tmp_path}", *flags)
    assert code == 1, output[-3000:]
    assert want in output


def test_a_large_embedding_and_its_linear_weights_are_split_across_the_ps_tasks_by_bytes(
        tmp_path):
    """With 2 ps tasks (RunConfig.num_ps_replicas), a table over 64 MiB (2.15's min slice)
    is split into one slice per ps, and the runtime's placement by bytes puts the slices on
    different ps tasks; each slice's Adagrad accumulator is saved under 2.15's full name
    `training/Adagrad/<table>/accumulator`, so partitioned and unpartitioned checkpoints
    load into each other."""
    from types import SimpleNamespace

    from lowlevel.estimator.canned import dnn, heads
    from lowlevel.runtime import placement
    rows, width = 1_100_000, 16  # 70.4 MB of float32
    ids = tf.feature_column.categorical_column_with_hash_bucket("id", rows)
    columns = [tf.feature_column.embedding_column(ids, width)]
    config = SimpleNamespace(num_ps_replicas=2)

    def build():
        tf.compat.v1.train.get_or_create_global_step()
        features = {"id": tf.constant([["a"], ["b"]])}
        dnn.dnn_model_fn(features, tf.constant([[0], [1]]), "train", heads.BinaryClassHead(),
                         [4], columns, config=config)

    sizes, _ = placement.measure(build)
    table = "dnn/input_from_feature_columns/input_layer/id_embedding/embedding_weights"
    assert {n: b for n, b in sizes.items() if n.startswith(table)} == {
        f"{table}/part_0": rows // 2 * width * 4, f"{table}/part_1": rows // 2 * width * 4}
    cluster = {"ps": ["ps0:2222", "ps1:2222"], "worker": ["w0:2222"]}
    with tf.Graph().as_default():
        with tf.compat.v1.device(placement.device_setter(cluster, 0, 0, sizes)):
            build()
        devices = {v.op.name: v.device for v in tf.compat.v1.global_variables()}
        slots = {v.op.name: v._save_slice_info.full_name  # noqa: SLF001
                 for v in tf.compat.v1.global_variables()
                 if v.op.name.endswith("/accumulator") and table in v.op.name}
    assert {devices[f"{table}/part_0"], devices[f"{table}/part_1"]} == {
        "/job:ps/task:0/device:CPU:0", "/job:ps/task:1/device:CPU:0"}
    assert slots == {f"training/Adagrad/{table}/part_{i}/accumulator":
                     f"training/Adagrad/{table}/accumulator" for i in (0, 1)}


# Where lowlevel answers differently from 2.15, and why (docs/estimator.md).
ERRORS_THAT_DIFFER = {
    "baseline_two_features": "2.15 fails on its own uninitialised iterator; here it trains",
    "optimizer_v1_train_optimizer": "accepted here: the runtime takes a TF1 optimizer over",
    "head_with_v1_train_optimizer": "the fixture's model_fn uses tf.compat.v1.layers",
    "head_with_keras_new_optimizer": "the fixture's model_fn uses tf.compat.v1.layers",
    "optimizer_legacy_keras_instance": "tf.keras.optimizers.legacy needs tf-keras on 2.21",
    # The case itself reaches for tf.keras or tf.losses (Keras 3 on TensorFlow 2.21, which a
    # test process may have set to tf-keras): what fails is the script's line, not ours.
    "optimizer_keras_new_instance": "tf.keras.optimizers.Adagrad in the case",
    "optimizer_keras_new_callable": "tf.keras.optimizers.Adagrad in the case",
    "loss_reduction_NONE": "tf.losses.Reduction in the case",
    "head_loss_reduction_NONE": "tf.losses.Reduction in the case",
}


@pytest.mark.reference
def test_bad_arguments_fail_as_in_2_15_at_the_same_call(tmp_path, monkeypatch):
    """make_fixtures' error cases (an unknown optimizer, n_classes 1, an unwrapped
    categorical column, labels out of range, ...) run here: each fails at the same call
    (constructor or train) with the same exception type as 2.15's, or succeeds as it did."""
    monkeypatch.setattr(REF, "HERE", str(tmp_path))  # its errors.json goes there
    with estimator_alias():
        monkeypatch.setattr(REF, "_tf", lambda: tf)
        REF.probe_errors(str(tmp_path))
    ours = REF.load_json(str(tmp_path / "errors.json"))["cases"]
    theirs = REF.load_json(os.path.join(CANNED, "errors.json"))["cases"]

    def outcome(row):
        at = row.get("raised_at")
        return at, row[at]["type"].rsplit(".", 1)[-1] if at else None

    differ = {k: (outcome(theirs[k]), outcome(ours[k])) for k in theirs
              if k not in ERRORS_THAT_DIFFER and outcome(theirs[k]) != outcome(ours[k])}
    assert not differ, differ
    assert len(theirs) - len(ERRORS_THAT_DIFFER) >= 35


SIGNATURES = REF.load_json(os.path.join(CANNED, "canned.json"))["constructor_signatures"]
# Arguments lowlevel takes beyond 2.15's v2 ones, always after them: 2.15's v1 argument
# `input_layer_partitioner` (the "honoured"), and `warm_start_from` on
# DNNLinearCombinedEstimator (its classifier and regressor have it in 2.15).
EXTRA = {"input_layer_partitioner", "warm_start_from"}


@pytest.mark.parametrize("name", sorted(set(SIGNATURES) - {"RunConfig"}))
def test_a_constructor_takes_2_15s_arguments_in_order_with_its_defaults(name):
    import inspect

    import lowlevel.estimator as estimator
    ours = list(inspect.signature(getattr(estimator, name).__init__).parameters.values())[1:]
    theirs = SIGNATURES[name]["parameters"]
    assert [p.name for p in ours[:len(theirs)]] == [p["name"] for p in theirs]
    assert {p.name for p in ours[len(theirs):]} <= EXTRA
    for mine, their in zip(ours, theirs):
        if "default" not in their:
            assert mine.default is inspect.Parameter.empty, mine
        elif their.get("default_function"):
            assert f"{mine.default.__module__}.{mine.default.__qualname__}".endswith(
                their["default_function"].rsplit(".", 1)[-1]), (mine, their)
        else:
            assert repr(mine.default) == their["default"], (name, mine.name)


@pytest.mark.reference
def test_the_head_based_estimators_train_through_any_head(tmp_path):
    """DNNEstimator with a MultiLabelHead, LinearEstimator with a PoissonRegressionHead,
    DNNLinearCombinedEstimator with a RegressionHead, BaselineEstimator with a weighted
    BinaryClassHead (its batch size read from the head's weight column): each trains,
    evaluates with its head's metric keys and predicts with its head's keys."""
    feats, labels = REF.head_data("multilabel")
    columns = [tf.feature_column.numeric_column(k) for k in sorted(feats)]
    counts = REF.head_data("poisson")[1]
    binary = REF.head_data("binary")[1]
    with estimator_alias() as estimator:
        cases = [
            (estimator.DNNEstimator(estimator.MultiLabelHead(3), [8], columns,
                                    model_dir=str(tmp_path / "dnn")), feats, labels,
             "MultiLabelHead"),
            (estimator.LinearEstimator(estimator.PoissonRegressionHead(), columns,
                                       model_dir=str(tmp_path / "linear")), feats, counts,
             "PoissonRegressionHead"),
            (estimator.DNNLinearCombinedEstimator(
                estimator.RegressionHead(), model_dir=str(tmp_path / "dlc"),
                linear_feature_columns=columns, dnn_feature_columns=columns,
                dnn_hidden_units=[4]), feats, counts, "RegressionHead"),
            (estimator.BaselineEstimator(estimator.BinaryClassHead(weight_column="w"),
                                         model_dir=str(tmp_path / "baseline")),
             dict(feats, w=np.ones(len(binary), np.float32)), binary, "BinaryClassHead"),
        ]
        for est, x, y, head in cases:
            train_fn, eval_fn, predict_fn = REF.make_inputs(tf, x, y)
            est.train(train_fn, steps=20)
            assert sorted(est.evaluate(eval_fn)) == HEADS[head]["evaluate_keys"], head
            assert sorted(next(iter(est.predict(predict_fn)))) == \
                HEADS[head]["predict"]["keys"], head


def test_the_parse_example_specs_are_2_15s():
    """classifier_/regressor_parse_example_spec on the arguments of
    tests/fixtures/canned215/parse_specs.py: the same specs and errors as 2.15's."""
    spec = importlib.util.spec_from_file_location(
        "canned215_parse_specs", os.path.join(CANNED, "parse_specs.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.out == REF.load_json(os.path.join(CANNED, "parse_specs.json"))


@pytest.mark.reference
def test_add_metrics_adds_a_metric_as_2_15_does():
    """tf.estimator.add_metrics on a LinearRegressor: the added metric among the model's own,
    its value 2.15's (to float rounding), the same model_dir, 2.15's error for a metric_fn
    with another argument."""
    spec = importlib.util.spec_from_file_location(
        "canned215_add_metrics", os.path.join(CANNED, "add_metrics.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with estimator_alias():
        ours = module.run()
    theirs = REF.load_json(os.path.join(CANNED, "add_metrics.json"))
    assert ours == dict(theirs, mae=pytest.approx(theirs["mae"], rel=1e-5))
