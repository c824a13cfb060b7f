"""A user's own TF1 program under the launcher and the Kubernetes generator:
`python -m lowlevel.launch --script=SCRIPT.py -- ARGS` runs it as a localhost cluster (each
task `python -m lowlevel SCRIPT ARGS` with the guide's cluster flags or `TF_CONFIG`, output
prefixed, restarts, the exit contract); `lowlevel-make-tf-configs --script` writes
manifests whose containers run it, validated as the trainer's (tests/test_k8s.py).

The tests that start clusters are marked `cluster`; the generator's output and the usage
errors are the fast tier.
"""

import json
import os
import re
import signal
import sys
import time

import kubernetes_validate
import psutil
import pytest
import yaml

import clusters
from lowlevel.ops import k8s
from lowlevel.outputs import checkpoints
from test_k8s import (KUBERNETES_VERSIONS, _as_pods, restricted_violations, run_checkov,
                      validate_tfjob)

SKELETON = os.path.join(clusters.ROOT, "tests", "tf1_scripts", "skeleton_trainer.py")
TASKS = ("ps0", "worker0", "worker1")
GUIDE_FLAGS = ("--ps_hosts", "--worker_hosts", "--job_name", "--task_index")


def _launch(*flags, timeout=150, cold=False):
    return clusters.run([sys.executable, "-m", "lowlevel.launch", *flags], timeout=timeout,
                        cold=cold)


def _task_lines(stdout: str) -> dict:
    """{task: its lines} of the launcher's output; AssertionError on a line that is neither
    a task's (prefixed) nor the launcher's own."""
    lines = {}
    for line in stdout.splitlines():
        found = re.match(r"\[(ps\d+|worker\d+)\] (.*)$", line)
        if found:
            lines.setdefault(found.group(1), []).append(found.group(2))
        else:
            assert line.startswith("launch: ") or not line.strip(), line
    return lines


def _ready_secs(lines: list) -> float:
    """Seconds since midnight of a task's "session ready" line (absl's prefix: I1127
    08:54:51.264046), from its lines without the launcher's prefix."""
    for line in lines:
        found = re.match(r"I\d{4} (\d\d):(\d\d):(\d\d\.\d+) .*: session ready at global step",
                         line)
        if found:
            h, m, sec = found.groups()
            return int(h) * 3600 + int(m) * 60 + float(sec)
    raise AssertionError(f"no session ready line in {lines[-10:]}")


@pytest.mark.cluster
@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode", ["async", "sync"])
def test_the_skeleton_runs_under_the_launcher_to_its_last_step(tmp_path, mode):
    """Flags mode, the default, async and with `SyncReplicasOptimizer`: every task's output
    prefixed, every task exits 0 (the ps at the chief's end), the non-chief's session
    ready within 5 s of the chief's, the final checkpoint at exactly the last step."""
    result = _launch(f"--script={SKELETON}", "--num_workers=2", "--",
                     "--last_step=300", f"--checkpoint_dir={tmp_path / 'ckpt'}",
                     f"--sync_replicas={mode == 'sync'}")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "launch: all 3 tasks exited 0 after" in result.stdout, result.stdout[-3000:]
    lines = _task_lines(result.stdout)
    assert set(lines) == set(TASKS), sorted(lines)
    assert any("the chief signalled the end of training" in line for line in lines["ps0"])
    lag = _ready_secs(lines["worker1"]) - _ready_secs(lines["worker0"])
    assert lag < 5.0, lag  # stock: up to 30 s (SessionManager's recovery_wait_secs)
    path, step = checkpoints.newest_readable(str(tmp_path / "ckpt"))
    assert step == 300, path
    assert not clusters.leftovers(tmp_path)


PRINTER = ("import json, os, sys\n"
           "print('TF_CONFIG=' + os.environ.get('TF_CONFIG', ''), flush=True)\n"
           "print('ARGV=' + json.dumps(sys.argv[1:]), flush=True)\n")


