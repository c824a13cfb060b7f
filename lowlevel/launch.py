"""Runs a whole ps/worker cluster on this machine and supervises it.

    python -m lowlevel.launch                      # 1 ps + 2 workers, mlp on digits
    python -m lowlevel.launch --num_workers=3 --sync --train_steps=3000
    python -m lowlevel.launch --evaluator     # plus an evaluator (continuous_eval)

Each task is `python -m lowlevel.trainer` on a free loopback port, forked from the
launcher once it has imported TensorFlow (`lowlevel.ops.forking`; `--nofork`: a process
of its own), by default inside a private network namespace with only loopback
(`lowlevel.ops.isolation`; `--no_isolation` to opt out): no other host or process
can connect to a task's server, which would run any graph it is sent;
every trainer flag given here is passed on to every task. Output is prefixed
with the task's name (`[ps0]`, `[worker1]`); on a terminal one live progress
line shows the chief's global step, rate and loss.

The live line is fed by the chief's `progress` events
(`<output_dir>/events/worker0.jsonl`, `lowlevel.events`), not by its log.

Exit status: 0 when every task exited 0; 2 for a usage error (one line on
stderr). With `--max_restarts=N` a task that ends with a retryable status
(killed or stopped by a signal, or status 200: `lowlevel.errors`) is
started again with the same flags, up to N times, and every restart is
reported. A task that exits 1-127 (a permanent failure or a usage error), or a
retryable one with its restarts used up, fails the run: the launcher names it,
stops the others and exits 1.
Limits per task, as a pod's (`--memory=ps=12Gi,worker=4Gi`, `--cpu=ps=250m,worker=1`):
each task in a cgroup of its own (`lowlevel.ops.memory_limits`, `lowlevel.ops.cpu_limits`),
so one task's use cannot take from another's, and a worker that joins brings its own.
Ctrl-C (exit 130) or SIGTERM (exit 143) stops every task; each child also gets
SIGTERM should the launcher itself die, even by SIGKILL (Linux
`PR_SET_PDEATHSIG`, which the child sets itself: `lowlevel.ops.lifetime`), so no
orphan is left behind.

A job whose workers come and go (file input through the data queue):

    python -m lowlevel.launch --dynamic_workers --dataset=criteo_files --train_files=...
    python -m lowlevel.launch --output_dir=DIR --resize=4     # from another shell

Every task then gets the training operator's `sparseCluster` TF_CONFIG, and a resize
starts or stops workers as the operator does for a TFJob's replicas
(`lowlevel.ops.resize`; SIGTTIN / SIGTTOU to the launcher: one worker more / fewer).

Your own TF1 program in place of the trainer:

    python -m lowlevel.launch --script=SCRIPT.py --num_workers=2 -- --last_step=1000
    python -m lowlevel.launch --script=SCRIPT.py --script_cluster=tf_config -- ARGS

Each task is then `python -m lowlevel SCRIPT.py ARGS` (ARGS: everything after `--`) plus
its cluster: the Distributed TensorFlow guide's `--ps_hosts --worker_hosts --job_name
--task_index` after ARGS (`--script_cluster=flags`, the default) or `TF_CONFIG` in its
environment (`tf_config`: {"cluster": {"ps": [...], "worker": [...]}, "task": ...};
worker 0 is the chief either way: no `chief` job, which an Estimator script needs).
Isolation, the prefixes, `--max_restarts`, `--memory`, `--cpu` and the exit status are as above;
the trainer's flags (`--model`, `--output_dir`, ...) and `--evaluator` do not apply (one
usage line, exit 2). A script's task is forked as the trainer's are (`python -m lowlevel`
runs the script as `__main__` in the forked process, as it would in a fresh one;
`--nofork`: each started cold), and there is no live progress line (a script's tasks
write no events). Once the chief has exited 0, the workers left are
stopped after `PS_AFTER_CHIEF_SECS`, as the ps tasks are.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys
import time

import portpicker
from absl import app, flags

from lowlevel import cli, output_layout
from lowlevel.errors import UsageError
from lowlevel.ops import cpu_limits, forking, isolation, k8s, memory_limits, resize
from lowlevel.ops.supervisor import Progress, Supervisor, output_closed, supervise
from lowlevel.runtime import restarts

cli.define_trainer_flags()  # the flags passed on to every task
FLAGS = flags.FLAGS
flags.DEFINE_integer("num_ps", 1, "Number of ps tasks.")
flags.DEFINE_integer("num_workers", 2, "Number of worker tasks (worker 0 is the chief).")
flags.DEFINE_boolean("evaluator", False, "Add an evaluator task: it evaluates each new "
                     "checkpoint on the test split (<output_dir>/eval/) and exits after the "
                     "final one.")
# --max_restarts is the trainer's (lowlevel.config), passed on to every task: the
# launcher restarts a task that ends with a retryable status (killed or stopped by
# a signal, or 200) up to that many times (default 0: any task that fails fails the
# run); statuses 1-127 are never restarted.
flags.declare_key_flag("max_restarts")  # listed by --help with the launcher's own
flags.declare_key_flag("metrics_port")  # each task gets its own, from this one upwards
flags.DEFINE_boolean("no_isolation", False, "Run the tasks on the machine's own network. "
                     "By default they run in a private network namespace with only loopback "
                     "(root, or a user namespace where the OS allows it), so no other host, "
                     "namespace or process outside the launcher can reach their servers "
                     "(which run any graph sent to them, with no authentication).")
flags.DEFINE_boolean("fork", True, "Start each task by forking the launcher once it has "
                     "imported TensorFlow (about 3 s of CPU per task saved: lowlevel.ops.forking); "
                     "--nofork starts every task as its own python -m lowlevel.trainer (with "
                     "--script: python -m lowlevel SCRIPT).")
flags.DEFINE_string("memory", None, "Each task's memory limit (Kubernetes quantities), one "
                    "value for every task (4Gi) or per role (ps=12Gi,worker=4Gi,chief=4Gi,"
                    "evaluator=2Gi): each task runs in a memory cgroup of its own, so one that "
                    "outgrows its limit is killed alone, named, with its peak "
                    "(lowlevel.ops.memory_limits; needs root or a delegated cgroup). "
                    "Default: no limit.")
flags.DEFINE_string("cpu", None, "Each task's CPU limit (Kubernetes quantities), one value "
                    "for every task (500m) or per role (ps=250m,worker=1,chief=1,evaluator=500m): "
                    "each task runs in a CPU cgroup of its own with that CFS quota, as a pod "
                    "with resources.limits.cpu, and sizes its thread pools for it; a worker "
                    "that joins brings its own (lowlevel.ops.cpu_limits; needs root or a "
                    "delegated cgroup). Default: no limit.")
flags.DEFINE_float("stop_timeout_secs", 5.0, "After asking a task to stop (SIGTERM), seconds "
                   "to wait before killing it.")
flags.DEFINE_boolean("dynamic_workers", False, "Workers may join and leave the running job "
                     "(as a TFJob's enableDynamicWorker): every task gets the operator's "
                     "sparseCluster TF_CONFIG, and python -m lowlevel.launch "
                     "--output_dir=DIR --resize=N (or SIGTTIN / SIGTTOU to the launcher: one "
                     "more / fewer) changes the worker count while it runs "
                     "(lowlevel.ops.resize). Needs the data queue (--dataset=criteo_files).")
flags.DEFINE_integer("resize", None, "With --output_dir of a running --dynamic_workers "
                     "launcher: ask it for this many workers, wait until they run, exit 0 "
                     "(1 if not within 120 s). Starts nothing else.")
flags.DEFINE_string("script", None, "Run your own TF1 program on every task instead of the "
                    "trainer: each task is python -m lowlevel SCRIPT ARGS "
                    "(ARGS: everything after --) plus its cluster (--script_cluster). Trainer "
                    "flags and --evaluator do not apply; --num_ps, --num_workers, "
                    "--max_restarts, --memory, --cpu, --no_isolation, --nofork do; no live "
                    "progress line.")
flags.DEFINE_enum("script_cluster", "flags", ["flags", "tf_config"], "With --script, how each "
                  "task is given the cluster: flags: the Distributed TensorFlow guide's "
                  "--ps_hosts, --worker_hosts, --job_name, --task_index after ARGS; tf_config: "
                  "the TF_CONFIG environment variable (jobs ps and worker; worker 0 is the "
                  "chief).")


def trainer_args() -> list[str]:
    """The trainer flags set on this command line, serialised to pass on."""
    names = cli.trainer_flag_names() + ["verbosity"]
    for name in cli.CLUSTER_FLAGS:
        if FLAGS[name].present:
            raise UsageError(f"--{name} is set by the launcher; use --num_ps/--num_workers")
    return [FLAGS[n].serialize() for n in names if FLAGS[n].present and n != "output_dir"]


def task_commands(num_ps: int, num_workers: int, output_dir: str, extra: list[str],
                  host: str = "127.0.0.1", evaluator: bool = False) -> dict[str, list[str]]:
    """{task name: argv} for a cluster on free ports of `host` (and an evaluator)."""
    ps = [f"{host}:{portpicker.pick_unused_port()}" for _ in range(num_ps)]
    workers = [f"{host}:{portpicker.pick_unused_port()}" for _ in range(num_workers)]
    common = [sys.executable, "-m", "lowlevel.trainer", f"--ps_hosts={','.join(ps)}",
              f"--worker_hosts={','.join(workers)}", f"--output_dir={output_dir}", *extra]
    tasks = {f"ps{i}": common + ["--job_name=ps", f"--task_index={i}"] for i in range(num_ps)}
    tasks.update({f"worker{i}": common + ["--job_name=worker", f"--task_index={i}"]
                  for i in range(num_workers)})
    if evaluator:
        tasks["evaluator0"] = common + ["--job_name=evaluator"]
    return tasks


def preload(verbose: bool = False, modules: tuple = ()) -> float:
    """Imports TensorFlow (graph mode, `lowlevel.tf_import`), then `modules`, into the
    launcher before it forks its tasks (`lowlevel.ops.forking`), so that each task starts
    past them; returns the seconds it took. Importing them starts no thread or server.

    Args:
      verbose: keep TensorFlow's import-time log lines (the tasks' `--verbosity>=1`).
      modules: module names the tasks import after TensorFlow (`forking.TRAINER_MODULES`).
    """
    started = time.monotonic()
    from lowlevel.tf_import import import_tensorflow
    import_tensorflow(verbose=verbose)
    for name in modules:
        importlib.import_module(name)
    forking.freeze_heap()
    return time.monotonic() - started


def metrics_ports(commands: dict[str, list[str]], first: int) -> str:
    """Gives each task its own --metrics_port, `first` upwards (one machine: one port each);
    returns where each one's metrics are."""
    where = []
    for k, (name, argv) in enumerate(commands.items()):
        argv[:] = [a for a in argv if not a.startswith("--metrics_port=")]
        argv.append(f"--metrics_port={first + k}")
        where.append(f"{name} :{first + k}")
    return "metrics (/metrics, /healthz) of " + ", ".join(where)


