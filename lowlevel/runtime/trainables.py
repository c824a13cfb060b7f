"""What a training task trains: a built-in model on its data set, or a user's model_fn.

One runtime trains both (`training.train`) through one graph (`graph.build`): it asks
the trainable for what differs — its model_fn and device function (`placed`), its
training input (`train_input`, a `TrainInput`), its final evaluation — and after the
run for its export.

- `Builtin`: `--model=softmax|mlp|cnn|wide_deep` on `--dataset`: the built-in model_fn
  (`models.catalogue.model_fn`) with the params of the flags and its tables'
  partitioner; its input the worker's shard of the data set or the data queue
  (`spans`); evaluated on the test split inside the chief's session; exported as
  `export/<global_step>/`.
- `ModelFn`: an Estimator `model_fn` with its input_fn(s) and params — named on the
  command line (`--model=package.module:function --input_fn=... --params=JSON`,
  `for_config`) or given by `lowlevel.estimator`; evaluated after the run from the
  final checkpoint when it has an eval input_fn; exported by the Estimator's exporters,
  not here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from typing import Callable, Optional

import tensorflow as tf
from absl import logging

from lowlevel import output_layout
from lowlevel.cluster.spec import EVALUATOR, Cluster, Task
from lowlevel.config import TrainConfig
from lowlevel.data import replaceable
from lowlevel.errors import UsageError
from lowlevel.models import catalogue as models
from lowlevel.models import input_fns, user
from lowlevel.models import spec as spec_lib
from lowlevel.models.model_fn_model import ModelFnModel
from lowlevel.models.optimizers import make_optimizer
from lowlevel.models.run_config import RunConfig
from lowlevel.runtime import evaluation, evaluator, placement, step


@dataclasses.dataclass
class TrainInput:
    """A worker's training input, built in its graph (`train_input`)."""

    features: object  # the model_fn's features: a Tensor or {name: Tensor}, batch-major
    labels: object  # its labels, batch-major: int64 `[b]` for the built-in models
    batch_size: int  # examples per run of the step on this worker, all towers; 0: unknown
    initializer: object = None  # run at local init (a data set's iterator), or None
    feed: Optional[dict] = None  # the initializer's feed
    span: Optional[object] = None  # `spans.SpanInput` with the data queue
    next_batch: Optional[Callable] = None  # () -> (features, labels): local steps in blocks
    hooks: tuple = ()  # the input_fn's `SessionRunHook`s


