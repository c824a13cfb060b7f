"""The canned estimators' optimizers: TF1 optimizers that keep 2.15's Keras names.

tensorflow_estimator 2.15's v2 canned estimators train with Keras optimizers
(`optimizers.get_optimizer_instance_v2`), whose checkpoint names a user's
model_dir holds: hyper-parameters `training/<Name>/<hyper>` (float32 scalars:
`training/Adagrad/learning_rate`, `training/Ftrl/l1_regularization_strength`,
...) and slots `training/<Name>/<variable>/<slot>` (`.../accumulator`,
`.../linear`, `.../m`). Keras optimizers do not build TF1 graphs on
TensorFlow 2.21 (Keras 3), and lowlevel's runtime takes over a
`tf.compat.v1.train.Optimizer`'s `apply_gradients` (the counted update, sync):
so these are `tf.compat.v1.train.Optimizer`s whose variables carry those names
and whose updates are Keras' (the same fused kernels: `ResourceApplyAdagradV2`
with Keras' epsilon 1e-7, `ResourceApplyFtrl` with `l2 + beta / (2 lr)`, ...).
A 2.15 model_dir restores into them, and theirs into 2.15.

`get_optimizer_instance(opt, learning_rate)` takes what 2.15 took: a name
('Adagrad', 'Adam', 'Ftrl', 'RMSProp', 'SGD'), a legacy Keras optimizer
instance (`tf.keras.optimizers.legacy.*`, with the tf-keras package: by class
name and `get_config()`), or a callable returning one; and, unlike 2.15, a
`tf.compat.v1.train.Optimizer` as it is (its own slot names) and the classes
here (`Adagrad(0.05)`: 2.15's names without tf-keras). Raises ValueError for an
unknown name, a Keras 3 or "new" Keras 2 optimizer and an object that is none of
these (2.15's messages).

The hyper-parameters are variables (as Keras'), initialised from the values
given and read at each step; `decay` is stored as 2.15 stores it and must be 0
(Keras' time decay of the learning rate is not applied).
"""

from __future__ import annotations

import inspect

import tensorflow as tf

from lowlevel.models.optimizers import Filled
from lowlevel.modes import local_sgd

v1 = tf.compat.v1
_raw = tf.raw_ops
EPSILON = 1e-7  # Keras' default epsilon (tf.keras.backend.epsilon())


