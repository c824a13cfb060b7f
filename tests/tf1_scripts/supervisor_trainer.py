"""A between-graph trainer in the shape of TensorFlow's `tools/dist_test/python/mnist_replica.py`
(written for these tests, not copied): `tf.train.Supervisor` with `recovery_wait_secs=1`,
`prepare_or_wait_for_session(server.target)`, its own loop until the global step it reads
reaches `--train_steps`, and with `--sync_replicas` a `SyncReplicasOptimizer` whose chief
queue runner and init tokens the chief starts itself. No `MonitoredTrainingSession`, no
hooks: the runner ends the cluster after the loop (`lowlevel.train.end_of_script`).
"""
import argparse
import os
import sys
import tempfile

import tensorflow.compat.v1 as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from skeleton_trainer import model  # noqa: E402

tf.disable_v2_behavior()


FLAGS = None


def main(_):
    flags = FLAGS
    workers = flags.worker_hosts.split(",")
    cluster = tf.train.ClusterSpec({"ps": flags.ps_hosts.split(","), "worker": workers})
    server = tf.train.Server(cluster, job_name=flags.job_name, task_index=flags.task_index)
    if flags.job_name == "ps":
        server.join()
        return
    is_chief = flags.task_index == 0
    with tf.device(tf.train.replica_device_setter(
            worker_device="/job:worker/task:%d" % flags.task_index, cluster=cluster)):
        global_step = tf.Variable(0, name="global_step", trainable=False)
        loss = model(64)
        opt = tf.train.AdamOptimizer(0.01)
        if flags.sync_replicas:
            opt = tf.train.SyncReplicasOptimizer(opt, replicas_to_aggregate=len(workers),
                                                 total_num_replicas=len(workers))
        train_step = opt.minimize(loss, global_step=global_step)
        extra = {}
        if flags.sync_replicas:
            extra = dict(local_init_op=opt.chief_init_op if is_chief else opt.local_step_init_op,
                         ready_for_local_init_op=opt.ready_for_local_init_op)
            chief_queue_runner = opt.get_chief_queue_runner()
            sync_init_op = opt.get_init_tokens_op()
        init_op = tf.global_variables_initializer()
    sv = tf.train.Supervisor(is_chief=is_chief, logdir=flags.checkpoint_dir or tempfile.mkdtemp(),
                             init_op=init_op, recovery_wait_secs=1, global_step=global_step,
                             **extra)
    config = tf.ConfigProto(device_filters=["/job:ps", "/job:worker/task:%d" % flags.task_index])
    sess = sv.prepare_or_wait_for_session(server.target, config=config)
    print("worker %d: session ready" % flags.task_index, flush=True)
    if flags.sync_replicas and is_chief:
        sess.run(sync_init_op)
        sv.start_queue_runners(sess, [chief_queue_runner])
    step = 0
    while step < flags.train_steps:
        _, step = sess.run([train_step, global_step])
    print("worker %d: training ended at global step %d" % (flags.task_index, step), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    for name in ("ps_hosts", "worker_hosts", "job_name", "checkpoint_dir"):
        parser.add_argument(f"--{name}", default="")
    parser.add_argument("--task_index", type=int, default=0)
    parser.add_argument("--train_steps", type=int, default=200)
    parser.add_argument("--sync_replicas", action="store_true")
    FLAGS, unparsed = parser.parse_known_args()
    tf.app.run(main=main, argv=[sys.argv[0]] + unparsed)
