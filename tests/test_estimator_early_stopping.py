"""tf.estimator's early-stopping hooks, locally, against the real 2.15 on the same script
(tests/estimator_scripts/early_stopping.py; tests/fixtures/estimator215/early_stopping.json,
made by make_early_stopping.py): each hook stops at 2.15's step with 2.15's log lines,
evaluations and STOP variable; bad arguments raise 2.15's errors at the same call. (On a
TF_CONFIG cluster: tests/test_estimator_cluster.py.)"""

import json
import os
import re
import sys

import pytest

import clusters

ROOT = clusters.ROOT
SCRIPT = os.path.join(ROOT, "tests", "estimator_scripts", "early_stopping.py")
MAKER = os.path.join(ROOT, "tests", "fixtures", "estimator215", "make_early_stopping.py")
FIXTURE = json.load(open(os.path.join(ROOT, "tests", "fixtures", "estimator215",
                                      "early_stopping.json")))
COMPARED = ("final_step", "eval_steps", "stop_log", "stop_var", "hook_type",
            "predicate_calls")


def _last_json(text: str) -> dict:
    lines = [line for line in text.splitlines() if line.startswith("{")]
    assert lines, text[-3000:]
    return json.loads(lines[-1])


def _script(model_dir, hook: str) -> dict:
    extra = ["--max_steps", "600"] if hook == "none" else []
    done = clusters.run([sys.executable, "-m", "lowlevel.estimator", SCRIPT,
                         f"--model_dir={model_dir}", f"--hook={hook}", *extra], timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return _last_json(done.stdout)


@pytest.mark.cluster  # starts a process per run
@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", sorted(FIXTURE["cases"]))
def test_a_hook_stops_where_2_15s_stops(case, tmp_path):
    want = FIXTURE["cases"][case]
    hook = case.removesuffix("_resume")
    if case.endswith("_resume"):  # a second run on the model_dir of a stopped one
        _script(tmp_path / "model", hook)
    got = _script(tmp_path / "model", hook)
    assert ({k: _words(got[k]) for k in COMPARED} == {k: _words(want[k]) for k in COMPARED})
    for step, metrics in want["eval_history"].items():  # bit-identical when measured
        assert got["eval_history"][step] == pytest.approx(metrics, rel=1e-4), step
    # the values in the log lines: bit-identical on the machine the fixture was made on,
    # 8e-8 apart on one whose CPU takes other oneDNN kernels (AVX512_BF16, AVX_VNNI)
    assert _numbers(got["stop_log"]) == pytest.approx(_numbers(want["stop_log"]), rel=1e-4)


NUMBER = re.compile(r"-?\d+\.\d+(?:e-?\d+)?")


def _words(value):
    """Log lines with their decimal numbers replaced by "<number>"; anything else as it is."""
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return [NUMBER.sub("<number>", v) for v in value]
    return value


def _numbers(lines: list) -> list:
    return [float(x) for line in lines for x in NUMBER.findall(line)]


@pytest.mark.cluster  # one process
@pytest.mark.timeout(300)
def test_bad_arguments_raise_2_15s_errors_at_the_same_call():
    done = clusters.run([sys.executable, "-m", "lowlevel.estimator", MAKER, "--probe-errors"],
                        timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    got = _last_json(done.stdout)
    assert got == FIXTURE["errors"]


@pytest.mark.timeout(60)
def test_the_defaults_are_2_15s_60_seconds_between_checks(tmp_path):
    import lowlevel.estimator as estimator
    est = estimator.Estimator(lambda features, labels, mode: None, str(tmp_path))
    for hook in (estimator.experimental.stop_if_lower_hook(est, "loss", 1.0),
                 estimator.experimental.make_early_stopping_hook(est, lambda: False)):
        timer = hook._timer  # noqa: SLF001 - 2.15's SecondOrStepTimer, its settings
        assert (timer._every_secs, timer._every_steps) == (60, None)  # noqa: SLF001