def _confine() -> str:
    """Moves the launcher into a private network namespace (before any thread or port: the
    tasks inherit it); returns where the tasks run, in words (`ops.isolation`)."""
    how, why = isolation.confine()
    if how is None:
        print(f"launch: warning: no private network namespace ({why}); the tasks' "
              "servers listen on every interface of this machine with no authentication "
              "(--no_isolation silences this)", flush=True)
        return "on localhost"
    return (f"on localhost in a {how}: loopback only, unreachable from outside "
            "(--no_isolation to opt out)")


def _task_names() -> list[str]:
    """The names of the tasks the flags ask for: ps0.., worker0.., evaluator0."""
    return ([f"ps{i}" for i in range(FLAGS.num_ps)] +
            [f"worker{i}" for i in range(FLAGS.num_workers)] +
            (["evaluator0"] if FLAGS.evaluator else []))


def _memory_cgroups(limits: dict[str, int]) -> "memory_limits.TaskCgroups | None":
    """The tasks' memory cgroups for `--memory` (`limits`: {task: bytes}; None without).

    Raises:
      MemoryLimitError: no cgroup may be made here.
    """
    if not limits:
        return None
    memory = memory_limits.TaskCgroups(limits)
    each = ", ".join(f"{name} {memory_limits.gib(limit)}" for name, limit in limits.items())
    print(f"launch: memory limits (--memory): {each}", flush=True)
    return memory


