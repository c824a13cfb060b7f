"""What a training task trains: a built-in model on its data set, or a user's model_fn.

One runtime trains both (`training.train`): it asks the trainable for its graph,
and after the run for its final evaluation and its export.

- `Builtin`: `--model=softmax|mlp|cnn|wide_deep` on `--dataset` (`graph.build`: the
  exact mode's fused transfers and products on the ps, the communication-reduced
  mode; evaluated on the test split inside the chief's session; exported as
  `export/<global_step>/`).
- `ModelFn`: an Estimator `model_fn` with its input_fn(s) and params — named on the
  command line (`--model=package.module:function --input_fn=... --params=JSON`,
  `for_config`) or given by `lowlevel.estimator` (`model_graph.build`; evaluated
  after the run from the final checkpoint when it has an eval input_fn; exported by
  the Estimator's exporters, not here).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from typing import Callable, Optional

from absl import logging

from lowlevel import output_layout
from lowlevel.cluster.spec import EVALUATOR, Cluster, Task
from lowlevel.config import TrainConfig
from lowlevel.models import user
from lowlevel.models.model_fn_model import ModelFnModel
from lowlevel.models.run_config import RunConfig


class Builtin:
    """A built-in model on its data set (`data.catalogue.load_for(config)`).

    Attributes:
      data: the data set (`images.DataSet` or `ctr.CtrDataSet`).
    """

    def __init__(self, config: TrainConfig):
        from lowlevel.data import catalogue
        self.data = catalogue.load_for(config)
        self.description = f"{config.model} on " + (
            self.data.description if hasattr(self.data, "description") else
            f"{self.data.name} ({len(self.data.train)} train / {len(self.data.test)} test "
            "examples)")

    def build(self, config: TrainConfig, cluster: Optional[Cluster], task: Task,
              worker_gpu: int, preempted: threading.Event):
        """The task's `graph.TrainGraph` (`graph.build`)."""
        from lowlevel.runtime import graph
        return graph.build(config, self.data, cluster, task, worker_gpu, preempted)

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

    def __init__(self, model: ModelFnModel, eval_input_fn: Optional[Callable] = None,
                 description: str = "a model_fn"):
        self.model = model
        self.eval_input_fn = eval_input_fn
        self.description = description

    def build(self, config: TrainConfig, cluster: Optional[Cluster], task: Task,
              worker_gpu: int, preempted: threading.Event):
        """The task's `graph.TrainGraph` (`model_graph.build`)."""
        from lowlevel.runtime import model_graph
        return model_graph.build(config, self.model, cluster, task, worker_gpu, preempted)

    def final_evaluation(self, g, config: TrainConfig, checkpoint: Optional[str]) -> dict:
        """The model's EVAL metrics (its eval_metric_ops, `loss`, `global_step`) on the eval
        input_fn, from `checkpoint`, as `Estimator.evaluate` gives them; {} without one."""
        if self.eval_input_fn is None or checkpoint is None:
            return {}
        from lowlevel.runtime import model_evaluation
        result = model_evaluation.evaluate(self.model, self.eval_input_fn,
                                           checkpoint_path=checkpoint)
        return {k: v.item() if hasattr(v, "item") else v for k, v in result.items()}

    def export(self, checkpoint: str, config: TrainConfig) -> Optional[str]:
        """None: a model_fn is exported by the Estimator's exporters (`lowlevel.estimator`)."""
        return None


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
