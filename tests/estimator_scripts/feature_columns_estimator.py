"""A custom tf.estimator.Estimator built on tf.compat.v1.feature_column
(numeric + identity + hash-bucket categorical columns through embedding
columns), its variables under a fixed_size_partitioner(2), fed by
tf.compat.v1.estimator.inputs.numpy_input_fn (queue runners), exported with a
tf.Example parsing serving_input_receiver_fn.

Reference script for lowlevel.estimator: run it unmodified with
    python feature_columns_estimator.py --model_dir=/tmp/fc
    python -m lowlevel.estimator feature_columns_estimator.py --model_dir=/tmp/fc
Prints one line "RESULT {json}" at the end.
"""
import argparse
import json
import sys
import time

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

NUM_CLASSES = 10
NUM_TRAIN = 1500


def parse_args(argv):
  p = argparse.ArgumentParser(description=__doc__)
  p.add_argument('--model_dir', default='/tmp/feature_columns_estimator')
  p.add_argument('--max_steps', type=int, default=200)
  p.add_argument('--batch_size', type=int, default=32)
  p.add_argument('--hidden_units', type=int, default=16)
  p.add_argument('--learning_rate', type=float, default=0.1)
  p.add_argument('--num_partitions', type=int, default=2)
  p.add_argument('--save_checkpoints_steps', type=int, default=100)
  p.add_argument('--keep_checkpoint_max', type=int, default=3)
  p.add_argument('--tf_random_seed', type=int, default=42)
  p.add_argument('--throttle_secs', type=int, default=1)
  return p.parse_args(argv)


FLAGS = None