@pytest.mark.cluster
@pytest.mark.timeout(180)
@pytest.mark.parametrize("cluster_as", ["tf_config", "flags"])
def test_each_task_gets_its_cluster_as_tf_config_or_as_the_guides_flags(tmp_path,
                                                                         cluster_as):
    """A script that prints what it was given: `TF_CONFIG` (jobs ps and worker, its own
    task) and only the script's arguments; or the guide's four flags after them."""
    script = tmp_path / "printer.py"
    script.write_text(PRINTER)
    result = _launch(f"--script={script}", f"--script_cluster={cluster_as}", "--",
                     "--mine=1", timeout=120)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    lines = _task_lines(result.stdout)
    assert set(lines) == set(TASKS), sorted(lines)
    clusters_seen = set()
    for name in TASKS:
        job, index = re.match(r"([a-z]+)(\d+)", name).groups()
        tf_config = next(x for x in lines[name] if x.startswith("TF_CONFIG="))[10:]
        argv = json.loads(next(x for x in lines[name] if x.startswith("ARGV="))[5:])
        assert argv[0] == "--mine=1", argv
        if cluster_as == "flags":
            assert tf_config == "", tf_config
            given = dict(a[2:].split("=", 1) for a in argv[1:])
            assert list(given) == [f[2:] for f in GUIDE_FLAGS], argv
            assert (given["job_name"], given["task_index"]) == (job, index)
            cluster = {"ps": given["ps_hosts"].split(","),
                       "worker": given["worker_hosts"].split(",")}
        else:
            assert argv == ["--mine=1"], argv
            config = json.loads(tf_config)
            assert config["task"] == {"type": job, "index": int(index)}, config
            cluster = config["cluster"]
        assert len(cluster["ps"]) == 1 and len(cluster["worker"]) == 2, cluster
        assert all(re.fullmatch(r"127\.0\.0\.1:\d+", h) for h in cluster["ps"] +
                   cluster["worker"]), cluster
        clusters_seen.add(json.dumps(cluster, sort_keys=True))
    assert len(clusters_seen) == 1  # one cluster, the same for every task


def _task_process(launcher_pid: int, name: str, deadline: float) -> psutil.Process:
    """The process of launcher task `name` ("worker1"), by its cluster flags."""
    job, index = re.match(r"([a-z]+)(\d+)", name).groups()
    wanted = {f"--job_name={job}", f"--task_index={index}"}
    while time.monotonic() < deadline:
        for child in psutil.Process(launcher_pid).children():
            try:
                if wanted <= set(clusters.argv_of(child)):
                    return child
            except psutil.Error:
                continue
        time.sleep(0.1)
    raise AssertionError(f"no process of {name} under the launcher {launcher_pid}")


def _wait_for(log, text, proc, timeout_secs=120) -> None:
    deadline = time.monotonic() + timeout_secs
    while text not in log.read_text():
        assert proc.poll() is None, clusters.tail(log)
        assert time.monotonic() < deadline, clusters.tail(log)
        time.sleep(0.1)


ABSL_FLAGS = ("import tensorflow as tf\n"
              "flags = tf.app.flags\n"
              "flags.DEFINE_string('data_dir', '/tmp/mnist-data', 'as mnist_replica.py')\n"
              "flags.DEFINE_integer('task_index', None, 'as mnist_replica.py')\n"
              "flags.DEFINE_string('job_name', None, 'as mnist_replica.py')\n"
              "flags.DEFINE_string('ps_hosts', '', 'as mnist_replica.py')\n"
              "flags.DEFINE_string('worker_hosts', '', 'as mnist_replica.py')\n"
              "FLAGS = flags.FLAGS\n"
              "def main(_):\n"
              "    print('GOT %s %d %s' % (FLAGS.job_name, FLAGS.task_index, FLAGS.data_dir))\n"
              "tf.app.run()\n")


