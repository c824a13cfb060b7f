"""Storage faults: `--output_dir` full, or read-only, in the middle of a run (lowlevel/outputs/storage.py).

The output directory is a small tmpfs mounted by the test (and always
unmounted): filled up mid-run with a file that leaves a few pages free (room
for event lines, not for a checkpoint), or covered mid-run by a read-only bind
mount of itself (open files, such as the event logs, keep their writable
mount; anything opened afterwards, such as a checkpoint, is read-only).
"""

import os
import subprocess
import sys
import time

import pytest

import clusters
from lowlevel.outputs import checkpoints, storage

MARGIN = 96 * 1024  # bytes left free when filling: event lines fit, a checkpoint (~300 KB) does not


def _mount_reason():
    return None if os.geteuid() == 0 else "mounting a tmpfs needs root (this process is not)"


@pytest.fixture
def tmpfs(tmp_path):
    """A 16 MiB tmpfs at tmp_path/out; unmounts it (and anything over it) at the end."""
    reason = _mount_reason()
    if reason:
        pytest.skip(reason)
    out = tmp_path / "out"
    out.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "llstorage", str(out)], check=True)
    yield out
    for _ in range(3):  # an overmount, then the tmpfs; lazily if something still holds it
        if subprocess.run(["mountpoint", "-q", str(out)]).returncode != 0:
            break
        if subprocess.run(["umount", str(out)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(out)], capture_output=True)
    assert subprocess.run(["mountpoint", "-q", str(out)]).returncode != 0


class _Launch:
    def __init__(self, out, log, *flags):
        self.out, self.log = out, log
        self.proc = clusters.start(
            [sys.executable, "-m", "lowlevel.launch", f"--output_dir={out}", *flags], log)

    def wait_for(self, predicate, what, timeout_secs):
        deadline = time.monotonic() + timeout_secs
        while time.monotonic() < deadline:
            found = predicate()
            if found:
                return found
            if self.proc.poll() is not None:
                pytest.fail(f"the launcher exited {self.proc.returncode} before {what}:\n"
                            + clusters.tail(self.log, 60))
            time.sleep(0.1)
        pytest.fail(f"no {what} within {timeout_secs} s:\n" + clusters.tail(self.log, 60))

    def wait(self, timeout_secs):
        try:
            return self.proc.wait(timeout_secs)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the launcher did not exit within {timeout_secs} s:\n"
                        + clusters.tail(self.log, 60))

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _saved(out, after_step=0):
    return [r for r in clusters.task_events(out, "worker0", "checkpoint_saved")
            if r["global_step"] > after_step]


def _partials(out):
    return [n for n in os.listdir(out) if "_temp" in n or ".tempstate" in n]


def _fill(out, margin=MARGIN):
    st = os.statvfs(out)
    size = st.f_bavail * st.f_frsize - margin
    filler = out / "filler"
    with open(filler, "wb") as f:
        f.write(b"\0" * max(size, 0))
    return filler


@pytest.mark.cluster
@pytest.mark.timeout(420)
def test_full_output_dir_is_a_line_then_the_next_interval_saves(tmpfs, tmp_path):
    out = tmpfs
    launch = _Launch(out, tmp_path / "launch.log", "--train_steps=6000",
                     "--save_checkpoint_steps=100", "--log_every_secs=1")
    try:
        first = launch.wait_for(lambda: _saved(out, 0), "checkpoint after step 0", 240)[-1]
        filler = _fill(out)
        failed = launch.wait_for(
            lambda: clusters.task_events(out, "worker0", "checkpoint_failed"),
            "checkpoint_failed event", 120)[0]
        assert failed["directory"] == str(out)
        assert failed["error"] == "No space left on device (ENOSPC)"
        assert failed["failures"] == 1 and failed["final"] is False
        assert _partials(out) == []  # model.ckpt-N_temp/ removed
        newest = checkpoints.newest_readable(str(out))  # the previous one reads whole
        assert newest is not None and newest[1] >= first["global_step"]
        os.unlink(filler)
        launch.wait_for(lambda: _saved(out, failed["global_step"]),
                        "checkpoint saved after the disk had room again", 120)
        assert launch.wait(300) == 0, clusters.tail(launch.log, 60)
    finally:
        launch.close()
    log = open(launch.log).read()
    lines = [line for line in log.splitlines() if "checkpoint save at global step" in line]
    assert lines, log[-4000:]
    assert all(str(out) in line and "No space left on device (ENOSPC)" in line
               and "retrying at the next interval" in line for line in lines), lines
    assert "ResourceExhaustedError" not in log and "Traceback" not in log
    assert "checkpoint saves work again" in log
    assert clusters.final_metrics(out)["global_step"] == 6000
    assert _partials(out) == []


