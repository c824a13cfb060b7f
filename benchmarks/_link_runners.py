"""One configuration run with every task on its own host behind a bandwidth-limited link.

`OnHosts(bits)` has the `run_lowlevel`, `run_classic` and `run_tf2_pss` of
`benchmarks/_runners.py` (same arguments, same run dict), for
`_configs.run_config(..., runners=OnHosts(bits))`. Each run makes fresh hosts
(`lowlevel.testing.netns.Hosts`: one network namespace per task, `ps0`, `worker0`, ...,
`chief` for tf2_pss's coordinator, on one bridge in 198.18.0.0/15), gives every host's
link `bits`/s each way (`_links.shape`), starts each task on its host listening on
port 2222 of the host's address (the trainer per task, `--ps_hosts`/`--worker_hosts`
by address, as on separate machines; lowlevel without its launcher), and removes every
namespace at the end, also on a failure or Ctrl-C (`Hosts.close`, which kills what
still runs there). `local` (no ps) has no link: it runs on this machine as in
`_runners`.

Thread pools: the tasks share this machine's cores whatever their namespace, so each
task gets the counts the same cluster would get on one machine
(`_reference.thread_counts` over loopback addresses: a worker cores // workers, a ps or
a coordinator 1, inter-op >= 2), passed as `--intra_op_threads`/`--inter_op_threads`.
Without that every task would take every core as if its host were its own.

Bytes: from the kernel's counters of each host's link (`_links.LinkWatcher`); a
worker's `bytes_per_step` counts everything its link carried (its host runs nothing
else: its exchanges with the ps and, for lowlevel, its few small RPCs to the chief).
Besides `_runners`' keys a run has `link`: {"bits_per_sec": the configured rate,
"hosts": {host: `_links.link_rates` over the measured window}, "utilisation": the
busiest direction of the busiest link over the window / the rate, "peak_utilisation":
the same for the busiest 1 s}.
"""

from __future__ import annotations

import os
import subprocess
import time
from typing import Optional

from benchmarks import _reference, _runners
from benchmarks._links import LinkWatcher, link_rates, shape, wait_until
from lowlevel import output_layout
from lowlevel.testing import netns

PORT = 2222


class _HostProcs(_runners.Procs):
    """`_runners.Procs` whose processes each start on their own host."""

    def __init__(self, workdir: str, watcher, hosts):
        super().__init__(workdir, watcher)
        self.hosts = hosts

    def start(self, name: str, argv: list, role: str = "other", ports=()):
        with open(self.log_path(name), "w") as log:
            proc = self.hosts.popen(name, argv, stdout=log, stderr=subprocess.STDOUT,
                                    cwd=_runners.ROOT, env=self.env,
                                    stdin=subprocess.DEVNULL)
        self.popen[name] = proc
        self.watcher.add(name, proc.pid, role, ports)
        return proc


def threads(num_workers: int, job: str) -> list:
    """The thread flags of a `job` task when `num_workers` workers share this machine."""
    workers = [f"127.0.0.1:{i}" for i in range(num_workers)]
    intra, inter = _reference.thread_counts(workers, "127.0.0.1:0", job == "worker",
                                            ["127.0.0.1:0"])
    return [f"--intra_op_threads={intra}", f"--inter_op_threads={inter}"]


