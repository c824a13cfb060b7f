"""A training input whose session can be replaced: `tf.data` without its autotune thread.

A worker's training iterator lives in its session on the worker's own server. When a ps
fails, the session is replaced (`runtime/sessions.py`), and TensorFlow deletes the old
worker session, which destroys the iterator, while holding the server's session-manager
lock (`SessionMgr`), so the new session's creation waits for it (seen with gdb:
`WorkerSession::~WorkerSession` -> `GraphMgr::DeregisterAll` ->
`RootDataset::Iterator::~Iterator` -> `UnboundedThreadPool::LogicalThreadWrapper`'s
destructor). With autotuning on (`tf.data.Options.autotune.enabled`, TensorFlow's
default), that destructor waits for the iterator's model thread (`Model::OptimizeLoop`),
which sleeps between rounds for longer and longer periods, up to 60 s, and is not woken.
So a worker's recovery after a ps failure waited up to a minute once its input had run
for a few minutes:

- alone, an iterator read at a training pace (a batch every 20 ms) for 150 s, then
  re-initialized: 51.9 s with autotuning for a `from_tensor_slices`, `shuffle`,
  `repeat`, `batch`, `map` pipeline (with `prefetch(AUTOTUNE)`, `prefetch(2)` or no
  prefetch alike), 0.02-0.03 s without; read unpaced, no wait either way;
- the default trainer (1 ps + 2 workers, async MLP), ps0 SIGKILLed after 180 s: both
  workers trained again 25.5 s later (the chief's check of the ps tasks' model 23.3 s);
- a span's dataset on 90 M lines (`criteo.span_batches`, re-initialized at every span):
  span switches of 55 s and sync recoveries of 50-60 s.

Measurements: benchmarks/NOTES.md (2026-11-29, the seventeenth and eighteenth stops).
Without autotuning, a `num_parallel_calls=AUTOTUNE` stage runs at the size of the
iterator's thread pool (the task's cores) and `prefetch(AUTOTUNE)` keeps its own buffer
tuning, which needs no model thread. Measured no slower: a span's reader on a 2.8 M-line
file, batches of 1,024, 174-183 K lines/s with autotuning, 174-215 K without; the
images' pipeline read unpaced, 3,324 and 3,498 batches/s.
"""

from __future__ import annotations

import warnings


def without_autotune(ds, default_rewrites: bool = True):
    """`ds` (a `tf.data.Dataset`) with `autotune.enabled = False`, unless its own options
    set `autotune.enabled` (a user's explicit choice is kept). Anything else (an
    input_fn's (features, labels) tensors) is returned as it is.

    Args:
      default_rewrites: False also turns off tf.data's default static rewrites
        (`experimental_optimization.apply_default_optimizations`), which run Grappler on
        the dataset's graph each time an iterator is made (~50 ms of CPU; turning them
        off pays for a dataset made anew often, as a span's).

    Returns:
      The dataset with those options; `ds` itself when there is nothing to change.
    """
    import tensorflow as tf
    if not isinstance(ds, tf.data.Dataset):
        return ds
    options = tf.data.Options()
    with warnings.catch_warnings():  # graph mode's "might not reflect the actual value":
        warnings.simplefilter("ignore", UserWarning)  # it does for options set in Python
        explicit = ds.options().autotune.enabled
    if explicit is None:
        options.autotune.enabled = False
    if not default_rewrites:
        options.experimental_optimization.apply_default_optimizations = False
    if options == tf.data.Options():
        return ds
    return ds.with_options(options)
