"""Scripts in TF1's own namespace (`import tensorflow as tf`, `tf.train.Server`, `tf.app.run`,
`tf.contrib...`) under `python -m lowlevel` (lowlevel.tf1_namespace): the rule that decides,
from a script's text, which scripts get `tf.compat.v1` for their `import tensorflow`; the
import it gives them; the `tf.contrib` table against contrib's own formulas; the one-line
error of any other `tf.contrib` name. Then, as real processes: the Distributed TensorFlow
guide's skeleton as printed, 1 ps + 2 workers, every task exiting 0; a script using
`tf.contrib.slim`, exit status 1 and one line naming it.
"""

import glob
import math
import os
import sys

import numpy as np
import pytest

import clusters
from lowlevel import errors
from lowlevel import tf1_namespace as ns
from test_tf1_programs import _assert_ran_to_the_end, _start

import tensorflow as tf

v1 = tf.compat.v1
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(os.path.dirname(__file__), "tf1_scripts")
SKELETON_TF1 = os.path.join(SCRIPTS, "skeleton_tf1.py")
SLIM_LINE = ("tf.contrib.slim is not in TensorFlow 2.21: use the tf_slim package "
             "(pip install tf-slim; import tf_slim as slim)")


# --- the rule ---------------------------------------------------------------------------


def test_the_guides_skeleton_is_found_to_be_tf1_by_its_names_in_order():
    names = ns.tf1_names(open(SKELETON_TF1).read())
    assert names == ["tf.get_variable", "tf.contrib.layers.xavier_initializer",
                     "tf.train.Server", "tf.train.replica_device_setter",
                     "tf.contrib.framework.get_or_create_global_step",
                     "tf.train.AdagradOptimizer", "tf.train.StopAtStepHook",
                     "tf.train.MonitoredTrainingSession", "tf.app.run"], names


@pytest.mark.parametrize("source, expected", [
    ("import tensorflow as tf\nx = tf.placeholder(tf.float32)\n", ["tf.placeholder"]),
    ("import tensorflow as tf\ns = tf.Session()\ny = tf.log(x)\n", ["tf.Session", "tf.log"]),
    ("import tensorflow\nserver = tensorflow.train.Server(c)\n", ["tensorflow.train.Server"]),
    ("import tensorflow as t1\ndef f():\n    return t1.contrib.anything\n", ["t1.contrib.anything"]),
    ("from tensorflow import placeholder\n", ["from tensorflow import placeholder"]),
    ("from tensorflow.contrib import slim\n", ["from tensorflow.contrib import slim"]),
    ("from tensorflow.contrib.layers import xavier_initializer\n",
     ["from tensorflow.contrib.layers import xavier_initializer"]),
    ("import tensorflow as tf\ntf.app.run(main)\ntf.app.run(main)\n", ["tf.app.run"]),
])
def test_a_name_tensorflow_2_21_lacks_but_tf1_has_makes_the_script_tf1(source, expected):
    assert ns.tf1_names(source) == expected


@pytest.mark.parametrize("source", [
    # TF 2.21's own namespace, as an Estimator or a TF2 script writes it
    "import tensorflow as tf\nds = tf.data.Dataset.from_tensor_slices(x).batch(2)\n"
    "tf.feature_column.numeric_column('x')\nlayer = tf.keras.layers.Dense(3)\n",
    # the migrated forms
    "import tensorflow.compat.v1 as tf\ntf.disable_v2_behavior()\nx = tf.placeholder(tf.float32)\n",
    "import tensorflow as tf\nx = tf.compat.v1.placeholder(tf.float32)\n",
    "import tensorflow.compat.v1\ntensorflow.compat.v1.train.Server(c)\n",
    "from tensorflow.compat.v1 import placeholder\n",
    # a lazily loaded module is not loaded to decide: present
    "import tensorflow as tf\nl = tf.losses.sparse_softmax_cross_entropy\n",
    # a name in neither namespace is the script's error, not TF1's
    "import tensorflow as tf\ntf.no_such_function()\n",
    # another module's `tf`, and text that does not parse
    "import numpy as tf\ntf.placeholder\n",
    "import tensorflow as tf\ndef (:\n",
])
def test_a_script_without_tf1_names_keeps_tensorflows_namespace(source):
    assert ns.tf1_names(source) == []


