"""The SavedModel export of a real 1 ps + 2 worker run (with an evaluator exporting each
checkpoint it evaluates), loaded by plain TensorFlow in a fresh process, shown by
saved_model_cli, scored by `python -m lowlevel.predict`."""

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import clusters
from lowlevel import errors
from lowlevel.data import images as data_lib

TRAIN_STEPS = 600


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A finished run: (output_dir, final metrics, launcher output)."""
    out = tmp_path_factory.mktemp("export_run") / "out"
    argv = [sys.executable, "-m", "lowlevel.launch", f"--output_dir={out}", "--evaluator",
            "--export_every_checkpoint", "--keep_exports=2", f"--train_steps={TRAIN_STEPS}",
            "--save_checkpoint_steps=200", "--log_every_secs=1"]
    result = clusters.run(argv, timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert not clusters.leftovers(out)
    return str(out), clusters.final_metrics(out), result.stdout


def _predict(*flags, timeout=120):
    return clusters.run([sys.executable, "-m", "lowlevel.predict", *flags], timeout=timeout)


@pytest.mark.cluster  # starts trainer processes
@pytest.mark.timeout(300)
def test_export_is_complete_numbered_and_pruned(run):
    out, metrics, stdout = run
    final = os.path.join(out, "export", str(TRAIN_STEPS))
    assert metrics["export_dir"] == final and metrics["global_step"] == TRAIN_STEPS
    names = os.listdir(os.path.join(out, "export"))
    assert all(n.isdigit() for n in names), names  # no temporary left behind
    assert str(TRAIN_STEPS) in names and len(names) <= 2, names  # --keep_exports=2
    for name in names:
        assert os.path.isfile(os.path.join(out, "export", name, "saved_model.pb"))
        assert os.path.isdir(os.path.join(out, "export", name, "variables"))
    with open(os.path.join(final, "assets.extra", "lowlevel_export.json")) as f:
        meta = json.load(f)
    assert meta["global_step"] == TRAIN_STEPS and meta["dataset"] == "digits"
    assert meta["image_shape"] == [8, 8, 1] and meta["max_value"] == 16
    # The evaluator saw to an export of each checkpoint it evaluated
    # (--export_every_checkpoint): it wrote it, or found the chief's (a fast run's
    # evaluator may see only the final checkpoint, which the chief exports too).
    evaluator = "\n".join(line for line in stdout.splitlines() if line.startswith("[evaluator0]"))
    evaluated = set(re.findall(r"evaluator: step (\d+) \|", evaluator))
    # (the export's number is the checkpoint's global step, as the evaluator's)
    exported = set(re.findall(r"exported model\.ckpt-\d+ as SavedModel \S+/export/(\d+) ",
                              evaluator)) | set(
        re.findall(r"export \S+/export/(\d+) exists already", evaluator))
    assert evaluated and evaluated <= exported, evaluator


@pytest.mark.cluster  # starts trainer processes
@pytest.mark.timeout(300)
def test_plain_tensorflow_loads_the_export_at_the_chiefs_accuracy(run, tmp_path):
    out, metrics, _ = run
    test = data_lib.load_digits().test
    np.savez(tmp_path / "test.npz", images=test.images.astype(np.float32),
             labels=test.labels)
    script = textwrap.dedent(f"""
        import json, sys
        import numpy as np
        import tensorflow as tf
        split = np.load({str(tmp_path / 'test.npz')!r})
        model = tf.saved_model.load({metrics['export_dir']!r})
        serve = model.signatures["serving_default"]
        out = serve(images=tf.constant(split["images"]))
        p, c = out["probabilities"].numpy(), out["classes"].numpy()
        assert p.dtype == np.float32 and p.shape == (len(c), 10), (p.dtype, p.shape)
        assert c.dtype == np.int64 and np.allclose(p.sum(axis=1), 1, atol=1e-5)
        print(json.dumps({{"accuracy": float(np.mean(c == split["labels"])),
                          "lowlevel": any(m.startswith("lowlevel") for m in sys.modules)}}))
    """)
    # A fresh process that cannot import lowlevel: not on its path, run elsewhere.
    env = {k: v for k, v in clusters.ENV.items() if k != "PYTHONPATH"}
    result = subprocess.run([sys.executable, "-c", script], cwd=str(tmp_path), env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    assert loaded["lowlevel"] is False
    assert abs(loaded["accuracy"] - metrics["accuracy"]) <= 0.005, (loaded, metrics)
    assert metrics["accuracy"] >= 0.9


@pytest.mark.cluster  # starts trainer processes
@pytest.mark.timeout(120)
def test_saved_model_cli_lists_the_signature(run):
    _, metrics, _ = run
    cli = shutil.which("saved_model_cli", path=os.path.dirname(sys.executable))
    assert cli, "saved_model_cli is installed with tensorflow"
    result = subprocess.run([cli, "show", "--all", "--dir", metrics["export_dir"]],
                            capture_output=True, text=True, timeout=100)
    assert result.returncode == 0, result.stderr[-2000:]
    text = result.stdout
    assert "signature_def['serving_default']" in text
    assert "inputs['images']" in text and "shape: (-1, 8, 8, 1)" in text
    assert "outputs['probabilities']" in text and "shape: (-1, 10)" in text
    assert "outputs['classes']" in text and "DT_INT64" in text


@pytest.mark.cluster  # starts trainer processes
@pytest.mark.timeout(200)
def test_predict_scores_the_test_split_and_files(run, tmp_path):
    out, metrics, _ = run
    # The test split of the run's data set, from the run's output_dir (newest export).
    result = _predict(f"--export_dir={out}", f"--output={tmp_path / 'test.csv'}")
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["global_step"] == TRAIN_STEPS and report["num_examples"] == 360
    assert abs(report["accuracy"] - metrics["accuracy"]) <= 0.005, (report, metrics)
    rows = (tmp_path / "test.csv").read_text().splitlines()
    assert rows[0].startswith("class,probability,p0,") and rows[0].endswith(",label")
    assert len(rows) == 361
    # A file of inputs: the same images, flat, as CSV; and as .npy [N, H, W].
    test = data_lib.load_digits().test
    flat = test.images.reshape(len(test), -1)
    np.savetxt(tmp_path / "in.csv", flat[:50], fmt="%d", delimiter=",")
    np.save(tmp_path / "in.npy", test.images[:50, :, :, 0])
    classes = {}
    for name in ("in.csv", "in.npy"):
        result = _predict(f"--export_dir={metrics['export_dir']}",
                          f"--input={tmp_path / name}", f"--output={tmp_path / name}.out")
        assert result.returncode == 0, result.stderr[-3000:]
        assert json.loads(result.stdout.strip().splitlines()[-1])["num_examples"] == 50
        lines = (tmp_path / f"{name}.out").read_text().splitlines()[1:]
        classes[name] = [int(line.split(",")[0]) for line in lines]
    assert classes["in.csv"] == classes["in.npy"]
    expected = [int(line.split(",")[0]) for line in rows[1:51]]
    assert classes["in.csv"] == expected


@pytest.mark.cluster  # starts trainer processes
@pytest.mark.timeout(200)
def test_predict_wrong_input_is_one_line_and_status_2(run, tmp_path):
    _, metrics, _ = run
    np.save(tmp_path / "shape.npy", np.zeros((4, 5, 5), np.float32))
    np.save(tmp_path / "dtype.npy", np.array([["x"] * 64] * 2))
    (tmp_path / "ragged.csv").write_text("1,2,3\n4,5\n")
    cases = {"shape.npy": "images of shape [4, 5, 5]; expected [N, 8, 8, 1]",
             "dtype.npy": "images of dtype <U1; expected numbers",
             "ragged.csv": "lines of [2, 3] values"}
    for name, needle in cases.items():
        result = _predict(f"--export_dir={metrics['export_dir']}",
                          f"--input={tmp_path / name}", f"--output={tmp_path / 'x.csv'}")
        assert result.returncode == 2, (name, result.stderr[-2000:])
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("lowlevel.predict: error: --input="), \
            result.stderr
        assert needle in lines[0], lines[0]
        assert not (tmp_path / "x.csv").exists()


def _checkpoints(directory, steps):
    """Checkpoints of the digits MLP (as training writes them) at `steps`; their paths."""
    import tensorflow as tf

    from lowlevel.models import catalogue as models
    v1 = tf.compat.v1
    paths = []
    with tf.Graph().as_default():
        step = v1.train.get_or_create_global_step()
        models.build("mlp", tf.zeros([1, 8, 8, 1]), 10, (128, 128))
        saver = v1.train.Saver()
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            for s in steps:
                sess.run(step.assign(s))
                paths.append(saver.save(sess, os.path.join(directory, "model.ckpt"),
                                        global_step=s))
    return paths


@pytest.mark.timeout(120)
def test_export_keeps_the_newest_and_leaves_nothing_half_written(tmp_path):
    from lowlevel.config import TrainConfig
    from lowlevel.outputs import export
    digits = data_lib.load_digits()
    paths = _checkpoints(str(tmp_path), [10, 20, 30])
    base = str(tmp_path / "export")
    for path in paths:
        export.export(path, base, TrainConfig(), digits, keep=2)
    assert sorted(os.listdir(base)) == ["20", "30"]
    before = os.stat(os.path.join(base, "30", "saved_model.pb")).st_mtime_ns
    assert export.export(paths[-1], base, TrainConfig(), digits, keep=2) == \
        os.path.join(base, "30")  # already there: left as it is
    assert os.stat(os.path.join(base, "30", "saved_model.pb")).st_mtime_ns == before
    shutil.rmtree(os.path.join(base, "30"))
    with pytest.raises(errors.CheckpointMismatch):  # fails half-way: nothing is left
        export.export(paths[-1], base, TrainConfig(model="cnn"), digits, keep=2)
    assert sorted(os.listdir(base)) == ["20"]
    assert export.exports(base) == [os.path.join(base, "20")]


@pytest.mark.cluster  # starts trainer processes
@pytest.mark.timeout(200)
def test_a_finished_run_without_an_export_gets_one_when_restarted(tmp_path):
    out = tmp_path / "out"

    def trainer(*flags):
        return clusters.run([sys.executable, "-m", "lowlevel.trainer", f"--output_dir={out}",
                             "--train_steps=50", *flags], timeout=120)

    first = trainer("--keep_exports=0")
    assert first.returncode == 0, first.stderr[-3000:]
    assert not (out / "export").exists() and "export_dir" not in clusters.final_metrics(out)
    again = trainer()
    assert again.returncode == 0, again.stderr[-3000:]
    assert "nothing to train" in again.stderr
    metrics = json.loads(again.stdout.strip().splitlines()[-1])
    assert metrics["export_dir"] == str(out / "export" / "50")
    assert os.path.isfile(out / "export" / "50" / "saved_model.pb")