@pytest.mark.cluster
@pytest.mark.timeout(180)
def test_a_forked_task_runs_a_script_whose_absl_flags_share_the_trainers_names(tmp_path):
    """Tasks are forked from the launcher, whose TensorFlow import defined the trainer's
    absl flags; a script in TF1's namespace that defines flags of the same names
    (`--data_dir`, `--task_index`: mnist_replica.py's) gets its own, as in a fresh
    process (stock absl: `DuplicateFlagError`)."""
    script = tmp_path / "absl_flags.py"
    script.write_text(ABSL_FLAGS)
    result = _launch(f"--script={script}", "--", f"--data_dir={tmp_path}", timeout=120)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    lines = _task_lines(result.stdout)
    for name in TASKS:
        job, index = re.match(r"([a-z]+)(\d+)", name).groups()
        assert f"GOT {job} {index} {tmp_path}" in lines[name], lines[name][-5:]


# What shows a task's second life in its lines: a worker's session again, a ps serving again.
_BACK = {"worker0": "worker0: session ready at global step",
         "worker1": "worker1: session ready at global step",
         "ps0": "ps0: serving variables"}


@pytest.mark.cluster
@pytest.mark.timeout(300)
@pytest.mark.parametrize("victim", ["worker1", "ps0", "worker0"])
def test_a_killed_task_is_restarted_and_the_run_ends_at_its_exact_last_step(tmp_path, victim):
    """A task of the skeleton SIGKILLed in training, --max_restarts=1: the launcher says so
    and starts it again with the same command; a worker rejoins (the chief adopts the model
    the ps still holds), a ps comes back empty and the chief's session, lost with it, is
    made again from the model's checkpoint or afresh; every task exits 0 and the final
    checkpoint holds exactly the last step (the counted step: a step whose worker died
    after reserving its number still counts once). (3,000 steps, not a few hundred: the
    run must outlast the restart.)"""
    log = tmp_path / "launch.log"
    proc = clusters.start([sys.executable, "-m", "lowlevel.launch", f"--script={SKELETON}",
                           "--max_restarts=1", "--", "--last_step=3000",
                           f"--checkpoint_dir={tmp_path / 'ckpt'}"], log)
    try:
        _wait_for(log, f"[{victim}] ", proc)
        task = _task_process(proc.pid, victim, time.monotonic() + 60)
        before = task.cmdline()
        _wait_for(log, "worker1: session ready at global step", proc)
        _wait_for(log, "worker0: session ready at global step", proc)
        task.kill()
        _wait_for(log, f"launch: {victim} was killed by SIGKILL; restarting it (restart 1 of 1)",
                  proc)
        again = _task_process(proc.pid, victim, time.monotonic() + 60)
        assert again.pid != task.pid and again.cmdline() == before
        code = proc.wait(240)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
    text = log.read_text()
    assert code == 0, clusters.tail(log, 60)
    assert "launch: all 3 tasks exited 0 after" in text and f"(restarts: {victim} x1)" in text
    assert text.count(_BACK[victim]) == 2, clusters.tail(log, 60)  # it came back
    path, step = checkpoints.newest_readable(str(tmp_path / "ckpt"))
    assert step == 3000, path
    assert not clusters.leftovers(tmp_path)


FAILING = ("import sys, time\n"
           "if '--job_name=worker' in sys.argv and '--task_index=1' in sys.argv:\n"
           "    raise ValueError('the model is wrong')\n"
           "time.sleep(120)\n")


