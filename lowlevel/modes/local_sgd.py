"""Communication-reduced training: K local steps between exchanges with the ps (local SGD).

In the exact mode (`--communication_period=1`, the default, what the classic
trainer does) every step reads every parameter from the ps tasks and sends
every gradient back: twice the model's bytes per step. On a 2-core machine
moving those bytes through gRPC (serialisation, copies, system calls) costs
more CPU than the step's arithmetic, so a distributed step runs at a third to
a half of in-process speed (benchmarks/NOTES.md). What moves the figure is
sending fewer bytes per example.

With `--communication_period=K` each worker trains a copy of the model held
on its own device for K steps, with its own optimizer state, and then
exchanges with the ps: it adds to each ps variable what its copy moved since
the last exchange (the delta), and takes the result. Twice the model's bytes
per K steps instead of per step.

Async (the default) is local SGD in its asynchronous, delta-pushing form
(Zinkevich et al., "Parallelized Stochastic Gradient Descent", NIPS 2010;
Lin et al., "Don't Use Large Mini-Batches, Use Local SGD", ICLR 2020; the
elastic-averaging variant of Zhang, Choromanska and LeCun, "Deep learning
with Elastic Averaging SGD", NIPS 2015, targets this same parameter-server
layout). The exchange runs in the background while the worker trains on
(`send`, then `merge` at the next block boundary; Wang et al., "Overlap
Local-SGD", ICASSP 2020): the values it brings back are combined with the
steps taken meanwhile as copy + (pulled - snapshot), so no step is lost or
counted twice. The claim of the next block rides with it, and all the
variables bound for one ps task travel as one tensor each way. With one
worker it is in-process training, up to rounding and the one block by which
the pulled values lag. What it trades, with several
workers: a worker's steps start from parameters that miss up to 2K of each
other worker's steps (the exact async mode misses up to one). The optimizer's
slots that only add to themselves (`ADDITIVE_SLOTS`: Adagrad's accumulator,
FTRL's accumulator and linear) are exchanged as the variables are, as deltas
added to a shared twin on the ps (`optimizer_state.Mirrors`), so every worker's
steps are scaled by what all workers accumulated, as in the exact mode; kept
per worker, FTRL, which recomputes each weight from its own slots, undid the
other workers' steps at every one of its own (a canned wide & deep: test AUC
0.588 against 0.603 at any K, benchmarks/NOTES.md 2026-12-02). Slots that decay
(Momentum's, Adam's moments) would add their decay once per worker as deltas:
they stay per worker (the chief's are what checkpoints hold), and so do all
slots in the sync mode (model averaging). A worker that joins a trained model
late (or restarts) loads the optimizer state of the last checkpoint, the shared
twins as they are; per-worker state from a checkpoint, or the initial state
before the first one; older state means larger steps than the others take
(fresh Adagrad: ~10x after 1,000 steps), which can throw the shared model off
(benchmarks/NOTES.md, 2026-11-24).
So a fresh async run starts together: the chief waits, up to
`--start_wait_secs`, until every worker is ready (`lowlevel.runtime.start`); before,
about 1 digits run in 22 ended below 0.93 because the second worker was ready
only when the chief had run 240-1,000 of the 2,000 steps alone.
The benchmark reports the test accuracy of both modes beside their
speed; `--communication_period=1` switches it off.

With `--sync` the exchange is synchronous model averaging instead: the ps
model becomes the average of `--replicas_to_aggregate` workers' models every
K steps (McDonald et al., "Distributed Training Strategies for the Structured
Perceptron", NAACL 2010; Lin et al. above), through the same
`SyncReplicasOptimizer` machinery as the exact sync mode. It cannot overlap:
every worker waits for the round's average.

The global step counts local steps (in sync mode, each worker's: a round of K
steps moves it by K). Async workers claim each block of at most K steps
(`exchange.claim`, atomic on global_step's ps); each sync round moves it by at most
what is left; so the run ends at exactly `--train_steps`.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import tensorflow as tf

from lowlevel.models import embeddings
from lowlevel.modes import exchange, optimizer_state

v1 = tf.compat.v1

# Local steps per run of `LocalSGDOps.block` at most: a run's fixed cost spread over 16
# steps is ~1 % of a step, and a block stays short next to --step_timeout_secs and a
# preemption's wait.
BLOCK_STEPS = 16


@dataclasses.dataclass
class Copy:
    """A worker's copy of one variable, and what the exchanges keep beside it.

    Attributes:
      shards: the variable's shards on the ps tasks (one if not sharded).
      copy: what the model computes with, the variable's whole shape.
      anchor: the ps value the last exchange brought back; copy - anchor is
        what this worker has not pushed yet (the delta).
      diff: async: what the last exchange brought back minus the copy it was
        computed from (the other workers' pushes), added to the copy by `merge`.
    """

    shards: list
    copy: object
    anchor: object
    diff: object


class LocalCopies:
    """A `custom_getter` giving the model a worker-local copy of each trainable variable.

    The variable itself is created as usual (on a ps, by the device setter);
    the model computes with a copy on `worker_device`, initialised from it
    when the session's local init op runs (after the chief has initialised or
    restored the ps variables, and again in every session that replaces one
    lost to a failure). The copies are local variables: never saved, never
    checked by the chief. A variable sharded over the ps tasks
    (`placement.partitioner`) gets one copy of its whole shape: the shards
    are concatenated when pulled and the delta is split when pushed.

    Embedding tables (`embeddings.TABLES`) get no copy: a worker never holds
    a table. The model looks their rows up on the ps tasks and every local
    step applies their sparse gradients there directly, as the exact mode
    does (`build`).

    Attributes:
      copies: one `Copy` per trainable variable, in creation order.
      tables: the shards of every embedding table, in creation order.
    """

    def __init__(self, worker_device: str):
        self.device = worker_device
        self.copies: list[Copy] = []
        self.tables: list = []
        self._by_name: dict[str, object] = {}

    def __call__(self, getter, name, *args, **kwargs):
        var = getter(name, *args, **kwargs)
        if not kwargs.get("trainable", True):
            return var
        if embeddings.is_table_request(kwargs):
            if name not in self._by_name:
                self.tables += exchange.shards_of(var)
                self._by_name[name] = var
            return var
        if name in self._by_name:  # the model was built a second time (reuse)
            return self._by_name[name]
        shards = exchange.shards_of(var)
        initial = exchange.pull(shards, self.device)
        with v1.device(None), v1.device(self.device):
            made = [v1.Variable(initial, trainable=False, name=f"{name}/{role}",
                                collections=[v1.GraphKeys.LOCAL_VARIABLES])
                    for role in ("local", "anchor", "diff")]
        setattr(made[0], _COPY_OF, shards[0])
        self.copies.append(Copy(shards, *made))
        self._by_name[name] = made[0]
        return made[0]

    def local_of(self, variables) -> list:
        """What a local step's gradients are taken for, in place of `variables` (the
        model's own, on the ps): each one's copy (once for all of a sharded variable's
        shards), a table shard itself; a copy or a table shard stays as it is.

        Raises:
          ValueError: a variable the getter never gave a copy (made without
            `tf.compat.v1.get_variable`, so the model reads it from the ps every step).
        """
        own = {id(v): c.copy for c in self.copies for v in [c.copy] + list(c.shards)}
        own.update({id(t): t for t in self.tables})
        missing = [v.op.name for v in variables if id(v) not in own]
        if missing:
            raise ValueError(f"variables without a local copy: {', '.join(missing[:5])}")
        return list({id(own[id(v)]): own[id(v)] for v in variables}.values())


_COPY_OF = "_lowlevel_copy_of"  # on a copy: its model variable (the first shard)


def model_variable(variable):
    """The model's variable (its first shard, when sharded) that `variable` is the worker's
    copy of (`LocalCopies`), or `variable` itself when it is no copy. An optimizer that
    dispatches by variable (a canned wide & deep's `Combined`: the linear part's FTRL, the
    DNN's Adagrad) looks its copies up by it."""
    return getattr(variable, _COPY_OF, variable)


@dataclasses.dataclass
class LocalSGDOps:
    """The ops of one worker in the communication-reduced mode.

    Attributes:
      local_step: one optimizer step on the worker's copies (no ps traffic).
      block: `block_steps` local steps in one run (`local_block`), or None
        (a model with embedding tables: their updates go to the ps every step).
      block_steps: the local steps `block` runs.
      claim: int64 `[2]`: (global step at the start of this worker's next
        block of local steps, steps in it); 0 steps: the run is over. Async:
        reserves the block; sync: reads the next round's.
      send: async: pushes each copy's delta, pulls the result into the
        anchor and keeps in `diff` what it adds to the copy it was computed
        from (run in the background while training goes on, with the claim
        of the next block).
      merge: async: folds a finished `send` into the copies: copy += diff
        (worker-local, one elementwise pass).
      resync: async: copies := the ps values (after a `send` that failed).
      exchange: sync: pushes the deltas, waits for the round's average, pulls
        it and evaluates to the next round, as `claim`.
      sync_optimizer: sync: the `SyncReplicasOptimizer` that averages the
        deltas (its hook runs the chief's sync loop).
      state: the optimizer state's twins on the ps, saved in checkpoints
        under the exact mode's names (`optimizer_state.Mirrors`).
    """

    local_step: object
    claim: object
    block: Optional[object] = None
    block_steps: int = 1
    send: Optional[object] = None
    merge: Optional[object] = None
    resync: Optional[object] = None
    exchange: Optional[object] = None
    sync_optimizer: Optional[object] = None
    state: Optional[optimizer_state.Mirrors] = None


def gradients(loss, copies: LocalCopies) -> list:
    """[(gradient, variable)] of `loss` (built with `copies`) for every copy and table
    shard, in `copies`' order; None where the loss does not depend on it."""
    variables = [c.copy for c in copies.copies] + copies.tables
    return list(zip(tf.gradients(loss, variables), variables))


def build(opt, grads_and_vars, copies: LocalCopies, global_step, period: int, last_step: int,
          sync: Optional[tuple[int, int]] = None, table_opt=None,
          next_grads: Optional[Callable[[], list]] = None) -> LocalSGDOps:
    """Builds the local step and the exchanges for the model built with `copies`.

    The optimizer's slots and other variables it creates (for the copies, on
    the worker) are moved to the local variables; their twins on the ps
    (`optimizer_state.Mirrors`) carry them in and out of checkpoints.

    Sync (`sync` = (replicas_to_aggregate, total workers)): each worker's
    -delta goes through a `SyncReplicasOptimizer` as if it were a gradient:
    the ps accumulators average `replicas_to_aggregate` of them, the chief's
    sync loop applies the mean (descent at rate 1: the ps model becomes the
    average of the workers' models) and moves global_step by the round's
    steps, and its tokens release the workers, who then pull the average.
    Extra workers are backups, as in the exact sync mode: their late deltas
    are dropped as stale.

    Args:
      opt: a `tf.compat.v1.train.Optimizer`, for the local steps.
      grads_and_vars: [(gradient, variable)] of one local step, each variable a copy
        (`Copy.copy`) or a table shard (`copies.tables`), as `gradients` gives them
        (or a model_fn's, transformed as it likes: `lowlevel.runtime.step`).
      copies: the `LocalCopies` the model was built with.
      global_step: the int64 global step variable (on a ps).
      period: K, the local steps per exchange.
      last_step: `--train_steps`.
      sync: None, or (replicas_to_aggregate, total number of workers).
      table_opt: another instance of `opt`'s optimizer, for the embedding
        tables (`copies.tables`): their sparse gradients go to the ps every
        local step, and its slots stay there, shared by all workers.
      next_grads: builds `grads_and_vars` again on the next batch (a model built
        with `copies`); given, and with no tables, the ops include a `block` of
        local steps in one run (`local_block`).
    """
    local_step, made = _local_update(opt, table_opt, grads_and_vars, copies)
    _make_local(made)
    block, block_steps = None, 1
    if next_grads is not None and not copies.tables and min(period, BLOCK_STEPS) > 1:
        block_steps = min(period, BLOCK_STEPS)
        block = local_block(lambda: _local_update(opt, table_opt, next_grads(), copies)[0],
                            block_steps)
    shared = [] if sync is not None else _additive_slots(opt, copies.copies)
    state = optimizer_state.Mirrors(
        made, {c.copy.op.name: (c.copy.op.name[:-len("/local")], c.shards[0].device)
               for c in copies.copies}, global_step.device, shared=shared)
    if sync is None:
        send, merge, resync = exchange.async_exchange(
            copies.copies + [Copy([twin], slot, anchor, diff)
                             for twin, slot, anchor, diff in state.shared_copies()],
            copies.device)
        return LocalSGDOps(local_step, exchange.claim(global_step, period, last_step),
                           block, block_steps, send=send, merge=merge, resync=resync,
                           state=state)
    sync_round, sync_opt = exchange.sync_exchange(copies.copies, copies.device, global_step,
                                                  period, last_step, *sync)
    return LocalSGDOps(local_step, exchange.next_round(global_step, period, last_step), block,
                       block_steps, exchange=sync_round, sync_optimizer=sync_opt, state=state)


# The slots, by optimizer class, that only ever add to themselves (no decay, no
# overwrite): a sum over every worker's steps is what one shared optimizer would hold, so
# async exchanges them as deltas, as the model's variables. Adagrad's accumulator (sum of
# g^2); FTRL's accumulator (sum of g^2) and linear (z: sum of g - sigma * w; McMahan et al.,
# KDD 2013). Momentum and Adam's moments decay: their deltas would add the decay once per
# worker, so they stay per worker.
ADDITIVE_SLOTS = {"AdagradOptimizer": ("accumulator",), "FtrlOptimizer": ("accum", "linear"),
                  "ProximalAdagradOptimizer": ("accumulator",)}


def additive_slot_names(opt, var) -> tuple:
    """The names of `opt`'s slots for `var` that only add (`ADDITIVE_SLOTS`): an optimizer's
    own `additive_slot_names(var)` where it has one (lowlevel's canned optimizers, and their
    `Combined`), else by its TensorFlow class."""
    own = getattr(opt, "additive_slot_names", None)
    if own is not None:
        return tuple(own(var))
    return next((names for cls in type(opt).__mro__
                 for name, names in ADDITIVE_SLOTS.items() if cls.__name__ == name), ())


def _additive_slots(opt, copies: list) -> list:
    """The additive slots (`ADDITIVE_SLOTS`) `opt` made for the copies, in the copies' order."""
    return [slot for c in copies for name in additive_slot_names(opt, c.copy)
            if (slot := opt.get_slot(c.copy, name)) is not None]


def _local_update(opt, table_opt, grads_and_vars, copies: LocalCopies):
    """One local step's update: `opt` on the copies, `table_opt` (or `opt`) on the tables.

    Returns:
      (the update op, the variables `opt` made for the copies: its slots, in the
      first build; the tables' optimizer state is not among them, it stays on the ps).
    """
    graph = v1.get_default_graph()
    tables = {id(t) for t in copies.tables}
    pairs = [(g, v) for g, v in grads_and_vars if g is not None]
    updates = []
    table_grads = [(g, v) for g, v in pairs if id(v) in tables]
    if table_grads:
        updates.append((table_opt or opt).apply_gradients(table_grads))
    before = set(graph.get_collection(v1.GraphKeys.GLOBAL_VARIABLES))
    # On the worker, with the copies: what the optimizer makes for them outside their slots
    # (Keras-named hyper-parameters and step counts, Adam's powers) is worker-local too;
    # left to the device function it went to a ps, shared by every worker's local
    # variables of that name and read there in every local step.
    with v1.device(None), v1.device(copies.device):
        updates.append(opt.apply_gradients([(g, v) for g, v in pairs if id(v) not in tables]))
    made = [v for v in graph.get_collection(v1.GraphKeys.GLOBAL_VARIABLES) if v not in before]
    return tf.group(updates), made


def local_block(step_fn: Callable[[], object], steps: int):
    """An op that runs `steps` local steps in one `session.run` (a `tf.while_loop`).

    Each run of a distributed session costs its master's fixed overhead
    (partitioning the fetch, the step's rendezvous): ~0.25 ms, a tenth of the
    MLP's 2.4 ms step on 2 cores (benchmarks/NOTES.md). A block pays it once for
    `steps` steps, as TPUEstimator's `iterations_per_loop` and Keras'
    `steps_per_execution` do. `step_fn` builds one step (taking its own batch)
    in the loop's body; the iterations run one after the other.
    """
    def body(i):
        with tf.control_dependencies([step_fn()]):
            return i + 1
    done, = tf.while_loop(lambda i: i < steps, body, [tf.constant(0)], parallel_iterations=1,
                          back_prop=False, name="local_block")
    return done  # int32 scalar: `steps`


def _make_local(variables) -> None:
    """Moves `variables` from the global collection to the local one."""
    graph = v1.get_default_graph()
    global_vars = graph.get_collection_ref(v1.GraphKeys.GLOBAL_VARIABLES)
    local_vars = graph.get_collection_ref(v1.GraphKeys.LOCAL_VARIABLES)
    for v in variables:
        global_vars.remove(v)
        local_vars.append(v)
