"""A DNNClassifier script with the argument mistakes users make, one per flag.

    python canned_errors.py --model_dir=D --optimizer=Nope      # an unknown optimizer
    python canned_errors.py --model_dir=D --n_classes=1         # fewer than 2 classes
    python canned_errors.py --model_dir=D --categorical_in_dnn  # an unwrapped category

Under tensorflow_estimator 2.15 (tests/fixtures/canned215/errors.json) each raises
ValueError: the optimizer and the column at `train`, n_classes at the constructor.
Without a mistake it trains 20 steps on iris and prints "RESULT {json}".
"""
import argparse
import json
import sys

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_iris


def parse_args(argv):
  p = argparse.ArgumentParser(description=__doc__)
  p.add_argument('--model_dir', required=True)
  p.add_argument('--optimizer', default='Adagrad')
  p.add_argument('--n_classes', type=int, default=3)
  p.add_argument('--categorical_in_dnn', action='store_true')
  return p.parse_args(argv)


def main(argv):
  args = parse_args(argv[1:])
  x, y = load_iris(return_X_y=True)
  features = {'petal_length': x[:, 2].astype(np.float32),
              'size': np.array([b'small' if v < 5.5 else b'large' for v in x[:, 0]])}
  columns = [tf.feature_column.numeric_column('petal_length')]
  size = tf.feature_column.categorical_column_with_vocabulary_list(
      'size', ['small', 'large'])
  columns.append(size if args.categorical_in_dnn
                 else tf.feature_column.indicator_column(size))
  classifier = tf.estimator.DNNClassifier(
      hidden_units=[8], feature_columns=columns, n_classes=args.n_classes,
      optimizer=args.optimizer, model_dir=args.model_dir)
  classifier.train(
      lambda: tf.data.Dataset.from_tensor_slices((features, y)).repeat().batch(16),
      steps=20)
  print('RESULT ' + json.dumps({'global_step': 20}))


if __name__ == '__main__':
  main(sys.argv)
