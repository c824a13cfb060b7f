"""Wide & deep on MovieLens 100K: the census/recommendation-style
tf.estimator.DNNLinearCombinedClassifier run by tf.estimator.train_and_evaluate.

Task: will a user rate a film 4 or 5 (label = rating >= 4)?
  wide (linear) part: identity columns of user_id and item_id, gender and
    occupation (vocabulary lists), age (bucketized), genres (a multi-valued
    vocabulary-list column) and occupation x genres (crossed, hashed);
  deep (DNN) part: 8-dim embeddings of user_id and item_id, a 4-dim embedding
    of occupation, indicator columns of gender, age buckets and genres;
    hidden units 64, 32 (--hidden_units).
Estimator default optimizers (Ftrl for the linear part, Adagrad for the DNN).
Data: the RecBole atomic files ml-100k.inter / .user / .item in --data_dir
(tab-separated, typed header line `user_id:token ...`; genres space-separated
in the item file's `class` field), e.g. from
    scripts/get_movielens /tmp/ml-100k
split 80/20 at random by rating (seeded). Input: tf.data from in-memory numpy
arrays; the ratings carry only (user, item, label), the user and film
attributes are joined in the input pipeline with tf.gather from small tables.

The same script runs locally and as a TF_CONFIG cluster task (chief, worker,
ps, evaluator): tf.estimator.train_and_evaluate decides.

    python wide_deep_movielens.py --data_dir=/tmp/ml-100k --model_dir=/tmp/wd
    python -m lowlevel.estimator wide_deep_movielens.py --data_dir=... --model_dir=...

Prints one line "RESULT {json}" at the end, on the chief or when local.
"""
import argparse
import json
import os
import sys
import time

import numpy as np
import tensorflow as tf

AGE_BOUNDARIES = [18, 25, 30, 35, 45, 50, 56]


def parse_args(argv):
  p = argparse.ArgumentParser(description=__doc__)
  p.add_argument('--data_dir', default='/tmp/ml-100k')
  p.add_argument('--model_dir', default='/tmp/wide_deep_movielens')
  p.add_argument('--max_steps', type=int, default=2000)
  p.add_argument('--batch_size', type=int, default=256)
  p.add_argument('--seed', type=int, default=42)
  p.add_argument('--hidden_units', default='64,32')
  p.add_argument('--embedding_dim', type=int, default=8)
  p.add_argument('--cross_buckets', type=int, default=1000,
                 help='hash_bucket_size of occupation x genres')
  p.add_argument('--save_checkpoints_steps', type=int, default=None,
                 help='default: RunConfig default (every 600 s)')
  p.add_argument('--start_delay_secs', type=int, default=0)
  p.add_argument('--throttle_secs', type=int, default=5)
  return p.parse_args(argv)


# ------------------------------------------------------------------ data

def read_atomic(path):
  """A RecBole atomic file: a list of column names (the part before ':')
  and the rows as lists of strings."""
  with open(path, encoding='utf-8') as f:
    header = f.readline().rstrip('\n').split('\t')
    rows = [line.rstrip('\n').split('\t') for line in f if line.strip()]
  return [h.split(':')[0] for h in header], rows


