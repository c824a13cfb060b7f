"""`RunConfig`: an Estimator's settings and its place in a cluster, read from TF_CONFIG.

Reproduces tensorflow_estimator 2.15's `run_config.py` as observed
(tests/fixtures/estimator215/run_config.json, every row): the defaults
(save_checkpoints_secs 600 unless save_checkpoints_steps is given,
save_summary_steps 100, keep_checkpoint_max 5, keep_checkpoint_every_n_hours
10000, log_step_count_steps 100, session_creation_timeout_secs 7200), the
validation messages, `replace()` and its allowed keys, and TF_CONFIG
(`{"cluster": {...}, "task": {"type", "index"}, "session_master",
"eval_session_master", "model_dir", "service"}`):

- no cluster: task worker/0 only, is_chief, master "" (or session_master);
- a cluster needs exactly one "chief" (or, in the legacy form, one "master"
  and no chief); is_chief = the chief (master); num_worker_replicas = workers
  + chief; global_id_in_cluster orders chief, other jobs sorted, ps last;
  master "grpc://<own address>" unless the cluster is one task (then "");
  session_config gets 2.15's device_filters;
- an evaluator is outside the cluster: empty cluster_spec, 0 replicas,
  global_id_in_cluster None, any index.

The distribution-strategy arguments are stored and returned but not used
(lowlevel's runtime places variables itself).
"""

from __future__ import annotations

import copy
import json
import os

import tensorflow as tf

from lowlevel.models.spec import fn_args

logging = tf.compat.v1.logging  # the 'tensorflow' logger, as tensorflow_estimator 2.15 logs

_USE_DEFAULT = object()
_DEFAULT_REPLACEABLE_LIST = [
    "model_dir", "tf_random_seed", "save_summary_steps", "save_checkpoints_steps",
    "save_checkpoints_secs", "session_config", "keep_checkpoint_max",
    "keep_checkpoint_every_n_hours", "log_step_count_steps", "train_distribute", "device_fn",
    "protocol", "eval_distribute", "experimental_distribute",
    "experimental_max_worker_delay_secs", "session_creation_timeout_secs",
    "checkpoint_save_graph_def"]
_SAVE_CKPT_ERR = "`save_checkpoints_steps` and `save_checkpoints_secs` cannot be both set."
_LOCAL_MASTER = ""
_NOTE = "\n\nNote that these values may be coming from the TF_CONFIG environment variable."


class TaskType:
    """The job names of a TF_CONFIG cluster."""

    MASTER = "master"
    PS = "ps"
    WORKER = "worker"
    CHIEF = "chief"
    EVALUATOR = "evaluator"


def get_default_session_config():
    """2.15's default session config: allow_soft_placement, one meta-optimizer pass."""
    return tf.compat.v1.ConfigProto(allow_soft_placement=True, graph_options=_graph_options())


def _graph_options():
    from tensorflow.core.protobuf import rewriter_config_pb2
    rewrite = rewriter_config_pb2.RewriterConfig(
        meta_optimizer_iterations=rewriter_config_pb2.RewriterConfig.ONE)
    return tf.compat.v1.GraphOptions(rewrite_options=rewrite)


def path_to_str(path):
    """A path-like object as a str (other values unchanged)."""
    if hasattr(path, "__fspath__"):
        path = tf.compat.as_str_any(path.__fspath__())
    return path


def _validate_task(cluster_spec, task_env, chief_task_type):
    if chief_task_type not in cluster_spec.jobs:
        raise ValueError(
            f'If "cluster" is set in TF_CONFIG, it must have one "{chief_task_type}" node.')
    if len(cluster_spec.job_tasks(chief_task_type)) > 1:
        raise ValueError(
            f'The "cluster" in TF_CONFIG must have only one "{chief_task_type}" node.')
    task_type, task_id = task_env.get("type"), task_env.get("index")
    if not task_type:
        raise ValueError('If "cluster" is set in TF_CONFIG, task type must be set.')
    if task_id is None:
        raise ValueError('If "cluster" is set in TF_CONFIG, task index must be set.')
    task_id = int(task_id)
    if task_id < 0:
        raise ValueError("Task index must be non-negative number.")
    if task_type == TaskType.EVALUATOR:
        return task_type, task_id
    if task_type not in cluster_spec.jobs:
        raise ValueError(f"{task_type} is not a valid task_type in the cluster_spec:\n"
                         f"{cluster_spec}{_NOTE}")
    if not 0 <= task_id < len(cluster_spec.job_tasks(task_type)):
        raise ValueError(f"{task_id} is not a valid task_id for task_type {task_type} in the "
                         f"cluster_spec:\n{cluster_spec}{_NOTE}")
    return task_type, task_id


