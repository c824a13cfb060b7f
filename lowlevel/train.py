"""`tf.compat.v1.train` with lowlevel's runtime under its distributed classes, for your own TF1 program.

    import lowlevel.train as train    # in place of: train = tf.compat.v1.train

    server = train.Server(cluster, job_name=FLAGS.job_name, task_index=FLAGS.task_index)
    if FLAGS.job_name == "ps":
        server.join()                  # serves until the chief ends the training, then exits 0
    ...
    with train.MonitoredTrainingSession(master=server.target, is_chief=..., ...) as sess:
        ...

`python -m lowlevel SCRIPT.py` puts these classes into `tf.compat.v1.train` (`install`)
before the script runs, so an unmodified script gets them. Same names and signatures as
TensorFlow 2.21's `tf.compat.v1.train`; any other name here is `tf.compat.v1.train`'s own.

Taken over (the defects of the Distributed TensorFlow guide's skeleton trainer on stock
TensorFlow 2.21, measured: docs/tf1-programs.md):

- `Server`: with no `config`, the thread pools and device filters of lowlevel's tasks
  (`runtime.server.session_config`: the task's CPUs shared among the tasks on its host; a
  worker sees only the ps job and itself). `join()` on a ps ends the process with status 0
  once the chief signals the end of training (`runtime.shutdown`, steps 7-8); stock
  `join()` never returns (tensorflow/tensorflow#4713).
- `MonitoredTrainingSession`: lowlevel's session creators (`runtime.sessions`): a
  non-chief polls for the chief's model every 0.5 s (stock: every 30 s, so it ran its
  first step ~30 s after the chief), each session waits for the ps tasks first, bounded,
  naming the one that does not answer (exit status 200); the chief adopts a model the ps
  tasks still hold when it is restarted. The end-of-training protocol
  (`runtime.shutdown.end_of_training_hooks`): a non-chief reports its end; the chief
  waits for the other workers, saves its final checkpoint, tells every ps to exit. The
  stock stop grace of 120 s is 2 s (`runtime.training.STOP_GRACE_SECS`). The session's
  `run` has the trainer's deadline (60 s) and outage clock (`runtime.faults`): a run past
  its deadline (a ps frozen or cut off: silence, no error) is reported and run again; once
  the outage has lasted 90 s the task gives up with `errors.NetworkFault` naming the peers
  that do not answer (exit status 200 under the runner), a watchdog ending it likewise if
  it is stuck in a call TensorFlow gives no deadline. A session lost to a failed task is
  replaced on the same clock. A script has no flags for these limits: the environment
  gives others, `LOWLEVEL_<FLAG>` for the trainer's flag of the same meaning
  (`LOWLEVEL_STEP_TIMEOUT_SECS`, `_FAULT_TIMEOUT_SECS`, `_STARTUP_TIMEOUT_SECS`,
  `_SYNC_TIMEOUT_SECS`, `_SHUTDOWN_TIMEOUT_SECS`; `limit`).

  Under the runner, SIGTERM or SIGINT in training stops the loop after its current run;
  the chief's close saves its checkpoint; the process exits 128 + N (143 for SIGTERM:
  retryable), and at once with it before training (`runtime.preemption`).

- The step: once a task's `Server` is made, an optimizer's `minimize`/`apply_gradients`
  with a global step is the counted step (`modes.script_steps`), its limit the
  `last_step` of the `StopAtStepHook` given to `MonitoredTrainingSession`, or else the
  environment's `LOWLEVEL_LAST_STEP` (for a loop of the script's own, `until step >= N`):
  an async run ends at exactly that step (stock: up to (workers - 1) past it). A run whose
  step finds no step left returns its other fetches, the step's own None
  (`script_steps._run_past_the_end`), so the loop sees the last step and ends. With
  `SyncReplicasOptimizer`, its `make_session_run_hook` gets the runtime's hook, whose
  chief loop stops at the last step (stock: it blocks in the ps's accumulators until its
  session is closed, tensorflow/tensorflow#7970), and the outage clock counts the other
  workers too (a sync step waits for them).
- A loop of the script's own (a `Supervisor`'s or a plain session, no
  `MonitoredTrainingSession`): the main thread's runs of a session on a worker's `Server`
  have the same deadline and outage clock (`_watch_own_loops`); a run that fails because
  gRPC's keepalive closed the channel to a silent peer (`UnavailableError`) is run again
  on the same session too (a plain session stays usable; it cannot be replaced, the
  script holds it), and so is an `OutOfRangeError` in an outage (an input iterator
  whose read a deadline cancelled reports its end: seen on a frozen ps; a script that
  takes it for the end of its data would end early), so a frozen ps ends the task with
  status 200 naming it.
  `end_of_script`, after the loop, ends the cluster.

- `replica_device_setter`: with several ps tasks, variables balanced by bytes (greedy:
  each to the ps holding the fewest bytes so far; stock: round-robin), on the ps's CPU.

Not taken over yet (stock behaviour): a last step
given only as `StopAtStepHook(num_steps=...)` (the steps run uncounted); runs of the
script's own sessions
in threads other than the main one (a `Supervisor`'s services: the watchdog still ends a
task whose main thread is held).
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Optional

import tensorflow as tf
from absl import logging

from lowlevel import events
from lowlevel.cluster.spec import CHIEF, PS, WORKER, Cluster, Task
from lowlevel.cluster import probes
from lowlevel.errors import UsageError
from lowlevel.modes import script_steps
from lowlevel.runtime import server as server_lib
from lowlevel.runtime import faults, hooks as runtime_hooks, placement, preemption, progress
from lowlevel.runtime import sessions, shutdown
from lowlevel.runtime.training import STOP_GRACE_SECS, ClusterWaits

v1 = tf.compat.v1
_stock = v1.train  # the module itself: its attributes are replaced by `install`
_STOCK = {name: getattr(_stock, name) for name in
          ("Server", "MonitoredTrainingSession", "StopAtStepHook", "replica_device_setter")}
_stock_replica_device_setter = _STOCK["replica_device_setter"]

# The trainer's defaults (`lowlevel.config.TrainConfig`), seconds: a session's wait for the
# ps tasks to answer at start-up (--startup_timeout_secs); the deadline of every run
# (--step_timeout_secs); the longest outage before the task gives up with exit status 200,
# naming the peers that do not answer (--fault_timeout_secs).
STARTUP_TIMEOUT_SECS = 600.0
STEP_TIMEOUT_SECS = 60.0
FAULT_TIMEOUT_SECS = 90.0
# Sync: seconds a step may wait for gradients before the chief logs the workers that do
# not answer (--sync_timeout_secs).
SYNC_TIMEOUT_SECS = 30.0
# Seconds the chief waits after its last step for the other workers' end reports (the
# trainer's --shutdown_timeout_secs default).
SHUTDOWN_TIMEOUT_SECS = 60.0
# A script has no flags for the limits: the environment variable LOWLEVEL_<FLAG NAME>
# (LOWLEVEL_STEP_TIMEOUT_SECS=20) gives one other than its default (`limit`).
LIMITS = {"startup_timeout_secs": STARTUP_TIMEOUT_SECS, "step_timeout_secs": STEP_TIMEOUT_SECS,
          "fault_timeout_secs": FAULT_TIMEOUT_SECS, "sync_timeout_secs": SYNC_TIMEOUT_SECS,
          "shutdown_timeout_secs": SHUTDOWN_TIMEOUT_SECS}
# Seconds between a worker's progress lines (`runtime.progress.GlobalStepProgressHook`).
PROGRESS_EVERY_SECS = 10.0
# MonitoredTrainingSession's stock stop grace, seconds: taken to mean "not given".
_STOCK_STOP_GRACE_SECS = 120

# The servers this process started with a cluster: {server.target: (Cluster, Task,
# the server's ConfigProto)}.
_tasks: dict[str, tuple] = {}
_protocol_in_hooks: set[str] = set()  # the targets a MonitoredTrainingSession of ours ran on
_lock = threading.Lock()


def _cluster_and_task(server_or_cluster_def, job_name, task_index) -> tuple[Cluster, Task]:
    """lowlevel's `Cluster` and `Task` for a `Server`'s arguments (a ClusterSpec, a dict,
    a ClusterDef or a ServerDef, as `tf.compat.v1.train.Server` takes them).

    Raises:
      UsageError: not a ps/worker cluster (no ps job, or jobs other than chief, worker
        and ps), or no `job_name` for a cluster of several jobs.
    """
    if isinstance(server_or_cluster_def, tf.train.ServerDef):
        job_name = job_name or server_or_cluster_def.job_name
        task_index = server_or_cluster_def.task_index if task_index is None else task_index
        server_or_cluster_def = server_or_cluster_def.cluster
    spec = v1.train.ClusterSpec(server_or_cluster_def).as_dict()
    other = set(spec) - {CHIEF, PS, WORKER}
    if other or PS not in spec:
        raise UsageError(f"the cluster's jobs are {sorted(spec)}, not a ps/worker cluster "
                         "(jobs ps, worker and an optional chief)")

    def hosts(job):  # a job given as {task_index: address} may leave gaps: None there
        tasks = spec.get(job, [])
        if isinstance(tasks, dict):
            return tuple(tasks.get(i) for i in range(max(tasks, default=-1) + 1))
        return tuple(tasks)
    cluster = Cluster(hosts(PS), hosts(WORKER), hosts(CHIEF),
                      sparse=any(isinstance(tasks, dict) for tasks in spec.values()))
    if job_name is None:
        job_name = next(iter(spec)) if len(spec) == 1 else None
    if job_name is None:
        raise UsageError("no job_name for a cluster of several jobs")
    return cluster, cluster.task(job_name, task_index or 0)


class Server(_STOCK["Server"]):
    """`tf.compat.v1.train.Server` whose `join()` on a ps ends the process at the end of training.

    Same arguments as `tf.compat.v1.train.Server`. For a ps/worker cluster (jobs ps and
    worker, an optional chief) with `config` None, the task's server gets lowlevel's
    session config (thread pools sized from the task's CPUs among the tasks on its host,
    device filters: `runtime.server.session_config`); from then on, in this process, an
    optimizer's apply with a global step is the counted step (`modes.script_steps`). Any
    other cluster gets the stock server, `join()` included.
    """

    def __init__(self, server_or_cluster_def, job_name=None, task_index=None, protocol=None,
                 config=None, start=True):
        try:
            cluster, task = _cluster_and_task(server_or_cluster_def, job_name, task_index)
        except UsageError as e:
            logging.info("%s; this server is stock TensorFlow's", e)
            cluster = task = None
        if task is not None and config is None:
            config = server_lib.session_config(cluster, task)
        super().__init__(server_or_cluster_def, job_name=job_name, task_index=task_index,
                         protocol=protocol, config=config, start=start)
        self.task = task
        if task is not None:
            script_steps.install()  # the counted step, for the graph the script builds next
            _watch_own_loops()
            with _lock:
                _tasks[tf.compat.as_text(self.target)] = (cluster, task, config)
            logging.info("%s: server listening (%s)", task.name, self.target)

    def join(self):
        """A ps: serves until the chief signals the end of training, then ends the process
        with status 0 (its output flushed). It does not return: stock `join()` never does,
        so no script's code after it was ever run, and some go on into the worker's code
        if it returns (TensorFlow's `mnist_replica.py` builds the model and waits for a
        session as worker 0). Any other task: `tf.compat.v1.train.Server.join` (blocks
        until the process ends)."""
        if self.task is None or self.task.job_name != PS:
            return super().join()
        shutdown.run_std_server(self, self.task, _tasks[tf.compat.as_text(self.target)][2])
        logging.flush()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # a Server has no working Stop(): its destructor could hang an exit


def limit(name: str) -> float:
    """The limit `name` (a key of `LIMITS`, the trainer's flag of the same name), seconds:
    the environment's `LOWLEVEL_<NAME>` when set, else its default.

    Raises:
      UsageError: the variable is set to something other than a positive number (exit
        status 2 under the runner).
    """
    variable = f"LOWLEVEL_{name.upper()}"
    text = os.environ.get(variable, "").strip()
    if not text:
        return LIMITS[name]
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise UsageError(f"{variable}={text!r}: expected a positive number of seconds (the "
                         f"trainer's --{name}; default {LIMITS[name]:g})")
    return value


def check_limits() -> None:
    """Reads every limit the environment gives (`limit`), so that a wrong one stops the
    runner before the script starts.

    Raises:
      UsageError: one of them is not a positive number.
    """
    for name in LIMITS:
        limit(name)


_own_watches: dict = {}  # {server.target: faults.FaultWatch} of sessions a script made itself


def _watch_own_loops() -> None:
    """Gives the main thread's runs of a session the script made itself (a `Supervisor`'s,
    a plain `tf.compat.v1.Session(server.target)`) on a worker's `Server` of this process
    the deadline and outage clock `MonitoredTrainingSession`'s runs have (`_own_loop_run`),
    for the rest of the process (once; later calls do nothing)."""
    with _lock:
        own = v1.Session.run
        if getattr(own, "lowlevel_own_loops", False):
            return

        def run(self, fetches, feed_dict=None, options=None, run_metadata=None):
            watch = _own_loop_watch(self)
            if watch is None:
                return own(self, fetches, feed_dict, options, run_metadata)
            return _own_loop_run(watch, lambda merged: own(self, fetches, feed_dict, merged,
                                                           run_metadata), options)
        run.lowlevel_own_loops = True
        v1.Session.run = run


_in_watched_run = threading.local()


def _own_loop_watch(session) -> Optional[faults.FaultWatch]:
    """The task's watch for a run of `session` in the main thread, outside another watched
    run, when its target is a worker's `Server` of this process that no
    `MonitoredTrainingSession` of ours runs on (those have theirs: `_WatchedSession`);
    else None (the run is stock). Made on first use, with the watchdog (`faults.Outage`)."""
    if getattr(_in_watched_run, "active", False) or \
            threading.current_thread() is not threading.main_thread():
        return None
    target = tf.compat.as_text(session.sess_str or "")
    with _lock:
        found = _tasks.get(target)
        if found is None or target in _protocol_in_hooks or found[1].job_name == PS:
            return None
        watch = _own_watches.get(target)
        if watch is None:
            cluster, task, _ = found
            peers = faults.peers_of(cluster, task, sync=script_steps.trains_in_sync())
            watch = _own_watches[target] = _fault_watch(task.name, peers)
    return watch


def _fault_watch(task_name: str, peers, outage: Optional[faults.Outage] = None):
    """A `faults.FaultWatch` at the limits (`limit`), on `outage`'s clock (default: a new
    one), its watchdog started."""
    watch = faults.FaultWatch(task_name, peers, limit("step_timeout_secs"),
                              limit("fault_timeout_secs"), outage=outage)
    watch.outage.watchdog()
    return watch


def _own_loop_run(watch: faults.FaultWatch, run, options):
    """`run(options)` under `watch` (`faults.FaultWatch.run`: the deadline, reports, the
    outage clock), the run's own shorter deadline kept.

    Raises:
      errors.NetworkFault: the peers did not answer for `FAULT_TIMEOUT_SECS` (exit status
        200 under the runner).
    """
    _in_watched_run.active = True
    try:
        return watch.run(lambda deadline: run(_merged_options(deadline, options)),
                         lost=(tf.errors.UnavailableError,),
                         lost_in_outage=(tf.errors.OutOfRangeError,))
    finally:
        _in_watched_run.active = False


def _merged_options(deadline, options):
    """`deadline` (RunOptions with the watch's timeout) merged with a run's own `options`,
    the shorter timeout kept."""
    merged = v1.RunOptions()
    merged.CopyFrom(deadline)
    if options is not None:
        merged.MergeFrom(options)
        if options.timeout_in_ms:
            merged.timeout_in_ms = min(options.timeout_in_ms, deadline.timeout_in_ms)
    return merged


class StopAtStepHook(_STOCK["StopAtStepHook"]):
    """`tf.compat.v1.train.StopAtStepHook` (same arguments, same behaviour) whose
    `last_step` (int, or None when `num_steps` was given) `MonitoredTrainingSession` reads:
    it is the limit of the script's counted steps (`modes.script_steps`)."""

    def __init__(self, num_steps=None, last_step=None):
        super().__init__(num_steps=num_steps, last_step=last_step)
        self.last_step = last_step


def replica_device_setter(ps_tasks=0, ps_device="/job:ps", worker_device="/job:worker",
                          merge_devices=True, cluster=None, ps_ops=None, ps_strategy=None):
    """`tf.compat.v1.train.replica_device_setter` (same arguments) with the variables
    balanced by bytes over several ps tasks and pinned to the ps's CPU.

    With more than one ps task (`cluster`'s ps job, else `ps_tasks`) and no `ps_strategy`,
    each variable op goes to the ps task holding the fewest bytes so far, its bytes its
    shape times its dtype's size (`runtime.placement.ByteBalancedStrategy`: the greedy
    byte-size balancing of TensorFlow 1.x's `tf.contrib.training.GreedyLoadBalancingStrategy`
    with `byte_size_load_fn`, gone from TensorFlow 2); a variable whose shape is not known
    when it is made counts 0 bytes. Stock: round-robin by creation order, which puts a
    large layer and a small one on the same ps as readily as on two. Every worker builds
    the same graph in the same order, so each places every variable alike. `ps_device` left
    at "/job:ps" is "/job:ps/device:CPU:0": the variables stay in a ps's host memory even on
    a ps host with a GPU (stock: TensorFlow's placer would put them on its GPU). Returns the
    device function, as the stock one; None when there is no ps task."""
    spec = v1.train.ClusterSpec(cluster) if cluster is not None else None
    num_ps = (len(spec.as_dict().get(PS, [])) if spec is not None and PS in spec.jobs
              else ps_tasks)
    if ps_strategy is None and num_ps > 1:
        ps_strategy = placement.ByteBalancedStrategy({}, num_ps)
    if ps_device == "/job:ps":
        ps_device = placement.PS_CPU
    return _stock_replica_device_setter(
        ps_tasks=ps_tasks, ps_device=ps_device, worker_device=worker_device,
        merge_devices=merge_devices, cluster=cluster, ps_ops=ps_ops, ps_strategy=ps_strategy)


USE_DEFAULT = object()  # an argument not given (as tf.compat.v1.train's own USE_DEFAULT)


def MonitoredTrainingSession(master="", is_chief=True, checkpoint_dir=None, scaffold=None,  # noqa: N802
                             hooks=None, chief_only_hooks=None,
                             save_checkpoint_secs=USE_DEFAULT, save_summaries_steps=USE_DEFAULT,
                             save_summaries_secs=USE_DEFAULT, config=None,
                             stop_grace_period_secs=_STOCK_STOP_GRACE_SECS,
                             log_step_count_steps=100, max_wait_secs=7200,
                             save_checkpoint_steps=USE_DEFAULT, summary_dir=None,
                             save_graph_def=True):
    """`tf.compat.v1.train.MonitoredTrainingSession`, on lowlevel's session creators and
    end-of-training protocol when `master` is the target of a `Server` of this process
    (module doc); any other `master` (in-process, a remote target) gets the stock one.

    Same arguments and defaults as TensorFlow 2.21's: a checkpoint every 600 s unless
    `save_checkpoint_steps` or `save_checkpoint_secs` is given, summaries every 100 steps,
    `config` None meaning the server's. `stop_grace_period_secs` left at its stock 120 s is
    2 s (the helper threads of lowlevel's hooks end at the last step). The task logs its
    progress every `PROGRESS_EVERY_SECS` and writes its events to
    `<checkpoint_dir>/events/<task>.jsonl`, as the trainer does in its output dir.

    Returns:
      A `tf.compat.v1.train.MonitoredSession`; on a cluster, wrapped so that its `run` has
      the deadline and the outage clock (`_WatchedSession`: otherwise the session).

    Raises (from the session's creation; the wrapped `run` raises the first):
      errors.NetworkFault: the peers did not answer for `FAULT_TIMEOUT_SECS`.
      errors.StartupError: a ps did not answer within `STARTUP_TIMEOUT_SECS`.
      tf.errors.DeadlineExceededError: (a non-chief) the chief had no model ready within
        `max_wait_secs` seconds.
    """
    given = {k: v for k, v in dict(
        save_checkpoint_secs=save_checkpoint_secs, save_summaries_steps=save_summaries_steps,
        save_summaries_secs=save_summaries_secs,
        save_checkpoint_steps=save_checkpoint_steps).items() if v is not USE_DEFAULT}
    found = _claim(master)
    if found is None:
        return _STOCK["MonitoredTrainingSession"](
            master=master, is_chief=is_chief, checkpoint_dir=checkpoint_dir, scaffold=scaffold,
            hooks=hooks, chief_only_hooks=chief_only_hooks, config=config,
            stop_grace_period_secs=stop_grace_period_secs,
            log_step_count_steps=log_step_count_steps, max_wait_secs=max_wait_secs,
            summary_dir=summary_dir, save_graph_def=save_graph_def, **given)
    cluster, task, server_config = found
    if checkpoint_dir and not events.is_open():  # <checkpoint_dir>/events/<task>.jsonl
        events.open_log(checkpoint_dir, task.name)
    scaffold = scaffold or v1.train.Scaffold()
    chief_hooks = (list(chief_only_hooks or []) +
                   _chief_hooks(scaffold, checkpoint_dir, summary_dir or checkpoint_dir,
                                log_step_count_steps, save_graph_def, **given)
                   if is_chief else [])
    steps, sync, last_step = _counted(cluster, chief_hooks + list(hooks or []))
    steps.append(progress.GlobalStepProgressHook(task.name, last_step, PROGRESS_EVERY_SECS))
    outage = faults.Outage(task.name, faults.peers_of(cluster, task, sync=sync),
                           limit("fault_timeout_secs"))
    creator = _session_creator(cluster, task, is_chief, scaffold, master,
                               _with_deadline(config or server_config), checkpoint_dir,
                               max_wait_secs, outage)
    grace = (STOP_GRACE_SECS if stop_grace_period_secs == _STOCK_STOP_GRACE_SECS
             else stop_grace_period_secs)
    return _watched(v1.train.MonitoredSession(
        creator, _protocol_hooks(cluster, task, steps), stop_grace_period_secs=grace), outage)


def _watched(session, outage: faults.Outage) -> "_WatchedSession":
    """`session` with the deadline and `outage`'s clock on its runs, its watchdog started."""
    return _WatchedSession(session, _fault_watch(outage.task_name, outage.peers, outage))


def _claim(master: str) -> Optional[tuple]:
    """(Cluster, Task, ConfigProto) of this process's `Server` whose target is `master`,
    now marked as running the protocol in its session's hooks; None if there is none."""
    master = tf.compat.as_text(master or "")
    with _lock:
        found = _tasks.get(master)
        if found is not None:
            _protocol_in_hooks.add(master)
    return found


def _counted(cluster: Cluster, hooks: list) -> tuple[list, bool, Optional[int]]:
    """Closes the limit of the default graph's counted steps at the last step of the
    `StopAtStepHook`s among `hooks` (the smallest; else `LOWLEVEL_LAST_STEP`'s), and puts
    the runtime's sync hook, which stops at it, in place of each `SyncReplicasOptimizer`
    hook (`modes.script_steps`). Returns (the hooks, whether the script trains in sync,
    the last step or None).
    With no last step (no `StopAtStepHook`, or one given `num_steps`, and no
    `LOWLEVEL_LAST_STEP`) the steps and hooks stay as they are."""
    last = [h.last_step for h in hooks if getattr(h, "last_step", None) is not None
            and isinstance(h, _STOCK["StopAtStepHook"])]
    sync = any(isinstance(h, script_steps.DeferredSyncHook) for h in hooks)
    last_step = min(last) if last else script_steps.env_last_step()
    if last_step is None:
        if v1.get_collection(script_steps.COUNTED_STEPS) or sync:
            logging.info("no StopAtStepHook(last_step=...) among the session's hooks and no "
                         "%s: the script's steps are not counted to a last step (an async "
                         "run may end up to (workers - 1) steps past its own)",
                         script_steps.LAST_STEP_ENV)
        return list(hooks), sync, None
    script_steps.close_limit(v1.get_default_graph(), last_step)
    return [_sync_hook(cluster, h, last_step) if isinstance(h, script_steps.DeferredSyncHook)
            else h for h in hooks], sync, last_step


def _sync_hook(cluster: Cluster, deferred, last_step: int):
    """The runtime's `SyncReplicasHook` for a `SyncReplicasOptimizer`'s hook: its chief
    loop stops at `last_step`, and a sync step waiting `SYNC_TIMEOUT_SECS` for gradients
    logs the workers that do not answer."""
    global_step = deferred.global_step
    if global_step is None:
        raise UsageError("SyncReplicasOptimizer.make_session_run_hook before its "
                         "apply_gradients/minimize with a global_step")
    return runtime_hooks.SyncReplicasHook(
        deferred.optimizer, deferred.is_chief, global_step, last_step,
        limit("sync_timeout_secs"),
        lambda: probes.silent_sync_peers(cluster), num_tokens=deferred.num_tokens)


def _protocol_hooks(cluster: Cluster, task: Task, hooks: list) -> list:
    """`hooks` (the chief's stock ones first, then the script's) in the end-of-training
    protocol's order (`runtime.shutdown`), after the session-ready log and the stop at a
    safe point on SIGTERM/SIGINT (the runner's `preemption`, if any). Builds the protocol's
    queues into the graph: call before it is finalised."""
    channel = shutdown.ShutdownChannel(cluster.num_ps)
    stop = preemption.current()
    if stop is not None:
        stop.task_name = task.name
    preempted = stop.requested if stop is not None else threading.Event()
    training = [_SessionReadyHook(task, stop), _StopWhenPreempted(preempted)] + hooks
    return shutdown.end_of_training_hooks(task, cluster, channel, training,
                                          timeout_secs=limit("shutdown_timeout_secs"),
                                          preempted=preempted)


def _with_deadline(config):
    """A copy of `config` whose runs without a deadline of their own (the hooks', the
    session's set-up) get `STEP_TIMEOUT_SECS`."""
    config = type(config).FromString(config.SerializeToString()) if config is not None \
        else v1.ConfigProto()
    config.operation_timeout_in_ms = int(limit("step_timeout_secs") * 1000)
    return config


class _WatchedSession:
    """A `MonitoredSession` whose `run` has a deadline and the task's outage clock
    (`faults.FaultWatch`): a run past `STEP_TIMEOUT_SECS` (a peer frozen or cut off) is
    reported with the peers that do not answer and run again, until the outage has
    lasted `FAULT_TIMEOUT_SECS`; then `errors.NetworkFault` (exit status 200 under the
    runner) names them. Everything else is the `MonitoredSession`'s."""

    def __init__(self, session, watch: faults.FaultWatch):
        self._session, self._watch = session, watch

    def run(self, fetches, feed_dict=None, options=None, run_metadata=None):
        """`MonitoredSession.run`, under the deadline (a run's own shorter one is kept).

        Raises:
          errors.NetworkFault: the peers did not answer for `FAULT_TIMEOUT_SECS`.
        """
        def once(deadline):
            return self._session.run(fetches, feed_dict=feed_dict,
                                     options=_merged_options(deadline, options),
                                     run_metadata=run_metadata)
        return self._watch.run(once)

    def __enter__(self):
        self._session.__enter__()
        return self

    def __exit__(self, *exc):
        return self._session.__exit__(*exc)

    def __getattr__(self, name):
        return getattr(self._session, name)


class _SessionReadyHook(v1.train.SessionRunHook):
    """Logs each new session of the task, with the global step it starts from (the line
    tells when a non-chief began to train, against the chief's); from the first, a
    SIGTERM or SIGINT stops training at a safe point (`preemption`) instead of at once."""

    def __init__(self, task: Task, stop: Optional[preemption.Preemption]):
        self._task, self._stop = task, stop
        self._global_step = None

    def begin(self):
        self._global_step = v1.train.get_global_step()

    def after_create_session(self, session, coord):
        step = session.run(self._global_step) if self._global_step is not None else None
        logging.info("%s: session ready at global step %s", self._task.name, step)
        events.emit("session_ready", step)
        if self._stop is not None:
            self._stop.training_started()


class _StopWhenPreempted(v1.train.SessionRunHook):
    """Ends the script's loop (`should_stop`) after the run under way once `preempted` is
    set; the session's close then runs the hooks' ends (the chief's checkpoint is saved;
    the end-of-training signals are not sent: the run is not over)."""

    def __init__(self, preempted: threading.Event):
        self._preempted = preempted

    def after_run(self, run_context, run_values):
        if self._preempted.is_set():
            run_context.request_stop()


def _chief_hooks(scaffold, checkpoint_dir, summary_dir, log_step_count_steps, save_graph_def,
                 save_checkpoint_secs=USE_DEFAULT, save_summaries_steps=USE_DEFAULT,
                 save_summaries_secs=USE_DEFAULT, save_checkpoint_steps=USE_DEFAULT) -> list:
    """The chief's stock hooks, with TensorFlow 2.21's defaults (its
    `training/monitored_session.py`): step counter, summaries, checkpoints."""
    save_summaries_steps, save_summaries_secs = _every(save_summaries_steps,
                                                       save_summaries_secs, (100, None))
    save_checkpoint_steps, save_checkpoint_secs = _every(save_checkpoint_steps,
                                                         save_checkpoint_secs, (None, 600))
    made = []
    if summary_dir and log_step_count_steps and log_step_count_steps > 0:
        made.append(v1.train.StepCounterHook(output_dir=summary_dir,
                                             every_n_steps=log_step_count_steps))
    if summary_dir and ((save_summaries_steps or 0) > 0 or (save_summaries_secs or 0) > 0):
        made.append(v1.train.SummarySaverHook(scaffold=scaffold, save_steps=save_summaries_steps,
                                              save_secs=save_summaries_secs,
                                              output_dir=summary_dir))
    if checkpoint_dir and ((save_checkpoint_secs or 0) > 0 or (save_checkpoint_steps or 0) > 0):
        made.append(v1.train.CheckpointSaverHook(checkpoint_dir, save_steps=save_checkpoint_steps,
                                                 save_secs=save_checkpoint_secs,
                                                 scaffold=scaffold, save_graph_def=save_graph_def))
    return made


def _every(steps, secs, default: tuple) -> tuple:
    """(steps, secs) of a hook's period: `default` when neither was given, else the one
    given and None for the other (TensorFlow 2.21's rule for MonitoredTrainingSession)."""
    if steps is USE_DEFAULT and secs is USE_DEFAULT:
        return default
    return (None if steps is USE_DEFAULT else steps, None if secs is USE_DEFAULT else secs)


def _session_creator(cluster: Cluster, task: Task, is_chief: bool, scaffold, master, config,
                     checkpoint_dir: Optional[str], max_wait_secs: float,
                     outage: faults.Outage):
    """The chief's or a worker's creator (`runtime.sessions`); each session first waits for
    every ps to answer: the first at most `STARTUP_TIMEOUT_SECS`, one that replaces a lost
    session on the task's outage clock (`runtime.training.ClusterWaits`)."""
    waits = ClusterWaits(cluster, task, outage, limit("startup_timeout_secs"),
                         limit("fault_timeout_secs"))
    if is_chief:
        creator = sessions.ChiefSessionCreator(scaffold, master, config, checkpoint_dir,
                                               waits.wait_for_cluster, waits.cluster_alive,
                                               guard=waits.guard)
        creator.retry_secs = limit("fault_timeout_secs")
        return creator
    return sessions.WorkerSessionCreator(scaffold, master, config, max_wait_secs,
                                         waits.wait_for_cluster, waits.cluster_alive,
                                         guard=waits.guard)


def end_of_script() -> None:
    """The end-of-training protocol for each worker of this process whose script ended
    without a `MonitoredTrainingSession` of this module (its own loop over a `Supervisor`'s
    or a plain session): a non-chief reports its end; the chief waits for the other
    workers (at most `SHUTDOWN_TIMEOUT_SECS`), then tells every ps to exit, so that their
    `join()` ends them (`runtime.shutdown.end_outside_a_session`). The runner calls it when
    the script has ended with status 0; a library user calls it after the loop."""
    with _lock:
        ended = [(target, found) for target, found in _tasks.items()
                 if target not in _protocol_in_hooks and found[1].job_name != PS]
        _protocol_in_hooks.update(target for target, _ in ended)
    for target, (cluster, task, config) in ended:
        shutdown.end_outside_a_session(target, task, cluster, config,
                                       limit("shutdown_timeout_secs"))


def install() -> None:
    """Puts `Server`, `MonitoredTrainingSession`, `StopAtStepHook` and
    `replica_device_setter` into `tf.compat.v1.train` (and `tf.train` where it is that
    module), for scripts that call them by TensorFlow's names."""
    for name in _STOCK:
        setattr(_stock, name, globals()[name])


def __getattr__(name):
    """Every other name is `tf.compat.v1.train`'s own."""
    return getattr(_stock, name)
