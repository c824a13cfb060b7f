"""Every mistake in setting up a cluster: one line on stderr naming the value, the right
exit status (lowlevel.errors: 2 usage, 1 permanent, 200 retryable), no traceback, no hang, and nothing in --output_dir
damaged. Each row runs the real trainer CLI as a subprocess."""

import gzip
import hashlib
import json
import os
import socket
import sys

import pytest

import clusters
from mnist_files import write_idx_set

pytestmark = pytest.mark.cluster  # every test here starts trainer processes

CHIEF_SPEC = {"chief": ["127.0.0.1:{p0}"], "worker": ["127.0.0.1:{p1}"],
              "ps": ["127.0.0.1:{p2}"]}


def _tf_config(task_type, index=0, **extra):
    return json.dumps({"cluster": CHIEF_SPEC, "task": {"type": task_type, "index": index},
                       **extra})


NO_OUTPUT_DIR = "(no --output_dir)"  # a flags entry: run without the default --output_dir
CLUSTER = ["--ps_hosts=127.0.0.1:{p0}", "--worker_hosts=127.0.0.1:{p1},127.0.0.1:{p2}"]

# (id, flags, TF_CONFIG or None, set-up, exit status, text the error line must hold)
CASES = [
    ("malformed_host_port", ["--ps_hosts=127.0.0.1", "--worker_hosts=127.0.0.1:{p1}",
                             "--job_name=ps"], None, None, 2,
     "--ps_hosts: '127.0.0.1' is not host:port"),
    ("port_out_of_range", ["--ps_hosts=127.0.0.1:70000", "--worker_hosts=127.0.0.1:{p1}",
                           "--job_name=ps"], None, None, 2, "port 70000 in '127.0.0.1:70000'"),
    ("same_address_twice", ["--ps_hosts=127.0.0.1:{p0}", "--worker_hosts=127.0.0.1:{p0}",
                            "--job_name=ps"], None, None, 2, "127.0.0.1:{p0} is given twice"),
    ("port_in_use", ["--ps_hosts=127.0.0.1:{busy}", "--worker_hosts=127.0.0.1:{p1}",
                     "--job_name=ps"], None, "busy_port", 2,
     "127.0.0.1:{busy}: port {busy} is already in use"),
    ("job_not_in_cluster", [*CLUSTER, "--job_name=chef"], None, None, 2, "--job_name=chef"),
    ("task_index_out_of_range", [*CLUSTER, "--job_name=worker", "--task_index=2"], None, None,
     2, "--task_index=2: job 'worker' has 2 task(s), so expected 0 to 1"),
    ("missing_job_name", CLUSTER, None, None, 2, "--job_name is required"),
    ("tf_config_not_json", [], "{cluster: ps}", None, 2, "TF_CONFIG is not JSON"),
    ("tf_config_without_cluster", [], '{"task": {"type": "worker", "index": 0}}', None, 2,
     'TF_CONFIG lacks "cluster"'),
    ("tf_config_without_task", [], json.dumps({"cluster": CHIEF_SPEC}), None, 2,
     'TF_CONFIG lacks "task"'),
    ("flags_disagree_with_tf_config", ["--job_name=ps"], _tf_config("worker"), None, 2,
     "--job_name=ps disagrees with TF_CONFIG task.type=worker"),
    ("hosts_disagree_with_tf_config", ["--ps_hosts=127.0.0.1:{busy}"], _tf_config("worker"),
     None, 2, "--ps_hosts=127.0.0.1:{busy} disagrees with TF_CONFIG cluster.ps=127.0.0.1:{p2}"),
    ("replicas_to_aggregate_too_large", [*CLUSTER, "--job_name=worker", "--sync",
                                         "--replicas_to_aggregate=3"], None, None, 2,
     "--replicas_to_aggregate=3: expected 1 to 2"),
    ("unknown_flag", ["--no_such_flag=1"], None, None, 2, "Unknown command line flag "
     "'no_such_flag'"),
    ("batch_size_zero", ["--batch_size=0"], None, None, 2, "--batch_size=0"),
    ("train_steps_negative", ["--train_steps=-1"], None, None, 2, "--train_steps=-1"),
    ("unknown_model", ["--model=resnet"], None, None, 2,
     "--model=resnet: expected one of softmax, mlp, cnn, wide_deep, or a model_fn of your own"),
    ("model_fn_module_missing", ["--model=no.such:fn", "--input_fn=no.such:input_fn"], None,
     None, 2, "--model=no.such:fn: no module named 'no.such'"),
    ("model_fn_not_in_module", ["--model=tests.user_models.digits:nope",
                                "--input_fn=tests.user_models.digits:input_fn"], None, None, 2,
     "--model=tests.user_models.digits:nope: module tests.user_models.digits"),
    ("model_fn_without_input_fn", ["--model=tests.user_models.digits:model_fn"], None, None, 2,
     "--model=tests.user_models.digits:model_fn needs --input_fn"),
    ("params_not_json", ["--model=tests.user_models.digits:model_fn",
                         "--input_fn=tests.user_models.digits:input_fn", "--params={{x"],
     None, None, 2, "--params={{x: not JSON"),
    ("model_fn_without_train_op", ["--model=tests.user_models.bad:no_train_op",
                                   "--input_fn=tests.user_models.digits:input_fn"], None, None,
     1, "model_fn tests.user_models.bad:no_train_op: ValueError: Missing train_op."),
    ("train_op_never_moves_the_global_step", ["--model=tests.user_models.bad:no_global_step",
                                              "--input_fn=tests.user_models.digits:input_fn"],
     None, None, 1, "model_fn tests.user_models.bad:no_global_step: its train_op does not "
     "increment the global step"),
    ("input_fn_wrong_structure", ["--model=tests.user_models.digits:model_fn",
                                  "--input_fn=tests.user_models.bad:three_tuple"], None, None,
     1, "input_fn tests.user_models.bad:three_tuple: ValueError: input_fn should return "
     "(features, labels) as a len 2 tuple."),
    ("unknown_dataset", ["--dataset=cifar"], None, None, 2,
     "--dataset=cifar: value should be one of"),
    ("unknown_optimizer", ["--optimizer=lbfgs"], None, None, 2, "--optimizer=lbfgs"),
    ("keep_exports_negative", ["--keep_exports=-1"], None, None, 2,
     "--keep_exports=-1: -1 is not a non-negative integer"),
    ("wrong_schedule_for_job", [*CLUSTER, "--job_name=ps", "--schedule=train"], None, None, 2,
     "--schedule=train cannot run on a ps task"),
    ("data_dir_missing", ["--dataset=mnist", "--data_dir={tmp}/nowhere"], None, None, 1,
     "--data_dir={tmp}/nowhere: no such directory"),
    ("data_dir_truncated", ["--dataset=mnist", "--data_dir={tmp}/mnist"], None,
     "truncated_mnist", 1, "train-images-idx3-ubyte.gz: truncated"),
    ("data_dir_wrong_files", ["--dataset=mnist", "--data_dir={tmp}/mnist"], None,
     "wrong_mnist", 1, "mnist.npz: not a readable npz file"),
    ("output_dir_not_writable", ["--output_dir={tmp}/file/out"], None, "plain_file", 2,
     "--output_dir={tmp}/file/out: cannot write there"),
    ("checkpoint_of_another_model", ["--model=cnn"], None, "mlp_checkpoint", 1,
     "variable model/hidden0/kernel has shape [64, 128] there but [256, 128] in this model"),
    ("evaluator_without_output_dir", ["--schedule=continuous_eval", NO_OUTPUT_DIR], None, None, 2,
     "--schedule=continuous_eval needs --output_dir"),
    ("ps_never_comes_up", [*CLUSTER, "--job_name=worker", "--task_index=0",
                           "--startup_timeout_secs=3"], None, None, 200,
     "ps0 at 127.0.0.1:{p0} did not answer within 3 s (--startup_timeout_secs)"),
    ("tf_config_ps_never_comes_up", ["--startup_timeout_secs=2"], _tf_config("chief"), None, 200,
     "ps0 at 127.0.0.1:{p2} did not answer within 2 s"),
    ("ps_host_name_never_resolves", ["--ps_hosts=lowlevel-test-nowhere.invalid:{p0}",
                                     "--worker_hosts=127.0.0.1:{p1}", "--job_name=worker",
                                     "--startup_timeout_secs=2"], None, None, 200,
     "ps0 at lowlevel-test-nowhere.invalid:{p0}: host name lowlevel-test-nowhere.invalid did "
     "not resolve within 2 s"),
    ("evaluator_gets_no_checkpoint", ["--schedule=continuous_eval", "--eval_timeout_secs=2"],
     None, None, 200, "no new checkpoint in {out} for 2 s (--eval_timeout_secs)"),
]


