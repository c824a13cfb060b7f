"""tf.estimator's early-stopping hooks on a small seeded regression Estimator,
written the way a TensorFlow <= 2.15 user writes one (tf.compat.v1
get_variable layers, Dataset input_fns, local tf.estimator.train_and_evaluate).

Reference script for lowlevel.estimator: run it unmodified with
    python early_stopping.py --model_dir=/tmp/es --hook=higher            (TF 2.15 + tensorflow_estimator 2.15)
    python -m lowlevel.estimator early_stopping.py --model_dir=/tmp/es --hook=higher

--hook picks the training hook:
  higher           stop_if_higher_hook(est, 'r2', R2_THRESHOLD)
  lower            stop_if_lower_hook(est, 'loss', LOSS_THRESHOLD)
  no_increase      stop_if_no_increase_hook(est, 'within_tol', 200)
  no_decrease      stop_if_no_decrease_hook(est, 'miss_rate', 300)
  predicate        make_early_stopping_hook(est, fn) with fn True from its
                   PREDICATE_CALLS-th call on
  checkpoint_step  make_stop_at_checkpoint_step_hook(est, last_step=300)
  none             no hook
(all but checkpoint_step with run_every_secs=None, run_every_steps=50).

Prints ONE final line: a JSON object {"hook", "final_step" (global step of the
latest checkpoint), "eval_steps" (steps with an evaluation in the eval dir's
summaries), "eval_history" ({step: metrics} from those summaries), "eval"
(train_and_evaluate's last metrics), "stop_log" (the tensorflow logger's
early-stopping lines), "stop_var" (signal_early_stopping/STOP in the latest
checkpoint, null if absent), "predicate_calls", "seconds"}.
"""
import argparse
import glob
import json
import logging
import os
import sys
import time

import numpy as np
import tensorflow as tf

NUM_FEATURES = 8
HIDDEN = 16
NUM_TRAIN = 1000
NUM_EVAL = 200
BATCH = 32
EVAL_BATCH = 50
TOL = 1.0

R2_THRESHOLD = 0.8
LOSS_THRESHOLD = 0.07
NO_INCREASE_STEPS = 200
NO_DECREASE_STEPS = 300
PREDICATE_CALLS = 4
LAST_STEP = 300
RUN_EVERY_STEPS = 50


def parse_args(argv):
  p = argparse.ArgumentParser(description=__doc__)
  p.add_argument('--model_dir', default='/tmp/early_stopping_estimator')
  p.add_argument('--hook', default='higher',
                 choices=['higher', 'lower', 'no_increase', 'no_decrease',
                          'predicate', 'checkpoint_step', 'none'])
  p.add_argument('--max_steps', type=int, default=3000)
  p.add_argument('--learning_rate', type=float, default=0.003)
  p.add_argument('--eval_defaults', action='store_true',
                 help="EvalSpec's defaults (start_delay_secs=120, throttle_secs=600) "
                      'instead of 0 and 0')
  return p.parse_args(argv)


def make_data():
  rng = np.random.RandomState(0)
  w = rng.uniform(-1.0, 1.0, size=(NUM_FEATURES, 1)).astype(np.float32)
  x = rng.normal(size=(NUM_TRAIN + NUM_EVAL, NUM_FEATURES)).astype(np.float32)
  y = (x.dot(w) + 0.1 * rng.normal(size=(NUM_TRAIN + NUM_EVAL, 1))).astype(
      np.float32)
  return (x[:NUM_TRAIN], y[:NUM_TRAIN]), (x[NUM_TRAIN:], y[NUM_TRAIN:])


def dense(name, inputs, units, activation=None):
  with tf.compat.v1.variable_scope(name):
    w = tf.compat.v1.get_variable(
        'kernel', [int(inputs.shape[-1]), units],
        initializer=tf.compat.v1.glorot_uniform_initializer())
    b = tf.compat.v1.get_variable('bias', [units],
                                  initializer=tf.compat.v1.zeros_initializer())
    out = tf.matmul(inputs, w) + b
    return activation(out) if activation is not None else out


def model_fn(features, labels, mode, params):
  hidden = dense('hidden', features['x'], HIDDEN, tf.nn.tanh)
  pred = dense('out', hidden, 1)
  if mode == tf.estimator.ModeKeys.PREDICT:
    return tf.estimator.EstimatorSpec(mode, predictions={'y': pred})
  loss = tf.compat.v1.losses.mean_squared_error(labels, pred)
  if mode == tf.estimator.ModeKeys.EVAL:
    err = tf.abs(pred - labels)
    mse, mse_update = tf.compat.v1.metrics.mean_squared_error(labels, pred)
    # R^2 against the eval labels' variance: rises towards 1 as training goes.
    r2 = 1.0 - mse / params['label_var']
    hit = tf.cast(err < TOL, tf.float32)
    metrics = {
        'mse': (mse, mse_update),
        'r2': (r2, mse_update),
        # fraction of rows within TOL / outside it: plateau at 1 / 0
        'within_tol': tf.compat.v1.metrics.mean(hit),
        'miss_rate': tf.compat.v1.metrics.mean(1.0 - hit),
    }
    return tf.estimator.EstimatorSpec(mode, loss=loss,
                                      eval_metric_ops=metrics)
  opt = tf.compat.v1.train.GradientDescentOptimizer(params['learning_rate'])
  train_op = opt.minimize(loss,
                          global_step=tf.compat.v1.train.get_global_step())
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


