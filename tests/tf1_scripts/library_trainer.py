"""The skeleton trainer written for `lowlevel.train` (`import lowlevel.train as train` in
place of `tf.train`), run with plain `python`: the library without the runner."""
import argparse
import os
import sys

import tensorflow.compat.v1 as tf
from absl import logging

import lowlevel.train as train

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from skeleton_trainer import model  # noqa: E402

tf.disable_v2_behavior()


def main(flags):
    cluster = train.ClusterSpec({"ps": flags.ps_hosts.split(","),
                                 "worker": flags.worker_hosts.split(",")})
    server = train.Server(cluster, job_name=flags.job_name, task_index=flags.task_index)
    if flags.job_name == "ps":
        server.join()
        return
    with tf.device(train.replica_device_setter(
            worker_device="/job:worker/task:%d" % flags.task_index, cluster=cluster)):
        loss = model(flags.batch_size)
        train_op = train.AdagradOptimizer(0.1).minimize(
            loss, global_step=train.get_or_create_global_step())
    with train.MonitoredTrainingSession(master=server.target, is_chief=flags.task_index == 0,
                                        checkpoint_dir=flags.checkpoint_dir,
                                        hooks=[train.StopAtStepHook(last_step=flags.last_step)]
                                        ) as sess:
        while not sess.should_stop():
            sess.run(train_op)


if __name__ == "__main__":
    logging.use_absl_handler()  # lowlevel logs through absl: its format and level, as
    logging.set_verbosity(logging.INFO)  # absl.app.run would set them
    parser = argparse.ArgumentParser()
    for name in ("ps_hosts", "worker_hosts", "job_name", "checkpoint_dir"):
        parser.add_argument(f"--{name}", default="")
    for name, default in (("task_index", 0), ("last_step", 1000), ("batch_size", 64)):
        parser.add_argument(f"--{name}", type=int, default=default)
    main(parser.parse_args())
    sys.stdout.flush()
    os._exit(0)  # a tf.train.Server has no working Stop(): its destructor may hang the exit
