"""Every public name of tensorflow_estimator 2.15's `tf.estimator` (v2) and
`tf.compat.v1.estimator` (v1), walked into their submodules by the real 2.15
(tests/fixtures/estimator215/public_names.json), resolves in `lowlevel.estimator` with the
public methods and properties 2.15's class has, or is in docs/estimator.md's list of
names not provided, with its reason. And the v1 logit_fn builders build 2.15's variables."""

import json
import os
import re

import pytest
import tensorflow as tf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAMES = json.load(open(os.path.join(ROOT, "tests", "fixtures", "estimator215",
                                    "public_names.json")))
LOGIT_FNS = json.load(open(os.path.join(ROOT, "tests", "fixtures", "canned215",
                                        "logit_fns.json")))
DOCS = os.path.join(ROOT, "docs", "estimator.md")
v1 = tf.compat.v1


def _not_provided() -> dict:
    """{name: reason} of docs/estimator.md's "Not provided" list ("- `name`: reason")."""
    text = open(DOCS).read()
    section = text.split("#### Not provided", 1)[1].split("\n#", 1)[0]
    return {m.group(1): m.group(2) for m in re.finditer(r"^- `([\w.]+)`: (.+)$", section, re.M)}


def _resolve(name):
    import lowlevel.estimator as obj
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


@pytest.mark.timeout(60)
@pytest.mark.parametrize("version", ["v2", "v1"])
def test_every_public_name_resolves_or_is_listed_as_not_provided(version):
    listed = _not_provided()
    missing = []
    for name in NAMES[version]:
        try:
            _resolve(name)
        except AttributeError:
            if name not in listed and name.split(".")[0] not in listed:
                missing.append(name)
    assert not missing, missing
    assert all(len(reason) > 20 for reason in listed.values()), listed
    provided = [n for n in listed if _resolvable(n)]
    assert not provided, f"listed as not provided but present: {provided}"


def _resolvable(name) -> bool:
    try:
        _resolve(name)
        return True
    except AttributeError:
        return False


@pytest.mark.timeout(60)
@pytest.mark.parametrize("version", ["v2", "v1"])
def test_every_class_has_2_15s_public_methods_and_properties(version):
    listed = _not_provided()
    lacking = {}
    for name, members in NAMES["classes"][version].items():
        if name in listed or name.split(".")[0] in listed:
            continue
        cls = _resolve(name)
        want = members["methods"] + members["properties"] + members["attributes"]
        gone = [m for m in want if not hasattr(cls, m)]
        if gone:
            lacking[name] = gone
    assert not lacking, lacking


@pytest.mark.timeout(60)
def test_the_v1_logit_fn_builders_build_2_15s_variables():
    import lowlevel.estimator as estimator
    exp = estimator.experimental

    def features():
        return {"x": tf.ones([2, 3]), "c": tf.constant([[1], [4]], tf.int64)}

    def variables():
        return sorted([v.op.name, v.shape.as_list()] for v in v1.global_variables())

    columns = [tf.feature_column.numeric_column("x", shape=[3]),
               tf.feature_column.indicator_column(
                   tf.feature_column.categorical_column_with_identity("c", 5))]
    with tf.Graph().as_default():
        fn = exp.dnn_logit_fn_builder(3, [4, 2], columns, tf.nn.relu, None, None, False)
        with v1.variable_scope("dnn"):
            logits = fn(features=features(), mode="train")
        assert variables() == LOGIT_FNS["dnn"]["variables"]
        assert logits.shape.as_list() == LOGIT_FNS["dnn"]["logits_shape"]
    with tf.Graph().as_default():
        fn = exp.linear_logit_fn_builder(2, [tf.feature_column.numeric_column("x", shape=[3]),
                                             tf.feature_column.categorical_column_with_identity(
                                                 "c", 5)])
        with v1.variable_scope("linear"):
            logits = fn(features=features())
        assert variables() == LOGIT_FNS["linear"]["variables"]
        assert logits.shape.as_list() == LOGIT_FNS["linear"]["logits_shape"]
    with pytest.raises(ValueError) as raised:
        exp.dnn_logit_fn_builder(2.0, [4], columns, tf.nn.relu, None, None, False)
    assert str(raised.value) == LOGIT_FNS["units_error"]