class Builtin:
    """A built-in model on its data set (`data.catalogue.load_for(config)`, unless given).

    Attributes:
      data: the data set (`images.DataSet`, `ctr.CtrDataSet` or `ctr_files.CtrFiles`).
    """

    ends_early = False  # trains to --train_steps: its workers skip the early end's watch

    def __init__(self, config: TrainConfig, data=None):
        from lowlevel.data import catalogue
        self.data = data if data is not None else catalogue.load_for(config)
        self.description = f"{config.model} on " + (
            self.data.description if hasattr(self.data, "description") else
            f"{self.data.name} ({len(self.data.train)} train / {len(self.data.test)} test "
            "examples)")

    def seed(self, config: TrainConfig) -> int:
        """The graph's seed: --seed."""
        return config.seed

    def towers(self, config: TrainConfig) -> Optional[int]:
        """--towers (None: one per device the worker has, `placement.towers`)."""
        return config.towers

    def placed(self, config: TrainConfig, cluster: Optional[Cluster], task: Task,
               worker_gpu: int, hub: Optional[str]):
        """(the `ModelFnModel`, the device function or None): the built-in model_fn with the
        params of `config` (`models.catalogue.params_for`) and, on a cluster, its tables'
        partitioner (`_placement`)."""
        device, partitioner = (self._placement(config, cluster, task, worker_gpu, hub)
                               if cluster else (None, None))
        params = models.params_for(config, self.data, partitioner,
                                   cluster.num_ps if cluster else 0)
        return (ModelFnModel(models.model_fn, params, run_config=None,
                             model_dir=config.output_dir or ""), device)

    def _placement(self, config: TrainConfig, cluster: Cluster, task: Task, worker_gpu: int,
                   hub: str):
        """(device function, variable partitioner or None) of a training task.

        The model's total bytes size the shards, and the plan balances the shards' bytes
        over the ps tasks (`placement`); both from one scratch build of the model
        (`placement.measure_sharded`).
        """
        sizes, tables, partitioner = placement.measure_sharded(
            lambda partitioner: models.for_config(config, self.data, partitioner,
                                                  cluster.num_ps)(self.data.probe_inputs()),
            lambda total, table_bytes: placement.partitioner(cluster.num_ps, total,
                                                             table_bytes))
        device = placement.device_setter(cluster.as_dict(), task.task_index, worker_gpu,
                                         sizes, task.job_name, tables, worker=hub)
        return device, partitioner

    def train_input(self, config: TrainConfig, cluster: Optional[Cluster], task: Task,
                    towers: int) -> TrainInput:
        """The worker's input: from the data queue (`_span_input`), else its fixed shard of
        the training split, in batches of --batch_size per tower."""
        span = self._span_input(config, cluster, task, towers)
        if span is not None:
            init, feed, iterator = span.initializer, {}, span
        else:
            if cluster and cluster.sparse:  # dynamic workers: the whole split, own order
                shards, shard, seed = 1, 0, config.seed + task.replica_index
            else:  # this worker's shard
                shards = (cluster.num_workers or 1) if cluster else 1
                shard, seed = task.replica_index, config.seed
            init, feed, iterator = self.data.train_iterator(config.batch_size * towers, shards,
                                                            shard, seed)
        features, labels = iterator.get_next()
        return TrainInput(features, labels, config.batch_size * towers, init, feed, span,
                          iterator.get_next)

    def _span_input(self, config: TrainConfig, cluster: Optional[Cluster], task: Task,
                    towers: int):
        """The worker's `spans.SpanInput` (the queue on ps 0) with --data_sharding=queue in
        effect (`TrainConfig.span_queue`), else None.

        Raises:
          UsageError: --data_sharding=queue on a worker with towers (the GPUs it found).
        """
        sync = bool(config.sync and cluster)
        if not config.span_queue(cluster is not None, sync):
            return None
        if towers > 1:
            if config.data_sharding == "queue":
                raise UsageError(f"--data_sharding=queue: not with towers ({towers} devices "
                                 "in this worker); give --towers=1 or --data_sharding=static")
            return None
        logging.info("data: %d span(s) (files) handed out by the queue on /job:ps/task:0",
                     len(self.data.train.files))
        cache = (output_layout.line_counts_file(config.output_dir)
                 if config.output_dir and config.count_examples else None)
        return self.data.span_input(config.batch_size, task.replica_index, "/job:ps/task:0",
                                    config.span_lease_secs, config.seed,
                                    config.count_examples, cache, sync=sync)

    def table_optimizer(self, config: TrainConfig) -> Callable:
        """`() ->` a new optimizer for the embedding tables in the communication-reduced mode
        (`step.build`): --optimizer at --lr."""
        return lambda: make_optimizer(config.optimizer, config.lr)

    def final_eval(self, model: ModelFnModel, preempted):
        """The chief's evaluation of the test split inside its session, after its last step
        (`evaluation.FinalEvalHook`; skipped once `preempted` is set)."""
        return evaluation.FinalEvalHook(
            evaluation.build(self.data, self.data.test, models.logits_fn(model.params)),
            skip=preempted)

    def checkpoint_evaluation(self, config: TrainConfig, on_train_data: bool = False,
                              session_config=None) -> "evaluator.BuiltinCheckpoints":
        """The evaluator's pass at each checkpoint (`evaluator.continuous_eval`): the test
        split (the training split with `on_train_data`), in one graph and session."""
        return evaluator.BuiltinCheckpoints(config, self.data, on_train_data, session_config)

    def final_evaluation(self, g, config: TrainConfig, checkpoint: Optional[str]) -> dict:
        """The chief's final evaluation, made inside its session (`evaluation.FinalEvalHook`)."""
        return g.final_eval.result if g.final_eval and g.final_eval.result else {}

    def export(self, checkpoint: str, config: TrainConfig) -> Optional[str]:
        """Exports `checkpoint` as `<output_dir>/export/<global_step>/` (`outputs.export`)."""
        from lowlevel.outputs import export
        return export.export(checkpoint, output_layout.export_base(config.output_dir), config,
                             self.data, config.keep_exports)


