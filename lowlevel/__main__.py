"""`python -m lowlevel SCRIPT.py [ARGS...]`: runs your own TF1 program, or an Estimator script,
unmodified on lowlevel's runtime (also the console script `lowlevel-run`).

Before the script runs: TensorFlow imported quietly (its C++ start-up lines hidden,
`tf_import`), gRPC keepalive on the channels between tasks
(`cluster.channels`), `tf.compat.v1.train.Server` and `MonitoredTrainingSession` replaced
by `lowlevel.train`'s (what they take over: that module's doc, docs/tf1-programs.md), and
`tf.estimator` resolving to `lowlevel.estimator` as `python -m lowlevel.estimator` does.
Then SCRIPT runs as `__main__` with `sys.argv = [SCRIPT, ARGS...]`, as `python SCRIPT.py
ARGS` would. Exit status: the script's (0 when it ends; a ps whose `server.join()` returned
at the end of training ends so); 128 + N when signal N stopped it (143: SIGTERM, at a safe
point once training has begun, `lowlevel.train`); a traceback and 1 for an exception of
the script; one line and the status of `lowlevel.errors`' table for a failure of the
runtime (200: a ps that does not answer); 2 for no script or one that does not exist.
"""

from __future__ import annotations

from lowlevel.cluster import channels

USAGE = ("usage: python -m lowlevel SCRIPT.py [ARGS...]\n\n"
         "Runs a TF1 program (tf.compat.v1.train.Server, MonitoredTrainingSession, ...) or a\n"
         "tf.estimator script unmodified on lowlevel's runtime: a ps's server.join() returns\n"
         "when the chief ends the training, a non-chief starts within a second of the chief's\n"
         "model, every task exits 0. ARGS go to the script.\n")


def main(argv=None) -> int:
    """Prepares the runtime, runs the script named by argv[0]; returns the exit status."""
    channels.use_channel_options()  # before TensorFlow makes a channel
    from lowlevel.tf_import import import_quietly
    import_quietly()  # TensorFlow's start-up lines hidden; the script's mode left to it
    from lowlevel import train
    from lowlevel.estimator import __main__ as scripts
    train.install()
    code = scripts.main(argv, prog="lowlevel", usage=USAGE)
    return _preempted_status(code)


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
    """Console-script entry point (`lowlevel-run`)."""
    from lowlevel.estimator import __main__ as scripts
    scripts.run(main)


if __name__ == "__main__":
    run()