def test_no_script_or_module_of_the_repository_but_the_tf1_skeleton_is_switched():
    """The Estimator scripts, the user models, the migrated TF1 scripts, the benchmarks and
    the package itself all use TF 2.21's namespace (or tf.compat.v1 by that name)."""
    paths = [p for top in ("lowlevel", "tests", "benchmarks", "scripts")
             for p in glob.glob(os.path.join(ROOT, top, "**", "*.py"), recursive=True)]
    assert len(paths) > 100
    switched = [os.path.relpath(p, ROOT) for p in paths if ns.tf1_names(open(p).read(), p)]
    assert switched == [os.path.relpath(SKELETON_TF1, ROOT)]


def test_tf2_scripts_are_left_as_they_are(tmp_path):
    script = tmp_path / "tf2.py"
    script.write_text("import tensorflow as tf\nprint(tf.reduce_sum([1, 2]))\n")
    eager = tf.executing_eagerly()
    assert ns.prepare(str(script)) is None  # no globals, the mode untouched
    assert tf.executing_eagerly() == eager


# --- the import a TF1 script gets ---------------------------------------------------------


def _run(source: str) -> dict:
    """The globals of `source` run as the runner runs a TF1 script's module (without the
    switch to graph mode, which is process-wide)."""
    scope = ns.script_globals()
    exec(compile(source, "script.py", "exec"), scope)
    return scope


def test_import_tensorflow_gives_tf1s_namespace_in_every_form():
    got = _run("import tensorflow as tf\n"
               "from tensorflow import placeholder, Session, contrib\n"
               "import tensorflow.compat.v1 as tf1\n"
               "from tensorflow.compat.v1 import train\n"
               "from tensorflow.contrib.layers import l2_regularizer\n"
               "import tensorflow.python.ops.array_ops as array_ops\n"
               "from tensorflow.python.ops import math_ops\n"
               "import json\n"
               "def inner():\n"
               "    import tensorflow\n"
               "    return tensorflow\n")
    namespace = ns.tf1_namespace()
    assert got["tf"] is namespace and got["inner"]() is namespace
    assert got["placeholder"] is v1.placeholder and got["Session"] is v1.Session
    assert got["tf"].train is v1.train and got["tf"].train.Server is v1.train.Server
    assert got["tf"].app.run is v1.app.run and got["tf"].__version__ == tf.__version__
    assert got["contrib"] is namespace.contrib
    assert got["tf1"].placeholder is v1.placeholder and got["train"] is v1.train
    assert got["l2_regularizer"] is ns.l2_regularizer
    assert got["array_ops"].__name__ == "tensorflow.python.ops.array_ops"
    assert got["math_ops"].__name__ == "tensorflow.python.ops.math_ops"
    assert got["json"].__name__ == "json"
    assert not hasattr(v1, "contrib")  # tf.compat.v1 itself is untouched


# --- tf.contrib -------------------------------------------------------------------------


def test_the_contrib_global_step_functions_are_tf_compat_v1_trains():
    contrib = ns.tf1_namespace().contrib
    assert contrib.framework.get_or_create_global_step is v1.train.get_or_create_global_step
    assert contrib.framework.get_global_step is v1.train.get_global_step
    assert contrib.framework.create_global_step is v1.train.create_global_step
    assert contrib.layers.xavier_initializer_conv2d is ns.xavier_initializer
    assert sorted(dir(contrib)) == ["framework", "layers"]


def _values(*make):
    """The values of the tensors each of `make` builds, each in a graph of its own."""
    out = []
    for build in make:
        with tf.Graph().as_default():
            tensor = build()
            with v1.Session() as session:
                out.append(session.run(tensor))
    return out


