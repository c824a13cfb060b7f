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

The global step counts local steps. Each exchange also claims the next block
of at most K steps (`claim`, atomic on global_step's ps), so the run ends at
exactly `--train_steps` however the workers interleave.
"""

from __future__ import annotations

import dataclasses

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
        self._device = worker_device
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
        with v1.device(None), v1.device(self._device):
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
      exchange: pushes the deltas, pulls fresh copies and claims the next
        block; evaluates to int64 `[2]`: (global step at the block's start,
        steps in the block). 0 steps: the run is over.
    """

    local_step: object
    exchange: object


def build(opt, loss, copies: LocalCopies, global_step, period: int, last_step: int
          ) -> LocalSGDOps:
    """Builds the local step and the exchange for the model built with `copies`.

    The optimizer's slots and other variables it creates (for the copies, on
    the worker) are moved to the local variables.

    Args:
      opt: a `tf.compat.v1.train.Optimizer`.
      loss: float32 scalar computed with the local copies.
      copies: the `LocalCopies` the model was built with.
      global_step: the int64 global step variable (on a ps).
      period: K, the local steps per exchange.
      last_step: `--train_steps`.
    """
    graph = v1.get_default_graph()
    before = set(graph.get_collection(v1.GraphKeys.GLOBAL_VARIABLES))
    local_vars = [copy for _, copy, _ in copies.triples]
    local_step = opt.minimize(loss, var_list=local_vars)
    _make_local([v for v in graph.get_collection(v1.GraphKeys.GLOBAL_VARIABLES)
                 if v not in before])

    updates = []
    for parts, copy, anchor in copies.triples:
        with tf.device(copy.device):
            delta = copy.read_value() - anchor.read_value()
            pieces = (tf.split(delta, [p.shape[0] for p in parts], axis=0) if len(parts) > 1
                      else [delta])
        fresh = []
        for part, piece in zip(parts, pieces):
            with tf.device(part.device):
                pushed = part.assign_add(piece, read_value=False)
                with tf.control_dependencies([pushed]):
                    fresh.append(part.read_value())
        with tf.device(copy.device):
            fresh = tf.concat(fresh, axis=0) if len(fresh) > 1 else fresh[0]
            updates += [copy.assign(fresh, read_value=False),
                        anchor.assign(fresh, read_value=False)]
    with tf.control_dependencies(updates):
        exchange = claim(global_step, period, last_step)
    return LocalSGDOps(local_step, exchange)


def claim(global_step, period: int, last_step: int):
    """int64 `[2]`: (start, n) — reserves the next n = min(period, last_step - start) steps.

    Runs in a `tf.CriticalSection` on global_step's device, shared by name by
    every worker's graph, so two claims never overlap.
    """
    with tf.device(global_step.device):
        section = tf.CriticalSection(name="claim_steps", shared_name="lowlevel_claim_steps")

        def reserve():
            start = global_step.read_value()
            n = tf.maximum(tf.minimum(tf.constant(period, tf.int64), last_step - start), 0)
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