def _cpu_cgroups(limits: dict) -> "cpu_limits.TaskCgroups | None":
    """The tasks' CPU cgroups for `--cpu` (`limits`: {task: CPUs}; None without); warns
    when the limits add up to more than the machine's cores.

    Raises:
      CpuLimitError: no cgroup may be made here.
    """
    if not limits:
        return None
    cpu = cpu_limits.TaskCgroups(limits)
    total, cores = sum(limits.values()), os.cpu_count() or 1
    over = (f"; warning: they add up to {cpu_limits.quantity(total)} CPUs, more than the "
            f"machine's {cores}: the tasks will also wait for each other"
            ) if total > cores else ""
    each = ", ".join(f"{name} {cpu_limits.quantity(limit)}" for name, limit in limits.items())
    print(f"launch: CPU limits (--cpu): {each}{over}", flush=True)
    return cpu


def _close_cgroups(memory, cpu) -> None:
    """Prints each limited task's peak memory and CPU use, and removes the cgroups."""
    for cgroups, what in ((memory, "peak memory"), (cpu, "CPU")):
        if cgroups is None:
            continue
        print(f"launch: {what}: {cgroups.summary()}", flush=True)
        if cgroups is cpu:
            _warn_held_back_ps(cpu)
        for path in cgroups.close():
            print(f"launch: warning: could not remove cgroup {path} (a process still in it?)",
                  flush=True)


