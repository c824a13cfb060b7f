"""`python -m lowlevel SCRIPT.py [ARGS...]`: runs your own TF1 program, or an Estimator script,
unmodified on lowlevel's runtime (also the console script `lowlevel-run`).

Before the script runs: TensorFlow imported quietly (its C++ start-up lines hidden,
`tf_import`), gRPC keepalive on the channels between tasks
(`cluster.channels`), `tf.compat.v1.train.Server` and `MonitoredTrainingSession` replaced
by `lowlevel.train`'s (what they take over: that module's doc, docs/tf1-programs.md), and
`tf.estimator` resolving to `lowlevel.estimator` as `python -m lowlevel.estimator` does.
A script written in TF1's own namespace (`import tensorflow as tf` with `tf.placeholder`,
`tf.train.Server`, `tf.app.run`, `tf.contrib...`: any name TensorFlow 2.21's `tensorflow`
lacks but `tf.compat.v1` has, read from the script's text) gets `tf.compat.v1` for its
`import tensorflow`, in graph mode, with the few `tf.contrib` functions such scripts use
mapped to their TF 2.21 homes, and one line on stderr saying so; any other `tf.contrib`
name ends it with one line naming it and its replacement (exit status 1): the rule and
the table are `lowlevel.tf1_namespace`'s doc. Other scripts run as they are.
Then SCRIPT runs as `__main__` with `sys.argv = [SCRIPT, ARGS...]`, as `python SCRIPT.py
ARGS` would. Exit status: the script's (0 when it ends; a ps's `server.join()` ends the
process with 0 at the end of training); 128 + N when signal N stopped it (143: SIGTERM, at a safe
point once training has begun, `lowlevel.train`); a traceback and 1 for an exception of
the script; one line and the status of `lowlevel.errors`' table for a failure of the
runtime (200: a ps that does not answer); 2 for no script or one that does not exist, or
a limit in the environment that is not a positive number (`LOWLEVEL_STEP_TIMEOUT_SECS`
and the like: `lowlevel.train.limit`).
"""

from __future__ import annotations

import os
import sys
from typing import Optional

from lowlevel.cluster import channels

USAGE = ("usage: python -m lowlevel [--cluster_flags_from_tf_config] SCRIPT.py [ARGS...]\n\n"
         "Runs a TF1 program (tf.compat.v1.train.Server, MonitoredTrainingSession, ...) or a\n"
         "tf.estimator script unmodified on lowlevel's runtime: a ps's server.join() exits 0\n"
         "when the chief ends the training, a non-chief starts within a second of the chief's\n"
         "model, every task exits 0. ARGS go to the script.\n\n"
         "  --cluster_flags_from_tf_config  give the script its task's cluster as the\n"
         "      Distributed TensorFlow guide's flags, --ps_hosts --worker_hosts --job_name\n"
         "      --task_index (after ARGS), read from TF_CONFIG (as a TFJob's operator sets it)\n")
# The runner's one option (before SCRIPT): see USAGE.
CLUSTER_FLAGS_FROM_TF_CONFIG = "--cluster_flags_from_tf_config"


def main(argv=None) -> int:
    """Prepares the runtime, runs the script named by argv[0]; returns the exit status."""
    channels.use_channel_options()  # before TensorFlow makes a channel
    from lowlevel.tf_import import import_quietly
    import_quietly()  # TensorFlow's start-up lines hidden; the script's mode left to it
    from lowlevel import errors, tf1_namespace, train
    from lowlevel.estimator import __main__ as scripts
    try:
        train.check_limits()
        argv = with_cluster_flags(sys.argv[1:] if argv is None else list(argv),
                                  os.environ.get("TF_CONFIG"))
    except errors.UsageError as e:
        sys.stderr.write(f"lowlevel: {e}\n")
        return errors.USAGE
    train.install()
    code = scripts.main(argv, prog="lowlevel", usage=USAGE, prepare=tf1_namespace.prepare)
    code = _preempted_status(code)
    if code == 0:
        train.end_of_script()  # a loop of its own (no MonitoredTrainingSession): the end here
    return code


def with_cluster_flags(argv: list, tf_config: Optional[str]) -> list:
    """`argv` (the runner's arguments: SCRIPT.py ARGS), or, when it begins with
    `CLUSTER_FLAGS_FROM_TF_CONFIG`, the rest of it with the guide's cluster flags of
    `tf_config`'s task after ARGS (`--ps_hosts=... --worker_hosts=... --job_name=worker
    --task_index=1`: a TFJob's pods share one template, so only the operator's TF_CONFIG
    can tell each its task).

    Raises:
      errors.UsageError: the option without a TF_CONFIG, with a malformed one, or with a
        chief or evaluator (the guide's flags name ps and worker tasks only; worker 0 is
        the chief).
    """
    if not argv or argv[0] != CLUSTER_FLAGS_FROM_TF_CONFIG:
        return argv
    from lowlevel.cluster import tf_config as tf_configs
    from lowlevel.errors import UsageError
    from lowlevel.ops import k8s
    if not tf_config:
        raise UsageError(f"{CLUSTER_FLAGS_FROM_TF_CONFIG}: no TF_CONFIG in the environment "
                         "(a TFJob's operator sets it for each pod)")
    cluster, task = tf_configs.from_tf_config(tf_config)
    spec = cluster.as_dict() if cluster is not None and not cluster.sparse else {}
    if task.job_name not in ("ps", "worker") or set(spec) - {"ps", "worker"} or not spec:
        raise UsageError(f"{CLUSTER_FLAGS_FROM_TF_CONFIG}: the guide's flags name ps and "
                         f"worker tasks only (worker 0 is the chief); TF_CONFIG has jobs "
                         f"{sorted(spec)} and this task is a {task.job_name}")
    return argv[1:] + k8s.guide_flags(spec, task.job_name, task.task_index)


def _preempted_status(code: int) -> int:
    """128 + N if signal N stopped the script's training at a safe point (it then ends as
    if done: its loop saw `should_stop`), else `code`."""
    from lowlevel import events
    from lowlevel.runtime import preemption
    stop = preemption.current()
    if code == 0 and stop is not None and stop.requested.is_set():
        events.emit("preempted", None, signal=stop.signal_name, checkpoint=None)
        return preemption.exit_status(stop.signum)
    return code


def run():
    """Console-script entry point (`lowlevel-run`). Started by `lowlevel.launch --script`,
    the task first binds its life to the launcher's (`ops.lifetime`: SIGTERM when it dies)."""
    from lowlevel.ops.lifetime import die_with_parent
    die_with_parent()
    from lowlevel.estimator import __main__ as scripts
    scripts.run(main)


if __name__ == "__main__":
    run()
