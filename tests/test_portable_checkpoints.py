"""Checkpoints are portable: every mode saves the same names; a checkpoint of any mode,
cluster shape or process resumes in any other (real clusters, one output_dir)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import clusters
from lowlevel import checkpoints, training
from lowlevel import data as data_lib
from lowlevel.cluster import Cluster, Task
from lowlevel.config import OPTIMIZERS, TrainConfig

v1 = tf.compat.v1

# (name, cluster or None, communication_period, sync)
GRAPH_MODES = [
    ("in_process", None, 1, False),
    ("exact_2ps", Cluster(("a:1", "b:2"), ("c:3", "d:4")), 1, False),
    ("sync_1ps", Cluster(("a:1",), ("c:3", "d:4")), 1, True),
    ("local_sgd_2ps", Cluster(("a:1", "b:2"), ("c:3", "d:4")), 8, False),
    ("model_averaging_1ps", Cluster(("a:1",), ("c:3", "d:4")), 8, True),
]


def _saved_shapes(optimizer, cluster, period, sync):
    config = TrainConfig(optimizer=optimizer, communication_period=period, sync=sync,
                         hidden_units=(2000, 32))  # 2000: sharded over 2 ps
    g = training.build(config, data_lib.load_digits(), cluster, Task("worker", 0), 0)
    return {name: shape for name, (shape, _) in checkpoints._logical(g.saved).items()}, g


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_every_mode_saves_the_same_names_and_shapes(optimizer):
    reference, _ = _saved_shapes(optimizer, None, 1, False)
    assert "model/hidden0/kernel" in reference and "global_step" in reference
    for name, cluster, period, sync in GRAPH_MODES[1:]:
        shapes, g = _saved_shapes(optimizer, cluster, period, sync)
        assert shapes == reference, name
        if name == "exact_2ps":  # the big kernel really is sharded, and its slots too
            assert isinstance(g.saved["model/hidden0/kernel"], list)
    if optimizer != "sgd":
        assert any(n.startswith("model/hidden0/kernel/") for n in reference), reference