@pytest.mark.parametrize("shape", [(64, 10), (3, 3, 8, 16)])
def test_xavier_and_variance_scaling_draw_contribs_distributions(shape):
    """Each initializer against contrib's formula (initializers.py, TF 1.15), drawn by the
    same random op with the same seed: fan_in/fan_out as contrib computes them; uniform in
    +-sqrt(3 * factor / n); a truncated normal of stddev sqrt(1.3 * factor / n)."""
    receptive = math.prod(shape[:-2])
    fan_in, fan_out = shape[-2] * receptive, shape[-1] * receptive
    avg = (fan_in + fan_out) / 2.0
    cases = [(ns.xavier_initializer(seed=7),
              lambda: v1.random_uniform(shape, -math.sqrt(3.0 / avg), math.sqrt(3.0 / avg),
                                        seed=7)),
             (ns.xavier_initializer(uniform=False, seed=7),
              lambda: v1.truncated_normal(shape, 0.0, math.sqrt(1.3 / avg), seed=7)),
             (ns.variance_scaling_initializer(seed=7),  # factor 2, FAN_IN, normal
              lambda: v1.truncated_normal(shape, 0.0, math.sqrt(1.3 * 2.0 / fan_in), seed=7)),
             (ns.variance_scaling_initializer(1.5, "FAN_OUT", uniform=True, seed=7),
              lambda: v1.random_uniform(shape, -math.sqrt(4.5 / fan_out),
                                        math.sqrt(4.5 / fan_out), seed=7))]
    for init, contrib in cases:
        mine, theirs = _values(lambda: init(list(shape)), contrib)
        np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-7)
    glorot, = _values(lambda: v1.glorot_uniform_initializer(seed=7)(list(shape)))
    np.testing.assert_allclose(_values(lambda: cases[0][0](list(shape)))[0], glorot, rtol=1e-6)


def test_variance_scaling_refuses_what_contrib_refused():
    with pytest.raises(TypeError, match="non-floating"):
        ns.variance_scaling_initializer(dtype=tf.int32)
    with pytest.raises(TypeError, match="FAN_SIDEWAYS"):
        ns.variance_scaling_initializer(mode="FAN_SIDEWAYS")


def test_the_regularizers_have_contribs_semantics():
    """l2: scale * l2_loss = scale * sum(w**2) / 2; l1: scale * sum(|w|); l1_l2 their sum;
    apply_regularization sums over the weights into REGULARIZATION_LOSSES."""
    w = np.array([[1.0, -2.0], [3.0, 0.5]], np.float32)

    def graph(penalty):
        def build():
            return penalty(tf.constant(w))
        return build

    l2, l1, both, summed = _values(graph(ns.l2_regularizer(0.1)), graph(ns.l1_regularizer(0.1)),
                                   graph(ns.l1_l2_regularizer(0.1, 0.2)),
                                   graph(ns.sum_regularizer([ns.l2_regularizer(0.1), None])))
    assert l2 == pytest.approx(0.1 * (w ** 2).sum() / 2)
    assert l1 == pytest.approx(0.1 * abs(w).sum())
    assert both == pytest.approx(0.1 * abs(w).sum() + 0.2 * (w ** 2).sum() / 2)
    assert summed == pytest.approx(l2)
    with tf.Graph().as_default() as g:
        weights = [tf.constant(w), tf.constant(2 * w)]
        total = ns.apply_regularization(ns.l2_regularizer(1.0), weights)
        assert g.get_collection(v1.GraphKeys.REGULARIZATION_LOSSES) == [total]
        with v1.Session() as session:
            assert session.run(total) == pytest.approx(5 * (w ** 2).sum() / 2)
    assert ns.l2_regularizer(0.0)("anything") is None  # scale 0: disabled
    assert ns.sum_regularizer([None]) is None
    for scale, message in ((-0.1, "less than 0"), (1, "cannot be an integer")):
        with pytest.raises(ValueError, match=message):
            ns.l2_regularizer(scale)
        with pytest.raises(ValueError, match=message):
            ns.l1_regularizer(scale)


