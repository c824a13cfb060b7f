"""A feature-column `StateManager` base that keeps the columns' resources (lookup tables)
by (column name, resource name); subclasses say how `get_variable` finds a column's
variables (`rnn._StateManager` makes them, `sdca.LinearModelState` finds the linear
model's). TensorFlow's `StateManager` has no such bookkeeping of its own."""

from __future__ import annotations

from tensorflow.python.feature_column import feature_column_v2 as fc_v2


class ColumnResources(fc_v2.StateManager):
    """`add_resource` / `has_resource` / `get_resource` over a dict (KeyError for one never
    added)."""

    def __init__(self):
        self._resources = {}

    def has_resource(self, feature_column, name):
        return (feature_column.name, name) in self._resources

    def add_resource(self, feature_column, name, resource):
        self._resources[(feature_column.name, name)] = resource

    def get_resource(self, feature_column, name):
        return self._resources[(feature_column.name, name)]