class KerasNamedOptimizer(v1.train.Optimizer):
    """A TF1 optimizer whose variables are named as Keras' `training/<NAME>/...`.

    Subclasses set NAME, HYPERS (hyper-parameter -> default, the float32
    variables a 2.15 checkpoint holds) and `slots()` ((slot name, initial
    value) pairs), and implement `_dense(grad, var, slots, hyper)` and
    `_sparse(grad, var, indices, slots, hyper)` with resource variables.
    """

    NAME = ""
    HYPERS: dict = {}

    def __init__(self, learning_rate=0.001, name=None, **hypers):
        super().__init__(use_locking=False, name=name or self.NAME)
        unknown = set(hypers) - set(self.HYPERS)
        if unknown:
            raise ValueError(f"{self.NAME}: unknown hyper-parameters {sorted(unknown)}")
        self._values = {**self.HYPERS, **hypers, "learning_rate": learning_rate}
        if self._values.get("decay"):
            raise ValueError(f"{self.NAME}: decay={self._values['decay']} is not supported "
                             "(Keras' time decay); give a learning rate schedule instead")
        self._hyper, self._read = None, {}
        # The root name scope of its variables: "training", as 2.15's Keras optimizers in a
        # canned estimator; `MultiHead` sets "training_<n>", as 2.15's took after n heads.
        self.scope_prefix = "training"

    # The slots that only add to themselves (`local_sgd.ADDITIVE_SLOTS`): shared among
    # the workers in the communication-reduced mode.
    ADDITIVE: tuple = ()

    def slots(self) -> tuple:
        return ()

    def additive_slot_names(self, var) -> tuple:  # noqa: ARG002 - the same for every variable
        return self.ADDITIVE

    def get_config(self) -> dict:
        return dict(self._values, name=self._name)

    def _scope(self, suffix=""):
        return v1.name_scope(f"{self.scope_prefix}/{self._name}/{suffix}")  # absolute: "/"

    def _create_hypers(self):
        if self._hyper is None:
            with self._scope():
                self._hyper = {k: v1.Variable(float(v), name=k, trainable=False,
                                              use_resource=True, dtype=tf.float32)
                               for k, v in sorted(self._values.items())
                               if k in self.HYPERS or k == "learning_rate"}

    def _create_slots(self, var_list):
        self._create_hypers()
        for var in var_list:
            for slot, initial in self.slots():
                if self.get_slot(var, slot) is not None:
                    continue
                name = var.op.name
                with v1.colocate_with(var), self._scope(name + "/"):
                    shape, dtype = var.get_shape(), var.dtype.base_dtype
                    made = v1.Variable(lambda: Filled(initial)(shape, dtype), name=slot,
                                       trainable=False, use_resource=True, dtype=dtype)
                _slice_like(made, var, f"{self.scope_prefix}/{self._name}", slot)
                self._slot_dict(slot)[_var_key(var)] = made

    def _prepare(self):
        """Each hyper-parameter read once per step, on its own device, not once per
        variable: a step of wide & deep applies to ~20 variables (measured: ~15 % more
        examples/s on 1 ps + 2 workers)."""
        self._read = {}
        for k, var in self._hyper.items():
            with v1.colocate_with(var):
                self._read[k] = var.read_value()

    def _h(self, name, dtype):
        return tf.cast(self._read[name], dtype)

    def _var_slots(self, var):
        return {slot: self.get_slot(var, slot) for slot, _ in self.slots()}

    def _resource_apply_dense(self, grad, var):
        return self._dense(grad, var, self._var_slots(var), lambda n: self._h(n, grad.dtype))

    def _resource_apply_sparse(self, grad, var, indices):
        return self._sparse(grad, var, indices, self._var_slots(var),
                            lambda n: self._h(n, grad.dtype))

    def _apply_dense(self, grad, var):
        raise TypeError(f"{self._name}: {var.op.name} is a reference variable; the canned "
                        "estimators make resource variables")

    _apply_sparse = _apply_dense


def _slice_like(slot, var, prefix, slot_name):
    """A slice of a partitioned variable: its slot is saved as the same slice of
    `<prefix>/<full name>/<slot>`, so a checkpoint of the unpartitioned model (2.15's
    Keras names) restores into it and back (as TF's `slot_creator` does)."""
    info = getattr(var, "_save_slice_info", None)
    if info is not None:
        slot._set_save_slice_info(tf.Variable.SaveSliceInfo(
            f"{prefix}/{info.full_name}/{slot_name}", info.full_shape, info.var_offset,
            info.var_shape))


def _var_key(var):
    from tensorflow.python.training import optimizer as optimizer_lib  # noqa: PLC0415
    return optimizer_lib._var_key(var)  # the key `get_slot` looks a variable up by


class Adagrad(KerasNamedOptimizer):
    """Keras' Adagrad (2.15): accum += g^2; var -= lr * g / (sqrt(accum) + 1e-7)."""

    NAME = "Adagrad"
    HYPERS = {"learning_rate": 0.001, "decay": 0.0}
    ADDITIVE = ("accumulator",)

    def __init__(self, learning_rate=0.001, initial_accumulator_value=0.1, epsilon=EPSILON,
                 name=None, **hypers):
        super().__init__(learning_rate, name, **hypers)
        self._initial, self._epsilon = initial_accumulator_value, epsilon

    def slots(self):
        return (("accumulator", self._initial),)

    def _dense(self, grad, var, slots, h):
        return _raw.ResourceApplyAdagradV2(
            var=var.handle, accum=slots["accumulator"].handle, lr=h("learning_rate"),
            epsilon=tf.cast(self._epsilon, grad.dtype), grad=grad)

    def _sparse(self, grad, var, indices, slots, h):
        return _raw.ResourceSparseApplyAdagradV2(
            var=var.handle, accum=slots["accumulator"].handle, lr=h("learning_rate"),
            epsilon=tf.cast(self._epsilon, grad.dtype), grad=grad, indices=indices)