class OnHosts:
    """The runners of `_runners`, each task on its own host behind a `bits`/s link."""

    def __init__(self, bits: int, interval: float = 0.1):
        self.bits = bits
        self.interval = interval

    def _run(self, names: list, workdir: str, body) -> dict:
        """Makes the hosts, shapes them, runs `body(hosts, procs, watcher)`, cleans up.

        A host that cannot be made or shaped (`ip` or `tc` failing) fails the run with
        the command's message; everything made so far is removed.
        """
        try:
            hosts = netns.Hosts({n: [] for n in names})
        except subprocess.CalledProcessError as e:
            return {"ok": False, "error": f"cannot make the hosts: {' '.join(e.cmd)}: "
                                          f"{(e.stderr or '').strip()}"}
        with hosts:
            try:
                for n in names:
                    shape(hosts, n, self.bits)
            except RuntimeError as e:
                return {"ok": False, "error": f"cannot limit the links: {e}"}
            watcher = LinkWatcher(hosts, {n: n for n in names}, self.interval)
            procs = _HostProcs(workdir, watcher, hosts)
            watcher.start()
            procs.launched = time.time()
            try:
                run = body(hosts, procs, watcher)
            finally:
                watcher.stop()
                procs.stop()  # by PID; Hosts.close kills anything left in the namespaces
        if run.get("ok"):
            run["link"] = self.link_stats(watcher, run["tasks"], names)
        return run

    def link_stats(self, watcher: LinkWatcher, tasks: list, names: list) -> dict:
        starts, ends = [], []
        for t in tasks:
            if t.get("examples_per_sec") and t.get("measured_steps"):
                window = t["measured_steps"] * t.get("batch_size", 0) / t["examples_per_sec"]
                ends.append(t["last_step_unix"])
                starts.append(t["last_step_unix"] - window if window else t["first_step_unix"])
        out = {"bits_per_sec": self.bits, "hosts": {}, "utilisation": None,
               "peak_utilisation": None}
        if not starts:
            return out
        for n in names:
            out["hosts"][n] = link_rates(watcher.link_samples, n, min(starts), max(ends))
        found = [r for r in out["hosts"].values() if r]
        if found:
            out["utilisation"] = round(max(max(r["sent_bits_per_sec"], r["received_bits_per_sec"])
                                           for r in found) / self.bits, 3)
            peaks = [r["peak_bits_per_sec"] for r in found if r["peak_bits_per_sec"]]
            out["peak_utilisation"] = round(max(peaks) / self.bits, 3) if peaks else None
        return out

    @staticmethod
    def _cluster(hosts, num_ps: int, num_workers: int, chief: bool = False) -> list:
        ps = ",".join(f"{hosts.addresses[f'ps{k}']}:{PORT}" for k in range(num_ps))
        wk = ",".join(f"{hosts.addresses[f'worker{i}']}:{PORT}" for i in range(num_workers))
        out = [f"--ps_hosts={ps}", f"--worker_hosts={wk}"]
        return out + ([f"--chief_host={hosts.addresses['chief']}:{PORT}"] if chief else [])

    def run_lowlevel(self, num_ps: int, num_workers: int, flags: list, workdir: str,
                     timeout_secs: float, batch_size: int, interval: float = 0.1) -> dict:
        """lowlevel's trainer, one process per task on its host; `local` as `_runners`."""
        if num_ps == 0:
            return _runners.run_lowlevel(0, 1, flags, workdir, timeout_secs, batch_size,
                                         interval)
        names = [f"ps{k}" for k in range(num_ps)] + [f"worker{i}" for i in range(num_workers)]
        out = os.path.join(workdir, "out")

        def body(hosts, procs, watcher):
            cluster = self._cluster(hosts, num_ps, num_workers)
            for name in names:
                job, index = name.rstrip("0123456789"), name[len(name.rstrip("0123456789")):]
                procs.start(name, [*_runners._py("lowlevel.trainer"), f"--output_dir={out}",
                                   *cluster, f"--job_name={job}", f"--task_index={index}",
                                   *threads(num_workers, job), *flags], job, [PORT])
            deadline = time.monotonic() + timeout_secs
            done = wait_until(lambda: all(p.poll() is not None for p in procs.popen.values()),
                              deadline, 0.1)
            if not done:
                left = [n for n, p in procs.popen.items() if p.poll() is None]
                return {"ok": False, "error": f"{', '.join(left)} still running after "
                                              f"{timeout_secs:.0f} s:\n{procs.log(left[-1])}"}
            time.sleep(self.interval)
            for name in names:
                code = procs.popen[name].returncode
                if code == 2 and _runners._flag(flags, "communication_period") not in (None, "1"):
                    return {"ok": False, "skipped": _runners._error_line(procs.log(name))}
                if code != 0:
                    return {"ok": False, "error": f"{name} exited {code}:\n{procs.log(name)}"}
            tasks = [_runners._read_json(output_layout.task_record(out, f"worker{i}"))
                     for i in range(num_workers)]
            if None in tasks:
                return {"ok": False, "error": f"a worker wrote no tasks/worker*.json in {out}"}
            metrics = _runners._read_json(output_layout.final_metrics(out)) or {}
            run = self._summary(tasks, watcher, batch_size, procs.launched)
            run.update(shutdown_secs=_runners._shutdown(watcher, tasks), shutdown_note=None,
                       startup_import_secs=_runners.imported_secs(out, procs.launched),
                       accuracy=metrics.get("accuracy"), loss=metrics.get("loss"),
                       global_step=metrics.get("global_step"))
            return run

        return self._run(names, workdir, body)

    def run_classic(self, num_ps: int, num_workers: int, flags: list, workdir: str,
                    timeout_secs: float, batch_size: int, interval: float = 0.1) -> dict:
        """The textbook trainer, every task at once (the others wait for the chief's session)."""
        names = [f"ps{k}" for k in range(num_ps)] + [f"worker{i}" for i in range(num_workers)]
        go = os.path.join(workdir, "go")
        outs = [os.path.join(workdir, f"worker{i}.json") for i in range(num_workers)]

        def body(hosts, procs, watcher):
            cluster = self._cluster(hosts, num_ps, num_workers)
            deadline = time.monotonic() + timeout_secs
            for k in range(num_ps):
                procs.start(f"ps{k}", [*_runners._py("benchmarks.classic"), *cluster, *flags,
                                       "--job_name=ps", f"--task_index={k}",
                                       *threads(num_workers, "ps")], "ps", [PORT])
            workers = [procs.start(f"worker{i}", [
                *_runners._py("benchmarks.classic"), *cluster, *flags, "--job_name=worker",
                f"--task_index={i}", f"--out_json={outs[i]}", f"--start_file={go}",
                *threads(num_workers, "worker")], "worker", [PORT]) for i in range(num_workers)]
            for i, w in enumerate(workers):  # the others wait for the chief's session
                ready = wait_until(lambda: os.path.exists(_reference.ready_file(
                    go, f"worker{i}")) or w.poll() is not None, deadline)
                if not ready or w.poll() is not None:
                    return {"ok": False, "error": f"worker{i} never had its session:\n"
                                                  f"{procs.log(f'worker{i}')}"}
            open(go, "w").close()
            return self._finish_references(procs, watcher, [f"worker{i}" for i in
                                                            range(num_workers)], outs,
                                           deadline, timeout_secs, batch_size)

        return self._run(names, workdir, body)

    def run_tf2_pss(self, num_ps: int, num_workers: int, flags: list, workdir: str,
                    timeout_secs: float, batch_size: int, interval: float = 0.1) -> dict:
        """ParameterServerStrategy: ps and workers serve forever; the chief writes the record."""
        names = ([f"ps{k}" for k in range(num_ps)] + [f"worker{i}" for i in range(num_workers)]
                 + ["chief"])
        out = os.path.join(workdir, "chief.json")

        def body(hosts, procs, watcher):
            cluster = self._cluster(hosts, num_ps, num_workers, chief=True)
            for name in names[:-1]:
                job = name.rstrip("0123456789")
                procs.start(name, [*_runners._py("benchmarks.tf2_pss"), *cluster, *flags,
                                   f"--job_name={job}", f"--task_index={name[len(job):]}",
                                   *threads(num_workers, job)], job, [PORT])
            procs.start("chief", [*_runners._py("benchmarks.tf2_pss"), *cluster, *flags,
                                  "--job_name=chief", f"--out_json={out}",
                                  *threads(num_workers, "chief")], "chief", [PORT])
            run = self._finish_references(procs, watcher, ["chief"], [out],
                                          time.monotonic() + timeout_secs, timeout_secs,
                                          batch_size, [[f"worker{i}" for i in
                                                        range(num_workers)]], grace_secs=5.0)
            if run.get("ok"):
                run["shutdown_note"] = "ps and workers never exit (Server.join()); killed by PID"
            return run

        return self._run(names, workdir, body)

    def _finish_references(self, procs, watcher, waited: list, outs: list, deadline: float,
                           timeout_secs: float, batch_size: int,
                           groups: Optional[list] = None,
                           grace_secs: Optional[float] = None) -> dict:
        """Waits for the `waited` processes, then reads the records they wrote to `outs`.

        `grace_secs`: once every record is written, wait at most this long for the
        processes to exit, then kill them (tf2_pss's coordinator can take 20 s to tear
        down its cluster behind a slow link, after its measurement is done).
        """
        mains = [procs.popen[n] for n in waited]
        if grace_secs is not None:  # the records are all there: wait for exits a little only
            wait_until(lambda: all(os.path.exists(o) for o in outs) or
                       any(p.poll() is not None for p in mains), deadline, 0.1)
            if all(os.path.exists(o) for o in outs):
                deadline = min(deadline, time.monotonic() + grace_secs)
                wait_until(lambda: all(p.poll() is not None for p in mains), deadline, 0.1)
                for p in mains:
                    if p.poll() is None:
                        p.kill()  # ends with its record written: a clean finish here
                        p.wait()
                        p.returncode = 0
        if not wait_until(lambda: all(p.poll() is not None for p in mains), deadline, 0.1):
            return {"ok": False, "error": f"{', '.join(waited)} still running after "
                                          f"{timeout_secs:.0f} s:\n{procs.log(waited[0])}"}
        bad = [n for n, p in zip(waited, mains) if p.returncode]
        if bad:
            return {"ok": False, "error": f"{bad[0]} exited {procs.popen[bad[0]].returncode}:"
                                          f"\n{procs.log(bad[0])}"}
        time.sleep(self.interval)
        tasks = []
        for path in outs:
            rec = _runners._read_json(path)
            if rec is None:
                return {"ok": False, "error": f"no record {path}"}
            tasks.append(dict(rec, measured_steps=rec["local_steps"]))
        run = self._summary(tasks, watcher, batch_size, procs.launched, groups)
        run.update(shutdown_secs=None, accuracy=None, loss=None,
                   shutdown_note="ps never exits (server.join()); killed by PID")
        return run

    def _summary(self, tasks, watcher, batch_size, launched, groups=None) -> dict:
        tasks = [dict(t, batch_size=t.get("batch_size") or batch_size) for t in tasks]
        run = _runners.summarise(tasks, watcher, batch_size, launched,
                                 groups or [[t["task"]] for t in tasks])
        run.update(ok=True, tasks=tasks, wall_secs=round(time.time() - launched, 1))
        return run
