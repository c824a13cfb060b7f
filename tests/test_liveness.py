"""The manifests' liveness probe, run as the kubelet runs it, against real tasks.

A live ps passes it; a ps frozen with SIGSTOP (its kernel still accepts TCP connections:
a TCP probe would pass) fails it within one period. And a frozen ps in a real 1 ps + 2
worker run is found by the probe, killed and started again, as the kubelet and the Job
or the training operator would, and the run recovers to its exact last step."""

import signal
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest
import yaml

import clusters
from lowlevel.ops import k8s


def manifest_probes():
    """The liveness and startup probes of a generated ps pod."""
    result = clusters.run([sys.executable, "-m", "lowlevel.tf_configs", "--format=k8s", "--name=r",
                           "--image=i:1", "--pvc=p", "--output_dir=/o", "--namespace=ml"],
                          timeout=60)
    assert result.returncode == 0, result.stderr
    job = next(d for d in yaml.safe_load_all(result.stdout)
               if d["kind"] == "Job" and d["metadata"]["name"] == "r-ps-0")
    container = job["spec"]["template"]["spec"]["containers"][0]
    return container["livenessProbe"], container["startupProbe"]


def probe_once(probe: dict, port: int) -> bool:
    """One httpGet probe as the kubelet makes it: success is a status 200-399 within
    timeoutSeconds (the kubelet probes the pod's IP; here the task is on loopback)."""
    url = f"http://127.0.0.1:{port}{probe['httpGet']['path']}"
    try:
        with urllib.request.urlopen(url, timeout=probe["timeoutSeconds"]) as r:
            return 200 <= r.status < 400
    except (urllib.error.URLError, OSError):
        return False


def wait_started(startup: dict, port: int, proc, log) -> float:
    """Probes every periodSeconds until one passes, within failureThreshold; returns the
    seconds it took."""
    t0 = time.monotonic()
    for _ in range(startup["failureThreshold"]):
        if probe_once(startup, port):
            return time.monotonic() - t0
        assert proc.poll() is None, clusters.tail(log)
        time.sleep(1)  # the kubelet waits periodSeconds; sooner here, same verdict
    raise AssertionError(f"startup probe never passed:\n{clusters.tail(log)}")


def _ps_argv(ports, metrics_port, *flags):
    p = ports(3)
    return clusters.trainer_argv([f"127.0.0.1:{p[0]}"], [f"127.0.0.1:{p[1]}",
                                                         f"127.0.0.1:{p[2]}"], "ps", 0,
                                 f"--metrics_port={metrics_port}", *flags), p


@pytest.mark.cluster  # starts a ps
@pytest.mark.timeout(180)
def test_liveness_probe_passes_on_a_live_ps_and_fails_on_a_frozen_one(ports, tmp_path):
    liveness, startup = manifest_probes()
    assert liveness["httpGet"] == {"path": "/healthz", "port": k8s.METRICS_PORT}
    assert liveness["timeoutSeconds"] < liveness["periodSeconds"]
    metrics_port = ports(1)[0]
    argv, _ = _ps_argv(ports, metrics_port)
    log = tmp_path / "ps0.log"
    proc = clusters.start(argv, log)
    try:
        took = wait_started(startup, metrics_port, proc, log)
        print(f"startup probe passed after {took:.1f} s", file=sys.stderr)
        assert all(probe_once(liveness, metrics_port) for _ in range(3))
        proc.send_signal(signal.SIGSTOP)
        t0 = time.monotonic()
        assert not probe_once(liveness, metrics_port)
        failed_in = time.monotonic() - t0
        assert failed_in <= liveness["periodSeconds"], failed_in  # within one period
        # failureThreshold failures in a row: the kubelet restarts the container.
        assert not any(probe_once(liveness, metrics_port)
                       for _ in range(liveness["failureThreshold"] - 1))
        proc.send_signal(signal.SIGCONT)
        deadline = time.monotonic() + 30
        while not probe_once(liveness, metrics_port):  # thawed, it answers again
            assert time.monotonic() < deadline
            time.sleep(0.5)
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.kill()
        proc.wait(timeout=30)


class Kubelet(threading.Thread):
    """Runs one task's liveness probe every periodSeconds; after failureThreshold failures
    in a row kills the process (SIGKILL: a stopped process cannot act on the kubelet's
    SIGTERM) and starts a new one with the same command, as the Job controller or the
    training operator (restartPolicy: ExitCode, status 137) would."""

    def __init__(self, probe, port, argv, log):
        super().__init__(daemon=True)
        self.probe, self.port, self.argv, self.log = probe, port, argv, log
        self.proc = clusters.start(argv, log)
        self.restarts, self.halt = [], threading.Event()

    def run(self):
        # On a ticker, as the kubelet's prober: a probe every periodSeconds however long
        # the last one took (one against a frozen task takes its timeoutSeconds).
        failures, next_at = 0, time.monotonic()
        while True:
            next_at += self.probe["periodSeconds"]
            if self.halt.wait(max(0.0, next_at - time.monotonic())):
                return
            if self.proc.poll() is not None:
                return  # it ended by itself (the chief's word): nothing to probe
            if probe_once(self.probe, self.port):
                failures = 0
                continue
            failures += 1
            if failures >= self.probe["failureThreshold"]:
                self.proc.kill()
                self.proc.wait()
                self.restarts.append(time.time())
                with open(self.log, "a") as f:
                    f.write("kubelet: liveness probe failed; container restarted\n")
                self.proc = clusters.start(self.argv, self.log, append=True)
                failures = 0