def load_data(data_dir, seed):
  """Returns (tables, vocabularies, train, test).

  tables: numpy arrays indexed by user_id (0..943) or item_id (0..1682);
  train/test: (user_id, item_id, label) int64 arrays.
  """
  names, rows = read_atomic(os.path.join(data_dir, 'ml-100k.user'))
  col = {n: i for i, n in enumerate(names)}
  num_users = max(int(r[col['user_id']]) for r in rows) + 1
  occupations = sorted({r[col['occupation']] for r in rows})
  user_gender = np.full([num_users], b'', dtype=object)
  user_occupation = np.full([num_users], b'', dtype=object)
  user_age = np.zeros([num_users], dtype=np.float32)
  for r in rows:
    u = int(r[col['user_id']])
    user_gender[u] = r[col['gender']].encode()
    user_occupation[u] = r[col['occupation']].encode()
    user_age[u] = float(r[col['age']])

  names, rows = read_atomic(os.path.join(data_dir, 'ml-100k.item'))
  col = {n: i for i, n in enumerate(names)}
  num_items = max(int(r[col['item_id']]) for r in rows) + 1
  item_genres = [[] for _ in range(num_items)]
  for r in rows:
    item_genres[int(r[col['item_id']])] = r[col['class']].split()
  genres = sorted({g for gs in item_genres for g in gs})
  width = max(len(gs) for gs in item_genres)
  genre_table = np.full([num_items, width], b'', dtype=object)  # '' = none
  for i, gs in enumerate(item_genres):
    genre_table[i, :len(gs)] = [g.encode() for g in gs]

  names, rows = read_atomic(os.path.join(data_dir, 'ml-100k.inter'))
  col = {n: i for i, n in enumerate(names)}
  users = np.array([int(r[col['user_id']]) for r in rows], dtype=np.int64)
  items = np.array([int(r[col['item_id']]) for r in rows], dtype=np.int64)
  ratings = np.array([float(r[col['rating']]) for r in rows])
  labels = (ratings >= 4).astype(np.int64)
  order = np.random.RandomState(seed).permutation(len(labels))
  cut = int(len(labels) * 0.8)
  train, test = order[:cut], order[cut:]

  tables = {
      'gender': user_gender.astype(bytes),
      'occupation': user_occupation.astype(bytes),
      'age': user_age,
      'genres': genre_table.astype(bytes),
  }
  vocab = {'occupation': occupations, 'genres': genres,
           'num_users': num_users, 'num_items': num_items}
  return (tables, vocab, (users[train], items[train], labels[train]),
          (users[test], items[test], labels[test]))


def make_input_fn(tables, split, batch_size, training):
  users, items, labels = split

  def input_fn():
    ds = tf.data.Dataset.from_tensor_slices((users, items, labels))
    if training:
      ds = ds.shuffle(10000).repeat()
    ds = ds.batch(batch_size)

    def join(u, i, y):
      # Per-user and per-film attributes from the small tables.
      features = {
          'user_id': u,
          'item_id': i,
          'gender': tf.gather(tf.constant(tables['gender']), u),
          'occupation': tf.gather(tf.constant(tables['occupation']), u),
          'age': tf.gather(tf.constant(tables['age']), u),
          'genres': tf.gather(tf.constant(tables['genres']), i),  # [B, 6]
      }
      return features, y

    return ds.map(join).prefetch(1)

  return input_fn


def feature_columns(vocab, embedding_dim, cross_buckets):
  fc = tf.feature_column
  user = fc.categorical_column_with_identity('user_id', vocab['num_users'])
  item = fc.categorical_column_with_identity('item_id', vocab['num_items'])
  gender = fc.categorical_column_with_vocabulary_list('gender', ['M', 'F'])
  occupation = fc.categorical_column_with_vocabulary_list(
      'occupation', vocab['occupation'])
  age = fc.bucketized_column(fc.numeric_column('age'), AGE_BOUNDARIES)
  # Multi-valued: each film has 1-6 genres, '' pads the rest (dropped).
  genres = fc.categorical_column_with_vocabulary_list('genres',
                                                      vocab['genres'])
  occupation_x_genres = fc.crossed_column([occupation, genres],
                                          hash_bucket_size=cross_buckets)
  linear = [user, item, gender, occupation, age, genres, occupation_x_genres]
  dnn = [
      fc.embedding_column(user, dimension=embedding_dim),
      fc.embedding_column(item, dimension=embedding_dim),
      fc.embedding_column(occupation, dimension=4),
      fc.indicator_column(gender),
      fc.indicator_column(age),
      fc.indicator_column(genres),
  ]
  return linear, dnn


# ------------------------------------------------------------------ timing
# examples/s of training = local steps x batch_size / training seconds, where
# training seconds = wall time from this process's first train step (the
# before_run of its first session.run) to the after_run of its last one,
# minus the time spent in evaluations that train_and_evaluate ran inside that
# window (locally it evaluates in the checkpoint listener; measured from the
# evaluation hooks' begin() to end()). Graph building, session creation and
# the final checkpoint+evaluation (in the checkpoint hook's end()) are not in
# it; periodic checkpoint saves are. "Local steps" are this process's own
# session.run calls, so on a cluster it is this task's rate, not the
# cluster's.

