"""lowlevel.runtime.metrics: every task's Prometheus metrics and health.

In-process: the figures from events, evaluations and the loop's hook; the names follow
Prometheus' conventions; the TCP counters of real sockets. A real 1 ps + 2 worker run
scraped with prometheus_client's own parser: the chief's step counter ends at the final
step, and the bytes each worker moves to and from the ps match the benchmark's counters
(`benchmarks._measure.Watcher`, the kernel's counters read with `ss`) within 10 %."""

import http.client
import json
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

import clusters
from lowlevel import events
from lowlevel.runtime import metrics


def scrape(port_or_metrics, path="/metrics", timeout=5.0):
    """(status, body) of a GET on a task's metrics port, or of a TaskMetrics directly."""
    if isinstance(port_or_metrics, metrics.TaskMetrics):
        status, _, body = port_or_metrics.http_response(path)
        return status, body.decode()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port_or_metrics}{path}",
                                    timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def samples(text) -> dict:
    """{(sample name, frozen labels): value} of a scrape, parsed by prometheus_client."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(text, name, **labels):
    return samples(text).get((name, tuple(sorted(labels.items()))))


class FakeProgress:
    """What `_TrainingCollector` reads of a `progress.ProgressHook`."""

    def __init__(self):
        self.step_secs, self.local_steps = [], 0


class FakeLoop:
    value = 0


def test_training_figures_come_from_the_hook_and_the_events():
    m = metrics.TaskMetrics("worker0", "worker", 0)
    progress, loop = FakeProgress(), FakeLoop()
    m.watch_training(progress, loop, batch_size=64)
    progress.step_secs += [0.0004, 0.003, 0.003, 0.2]
    progress.local_steps, loop.value = 24, 1234  # 20 warm-up steps are not timed
    text = scrape(m)[1]
    assert value(text, "lowlevel_global_step") == 1234
    assert value(text, "lowlevel_local_steps_total") == 24
    assert value(text, "lowlevel_examples_total") == 24 * 64
    assert value(text, "lowlevel_step_duration_seconds_count") == 4
    assert value(text, "lowlevel_step_duration_seconds_bucket", le="0.0005") == 1
    assert value(text, "lowlevel_step_duration_seconds_bucket", le="0.005") == 3
    assert value(text, "lowlevel_step_duration_seconds_bucket", le="+Inf") == 4
    assert value(text, "lowlevel_step_duration_seconds_sum") == pytest.approx(0.2064)
    progress.step_secs.append(0.003)  # the next scrape folds in only the new ones
    assert value(scrape(m)[1], "lowlevel_step_duration_seconds_count") == 5
    m.on_event("progress", 1300, {"loss": 0.25, "examples_per_sec": 9000.0,
                                  "train_steps": 2000,
                                  "dynamic_rows": {"model/deep/embeddings/shard1": 20632}})
    m.on_event("checkpoint_saved", 1300, {"path": "model.ckpt-1300"})
    m.on_event("fault_noticed", 1301, {"error": "UnavailableError"})
    m.on_event("fault_noticed", 1302, {"error": "UnavailableError"})
    m.on_event("recovered", 1302, {"origin": "ready"})
    text = scrape(m)[1]
    assert value(text, "lowlevel_loss") == 0.25
    assert value(text, "lowlevel_cluster_examples_per_second") == 9000
    assert value(text, "lowlevel_train_steps") == 2000
    assert value(text, "lowlevel_dynamic_embedding_rows",
                 shard="model/deep/embeddings/shard1") == 20632
    assert value(text, "lowlevel_checkpoint_saves_total") == 1
    assert value(text, "lowlevel_faults_total", kind="fault_noticed") == 2
    assert value(text, "lowlevel_faults_total", kind="recovered") == 1
    assert value(text, "lowlevel_faults_total", kind="preempted") == 0


def test_events_reach_the_metrics_through_the_listener(tmp_path):
    m = metrics.TaskMetrics("ps0", "ps", 0)
    events.add_listener(m.on_event)
    try:
        events.emit("preempted", None, signal="SIGTERM", checkpoint=None)
    finally:
        events._listeners.remove(m.on_event)
    assert value(scrape(m)[1], "lowlevel_faults_total", kind="preempted") == 1


def test_the_evaluator_reports_its_last_record():
    m = metrics.TaskMetrics("evaluator0", "evaluator", 0)
    m.evaluated({"global_step": 500, "accuracy": 0.9, "loss": 0.3, "split": "test"})
    m.evaluated({"global_step": 1000, "accuracy": 0.95, "loss": 0.2, "auc": 0.8,
                 "split": "test"})
    text = scrape(m)[1]
    assert value(text, "lowlevel_eval_global_step", split="test") == 1000
    assert value(text, "lowlevel_eval_accuracy", split="test") == 0.95
    assert value(text, "lowlevel_eval_auc", split="test") == 0.8
    assert value(text, "lowlevel_evaluations_total", split="test") == 2
    assert value(text, "lowlevel_eval_last_timestamp_seconds", split="test") > 1e9


def test_files_of_the_run_checkpoint_age_and_a_ps_variable_bytes(tmp_path):
    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-1500"\n'
                                         'all_model_checkpoint_paths: "model.ckpt-1500"\n')
    (tmp_path / metrics.PLACEMENT_FILE).write_text('{"ps_variable_bytes": {"ps0": 100, '
                                                   '"ps1": 250}}')
    text = scrape(metrics.TaskMetrics("ps1", "ps", 1, str(tmp_path)))[1]
    assert value(text, "lowlevel_checkpoint_last_step") == 1500
    assert 0 <= value(text, "lowlevel_checkpoint_age_seconds") < 60
    assert value(text, "lowlevel_ps_variable_bytes") == 250
    assert value(scrape(metrics.TaskMetrics("worker0", "worker", 0, str(tmp_path)))[1],
                 "lowlevel_ps_variable_bytes") is None


# Prometheus' conventions (prometheus.io/docs/practices/naming): a prefix of our own,
# base units in the name, counters ending in _total.
def test_names_follow_prometheus_conventions(tmp_path):
    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-10"\n')
    texts = []
    for job, task in (("worker", "worker0"), ("ps", "ps0"), ("evaluator", "evaluator0")):
        m = metrics.TaskMetrics(task, job, 0, str(tmp_path))
        m.watch_training(FakeProgress(), FakeLoop(), 1)
        m.evaluated({"global_step": 1, "accuracy": 1.0, "loss": 0.0, "split": "test"})
        m.network = metrics.NetworkCounters({}, None, [])
        m.memory_limit = 2 ** 30
        texts.append(scrape(m)[1])
    seen = set()
    for text in texts:
        for family in text_string_to_metric_families(text):
            if family.name.startswith(("process_", "python_")):
                continue
            seen.add(family.name)
            assert re.fullmatch(r"lowlevel_[a-z0-9_]+", family.name), family.name
            assert family.documentation, family.name
            if family.type == "counter":
                assert all(s.name.endswith("_total") for s in family.samples), family.name
            else:
                assert not family.name.endswith("_total"), family.name
            if re.search(r"_(bytes|seconds)_", family.name + "_"):  # a unit: at the end
                assert family.name.endswith(("_bytes", "_seconds")), family.name
    with open(f"{clusters.ROOT}/docs/metrics.md") as f:
        documented = set(re.findall(r"`(lowlevel_[a-z0-9_]+)`", f.read()))
    undocumented = {n for n in seen if n not in documented and f"{n}_total" not in documented}
    assert not undocumented, f"not in docs/metrics.md: {sorted(undocumented)}"


def test_health_is_503_until_the_task_serves_then_follows_its_server():
    m = metrics.TaskMetrics("ps0", "ps", 0)
    assert scrape(m, "/healthz") == (503, "starting\n")
    assert scrape(m, "/nothing")[0] == 404
    up = [True]
    m.set_health(lambda: (up[0], "ok" if up[0] else "the gRPC server does not answer"))
    assert scrape(m, "/healthz")[0] == 200
    up[0] = False
    assert scrape(m, "/healthz") == (503, "the gRPC server does not answer\n")


def test_tcp_counters_of_real_sockets_by_peer():
    """A connection this process opened to a 'ps' address, and one a 'ps' opened to our
    'server' port: each attributed, and the bytes of a closed one kept."""
    server, own = socket.create_server(("127.0.0.1", 0)), socket.create_server(("127.0.0.1", 0))
    ps_port, own_port = server.getsockname()[1], own.getsockname()[1]
    counters = metrics.NetworkCounters({"ps0": f"127.0.0.1:{ps_port}"}, own_port, ["ps0"])
    out = socket.create_connection(("127.0.0.1", ps_port))
    accepted, _ = server.accept()
    incoming_client = socket.create_connection(("127.0.0.1", own_port))
    incoming, _ = own.accept()
    try:
        out.sendall(b"x" * 100_000)
        got = 0
        while got < 100_000:
            got += len(accepted.recv(65536))
        accepted.sendall(b"y" * 3000)
        incoming.sendall(b"z" * 5000)
        for sock, n in ((out, 3000), (incoming_client, 5000)):
            got = 0
            while got < n:
                got += len(sock.recv(65536))
        deadline = time.monotonic() + 10
        while True:  # an ack may lag the data by a moment
            sent, received = counters.totals()
            if (sent.get("ps0", 0) >= 105_000 and received.get("ps0", 0) >= 3000
                    or time.monotonic() > deadline):
                break
            time.sleep(0.05)
        # out (sent 100,000) and incoming (sent 5,000) are ps0's; accepted, the ps end of
        # `out`, reached on the ps port from an ephemeral one, is not cluster traffic. The
        # kernel counts an acknowledged SYN as a byte (what `ss` shows too).
        assert 105_000 <= sent["ps0"] <= 105_002, sent
        assert 3000 <= received["ps0"] <= 3002, received
        before = sent["ps0"], received["ps0"]
        out.close()
        accepted.close()
        time.sleep(0.1)
        assert counters.totals() == ({"ps0": before[0]}, {"ps0": before[1]})  # kept
    finally:
        for s in (out, accepted, incoming_client, incoming, server, own):
            s.close()


def test_serve_on_a_port_in_use_is_a_usage_error(ports):
    from lowlevel.config import UsageError
    busy = socket.create_server(("", ports(1)[0]))
    try:
        with pytest.raises(UsageError, match=r"--metrics_port=\d+: port \d+ is already in use"):
            metrics.serve(busy.getsockname()[1], "worker0", "worker", 0)
    finally:
        busy.close()


def test_linger_waits_for_one_scrape_that_began_after_it(ports, monkeypatch):
    monkeypatch.setattr(metrics, "_current", None)  # serve's globals, restored after
    monkeypatch.setattr(events, "_listeners", list(events._listeners))
    m = metrics.serve(ports(1)[0], "worker0", "worker", 0)
    try:
        _linger_waits(m)
    finally:
        m.close()


def _linger_waits(m):
    t0 = time.monotonic()
    assert m.linger(0.3) is False  # nobody scrapes: the limit
    assert time.monotonic() - t0 >= 0.3
    assert scrape(m.port, "/healthz")[0] in (200, 503)  # a probe is not a scrape
    later = threading.Timer(0.5, scrape, args=(m.port,))
    later.start()
    t0 = time.monotonic()
    try:
        assert m.linger(30) is True
        assert 0.4 <= time.monotonic() - t0 < 20
    finally:
        later.join(10)


# A real run, scraped.
STEPS = 5000


def _scraper(task: str, port: int, stop: threading.Event, out: list):
    """Scrapes one task every 0.1 s: out gets (unix time, task, parsed samples).

    One thread per task: a task that is exiting can accept a connection and never
    answer, and its 2 s timeout must not eat another task's window (the chief's
    final step shows for well under a second between its last step and its exit).
    """
    while not stop.is_set():
        try:
            t0 = time.time()
            status, text = scrape(port, timeout=2)
            t1 = time.time()
        except (OSError, http.client.HTTPException):  # an exiting task: cut off mid-answer
            stop.wait(0.05)
            continue
        if status == 200:
            out.append(((t0 + t1) / 2, task, samples(text)))
        stop.wait(0.1)


def _bytes(parsed, peer):
    return sum(v for (name, labels), v in parsed.items()
               if name in ("lowlevel_network_transmit_bytes_total",
                           "lowlevel_network_receive_bytes_total")
               and dict(labels).get("peer") == peer)


def _step(parsed):
    return parsed.get(("lowlevel_global_step", ()))


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_a_real_run_scrapes_with_the_final_step_and_the_benchmarks_bytes(ports, tmp_path):
    from benchmarks._measure import Watcher
    p = ports(6)
    ps_hosts, worker_hosts = [f"127.0.0.1:{p[0]}"], [f"127.0.0.1:{p[1]}", f"127.0.0.1:{p[2]}"]
    out = tmp_path / "out"
    metric_ports = {"ps0": p[3], "worker0": p[4], "worker1": p[5]}
    flags = [f"--output_dir={out}", f"--train_steps={STEPS}", "--save_checkpoint_steps=1000",
             "--keep_exports=0", "--metrics_linger_secs=30"]
    procs = {}
    for name, (job, index) in {"ps0": ("ps", 0), "worker0": ("worker", 0),
                               "worker1": ("worker", 1)}.items():
        procs[name] = clusters.start(
            clusters.trainer_argv(ps_hosts, worker_hosts, job, index, *flags,
                                  f"--metrics_port={metric_ports[name]}"),
            tmp_path / f"{name}.log")
    watcher = Watcher(interval=0.1)
    for name, host in (("ps0", ps_hosts[0]), ("worker0", worker_hosts[0]),
                       ("worker1", worker_hosts[1])):
        watcher.add(name, procs[name].pid, name.rstrip("0123456789"),
                    [int(host.rpartition(":")[2])])
    watcher.start()
    scraped, stop = [], threading.Event()
    threads = [threading.Thread(target=_scraper, args=(task, port, stop, scraped), daemon=True)
               for task, port in metric_ports.items()]
    for thread in threads:
        thread.start()
    try:
        statuses = clusters.wait_all(procs, 240)
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)
        watcher.stop()
    for name, (code, _) in statuses.items():
        assert code == 0, f"{name} exited {code}:\n{clusters.tail(tmp_path / f'{name}.log')}"
    assert clusters.final_metrics(out)["global_step"] == STEPS

    by_task = {t: [(ts, s) for ts, task, s in scraped if task == t] for t in metric_ports}
    # The step counter: the chief's last scrape (the one --metrics_linger_secs waits for,
    # after its session ended) shows the final step exactly; its local steps are its own.
    assert "worker0: scraped" in (tmp_path / "worker0.log").read_text()
    chief_last = by_task["worker0"][-1][1]
    assert _step(chief_last) == STEPS
    tasks_file = json.loads((out / "tasks" / "worker0.json").read_text())
    assert chief_last[("lowlevel_local_steps_total", ())] == tasks_file["local_steps"]
    # The newest checkpoint: at every scrape, the step of the newest save the chief had
    # reported by then (or of the next one: the checkpoint file is written just before the
    # event). Not "the last scrape shows the final one": the final save may end after the
    # last scrape a loaded machine fits into the chief's last second (CI: 4002, not 5000).
    saves = [(r["unix_time"], r["global_step"])
             for r in clusters.task_events(out, "worker0", "checkpoint_saved")]
    assert saves and saves[-1][1] == STEPS, saves
    shown = [(ts, s[("lowlevel_checkpoint_last_step", ())]) for ts, s in by_task["worker0"]
             if ("lowlevel_checkpoint_last_step", ()) in s]
    assert shown, "no scrape of the chief showed lowlevel_checkpoint_last_step"
    for ts, step in shown:
        allowed = [st for t, st in saves if t <= ts][-1:] + [st for t, st in saves if t > ts][:1]
        assert step in allowed, (ts, step, saves)
    ps_last = by_task["ps0"][-1][1]
    assert ps_last[("lowlevel_ps_variable_bytes", ())] > 0
    assert ps_last[("process_resident_memory_bytes", ())] > 100 * 2 ** 20
    assert ps_last[("lowlevel_cpus", ())] >= 1

    # Bytes: each worker's to and from ps0 over a window of steady training, as a rate,
    # against the Watcher's for the same pair and window (bytes per step differ by the
    # same factor: the same steps are divided into both).
    for worker in ("worker0", "worker1"):
        window = [(ts, s) for ts, s in by_task[worker]
                  if _step(s) is not None and STEPS * 0.1 <= _step(s) <= STEPS * 0.9]
        assert len(window) >= 10, f"{worker}: {len(window)} scrapes in steady training"
        (t1, s1), (t2, s2) = window[0], window[-1]
        assert t2 - t1 >= 2.0, f"{worker}: window of {t2 - t1:.1f} s"
        ours = (_bytes(s2, "ps0") - _bytes(s1, "ps0")) / (t2 - t1)
        secs, per_ps = watcher.bytes_in_window(t1, t2, [worker])
        theirs = per_ps.get("ps0", 0) / secs
        steps = _step(s2) - _step(s1)
        print(f"{worker}: {ours / 1e6:.1f} MB/s here, {theirs / 1e6:.1f} MB/s by ss; "
              f"{ours * (t2 - t1) / steps / 1e3:.1f} KB per global step", file=sys.stderr)
        assert theirs > 0 and abs(ours - theirs) / theirs <= 0.10, (worker, ours, theirs)


def test_the_grafana_dashboard_queries_only_metrics_the_tasks_export(tmp_path):
    with open(f"{clusters.ROOT}/scripts/grafana-dashboard.json") as f:
        dashboard = json.load(f)
    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-10"\n')
    (tmp_path / metrics.PLACEMENT_FILE).write_text('{"ps_variable_bytes": {"ps0": 1}}')
    exported = set()
    for job, task in (("worker", "worker0"), ("ps", "ps0"), ("evaluator", "evaluator0")):
        m = metrics.TaskMetrics(task, job, 0, str(tmp_path))
        m.watch_training(FakeProgress(), FakeLoop(), 1)
        m.evaluated({"global_step": 1, "accuracy": 1.0, "loss": 0.0, "auc": 0.5,
                     "split": "test"})
        m.threads.labels("intra_op").set(1)
        m.network = metrics.NetworkCounters({}, None, [])
        m.network._closed_sent = m.network._closed_received = {"ps0": 1}
        exported |= {name for name, _ in samples(scrape(m)[1])}
    used = set()
    assert dashboard["panels"] and dashboard["uid"]
    for panel in dashboard["panels"]:
        assert panel["title"] and panel["targets"], panel
        assert panel["datasource"]["uid"] == "${datasource}"
        for target in panel["targets"]:
            assert 'lowlevel_run="$run"' in target["expr"], target["expr"]
            used |= set(re.findall(r"\b((?:lowlevel|process)_[a-z0-9_]+)\b", target["expr"]))
    used -= {"lowlevel_run", "lowlevel_role"}  # the pods' labels, on every series
    assert used and used <= exported, sorted(used - exported)
    # Every figure the issue asks the dashboard's run view for is on it.
    for name in ("lowlevel_global_step", "lowlevel_step_duration_seconds_bucket",
                 "lowlevel_examples_total", "lowlevel_network_transmit_bytes_total",
                 "lowlevel_network_receive_bytes_total", "lowlevel_checkpoint_age_seconds",
                 "lowlevel_restarts_total", "lowlevel_faults_total", "lowlevel_eval_accuracy",
                 "lowlevel_ps_variable_bytes", "process_resident_memory_bytes"):
        assert name in used, name


def test_the_launcher_gives_each_task_its_own_metrics_port():
    """In a process of its own: the launcher defines the trainer's flags, which other
    tests' modules (benchmarks, tf_configs) define too."""
    code = ("import json; from lowlevel import launch; "
            "c = launch.task_commands(1, 2, '/tmp/out', ['--metrics_port=9300'], "
            "evaluator=True); w = launch.metrics_ports(c, 9300); "
            "print(json.dumps([w, {n: [a for a in v if a.startswith('--metrics_port=')] "
            "for n, v in c.items()}]))")
    result = subprocess.run([sys.executable, "-c", code], cwd=clusters.ROOT, env=clusters.ENV,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    where, ports = json.loads(result.stdout.strip().splitlines()[-1])
    assert ports == {"ps0": ["--metrics_port=9300"], "worker0": ["--metrics_port=9301"],
                     "worker1": ["--metrics_port=9302"], "evaluator0": ["--metrics_port=9303"]}
    assert where.endswith("ps0 :9300, worker0 :9301, worker1 :9302, evaluator0 :9303")