class ModelFn:
    """A user's model_fn (`ModelFnModel`), with the input_fn the chief evaluates with at the end.

    Args:
      model: the model_fn, params, run config, model_dir, warm start and training input_fn.
      eval_input_fn: the input_fn of the final evaluation (None: none).
      description: how the logs name it.
    """

    # A model's hook or the end of its input may stop the chief before --train_steps.
    ends_early = True

    def __init__(self, model: ModelFnModel, eval_input_fn: Optional[Callable] = None,
                 description: str = "a model_fn"):
        self.model = model
        self.eval_input_fn = eval_input_fn
        self.description = description

    def seed(self, config: TrainConfig) -> int:
        """The graph's seed: the run config's `tf_random_seed`, else --seed."""
        seed = getattr(self.model.run_config, "tf_random_seed", None)
        return config.seed if seed is None else seed

    def towers(self, config: TrainConfig) -> int:
        """--towers, else 1. A model_fn gets towers only when asked: whether it can share its
        variables shows only once built (a Keras layer cannot), and the default must not
        refuse a script that runs on one device (GPU task_index mod worker_gpu)."""
        return config.towers or 1

    def placed(self, config: TrainConfig, cluster: Optional[Cluster], task: Task,
               worker_gpu: int, hub: Optional[str]):
        """(the model, the device function or None): variables on the ps tasks by bytes (the
        model measured in a scratch graph, with its input), compute on the worker."""
        if not cluster:
            return self.model, None

        def probe():
            tf.compat.v1.train.get_or_create_global_step()
            features, labels, _ = self.call_input_fn()
            step.call_model_fn(self.model, features, labels)

        sizes, tables = placement.measure(probe)
        return self.model, placement.device_setter(cluster.as_dict(), task.task_index,
                                                   worker_gpu, sizes, task.job_name, tables,
                                                   worker=hub)

    def call_input_fn(self):
        """(features, labels, input hooks) of the training input_fn, in the current graph."""
        with user.calling("input_fn", self.model.input_fn):
            result = input_fns.call_input_fn(self.model.input_fn, spec_lib.ModeKeys.TRAIN,
                                             self.model.params,
                                             self.model.run_config)
            # a user's Dataset: no autotune thread for a replaced session to wait for
            return input_fns.features_and_labels(replaceable.without_autotune(result))

    def train_input(self, config: TrainConfig, cluster: Optional[Cluster], task: Task,
                    towers: int) -> TrainInput:
        """The training input_fn's batch; its size from the static leading dimension."""
        features, labels, input_hooks = self.call_input_fn()
        return TrainInput(features, labels, _batch_size(labels, features),
                          hooks=tuple(input_hooks))

    def table_optimizer(self, config: TrainConfig) -> None:
        """None: the communication-reduced mode updates a model_fn's tables with its own
        optimizer."""
        return None

    def final_eval(self, model: ModelFnModel, preempted) -> None:
        """None: a model_fn is evaluated after the run, from its final checkpoint."""
        return None

    def checkpoint_evaluation(self, config: TrainConfig, on_train_data: bool = False,
                              session_config=None) -> "evaluator.ModelFnCheckpoints":
        """The evaluator's pass at each checkpoint (`evaluator.continuous_eval`): the eval
        input_fn, as `Estimator.evaluate` runs it (`on_train_data`: the input_fn decides)."""
        return evaluator.ModelFnCheckpoints(config, self.model, self.eval_input_fn)

    def final_evaluation(self, g, config: TrainConfig, checkpoint: Optional[str]) -> dict:
        """The model's EVAL metrics (its eval_metric_ops, `loss`, `global_step`) on the eval
        input_fn, from `checkpoint`, as `Estimator.evaluate` gives them; {} without one."""
        if self.eval_input_fn is None or checkpoint is None:
            return {}
        return evaluation.as_record(evaluation.evaluate_model_fn(
            self.model, self.eval_input_fn, checkpoint_path=checkpoint))

    def export(self, checkpoint: str, config: TrainConfig) -> Optional[str]:
        """None: a model_fn is exported by the Estimator's exporters (`lowlevel.estimator`)."""
        return None