@pytest.mark.cluster
@pytest.mark.timeout(420)
def test_read_only_output_dir_ends_the_run_after_the_failures_in_a_row(tmpfs, tmp_path):
    out = tmpfs
    launch = _Launch(out, tmp_path / "launch.log", "--train_steps=200000",
                     "--save_checkpoint_steps=100", "--max_checkpoint_failures=2")
    try:
        launch.wait_for(lambda: _saved(out, 0), "checkpoint after step 0", 240)
        subprocess.run(["mount", "--bind", "-o", "ro", str(out), str(out)], check=True)
        code = launch.wait(240)
        before = checkpoints.newest_readable(str(out))
    finally:
        launch.close()
    log = open(launch.log).read()
    assert code == 1, log[-4000:]
    failed = clusters.task_events(out, "worker0", "checkpoint_failed")
    assert [r["failures"] for r in failed] == [1, 2]
    assert {r["error"] for r in failed} == {"Read-only file system (EROFS)"}
    first = [line for line in log.splitlines() if "failure 1 of 2 in a row" in line]
    assert len(first) == 1 and str(out) in first[0] and "EROFS" in first[0], log[-4000:]
    error = [line for line in log.splitlines() if "lowlevel.trainer: error:" in line]
    assert len(error) == 1 and "2 saves in a row failed (--max_checkpoint_failures)" in error[0]
    assert "exit status 1" in error[0] and str(out) in error[0]
    assert "launch: worker0 exited with status 1 (permanent failure)" in log
    assert "Traceback" not in log and "PermissionDeniedError" not in log
    assert before is not None and before[1] < failed[0]["global_step"] + 1
    assert _partials(out) == []


def test_os_error_names_the_error_in_tensorflow_messages():
    message = ("Graph execution error:\n\nNode: 'save/SaveV2'\n/out/model.ckpt-0.data-00000-of-"
               "00001.tempstate123; No space left on device\n\t [[{{node save/SaveV2}}]]\n")
    assert storage.os_error(RuntimeError(message)) == "No space left on device (ENOSPC)"
    assert storage.os_error(OSError(30, "x")) == "Read-only file system (EROFS)"
    assert storage.os_error(RuntimeError("something else\nmore")) == \
        "RuntimeError: something else"


def test_remove_partial_removes_only_temporary_files(tmp_path):
    for name in ("model.ckpt-5_temp", "model.ckpt-7.index"):
        (tmp_path / name).mkdir() if name.endswith("_temp") else (tmp_path / name).write_text("")
    (tmp_path / "model.ckpt-5_temp" / "part-00000-of-00001.data").write_text("x")
    (tmp_path / "model.ckpt-9.data-00000-of-00001.tempstate42").write_text("x")
    removed = storage.remove_partial(str(tmp_path))
    assert sorted(removed) == ["model.ckpt-5_temp", "model.ckpt-9.data-00000-of-00001.tempstate42"]
    assert os.listdir(tmp_path) == ["model.ckpt-7.index"]


def test_a_save_that_works_removes_what_a_cut_save_left(tmp_path, caplog):
    """A chief or ps killed mid-save leaves `model.ckpt-N_temp/`; nothing of the run writes it
    again, and the next save that works removes it (a failed one keeps the last good)."""
    cut = tmp_path / "model.ckpt-40_temp"
    cut.mkdir()
    (cut / "part-00001-of-00002.data-00000-of-00001").write_bytes(b"\0" * 1024)
    saves = storage.CheckpointSaves(str(tmp_path), max_failures=3)
    with caplog.at_level("INFO"):
        path = saves.save(lambda: str(tmp_path / "model.ckpt-80"), step=80)
    assert path == str(tmp_path / "model.ckpt-80")
    assert not cut.exists()
    assert "model.ckpt-40_temp" in caplog.text and "cut short" in caplog.text


@pytest.mark.cluster
@pytest.mark.timeout(180)
@pytest.mark.parametrize("model", [[], ["--model=wide_deep", "--dataset=synthetic_ctr",
                                        "--vocab_size=1000", "--embedding=dynamic"]],
                         ids=["mlp", "dynamic_tables"])
def test_an_evaluator_whose_checkpoint_read_hangs_exits_200_naming_it(tmp_path, model):
    """A read that blocks in the kernel with no deadline, as on a hung NFS mount: the
    checkpoint's index is a FIFO no one writes. The evaluator gives up after
    --fault_timeout_secs with status 200, naming the checkpoint, instead of hanging (with
    dynamic tables the first read is of the shard count, before the graph is built)."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-5"\n'
                                    'all_model_checkpoint_paths: "model.ckpt-5"\n')
    (out / "model.ckpt-5.data-00000-of-00001").write_bytes(b"")
    os.mkfifo(out / "model.ckpt-5.index")
    log = tmp_path / "evaluator.log"
    proc = clusters.start([sys.executable, "-m", "lowlevel.trainer", "--schedule=continuous_eval",
                           f"--output_dir={out}", "--train_steps=10", "--fault_timeout_secs=5",
                           "--eval_timeout_secs=60", *model], log)
    code, _ = clusters.wait_all({"evaluator": proc}, 150)["evaluator"]
    assert code == 200, (code, clusters.tail(log))
    last = [line for line in clusters.tail(log).splitlines() if line.strip()][-1]
    assert last.startswith("lowlevel.trainer: error: evaluator: reading ") and \
        "model.ckpt-5 did not complete within 5 s (--fault_timeout_secs)" in last, last
