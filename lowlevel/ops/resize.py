"""A running launcher's job resized: workers added and removed as the training operator
does when a `TFJob`'s Worker replicas change under `enableDynamicWorker`.

`python -m lowlevel.launch --dynamic_workers` gives every task the operator's
`sparseCluster` TF_CONFIG (`k8s.operator_tf_config(sparse=True)`: a worker knows the ps
tasks and itself, a ps itself), so workers may join and leave without the others being
told; the work goes to them through the data queue (`lowlevel.data.spans`). While it
runs, its worker count is changed by

    python -m lowlevel.launch --output_dir=DIR --resize=N   # waits until N workers run
    kill -TTIN <launcher pid>                                # one worker more
    kill -TTOU <launcher pid>                                # one fewer

(TTIN and TTOU as gunicorn uses them; two sent at once may arrive as one, the
command's request does not). A resize to N is the operator's reconciliation
(`ReconcilePods` in kubeflow's training operator: a missing replica of an index below
`replicas` is created, one at or above it deleted): each worker of index < N not
running starts (a fresh port, the same flags), each of index >= N is sent SIGTERM: it
stops at a safe point (`runtime.preemption`), leaves the data queue (its span freed; in
sync its heartbeat cleared: `runtime.hooks.LeaveHook`) and exits; one still running
`LEAVE_GRACE_SECS` later is killed. Worker 0, the chief, never leaves (N >= 1).
Once the chief has finished, requests are ignored (the run is over).

The launcher keeps `<output_dir>/launch.json` current: {"pid": the launcher's,
"workers": [the workers running and not leaving], "leaving": [those sent SIGTERM
and still running], "target": N}.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Callable

import portpicker

from lowlevel.errors import UsageError
from lowlevel.ops import k8s

STATE_FILE = "launch.json"  # in the output_dir: the launcher's pid, workers, target
REQUEST_FILE = "launch_resize.json"  # in the output_dir: {"num_workers": N}, then SIGHUP
LEAVE_GRACE_SECS = 30.0  # Kubernetes' default terminationGracePeriodSeconds
REQUEST_TIMEOUT_SECS = 120.0  # --resize waits this long for the job to reach N


def dynamic_commands(num_ps: int, num_workers: int, base: list[str], evaluator: bool = False,
                     host: str = "127.0.0.1") -> tuple[dict, dict, Callable]:
    """The tasks of a `--dynamic_workers` job on free ports of `host`: ({task name: argv},
    {task name: {"TF_CONFIG": ...}}, new_worker), where `new_worker(index)` gives
    (argv, env) of worker `index`, now or later. `base`: every task's argv (the trainer and
    its flags, no cluster flags)."""
    ps = [f"{host}:{portpicker.pick_unused_port()}" for _ in range(num_ps)]

    def tf_config(job: str, index: int, address: str = "") -> dict:
        cluster = {"ps": ps, "worker": [""] * index + [address]}
        return {"TF_CONFIG": json.dumps(k8s.operator_tf_config(cluster, job, index,
                                                               sparse=True))}

    def new_worker(index: int) -> tuple[list[str], dict]:
        address = f"{host}:{portpicker.pick_unused_port()}"
        return list(base), tf_config("worker", index, address)

    commands, envs = {}, {}
    for i in range(num_ps):
        commands[f"ps{i}"], envs[f"ps{i}"] = list(base), tf_config("ps", i)
    for i in range(num_workers):
        commands[f"worker{i}"], envs[f"worker{i}"] = new_worker(i)
    if evaluator:
        commands["evaluator0"], envs["evaluator0"] = list(base), tf_config("evaluator", 0)
    return commands, envs, new_worker


class Resizer:
    """The launcher's side: takes requests (signals, the request file) and reconciles the
    supervisor's workers with the target, once per supervision loop (`apply`).

    Args:
      output_dir: the run's; holds `STATE_FILE` and `REQUEST_FILE`.
      num_workers: the workers the job starts with (the first target).
      new_worker: `dynamic_commands`' (argv, env) of a worker index.
      say: prints one launcher line.
    """

    def __init__(self, output_dir: str, num_workers: int, new_worker: Callable,
                 say: Callable[[str], None]):
        self.output_dir, self.target, self._new_worker, self._say = \
            output_dir, num_workers, new_worker, say
        self._asked = False
        self._unreadable = None  # why the last SIGHUP's request could not be read
        self._leaving: dict[str, float] = {}  # name: monotonic deadline of its SIGTERM
        self._over = False

    def install(self) -> None:
        """SIGTTIN (+1), SIGTTOU (-1), SIGHUP (read `REQUEST_FILE`) set the target; the
        work is done in `apply`, outside the handler."""
        def step(delta):
            def handler(signum, frame):
                self.target = max(1, self.target + delta)
                self._asked = True
            return handler
        signal.signal(signal.SIGTTIN, step(+1))
        signal.signal(signal.SIGTTOU, step(-1))
        signal.signal(signal.SIGHUP, lambda signum, frame: self._read_request())

    def _read_request(self) -> None:
        try:
            with open(os.path.join(self.output_dir, REQUEST_FILE)) as f:
                self.target = max(1, int(json.load(f)["num_workers"]))
            self._asked = True
        except (OSError, ValueError, KeyError, TypeError) as e:
            self._unreadable = f"{type(e).__name__}: {e}"  # printed in apply (not in a
            # signal handler, which may interrupt a print)

    def apply(self, sup, finished: set, chief: str) -> None:
        """Reconciles `sup`'s workers with the target (see the module doc): starts the
        missing ones below it, asks those at or above it to leave, kills a leaver past its
        grace, and writes the state file."""
        if chief in finished or sup.stopping:
            if self._asked and not self._over:
                self._say("launch: resize ignored: the run is over")
                self._over = True
            return
        for name, deadline in list(self._leaving.items()):
            proc = sup.procs[name]
            if proc.poll() is not None or name in finished:
                del self._leaving[name]
                self.write_state(sup, finished)
            elif time.monotonic() > deadline:
                self._say(f"launch: {name} still running {LEAVE_GRACE_SECS:.0f} s after "
                          "SIGTERM; killing it")
                proc.kill()
        if self._unreadable:
            self._say(f"launch: resize request {os.path.join(self.output_dir, REQUEST_FILE)} "
                      f"unreadable ({self._unreadable}); keeping {self.target} worker(s)")
            self._unreadable = None
        if not self._asked:
            return
        self._asked = False
        running = self._running(sup, finished)
        for index in range(self.target):
            name = f"worker{index}"
            if name not in running:
                argv, env = self._new_worker(index)
                finished.discard(name)
                sup.add(name, argv, env)
                self._say(f"launch: {name} joins the job (resize to {self.target})")
        for name in running:
            if int(name[len("worker"):]) >= self.target:
                self._leaving[name] = time.monotonic() + LEAVE_GRACE_SECS
                sup.retire(name)
                self._say(f"launch: {name} leaves the job (resize to {self.target}): "
                          "SIGTERM, it stops at a safe point")
        self.write_state(sup, finished)

    def _running(self, sup, finished: set) -> list[str]:
        return sorted((n for n, p in sup.procs.items() if n.startswith("worker")
                       and n not in finished and p.poll() is None and n not in self._leaving),
                      key=lambda n: int(n[len("worker"):]))

    def write_state(self, sup, finished: set) -> None:
        """Writes `STATE_FILE` (atomically): pid, the workers running, the target."""
        state = {"pid": os.getpid(), "workers": self._running(sup, finished),
                 "leaving": sorted(self._leaving), "target": self.target}
        path = os.path.join(self.output_dir, STATE_FILE)
        with open(path + ".tmp", "w") as f:
            json.dump(state, f)
        os.replace(path + ".tmp", path)


def request(output_dir: str, num_workers: int, timeout_secs: float = REQUEST_TIMEOUT_SECS,
            out=sys.stdout) -> int:
    """`python -m lowlevel.launch --output_dir=DIR --resize=N`: asks the launcher running
    on DIR for N workers and waits until `STATE_FILE` lists N and none leaving; returns the exit status (0;
    1 if not within `timeout_secs` seconds).

    Raises:
      UsageError: N < 1; no launcher with --dynamic_workers is running on DIR.
    """
    if num_workers < 1:
        raise UsageError(f"--resize={num_workers}: a job needs at least 1 worker (the chief)")
    path = os.path.join(output_dir, STATE_FILE)
    try:
        with open(path) as f:
            pid = int(json.load(f)["pid"])
        os.kill(pid, 0)
    except (OSError, ValueError, KeyError):
        raise UsageError(f"--resize: no launcher with --dynamic_workers is running on "
                         f"{output_dir} (no live pid in {path})") from None
    request_path = os.path.join(output_dir, REQUEST_FILE)
    with open(request_path + ".tmp", "w") as f:
        json.dump({"num_workers": num_workers}, f)
    os.replace(request_path + ".tmp", request_path)
    os.kill(pid, signal.SIGHUP)
    deadline = time.monotonic() + timeout_secs
    while time.monotonic() < deadline:
        with open(path) as f:
            state = json.load(f)
        workers = state["workers"]
        if len(workers) == num_workers and not state.get("leaving"):
            print(f"launch: {output_dir}: {num_workers} workers ({', '.join(workers)})",
                  file=out, flush=True)
            return 0
        time.sleep(0.2)
    print(f"launch: {output_dir}: asked for {num_workers} workers; {len(workers)} running "
          f"after {timeout_secs:.0f} s", file=out, flush=True)
    return 1
