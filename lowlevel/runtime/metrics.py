"""Prometheus metrics of one task, and its health, on `--metrics_port` (0: off).

    GET /metrics   the Prometheus text format (prometheus_client)
    GET /healthz   200 "ok" once the task's gRPC server answers (a ps, a worker) or it
                   has imported TensorFlow (an evaluator); 503 before, and 503 when
                   its server no longer answers; nothing at all from a frozen process

Nothing here slows a training step: the figures are read from what the loop and
its hooks already keep (`progress.ProgressHook`'s step times and counts, the
loop's `LoopState`, the events every task emits), when Prometheus scrapes, never
through an extra `session.run`. Bytes on the wire are the kernel's own TCP
counters (`tcp_info`'s bytes_acked and bytes_received, the ones
`benchmarks/_measure.py` reads with `ss`) of this process's sockets to the other
tasks, sampled every `SAMPLE_SECS` by a thread. docs/metrics.md lists every
metric. The server starts before TensorFlow is imported, so that a probe can
tell a task that is starting from one that is stuck.

Module functions are no-ops until `serve` has run: code that reports (the
trainer, `training`, `evaluation`) calls them whether metrics are on or not.
"""

from __future__ import annotations

import errno
import http.server
import json
import os
import re
import socket
import struct
import threading
import time
from typing import Callable, Iterable, Optional

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Info,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from lowlevel import output_layout

disable_created_metrics()  # no `_created` series: a restart shows as a counter reset

SAMPLE_SECS = 1.0  # how often the TCP counters are read (a socket's bytes since are lost at its close)
PLACEMENT_FILE = output_layout.PLACEMENT  # the chief's record of the bytes of variables on each ps
# Step times: from a fast local step (~0.2 ms) to a sync step waiting on a slow worker.
STEP_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                5.0, 10.0, 30.0, 60.0)
# The events that are faults, by kind (lowlevel.events).
FAULT_EVENTS = ("fault_noticed", "fault_cleared", "recovered", "checkpoint_failed", "preempted")
_CHECKPOINT_LINE = re.compile(r'^model_checkpoint_path:\s*"([^"]*)"', re.M)


METRICS_PATHS = ("/metrics", "/")  # GETs answered with the metrics (a scrape)


class TaskMetrics:
    """The metrics of one task, in a registry of their own.

    Args:
      task_name: "ps0", "worker1", ...
      job, index: the task's job and index.
      output_dir: the run's directory (checkpoint age; a ps's variable bytes).
    """

    def __init__(self, task_name: str, job: str, index: int, output_dir: Optional[str] = None):
        self.task_name, self.job, self.output_dir = task_name, job, output_dir
        self.registry = r = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=r)  # process_resident_memory_bytes, cpu seconds, fds
        PlatformCollector(registry=r)
        Info("lowlevel_task", "The task these metrics are of.", registry=r).info(
            {"task": task_name, "job": job, "index": str(index)})
        self.cpus = Gauge("lowlevel_cpus", "CPUs this task sizes its thread pools from (its "
                          "cgroup quota, else its pod's CPU request, affinity mask, cores).",
                          registry=r)
        self.threads = Gauge("lowlevel_threads", "Threads of each TensorFlow pool.", ["pool"],
                             registry=r)
        self.faults = Counter("lowlevel_faults", "Fault events of this task by kind "
                              "(lowlevel.events: fault_noticed, fault_cleared, recovered, "
                              "checkpoint_failed, preempted).", ["kind"], registry=r)
        for kind in FAULT_EVENTS:
            self.faults.labels(kind)
        self.restarts = Counter("lowlevel_restarts", "Restarts of this task in this run "
                                "(<output_dir>/restarts/TASK.json; preemptions not counted), "
                                "as this process found them when it started.", registry=r)
        self.memory_limit: Optional[int] = None  # lowlevel_memory_limit_bytes, when known
        if job in ("chief", "worker"):
            self.loss = Gauge("lowlevel_loss", "The batch loss at the last progress line.",
                              registry=r)
            self.examples_rate = Gauge("lowlevel_cluster_examples_per_second", "Examples per "
                                       "second of all workers together, over the last "
                                       "--log_every_secs (from the global step).", registry=r)
            self.train_steps = Gauge("lowlevel_train_steps", "The global step the run stops "
                                     "at.", registry=r)
            self.checkpoint_saves = Counter("lowlevel_checkpoint_saves", "Checkpoints this "
                                            "task saved (the chief).", registry=r)
            self.dynamic_rows = Gauge("lowlevel_dynamic_embedding_rows", "Live rows (admitted "
                                      "ids) of each dynamic embedding shard at the last "
                                      "progress line (--embedding=dynamic).", ["shard"],
                                      registry=r)
        if job == "evaluator":
            self.eval_step = Gauge("lowlevel_eval_global_step", "Global step of the checkpoint "
                                   "the evaluator evaluated last.", ["split"], registry=r)
            self.eval_values = {
                name: Gauge(f"lowlevel_eval_{name}", f"The evaluator's {name} on the last "
                            "checkpoint it evaluated.", ["split"], registry=r)
                for name in ("accuracy", "loss", "auc")}
            self.eval_time = Gauge("lowlevel_eval_last_timestamp_seconds", "When the evaluator "
                                   "finished its last evaluation (Unix seconds).", ["split"],
                                   registry=r)
            self.evaluations = Counter("lowlevel_evaluations", "Checkpoints evaluated.",
                                       ["split"], registry=r)
        self.network: Optional[NetworkCounters] = None
        self.port: Optional[int] = None  # the port served on
        self.server: Optional[http.server.HTTPServer] = None  # what serves it (`serve`)
        self._scrapes = threading.Condition()
        self._last_scrape = float("-inf")  # time.monotonic() at which the newest answered
        # GET of /metrics began
        self._health: Callable[[], tuple[bool, str]] = lambda: (False, "starting")
        r.register(_FilesCollector(self))
        self._training = _TrainingCollector()
        r.register(self._training)

    # What the trainer reports.
    def set_health(self, check: Callable[[], tuple[bool, str]]) -> None:
        self._health = check

    def health(self) -> tuple[bool, str]:
        try:
            return self._health()
        except Exception as e:  # noqa: BLE001 - a probe answers, never raises
            return False, f"health check failed: {e}"

    def on_event(self, event: str, global_step, fields: dict) -> None:
        """An event of this task (`lowlevel.events` listener)."""
        if event == "progress" and self.job in ("chief", "worker"):
            if fields.get("loss") is not None:
                self.loss.set(fields["loss"])
            if fields.get("examples_per_sec") is not None:
                self.examples_rate.set(fields["examples_per_sec"])
            if fields.get("train_steps") is not None:
                self.train_steps.set(fields["train_steps"])
            for shard, rows in (fields.get("dynamic_rows") or {}).items():
                self.dynamic_rows.labels(shard).set(rows)
        elif event == "checkpoint_saved" and self.job in ("chief", "worker"):
            self.checkpoint_saves.inc()
        if event in FAULT_EVENTS:
            self.faults.labels(event).inc()

    def evaluated(self, record: dict) -> None:
        if self.job != "evaluator":
            return
        split = record.get("split", "test")
        self.evaluations.labels(split).inc()
        self.eval_step.labels(split).set(record["global_step"])
        self.eval_time.labels(split).set(time.time())
        for name, gauge in self.eval_values.items():
            if record.get(name) is not None:
                gauge.labels(split).set(record[name])

    def close(self) -> None:
        """Stops serving and closes the port (a task serves until it exits; tests close)."""
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def answered(self, path: str, began: float) -> None:
        """The handler has written its answer to a GET of `path` that began at `began`
        (`time.monotonic()`): what `linger` waits for."""
        if path.split("?", 1)[0] in METRICS_PATHS:
            with self._scrapes:
                self._last_scrape = max(self._last_scrape, began)
                self._scrapes.notify_all()

    def linger(self, secs: float) -> bool:
        """Waits until a scrape of /metrics that began after this call has been answered,
        for at most `secs` seconds: the task's final figures (the chief's final global
        step) reach a Prometheus that scrapes every `secs` before the process exits
        (`--metrics_linger_secs`).

        Returns:
          True when such a scrape came, False when `secs` ran out (or was 0).
        """
        start = time.monotonic()
        deadline = start + secs
        with self._scrapes:
            while self._last_scrape < start:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._scrapes.wait(left)
        return True

    def watch_training(self, progress, steps, batch_size: int) -> None:
        self._training.watch(progress, steps, batch_size)

    def http_response(self, path: str) -> tuple[int, str, bytes]:
        """(status, content type, body) for a GET of `path`."""
        path = path.split("?", 1)[0]
        if path in METRICS_PATHS:
            return 200, CONTENT_TYPE_LATEST, generate_latest(self.registry)
        if path in ("/healthz", "/livez", "/readyz"):
            ok, why = self.health()
            return (200 if ok else 503), "text/plain; charset=utf-8", (why + "\n").encode()
        return 404, "text/plain; charset=utf-8", b"not found: /metrics or /healthz\n"


class _TrainingCollector:
    """The training loop's figures, read from its hooks at scrape time (no per-step cost).

    `ProgressHook` already times every step after the warm-up (`step_secs`) and
    counts local steps; `LoopState.value` is the global step as the loop last saw
    it. Each scrape folds the step times that arrived since the last one into
    the histogram.
    """

    def __init__(self):
        self._progress = self._steps = None
        self._batch = 0
        self._seen = 0
        self._counts = [0] * (len(STEP_BUCKETS) + 1)
        self._sum = 0.0
        self._lock = threading.Lock()

    def watch(self, progress, steps, batch_size: int) -> None:
        with self._lock:
            self._progress, self._steps, self._batch = progress, steps, batch_size
            self._seen = 0  # a new graph: its hook's step times start anew

    def collect(self):
        with self._lock:
            progress, steps = self._progress, self._steps
            if progress is None:
                return
            new = progress.step_secs[self._seen:]
            self._seen += len(new)
            for secs in new:
                i = 0
                while i < len(STEP_BUCKETS) and secs > STEP_BUCKETS[i]:
                    i += 1
                self._counts[i] += 1
                self._sum += secs
            cumulative, total = [], 0
            for bound, count in zip((*STEP_BUCKETS, float("inf")), self._counts):
                total += count
                cumulative.append(("+Inf" if bound == float("inf") else repr(bound), total))
        # After the session's end, the step it ended at (the other workers' last steps
        # included); before, the one the loop last saw.
        end = getattr(progress, "end_step", None)
        yield GaugeMetricFamily("lowlevel_global_step", "The global step as this task last "
                                "saw it.", value=steps.value if end is None else end)
        yield CounterMetricFamily("lowlevel_local_steps", "Training steps this task ran.",
                                  value=progress.local_steps)
        yield CounterMetricFamily("lowlevel_examples", "Training examples this task "
                                  "consumed.", value=progress.local_steps * self._batch)
        yield HistogramMetricFamily(
            "lowlevel_step_duration_seconds", "Wall time of each training step's "
            "session.run, after the first --warmup_steps.", buckets=cumulative,
            sum_value=self._sum)


class _FilesCollector:
    """Figures read from the run's directory at scrape time: the newest checkpoint (any
    task), a ps's variable bytes (the chief's `placement.json`), this task's restarts."""

    def __init__(self, metrics: TaskMetrics):
        self._m = metrics
        self._cache: dict = {}

    def _read(self, name: str) -> Optional[tuple[float, str]]:
        """(mtime, text) of `<output_dir>/name`, re-read only when it changes."""
        if not self._m.output_dir:
            return None
        path = os.path.join(self._m.output_dir, name)
        try:
            mtime = os.stat(path).st_mtime
            if self._cache.get(name, (None,))[0] != mtime:
                with open(path) as f:
                    self._cache[name] = (mtime, f.read())
        except OSError:
            return None
        return self._cache[name]

    def collect(self):
        if self._m.memory_limit:
            yield GaugeMetricFamily("lowlevel_memory_limit_bytes", "The memory limit of this "
                                    "task's cgroup.", value=self._m.memory_limit)
        state = self._read("checkpoint")
        match = state and _CHECKPOINT_LINE.search(state[1])
        step = match and re.search(r"-(\d+)$", match.group(1))
        if step:
            yield GaugeMetricFamily("lowlevel_checkpoint_last_step", "Global step of the newest "
                                    "checkpoint in --output_dir.", value=int(step.group(1)))
            yield GaugeMetricFamily("lowlevel_checkpoint_last_timestamp_seconds", "When the "
                                    "newest checkpoint was recorded (Unix seconds).",
                                    value=state[0])
            yield GaugeMetricFamily("lowlevel_checkpoint_age_seconds", "Seconds since the "
                                    "newest checkpoint was recorded.",
                                    value=max(0.0, time.time() - state[0]))
        if self._m.job == "ps":
            placement = self._read(PLACEMENT_FILE)
            try:
                held = json.loads(placement[1])["ps_variable_bytes"][self._m.task_name]
            except (TypeError, ValueError, KeyError):
                held = None
            if held is not None:
                yield GaugeMetricFamily("lowlevel_ps_variable_bytes", "Bytes of the variables "
                                        "(model, optimizer slots, global step) this ps holds, "
                                        "as the chief placed them.", value=held)
        network = self._m.network
        if network is not None:
            sent, received = network.totals()
            for name, values, what in (("transmit", sent, "sent to"),
                                       ("receive", received, "received from")):
                family = CounterMetricFamily(
                    f"lowlevel_network_{name}_bytes", f"Bytes this task {what} each other task "
                    "of the cluster (TCP, both connection directions; peer \"\": a peer that "
                    "shares an address with others).", labels=["peer"])
                for peer, value in sorted(values.items()):
                    family.add_metric([peer], value)
                yield family


# struct tcp_info (linux/tcp.h): tcpi_bytes_acked and tcpi_bytes_received, u64 at 120, 128.
_TCP_INFO_BYTES = struct.Struct("=QQ")
_TCP_INFO_OFFSET = 120


def _plain_ip(ip: str) -> str:
    return ip[7:] if ip.startswith("::ffff:") else ip


def process_tcp_sockets(skip_ports: Iterable[int] = ()) -> dict[int, tuple]:
    """{inode: (local (ip, port), peer (ip, port), bytes sent and acked, bytes received)} of
    this process's connected TCP sockets, from the kernel's `tcp_info`."""
    skip = set(skip_ports)
    out = {}
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return out
    for name in fds:
        try:
            link = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if not link.startswith("socket:["):
            continue
        try:
            dup = os.dup(int(name))
        except OSError:
            continue
        try:
            sock = socket.socket(fileno=dup)
        except OSError:
            os.close(dup)
            continue
        try:
            if sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET,
                                                                     socket.AF_INET6):
                continue
            local, peer = sock.getsockname(), sock.getpeername()
            if local[1] in skip:
                continue
            info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 192)
            if len(info) < _TCP_INFO_OFFSET + _TCP_INFO_BYTES.size:
                continue
            sent, received = _TCP_INFO_BYTES.unpack_from(info, _TCP_INFO_OFFSET)
            out[int(link[8:-1])] = ((_plain_ip(local[0]), local[1]),
                                    (_plain_ip(peer[0]), peer[1]), sent, received)
        except OSError:  # not connected (a listening socket), or gone meanwhile
            continue
        finally:
            sock.close()  # the duplicate only
    return out


