"""A custom tf.estimator.Estimator on scikit-learn's 8x8 digits, written the
way a TensorFlow <= 2.15 user writes one (tf.compat.v1 graph primitives,
tf.estimator.train_and_evaluate, exporters).

Reference script for lowlevel.estimator: run it unmodified with
    python digits_estimator.py --model_dir=/tmp/d            (TF 2.15 + tensorflow_estimator 2.15)
    python -m lowlevel.estimator digits_estimator.py --model_dir=/tmp/d

Honours TF_CONFIG (chief/worker/ps/evaluator) through tf.estimator.RunConfig.
Prints one line "RESULT {json}" at the end (eval metrics, export paths, seconds).
"""
import argparse
import json
import sys
import time

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

NUM_FEATURES = 64
NUM_CLASSES = 10
NUM_TRAIN = 1500  # the remaining 297 images are the eval set


def parse_args(argv):
  p = argparse.ArgumentParser(description=__doc__)
  p.add_argument('--model_dir', default='/tmp/digits_estimator')
  p.add_argument('--max_steps', type=int, default=300)
  p.add_argument('--batch_size', type=int, default=32)
  p.add_argument('--hidden_units', type=int, default=16)
  p.add_argument('--learning_rate', type=float, default=0.1)
  p.add_argument('--save_checkpoints_steps', type=int, default=100)
  p.add_argument('--keep_checkpoint_max', type=int, default=3)
  p.add_argument('--tf_random_seed', type=int, default=42)
  p.add_argument('--throttle_secs', type=int, default=1)
  p.add_argument('--start_delay_secs', type=int, default=0)
  p.add_argument('--eval_steps', type=int, default=None,
                 help='EvalSpec.steps; None = the whole eval set')
  p.add_argument('--exports_to_keep', type=int, default=2)
  p.add_argument('--sync', action='store_true',
                 help='wrap the optimizer in SyncReplicasOptimizer')
  p.add_argument('--sync_hook_in', choices=['training_chief_hooks',
                                            'training_hooks'],
                 default='training_chief_hooks')
  p.add_argument('--model_fn_args', action='store_true',
                 help='use model_fn(features, labels, mode): no params')
  p.add_argument('--serving', choices=['raw', 'handwritten'], default='raw',
                 help='build_raw_serving_input_receiver_fn or a hand-written '
                      'ServingInputReceiver')
  p.add_argument('--export_outputs', choices=['predict', 'default', 'all'],
                 default='predict',
                 help='predict: {"classify": PredictOutput}; default: None '
                      '(Estimator builds serving_default); all: PredictOutput '
                      '+ ClassificationOutput + RegressionOutput')
  p.add_argument('--warm_start_from', default=None)
  p.add_argument('--warm_start_vars', default=None,
                 help='regex: use WarmStartSettings(vars_to_warm_start=...)')
  p.add_argument('--log_step_count_steps', type=int, default=100)
  p.add_argument('--save_summary_steps', type=int, default=100)
  return p.parse_args(argv)


FLAGS = None


# ---------------------------------------------------------------- data

def load_data():
  digits = load_digits()
  x = (digits.data / 16.0).astype(np.float32)
  y = digits.target.astype(np.int32)
  return (x[:NUM_TRAIN], y[:NUM_TRAIN]), (x[NUM_TRAIN:], y[NUM_TRAIN:])


def train_input_fn(params):
  (x, y), _ = load_data()
  ds = tf.data.Dataset.from_tensor_slices(({'x': x}, y))
  ds = ds.shuffle(1000, seed=params.get('seed', 0)).repeat()
  return ds.batch(params['batch_size'])


def eval_input_fn(params):
  _, (x, y) = load_data()
  ds = tf.data.Dataset.from_tensor_slices(({'x': x}, y))
  return ds.batch(params['batch_size'])


def predict_input_fn(params):
  _, (x, _) = load_data()
  return tf.data.Dataset.from_tensor_slices({'x': x}).batch(
      params['batch_size'])


def serving_input_receiver_fn_handwritten():
  """A hand-written serving_input_receiver_fn."""
  x = tf.compat.v1.placeholder(tf.float32, [None, NUM_FEATURES], name='x')
  return tf.estimator.export.ServingInputReceiver({'x': x}, {'x': x})


# TF2 runs eagerly at import time, so the example tensor is an eager tensor:
# only its dtype and shape[1:] are used (the batch dimension becomes None).
serving_input_receiver_fn_raw = (
    tf.estimator.export.build_raw_serving_input_receiver_fn(
        {'x': tf.zeros([1, NUM_FEATURES], tf.float32)}))


# ---------------------------------------------------------------- model

def _dense(x, units, name):
  with tf.compat.v1.variable_scope(name):
    w = tf.compat.v1.get_variable(
        'kernel', [x.shape[1], units],
        initializer=tf.compat.v1.glorot_uniform_initializer())
    b = tf.compat.v1.get_variable(
        'bias', [units], initializer=tf.compat.v1.zeros_initializer())
    return tf.matmul(x, w) + b


def _export_outputs(predictions):
  kind = FLAGS.export_outputs
  if kind == 'default':
    return None
  outputs = {'classify': tf.estimator.export.PredictOutput(predictions)}
  if kind == 'all':
    outputs['serving_default'] = tf.estimator.export.PredictOutput(predictions)
    outputs['classification'] = tf.estimator.export.ClassificationOutput(
        scores=predictions['probabilities'])
    outputs['regression'] = tf.estimator.export.RegressionOutput(
        value=tf.cast(predictions['classes'], tf.float32))
  return outputs