def _batch_size(labels, features) -> int:
    """The examples a step takes, from the input's static leading dimension; 0 if unknown."""
    for tensor in tf.nest.flatten(labels) + tf.nest.flatten(features):
        shape = getattr(tensor, "shape", None)
        if shape is not None and shape.rank and shape[0] is not None:
            return int(shape[0])
    return 0

def for_config(config: TrainConfig, cluster: Optional[Cluster], task: Task):
    """The trainable `config` names: `Builtin`, or `ModelFn` for --model=package.module:function.

    Raises:
      UsageError: a function named on the command line cannot be found (`models.user`).
      errors.DataError, errors.MovieLensError: a built-in model's data set cannot be read.
    """
    if config.builtin:
        return Builtin(config)
    model_fn = user.resolve(config.model, "--model")
    names = [n.strip() for n in config.input_fn.split(",")]
    train_fn = user.resolve(names[0], "--input_fn")
    eval_fn = user.resolve(names[1], "--input_fn") if len(names) > 1 else train_fn
    model = ModelFnModel(model_fn, json.loads(config.params or "{}"),
                         run_config_for(config, cluster, task), config.output_dir or "",
                         input_fn=train_fn)
    logging.info("%s: model_fn %s, input_fn %s", task.name, config.model, config.input_fn)
    return ModelFn(model, eval_fn, f"model_fn {config.model} on input_fn {config.input_fn}")


def run_config_for(config: TrainConfig, cluster: Optional[Cluster], task: Task) -> RunConfig:
    """The `RunConfig` a user's model_fn and input_fn get as `config`: this task's place in
    the cluster (as `TF_CONFIG` says it; from the flags if TF_CONFIG is not set), the run's
    model_dir, seed and checkpoint settings."""
    tf_config = None
    if cluster is not None and task.job_name != EVALUATOR:
        tf_config = json.dumps(estimator_tf_config(cluster, task))
    with _environment("TF_CONFIG", os.environ.get("TF_CONFIG") or tf_config):
        return RunConfig(model_dir=config.output_dir, tf_random_seed=config.seed,
                         save_checkpoints_steps=config.save_checkpoint_steps,
                         save_checkpoints_secs=(None if config.save_checkpoint_steps else
                                                config.save_checkpoint_secs),
                         keep_checkpoint_max=config.keep_checkpoint_max)


def estimator_tf_config(cluster: Cluster, task: Task) -> dict:
    """`TF_CONFIG` of `task` as tensorflow_estimator reads it: a cluster without a `chief`
    job has worker 0 as its chief (lowlevel's rule), which Estimator's RunConfig wants as a
    `chief` node: worker 0 becomes chief 0 and worker K worker K - 1."""
    spec = {job: list(hosts) for job, hosts in cluster.as_dict().items()}
    job, index = task.job_name, task.task_index
    if "chief" not in spec and spec.get("worker"):
        spec["chief"], spec["worker"] = spec["worker"][:1], spec["worker"][1:]
        if not spec["worker"]:
            del spec["worker"]
        if job == "worker":
            job, index = ("chief", 0) if index == 0 else ("worker", index - 1)
    return {"cluster": spec, "task": {"type": job, "index": index}}


@contextlib.contextmanager
def _environment(name: str, value: Optional[str]):
    """`os.environ[name]` is `value` (unset if None) within the block."""
    saved = os.environ.get(name)
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved
