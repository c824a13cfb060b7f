"""One training step for every model: a `model_fn`'s TRAIN graph, taken over by the runtime.

`build` calls a model_fn (a user's, or the built-in models' `models.catalogue.model_fn`)
on a batch already in the graph and returns the step one worker runs. The one training
graph (`graph.build`) uses it for every model, a user's model_fn with its input_fn and
the built-in models on their data sets, in every mode, so a change to the step reaches
every model.
What it does to the model_fn's graph, leaving the model_fn as it is:

- on a cluster, the small variables the worker reads come from one read per ps, and
  their gradients go back in one tensor per ps (`modes.fused_transfer`);
- on a CPU worker with one device (`--ps_products`), each dense layer's product runs
  where it moves the fewest bytes, its kernel's ps or the worker (`modes.ps_products`:
  the model_fn's MatMuls placed while it builds, each gradient beside its forward op);
- with towers (several devices in the worker), the model_fn is called once per device
  on its slice of the batch, variables shared, gradients averaged on the worker
  (`modes.towers`);
- its optimizer's apply with the global step (`modes.optimizer_capture`) becomes the
  mode's update: async, the counted update (`exact.counted_update`: the run ends at
  exactly the last step; with the data queue, its batch's check and commit); `--sync`,
  a `SyncReplicasOptimizer`, or with the data queue the live workers' sync
  (`modes.elastic_sync`); its gradients are built ungated, as `tf.gradients` builds
  them, when its variables are resource variables;
- with `--communication_period=K` > 1, the model_fn is built with worker-local copies of
  its variables, and its optimizer's apply becomes K local steps between exchanges with
  the ps (`modes.local_sgd`; `_local_step`).

A step the runtime could not take over (an optimizer that is not a
`tf.compat.v1.train.Optimizer`, a train_op that moves global_step by itself) runs
as the model_fn built it, followed by a read of global_step; an async run may
then overshoot the last step by up to (workers - 1) steps, and says so.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable, Optional

import tensorflow as tf
from absl import logging

from lowlevel import errors
from lowlevel.cluster import probes
from lowlevel.cluster.spec import Cluster
from lowlevel.config import TrainConfig
from lowlevel.models import embeddings, user
from lowlevel.models import spec as spec_lib
from lowlevel.models.model_fn_model import ModelFnModel
from lowlevel.modes import elastic_sync, exact, fused_transfer, local_sgd, optimizer_capture
from lowlevel.modes import ps_products
from lowlevel.modes import towers as towers_lib
from lowlevel.runtime import hooks

v1 = tf.compat.v1
TRAIN = spec_lib.ModeKeys.TRAIN


@dataclasses.dataclass
class TrainStep:
    """What `build` made in the graph."""

    spec: spec_lib.EstimatorSpec  # the model_fn's TRAIN spec (with towers: the mean loss)
    value: tf.Tensor  # int64 scalar: the global step after a run of the step
    runtime_sync: Optional[v1.train.SyncReplicasOptimizer]  # the one --sync wrapped
    sync_optimizer: Optional[v1.train.SyncReplicasOptimizer]  # the step's, any (a model's own)
    sync_hooks: list  # the runtime's sync hooks a model's own sync optimizer asked for
    elastic: Optional[elastic_sync.ElasticSync] = None  # --sync with the data queue
    local_ops: Optional[local_sgd.LocalSGDOps] = None  # --communication_period > 1


def build(config: TrainConfig, model: ModelFnModel, features, labels, global_step,
          worker: Optional[str], devices, cluster: Optional[Cluster], span=None,
          next_batch: Optional[Callable] = None, table_optimizer: Optional[Callable] = None
          ) -> TrainStep:
    """Calls `model.model_fn` in TRAIN mode on (`features`, `labels`) and takes its step over.

    Args:
      config: the run's settings (train_steps, sync, replicas_to_aggregate, ps_products).
      worker: the worker's compute device, where the fused reads are split and the
        gradients fused ("/job:worker/task:0/device:CPU:0"); None in one process.
      devices: the worker's compute devices; more than one: towers, `worker` their hub.
      span: the worker's input from the data queue (`spans.SpanInput`), or None. With
        `--sync` every parameter is read after global_step (`elastic_sync`, 1.).
      next_batch, table_optimizer: for the communication-reduced mode (`_local_step`).
    Returns:
      The `TrainStep`.
    Raises:
      errors.ModelFnError: a train_op that never moves the global step, towers the
        model_fn cannot share (new variables per tower, its own sync optimizer), a
        model_fn the communication-reduced mode cannot copy (`_local_step`).
      Whatever the model_fn raises (one line naming it: `models.user.calling`).
    """
    if cluster is not None and config.communication_period > 1:
        return _local_step(config, model, features, labels, global_step, worker, cluster,
                           next_batch, table_optimizer)
    graph = v1.get_default_graph()
    sync = bool(config.sync and cluster)
    after = [global_step.read_value()] if sync and span is not None else []
    made = _StepMaker(config, worker, global_step, sync, cluster, len(devices), span,
                      after[0] if after else None)
    on_ps = ps_products.wanted(config.ps_products, worker, len(devices))
    with optimizer_capture.capture(global_step, made.update, made.sync_hook,
                                   colocate_gradients=on_ps) as cap, \
            ps_products.placed(on_ps), tf.control_dependencies(after):
        spec = (_tower_specs(model, features, labels, devices, worker)
                if len(devices) > 1 else call_model_fn(model, features, labels))
    if worker:
        # an embedding table is read by gathers on its ps, never whole
        variables = [v for v in v1.global_variables() if not embeddings.is_table(v)]
        fused = fused_transfer.fuse_reads(graph, variables, worker, after)
        if len(devices) > 1:
            _check_towers(model, cap, made)
            fused_ids = {id(v) for v in fused}
            fused_transfer.share_reads(graph, [v for v in variables if id(v) not in fused_ids],
                                       worker)
    value = _step_value(spec, cap, global_step, config.train_steps, cluster, model)
    return TrainStep(spec, value, made.runtime_sync, made.runtime_sync or cap.sync_optimizer,
                     made.sync_hooks, made.elastic)


def call_model_fn(model: ModelFnModel, features, labels, mode: str = TRAIN):
    """The model_fn's `EstimatorSpec` in `mode` (a failure: one line naming it, `user.calling`)."""
    with user.calling("model_fn", model.model_fn):
        return spec_lib.call_model_fn(model.model_fn, features, labels, mode, model.params,
                                      model.run_config)


