"""`Estimator`: tensorflow_estimator 2.15's tf.estimator.Estimator on TensorFlow 2.21.

The constructor, properties, `train`'s argument checks, `evaluate`,
`predict`, `export_saved_model`/`export_savedmodel`, `latest_checkpoint`,
`get_variable_names`/`get_variable_value` behave as 2.15's `estimator.py`
(same exception types and messages). The work is done below the entry
point: `train` makes ONE call to `lowlevel.runtime.model_training.train`
(the runtime lowlevel's cluster integration replaces), `evaluate` calls
`lowlevel.runtime.evaluation.evaluate_model_fn`, `predict`
`lowlevel.runtime.prediction.predict`, the exports
`lowlevel.outputs.serving.export_saved_model`, each with a
`lowlevel.models.model_fn_model.ModelFnModel` describing this Estimator.
Every graph is built in its own `tf.Graph()`: eager execution stays as the
caller has it.
"""

from __future__ import annotations

import copy
import tempfile

import tensorflow as tf

from lowlevel.models import run_config as run_config_lib
from lowlevel.models import spec as spec_lib
from lowlevel.models import warm_start as warm_start_lib
from lowlevel.models.model_fn_model import ModelFnModel
from lowlevel.outputs import all_modes_export, serving
from lowlevel.runtime import evaluation, model_training, prediction

logging = tf.compat.v1.logging  # the 'tensorflow' logger, as tensorflow_estimator 2.15 logs

v1 = tf.compat.v1


def _check_hooks_type(hooks):
    hooks = list(hooks or [])
    for hook in hooks:
        if not isinstance(hook, v1.train.SessionRunHook):
            raise TypeError(f"Hooks must be a SessionRunHook, given: {hook}")
    return hooks


def _check_listeners_type(saving_listeners):
    listeners = list(saving_listeners or [])
    for listener in listeners:
        if not isinstance(listener, v1.train.CheckpointSaverListener):
            raise TypeError("saving_listeners must be a list of CheckpointSaverListener, "
                            f"given: {listener}")
    return listeners


def _check_checkpoint_available(model_dir):
    if not tf.train.latest_checkpoint(model_dir):
        raise ValueError(f"Could not find trained model in model_dir: {model_dir}.")


def _global_step_in(model_dir) -> int:
    try:
        reader = v1.train.NewCheckpointReader(tf.train.latest_checkpoint(model_dir))
        return reader.get_tensor(v1.GraphKeys.GLOBAL_STEP)
    except Exception:  # noqa: BLE001 (2.15: no readable checkpoint counts as step 0)
        return 0


def config_with_model_dir(config, model_dir):
    """The RunConfig an Estimator uses (2.15's `maybe_overwrite_model_dir_and_session_config`).

    None -> RunConfig(); not a RunConfig -> ValueError; no session_config ->
    the default one; model_dir given in both with different values ->
    ValueError; neither -> a new temporary directory (logged as a warning
    "Using temporary folder as model directory: <dir>").
    """
    if config is None:
        config = run_config_lib.RunConfig()
        logging.info("Using default config.")
    if not isinstance(config, run_config_lib.RunConfig):
        raise ValueError(f"config must be an instance of `RunConfig`, but provided {config}.")
    if config.session_config is None:
        config = config.replace(session_config=run_config_lib.get_default_session_config())
    model_dir = run_config_lib.path_to_str(model_dir)
    if model_dir is not None and config.model_dir is not None and config.model_dir != model_dir:
        raise ValueError(
            "`model_dir` are set both in constructor and `RunConfig`, but with different "
            f"values. In constructor: '{model_dir}', in `RunConfig`: '{config.model_dir}' ")
    if model_dir:
        config = config.replace(model_dir=model_dir)
    elif config.model_dir is None:
        model_dir = tempfile.mkdtemp()
        logging.warning("Using temporary folder as model directory: %s", model_dir)
        config = config.replace(model_dir=model_dir)
    return config


_ALLOWED_OVERRIDES = {"model_fn", "_create_and_assert_global_step", "_export_all_saved_models",
                      "latest_checkpoint"}