def _warn_held_back_ps(cpu: "cpu_limits.TaskCgroups") -> None:
    """One line per ps task whose CPU limit held it back in most of its periods
    (`cpu_limits.ps_held_back`)."""
    used = {name: cpu.used(name) for name in cpu.limits
            if os.path.isdir(os.path.join(cpu.base, name))}
    for name, share in cpu_limits.ps_held_back(used).items():
        print(f"launch: warning: {name} was held back by its CPU limit "
              f"({cpu_limits.quantity(cpu.limits[name])}) in {share:.0%} of its "
              f"{cpu_limits.PERIOD_US // 1000} ms periods: a request that came after its "
              "quota was spent waited for the next period, and so did the workers' steps "
              "behind it; if steps are slower than expected, give the ps tasks more CPU "
              "(--cpu=ps=...) or more ps tasks", flush=True)


def script_commands(script: str, script_args: list[str], num_ps: int, num_workers: int,
                    cluster_as: str = "flags", host: str = "127.0.0.1"
                    ) -> tuple[dict[str, list[str]], dict[str, dict]]:
    """A script's cluster on free ports of `host`: ({task name: argv}, {task name: variables
    added to its environment}).

    Every task runs `python -m lowlevel SCRIPT ARGS`; `cluster_as` "flags" appends the
    Distributed TensorFlow guide's `--ps_hosts --worker_hosts --job_name --task_index`,
    "tf_config" sets `TF_CONFIG` instead (jobs ps and worker, worker 0 the chief).
    """
    ps = [f"{host}:{portpicker.pick_unused_port()}" for _ in range(num_ps)]
    workers = [f"{host}:{portpicker.pick_unused_port()}" for _ in range(num_workers)]
    base = [sys.executable, "-m", "lowlevel", script, *script_args]
    cluster = {"ps": ps, "worker": workers}
    commands, envs = {}, {}
    for job, hosts in cluster.items():
        for index in range(len(hosts)):
            name = f"{job}{index}"
            if cluster_as == "flags":
                commands[name] = base + k8s.guide_flags(cluster, job, index)
            else:
                commands[name] = list(base)
                envs[name] = {"TF_CONFIG": json.dumps(
                    {"cluster": cluster, "task": {"type": job, "index": index}})}
    return commands, envs