class Operator(threading.Thread):
    """The manifests' restart policy for one worker (the TFJob's `restartPolicy: ExitCode`,
    the plain Jobs' podFailurePolicy): a process that exits with the retryable status 200
    is started again with the same command, at most `limit` times; `done` is set once it
    ends otherwise (or past the limit)."""

    def __init__(self, argv, log, limit: int = 2):
        super().__init__(daemon=True)
        self.argv, self.log, self.limit = argv, log, limit
        self.proc = clusters.start(argv, log)
        self.restarts, self.done, self.halt = 0, threading.Event(), threading.Event()

    def run(self):
        while True:
            code = self.proc.wait()
            if code != 200 or self.restarts >= self.limit or self.halt.is_set():
                self.done.set()
                return
            self.restarts += 1
            with open(self.log, "a") as f:
                f.write("operator: exit status 200 (retryable); pod restarted\n")
            self.proc = clusters.start(self.argv, self.log, append=True)

    def stop(self):
        self.halt.set()
        if self.proc.poll() is None:
            self.proc.kill()
        self.done.wait(30)
        self.proc.wait()


STEPS = 3000


@pytest.mark.cluster  # starts a cluster
@pytest.mark.timeout(600)
def test_a_frozen_ps_is_restarted_by_its_liveness_probe_and_the_run_recovers(ports, tmp_path):
    liveness, _ = manifest_probes()
    p = ports(4)
    ps_hosts, worker_hosts = [f"127.0.0.1:{p[0]}"], [f"127.0.0.1:{p[1]}", f"127.0.0.1:{p[2]}"]
    out = tmp_path / "out"
    flags = [f"--output_dir={out}", f"--train_steps={STEPS}", "--save_checkpoint_steps=250",
             "--keep_exports=0"]
    kubelet = Kubelet(liveness, p[3],
                      clusters.trainer_argv(ps_hosts, worker_hosts, "ps", 0, *flags,
                                            f"--metrics_port={p[3]}"), tmp_path / "ps0.log")
    workers = {f"worker{i}": Operator(clusters.trainer_argv(ps_hosts, worker_hosts, "worker",
                                                           i, *flags), tmp_path / f"worker{i}.log")
               for i in range(2)}
    kubelet.start()
    for operator in workers.values():
        operator.start()
    frozen_at = None
    try:
        deadline = time.monotonic() + 180
        while frozen_at is None:  # freeze the ps once training is under way
            records = clusters.task_events(out, "worker0", "checkpoint_saved")
            if any(r["global_step"] >= 500 for r in records):
                kubelet.proc.send_signal(signal.SIGSTOP)
                frozen_at = time.time()
            assert time.monotonic() < deadline, clusters.tail(tmp_path / "worker0.log")
            time.sleep(0.2)
        ended = time.monotonic() + 360
        for operator in workers.values():
            assert operator.done.wait(max(1.0, ended - time.monotonic()))
        kubelet.proc.wait(timeout=60)  # the restarted ps exits at the chief's word
    finally:
        kubelet.halt.set()
        kubelet.proc.send_signal(signal.SIGCONT)
        if kubelet.proc.poll() is None:
            kubelet.proc.kill()
        kubelet.proc.wait()
        for operator in workers.values():
            operator.stop()
    for name, operator in workers.items():
        code = operator.proc.returncode
        assert code == 0, f"{name} exited {code}:\n{clusters.tail(tmp_path / f'{name}.log')}"
        if operator.restarts:  # a step after the ps's restart can hang in TensorFlow
            print(f"{name} restarted {operator.restarts} time(s) after exit status 200",
                  file=sys.stderr)
    assert kubelet.proc.returncode == 0, clusters.tail(tmp_path / "ps0.log")
    assert len(kubelet.restarts) == 1
    found = kubelet.restarts[0] - frozen_at
    budget = liveness["periodSeconds"] * (liveness["failureThreshold"] + 1)
    print(f"frozen ps restarted {found:.1f} s after the freeze", file=sys.stderr)
    assert found <= budget, found
    assert clusters.final_metrics(out)["global_step"] == STEPS
    recovered = clusters.task_events(out, "worker0", "recovered")
    assert recovered and recovered[0]["origin"] == "restored", recovered