def _assert_members_are_not_overridden(cls, obj):
    """2.15's rule: a subclass may not redefine Estimator's members (but a few)."""
    members = {m for m in dir(cls) if not m.startswith("__")}
    overridden = [m for m in (members & set(obj.__class__.__dict__)) - _ALLOWED_OVERRIDES
                  if getattr(cls, m) != getattr(obj.__class__, m)]
    if overridden:
        raise ValueError("Subclasses of Estimator cannot override members of Estimator. "
                         f"{obj.__class__} does override {overridden}")


class Estimator:
    """tf.estimator.Estimator (2.15): trains, evaluates, predicts with and exports a model_fn.

    Args (as 2.15): model_fn(features, labels, mode, params, config) — any
    subset but features — returning an EstimatorSpec; model_dir (default
    config.model_dir, else a temporary directory); config (RunConfig);
    params (dict, deep-copied); warm_start_from (a checkpoint path, a
    SavedModel directory or WarmStartSettings). Raises ValueError
    "model_fn must be provided to Estimator." and the model_fn argument
    errors of `lowlevel.models.spec.verify_model_fn_args`.
    """

    def __init__(self, model_fn, model_dir=None, config=None, params=None,
                 warm_start_from=None):
        _assert_members_are_not_overridden(Estimator, self)
        self._config = config_with_model_dir(config, model_dir)
        self._model_dir = self._config.model_dir
        self._session_config = self._config.session_config
        logging.info("Using config: %s", str(vars(self._config)))
        if model_fn is None:
            raise ValueError("model_fn must be provided to Estimator.")
        spec_lib.verify_model_fn_args(model_fn, params)
        self._model_fn = model_fn
        self._params = copy.deepcopy(params or {})
        self._warm_start_settings = warm_start_lib.default_settings(warm_start_from)

    @property
    def model_dir(self):
        """The directory of checkpoints, summaries and `eval/` (str)."""
        return self._model_dir

    @property
    def config(self):
        """A deep copy of the RunConfig."""
        return copy.deepcopy(self._config)

    @property
    def params(self):
        """A deep copy of the params dict."""
        return copy.deepcopy(self._params)

    @property
    def model_fn(self):
        """`model_fn(features, labels, mode, config)` calling this Estimator's model_fn."""
        def public_model_fn(features, labels, mode, config):
            return spec_lib.call_model_fn(self._model_fn, features, labels, mode,
                                          self.params, config)
        return public_model_fn

    def _model(self, input_fn=None) -> ModelFnModel:
        return ModelFnModel(model_fn=self._model_fn, params=self.params, run_config=self.config,
                            model_dir=self._model_dir, warm_start=self._warm_start_settings,
                            input_fn=input_fn)

    def get_variable_value(self, name):
        """The value (numpy) of variable `name` in the latest checkpoint; ValueError if none."""
        _check_checkpoint_available(self.model_dir)
        return tf.train.load_variable(self.model_dir, name)

    def get_variable_names(self):
        """Names of the variables in the latest checkpoint; ValueError if there is none."""
        _check_checkpoint_available(self.model_dir)
        return [name for name, _ in tf.train.list_variables(self.model_dir)]

    def latest_checkpoint(self):
        """The latest checkpoint prefix in model_dir, or None."""
        return tf.train.latest_checkpoint(self.model_dir)

    def eval_dir(self, name=None):
        """`<model_dir>/eval` or `<model_dir>/eval_<name>`."""
        return evaluation.eval_dir(self._model_dir, name)

    def train(self, input_fn, hooks=None, steps=None, max_steps=None, saving_listeners=None):
        """Trains on `input_fn` for `steps` more steps or up to `max_steps`; returns self.

        As 2.15: ValueError for an evaluator or ps task ("Train has been called
        wrong configuration. ..."), for both steps and max_steps ("Can not
        provide both steps and max_steps."), for steps/max_steps <= 0 ("Must
        specify steps > 0, given: ..." / "Must specify max_steps > 0, given:
        ..."); when the checkpoint's global_step >= max_steps, logs "Skipping
        training since max_steps has already saved." and returns at once.
        TypeError for hooks/listeners of the wrong type.
        """
        if self._config.task_type in (run_config_lib.TaskType.EVALUATOR,
                                      run_config_lib.TaskType.PS):
            raise ValueError(
                "Train has been called wrong configuration. Please use "
                "tf.estimator.train_and_evaluate which calls proper API according to given "
                f"configuration. Current configuration: {self.config}.")
        if steps is not None and max_steps is not None:
            raise ValueError("Can not provide both steps and max_steps.")
        if steps is not None and steps <= 0:
            raise ValueError(f"Must specify steps > 0, given: {steps}")
        if max_steps is not None and max_steps <= 0:
            raise ValueError(f"Must specify max_steps > 0, given: {max_steps}")
        if max_steps is not None and max_steps <= _global_step_in(self._model_dir):
            logging.info("Skipping training since max_steps has already saved.")
            return self
        hooks = _check_hooks_type(hooks)
        listeners = _check_listeners_type(saving_listeners)
        loss = model_training.train(self._model(input_fn), hooks=hooks, steps=steps,
                                    max_steps=max_steps, saving_listeners=listeners)
        logging.info("Loss for final step: %s.", loss)
        return self

    def evaluate(self, input_fn, steps=None, hooks=None, checkpoint_path=None, name=None):
        """Evaluates a checkpoint (default the latest) on `input_fn`; returns the metrics dict.

        {"loss": float32 mean loss, <eval_metric_ops keys>, "global_step":
        int64}; summaries go to `eval_dir(name)`. steps: update steps (None:
        until the input ends). Errors: see
        `lowlevel.runtime.evaluation.evaluate_model_fn`.
        """
        hooks = _check_hooks_type(hooks)
        return evaluation.evaluate_model_fn(self._model(), input_fn, steps=steps, hooks=hooks,
                                         checkpoint_path=checkpoint_path, name=name)

    def predict(self, input_fn, predict_keys=None, hooks=None, checkpoint_path=None,
                yield_single_examples=True):
        """Yields predictions for `input_fn`'s features (see `lowlevel.runtime.prediction`)."""
        hooks = _check_hooks_type(hooks)
        yield from prediction.predict(self._model(), input_fn, predict_keys=predict_keys,
                                      hooks=hooks, checkpoint_path=checkpoint_path,
                                      yield_single_examples=yield_single_examples)

    def export_saved_model(self, export_dir_base, serving_input_receiver_fn, assets_extra=None,
                           as_text=False, checkpoint_path=None,
                           experimental_mode=spec_lib.ModeKeys.PREDICT):
        """Exports the serving graph and a checkpoint to `<export_dir_base>/<timestamp>/`.

        Returns the directory (bytes, as 2.15). See
        `lowlevel.outputs.serving.export_saved_model` (default attributes
        stripped).
        """
        return serving.export_saved_model(
            self._model(), export_dir_base, serving_input_receiver_fn, assets_extra=assets_extra,
            as_text=as_text, checkpoint_path=checkpoint_path, strip_default_attrs=True,
            mode=experimental_mode)

    def experimental_export_all_saved_models(self, export_dir_base, input_receiver_fn_map,
                                             assets_extra=None, as_text=False,
                                             checkpoint_path=None):
        """One SavedModel with a MetaGraphDef per mode of {ModeKeys: receiver fn} (2.15's).

        Returns the directory (bytes). See `lowlevel.outputs.all_modes_export`.
        """
        return all_modes_export.export_all_saved_models(
            self._model(), export_dir_base, input_receiver_fn_map, assets_extra=assets_extra,
            as_text=as_text, checkpoint_path=checkpoint_path)

    def export_savedmodel(self, export_dir_base, serving_input_receiver_fn, assets_extra=None,
                          as_text=False, checkpoint_path=None, strip_default_attrs=False):
        """The deprecated name of `export_saved_model` (default attributes kept by default)."""
        logging.warning("export_savedmodel (from tensorflow_estimator) is deprecated: This "
                        "function has been renamed, use `export_saved_model` instead.")
        return serving.export_saved_model(
            self._model(), export_dir_base, serving_input_receiver_fn, assets_extra=assets_extra,
            as_text=as_text, checkpoint_path=checkpoint_path,
            strip_default_attrs=strip_default_attrs)