class _Capture(logging.Handler):
  """Keeps the tensorflow logger's early-stopping lines."""

  def __init__(self):
    logging.Handler.__init__(self, level=logging.INFO)
    self.lines = []

  def emit(self, record):
    try:
      msg = record.getMessage()
    except Exception:  # pylint: disable=broad-except
      return
    if 'early stopping' in msg.lower():
      self.lines.append(msg)


def read_eval_dir(eval_dir):
  """{step: {tag: simple_value}} from the eval dir's event files."""
  out = {}
  for path in sorted(glob.glob(os.path.join(eval_dir, 'events.out.tfevents.*'))):
    for event in tf.compat.v1.train.summary_iterator(path):
      if not event.HasField('summary'):
        continue
      for value in event.summary.value:
        if value.HasField('simple_value'):
          out.setdefault(int(event.step), {})[value.tag] = float(
              value.simple_value)
  return dict(sorted(out.items()))


def to_json(value):
  if isinstance(value, dict):
    return {str(k): to_json(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [to_json(v) for v in value]
  if isinstance(value, (np.integer,)):
    return int(value)
  if isinstance(value, (np.floating, float)):
    return float(value)
  if isinstance(value, np.ndarray):
    return value.tolist()
  if isinstance(value, (bytes,)):
    return value.decode('utf-8', 'replace')
  return value


def main(argv):
  args = parse_args(argv)
  t0 = time.time()
  tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.INFO)
  capture = _Capture()
  logging.getLogger('tensorflow').addHandler(capture)

  (xt, yt), (xe, ye) = make_data()

  def train_input_fn():
    ds = tf.data.Dataset.from_tensor_slices(({'x': xt}, yt))
    return ds.shuffle(NUM_TRAIN, seed=1).repeat().batch(BATCH)

  def eval_input_fn():
    return tf.data.Dataset.from_tensor_slices(({'x': xe}, ye)).batch(EVAL_BATCH)

  config = tf.estimator.RunConfig(
      model_dir=args.model_dir, tf_random_seed=42, save_checkpoints_steps=100,
      save_summary_steps=100, log_step_count_steps=100, keep_checkpoint_max=3,
      session_config=tf.compat.v1.ConfigProto(
          intra_op_parallelism_threads=1, inter_op_parallelism_threads=1))
  est = tf.estimator.Estimator(
      model_fn=model_fn, config=config,
      params={'learning_rate': args.learning_rate,
              'label_var': float(np.var(ye))})

  exp = tf.estimator.experimental
  every = dict(run_every_secs=None, run_every_steps=RUN_EVERY_STEPS)
  calls = []

  def should_stop():
    calls.append(time.time())
    return len(calls) >= PREDICATE_CALLS

  hooks = []
  if args.hook == 'higher':
    hooks.append(exp.stop_if_higher_hook(est, 'r2', R2_THRESHOLD, **every))
  elif args.hook == 'lower':
    hooks.append(exp.stop_if_lower_hook(est, 'loss', LOSS_THRESHOLD, **every))
  elif args.hook == 'no_increase':
    hooks.append(exp.stop_if_no_increase_hook(
        est, 'within_tol', NO_INCREASE_STEPS, **every))
  elif args.hook == 'no_decrease':
    hooks.append(exp.stop_if_no_decrease_hook(
        est, 'miss_rate', NO_DECREASE_STEPS, **every))
  elif args.hook == 'predicate':
    hooks.append(exp.make_early_stopping_hook(est, should_stop, **every))
  elif args.hook == 'checkpoint_step':
    hooks.append(exp.make_stop_at_checkpoint_step_hook(est, last_step=LAST_STEP))

  train_spec = tf.estimator.TrainSpec(train_input_fn, max_steps=args.max_steps,
                                      hooks=hooks)
  delays = {} if args.eval_defaults else dict(start_delay_secs=0, throttle_secs=0)
  eval_spec = tf.estimator.EvalSpec(eval_input_fn, steps=None, **delays)
  result = tf.estimator.train_and_evaluate(est, train_spec, eval_spec)
  metrics = result[0] if isinstance(result, tuple) else result

  ckpt = tf.train.latest_checkpoint(args.model_dir)
  final_step = None
  stop_var = None
  if ckpt:
    final_step = int(tf.train.load_variable(ckpt, 'global_step'))
    names = [n for n, _ in tf.train.list_variables(ckpt)]
    if 'signal_early_stopping/STOP' in names:
      stop_var = bool(tf.train.load_variable(ckpt, 'signal_early_stopping/STOP'))
  history = read_eval_dir(est.eval_dir())
  out = {
      'hook': args.hook,
      'hook_type': type(hooks[0]).__name__ if hooks else None,
      'final_step': final_step,
      'eval_steps': sorted(history),
      'eval_history': history,
      'eval': metrics,
      'stop_log': capture.lines,
      'stop_var': stop_var,
      'predicate_calls': len(calls),
      'seconds': round(time.time() - t0, 2),
  }
  sys.stdout.flush()
  print(json.dumps(to_json(out), sort_keys=True))
  sys.stdout.flush()


if __name__ == '__main__':
  main(sys.argv[1:])
