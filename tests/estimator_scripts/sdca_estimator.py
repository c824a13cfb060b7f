"""LinearClassifier trained by tf.estimator.experimental.LinearSDCA, by train_and_evaluate,
as a TensorFlow <= 2.15 user writes it: locally, or as a TF_CONFIG cluster under
`python -m lowlevel.estimator`. Seeded data: 400 rows, label = (x0 + 2 x1 - x2 > 0) with
a bucketized and an identity column. Prints one JSON line: {"final_step", "eval"} (eval:
the local run's last metrics; None on a cluster's tasks).

    python -m lowlevel.estimator tests/estimator_scripts/sdca_estimator.py --model_dir=/tmp/sdca
"""
import argparse
import json

import numpy as np
import tensorflow as tf


def data(rows=400):
    rng = np.random.RandomState(0)
    x = rng.normal(size=(rows, 3)).astype(np.float32)
    y = (x[:, 0] + 2 * x[:, 1] - x[:, 2] > 0).astype(np.int64)[:, None]
    features = {"example_id": np.array([b"%d" % i for i in range(rows)]), "x": x,
                "c": (np.abs(x[:, 0]) * 3).astype(np.int64) % 5}
    return features, y


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model_dir", required=True)
    p.add_argument("--max_steps", type=int, default=30)
    args = p.parse_args()
    features, labels = data()

    def input_fn():
        return tf.data.Dataset.from_tensor_slices((features, labels)).repeat().batch(100)

    def eval_input_fn():
        return tf.data.Dataset.from_tensor_slices((features, labels)).batch(200)

    columns = [tf.feature_column.numeric_column("x", shape=[3]),
               tf.feature_column.categorical_column_with_identity("c", 5)]
    est = tf.estimator.LinearClassifier(
        feature_columns=columns, model_dir=args.model_dir,
        optimizer=tf.estimator.experimental.LinearSDCA(
            example_id_column="example_id", symmetric_l2_regularization=1.0),
        config=tf.estimator.RunConfig(tf_random_seed=42, save_checkpoints_steps=10))
    result = tf.estimator.train_and_evaluate(
        est, tf.estimator.TrainSpec(input_fn, max_steps=args.max_steps),
        tf.estimator.EvalSpec(eval_input_fn, steps=None, start_delay_secs=0, throttle_secs=0))
    metrics = result[0] if isinstance(result, tuple) else None
    step = int(tf.train.load_variable(args.model_dir, "global_step"))
    print(json.dumps({"final_step": step, "eval": metrics and {
        k: float(v) for k, v in metrics.items()}}, sort_keys=True))


if __name__ == "__main__":
    main()