def _global_id(cluster_spec, task_type, task_id, chief_task_type):
    order = [chief_task_type] + [t for t in sorted(cluster_spec.jobs)
                                 if t not in (chief_task_type, TaskType.PS)]
    if TaskType.PS in cluster_spec.jobs:
        order.append(TaskType.PS)
    next_id = 0
    for job in order:
        if job == task_type:
            return next_id + task_id
        next_id += len(cluster_spec.job_tasks(job))
    raise RuntimeError(f"Internal Error: `task_type` ({task_type}) is not in cluster_spec "
                       f"({cluster_spec}).")


def _session_master(cluster_spec, task_type, task_id, tf_config):
    if "session_master" in tf_config:
        return tf_config["session_master"]
    jobs = cluster_spec.jobs
    if len(jobs) == 1 and len(cluster_spec.job_tasks(jobs[0])) == 1:
        return _LOCAL_MASTER
    return "grpc://" + cluster_spec.job_tasks(task_type)[task_id]


def _model_dir(tf_config, model_dir):
    if model_dir == "":
        raise ValueError("model_dir should be non-empty.")
    in_tf_config = tf_config.get("model_dir")
    if in_tf_config == "":
        raise ValueError("model_dir in TF_CONFIG should be non-empty.")
    if in_tf_config:
        if model_dir and in_tf_config != model_dir:
            raise ValueError(
                "`model_dir` provided in RunConfig construct, if set, must have the same "
                "value as the model_dir in TF_CONFIG. model_dir: {}\nTF_CONFIG[\"model_dir\"]: "
                "{}.\n".format(model_dir, in_tf_config))
        logging.info("Using model_dir in TF_CONFIG: %s", in_tf_config)
    return model_dir or in_tf_config


def _check(config, name, cond, message):
    value = getattr(config, name)
    if value is not None and not cond(value):
        raise ValueError(message)


def _validate_properties(config):
    _check(config, "model_dir", bool, "model_dir should be non-empty")
    _check(config, "save_summary_steps", lambda v: v >= 0, "save_summary_steps should be >= 0")
    _check(config, "save_checkpoints_steps", lambda v: v >= 0,
           "save_checkpoints_steps should be >= 0")
    _check(config, "save_checkpoints_secs", lambda v: v >= 0,
           "save_checkpoints_secs should be >= 0")
    _check(config, "session_config", lambda v: isinstance(v, tf.compat.v1.ConfigProto),
           "session_config must be instance of ConfigProto")
    _check(config, "keep_checkpoint_max", lambda v: v >= 0, "keep_checkpoint_max should be >= 0")
    _check(config, "keep_checkpoint_every_n_hours", lambda v: v > 0,
           "keep_checkpoint_every_n_hours should be > 0")
    _check(config, "log_step_count_steps", lambda v: v > 0, "log_step_count_steps should be > 0")
    _check(config, "tf_random_seed", lambda v: isinstance(v, int),
           "tf_random_seed must be integer.")
    _check(config, "experimental_max_worker_delay_secs", lambda v: isinstance(v, int),
           "experimental_max_worker_delay_secs must be an integer if set.")
    _check(config, "session_creation_timeout_secs", lambda v: v > 0,
           "session_creation_timeout_secs should be > 0")
    _check(config, "device_fn", lambda v: callable(v) and set(fn_args(v)) == {"op"},
           'device_fn must be callable with exactly one argument "op".')
    _check(config, "protocol", lambda v: v in (None, "grpc", "grpc+verbs"),
           "protocol should be grpc or grpc+verbs")


def _save_checkpoint_defaults(steps, secs):
    if steps is _USE_DEFAULT and secs is _USE_DEFAULT:
        return None, 600
    if secs is _USE_DEFAULT:
        return steps, None
    if steps is _USE_DEFAULT:
        return None, secs
    if steps is not None and secs is not None:
        raise ValueError(_SAVE_CKPT_ERR)
    return steps, secs