def check_script_flags(script_args: list[str]) -> None:
    """Refuses, before anything starts, what does not apply to `--script`.

    Raises:
      UsageError: no such script; a trainer flag (`--model`, `--output_dir`, ...; the
        script's own flags go after `--`) or `--evaluator` given; a cluster flag of the
        guide after `--` with `--script_cluster=flags` (the launcher sets them).
    """
    if not os.path.isfile(FLAGS.script):
        raise UsageError(f"--script={FLAGS.script}: no such file")
    for name in cli.CLUSTER_FLAGS:
        if FLAGS[name].present:
            raise UsageError(f"--{name} is set by the launcher; use --num_ps/--num_workers")
    given = [n for n in cli.trainer_flag_names() if FLAGS[n].present and n != "max_restarts"]
    if FLAGS.evaluator:
        given.insert(0, "evaluator")
    if given:
        raise UsageError(f"--{given[0]} is the trainer's and does not apply to --script; the "
                         f"script's own flags go after '--' (python -m lowlevel.launch "
                         f"--script={FLAGS.script} -- ARGS)")
    if FLAGS.script_cluster == "flags":
        for arg in script_args:
            if arg.split("=")[0] in ("--ps_hosts", "--worker_hosts", "--job_name",
                                     "--task_index"):
                raise UsageError(f"{arg} after '--': the launcher gives each task its "
                                 "cluster flags; use --num_ps/--num_workers")


def main(argv) -> int:
    """Starts the cluster's tasks (the trainer's, or `--script`'s) and supervises them;
    returns the launcher's exit status.

    Raises:
      UsageError: a flag that does not apply or is out of range; TF_CONFIG set.
    """
    if FLAGS.resize is not None:
        if not FLAGS.output_dir:
            raise UsageError("--resize needs --output_dir: the running launcher's")
        return resize.request(FLAGS.output_dir, FLAGS.resize)
    if FLAGS.script is None and len(argv) > 1:
        raise UsageError(f"unexpected argument {argv[1]!r} (flags are --name=value)")
    if FLAGS.script is None and FLAGS["script_cluster"].present:
        raise UsageError("--script_cluster applies only with --script=SCRIPT.py")
    if FLAGS.num_ps < 1 or FLAGS.num_workers < 1:
        raise UsageError("--num_ps and --num_workers must be at least 1")
    if os.environ.get("TF_CONFIG"):
        raise UsageError("TF_CONFIG is set: the launcher makes its own cluster; unset it "
                         "(or start the tasks yourself with python -m lowlevel.trainer)")
    if FLAGS.script is not None:
        if FLAGS.dynamic_workers:
            raise UsageError("--dynamic_workers applies to the trainer only, not --script")
        return _launch_script(argv[1:])
    return _launch_trainer()