def model_fn(features, labels, mode, params):
  """MLP: 64 -> hidden (relu) -> 10, Adagrad."""
  x = features['x']
  with tf.compat.v1.variable_scope('mlp'):
    hidden = tf.nn.relu(_dense(x, params['hidden_units'], 'hidden'))
    logits = _dense(hidden, NUM_CLASSES, 'logits')
  classes = tf.argmax(logits, axis=1)
  predictions = {
      'classes': classes,
      'probabilities': tf.nn.softmax(logits),
  }
  if mode == tf.estimator.ModeKeys.PREDICT:
    return tf.estimator.EstimatorSpec(
        mode, predictions=predictions,
        export_outputs=_export_outputs(predictions))

  loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(
      labels=labels, logits=logits)
  if mode == tf.estimator.ModeKeys.EVAL:
    accuracy = tf.compat.v1.metrics.accuracy(labels=labels,
                                             predictions=classes)
    return tf.estimator.EstimatorSpec(
        mode, loss=loss, eval_metric_ops={'accuracy': accuracy})

  opt = tf.compat.v1.train.AdagradOptimizer(params['learning_rate'])
  chief_hooks, hooks = [], []
  if params.get('sync'):
    opt = tf.compat.v1.train.SyncReplicasOptimizer(
        opt, replicas_to_aggregate=params['num_workers'],
        total_num_replicas=params['num_workers'])
    hook = opt.make_session_run_hook(params['is_chief'])
    if params.get('sync_hook_in') == 'training_hooks':
      hooks.append(hook)
    else:
      chief_hooks.append(hook)
  train_op = opt.minimize(loss,
                          global_step=tf.compat.v1.train.get_global_step())
  return tf.estimator.EstimatorSpec(
      mode, loss=loss, train_op=train_op, training_chief_hooks=chief_hooks,
      training_hooks=hooks)


def model_fn_no_params(features, labels, mode):
  """Same model, reading its hyper-parameters from FLAGS instead of params."""
  return model_fn(features, labels, mode, params=hparams_from_flags(None))


def hparams_from_flags(config):
  return {
      'hidden_units': FLAGS.hidden_units,
      'learning_rate': FLAGS.learning_rate,
      'batch_size': FLAGS.batch_size,
      'seed': FLAGS.tf_random_seed,
      'sync': FLAGS.sync,
      'sync_hook_in': FLAGS.sync_hook_in,
      'is_chief': config.is_chief if config else True,
      'num_workers': max(1, config.num_worker_replicas) if config else 1,
  }


# ---------------------------------------------------------------- main

def build_estimator(flags=None):
  global FLAGS
  if flags is not None:
    FLAGS = flags
  config = tf.estimator.RunConfig(
      model_dir=FLAGS.model_dir,
      save_checkpoints_steps=FLAGS.save_checkpoints_steps,
      keep_checkpoint_max=FLAGS.keep_checkpoint_max,
      tf_random_seed=FLAGS.tf_random_seed,
      log_step_count_steps=FLAGS.log_step_count_steps,
      save_summary_steps=FLAGS.save_summary_steps)
  warm_start = FLAGS.warm_start_from
  if warm_start and FLAGS.warm_start_vars:
    warm_start = tf.estimator.WarmStartSettings(
        ckpt_to_initialize_from=FLAGS.warm_start_from,
        vars_to_warm_start=FLAGS.warm_start_vars)
  if FLAGS.model_fn_args:
    return tf.estimator.Estimator(model_fn=model_fn_no_params, config=config,
                                  warm_start_from=warm_start)
  return tf.estimator.Estimator(model_fn=model_fn, config=config,
                                params=hparams_from_flags(config),
                                warm_start_from=warm_start)


def serving_input_receiver_fn():
  if FLAGS.serving == 'handwritten':
    return serving_input_receiver_fn_handwritten()
  return serving_input_receiver_fn_raw()


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
  params = hparams_from_flags(None)
  # input_fns take `params`: the Estimator passes its own params; the
  # no-params variant gets them through a closure.
  if FLAGS.model_fn_args:
    train_fn = lambda: train_input_fn(params)
    eval_fn = lambda: eval_input_fn(params)
  else:
    train_fn, eval_fn = train_input_fn, eval_input_fn
  exporters = [
      tf.estimator.LatestExporter(
          'latest', serving_input_receiver_fn,
          exports_to_keep=FLAGS.exports_to_keep),
      tf.estimator.BestExporter(
          name='best_exporter',
          serving_input_receiver_fn=serving_input_receiver_fn,
          exports_to_keep=FLAGS.exports_to_keep),
      tf.estimator.FinalExporter('final', serving_input_receiver_fn),
  ]
  train_spec = tf.estimator.TrainSpec(input_fn=train_fn,
                                      max_steps=FLAGS.max_steps)
  eval_spec = tf.estimator.EvalSpec(
      input_fn=eval_fn, steps=FLAGS.eval_steps, exporters=exporters,
      start_delay_secs=FLAGS.start_delay_secs,
      throttle_secs=FLAGS.throttle_secs)
  result = tf.estimator.train_and_evaluate(estimator, train_spec, eval_spec)
  metrics, export_results = result if result else (None, None)
  out = {
      'task_type': estimator.config.task_type,
      'task_id': estimator.config.task_id,
      'return_is_none': result is None,
      'metrics': _jsonable(metrics),
      'metric_types': ({k: type(v).__name__ for k, v in metrics.items()}
                       if metrics else None),
      'export_results': _jsonable(export_results),
      'latest_checkpoint': estimator.latest_checkpoint(),
      'seconds': round(time.time() - start, 2),
  }
  print('RESULT ' + json.dumps(out, sort_keys=True), flush=True)
  return out


if __name__ == '__main__':
  main()