def _set_up(kind, tmp_path, out, values):
    """Prepares what a case needs; returns anything to keep alive while it runs."""
    if kind == "busy_port":
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        values["busy"] = sock.getsockname()[1]
        return sock
    if kind in ("truncated_mnist", "wrong_mnist"):
        data_dir = tmp_path / "mnist"
        data_dir.mkdir()
        if kind == "wrong_mnist":
            (data_dir / "mnist.npz").write_bytes(b"PK\x03\x04 not really a zip")
            return None
        write_idx_set(data_dir)
        path = data_dir / "train-images-idx3-ubyte.gz"
        with gzip.open(path) as f:
            raw = f.read()
        with gzip.open(path, "wb") as f:
            f.write(raw[:-100])
    if kind == "plain_file":
        (tmp_path / "file").write_text("a file, not a directory")
    if kind == "mlp_checkpoint":
        result = clusters.run([sys.executable, "-m", "lowlevel.trainer", f"--output_dir={out}",
                               "--train_steps=20", "--hidden_units=128,128"], timeout=100)
        assert result.returncode == 0, result.stderr[-2000:]
    return None


def _fill(text, values):
    """`text` with each {name} replaced (str.format would trip on TF_CONFIG's own braces)."""
    for name, value in values.items():
        text = text.replace("{" + name + "}", str(value))
    return text


