"""The Distributed TensorFlow guide's skeleton trainer (TensorFlow 1.x, "Putting it all
together: example trainer program") as printed, in TF1's own namespace (`import tensorflow
as tf`, `tf.train.Server`, `tf.contrib.framework.get_or_create_global_step()`,
`tf.app.run`), not migrated. Filled in: its "Build model..." with the MLP on scikit-learn's
digits of `skeleton_trainer.py`, in TF1 names (`tf.contrib.layers.xavier_initializer` is
Glorot's uniform initializer); `--last_step` and `--checkpoint_dir` flags for the guide's
constants (1000000, "/tmp/train_logs"). Stock TensorFlow 2.21 cannot run it (no
`tf.train.Server`, no `tf.contrib`); `python -m lowlevel` runs it (lowlevel.tf1_namespace).
"""
import argparse
import sys

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

FLAGS = None


def model(batch_size):
    digits = load_digits()
    images = (digits.images.reshape(-1, 64) / 16.0).astype(np.float32)
    labels = digits.target.astype(np.int64)
    data = tf.data.Dataset.from_tensor_slices((images, labels)).repeat().shuffle(2048, seed=0)
    x, y = data.batch(batch_size).make_one_shot_iterator().get_next()
    w1 = tf.get_variable("w1", [64, 64],
                         initializer=tf.contrib.layers.xavier_initializer(seed=1))
    b1 = tf.get_variable("b1", [64], initializer=tf.zeros_initializer())
    w2 = tf.get_variable("w2", [64, 10],
                         initializer=tf.contrib.layers.xavier_initializer(seed=2))
    b2 = tf.get_variable("b2", [10], initializer=tf.zeros_initializer())
    logits = tf.matmul(tf.nn.relu(tf.matmul(x, w1) + b1), w2) + b2
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))


def main(_):
    ps_hosts = FLAGS.ps_hosts.split(",")
    worker_hosts = FLAGS.worker_hosts.split(",")

    # Create a cluster from the parameter server and worker hosts.
    cluster = tf.train.ClusterSpec({"ps": ps_hosts, "worker": worker_hosts})

    # Create and start a server for the local task.
    server = tf.train.Server(cluster,
                             job_name=FLAGS.job_name,
                             task_index=FLAGS.task_index)

    if FLAGS.job_name == "ps":
        server.join()
    elif FLAGS.job_name == "worker":

        # Assigns ops to the local worker by default.
        with tf.device(tf.train.replica_device_setter(
                worker_device="/job:worker/task:%d" % FLAGS.task_index,
                cluster=cluster)):

            # Build model...
            loss = model(FLAGS.batch_size)
            global_step = tf.contrib.framework.get_or_create_global_step()

            train_op = tf.train.AdagradOptimizer(0.01).minimize(
                loss, global_step=global_step)

        # The StopAtStepHook handles stopping after running given steps.
        hooks = [tf.train.StopAtStepHook(last_step=FLAGS.last_step)]

        # The MonitoredTrainingSession takes care of session initialization,
        # restoring from a checkpoint, saving to a checkpoint, and closing when done
        # or an error occurs.
        with tf.train.MonitoredTrainingSession(master=server.target,
                                               is_chief=(FLAGS.task_index == 0),
                                               checkpoint_dir=FLAGS.checkpoint_dir,
                                               hooks=hooks) as mon_sess:
            while not mon_sess.should_stop():
                # Run a training step asynchronously.
                # See `tf.train.SyncReplicasOptimizer` for additional details on how to
                # perform *synchronous* training.
                # mon_sess.run handles AbortedError in case of preempted PS.
                mon_sess.run(train_op)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.register("type", "bool", lambda v: v.lower() == "true")
    # Flags for defining the tf.train.ClusterSpec
    parser.add_argument("--ps_hosts", type=str, default="",
                        help="Comma-separated list of hostname:port pairs")
    parser.add_argument("--worker_hosts", type=str, default="",
                        help="Comma-separated list of hostname:port pairs")
    parser.add_argument("--job_name", type=str, default="", help="One of 'ps', 'worker'")
    # Flags for defining the tf.train.Server
    parser.add_argument("--task_index", type=int, default=0, help="Index of task within the job")
    parser.add_argument("--last_step", type=int, default=1000000, help="StopAtStepHook's last step")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--checkpoint_dir", type=str, default="/tmp/train_logs")
    FLAGS, unparsed = parser.parse_known_args()
    tf.app.run(main=main, argv=[sys.argv[0]] + unparsed)