def _read_only(name):
    return property(lambda self: getattr(self, "_" + name), doc=f"The {name} setting.")


class RunConfig:
    """An Estimator's run settings (tf.estimator.RunConfig of 2.15), TF_CONFIG read at construction.

    Raises ValueError/TypeError with 2.15's messages for invalid settings or
    an invalid TF_CONFIG (see the module docstring).
    """

    def __init__(self, model_dir=None, tf_random_seed=None, save_summary_steps=100,
                 save_checkpoints_steps=_USE_DEFAULT, save_checkpoints_secs=_USE_DEFAULT,
                 session_config=None, keep_checkpoint_max=5,
                 keep_checkpoint_every_n_hours=10000, log_step_count_steps=100,
                 train_distribute=None, device_fn=None, protocol=None, eval_distribute=None,
                 experimental_distribute=None, experimental_max_worker_delay_secs=None,
                 session_creation_timeout_secs=7200, checkpoint_save_graph_def=True):
        steps, secs = _save_checkpoint_defaults(save_checkpoints_steps, save_checkpoints_secs)
        tf_config = json.loads(os.environ.get("TF_CONFIG", "{}"))
        if tf_config:
            logging.info("TF_CONFIG environment variable: %s", tf_config)
        RunConfig._replace(
            self, allowed_properties_list=_DEFAULT_REPLACEABLE_LIST,
            model_dir=_model_dir(tf_config, path_to_str(model_dir)),
            tf_random_seed=tf_random_seed, save_summary_steps=save_summary_steps,
            save_checkpoints_steps=steps, save_checkpoints_secs=secs,
            session_config=session_config, keep_checkpoint_max=keep_checkpoint_max,
            keep_checkpoint_every_n_hours=keep_checkpoint_every_n_hours,
            log_step_count_steps=log_step_count_steps, train_distribute=train_distribute,
            device_fn=device_fn, protocol=protocol, eval_distribute=eval_distribute,
            experimental_distribute=experimental_distribute,
            experimental_max_worker_delay_secs=experimental_max_worker_delay_secs,
            session_creation_timeout_secs=session_creation_timeout_secs,
            checkpoint_save_graph_def=checkpoint_save_graph_def)
        self._init_from_tf_config(tf_config)
        if not self._session_config and self._cluster_spec:
            RunConfig._replace(self, allowed_properties_list=_DEFAULT_REPLACEABLE_LIST,
                               session_config=self._distributed_session_config())

    def _distributed_session_config(self):
        filters = {
            TaskType.MASTER: ["/job:ps", "/job:master"],
            TaskType.CHIEF: ["/job:ps", "/job:chief"],
            TaskType.WORKER: ["/job:ps", f"/job:worker/task:{self._task_id}"],
            TaskType.PS: ["/job:ps", "/job:worker", "/job:chief", "/job:master"],
        }.get(self._task_type)
        if filters is None:
            return None
        return tf.compat.v1.ConfigProto(allow_soft_placement=True,
                                        graph_options=_graph_options(), device_filters=filters)

    def _init_from_tf_config(self, tf_config):
        service = tf_config.get("service")
        if service is not None and not isinstance(service, dict):
            raise TypeError(
                f'If "service" is set in TF_CONFIG, it must be a dict. Given {type(service)}')
        self._service = service
        self._cluster_spec = tf.train.ClusterSpec(tf_config.get("cluster", {}))
        task_env = tf_config.get("task", {})
        if self._cluster_spec and TaskType.MASTER in self._cluster_spec.jobs:
            self._init_with_master(tf_config, task_env)
        elif self._cluster_spec:
            self._init_with_chief(tf_config, task_env)
        else:
            self._init_local(tf_config, task_env)

    def _init_local(self, tf_config, task_env):
        self._task_type = task_env.get("type", TaskType.WORKER)
        self._task_id = int(task_env.get("index", 0))
        self._global_id_in_cluster = 0
        if self._task_type != TaskType.WORKER:
            raise ValueError('If "cluster" is not set in TF_CONFIG, task type must be WORKER.')
        if self._task_id != 0:
            raise ValueError('If "cluster" is not set in TF_CONFIG, task index must be 0.')
        self._master = tf_config.get("session_master", _LOCAL_MASTER)
        self._evaluation_master = tf_config.get("eval_session_master", _LOCAL_MASTER)
        self._is_chief = True
        self._num_ps_replicas = 0
        self._num_worker_replicas = 1

    def _init_with_chief(self, tf_config, task_env):
        spec = self._cluster_spec
        self._task_type, self._task_id = _validate_task(spec, task_env, TaskType.CHIEF)
        self._evaluation_master = (tf_config.get("eval_session_master", _LOCAL_MASTER)
                                   if self._task_type == TaskType.EVALUATOR else _LOCAL_MASTER)
        if self._task_type != TaskType.EVALUATOR:
            self._master = _session_master(spec, self._task_type, self._task_id, tf_config)
            self._num_ps_replicas = len(spec.as_dict().get(TaskType.PS, []))
            self._num_worker_replicas = (len(spec.as_dict().get(TaskType.WORKER, [])) +
                                         len(spec.as_dict().get(TaskType.CHIEF, [])))
            self._global_id_in_cluster = _global_id(spec, self._task_type, self._task_id,
                                                    TaskType.CHIEF)
        else:
            self._cluster_spec = tf.train.ClusterSpec({})
            self._master = _LOCAL_MASTER
            self._num_ps_replicas = 0
            self._num_worker_replicas = 0
            self._global_id_in_cluster = None
        self._is_chief = self._task_type == TaskType.CHIEF

    def _init_with_master(self, tf_config, task_env):
        spec = self._cluster_spec
        if TaskType.CHIEF in spec.jobs:
            raise ValueError("If `master` node exists in `cluster`, job `chief` is not supported.")
        self._task_type, self._task_id = _validate_task(spec, task_env, TaskType.MASTER)
        if self._task_type == TaskType.EVALUATOR:
            raise ValueError(
                "If `master` node exists in `cluster`, task_type `evaluator` is not supported.")
        self._global_id_in_cluster = _global_id(spec, self._task_type, self._task_id,
                                                TaskType.MASTER)
        self._master = _session_master(spec, self._task_type, self._task_id, tf_config)
        self._evaluation_master = _LOCAL_MASTER
        self._num_ps_replicas = len(spec.as_dict().get(TaskType.PS, []))
        self._num_worker_replicas = (len(spec.as_dict().get(TaskType.WORKER, [])) +
                                     len(spec.as_dict().get(TaskType.MASTER, [])))
        self._is_chief = self._task_type == TaskType.MASTER

    for _name in ["cluster_spec", "device_fn", "evaluation_master", "is_chief", "master",
                  "num_ps_replicas", "num_worker_replicas", "task_id", "global_id_in_cluster",
                  "experimental_max_worker_delay_secs", "task_type", "tf_random_seed",
                  "save_summary_steps", "save_checkpoints_secs", "session_config",
                  "save_checkpoints_steps", "checkpoint_save_graph_def", "keep_checkpoint_max",
                  "session_creation_timeout_secs", "keep_checkpoint_every_n_hours",
                  "log_step_count_steps", "model_dir", "service", "train_distribute",
                  "eval_distribute", "protocol"]:
        locals()[_name] = _read_only(_name)
    del _name

    def replace(self, **kwargs):
        """A new RunConfig with the given settings replaced (2.15's allowed keys and errors).

        Raises ValueError "Replacing <key> is not supported. Allowed properties
        are [...]." for other keys, and the constructor's validation errors.
        Setting one of save_checkpoints_steps/secs (not None) clears the other.
        """
        return RunConfig._replace(copy.deepcopy(self),
                                  allowed_properties_list=_DEFAULT_REPLACEABLE_LIST, **kwargs)

    @staticmethod
    def _replace(config, allowed_properties_list=None, **kwargs):
        allowed = allowed_properties_list or []
        for key, value in kwargs.items():
            if key not in allowed:
                raise ValueError(
                    f"Replacing {key} is not supported. Allowed properties are {allowed}.")
            setattr(config, "_" + key, value)
        steps, secs = config.save_checkpoints_steps, config.save_checkpoints_secs
        if "save_checkpoints_steps" in kwargs and "save_checkpoints_secs" in kwargs:
            if steps is not None and secs is not None:
                raise ValueError(_SAVE_CKPT_ERR)
        elif "save_checkpoints_steps" in kwargs and steps is not None:
            config._save_checkpoints_secs = None
        elif "save_checkpoints_secs" in kwargs and secs is not None:
            config._save_checkpoints_steps = None
        _validate_properties(config)
        return config
