"""Sharding a training split over the workers: disjoint, covering, the same in every task."""

from __future__ import annotations

import numpy as np


def shard_indices(num_examples: int, num_shards: int, index: int) -> np.ndarray:
    """Indices of shard `index` of `num_shards`: every num_shards-th example.

    The shards are disjoint and together cover `range(num_examples)`.
    """
    if not 0 <= index < num_shards:
        raise ValueError(f"shard {index} out of range for {num_shards} shards")
    return np.arange(index, num_examples, num_shards)