def _local_step(config: TrainConfig, model: ModelFnModel, features, labels, global_step,
                worker: str, cluster: Cluster, next_batch=None, table_optimizer=None
                ) -> TrainStep:
    """The communication-reduced mode (`modes.local_sgd`) for a model_fn.

    The model_fn is built with worker-local copies of its variables (a `custom_getter`
    around it), and its optimizer's apply with the global step becomes K local steps on
    them between exchanges with the ps. The gradients are the model_fn's own, taken for
    the copies (`optimizer_capture`'s `variables_for`): a transformation it makes
    (clipping) stays. `next_batch`: `() -> (features, labels)`, the input's next batch;
    given, local steps run in blocks (the model_fn called again in the block's loop,
    sharing its variables, its summaries there dropped). `table_optimizer`: `() ->` a new
    optimizer for the embedding tables (`local_sgd.build`), else the model's.

    Raises:
      errors.ModelFnError: its step is not one apply of a `tf.compat.v1.train.Optimizer`
        with the global step, or it made a variable without `get_variable`.
    """
    copies = local_sgd.LocalCopies(worker)
    spec, opt, grads = _local_gradients(model, copies, features, labels, global_step)

    def next_grads():
        summaries = v1.get_default_graph().get_collection_ref(v1.GraphKeys.SUMMARIES)
        kept = list(summaries)
        grads = _local_gradients(model, copies, *next_batch(), global_step, reuse=True)[2]
        summaries[:] = kept  # a summary in the block's loop could not be fetched
        return grads

    num_workers = cluster.num_workers or 1
    ops = local_sgd.build(
        opt, grads, copies, global_step, config.communication_period, config.train_steps,
        (config.replicas_to_aggregate or num_workers, num_workers) if config.sync else None,
        table_optimizer() if table_optimizer is not None and copies.tables else None,
        next_grads=next_grads if next_batch is not None else None)
    return TrainStep(spec, None, ops.sync_optimizer, ops.sync_optimizer, [], local_ops=ops)