@pytest.mark.cluster
@pytest.mark.timeout(180)
def test_a_scripts_exception_fails_the_run_with_1_naming_the_task(tmp_path):
    """worker1's script raises: its traceback, then the launcher names it, does not restart
    it (1 is permanent, whatever --max_restarts), stops the others and exits 1."""
    script = tmp_path / "failing.py"
    script.write_text(FAILING)
    result = _launch(f"--script={script}", "--max_restarts=2", timeout=120)
    assert result.returncode == 1, result.stdout[-4000:]
    assert "[worker1] ValueError: the model is wrong" in result.stdout, result.stdout[-3000:]
    assert ("launch: worker1 exited with status 1 (permanent failure); not restarting it; "
            "stopping the other tasks") in result.stdout, result.stdout[-3000:]
    assert "restarting it" not in result.stdout.replace("not restarting it", "")
    assert "launch: all" not in result.stdout
    assert not clusters.leftovers(script)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("flags,needle", [
    ([f"--script={SKELETON}", "--model=cnn"], "--model is the trainer's and does not apply "
                                               "to --script"),
    ([f"--script={SKELETON}", "--output_dir=/tmp/x"], "--output_dir is the trainer's"),
    ([f"--script={SKELETON}", "--evaluator"], "--evaluator is the trainer's"),
    ([f"--script={SKELETON}", "--job_name=ps"], "--job_name is set by the launcher"),
    ([f"--script={SKELETON}", "--", "--task_index=1"], "--task_index=1 after '--': the "
                                                       "launcher gives each task"),
    (["--script=/nonexistent/script.py"], "--script=/nonexistent/script.py: no such file"),
    (["--script_cluster=tf_config"], "--script_cluster applies only with --script"),
])
def test_launcher_refuses_what_does_not_apply_to_a_script(flags, needle):
    result = _launch(*flags, timeout=50, cold=True)  # a usage error: no TensorFlow import
    assert result.returncode == 2, result
    assert needle in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "[ps0]" not in result.stdout


LAYOUT = ["--name=skel", "--namespace=ml", "--image=registry.example.com/lowlevel:0.1.0",
          "--num_ps=2", "--num_workers=2", "--output_dir=/output", "--pvc=skel-output",
          "--script=/output/skeleton_trainer.py"]
SCRIPT_ARGS = ["--last_step=500", "--checkpoint_dir=/output/ckpt"]


def _documents(fmt, *flags):
    result = clusters.run([sys.executable, "-m", "lowlevel.tf_configs", f"--format={fmt}",
                           *LAYOUT, *flags, "--", *SCRIPT_ARGS], timeout=60)
    assert result.returncode == 0, result.stderr
    return list(yaml.safe_load_all(result.stdout))


def _assert_script_container(container, extra_args=()):
    assert container["command"] == ["python", "-m", "lowlevel"]
    assert container["args"] == ["/output/skeleton_trainer.py", *SCRIPT_ARGS, *extra_args]
    assert [p["name"] for p in container["ports"]] == ["tfjob-port"]  # no metrics port
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert probe not in container


@pytest.mark.parametrize("version", [KUBERNETES_VERSIONS[0], KUBERNETES_VERSIONS[-1]])
def test_a_scripts_tfjob_validates_and_runs_python_m_lowlevel_with_tf_config(version):
    tfjob, policy = _documents("tfjob", "--chief_job", "--evaluator")
    validate_tfjob(tfjob, version)
    kubernetes_validate.validate(policy, version, strict=True)
    assert [p["port"] for i in policy["spec"]["ingress"] for p in i["ports"]] == [2222]
    specs = tfjob["spec"]["tfReplicaSpecs"]
    assert set(specs) == {"Chief", "Worker", "PS", "Evaluator"}
    for spec in specs.values():
        pod = spec["template"]["spec"]
        _assert_script_container(pod["containers"][0])
        assert "TF_CONFIG" not in {e["name"] for e in pod["containers"][0]["env"]}  # operator's
        assert restricted_violations(pod) == []
    configs = k8s.tfjob_tf_configs(tfjob)
    assert configs[("worker", 1)]["task"] == {"type": "worker", "index": 1}