@pytest.mark.parametrize("source, line", [
    ("import tensorflow as tf\ntf.contrib.slim.fully_connected(x, 3)\n", SLIM_LINE),
    ("import tensorflow.contrib.slim as slim\n", SLIM_LINE),
    ("from tensorflow.contrib import slim\n", SLIM_LINE),
    ("import tensorflow as tf\ntf.contrib.layers.fully_connected(x, 3)\n",
     "tf.contrib.layers.fully_connected is not in TensorFlow 2.21: use tf_slim.layers "
     "(pip install tf-slim)"),
    ("from tensorflow.contrib.rnn import LSTMCell\n",
     "tf.contrib.rnn is not in TensorFlow 2.21: use tf.compat.v1.nn.rnn_cell"),
    ("import tensorflow as tf\ntf.contrib.bayesflow.monte_carlo\n",
     "tf.contrib.bayesflow is not in TensorFlow 2.21, and lowlevel maps only a few "
     "tf.contrib functions (docs/tf1-programs.md)"),
])
def test_any_other_contrib_name_is_one_line_naming_it_and_its_replacement(source, line):
    with pytest.raises(errors.ContribUnavailable) as raised:
        _run(source)
    assert errors.one_line(raised.value) == line
    assert errors.status_of(raised.value) == errors.FAILURE
    assert errors.is_runtime_failure(raised.value)  # the runner prints it without traceback


def test_a_scripts_import_error_fallback_takes_an_unmapped_contrib_module():
    got = _run("try:\n"
               "    from tensorflow.contrib import slim\n"
               "except ImportError:\n"
               "    slim = 'tf_slim'\n")
    assert got["slim"] == "tf_slim"


def test_contribs_dunder_lookups_are_plain_attribute_errors():
    """Introspection (`hasattr(module, "__path__")`, copy, pickle) sees a module."""
    contrib = ns.tf1_namespace().contrib
    assert not hasattr(contrib, "__path__") and not hasattr(contrib.layers, "__wrapped__")


# --- real processes -----------------------------------------------------------------------


@pytest.mark.cluster
@pytest.mark.timeout(240)
def test_the_guides_skeleton_as_printed_runs_under_the_runner_and_every_task_exits_0(
        tmp_path, ports):
    """1 ps + 2 workers of the TF1 skeleton, unmodified (`import tensorflow as tf`,
    `tf.contrib.framework.get_or_create_global_step()`, `tf.app.run`): every task exits 0
    by itself, the ps with the chief, the final checkpoint at the last step
    (`test_tf1_programs`' checks)."""
    procs = _start(tmp_path, ports, [sys.executable, "-m", "lowlevel", SKELETON_TF1])
    try:
        _assert_ran_to_the_end(tmp_path, procs)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
    for name in procs:
        log = (tmp_path / f"{name}.log").read_text()
        assert f"lowlevel: {SKELETON_TF1} uses TF1's own namespace (tf.get_variable, " \
               "tf.contrib.layers.xavier_initializer, tf.train.Server, ...)" in log, \
            clusters.tail(tmp_path / f"{name}.log")


@pytest.mark.cluster
@pytest.mark.timeout(120)
def test_an_unmapped_contrib_name_ends_the_script_with_1_and_one_line_naming_it(tmp_path):
    script = tmp_path / "slim_user.py"
    script.write_text("import tensorflow as tf\n\n\n"
                      "def main(_):\n"
                      "    x = tf.placeholder(tf.float32, [None, 4])\n"
                      "    return tf.contrib.slim.fully_connected(x, 2)\n\n\n"
                      "tf.app.run(main)\n")
    done = clusters.run([sys.executable, "-m", "lowlevel", str(script)], timeout=90)
    assert done.returncode == 1, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines[-1] == f"lowlevel: error: {SLIM_LINE} (exit status 1)", done.stderr[-2000:]
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    assert f"lowlevel: {script} uses TF1's own namespace (tf.placeholder, " \
           "tf.contrib.slim.fully_connected, tf.app.run)" in done.stderr
