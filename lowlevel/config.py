"""Typed, validated configuration of one training task.

Flags are parsed only at the edge (`lowlevel.trainer`); everything below takes a
`TrainConfig`. This module imports no TensorFlow so that the launcher and the
CLI can validate input before paying TensorFlow's multi-second import.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

MODELS = ("softmax", "mlp", "cnn")
DATASETS = ("digits", "mnist", "synthetic")
OPTIMIZERS = ("adagrad", "sgd", "momentum", "adam")

# What a task does (`--schedule`), as in tensor2tensor, and which jobs may do it;
# the first schedule of a job is its default.
TRAIN, RUN_STD_SERVER = "train", "run_std_server"
CONTINUOUS_EVAL, CONTINUOUS_EVAL_ON_TRAIN_DATA = "continuous_eval", "continuous_eval_on_train_data"
SCHEDULES = (TRAIN, RUN_STD_SERVER, CONTINUOUS_EVAL, CONTINUOUS_EVAL_ON_TRAIN_DATA)
JOB_SCHEDULES = {"chief": (TRAIN,), "worker": (TRAIN,), "ps": (RUN_STD_SERVER,),
                 "evaluator": (CONTINUOUS_EVAL, CONTINUOUS_EVAL_ON_TRAIN_DATA)}

# Learning rates used when --learning_rate is not given. Adagrad's 0.1 is the
# rate of TensorFlow's classic mnist_replica.py example (Adam's is its paper's).
DEFAULT_LEARNING_RATES = {"adagrad": 0.1, "sgd": 0.1, "momentum": 0.05, "adam": 0.001}


class UsageError(ValueError):
    """A configuration value is wrong. The message names the value and what is expected."""


class RuntimeFailure(RuntimeError):
    """Something outside the configuration failed (a task never came up, no checkpoint came).

    The message says what, and where to look. The trainer exits 1 on it.
    """


def check_schedule(schedule: str | None, job_name: str) -> str:
    """The schedule task `job_name` runs: `schedule`, or the job's default when None.

    Raises:
      UsageError: unknown schedule, or one the job cannot run (a ps only
        serves, an evaluator only evaluates, chief and workers train).
    """
    allowed = JOB_SCHEDULES[job_name]
    if schedule is None:
        return allowed[0]
    if schedule not in SCHEDULES:
        raise UsageError(f"--schedule={schedule}: expected one of {', '.join(SCHEDULES)}")
    if schedule not in allowed:
        raise UsageError(f"--schedule={schedule} cannot run on a {job_name} task: "
                         f"a {job_name} runs {' or '.join(allowed)}")
    return schedule


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """What one task trains and how.

    Attributes:
      model: one of `MODELS`.
      hidden_units: widths of the hidden layers (`mlp`: every layer; `cnn`: the
        dense layer after the convolutions uses the first).
      dataset: one of `DATASETS`.
      data_dir: directory holding MNIST files (`mnist` only); None lets Keras
        use its cache.
      optimizer: one of `OPTIMIZERS`.
      learning_rate: step size; None picks `DEFAULT_LEARNING_RATES[optimizer]`.
      batch_size: examples per worker step.
      train_steps: the global step to stop at (`StopAtStepHook(last_step=...)`).
      output_dir: checkpoints, summaries and metrics, shared by all tasks.
      save_checkpoint_steps / save_checkpoint_secs: checkpoint cadence; exactly
        one is used (steps win when both are set).
      keep_checkpoint_max: how many checkpoints the chief keeps.
      sync: synchronous training through `SyncReplicasOptimizer`.
      replicas_to_aggregate: gradients averaged per sync step; None means the
        number of workers.
      worker_gpu: GPUs per worker; None means the GPUs TensorFlow sees.
      seed: seed for initialisation and shuffling.
      log_every_secs: seconds between progress lines.
      intra_op_threads / inter_op_threads: TensorFlow thread pools per task;
        0 means "share the cores fairly among the tasks on this host".
      shutdown_timeout_secs: how long the chief waits, after its last step, for
        the other workers to report done before it stops the ps tasks anyway.
      startup_timeout_secs: how long a worker waits for the cluster (ps tasks,
        chief's initialisation) before giving up.
      eval_timeout_secs: how long an evaluator waits for a new checkpoint
        before giving up.
      sync_timeout_secs: sync mode: how long one sync step may wait for
        gradients before the chief reports which workers do not answer (it
        then keeps waiting; the step completes when they are back).
      warmup_steps: each task's first local steps, left out of its step-time
        figures (`<output_dir>/tasks/<task>.json`).
      communication_period: local steps each worker takes between exchanges
        with the ps (`lowlevel.local_sgd`: async, or with `sync` synchronous
        model averaging); 1 is the exact mode. No effect in-process.
      keep_exports: SavedModel exports kept in `<output_dir>/export/` (the
        newest, by global step); 0 writes none (`lowlevel.export`).
      export_every_checkpoint: the evaluator exports each checkpoint it
        evaluates (the chief exports the final one in any case).
    """

    model: str = "mlp"
    hidden_units: tuple[int, ...] = (128, 128)
    dataset: str = "digits"
    data_dir: Optional[str] = None
    optimizer: str = "adagrad"
    learning_rate: Optional[float] = None
    batch_size: int = 64
    train_steps: int = 2000
    output_dir: Optional[str] = None
    save_checkpoint_steps: Optional[int] = None
    save_checkpoint_secs: Optional[float] = 60.0
    keep_checkpoint_max: int = 5
    sync: bool = False
    replicas_to_aggregate: Optional[int] = None
    worker_gpu: Optional[int] = None
    seed: int = 0
    log_every_secs: float = 2.0
    intra_op_threads: int = 0
    inter_op_threads: int = 0
    shutdown_timeout_secs: float = 60.0
    startup_timeout_secs: float = 600.0
    eval_timeout_secs: float = 600.0
    sync_timeout_secs: float = 30.0
    warmup_steps: int = 20
    communication_period: int = 1
    keep_exports: int = 5
    export_every_checkpoint: bool = False

    @property
    def lr(self) -> float:
        """The learning rate in effect."""
        if self.learning_rate is not None:
            return self.learning_rate
        return DEFAULT_LEARNING_RATES[self.optimizer]

    def validate(self, num_workers: Optional[int] = 1) -> "TrainConfig":
        """Checks every field; returns self.

        `num_workers` bounds `replicas_to_aggregate`; None skips that check (an
        evaluator without the cluster's addresses).

        Raises:
          UsageError: naming the first bad value and what is expected.
        """
        _one_of("model", self.model, MODELS)
        _one_of("dataset", self.dataset, DATASETS)
        _one_of("optimizer", self.optimizer, OPTIMIZERS)
        _positive("batch_size", self.batch_size)
        _positive("train_steps", self.train_steps)
        _positive("keep_checkpoint_max", self.keep_checkpoint_max)
        if not self.hidden_units or any(u <= 0 for u in self.hidden_units):
            raise UsageError(
                f"--hidden_units={','.join(map(str, self.hidden_units))}: expected "
                "a comma-separated list of positive layer widths, e.g. 128,128")
        if self.learning_rate is not None and not self.learning_rate > 0:
            raise UsageError(f"--learning_rate={self.learning_rate}: expected a number > 0")
        if self.save_checkpoint_steps is not None:
            _positive("save_checkpoint_steps", self.save_checkpoint_steps)
        if self.save_checkpoint_secs is not None and not self.save_checkpoint_secs > 0:
            raise UsageError(f"--save_checkpoint_secs={self.save_checkpoint_secs}: expected > 0")
        if self.worker_gpu is not None and self.worker_gpu < 0:
            raise UsageError(f"--worker_gpu={self.worker_gpu}: expected 0 or more GPUs")
        if self.replicas_to_aggregate is not None and num_workers is not None:
            if not 1 <= self.replicas_to_aggregate <= num_workers:
                raise UsageError(
                    f"--replicas_to_aggregate={self.replicas_to_aggregate}: expected 1 to "
                    f"{num_workers}, the number of workers")
        _positive("communication_period", self.communication_period)
        if self.keep_exports < 0:
            raise UsageError(f"--keep_exports={self.keep_exports}: expected 0 (no export) or more")
        if self.warmup_steps < 0:
            raise UsageError(f"--warmup_steps={self.warmup_steps}: expected 0 or more")
        for name in ("startup_timeout_secs", "shutdown_timeout_secs", "eval_timeout_secs",
                     "sync_timeout_secs"):
            if not getattr(self, name) > 0:
                raise UsageError(f"--{name}={getattr(self, name)}: expected seconds > 0")
        for name in ("intra_op_threads", "inter_op_threads"):
            if getattr(self, name) < 0:
                raise UsageError(f"--{name}={getattr(self, name)}: expected 0 (auto) or more")
        return self


def _one_of(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise UsageError(f"--{name}={value}: expected one of {', '.join(allowed)}")


def _positive(name: str, value: int) -> None:
    if value <= 0:
        raise UsageError(f"--{name}={value}: expected a whole number > 0")