def load_data():
  """Digits as a dict of numpy columns: a numeric, an int and a string one."""
  digits = load_digits()
  pixels = (digits.data / 16.0).astype(np.float32)
  images = digits.data.reshape(-1, 8, 8)
  quadrant_ink = np.stack([images[:, :4, :4].sum((1, 2)),
                           images[:, :4, 4:].sum((1, 2)),
                           images[:, 4:, :4].sum((1, 2)),
                           images[:, 4:, 4:].sum((1, 2))], axis=1)
  features = {
      'pixels': pixels,
      'brightest_quadrant': quadrant_ink.argmax(axis=1).astype(np.int64),
      'ink': np.array([b'ink%d' % (s // 40) for s in digits.data.sum(1)]),
  }
  labels = digits.target.astype(np.int32)
  train = ({k: v[:NUM_TRAIN] for k, v in features.items()}, labels[:NUM_TRAIN])
  test = ({k: v[NUM_TRAIN:] for k, v in features.items()}, labels[NUM_TRAIN:])
  return train, test


def feature_columns():
  fc = tf.compat.v1.feature_column
  return [
      fc.numeric_column('pixels', shape=[64]),
      fc.embedding_column(
          fc.categorical_column_with_identity('brightest_quadrant',
                                              num_buckets=4), dimension=2),
      fc.embedding_column(
          fc.categorical_column_with_hash_bucket('ink', hash_bucket_size=16),
          dimension=3),
  ]


def model_fn(features, labels, mode, params):
  partitioner = tf.compat.v1.fixed_size_partitioner(params['num_partitions'])
  with tf.compat.v1.variable_scope('dnn', partitioner=partitioner):
    net = tf.compat.v1.feature_column.input_layer(features,
                                                  params['feature_columns'])
    w1 = tf.compat.v1.get_variable(
        'hidden/kernel', [net.shape[1], params['hidden_units']],
        initializer=tf.compat.v1.glorot_uniform_initializer())
    b1 = tf.compat.v1.get_variable('hidden/bias', [params['hidden_units']],
                                   initializer=tf.compat.v1.zeros_initializer())
    net = tf.nn.relu(tf.matmul(net, w1) + b1)
    w2 = tf.compat.v1.get_variable(
        'logits/kernel', [params['hidden_units'], NUM_CLASSES],
        initializer=tf.compat.v1.glorot_uniform_initializer())
    b2 = tf.compat.v1.get_variable('logits/bias', [NUM_CLASSES],
                                   initializer=tf.compat.v1.zeros_initializer())
    logits = tf.matmul(net, w2) + b2
  probabilities = tf.nn.softmax(logits)
  class_ids = tf.argmax(logits, axis=1)
  predictions = {'class_ids': class_ids, 'probabilities': probabilities}
  if mode == tf.estimator.ModeKeys.PREDICT:
    class_names = tf.tile(
        tf.expand_dims(tf.as_string(tf.range(NUM_CLASSES)), 0),
        [tf.shape(logits)[0], 1])
    return tf.estimator.EstimatorSpec(
        mode, predictions=predictions,
        export_outputs={
            'serving_default': tf.estimator.export.ClassificationOutput(
                scores=probabilities, classes=class_names),
            'predict': tf.estimator.export.PredictOutput(predictions),
        })
  loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
  if mode == tf.estimator.ModeKeys.EVAL:
    return tf.estimator.EstimatorSpec(
        mode, loss=loss,
        eval_metric_ops={
            'accuracy': tf.compat.v1.metrics.accuracy(labels, class_ids)})
  opt = tf.compat.v1.train.AdagradOptimizer(params['learning_rate'])
  train_op = opt.minimize(loss,
                          global_step=tf.compat.v1.train.get_global_step())
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def train_input_fn():
  (x, y), _ = load_data()
  return tf.compat.v1.estimator.inputs.numpy_input_fn(
      x, y, batch_size=FLAGS.batch_size, num_epochs=None, shuffle=True)()


def eval_input_fn():
  _, (x, y) = load_data()
  return tf.compat.v1.estimator.inputs.numpy_input_fn(
      x, y, batch_size=FLAGS.batch_size, num_epochs=1, shuffle=False)()


def predict_input_fn():
  _, (x, _) = load_data()
  return tf.compat.v1.estimator.inputs.numpy_input_fn(
      x, batch_size=FLAGS.batch_size, num_epochs=1, shuffle=False)()


def serving_input_receiver_fn():
  spec = tf.compat.v1.feature_column.make_parse_example_spec(feature_columns())
  return tf.estimator.export.build_parsing_serving_input_receiver_fn(spec)()


def build_estimator(flags=None):
  global FLAGS
  if flags is not None:
    FLAGS = flags
  config = tf.estimator.RunConfig(
      model_dir=FLAGS.model_dir,
      save_checkpoints_steps=FLAGS.save_checkpoints_steps,
      keep_checkpoint_max=FLAGS.keep_checkpoint_max,
      tf_random_seed=FLAGS.tf_random_seed)
  return tf.estimator.Estimator(
      model_fn=model_fn, config=config,
      params={'feature_columns': feature_columns(),
              'hidden_units': FLAGS.hidden_units,
              'learning_rate': FLAGS.learning_rate,
              'num_partitions': FLAGS.num_partitions})


def _jsonable(obj):
  if isinstance(obj, dict):
    return {str(k): _jsonable(v) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return [_jsonable(v) for v in obj]
  if isinstance(obj, bytes):
    return obj.decode()
  if isinstance(obj, np.generic):
    return obj.item()
  return obj


def main(argv=None):
  global FLAGS
  FLAGS = parse_args(sys.argv[1:] if argv is None else argv)
  tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.INFO)
  start = time.time()
  estimator = build_estimator()
  exporters = [
      tf.estimator.LatestExporter('latest', serving_input_receiver_fn,
                                  exports_to_keep=1),
      tf.estimator.FinalExporter('final', serving_input_receiver_fn),
  ]
  result = tf.estimator.train_and_evaluate(
      estimator,
      tf.estimator.TrainSpec(train_input_fn, max_steps=FLAGS.max_steps),
      tf.estimator.EvalSpec(eval_input_fn, steps=None, exporters=exporters,
                            start_delay_secs=0,
                            throttle_secs=FLAGS.throttle_secs))
  metrics, export_results = result if result else (None, None)
  out = {
      'return_is_none': result is None,
      'metrics': _jsonable(metrics),
      'export_results': _jsonable(export_results),
      'latest_checkpoint': estimator.latest_checkpoint(),
      'seconds': round(time.time() - start, 2),
  }
  print('RESULT ' + json.dumps(out, sort_keys=True), flush=True)
  return out


if __name__ == '__main__':
  main()
