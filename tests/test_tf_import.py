"""lowlevel/tf_import.py: a task imports TensorFlow without Keras, which it does not use.

TensorFlow 2.21 imports Keras 3 (and scikit-learn through it) eagerly: about half of
the import, ~3 s of CPU per task here. The trainer sets `TF_USE_LEGACY_KERAS=1` before
the import when `tf_keras` is absent, which skips it; a value the user set wins.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from lowlevel.tf_import import skip_keras

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What a task imports: TensorFlow through lowlevel.tf_import, then every module of its life
# (graph, training loop, evaluation, export, the wide & deep model, the CLI).
CHILD = """
import sys
from lowlevel.tf_import import import_tensorflow
tf = import_tensorflow()
import lowlevel.trainer, lowlevel.runtime.training, lowlevel.runtime.graph, lowlevel.runtime.loop
import lowlevel.runtime.evaluation, lowlevel.outputs.export, lowlevel.models.wide_deep, lowlevel.modes.local_sgd
tf.compat.v1.train.AdagradOptimizer(0.1)
print(sorted(m for m in ("keras", "sklearn") if m in sys.modules))
"""

needs_no_tf_keras = pytest.mark.skipif(importlib.util.find_spec("tf_keras") is not None,
                                       reason="tf_keras installed: Keras is not skipped")


@needs_no_tf_keras
def test_skip_keras_sets_the_variable_only_where_the_user_did_not():
    env: dict = {}
    assert skip_keras(env) and env == {"TF_USE_LEGACY_KERAS": "1"}
    env = {"TF_USE_LEGACY_KERAS": "0"}
    assert not skip_keras(env) and env == {"TF_USE_LEGACY_KERAS": "0"}


def _imported(env_value):
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    if env_value is not None:
        env["TF_USE_LEGACY_KERAS"] = env_value
    env["PYTHONPATH"] = ROOT
    proc = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip().splitlines()[-1]


@needs_no_tf_keras
@pytest.mark.cluster  # two Python processes importing TensorFlow
@pytest.mark.timeout(240)
def test_a_task_imports_no_keras_unless_the_user_asks_for_it():
    assert _imported(None) == "[]"
    assert "'keras'" in _imported("0")  # the user's value wins: Keras 3 as usual