def _launch_trainer() -> int:
    """The trainer's cluster: checks its flags, starts and supervises its tasks."""
    extra = trainer_args()
    config = cli.config_from_flags(FLAGS.num_workers)  # fail here, once, not in every task
    if FLAGS.dynamic_workers and not config.span_queue(True, config.sync):
        raise UsageError("--dynamic_workers: workers join and leave through the data queue; "
                         "use --dataset=criteo_files with --data_sharding=auto or queue")
    if config.dataset == "criteo_files":  # the globs match, the files read (first lines)
        from lowlevel.data import ctr_files
        ctr_files.check(config.train_files, config.eval_files)
    limits = _limits()
    output_dir = FLAGS.output_dir or os.path.join(
        "runs", time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}")
    output_layout.ensure_writable(output_dir)
    where = _confine() if not FLAGS.no_isolation else "on localhost"
    envs, resizer = {}, None
    if FLAGS.dynamic_workers:
        commands, envs, resizer = _dynamic(os.path.abspath(output_dir), extra)
    else:
        commands = task_commands(FLAGS.num_ps, FLAGS.num_workers, os.path.abspath(output_dir),
                                 extra, evaluator=FLAGS.evaluator)
    print(f"launch: {FLAGS.num_ps} ps + {FLAGS.num_workers} workers"
          f"{' + evaluator' if FLAGS.evaluator else ''} {where}; "
          f"output in {output_dir}", flush=True)
    if FLAGS.metrics_port:
        print(f"launch: {metrics_ports(commands, FLAGS.metrics_port)}", flush=True)
    if resizer is not None:
        print(f"launch: dynamic workers: python -m lowlevel.launch --output_dir={output_dir} "
              f"--resize=N, or kill -TTIN/-TTOU {os.getpid()}, changes the worker count",
              flush=True)
    return _run(commands, envs, limits, output_dir, FLAGS.fork,
                preloaded=forking.TRAINER_MODULES, resizer=resizer)


def _dynamic(output_dir: str, extra: list[str]):
    """The tasks of a `--dynamic_workers` job and its `resize.Resizer`: (commands, envs,
    resizer). A worker that joins later gets the next metrics port after the first tasks'."""
    base = [sys.executable, "-m", "lowlevel.trainer", f"--output_dir={output_dir}", *extra]
    commands, envs, new_worker = resize.dynamic_commands(
        FLAGS.num_ps, FLAGS.num_workers, base, evaluator=FLAGS.evaluator)
    first_tasks = len(commands)

    def worker(index: int):
        argv, env = new_worker(index)
        if FLAGS.metrics_port:
            argv = [a for a in argv if not a.startswith("--metrics_port=")]
            argv.append(f"--metrics_port={FLAGS.metrics_port + first_tasks + index - 1}")
        return argv, env

    say = lambda text: print(text, flush=True)  # noqa: E731
    return commands, envs, resize.Resizer(output_dir, FLAGS.num_workers, worker, say)


def _launch_script(script_args: list[str]) -> int:
    """`--script`'s cluster: `python -m lowlevel SCRIPT ARGS` per task, forked from this
    process once it has imported TensorFlow (`--nofork`: each started cold)."""
    check_script_flags(script_args)
    limits = _limits()
    where = _confine() if not FLAGS.no_isolation else "on localhost"
    commands, envs = script_commands(FLAGS.script, script_args, FLAGS.num_ps,
                                     FLAGS.num_workers, FLAGS.script_cluster)
    given = ("the guide's --ps_hosts --worker_hosts --job_name --task_index"
             if FLAGS.script_cluster == "flags" else "TF_CONFIG")
    print(f"launch: {FLAGS.script} (python -m lowlevel) as {FLAGS.num_ps} ps + "
          f"{FLAGS.num_workers} workers {where}; each task given {given}", flush=True)
    # After the chief's end a worker left (one restarted late) waits for ps tasks that are
    # gone: stopped like a ps.
    return _run(commands, envs, limits, None, fork=FLAGS.fork, after_chief=("ps", "worker"))