def test_a_scripts_tfjob_with_the_guides_flags_has_the_runner_read_them_from_tf_config():
    """--format=tfjob --script_cluster=flags: one pod template per replica type, so the
    container runs `python -m lowlevel --cluster_flags_from_tf_config SCRIPT ARGS`, and
    the runner gives each pod's script the four flags of the task the operator's TF_CONFIG
    names; a TF_CONFIG with a chief, or none, is refused."""
    from lowlevel.__main__ import with_cluster_flags
    from lowlevel.errors import UsageError
    tfjob, _ = _documents("tfjob", "--script_cluster=flags")
    validate_tfjob(tfjob, KUBERNETES_VERSIONS[-1])
    for replica in tfjob["spec"]["tfReplicaSpecs"].values():
        container = replica["template"]["spec"]["containers"][0]
        assert container["command"] == ["python", "-m", "lowlevel",
                                        "--cluster_flags_from_tf_config"], container["command"]
    configs = k8s.tfjob_tf_configs(tfjob)
    assert set(configs) == {("worker", 0), ("worker", 1), ("ps", 0), ("ps", 1)}
    for (job, index), config in configs.items():
        replica = tfjob["spec"]["tfReplicaSpecs"][{"worker": "Worker", "ps": "PS"}[job]]
        container = replica["template"]["spec"]["containers"][0]
        argv = with_cluster_flags(container["command"][3:] + container["args"], json.dumps(config))
        assert argv == container["args"] + k8s.guide_flags(config["cluster"], job, index)
    with pytest.raises(UsageError, match="no TF_CONFIG in the environment"):
        with_cluster_flags(["--cluster_flags_from_tf_config", "s.py"], None)
    chief = {"cluster": {"chief": ["c:1"], "ps": ["p:1"], "worker": ["w:1"]},
             "task": {"type": "worker", "index": 0}}
    with pytest.raises(UsageError, match="ps and worker tasks only.*jobs \\['chief', 'ps', "):
        with_cluster_flags(["--cluster_flags_from_tf_config", "s.py"], json.dumps(chief))
    assert with_cluster_flags(["s.py", "--x=1"], json.dumps(chief)) == ["s.py", "--x=1"]


@pytest.mark.parametrize("cluster_as", ["flags", "tf_config"])
def test_a_scripts_plain_jobs_validate_with_the_guides_flags_or_tf_config(cluster_as):
    docs = _documents("k8s", f"--script_cluster={cluster_as}")
    assert [d["kind"] for d in docs] == ["Service"] + ["Job"] * 4 + ["NetworkPolicy"]
    for version in (KUBERNETES_VERSIONS[0], KUBERNETES_VERSIONS[-1]):
        for doc in docs:
            kubernetes_validate.validate(doc, version, strict=True)
    cluster = k8s.operator_cluster("skel", "ml", {"worker": 2, "ps": 2}, subdomain="skel")
    for job in docs[1:-1]:
        pod = job["spec"]["template"]["spec"]
        container = pod["containers"][0]
        role, index = pod["hostname"].split("-")[1:]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert restricted_violations(pod) == []
        if cluster_as == "flags":
            _assert_script_container(container, k8s.guide_flags(cluster, role, int(index)))
            assert container["args"][-2:] == [f"--job_name={role}", f"--task_index={index}"]
            assert "TF_CONFIG" not in env
        else:
            _assert_script_container(container)
            assert json.loads(env["TF_CONFIG"])["task"] == {"type": role, "index": int(index)}


@pytest.mark.cluster  # runs checkov (its own process, ~10-20 s)
@pytest.mark.timeout(300)
def test_checkov_fails_no_check_of_a_scripts_manifests(tmp_path):
    """No probes (a script serves no /healthz): CKV_K8S_8 and 9 are skipped in the manifest,
    with the reason; nothing fails."""
    report = run_checkov(tmp_path, {"k8s.yaml": _documents("k8s"),
                                    "tfjob-pods.yaml": _as_pods(_documents("tfjob")[0])})
    assert report["resources"] >= 5 and report["passed"] > 100
    assert report["failed"] == [], sorted({(f["check_id"], f["resource"])
                                           for f in report["failed"]})
    skipped = {s["check_id"] for s in report["skipped"]}
    assert {"CKV_K8S_8", "CKV_K8S_9"} <= skipped, skipped
    for s in report["skipped"]:
        assert len(s["check_result"].get("suppress_comment", "")) > 20, s