class Ftrl(KerasNamedOptimizer):
    """Keras' FTRL (2.15; McMahan et al., "Ad Click Prediction", KDD 2013): the fused
    FTRL kernels with L2 = l2_regularization_strength + beta / (2 lr)."""

    NAME = "Ftrl"
    HYPERS = {"learning_rate": 0.001, "decay": 0.0, "learning_rate_power": -0.5,
              "l1_regularization_strength": 0.0, "l2_regularization_strength": 0.0,
              "beta": 0.0}
    ADDITIVE = ("accumulator", "linear")

    def __init__(self, learning_rate=0.001, initial_accumulator_value=0.1,
                 l2_shrinkage_regularization_strength=0.0, name=None, **hypers):
        super().__init__(learning_rate, name, **hypers)
        self._initial, self._shrinkage = initial_accumulator_value, \
            l2_shrinkage_regularization_strength

    def slots(self):
        return (("accumulator", self._initial), ("linear", 0.0))

    def _args(self, grad, var, slots, h):
        lr = h("learning_rate")
        return dict(var=var.handle, accum=slots["accumulator"].handle,
                    linear=slots["linear"].handle, grad=grad, lr=lr,
                    l1=h("l1_regularization_strength"),
                    l2=h("l2_regularization_strength") + h("beta") / (2.0 * lr),
                    lr_power=h("learning_rate_power"))

    def _dense(self, grad, var, slots, h):
        args = self._args(grad, var, slots, h)
        if self._shrinkage > 0:
            return _raw.ResourceApplyFtrlV2(
                l2_shrinkage=tf.cast(self._shrinkage, grad.dtype), **args)
        return _raw.ResourceApplyFtrl(**args)

    def _sparse(self, grad, var, indices, slots, h):
        args = self._args(grad, var, slots, h)
        if self._shrinkage > 0:
            return _raw.ResourceSparseApplyFtrlV2(
                indices=indices, l2_shrinkage=tf.cast(self._shrinkage, grad.dtype), **args)
        return _raw.ResourceSparseApplyFtrl(indices=indices, **args)


class Adam(KerasNamedOptimizer):
    """Keras' Adam (2.15), its step count the run's global step (as 2.15's heads set
    `optimizer.iterations`); sparse gradients update every row (Keras' dense Adam)."""

    NAME = "Adam"
    HYPERS = {"learning_rate": 0.001, "decay": 0.0, "beta_1": 0.9, "beta_2": 0.999}

    def __init__(self, learning_rate=0.001, epsilon=EPSILON, name=None, **hypers):
        super().__init__(learning_rate, name, **hypers)
        self._epsilon = epsilon

    def slots(self):
        return (("m", 0.0), ("v", 0.0))

    def _dense(self, grad, var, slots, h):
        step = tf.cast(v1.train.get_or_create_global_step() + 1, grad.dtype)
        b1, b2 = h("beta_1"), h("beta_2")
        return _raw.ResourceApplyAdam(
            var=var.handle, m=slots["m"].handle, v=slots["v"].handle,
            beta1_power=tf.pow(b1, step), beta2_power=tf.pow(b2, step),
            lr=h("learning_rate"), beta1=b1, beta2=b2,
            epsilon=tf.cast(self._epsilon, grad.dtype), grad=grad)

    def _sparse(self, grad, var, indices, slots, h):
        dense = tf.math.unsorted_segment_sum(grad, indices, tf.shape(var, out_type=indices.dtype)[0])
        return self._dense(dense, var, slots, h)