def _local_gradients(model: ModelFnModel, copies, features, labels, global_step,
                     reuse: bool = False):
    """(spec, optimizer, [(gradient, copy or table)]) of the model_fn called once with
    `copies` as its variables' getter; its apply is not built (`local_sgd.build` is)."""
    applied = []

    def update(opt, grads_and_vars):
        applied.append((opt, list(grads_and_vars)))
        return tf.constant(0, tf.int64)  # never run: the local ops are

    def local_of(variables):
        try:
            return copies.local_of(variables)
        except ValueError as e:
            raise _local_error(model, f"has {e}: make them with tf.compat.v1.get_variable "
                               "(a Keras layer, a tf.Variable do not)") from None

    # a model's own sync optimizer gets a hook that does nothing: refused below
    with optimizer_capture.capture(global_step, update,
                                   lambda *a, **k: v1.train.SessionRunHook(),
                                   variables_for=local_of) as cap, \
            v1.variable_scope(v1.get_variable_scope(), custom_getter=copies,
                              reuse=v1.AUTO_REUSE if reuse else None):
        spec = call_model_fn(model, features, labels)
    if len(applied) != 1 or cap.sync_optimizer is not None or cap.other_applies:
        raise _local_error(model, "did not apply its gradients once through a "
                           "tf.compat.v1.train.Optimizer with the global step (and no other "
                           "apply: its variables would not be trained), or wrapped it in its "
                           "own SyncReplicasOptimizer (--sync does that)")
    return spec, applied[0][0], applied[0][1]


def _local_error(model: ModelFnModel, problem: str):
    return errors.ModelFnError(f"--communication_period > 1: model_fn "
                               f"{user.name(model.model_fn)} {problem}; or use "
                               "--communication_period=1")


def _tower_specs(model: ModelFnModel, features, labels, devices, hub: str):
    """The model_fn called once per tower on its slice of the batch, its variables shared
    (`tf.compat.v1.get_variable` with reuse); the last tower's spec, whose train_op applies
    every tower's gradients (`_StepMaker.update`), with the towers' mean loss.

    Raises:
      errors.ModelFnError: the model_fn made new variables for a tower after the first.
    """
    logging.info("%d towers on %s, the batch split among them; shared reads and summed "
                 "gradients on %s", len(devices), ", ".join(devices), hub)
    specs, first = [], None
    with v1.variable_scope(v1.get_variable_scope(), reuse=v1.AUTO_REUSE):
        for i, (device, (f, y)) in enumerate(zip(devices, towers_lib.split(
                [features, labels], len(devices)))):
            # tower 0 unscoped: a tf.Variable there keeps the name it has with one tower
            scope = v1.name_scope(f"tower_{i}") if i else contextlib.nullcontext()
            with v1.device(towers_lib.compute_on(device)), scope:
                specs.append(call_model_fn(model, f, y))
            variables = v1.trainable_variables()
            first = variables if first is None else first
    if len(variables) != len(first):
        made = ", ".join(v.op.name for v in variables[len(first):][:3])
        _towers_error(model, len(devices), f"made new variables for its other towers "
                      f"({made}): towers share the variables tf.compat.v1.get_variable makes")
    return specs[-1]._replace(loss=towers_lib.mean([s.loss for s in specs], hub))


