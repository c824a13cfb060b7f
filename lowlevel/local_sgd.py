"""Communication-reduced training: K local steps between exchanges with the ps (local SGD).

In the exact mode (`--communication_period=1`, the default, what the classic
trainer does) every step reads every parameter from the ps tasks and sends
every gradient back: twice the model's bytes per step. On a 2-core machine
moving those bytes through gRPC (serialisation, copies, system calls) costs
more CPU than the step's arithmetic, so a distributed step runs at a third of
in-process speed (benchmarks/NOTES.md). Overlapping the transfers with compute
or sending bfloat16 gained at most ~10 % there; what moves the figure is
sending fewer bytes per example.

With `--communication_period=K` each worker trains a copy of the model held
on its own device for K steps, with its own optimizer state, and then, in one
`session.run`, exchanges with the ps: it adds to each ps variable what its copy
moved since the last exchange (the delta), and takes the result as its new
copy. Twice the model's bytes per K steps instead of per step.

This is local SGD, or periodic model averaging, in its asynchronous
delta-pushing form (Zinkevich et al., "Parallelized Stochastic Gradient
Descent", NIPS 2010; Lin et al., "Don't Use Large Mini-Batches, Use Local
SGD", ICLR 2020; the elastic-averaging variant of Zhang, Choromanska and LeCun,
"Deep learning with Elastic Averaging SGD", NIPS 2015, targets this same
parameter-server layout). With one worker it is in-process training, up to
the rounding of adding and reading back the delta at each exchange.
What it trades, with several workers: a worker's steps start from parameters
that miss up to K of each other worker's steps (the exact async mode misses
up to one), and the optimizer's slots (Adagrad accumulators, Adam moments)
are per worker instead of shared. The benchmark reports the test accuracy of
both modes beside their speed; `--communication_period=1` switches it off.

With `--sync` the exchange is synchronous model averaging instead: the ps
model becomes the average of `--replicas_to_aggregate` workers' models every
K steps (McDonald et al., "Distributed Training Strategies for the Structured
Perceptron", NAACL 2010; Lin et al. above), through the same
`SyncReplicasOptimizer` machinery as the exact sync mode.

The global step counts local steps (in sync mode, each worker's: a round of K
steps moves it by K). Each async exchange claims the next block of at most K
steps (`claim`, atomic on global_step's ps), and each sync round moves it by
at most what is left, so the run ends at exactly `--train_steps`.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import tensorflow as tf

v1 = tf.compat.v1


class LocalCopies:
    """A `custom_getter` giving the model a worker-local copy of each trainable variable.

    The variable itself is created as usual (on a ps, by the device setter);
    the model computes with a copy on `worker_device`, initialised from it
    when the session's local init op runs (after the chief has initialised or
    restored the ps variables). An anchor beside each copy remembers the value
    of the last exchange. Copies and anchors are local variables: never saved,
    never checked by the chief.

    A variable sharded over the ps tasks (`placement.partitioner`) gets one
    copy of its whole shape: the shards are concatenated when pulled and the
    delta is split when pushed.

    Attributes:
      triples: [(the variable's shards on the ps tasks, local copy, anchor)],
        in creation order.
    """

    def __init__(self, worker_device: str):
        self.device = worker_device
        self.triples: list[tuple] = []
        self._copies: dict[str, object] = {}

    def __call__(self, getter, name, *args, **kwargs):
        var = getter(name, *args, **kwargs)
        if not kwargs.get("trainable", True):
            return var
        if name in self._copies:  # the model was built a second time (reuse)
            return self._copies[name]
        parts = _parts(var)
        reads = []
        for part in parts:
            with tf.device(part.device):
                reads.append(part.read_value())
        with v1.device(None), v1.device(self.device):
            initial = reads[0] if len(reads) == 1 else tf.concat(reads, axis=0)
            copy = v1.Variable(initial, trainable=False, name=f"{name}/local",
                               collections=[v1.GraphKeys.LOCAL_VARIABLES])
            anchor = v1.Variable(initial, trainable=False, name=f"{name}/anchor",
                                 collections=[v1.GraphKeys.LOCAL_VARIABLES])
        self._copies[name] = copy
        self.triples.append((parts, copy, anchor))
        return copy


def _parts(var) -> list:
    """The shards of a sharded (`PartitionedVariable`) variable, in order; [var] otherwise."""
    shards = getattr(var, "_get_variable_list", None)  # no public name for the class
    return list(shards()) if shards else [var]


@dataclasses.dataclass
class LocalSGDOps:
    """The ops of one worker in the communication-reduced mode.

    Attributes:
      local_step: one optimizer step on the worker's copies (no ps traffic).
      first: evaluates to int64 `[2]`: (global step at the start of this
        worker's first block of local steps, steps in it). 0 steps: the run is
        over.
      exchange: pushes the deltas, pulls fresh copies and evaluates to the
        next block, as `first`.
      sync_optimizer: sync mode: the `SyncReplicasOptimizer` that averages the
        deltas (its hook runs the chief's sync loop); None when async.
    """

    local_step: object
    first: object
    exchange: object
    sync_optimizer: Optional[object] = None


def build(opt, loss, copies: LocalCopies, global_step, period: int, last_step: int,
          sync: Optional[tuple[int, int]] = None) -> LocalSGDOps:
    """Builds the local step and the exchange for the model built with `copies`.

    The optimizer's slots and other variables it creates (for the copies, on
    the worker) are moved to the local variables.

    Async (`sync` None): each exchange adds this worker's delta to the ps
    variables and claims the next block of steps (`claim`).

    Sync (`sync` = (replicas_to_aggregate, total workers)): synchronous
    periodic model averaging. Each worker's -delta goes through a
    `SyncReplicasOptimizer` as if it were a gradient: the ps accumulators
    average `replicas_to_aggregate` of them, the chief's sync loop applies the
    mean (descent at rate 1: the ps model becomes the average of the workers'
    models) and moves global_step by the round's steps, and its tokens release
    the workers, who then pull the average. Extra workers are backups, as in
    the exact sync mode: their late deltas are dropped as stale.

    Args:
      opt: a `tf.compat.v1.train.Optimizer`, for the local steps.
      loss: float32 scalar computed with the local copies.
      copies: the `LocalCopies` the model was built with.
      global_step: the int64 global step variable (on a ps).
      period: K, the local steps per exchange.
      last_step: `--train_steps`.
      sync: None, or (replicas_to_aggregate, total number of workers).
    """
    graph = v1.get_default_graph()
    before = set(graph.get_collection(v1.GraphKeys.GLOBAL_VARIABLES))
    local_vars = [copy for _, copy, _ in copies.triples]
    local_step = opt.minimize(loss, var_list=local_vars)
    _make_local([v for v in graph.get_collection(v1.GraphKeys.GLOBAL_VARIABLES)
                 if v not in before])

    pieces = []  # (delta piece, ps shard), and per variable the shards and the copies
    for parts, copy, anchor in copies.triples:
        with tf.device(copy.device):
            delta = copy.read_value() - anchor.read_value()
            split = (tf.split(delta, [p.shape[0] for p in parts], axis=0) if len(parts) > 1
                     else [delta])
        pieces += list(zip(split, parts))
    sync_opt = None
    if sync is None:
        pushed = []
        for piece, part in pieces:
            with tf.device(part.device):
                pushed.append(part.assign_add(piece, read_value=False))
    else:
        replicas, total = sync
        sync_opt = v1.train.SyncReplicasOptimizer(
            _AverageOptimizer(period, last_step), replicas_to_aggregate=replicas,
            total_num_replicas=total)
        negated = []
        for piece, part in pieces:
            with tf.device(copies.device):
                negated.append((-piece, part))
        pushed = [sync_opt.apply_gradients(negated, global_step=global_step)]
    updates = []
    with tf.control_dependencies(pushed):
        for parts, copy, anchor in copies.triples:
            fresh = []
            for part in parts:
                with tf.device(part.device):
                    fresh.append(part.read_value())
            with tf.device(copy.device):
                fresh = tf.concat(fresh, axis=0) if len(fresh) > 1 else fresh[0]
                updates += [copy.assign(fresh, read_value=False),
                            anchor.assign(fresh, read_value=False)]
    if sync is None:
        with tf.control_dependencies(updates):
            exchange = claim(global_step, period, last_step)
        return LocalSGDOps(local_step, exchange, exchange)
    with tf.control_dependencies(updates):
        exchange = _next_round(global_step, period, last_step)
    return LocalSGDOps(local_step, _next_round(global_step, period, last_step), exchange,
                       sync_opt)


def _steps_left(start, period: int, last_step: int):
    return tf.maximum(tf.minimum(tf.constant(period, tf.int64), last_step - start), 0)


def _next_round(global_step, period: int, last_step: int):
    """Sync: int64 `[2]`: (global step, steps in the next round); only the sync loop moves it."""
    with tf.device(global_step.device):
        start = global_step.read_value()
        return tf.stack([start, _steps_left(start, period, last_step)])


class _AverageOptimizer(v1.train.GradientDescentOptimizer):
    """Applies the averaged -delta at rate 1 and moves global_step by the round's local steps."""

    def __init__(self, period: int, last_step: int):
        super().__init__(1.0, name="ModelAverage")
        self._period, self._last_step = period, last_step

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        update = super().apply_gradients(grads_and_vars, name=name)
        with tf.control_dependencies([update]):
            steps = _steps_left(global_step.read_value(), self._period, self._last_step)
            return global_step.assign_add(steps, read_value=False)


def claim(global_step, period: int, last_step: int):
    """int64 `[2]`: (start, n) — reserves the next n = min(period, last_step - start) steps.

    Runs in a `tf.CriticalSection` on global_step's device, shared by name by
    every worker's graph, so two claims never overlap.
    """
    with tf.device(global_step.device):
        section = tf.CriticalSection(name="claim_steps", shared_name="lowlevel_claim_steps")

        def reserve():
            start = global_step.read_value()
            n = _steps_left(start, period, last_step)
            with tf.control_dependencies([global_step.assign_add(n, read_value=False)]):
                return tf.stack([start, n])

        return section.execute(reserve)


def _make_local(variables) -> None:
    """Moves `variables` from the global collection to the local one."""
    graph = v1.get_default_graph()
    global_vars = graph.get_collection_ref(v1.GraphKeys.GLOBAL_VARIABLES)
    local_vars = graph.get_collection_ref(v1.GraphKeys.LOCAL_VARIABLES)
    for v in variables:
        global_vars.remove(v)
        local_vars.append(v)