class _Clock(object):
  eval_secs = 0.0
  evals = 0


class TrainTimer(tf.estimator.SessionRunHook):

  def __init__(self):
    self.first = None
    self.last = None
    self.steps = 0
    self.eval_secs_at_first = 0.0

  def before_run(self, run_context):
    if self.first is None:
      self.first = time.time()
      self.eval_secs_at_first = _Clock.eval_secs

  def after_run(self, run_context, run_values):
    self.steps += 1
    self.last = time.time()
    self.eval_secs_at_last = _Clock.eval_secs

  def train_secs(self):
    if self.first is None:
      return 0.0
    return (self.last - self.first) - (self.eval_secs_at_last -
                                       self.eval_secs_at_first)


class EvalTimer(tf.estimator.SessionRunHook):

  def begin(self):
    self.t0 = time.time()

  def end(self, session):
    _Clock.eval_secs += time.time() - self.t0
    _Clock.evals += 1


# ------------------------------------------------------------------ main

def main(argv):
  args = parse_args(argv[1:])
  tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.INFO)
  tables, vocab, train, test = load_data(args.data_dir, args.seed)
  linear_columns, dnn_columns = feature_columns(vocab, args.embedding_dim,
                                                args.cross_buckets)
  kwargs = {}
  if args.save_checkpoints_steps:  # an explicit None would disable saving
    kwargs['save_checkpoints_steps'] = args.save_checkpoints_steps
  config = tf.estimator.RunConfig(tf_random_seed=args.seed, **kwargs)
  estimator = tf.estimator.DNNLinearCombinedClassifier(
      model_dir=args.model_dir,
      linear_feature_columns=linear_columns,
      dnn_feature_columns=dnn_columns,
      dnn_hidden_units=[int(u) for u in args.hidden_units.split(',')],
      config=config)

  timer = TrainTimer()
  train_spec = tf.estimator.TrainSpec(
      input_fn=make_input_fn(tables, train, args.batch_size, training=True),
      max_steps=args.max_steps, hooks=[timer])
  eval_input_fn = make_input_fn(tables, test, args.batch_size, training=False)
  eval_spec = tf.estimator.EvalSpec(
      input_fn=eval_input_fn, steps=None, hooks=[EvalTimer()],
      start_delay_secs=args.start_delay_secs,
      throttle_secs=args.throttle_secs)

  t0 = time.time()
  returned = tf.estimator.train_and_evaluate(estimator, train_spec, eval_spec)
  wall = time.time() - t0

  task_type = config.task_type  # 'worker' when local (no TF_CONFIG)
  if not config.is_chief:
    return  # worker of a cluster, ps, evaluator: no RESULT
  if returned is not None:  # local: the final evaluation's dict
    metrics, where = returned[0], 'train_and_evaluate'
  else:  # chief of a cluster: the evaluator has the eval/; evaluate here
    metrics = estimator.evaluate(eval_input_fn, name='chief')
    where = 'chief evaluate(name="chief")'
  secs = timer.train_secs()
  result = {
      'task_type': task_type,
      'cluster': bool(config.cluster_spec.as_dict()),
      'eval': {k: (int(v) if k == 'global_step' else float(v))
               for k, v in metrics.items()},
      'eval_from': where,
      'global_step': int(estimator.get_variable_value('global_step')),
      'local_steps': timer.steps,
      'batch_size': args.batch_size,
      'train_secs': round(secs, 3),
      'examples_per_sec': round(timer.steps * args.batch_size / secs, 1)
                          if secs > 0 else None,
      'evals_in_process': _Clock.evals,
      'eval_secs_in_train_window': round(
          timer.eval_secs_at_last - timer.eval_secs_at_first, 3)
                                   if timer.first else 0.0,
      'wall_secs_train_and_evaluate': round(wall, 3),
      'max_steps': args.max_steps,
      'seed': args.seed,
      'num_train': int(len(train[2])),
      'num_test': int(len(test[2])),
  }
  print('RESULT ' + json.dumps(result, sort_keys=True), flush=True)


if __name__ == '__main__':
  main(sys.argv)
