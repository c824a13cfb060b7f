"""The click-through models' SavedModel export, static and dynamic tables, from real 2 ps +
1 worker runs: plain TensorFlow in a fresh process scores the test split with it at the
chief's own test AUC (the dynamic tables' rows, and the default row of ids never admitted,
carried in the export), and what is not exported says so."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

import clusters
from lowlevel.data import ctr

VOCAB, BUCKETS, STEPS = 200000, 10000, 300
COMMON = ["--model=wide_deep", "--dataset=synthetic_ctr", f"--vocab_size={VOCAB}",
          f"--hash_buckets={BUCKETS}", "--num_ps=2", "--num_workers=1",
          f"--train_steps={STEPS}", "--save_checkpoint_steps=1000"]

SCORE = textwrap.dedent("""
    import json, sys
    import numpy as np
    import tensorflow as tf
    export_dir, split_path, out_path = sys.argv[1:4]
    split = np.load(split_path)
    serve = tf.saved_model.load(export_dir).signatures["serving_default"]
    out = serve(**{k: tf.constant(split[k]) for k in ("dense", "categorical", "crosses")})
    p, c = out["probabilities"].numpy(), out["classes"].numpy()
    assert p.dtype == np.float32 and p.shape == c.shape == (len(split["dense"]),), p.shape
    assert c.dtype == np.int64 and np.array_equal(c, (p > 0.5).astype(np.int64))
    np.save(out_path, p)
    print(json.dumps({"lowlevel": any(m.startswith("lowlevel") for m in sys.modules)}))
""")


def _launch(out, *flags):
    result = clusters.run([sys.executable, "-m", "lowlevel.launch", f"--output_dir={out}",
                           *COMMON, *flags], timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert not clusters.leftovers(out)
    return clusters.final_metrics(out)


@pytest.fixture(scope="module")
def test_split(tmp_path_factory):
    """(path of the test split's features as .npz, its labels)."""
    split = ctr.synthetic_ctr(VOCAB, BUCKETS).test
    path = tmp_path_factory.mktemp("ctr_split") / "test.npz"
    np.savez(path, dense=split.dense.astype(np.float32), categorical=split.categorical,
             crosses=split.crosses)
    return str(path), split.labels


def _served_auc(export_dir: str, split_path: str, labels, tmp_path) -> float:
    """Test AUC of the export, scored by a fresh process that cannot import lowlevel."""
    env = {k: v for k, v in clusters.ENV.items() if k != "PYTHONPATH"}
    out = tmp_path / "p.npy"
    result = subprocess.run([sys.executable, "-c", SCORE, export_dir, split_path, str(out)],
                            cwd=str(tmp_path), env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1])["lowlevel"] is False
    return float(roc_auc_score(labels, np.load(out)))


@pytest.mark.cluster  # starts trainer processes
@pytest.mark.timeout(420)
@pytest.mark.parametrize("embedding", ["static", "dynamic"])
def test_plain_tensorflow_serves_the_export_at_the_chiefs_test_auc(embedding, test_split,
                                                                   tmp_path):
    flags = (["--embedding=dynamic", "--dynamic_capacity=100000", "--admit_after=2"]
             if embedding == "dynamic" else [])
    metrics = _launch(tmp_path / "out", *flags)
    export_dir = metrics["export_dir"]
    assert export_dir == str(tmp_path / "out" / "export" / str(STEPS))
    with open(os.path.join(export_dir, "assets.extra", "lowlevel_export.json")) as f:
        meta = json.load(f)
    assert meta["embedding"] == embedding and meta["global_step"] == STEPS
    assert len(meta["field_names"]) == 26 and meta["num_dense"] == 13
    if embedding == "dynamic":  # rows on both ps (test ids without one read the default row)
        assert len(metrics["dynamic_rows"]) == 4 and min(metrics["dynamic_rows"].values()) > 0
    served = _served_auc(export_dir, *test_split, tmp_path)
    # The same rows and the same arithmetic as the chief's final evaluation.
    assert abs(served - metrics["auc"]) <= 1e-5, (served, metrics["auc"])
    assert metrics["auc"] >= 0.75

    # lowlevel.predict scores image models; on this export it says what to do instead.
    result = clusters.run([sys.executable, "-m", "lowlevel.predict",
                           f"--export_dir={tmp_path / 'out'}"], timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "a click-through model (synthetic_ctr)" in result.stderr
    assert "dense, categorical and crosses" in result.stderr


@pytest.mark.timeout(300)
def test_a_model_over_the_export_limit_is_not_exported_and_leaves_nothing(tmp_path,
                                                                          monkeypatch):
    import tensorflow as tf
    from lowlevel.config import TrainConfig
    from lowlevel.models import catalogue
    from lowlevel.outputs import export
    v1 = tf.compat.v1
    config = TrainConfig(model="wide_deep", dataset="synthetic_ctr", vocab_size=1000,
                         hash_buckets=100)
    data = ctr.synthetic_ctr(1000, 100)
    graph = tf.Graph()
    with graph.as_default():
        step = v1.train.get_or_create_global_step()
        catalogue.for_config(config, data)(data.probe_inputs())
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(step.assign(7))
            path = v1.train.Saver().save(sess, str(tmp_path / "model.ckpt"), global_step=7)
    base = str(tmp_path / "export")
    monkeypatch.setattr(export, "MAX_EXPORT_BYTES", 1000)
    assert export.export(path, base, config, data) is None
    assert not os.path.exists(base) or os.listdir(base) == []
    monkeypatch.undo()
    assert export.export(path, base, config, data) == os.path.join(base, "7")


@pytest.mark.cluster  # starts trainer processes
@pytest.mark.timeout(420)
def test_dynamic_tables_of_two_ps_evaluate_standalone_and_refuse_one_ps(tmp_path):
    """The evaluator (no server) builds as many shards as the checkpoint holds and scores it
    as the chief does; a restart with fewer ps tasks stops with a line instead of restoring
    half the rows (before: the evaluator restored shard 0 only, test AUC 0.733 for the
    chief's 0.796, and said nothing)."""
    from lowlevel import output_layout
    out = tmp_path / "out"
    dynamic = ["--embedding=dynamic", "--dynamic_capacity=100000", "--keep_exports=0"]
    metrics = _launch(out, *dynamic, "--evaluator", "--save_checkpoint_steps=100")
    with open(output_layout.eval_records(str(out), False)) as f:
        final = [r for r in json.load(f) if r["global_step"] == STEPS][0]
    assert abs(final["auc"] - metrics["auc"]) <= 1e-6, (final, metrics["auc"])
    assert final["dynamic_rows"] == metrics["dynamic_rows"]

    result = clusters.run([sys.executable, "-m", "lowlevel.launch", f"--output_dir={out}",
                           *COMMON[:4], "--num_ps=1", "--num_workers=1",
                           f"--train_steps={2 * STEPS}", *dynamic], timeout=300)
    assert result.returncode != 0
    assert "holds dynamic embedding tables in 2 shards" in result.stdout + result.stderr
    assert "--num_ps=2" in result.stdout + result.stderr
    assert clusters.final_metrics(out)["global_step"] == STEPS  # nothing trained over it
