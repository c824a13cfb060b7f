"""tf.estimator.MultiHead and tf.estimator.experimental.InMemoryEvaluatorHook against
tensorflow_estimator 2.15's, captured as fixtures.

tests/fixtures/canned215/multi_head.py and in_memory_evaluator.py ran under the real
2.15 (their JSON beside them); each test here runs the same function with
lowlevel.estimator aliased as tf.estimator, in this process, and compares: exception
types and messages, metric, prediction, export and variable names exactly, values to a
relative 1e-5. Why 1e-5: both sides build the same graph from the same seed (the DNN's
glorot draws, the linear model's zeros) and run the same kernels; on 2026-11-27 the
largest relative difference measured was 2.4e-7 (multi_head: the fixed-logits AUC) and
0.0 (in_memory_evaluator): 1e-5 leaves float32 rounding room, and a wrong weight, head
or step is far outside it.
"""

import importlib.util
import json
import os

import pytest

from estimator_support import HERE, estimator_alias

CANNED = os.path.join(HERE, "fixtures", "canned215")
REL = 1e-5


def _fixture(name):
    spec = importlib.util.spec_from_file_location(f"canned215_{name}",
                                                  os.path.join(CANNED, name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with open(os.path.join(CANNED, name + ".json")) as f:
        return module, json.load(f)


def _approx(value):
    """The fixture's value with every float compared to a relative REL (ints, str exact)."""
    if isinstance(value, dict):
        return {k: _approx(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_approx(v) for v in value]
    if isinstance(value, float):
        return pytest.approx(value, rel=REL, abs=1e-6)
    return value


@pytest.mark.timeout(60)
def test_multi_head_misuse_raises_2_15s_errors():
    """No heads, an unnamed head, head_weights of another length, heads whose
    loss_reduction differs, logits or labels missing a head, labels not a dict, a logits
    Tensor of the wrong width: 2.15's exception types and messages."""
    module, theirs = _fixture("multi_head")
    with estimator_alias():
        ours = module.errors()
    assert ours == theirs["errors"]
    assert len(ours) == 8 and all(ours.values())


@pytest.mark.timeout(60)
def test_multi_head_on_fixed_logits_gives_2_15s_loss_predictions_metrics_and_exports():
    """A binary + 3-class MultiHead, head_weights [1, 2], on fixed logits and labels: the
    merged loss (dict and split Tensor logits, with a regularization loss), the (head, key)
    predictions, EVAL metrics after one update (`loss/<head>`, `<metric>/<head>`,
    `regularization_loss/b_m`), TRAIN's keys and the merged export outputs."""
    module, theirs = _fixture("multi_head")
    with estimator_alias():
        ours = module.fixed()
    assert ours == _approx(theirs["fixed"])
    assert ours["loss"] == pytest.approx(0.3657135 + 2 * 0.4685794, rel=1e-6)


@pytest.mark.reference
@pytest.mark.timeout(120)
def test_dnn_estimator_with_a_multi_head_trains_evaluates_predicts_and_exports_as_2_15():
    """DNNEstimator(head=MultiHead([binary 'b', 3-class 'm'], [1, 2])), 60 steps, seed 42:
    checkpoint names (`training_2/Adagrad/...`, as 2.15 names them after two heads' scopes),
    shapes and dtypes; evaluate's keys and values; predictions; export signatures; the
    train loss summaries (`loss`, `loss/b`, `loss/m`). The DNN's own summary tags are left
    out: lowlevel's are `dnn/dnn/...` where 2.15's are `dnn/...` (dnn.py, every DNN)."""
    module, theirs = _fixture("multi_head")
    with estimator_alias():
        ours = module.dnn()
    theirs = dict(theirs["dnn"])
    for side in (ours, theirs):
        side["train_summary_tags"] = [t for t in side["train_summary_tags"]
                                      if t.startswith("loss")]
    assert ours == _approx(theirs)
    assert ours["train_summary_tags"] == ["loss", "loss/b", "loss/m"]
    assert ours["evaluate"]["loss"] == pytest.approx(
        ours["evaluate"]["loss/b"] + 2 * ours["evaluate"]["loss/m"], rel=1e-5)


@pytest.mark.reference
@pytest.mark.timeout(120)
def test_three_heads_in_a_wide_deep_estimator_name_and_evaluate_as_2_15():
    """MultiHead([multi-label with a weight column, 2-d regression, binary], [0.5, 1, 2]) in
    a DNNLinearCombinedEstimator (its Combined optimizer), 20 steps: the checkpoint's names
    (`training_3/Ftrl/...`, `training_3/Adagrad/...`) and evaluate. (The fixture's
    LinearEstimator run, the same names for Ftrl, is left out for time: it matched too.)"""
    module, theirs = _fixture("multi_head")
    with estimator_alias():
        ours = module.three_heads(kinds=("dnn_linear",))
    assert ours == _approx({"dnn_linear": theirs["three_heads"]["dnn_linear"]})
    assert "training_3/Ftrl/iter" in ours["dnn_linear"]["variables"]


@pytest.mark.reference
@pytest.mark.timeout(120)
def test_in_memory_evaluator_hook_evaluates_at_2_15s_steps_into_its_eval_dirs():
    """Two InMemoryEvaluatorHooks on a LinearRegressor over train(10) then train(3):
    every 4 iterations into eval/ (steps 0, 4, 8, 10, 10, 13) and every 3 with steps=2,
    name='mem' into eval_mem/ (0, 3, 6, 9, 10, 10, 13, 13); the same tags and losses,
    one events file each; and the constructor's errors (every_n_iter, steps, hooks, a
    distributed config)."""
    module, theirs = _fixture("in_memory_evaluator")
    with estimator_alias():
        ours = module.run()
    assert ours == _approx(theirs)
    assert [e["step"] for e in ours["eval"]["events"]] == [0, 4, 8, 10, 10, 13]
    assert ours["errors"]["distributed"]["message"] == (
        "InMemoryEvaluator supports only single machine (aka Local) setting.")


@pytest.mark.timeout(60)
def test_the_constructors_take_2_15s_arguments_with_its_defaults():
    """MultiHead(heads, head_weights=None) (canned.json's signature of 2.15's) and
    InMemoryEvaluatorHook(estimator, input_fn, steps=None, hooks=None, name=None,
    every_n_iter=100) (2.15's hooks.py); both reachable where 2.15 has them."""
    import inspect

    import lowlevel.estimator as estimator
    with open(os.path.join(CANNED, "canned.json")) as f:
        theirs = json.load(f)["constructor_signatures"]["MultiHead"]["parameters"]
    ours = list(inspect.signature(estimator.MultiHead.__init__).parameters.values())[1:]
    assert [(p.name, repr(p.default) if p.default is not p.empty else None) for p in ours] == \
        [(p["name"], p.get("default")) for p in theirs]
    hook = inspect.signature(estimator.experimental.InMemoryEvaluatorHook.__init__)
    assert [(p.name, p.default) for p in list(hook.parameters.values())[1:]] == [
        ("estimator", inspect.Parameter.empty), ("input_fn", inspect.Parameter.empty),
        ("steps", None), ("hooks", None), ("name", None), ("every_n_iter", 100)]
    assert issubclass(estimator.MultiHead, estimator.Head)
