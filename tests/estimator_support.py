"""Shared helpers of the lowlevel.estimator tests: fixtures of TF 2.15, the reference scripts.

The fixtures in tests/fixtures/estimator215/ were captured from
tensorflow==2.15.1 + tensorflow-estimator==2.15.0 by
tests/fixtures/estimator215/make_fixtures.py; tests/estimator_scripts/ holds
the unmodified reference scripts they ran.
"""

import contextlib
import gzip
import json
import os
import runpy

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "fixtures", "estimator215")
SCRIPTS = os.path.join(HERE, "estimator_scripts")


def fixture(name):
    """A JSON fixture of TF 2.15 (tests/fixtures/estimator215/<name>)."""
    path = os.path.join(FIXTURES, name)
    if name.endswith(".gz"):
        with gzip.open(path, "rt") as f:
            return json.load(f)
    with open(path) as f:
        return json.load(f)


@contextlib.contextmanager
def estimator_alias():
    """`tf.estimator` and `tf.compat.v1.estimator` name lowlevel.estimator while inside."""
    import tensorflow as tf

    import lowlevel.estimator as estimator
    tf.estimator = estimator
    tf.compat.v1.estimator = estimator
    try:
        yield estimator
    finally:
        del tf.estimator
        del tf.compat.v1.estimator


def load_script(name):
    """The globals of tests/estimator_scripts/<name> (run as a module, not as __main__).

    Call inside `estimator_alias()`: the scripts use tf.estimator at import.
    Returns the script's live globals dict (the one its functions see).
    """
    copy = runpy.run_path(os.path.join(SCRIPTS, name), run_name="estimator_script")
    return copy["main"].__globals__


def script_flags(script, model_dir, *args):
    """The script's parsed flags for `--model_dir=model_dir` and `args`."""
    return script["parse_args"]([f"--model_dir={model_dir}", *args])