def _limits() -> dict:
    """{"memory": {task: bytes}, "cpu": {task: CPUs}} from --memory and --cpu.

    Raises:
      UsageError: a malformed value.
    """
    return {"memory": memory_limits.limits_for(_task_names(), FLAGS.memory),
            "cpu": cpu_limits.limits_for(_task_names(), FLAGS.cpu)}


def _stop_on_signals(sup: Supervisor, memory, cpu) -> None:
    """Ctrl-C and SIGTERM stop every task (`sup.stop`), close the cgroups and exit 128 + N,
    also once the launcher's output is gone (a closed pipe: the line is not shown)."""
    def on_signal(signum, frame):
        try:
            print(f"launch: {signal.Signals(signum).name}; stopping every task", flush=True)
        except BrokenPipeError:  # the output's reader is gone: stop the tasks all the same
            output_closed(sys.stdout)
        sup.stop(FLAGS.stop_timeout_secs)
        for cgroups in (memory, cpu):
            if cgroups is not None:
                cgroups.close()
        os._exit(128 + signum)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)


def _run(commands: dict[str, list[str]], envs: dict[str, dict], limits: dict,
         output_dir, fork: bool, after_chief: tuple = ("ps",), preloaded: tuple = (),
         resizer=None) -> int:
    """Starts `commands` (forked from this process with `fork`), supervises them to the
    end and reports it; returns the exit status. `output_dir` (the trainer's; None for a
    script) feeds the live progress line and names the final metrics; `resizer`
    (`resize.Resizer`, `--dynamic_workers`) takes resize requests while it runs."""
    started = time.monotonic()
    if fork:
        preload(verbose=FLAGS.verbosity >= 1, modules=preloaded)
    # One run for the tasks' restart budgets (lowlevel.runtime.restarts), whatever --output_dir holds.
    os.environ.setdefault(restarts.RUN_ID_ENV, f"launch-{os.getpid()}-{int(time.time())}")
    memory = _memory_cgroups(limits["memory"])
    try:
        cpu = _cpu_cgroups(limits["cpu"])
    except cpu_limits.CpuLimitError:
        _close_cgroups(memory, None)  # nothing ran in them
        raise
    sup = Supervisor(commands, max_restarts=FLAGS.max_restarts or 0, fork=fork,
                     memory=memory, envs=envs, cpu=cpu)
    _stop_on_signals(sup, memory, cpu)
    if resizer is not None:
        resizer.install()
        resizer.write_state(sup, set())
    progress = Progress() if sys.stdout.isatty() and output_dir else None
    try:
        code = supervise(sup, FLAGS.stop_timeout_secs, progress,
                         os.path.abspath(output_dir) if output_dir else None, after_chief,
                         resizer)
    except BaseException:  # the launcher's own failure must not leave its tasks running
        sup.stop(FLAGS.stop_timeout_secs)
        _close_cgroups(memory, cpu)
        raise
    elapsed = time.monotonic() - started
    restarted = ", ".join(f"{n} x{k}" for n, k in sup.restarts.items() if k)
    _close_cgroups(memory, cpu)
    if code == 0:
        metrics = (f"; metrics in {output_layout.final_metrics(output_dir)}"
                   if output_dir else "")
        print(f"launch: all {len(commands)} tasks exited 0 after {elapsed:.1f} s"
              f"{f' (restarts: {restarted})' if restarted else ''}{metrics}", flush=True)
    if fork:
        # Every task has been reaped and nothing is left to clean; with TensorFlow
        # loaded the interpreter's own teardown took 0.6-0.9 s more (benchmarks/NOTES.md).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def run():
    """Console-script entry point."""
    app.run(cli.exit_status_main("lowlevel.launch", main),
            flags_parser=cli.flags_parser(
                "lowlevel.launch", [cli.TRAINER],
                hint="(python -m lowlevel.launch --help lists the flags; with --script, the "
                     "script's own go after --: --script=SCRIPT.py -- ARGS)"))


if __name__ == "__main__":
    run()