def _check_towers(model: ModelFnModel, cap, made) -> None:
    """Raises `errors.ModelFnError` when the towers' step is not the runtime's: the model's
    gradients not applied once per tower through a captured optimizer (`optimizer_capture`)."""
    own_sync = cap.sync_optimizer is not None and cap.sync_optimizer is not made.runtime_sync
    if own_sync or made.tower_applies != made.towers:
        _towers_error(model, made.towers, "did not apply its gradients once per tower through "
                      "a tf.compat.v1.train.Optimizer with the global step, or wrapped it in "
                      "its own SyncReplicasOptimizer (--sync does that)")


def _towers_error(model: ModelFnModel, towers: int, problem: str):
    raise errors.ModelFnError(f"--towers={towers}: model_fn {user.name(model.model_fn)} "
                              f"{problem}; or use --towers=1")


class _StepMaker:
    """What the captured optimizer's apply becomes, and the sync hook (`optimizer_capture`).

    `worker_device`: the worker's compute device, where its small gradients are fused
    into one tensor per ps (`fused_transfer`); None in one process. `span`: the data
    queue's input; with sync, `local_step` is global_step read before the parameters.
    """

    def __init__(self, config: TrainConfig, worker_device: Optional[str], global_step,
                 sync: bool, cluster=None, towers: int = 1, span=None, local_step=None):
        self._config, self._cluster, self._worker = config, cluster, worker_device
        self._global_step, self._sync = global_step, sync
        self._num_workers = (cluster.num_workers or 1) if cluster else 1
        self._span, self._local_step = span, local_step
        self.sync_hooks: list = []
        self.runtime_sync = None  # the SyncReplicasOptimizer `--sync` wrapped around the model's
        self.elastic = None  # `elastic_sync.ElasticSync`: --sync with the data queue
        self.towers, self.tower_applies = towers, 0
        self._tower_grads: list = []  # [[(gradient, variable)]], a tower's each

    def update(self, opt, grads_and_vars):
        """The mode's update of `grads_and_vars`: int64, the global step after it.

        With towers, each tower's model_fn applies once: the towers before the last
        are kept, and the last one's update applies their average (`towers.average`)."""
        if self.towers > 1:
            self.tower_applies += 1
            self._tower_grads.append(list(grads_and_vars))
            if len(self._tower_grads) < self.towers:
                return tf.constant(0, tf.int64)  # never run: the last tower's step is
            variables = [v for _, v in self._tower_grads[0]]
            by_tower = [{id(v): g for g, v in t} for t in self._tower_grads]
            grads = towers_lib.average([[t.get(id(v)) for v in variables] for t in by_tower],
                                       self._worker)
            grads_and_vars = list(zip(grads, variables))
        if self._worker:
            grads_and_vars = fused_transfer.fuse_gradients(grads_and_vars, self._worker)
        if not self._sync:
            return exact.counted_update(opt, grads_and_vars, self._global_step,
                                        self._config.train_steps, span=self._span)
        if self._span is not None:
            return self._elastic_update(opt, grads_and_vars)
        # The step's value is the token it took, which the chief's sync op fills with the
        # global step after its update: a worker stops as soon as the last step is done
        # (only the sync op moves global_step). Not a read of global_step after the token:
        # that costs two more hops, ~0.6 ms a step (benchmarks/NOTES.md).
        self.runtime_sync = v1.train.SyncReplicasOptimizer(
            opt, replicas_to_aggregate=self._config.replicas_to_aggregate or self._num_workers,
            total_num_replicas=self._num_workers)
        return tf.identity(self.runtime_sync.apply_gradients(
            grads_and_vars, global_step=self._global_step))

    def _elastic_update(self, opt, grads_and_vars):
        """The data queue's sync step (`elastic_sync`): aggregated over the live workers,
        at most --replicas_to_aggregate or the declared workers, at least --min_replicas."""
        config = self._config
        cap = config.replicas_to_aggregate or (self._cluster.num_workers if self._cluster
                                               else 1)
        # Outside the step's wait for its global_step read: the sync's own state (local
        # variables) is initialized at local init, before global_step may be read.
        with tf.control_dependencies(None):
            self.elastic = elastic_sync.ElasticSync(
                self._span, opt, grads_and_vars, self._global_step, self._local_step,
                config.train_steps, cap, config.min_replicas, config.sync_live_secs,
                self._span.worker)
            return self.elastic.push()

    def sync_hook(self, sync_opt, is_chief: bool, num_tokens: int = -1):
        """The runtime's `hooks.SyncReplicasHook` for `sync_opt` (stops at the last step)."""
        hook = hooks.SyncReplicasHook(
            sync_opt, is_chief, self._global_step, self._config.train_steps,
            self._config.sync_timeout_secs, self._silent_peers, num_tokens=num_tokens)
        self.sync_hooks.append(hook)
        return hook

    def _silent_peers(self) -> list:
        return probes.silent_sync_peers(self._cluster)