@pytest.mark.parametrize("flags,needle", [
    (["--format=tfjob", "--script_cluster=flags", "--evaluator"],
     "the guide's flags name ps and worker tasks only"),
    (["--format=k8s", "--chief_job"], "the guide's flags name ps and worker tasks only"),
    (["--format=k8s", "--max_restarts=3"], "--max_restarts is the trainer's"),
    (["--format=k8s", "--metrics_port=9000"], "--metrics_port is the trainer's"),
    (["--format=tfjob", "--pod_monitor"], "--pod_monitor is the trainer's"),
    (["--format=tfjob", "--sync"], "--sync is the trainer's"),
    (["--format=k8s", "--", "--job_name=ps"], "--job_name=ps: set by this tool"),
])
def test_generator_refuses_what_does_not_apply_to_a_script(flags, needle):
    result = clusters.run([sys.executable, "-m", "lowlevel.tf_configs", *LAYOUT, *flags],
                          timeout=60)
    assert result.returncode == 2 and not result.stdout, result.stdout[-2000:]
    assert needle in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_generator_prints_a_scripts_commands_for_named_hosts():
    """--format=shell: one `python -m lowlevel SCRIPT ARGS` line per task, with the guide's
    flags (default) or TF_CONFIG before it."""
    hosts = ["--workers=h1:2222,h2:2222", "--ps=h3:2222", "--script=/app/skeleton.py"]
    flags = clusters.run([sys.executable, "-m", "lowlevel.tf_configs", *hosts, "--",
                          "--last_step=5"], timeout=60)
    assert flags.returncode == 0, flags.stderr
    assert flags.stdout.splitlines() == [
        f"python -m lowlevel /app/skeleton.py --last_step=5 --ps_hosts=h3:2222 "
        f"--worker_hosts=h1:2222,h2:2222 --job_name={job} --task_index={i}"
        for job, i in (("worker", 0), ("worker", 1), ("ps", 0))]
    env = clusters.run([sys.executable, "-m", "lowlevel.tf_configs", *hosts,
                        "--script_cluster=tf_config", "--format=json"], timeout=60)
    assert env.returncode == 0, env.stderr
    tasks = json.loads(env.stdout)
    assert [t["tf_config"]["task"] for t in tasks] == [
        {"type": "worker", "index": 0}, {"type": "worker", "index": 1},
        {"type": "ps", "index": 0}]
    assert all(t["command"].endswith(" python -m lowlevel /app/skeleton.py") for t in tasks)


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_the_tasks_of_a_scripts_plain_jobs_train_to_the_end(tmp_path, hosts_factory):
    """Each Job's container (`python -m lowlevel SKELETON ARGS` and its four guide flags, no
    TF_CONFIG) run on a host of its own where the Service's host names resolve: every task
    exits 0, the ps at the chief's end."""
    result = clusters.run([sys.executable, "-m", "lowlevel.tf_configs", "--format=k8s",
                           "--name=skel", "--namespace=ml", "--image=lowlevel:test",
                           "--num_ps=1", "--num_workers=2", f"--output_dir={tmp_path}",
                           "--pvc=unused", f"--script={SKELETON}", "--", "--last_step=300",
                           f"--checkpoint_dir={tmp_path / 'ckpt'}"], timeout=60)
    assert result.returncode == 0, result.stderr
    tasks = {}
    for job in yaml.safe_load_all(result.stdout):
        if job["kind"] == "Job":
            pod = job["spec"]["template"]["spec"]
            container = pod["containers"][0]
            name = pod["hostname"].split("-", 1)[1].replace("-", "")  # skel-ps-0 -> ps0
            argv = [sys.executable if w == "python" else w for w in container["command"]]
            tasks[name] = ([f"{pod['hostname']}.{pod['subdomain']}.ml.svc"],
                           argv + container["args"])
    assert sorted(tasks) == ["ps0", "worker0", "worker1"]
    hosts = hosts_factory({name: names for name, (names, _) in tasks.items()})
    procs, logs = {}, {}
    for name, (_, argv) in tasks.items():
        logs[name] = tmp_path / f"{name}.log"
        procs[name] = clusters.start_on(hosts, name, argv, logs[name])
    done = clusters.wait_all(procs, 240)
    for name, (code, _) in done.items():
        assert code == 0, f"{name} exited {code}:\n{clusters.tail(logs[name])}"
    assert "the chief signalled the end of training" in logs["ps0"].read_text()
    path, step = checkpoints.newest_readable(str(tmp_path / "ckpt"))
    assert step == 300, path
