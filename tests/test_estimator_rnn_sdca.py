"""RNNClassifier / RNNEstimator and LinearSDCA against tensorflow_estimator 2.15's.

tests/fixtures/canned215/rnn_sdca.py ran each variant on the real 2.15 (seeded
synthetic sequences / a linear problem, 200 RNN steps, 30 SDCA steps) and Keras
2's cells on fixed weights; here the same variants run on lowlevel.estimator in this
process. The checkpoint's variable names, shapes and dtypes, evaluate()'s keys and
predict()'s keys, dtypes and shapes must be 2.15's exactly. Values: SDCA is
deterministic given the batches, so its metrics match 2.15's closely; the RNNs draw
their initial weights from other random streams (and 2.15 itself differs run to run
there: rnn_lstm_int_binary gave accuracy 0.71 and 0.83), so only the range is
compared. The cells' math is compared exactly (to float rounding) on fixed weights.
`return_sequences=True` (the rnn_seq_* variants, 2.15's SequentialHeadWrapper): the
same names and keys; the reductions over the valid steps are checked exactly on what
depends on the data only (label/mean, loss / average_loss = the mean weight of the
valid steps), and the wrapper itself against 2.15's on fixed logits (`seq_heads`).
"""

import importlib.util
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from estimator_support import HERE
from lowlevel.errors import LegacyKerasMissing
from lowlevel.estimator.canned import rnn
from lowlevel.estimator.canned import sequential_head as seq_head

CANNED = os.path.join(HERE, "fixtures", "canned215")


def _reference():
    spec = importlib.util.spec_from_file_location(
        "canned215_rnn_sdca", os.path.join(CANNED, "rnn_sdca.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


REF = _reference()
with open(REF.OUT) as _f:
    FIXTURE = json.load(_f)
RNN_VARIANTS = sorted(n for n in REF.VARIANTS if n.startswith("rnn"))
SDCA_VARIANTS = sorted(n for n in REF.VARIANTS if n.startswith("sdca"))


HAS_TF_KERAS = importlib.util.find_spec("tf_keras") is not None
NEEDS_TF_KERAS = pytest.mark.skipif(
    not HAS_TF_KERAS, reason="rnn_cell_fn takes Keras 2 cells: pip install -e '.[legacy-keras]'")


def _run(name, model_dir):
    import lowlevel.estimator as estimator  # given to the script: no tf.estimator alias needed
    return REF.run(tf, estimator, name, str(model_dir))


def _same_interface(name, ours):
    theirs = FIXTURE["variants"][name]
    assert ours["variables"] == theirs["variables"]
    assert sorted(ours["evaluate"]) == sorted(theirs["evaluate"])
    assert ours["predict"] == theirs["predict"]
    return theirs


@pytest.mark.timeout(30)
@pytest.mark.parametrize("case", sorted(REF.CELL_CASES))
def test_cells_compute_keras2s_masked_recurrence(case):
    """Keras 2's SimpleRNN / LSTM / GRU (reset_after) cells and a stacked pair, on the
    same weights, inputs and mask: lowlevel's TF1 cells give the same last output."""
    x, lengths = REF.cell_inputs()
    expected = np.array(FIXTURE["cells"][case]["output"])
    with tf.Graph().as_default():
        cells = [(kind, *[tf.constant(np.array(w, np.float32)) for w in weights])
                 for kind, weights in zip(REF.CELL_CASES[case],
                                          FIXTURE["cells"][case]["weights"])]
        out = rnn.run_cells(cells, tf.constant(x), tf.constant(lengths))
        with tf.compat.v1.Session() as sess:
            got = sess.run(out)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.timeout(30)
def test_a_padded_step_keeps_the_last_output():
    """A sequence of length 2 padded to 4 ends with its step-2 output (Keras' masking)."""
    x, _ = REF.cell_inputs()
    weights = REF.cell_weights("gru", 3, 3, np.random.RandomState(0))
    with tf.Graph().as_default():
        cells = [("gru", *[tf.constant(w) for w in weights])]
        padded = rnn.run_cells(cells, tf.constant(x[1:]), tf.constant([2]))
        cut = rnn.run_cells(cells, tf.constant(x[1:, :2]), tf.constant([2]))
        with tf.compat.v1.Session() as sess:
            a, b = sess.run([padded, cut])
    np.testing.assert_allclose(a, b, rtol=1e-6)
    assert np.abs(a).sum() > 0


@pytest.mark.timeout(30)
def test_a_named_optimizer_clips_each_gradient_to_norm_5():
    """2.15's `optimizer.clipnorm = 5.0` for a name: SGD at 0.05 on a gradient of norm 100
    moves the variable by 0.05 * 5, not 0.05 * 100; an optimizer object is not clipped."""
    with tf.Graph().as_default():
        var = tf.compat.v1.get_variable("w", initializer=[0.0, 0.0], use_resource=True)
        loss = tf.reduce_sum(var * tf.constant([60.0, 80.0]))
        step = tf.compat.v1.train.get_or_create_global_step()
        opt = rnn.rnn_optimizer("SGD")
        train = opt.minimize(loss, global_step=step)
        plain = rnn.rnn_optimizer(tf.compat.v1.train.GradientDescentOptimizer(0.05))
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(train)
            moved = sess.run(var)
    np.testing.assert_allclose(moved, [-0.05 * 3.0, -0.05 * 4.0], rtol=1e-5)
    assert opt.get_name() == "SGD" and not isinstance(plain, rnn._ClipNorm)


@pytest.mark.reference
@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", [pytest.param(n, marks=NEEDS_TF_KERAS) if "cell_fn" in n
                                  else n for n in RNN_VARIANTS])