def _step_value(spec, cap, global_step, last_step: int, cluster, model: ModelFnModel):
    """int64 scalar: the global step after a run of the model's step.

    The captured step's own value when the runtime made it; after a
    `SyncReplicasOptimizer`'s apply, the token it took (the global step after the
    chief's update); else a read of global_step after the model's train_op.
    """
    train_op = spec.train_op
    if cap.step is not None and _depends_on(train_op, cap.step):
        return _after(train_op, cap.step)
    if cap.sync_optimizer is not None:  # the chief's sync op moves global_step
        if not isinstance(train_op, tf.Operation):  # the token (a lazily read local step)
            return tf.identity(train_op)
        with tf.control_dependencies([train_op]):
            return global_step.read_value()
    if not _writes(train_op, global_step):
        raise errors.ModelFnError(
            f"model_fn {user.name(model.model_fn)}: its train_op does not increment the global "
            "step, so the run would never end: pass global_step=tf.compat.v1.train."
            "get_global_step() to the optimizer's minimize (or apply_gradients)")
    if cluster is not None and cluster.num_workers != 1:
        logging.warning(
            "the model_fn's train_op does not apply a tf.compat.v1.train.Optimizer with the "
            "global step: its steps are run as built, and an async run may end up to "
            "(workers - 1) steps past --train_steps=%d", last_step)
    with tf.control_dependencies([train_op]):
        return global_step.read_value()


def _ancestors(train_op):
    """Every op running `train_op` runs (its inputs' and control inputs' ancestry)."""
    seen, stack = set(), [train_op.op if isinstance(train_op, tf.Tensor) else train_op]
    while stack:
        op = stack.pop()
        if op in seen:
            continue
        seen.add(op)
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    return seen


def _depends_on(train_op, tensor) -> bool:
    """Whether running `train_op` runs `tensor`'s op."""
    return tensor.op in _ancestors(train_op)


# Ops that write a resource variable in place: one of them on global_step's handle moves it.
_WRITES = ("AssignAddVariableOp", "AssignVariableOp", "ResourceCountUpTo", "AssignSubVariableOp")


def _writes(train_op, global_step) -> bool:
    """Whether running `train_op` writes `global_step` (a graph walk, before anything runs)."""
    handle = global_step.handle.op
    return any(op.type in _WRITES and op.inputs and op.inputs[0].op is handle
               for op in _ancestors(train_op))


def _after(train_op, step):
    """`step`, fetched after the rest of `train_op` (the user's grouped ops) has run."""
    if isinstance(train_op, tf.Tensor) and train_op is step:
        return step
    with tf.control_dependencies([train_op]):
        return tf.identity(step)
