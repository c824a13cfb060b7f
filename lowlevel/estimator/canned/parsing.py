"""`classifier_parse_example_spec` and `regressor_parse_example_spec` (tensorflow_estimator
2.15's `canned/parsing_utils.py`): the `tf.io.parse_example` spec of the feature columns
plus the label (and the weight column), for an input_fn reading tf.Example records.

The same dicts as 2.15 for the same arguments (tests/fixtures/canned215/parse_specs.json,
captured from 2.15 by tests/fixtures/canned215/parse_specs.py): the columns' specs, the
label as `FixedLenFeature((1,), label_dtype, label_default)` (a regressor's:
`(label_dimension,)`), the weight column's as a numeric column's.
"""

from __future__ import annotations

import tensorflow as tf
from tensorflow.python.feature_column import feature_column_v2 as fc_v2


def _with_label_and_weight(spec: dict, label_key: str, label, weight_column) -> dict:
    if label_key in spec:
        raise ValueError(f"label should not be used as feature. label_key: {label_key}, "
                         f"features: {spec.keys()}")
    spec[label_key] = label
    if weight_column is None:
        return spec
    if isinstance(weight_column, str):
        weight_column = tf.feature_column.numeric_column(weight_column)
    if not isinstance(weight_column, fc_v2.NumericColumn):
        raise ValueError("weight_column should be an instance of "
                         f"tf.feature_column.numeric_column. Given type: "
                         f"{type(weight_column)} value: {weight_column}")
    spec.update(weight_column.parse_example_spec)
    return spec


def classifier_parse_example_spec(feature_columns, label_key, label_dtype=tf.int64,
                                  label_default=None, weight_column=None) -> dict:
    """{feature key: FixedLenFeature | VarLenFeature} of the columns, the label (int64 or
    string `[1]`) and the weight column (a key or numeric column).

    Raises ValueError: the label is also a feature; a weight column that is not numeric.
    """
    spec = tf.compat.v1.feature_column.make_parse_example_spec(feature_columns)
    label = tf.io.FixedLenFeature((1,), label_dtype, label_default)
    return _with_label_and_weight(spec, label_key, label, weight_column)


def regressor_parse_example_spec(feature_columns, label_key, label_dtype=tf.float32,
                                 label_default=None, label_dimension=1,
                                 weight_column=None) -> dict:
    """As `classifier_parse_example_spec`, the label float `[label_dimension]`."""
    spec = tf.compat.v1.feature_column.make_parse_example_spec(feature_columns)
    label = tf.io.FixedLenFeature((label_dimension,), label_dtype, label_default)
    return _with_label_and_weight(spec, label_key, label, weight_column)