class SGD(KerasNamedOptimizer):
    """Keras' SGD (2.15): var -= lr * g, or with momentum Keras' momentum kernel."""

    NAME = "SGD"
    HYPERS = {"learning_rate": 0.01, "decay": 0.0, "momentum": 0.0}

    def __init__(self, learning_rate=0.01, nesterov=False, name=None, **hypers):
        super().__init__(learning_rate, name, **hypers)
        self._nesterov = nesterov

    def slots(self):
        return (("momentum", 0.0),) if self._values["momentum"] else ()

    def _dense(self, grad, var, slots, h):
        if not slots:
            return _raw.ResourceApplyGradientDescent(var=var.handle, alpha=h("learning_rate"),
                                                     delta=grad)
        return _raw.ResourceApplyKerasMomentum(
            var=var.handle, accum=slots["momentum"].handle, lr=h("learning_rate"), grad=grad,
            momentum=h("momentum"), use_nesterov=self._nesterov)

    def _sparse(self, grad, var, indices, slots, h):
        if not slots:
            return _raw.ResourceScatterAdd(resource=var.handle, indices=indices,
                                           updates=-h("learning_rate") * grad)
        return _raw.ResourceSparseApplyKerasMomentum(
            var=var.handle, accum=slots["momentum"].handle, lr=h("learning_rate"), grad=grad,
            indices=indices, momentum=h("momentum"), use_nesterov=self._nesterov)


class RMSProp(KerasNamedOptimizer):
    """Keras' RMSprop (2.15) without momentum or centering:
    rms = rho rms + (1 - rho) g^2; var -= lr g / (sqrt(rms) + 1e-7)."""

    NAME = "RMSprop"
    HYPERS = {"learning_rate": 0.001, "decay": 0.0, "rho": 0.9, "momentum": 0.0}

    def __init__(self, learning_rate=0.001, epsilon=EPSILON, name=None, **hypers):
        super().__init__(learning_rate, name, **hypers)
        if self._values["momentum"]:
            raise ValueError("RMSprop: momentum is not supported by the canned estimators")
        self._epsilon = epsilon

    def slots(self):
        return (("rms", 0.0),)

    def _dense(self, grad, var, slots, h):
        rho, rms = h("rho"), slots["rms"]
        rms_t = rms.assign(rho * rms + (1.0 - rho) * tf.square(grad))
        return var.assign_sub(h("learning_rate") * grad / (tf.sqrt(rms_t) + self._epsilon)).op

    def _sparse(self, grad, var, indices, slots, h):
        dense = tf.math.unsorted_segment_sum(grad, indices, tf.shape(var, out_type=indices.dtype)[0])
        return self._dense(dense, var, slots, h)


class Combined(v1.train.Optimizer):
    """Several optimizers as one, each for its own variables (wide & deep's linear and
    DNN parts), so that one `apply_gradients` (which lowlevel's runtime takes over)
    makes the step.

    parts: [(KerasNamedOptimizer, [variables])]; `counted`: the part whose own
    step count `training/<Name>/iter` (int64) it adds 1 to each step, as 2.15's
    wide & deep did for its linear optimizer, or None.
    """

    def __init__(self, parts, counted=None):
        super().__init__(use_locking=False, name="Combined")
        self._parts = [(opt, {_var_key(v) for v in variables}) for opt, variables in parts]
        self._counted, self._iter = counted, None

    def _part(self, var):
        """The part `var` belongs to; a worker's copy of a variable in the
        communication-reduced mode (`local_sgd.model_variable`) to its variable's part."""
        key = _var_key(local_sgd.model_variable(var))
        for opt, keys in self._parts:
            if key in keys:
                return opt
        raise ValueError(f"{var.op.name} belongs to no part of the combined optimizer")

    def _create_slots(self, var_list):
        for opt, _ in self._parts:
            opt._create_slots([v for v in var_list if self._part(v) is opt])
        if self._counted is not None and self._iter is None:
            with self._counted._scope():
                self._iter = v1.Variable(0, name="iter", trainable=False, use_resource=True,
                                         dtype=tf.int64)

    def _prepare(self):
        for opt, _ in self._parts:
            opt._prepare()

    def _resource_apply_dense(self, grad, var):
        return self._part(var)._resource_apply_dense(grad, var)

    def _resource_apply_sparse(self, grad, var, indices):
        return self._part(var)._resource_apply_sparse(grad, var, indices)

    def _finish(self, update_ops, name_scope):
        if self._iter is None:
            return super()._finish(update_ops, name_scope)
        with tf.control_dependencies(update_ops):
            return self._iter.assign_add(1).op

    def get_slot(self, var, name):
        return self._part(var).get_slot(var, name)

    def get_slot_names(self):
        return sorted({n for opt, _ in self._parts for n in opt.get_slot_names()})

    def additive_slot_names(self, var) -> tuple:
        return local_sgd.additive_slot_names(self._part(var), var)