class NetworkCounters:
    """Bytes this task moved to and from each other task, from its sockets' TCP counters.

    A connection this task opened is the peer's whose server address it reaches; one
    the peer opened (to this task's server port) is the peer's at its IP address, among
    the tasks that may open one (a worker's server is reached only by ps tasks, with
    `device_filters`; a ps's by the training tasks). The bytes of a socket that closes
    are kept as of its last sample.

    Args:
      addresses: {task name: "host:port"} of every task of the cluster but this one.
      own_port: this task's server port.
      openers: the task names that may open connections to this task's server.
      skip_ports: local ports whose sockets are not cluster traffic (the metrics port).
    """

    def __init__(self, addresses: dict[str, str], own_port: Optional[int],
                 openers: Iterable[str], skip_ports: Iterable[int] = ()):
        self._addresses = dict(addresses)
        self._own_port = own_port
        self._openers = set(openers)
        self._skip = set(skip_ports)
        self._servers: dict[tuple, str] = {}
        self._at_ip: dict[str, list[str]] = {}
        self._resolved_at = 0.0
        self._last: dict[int, tuple] = {}
        self._closed_sent: dict[str, int] = {}
        self._closed_received: dict[str, int] = {}
        self._lock = threading.Lock()

    def _resolve(self) -> None:
        """Re-resolves the tasks' host names (a restarted pod has a new IP) every 10 s."""
        if time.monotonic() - self._resolved_at < 10:
            return
        self._resolved_at = time.monotonic()
        servers, at_ip = {}, {}
        for task, address in self._addresses.items():
            host, _, port = address.rpartition(":")
            try:
                infos = socket.getaddrinfo(host.strip("[]"), int(port),
                                           type=socket.SOCK_STREAM)
            except (OSError, ValueError, UnicodeError):
                continue
            for info in infos:
                ip = _plain_ip(info[4][0])
                servers[(ip, int(port))] = task
                if task in self._openers and task not in at_ip.setdefault(ip, []):
                    at_ip[ip].append(task)
        self._servers, self._at_ip = servers, at_ip

    def _peer(self, local: tuple, peer: tuple) -> Optional[str]:
        if peer in self._servers:
            return self._servers[peer]
        if local[1] == self._own_port:
            candidates = self._at_ip.get(peer[0], [])
            return candidates[0] if len(candidates) == 1 else ""
        return None  # not cluster traffic

    def sample(self) -> None:
        with self._lock:
            self._resolve()
            now = {}
            for inode, (local, peer, sent, received) in process_tcp_sockets(self._skip).items():
                previous = self._last.get(inode)
                task = previous[0] if previous else self._peer(local, peer)
                if task is None:
                    continue
                now[inode] = (task, sent, received)
            for inode, (task, sent, received) in self._last.items():
                if inode not in now:
                    self._closed_sent[task] = self._closed_sent.get(task, 0) + sent
                    self._closed_received[task] = self._closed_received.get(task, 0) + received
            self._last = now

    def totals(self) -> tuple[dict[str, int], dict[str, int]]:
        """({peer: bytes sent}, {peer: bytes received}) so far."""
        self.sample()
        with self._lock:
            sent, received = dict(self._closed_sent), dict(self._closed_received)
            for task, s, r in self._last.values():
                sent[task] = sent.get(task, 0) + s
                received[task] = received.get(task, 0) + r
        return sent, received

    def run_sampler(self, every_secs: float = SAMPLE_SECS) -> None:
        def loop():
            while True:
                time.sleep(every_secs)
                try:
                    self.sample()
                except Exception:  # noqa: BLE001 - a metric, never the task's failure
                    pass
        threading.Thread(target=loop, name="metrics_network", daemon=True).start()


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    address_family = socket.AF_INET6

    def server_bind(self):
        # Both IPv4 and IPv6 (a pod's probes come to its IPv4 address on most clusters).
        self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()


class _IPv4Server(http.server.ThreadingHTTPServer):
    daemon_threads = True


def _handler(metrics: TaskMetrics):
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the http.server API
            began = time.monotonic()
            status, content_type, body = metrics.http_response(self.path)
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            self.wfile.flush()
            metrics.answered(self.path, began)

        def log_message(self, *args):  # scrapes and probes are not news
            pass
    return Handler


_current: Optional[TaskMetrics] = None


def serve(port: int, task_name: str, job: str, index: int,
          output_dir: Optional[str] = None) -> TaskMetrics:
    """Serves this task's metrics and health on `port` (all interfaces) from a thread.

    Raises:
      UsageError: the port is in use.
    """
    global _current
    from lowlevel.errors import UsageError
    metrics = TaskMetrics(task_name, job, index, output_dir)
    handler = _handler(metrics)
    try:
        try:
            server = _Server(("::", port), handler)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise
            server = _IPv4Server(("", port), handler)  # no IPv6 on this machine
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise UsageError(f"--metrics_port={port}: port {port} is already in use on this "
                             "machine; give each task on a machine its own port") from None
        raise
    threading.Thread(target=server.serve_forever, name="metrics_http", daemon=True).start()
    metrics.server = server
    metrics.port = server.server_address[1]
    _current = metrics
    from lowlevel import events
    events.add_listener(metrics.on_event)
    return metrics