def test_rnn_matches_215(name, tmp_path):
    """Names, keys, shapes as 2.15's; accuracy (loss for the regression) in 2.15's range:
    not 0.2 below its run, not below the majority class (2.15's own runs of one variant
    spread over 0.71-0.96)."""
    ours = _run(name, tmp_path)
    theirs = _same_interface(name, ours)["evaluate"]
    assert ours["evaluate"]["global_step"] == REF.STEPS
    if "accuracy" in theirs:
        assert ours["evaluate"]["accuracy"] >= theirs["accuracy"] - 0.2, ours["evaluate"]
        if "accuracy_baseline" in theirs:
            assert ours["evaluate"]["accuracy"] >= theirs["accuracy_baseline"] - 0.01
    else:  # 2.15's own runs spread 2x (rnn_seq_estimator_regression: 0.0078 to 0.0156)
        bound = max(2 * theirs["average_loss"], _half_constant_loss(name))
        assert ours["evaluate"]["average_loss"] <= bound, ours["evaluate"]
    if "_seq_" in name:
        _check_valid_step_reduction(name, ours["evaluate"], theirs)


def _half_constant_loss(name):
    """A sequence regression's: half the loss of predicting the mean label (the variance
    over the valid steps, 0.046; 2.15's runs reach 0.17-0.34 of it); else 0."""
    if "_seq_" not in name:
        return 0.0
    _, (labels, mask) = REF.data(REF.VARIANTS[name][1])
    return 0.5 * float(labels[mask].var())


def _check_valid_step_reduction(name, ours, theirs):
    """What the sequential head's reduction over the valid steps fixes from the data alone
    (the eval batch is the whole set): label/mean the (weighted) mean label of the valid
    steps, loss / average_loss their mean weight (1 unweighted: the loss divides by the
    number of valid steps, average_loss by their total weight), accuracy_baseline."""
    feats, (labels, mask) = REF.data(REF.VARIANTS[name][1])
    weighted = "weight_column" in REF.VARIANTS[name][2]
    w = feats["w"][0][mask] if weighted else np.ones(mask.sum(), np.float32)
    label_mean = float((labels[mask] * w).sum() / w.sum())
    for got in (ours, theirs):
        if "label/mean" in got:  # not a multi-class head's
            assert got["label/mean"] == pytest.approx(label_mean, rel=1e-5)
        assert got["loss"] / got["average_loss"] == pytest.approx(float(w.mean()), rel=1e-5)
        if "accuracy_baseline" in got:
            assert got["accuracy_baseline"] == pytest.approx(max(label_mean, 1 - label_mean),
                                                             rel=1e-5)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", sorted(REF.SEQ_HEAD_CASES))