OPTIMIZERS = {"Adagrad": Adagrad, "Adam": Adam, "Ftrl": Ftrl, "RMSProp": RMSProp, "SGD": SGD}
_KERAS_CLASSES = {"Adagrad": Adagrad, "Adam": Adam, "Ftrl": Ftrl, "RMSprop": RMSProp,
                  "SGD": SGD}


def _is_legacy_keras(opt) -> bool:
    """A Keras 2 `optimizers.legacy` (OptimizerV2) instance: the Keras optimizers 2.15's
    canned estimators took (its Keras 2.11+ "new" optimizers and Keras 3's it refused)."""
    module = type(opt).__module__
    return ".legacy." in module or "optimizer_v2" in module


def _from_keras(opt):
    """A legacy Keras optimizer instance -> ours, by class name and `get_config()` (the
    hyper-parameters and constructor arguments ours take). Any other Keras optimizer:
    2.15's ValueError (Keras 3's cannot build a TF1 graph; 2.15 refused its "new" ones)."""
    cls = _KERAS_CLASSES.get(type(opt).__name__)
    if not _is_legacy_keras(opt) or cls is None:
        raise ValueError(
            "Please set your optimizer as an instance of `tf.keras.optimizers.legacy."
            "Optimizer`, e.g., `tf.keras.optimizers.legacy.Adagrad`.Received optimizer type "
            f"{type(opt)}. (On TensorFlow 2.21 the legacy optimizers need the tf-keras "
            "package; without it give the optimizer's name, a tf.compat.v1.train.Optimizer "
            "or one of lowlevel.estimator.canned.optimizers.)")
    config = opt.get_config()
    accepted = set(inspect.signature(cls.__init__).parameters) | set(cls.HYPERS)
    kept = {k: (float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v)
            for k, v in config.items()
            if k in accepted and k not in ("name", "learning_rate") and v is not None}
    return cls(learning_rate=float(config.get("learning_rate", cls.HYPERS["learning_rate"])),
               name=config.get("name") or cls.NAME, **kept)


def get_optimizer_instance(opt, learning_rate=None):
    """2.15's `optimizers.get_optimizer_instance_v2`: the optimizer a canned estimator trains with.

    Args:
      opt: a name (one of OPTIMIZERS; `learning_rate` is then required), a
        `tf.compat.v1.train.Optimizer`, a Keras optimizer (converted by class
        name: Adagrad, Adam, Ftrl, RMSprop, SGD), or a zero-argument callable
        returning one of those.
      learning_rate: float, the learning rate for a name.

    Raises:
      ValueError: an unknown name, a name without `learning_rate`, or an object
        that is none of the above (2.15's messages).
    """
    if isinstance(opt, str):
        if opt in OPTIMIZERS:
            if not learning_rate:
                raise ValueError("learning_rate must be specified when opt is string.")
            return OPTIMIZERS[opt](learning_rate=learning_rate)
        raise ValueError(f"Unsupported optimizer name: {opt}. Supported names are: "
                         f"{tuple(sorted(OPTIMIZERS))}")
    if callable(opt) and not _is_optimizer(opt):
        opt = opt()
    if isinstance(opt, v1.train.Optimizer):
        return opt
    if _is_optimizer(opt):
        return _from_keras(opt)
    raise ValueError(f"The given object is not a tf.keras.optimizers.Optimizer instance. "
                     f"Given: {opt}")


def _is_optimizer(obj) -> bool:
    return isinstance(obj, v1.train.Optimizer) or (
        hasattr(obj, "get_config") and hasattr(obj, "apply_gradients"))