def current() -> Optional[TaskMetrics]:
    """The metrics `serve` started, or None when they are off."""
    return _current


def report_cpus(figure, session_config=None) -> None:
    """The CPU figure (`resources.CpuFigure`) and the pools sized from it."""
    from lowlevel.ops import resources
    if _current is None:
        return
    _current.cpus.set(figure.cpus)
    _current.memory_limit = resources.memory_limit()
    if session_config is not None:
        _current.threads.labels("intra_op").set(session_config.intra_op_parallelism_threads)
        _current.threads.labels("inter_op").set(session_config.inter_op_parallelism_threads)


def report_restarts(restarts: int) -> None:
    """Adds this task's earlier starts in this run (`runtime.restarts`) to its restart counter."""
    if _current is not None and restarts:
        _current.restarts.inc(restarts)


def serving(address: Optional[str], cluster=None, task=None) -> None:
    """This task is up: with `address` ("host:port", its gRPC server) it is healthy while
    the server answers (`probes.answers`), and its bytes to every other task of `cluster`
    are counted; without one (an evaluator), while this process answers."""
    if _current is None:
        return
    if address is None:
        _current.set_health(lambda: (True, "ok"))
        return
    from lowlevel.cluster import probes
    port = int(address.rpartition(":")[2])
    local = f"127.0.0.1:{port}"

    def check():
        if probes.answers(local, 2.0):
            return True, "ok"
        return False, f"the gRPC server on port {port} does not answer"
    _current.set_health(check)
    if cluster is not None and task is not None:
        _current.network = network_counters(cluster, task, [_current.port])
        _current.network.run_sampler()


def network_counters(cluster, task, skip_ports: Iterable[int] = ()) -> NetworkCounters:
    """The `NetworkCounters` of `task` (a `cluster.Task`) in `cluster` (a `cluster.Cluster`)."""
    from lowlevel.cluster.spec import PS
    ps = [cluster.task(PS, k) for k in range(cluster.num_ps) if cluster.ps_hosts[k]]
    addresses = {t.name: cluster.hosts(t.job_name)[t.task_index]
                 for t in [*cluster.training_tasks(), *ps]
                 if (t.job_name, t.task_index) != (task.job_name, task.task_index)}
    own = cluster.hosts(task.job_name)[task.task_index]
    openers = [t.name for t in (cluster.training_tasks() if task.job_name == PS else ps)]
    return NetworkCounters(addresses, int(own.rpartition(":")[2]), openers, skip_ports)


def watch_training(progress, steps, batch_size: int) -> None:
    """The training loop's hook (`progress.ProgressHook`) and `LoopState` to read from."""
    if _current is not None:
        _current.watch_training(progress, steps, batch_size)


def evaluated(record: dict) -> None:
    """The evaluator's record of one checkpoint (`evaluator.continuous_eval`)."""
    if _current is not None:
        _current.evaluated(record)


def placement_built(graph, cluster, output_dir: Optional[str]) -> None:
    """The chief, with metrics on, records the bytes of variables it placed on each ps in
    `<output_dir>/placement.json`, for the ps tasks' `lowlevel_ps_variable_bytes`."""
    if not output_dir or cluster is None or _current is None:
        return  # metrics off: no file
    from lowlevel.outputs import files
    from lowlevel.runtime import placement
    held = {f"ps{k}": 0 for k in range(cluster.num_ps)}
    for op in graph.get_operations():
        m = re.search(r"/job:ps/task:(\d+)", op.device or "")
        if m and op.type in ("VariableV2", "VarHandleOp") and f"ps{m.group(1)}" in held:
            held[f"ps{m.group(1)}"] += placement.op_bytes(op)
    try:
        files.write_json(output_layout.placement_file(output_dir), {"ps_variable_bytes": held})
    except OSError:
        pass  # a metric only
