"""TensorFlow's premade-estimator tutorial (tensorflow/models
samples/core/get_started/premade_estimator.py, the "Premade Estimators"
guide), made offline: iris comes from scikit-learn's load_iris instead of the
downloaded iris_training.csv / iris_test.csv, split 120/30 with a seeded
permutation (the tutorial's files are also 120/30).

A tf.estimator.DNNClassifier, hidden_units [30, 10], 3 classes, one
numeric_column per feature; trained with a tf.data input_fn (shuffle 1000,
repeat, batch), evaluated on the 30 test rows, then asked for the tutorial's
three expected samples.

Reference script for lowlevel.estimator: run it unmodified with
    python premade_iris.py --model_dir=/tmp/iris
    python -m lowlevel.estimator premade_iris.py --model_dir=/tmp/iris
Prints the tutorial's lines, then one line "RESULT {json}" at the end.
"""
import argparse
import json
import sys
import time

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_iris

CSV_COLUMN_NAMES = ['SepalLength', 'SepalWidth', 'PetalLength', 'PetalWidth',
                    'Species']
SPECIES = ['Setosa', 'Versicolor', 'Virginica']
NUM_TRAIN = 120


def parse_args(argv):
  p = argparse.ArgumentParser(description=__doc__)
  p.add_argument('--model_dir', default=None, type=str,
                 help='model directory (default: a temporary one)')
  p.add_argument('--batch_size', default=100, type=int, help='batch size')
  p.add_argument('--train_steps', default=1000, type=int,
                 help='number of training steps')
  p.add_argument('--seed', default=42, type=int,
                 help='seed of the train/test split and tf_random_seed')
  return p.parse_args(argv)


def load_data(seed):
  """Returns (train_x, train_y), (test_x, test_y): dicts of float32 columns
  keyed by the tutorial's column names, int32 species 0-2."""
  iris = load_iris()
  order = np.random.RandomState(seed).permutation(len(iris.target))
  x = iris.data.astype(np.float32)[order]
  y = iris.target.astype(np.int32)[order]

  def cols(rows):
    return {name: x[rows, i] for i, name in enumerate(CSV_COLUMN_NAMES[:4])}

  train, test = slice(0, NUM_TRAIN), slice(NUM_TRAIN, None)
  return (cols(train), y[train]), (cols(test), y[test])


def train_input_fn(features, labels, batch_size):
  """An input function for training (the tutorial's iris_data.py)."""
  dataset = tf.data.Dataset.from_tensor_slices((dict(features), labels))
  # Shuffle, repeat, and batch the examples.
  return dataset.shuffle(1000).repeat().batch(batch_size)


def eval_input_fn(features, labels, batch_size):
  """An input function for evaluation or prediction."""
  features = dict(features)
  inputs = features if labels is None else (features, labels)
  dataset = tf.data.Dataset.from_tensor_slices(inputs)
  return dataset.batch(batch_size)


def main(argv):
  args = parse_args(argv[1:])

  # Fetch the data
  (train_x, train_y), (test_x, test_y) = load_data(args.seed)

  # Feature columns describe how to use the input.
  my_feature_columns = []
  for key in train_x.keys():
    my_feature_columns.append(tf.feature_column.numeric_column(key=key))

  # Build 2 hidden layer DNN with 30, 10 units respectively.
  classifier = tf.estimator.DNNClassifier(
      feature_columns=my_feature_columns,
      # Two hidden layers of 30 and 10 nodes.
      hidden_units=[30, 10],
      # The model must choose between 3 classes.
      n_classes=3,
      model_dir=args.model_dir,
      config=tf.estimator.RunConfig(tf_random_seed=args.seed))

  # Train the Model.
  t0 = time.time()
  classifier.train(
      input_fn=lambda: train_input_fn(train_x, train_y, args.batch_size),
      steps=args.train_steps)
  train_secs = time.time() - t0

  # Evaluate the model.
  eval_result = classifier.evaluate(
      input_fn=lambda: eval_input_fn(test_x, test_y, args.batch_size))

  print('\nTest set accuracy: {accuracy:0.3f}\n'.format(**eval_result))

  # Generate predictions from the model
  expected = ['Setosa', 'Versicolor', 'Virginica']
  predict_x = {
      'SepalLength': [5.1, 5.9, 6.9],
      'SepalWidth': [3.3, 3.0, 3.1],
      'PetalLength': [1.7, 4.2, 5.4],
      'PetalWidth': [0.5, 1.5, 2.1],
  }

  predictions = classifier.predict(
      input_fn=lambda: eval_input_fn(predict_x, labels=None,
                                     batch_size=args.batch_size))

  template = '\nPrediction is "{}" ({:.1f}%), expected "{}"'

  class_ids, probabilities = [], []
  for pred_dict, expec in zip(predictions, expected):
    class_id = pred_dict['class_ids'][0]
    probability = pred_dict['probabilities'][class_id]

    print(template.format(SPECIES[class_id], 100 * probability, expec))
    class_ids.append(int(class_id))
    probabilities.append([float(p) for p in pred_dict['probabilities']])

  result = {
      'eval': {k: (int(v) if k == 'global_step' else float(v))
               for k, v in eval_result.items()},
      'predicted_class_ids': class_ids,
      'predicted_species': [SPECIES[c] for c in class_ids],
      'expected_species': expected,
      'probabilities': probabilities,
      'global_step': int(classifier.get_variable_value('global_step')),
      # Wall seconds of classifier.train() (graph building, session start,
      # the steps, the final checkpoint).
      'train_secs': round(train_secs, 3),
      'train_steps': args.train_steps,
      'batch_size': args.batch_size,
      'seed': args.seed,
  }
  print('RESULT ' + json.dumps(result, sort_keys=True), flush=True)


if __name__ == '__main__':
  tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.INFO)
  main(sys.argv)
