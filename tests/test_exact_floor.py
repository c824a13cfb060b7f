"""`benchmarks.exact_floor`: one short round of its four steps runs, each a real ps process
beside the worker, and leaves nothing behind."""

import json
import sys

import psutil
import pytest

import clusters


@pytest.mark.timeout(240)
def test_one_short_round_measures_every_step_and_the_floor_moves_no_gradients():
    returncode, output, seen, _ = clusters.run_watched(
        [sys.executable, "-m", "benchmarks.exact_floor", "--rounds=1", "--window_secs=0.5"])
    assert returncode == 0, output[-3000:]
    launches = {r["step"]: r for r in (json.loads(line) for line in output.splitlines()
                                       if line.startswith('{"round"'))}
    assert set(launches) == {"local", "classic", "mirror", "floor"}, output[-3000:]
    assert all(r["examples_per_sec"] > 0 for r in launches.values())
    assert launches["local"]["ps_cpu_ms_per_step"] == 0
    assert all(launches[s]["ps_cpu_ms_per_step"] > 0 for s in ("classic", "mirror", "floor"))
    # The floor's ps receives no gradients and applies nothing: a fraction of the CPU a
    # step of the ps that takes 2.7 MB and applies Adagrad spends (0.6 against 2.4-2.9 ms).
    assert launches["floor"]["ps_cpu_ms_per_step"] < 0.6 * launches["classic"]["ps_cpu_ms_per_step"]
    for name in ("classic", "mirror", "floor"):
        assert f"{name} / local: median" in output
    assert not [p for p in seen if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