def _snapshot(directory):
    """{relative path: sha256} of every file under `directory` but the append-only events log
    (`events/`: a failed start is recorded there, which is what it is for)."""
    found = {}
    for root, _, files in os.walk(directory):
        if os.path.relpath(root, directory).split(os.sep)[0] == "events":
            continue
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                found[os.path.relpath(path, directory)] = hashlib.sha256(f.read()).hexdigest()
    return found


@pytest.mark.timeout(150)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_ends_in_one_clear_line(case, tmp_path, ports):
    _, flags, tf_config, setup, expected_code, needle = case
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("the user's own file")
    p = ports(3)
    values = {"p0": p[0], "p1": p[1], "p2": p[2], "tmp": tmp_path, "out": out, "busy": p[0]}
    keep = _set_up(setup, tmp_path, out, values)
    try:
        argv = [_fill(f, values) for f in flags if f != NO_OUTPUT_DIR]
        if NO_OUTPUT_DIR not in flags and not any(f.startswith("--output_dir") for f in argv):
            argv.append(f"--output_dir={out}")
        env = {"TF_CONFIG": _fill(tf_config, values)} if tf_config else {}
        before = _snapshot(out)
        result = clusters.run([sys.executable, "-m", "lowlevel.trainer", *argv], timeout=120,
                              env=env)
    finally:
        if keep is not None:
            keep.close()
    errors = [line for line in result.stderr.splitlines()
              if line.startswith("lowlevel.trainer: error:")]
    assert result.returncode == expected_code, result.stderr[-3000:]
    assert len(errors) == 1, result.stderr[-3000:]
    assert _fill(needle, values) in errors[0], errors[0]
    assert "Traceback" not in result.stderr
    after = _snapshot(out)
    assert {k: after.get(k) for k in before} == before  # nothing there changed or went