def test_sequential_head_matches_215s_on_fixed_logits(case):
    """SequentialHeadWrapper (2.15's, recorded) and lowlevel's on the same logits, labels
    (dense or sparse), mask and weights: EVAL loss, loss(), every metric and every
    prediction (dtype, shape, values) agree to float rounding."""
    import lowlevel.estimator as estimator
    theirs = FIXTURE["seq_heads"][case]
    ours = REF.seq_head_probe(tf, estimator, [case])[case]
    for key in ("loss", "head_loss"):
        assert ours[key] == pytest.approx(theirs[key], rel=1e-5)
    assert sorted(ours["metrics"]) == sorted(theirs["metrics"])
    for key, value in theirs["metrics"].items():
        assert ours["metrics"][key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    assert sorted(ours["predict"]) == sorted(theirs["predict"])
    for key, (dtype, shape, values) in theirs["predict"].items():
        assert ours["predict"][key][:2] == [dtype, shape], key
        if dtype in ("object", "bool") or dtype.startswith("int"):
            assert ours["predict"][key][2] == values, key
        else:
            np.testing.assert_allclose(ours["predict"][key][2], values, rtol=1e-5, atol=1e-6)


@pytest.mark.reference
@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", SDCA_VARIANTS)
def test_linear_sdca_matches_215(name, tmp_path):
    """Names (with the `_unshrunk` copies and the dual-state table) and keys as 2.15's; the
    same solver on the same batches, so the metrics agree closely."""
    ours = _run(name, tmp_path)
    theirs = _same_interface(name, ours)["evaluate"]
    for key in ("accuracy", "auc"):  # (the random order: runs agree to ~0.005 here)
        if key in theirs:
            assert ours["evaluate"][key] == pytest.approx(theirs[key], abs=0.02)
    # SDCA visits the examples in a random order and its kernel updates the weights from
    # several threads at once (2.15's too), so the regressor's converged loss is a draw
    # from a long-tailed spread. 12 runs each (2026-11-29; 2.15: `rnn_sdca.py --variant
    # sdca_regressor` 12 times): 2.15 1.4e-4..2.7e-3, lowlevel 1.5e-4..9.6e-4;
    # a loaded CI machine gave lowlevel 2.9e-3. All are under 0.1 % of the labels'
    # variance (3.5); the bound, 1e-2, is 0.3 % of it (an unconverged or wrong solver is
    # far above: the labels' variance itself is the loss of predicting their mean)
    assert ours["evaluate"]["average_loss"] == pytest.approx(theirs["average_loss"],
                                                             rel=0.3, abs=1e-2)
    if name == "sdca_classifier_l1":  # the chief's hook: weights = shrink(unshrunk, l1/l2)
        reader = tf.train.load_checkpoint(str(tmp_path))
        for var in ("bias_weights", "cat/weights", "x1/weights", "x2/weights"):
            w = reader.get_tensor(f"linear/linear_model/{var}")
            u = reader.get_tensor(f"linear/linear_model/{var}_unshrunk")
            np.testing.assert_allclose(w, np.sign(u) * np.maximum(0.0, np.abs(u) - 0.1),
                                       atol=1e-6)


@pytest.mark.timeout(30)
def test_rnn_refuses_what_it_does_not_build():
    """One-line errors at construction (2.15's): return_sequences with a head that is not
    sequential, rnn_cell_fn with units, an unknown cell_type; the sequential head's own
    (a MultiHead, a mask key or weight column not a str)."""
    import lowlevel.estimator as estimator
    cols = REF.columns(tf, "seq")
    exp = estimator.experimental
    with pytest.raises(ValueError, match="must be a `_SequentialHead` object"):
        exp.RNNEstimator(estimator.RegressionHead(), cols, units=[4], return_sequences=True)
    with pytest.raises(ValueError, match="`MultiHead` is not supported"):
        seq_head.SequentialHeadWrapper(estimator.MultiHead(
            [estimator.RegressionHead(name="a"), estimator.RegressionHead(name="b")]))
    with pytest.raises(TypeError, match="`sequence_mask` column must be a string"):
        seq_head.SequentialHeadWrapper(estimator.RegressionHead(), sequence_length_mask=3)
    with pytest.raises(TypeError, match="Column must a string"):  # 2.15's: a NumericColumn
        exp.RNNClassifier(cols, units=[4], return_sequences=True,
                          weight_column=tf.feature_column.numeric_column("w"))
    with pytest.raises(ValueError, match="must not be specified when using rnn_cell_fn"):
        exp.RNNClassifier(cols, units=[4], rnn_cell_fn=lambda: None)
    with pytest.raises(ValueError, match="Supported strings are"):
        exp.RNNClassifier(cols, units=[4], cell_type="transformer")


@pytest.mark.timeout(30)
@pytest.mark.skipif(HAS_TF_KERAS, reason="tf-keras is installed: rnn_cell_fn runs")
def test_rnn_cell_fn_without_tf_keras_names_the_extra():
    """Without Keras 2 a user's cell cannot be built: one line naming the extra."""
    import lowlevel.estimator as estimator
    with pytest.raises(LegacyKerasMissing, match=r"pip install -e '\.\[legacy-keras\]'") as err:
        estimator.experimental.RNNClassifier(REF.columns(tf, "seq"), rnn_cell_fn=lambda: None)
    assert "\n" not in str(err.value)


@pytest.mark.timeout(30)
def test_linear_sdca_refuses_what_2_15_refused():
    """2.15's constructor checks with a LinearSDCA, and its L2 check when training."""
    import lowlevel.estimator as estimator
    cols = REF.columns(tf, "linear")
    sdca = estimator.experimental.LinearSDCA(example_id_column="example_id")
    with pytest.raises(ValueError, match="multi-class"):
        estimator.LinearClassifier(cols, n_classes=3, optimizer=sdca)
    with pytest.raises(ValueError, match='sparse_combiner must be "sum"'):
        estimator.LinearClassifier(cols, optimizer=sdca, sparse_combiner="mean")
    with pytest.raises(ValueError, match="one-dimensional label"):
        estimator.LinearRegressor(cols, label_dimension=2, optimizer=sdca)
    with pytest.raises(ValueError, match="should be positive"):
        estimator.experimental.LinearSDCA("example_id",
                                          symmetric_l2_regularization=0.0).check()


@pytest.mark.timeout(120)
def test_rnn_export_serves_its_predictions(tmp_path):
    """export_saved_model with the sequence columns' parse spec (VarLenFeature): the loaded
    `predict` signature gives predict()'s probabilities on the same 3 examples."""
    import lowlevel.estimator as estimator
    feats, labels = REF.data("binary")
    est = REF.build(tf, estimator, "rnn_simple_binary", str(tmp_path / "model"))
    train_fn, _, predict_fn = REF.make_inputs(tf, feats, labels)
    est.train(train_fn, steps=5)
    predicted = [p["logistic"][0] for p in est.predict(predict_fn)]
    served, _ = _serve(est, tmp_path, feats, "logistic", with_ctx=True)
    np.testing.assert_allclose(served.ravel(), predicted, rtol=1e-5)


def _serve(est, tmp_path, feats, output: str, with_ctx: bool):
    """(`output` of the exported `predict` signature for the first 3 rows of `feats`, served
    from tf.Examples; the signature's output names)."""
    import lowlevel.estimator as estimator
    columns = REF.columns(tf, "seq") + (REF.columns(tf, "ctx") if with_ctx else [])
    path = est.export_saved_model(str(tmp_path / "export"),
                                  estimator.export.build_parsing_serving_input_receiver_fn(
                                      tf.feature_column.make_parse_example_spec(columns)))
    (tokens, mask), (price, _) = feats["tokens"], feats["price"]

    def example(i):
        feature = {"tokens": tf.train.Feature(int64_list=tf.train.Int64List(
                       value=tokens[i][mask[i]])),
                   "price": tf.train.Feature(float_list=tf.train.FloatList(
                       value=price[i][mask[i]]))}
        if with_ctx:
            feature["ctx"] = tf.train.Feature(float_list=tf.train.FloatList(
                value=feats["ctx"][i]))
        return tf.train.Example(features=tf.train.Features(feature=feature))
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        sig = tf.compat.v1.saved_model.load(sess, ["serve"], path).signature_def["predict"]
        served = sess.run(sig.outputs[output].name, {sig.inputs["examples"].name: [
            example(i).SerializeToString() for i in range(3)]})
    return served, set(sig.outputs)


@pytest.mark.timeout(120)
def test_rnn_sequences_predict_every_step_and_export(tmp_path):
    """return_sequences=True: predict() gives each step's predictions and the mask; a step
    after the sequence's end repeats its last output (Keras' masking), and the last valid
    step's logits are those of return_sequences=False on the same checkpoint; a mask in the
    features is used as given; the exported `predict` signature serves the same
    probabilities (`[batch, time, 2]`, without the mask, as 2.15's PredictOutput)."""
    import lowlevel.estimator as estimator
    feats, labels = REF.data("seq_binary")
    model_dir = str(tmp_path / "model")
    kwargs = dict(sequence_feature_columns=REF.columns(tf, "seq"), units=[5],
                  cell_type="gru", model_dir=model_dir)
    est = estimator.experimental.RNNClassifier(return_sequences=True, **kwargs)
    train_fn, _, predict_fn = REF.make_inputs(tf, feats, labels)
    est.train(train_fn, steps=3)
    steps = list(est.predict(predict_fn))
    last = list(estimator.experimental.RNNClassifier(**kwargs).predict(predict_fn))
    lengths = feats["tokens"][1][:3].sum(axis=1)
    for step, whole, n in zip(steps, last, lengths):
        np.testing.assert_array_equal(step["sequence_mask"], np.arange(lengths.max()) < n)
        assert step["probabilities"].shape == (lengths.max(), 2)
        np.testing.assert_allclose(step["logits"][n - 1], whole["logits"], rtol=1e-5)
        np.testing.assert_allclose(step["logits"][n:], np.repeat(step["logits"][n - 1:n],
                                                                 lengths.max() - n, 0))

    def masked_fn():  # a given mask: every step valid
        return predict_fn().map(lambda f: {**f, "sequence_mask": tf.ones(
            tf.stack([tf.shape(f["ctx"])[0], tf.cast(f["tokens"].dense_shape[1], tf.int32)]),
            tf.bool)})
    assert all(p["sequence_mask"].all() for p in est.predict(masked_fn))
    served, outputs = _serve(est, tmp_path, feats, "probabilities", with_ctx=False)
    assert "sequence_mask" not in outputs
    np.testing.assert_allclose(served, np.stack([p["probabilities"] for p in steps]),
                               rtol=1e-5)
