"""Scripts written in TF1's own namespace (`import tensorflow as tf`, then `tf.placeholder`,
`tf.train.Server`, `tf.app.run`, `tf.contrib...`) run unmodified under `python -m lowlevel`.

The rule, decided per script before it runs, from its text alone (`tf1_names`): the script's
syntax tree is read for the names it takes from the module `tensorflow` — attribute chains
on a name that `import tensorflow` or `import tensorflow as NAME` bound (`tf.train.Server`),
and the names of `from tensorflow[.X] import NAME` (`from tensorflow.contrib import slim`).
A name that TensorFlow 2.21's own `tensorflow` namespace lacks but `tf.compat.v1` has
(`tf.placeholder`, `tf.Session`, `tf.app.run`, `tf.log`, `tf.train.Server`,
`tf.train.AdagradOptimizer`), and any name under `tf.contrib`, is TF1's. A chain is followed
no further than a lazily loaded module (`tf.keras`, `tf.losses`: Keras is not imported to
decide), which counts as present. A script with at least one TF1 name gets, in its own
module only (the `__import__` of the builtins its globals carry, `script_globals`):

- `import tensorflow [as tf]` and `from tensorflow import NAME`: `tf1_namespace()`, i.e.
  `tf.compat.v1` (the runner's `Server` and `MonitoredTrainingSession` in its `train`)
  plus `contrib`, the small table below; and v2 behaviour disabled (graph mode), as
  `tf.disable_v2_behavior()` would, before the script's first line;
- `import tensorflow.X...` (with or without `as`): TensorFlow's module `X` is imported as
  usual, and the name bound is reached from `tf1_namespace()` (so `import
  tensorflow.compat.v1 as tf` gives tf.compat.v1's names, the same objects as before,
  and a bare `import tensorflow.compat.v1` binds `tensorflow` to TF1's namespace too);
  `from tensorflow.X import NAME`: Python's own import, unchanged;
- `tensorflow.contrib...` in any import form: the table;
- `tensorflow.examples.tutorials.mnist.input_data` (gone from TF 2), in any import form:
  `lowlevel.data.mnist_tutorial`, the same reader over MNIST files already on disk.

`prepare(script)` decides, and for a TF1 script writes one line naming the first TF1 names
found ("lowlevel: SCRIPT uses TF1's own namespace (tf.train.Server, ...): ..."). Any other
script (an Estimator script, a TF2 or a `tensorflow.compat.v1` script) runs exactly as
before. Modules the script imports are not covered: a helper module of its own that does
`import tensorflow as tf` gets TensorFlow 2.21's namespace.

`tf.contrib` (`CONTRIB`), mapped to TF 2.21 with contrib's semantics (TF 1.15's
`tensorflow/contrib/framework/python/ops/variables.py`,
`contrib/layers/python/layers/initializers.py` and `regularizers.py`):
`framework.get_or_create_global_step`, `get_global_step`, `create_global_step` (the
`tf.compat.v1.train` functions contrib's delegated to); `layers.xavier_initializer`
(`xavier_initializer_conv2d`) and `layers.variance_scaling_initializer`
(`tf.compat.v1.variance_scaling_initializer` scaled to contrib's: uniform, limit
sqrt(3 * factor / n), that is glorot_uniform for xavier; normal, a truncated normal of
stddev sqrt(1.3 * factor / n)); `layers.l1_regularizer`, `l2_regularizer` (scale *
sum(|w|), scale * l2_loss(w) = scale * sum(w**2) / 2; a scale of 0 gives a regularizer
returning None; a negative or an integer scale is a ValueError), `l1_l2_regularizer`,
`sum_regularizer`, `apply_regularization`. Any other `tf.contrib` name raises
`errors.ContribUnavailable` where the script reaches it (the attribute, or the import
line), whose one line names it and its TF 2.21 replacement where one is known
(`REPLACEMENTS`: `tf.contrib.slim` -> the tf_slim package, ...); the runner prints that
line and exits 1. It is also an `ImportError`: a script's own `except ImportError:`
fallback takes it.
"""

from __future__ import annotations

import ast
import builtins
import numbers
import sys
import types
from typing import Optional

import tensorflow as tf

from lowlevel.errors import ContribUnavailable

v1 = tf.compat.v1
TF = "tensorflow"
# The truncated normal's stddev over its untruncated one, as tf.compat.v1's VarianceScaling
# divides by it (scipy.stats.truncnorm.std(a=-2, b=2)); contrib's 1.3 stood for 1 / its
# square. Scaling contrib's factor by 1.3 * this ** 2 gives contrib's stddev exactly.
_TRUNCATED_STD = .87962566103423978


def _resolves(root, path) -> bool:
    """Whether the attribute chain `path` exists on `root`, looking no further than a lazily
    loaded module (TensorFlow's `LazyLoader`, `KerasLazyLoader`: present, not imported)."""
    obj = root
    for name in path:
        if type(obj).__module__ == "tensorflow.python.util.lazy_loader":
            return True
        try:
            obj = getattr(obj, name)
        except Exception:  # noqa: BLE001 - AttributeError, or a module that cannot load
            return False
    return True


def is_tf1_name(path) -> bool:
    """Whether `tf.<path>` (path: ("train", "Server")) exists only in TF1: under `contrib`,
    or in `tf.compat.v1` but not in TensorFlow 2.21's own namespace."""
    path = tuple(path)
    if not path or _resolves(tf, path):
        return False
    return path[0] == "contrib" or _resolves(v1, path)


def _imports(tree: ast.AST) -> tuple[set, list]:
    """(the names bound to the module `tensorflow` by `import tensorflow[.X] [as NAME]`,
    [(node, path) of each `from tensorflow[.X] import NAME`])."""
    aliases, imported = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == TF:
                    aliases.add(alias.asname or TF)
                elif alias.name.startswith(TF + ".") and alias.asname is None:
                    aliases.add(TF)  # `import tensorflow.compat.v1` binds `tensorflow`
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module and \
                (node.module == TF or node.module.startswith(TF + ".")):
            module = node.module.split(".")[1:]
            imported += [(node, (*module, a.name)) for a in node.names if a.name != "*"]
    return aliases, imported


def _chain(node: ast.Attribute, aliases: set) -> Optional[tuple]:
    """(alias, path) of an attribute chain `alias.a.b` on a name of `aliases`, else None."""
    path = []
    while isinstance(node, ast.Attribute):
        path.insert(0, node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id in aliases:
        return node.id, tuple(path)
    return None


def tf1_names(source: str, filename: str = "<script>") -> list[str]:
    """The names `source` (a script's text) takes from `tensorflow` that exist only in TF1
    (`is_tf1_name`), as written ("tf.train.Server", "from tensorflow import placeholder"),
    each once, in the order of the script; [] for a script of TF 2.21's namespace, a
    `tensorflow.compat.v1` one, or one that does not parse (runpy reports its error).
    """
    try:
        tree = ast.parse(source, filename)
    except SyntaxError:
        return []
    aliases, imported = _imports(tree)
    known: dict = {}  # path -> is_tf1_name(path), each path looked up once

    def tf1(path):
        if path not in known:
            known[path] = is_tf1_name(path)
        return known[path]
    found = [(n.lineno, n.col_offset, f"from {n.module} import {path[-1]}")
             for n, path in imported if tf1(path)]
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            chain = _chain(node, aliases)
            if chain and tf1(chain[1]):
                found.append((node.lineno, node.col_offset, ".".join((chain[0], *chain[1]))))
    names = []
    for _, _, name in sorted(found):
        if name not in names and not any(n.startswith(name + ".") for n in names):
            names = [n for n in names if not name.startswith(n + ".")] + [name]
    return names


# --- tf.contrib ----------------------------------------------------------------------


def variance_scaling_initializer(factor=2.0, mode="FAN_IN", uniform=False, seed=None,
                                 dtype=tf.float32):
    """`tf.contrib.layers.variance_scaling_initializer`: n = fan_in, fan_out or their mean
    (`mode`: "FAN_IN", "FAN_OUT", "FAN_AVG"); uniform in +-sqrt(3 * factor / n), or a
    truncated normal of stddev sqrt(1.3 * factor / n). Returns contrib's
    `initializer(shape, dtype=dtype, partition_info=None)`, drawn by
    `tf.compat.v1.variance_scaling_initializer` with the scale that gives those bounds.

    Raises:
      TypeError: `dtype` is not a floating type, or `mode` is not one of the three.
    """
    dtype = tf.as_dtype(dtype)
    if not dtype.is_floating:
        raise TypeError("Cannot create initializer for non-floating point type.")
    if mode not in ("FAN_IN", "FAN_OUT", "FAN_AVG"):
        raise TypeError(f"Unknown mode {mode} [FAN_IN, FAN_OUT, FAN_AVG]")
    scale = factor if uniform else 1.3 * factor * _TRUNCATED_STD ** 2
    draw = v1.variance_scaling_initializer(
        scale=scale, mode=mode.lower(), seed=seed,
        distribution="uniform" if uniform else "truncated_normal")

    def initializer(shape, dtype=dtype, partition_info=None):
        return draw(shape, dtype=dtype, partition_info=partition_info)
    return initializer


def xavier_initializer(uniform=True, seed=None, dtype=tf.float32):
    """`tf.contrib.layers.xavier_initializer` (and `xavier_initializer_conv2d`): Glorot's,
    `variance_scaling_initializer(1.0, "FAN_AVG", uniform)`; uniform (the default) is
    `tf.compat.v1.glorot_uniform_initializer`'s distribution."""
    return variance_scaling_initializer(factor=1.0, mode="FAN_AVG", uniform=uniform,
                                        seed=seed, dtype=dtype)


def _check_scale(scale):
    """Contrib's checks of a regularizer's scale; True when it disables the regularizer.

    Raises:
      ValueError: an integer or a negative scale.
    """
    if isinstance(scale, numbers.Integral):
        raise ValueError(f"scale cannot be an integer: {scale}")
    if isinstance(scale, numbers.Real):
        if scale < 0.:
            raise ValueError(f"Setting a scale less than 0 on a regularizer: {scale:g}.")
        return scale == 0.
    return False


def _regularizer(scale, scope, default_name, penalty):
    """A contrib regularizer: weights -> scale * penalty(weights), in a name scope."""
    if _check_scale(scale):
        return lambda _: None

    def regularize(weights):
        with v1.name_scope(scope, default_name, [weights]) as name:
            my_scale = tf.convert_to_tensor(scale, dtype=weights.dtype.base_dtype, name="scale")
            return tf.multiply(my_scale, penalty(weights), name=name)
    return regularize


def l1_regularizer(scale, scope=None):
    """`tf.contrib.layers.l1_regularizer`: weights -> scale * reduce_sum(abs(weights)).
    A scale of 0.0 returns a regularizer that returns None.

    Raises:
      ValueError: `scale` is an integer or negative.
    """
    return _regularizer(scale, scope, "l1_regularizer",
                        lambda w: tf.reduce_sum(tf.abs(w)))


def l2_regularizer(scale, scope=None):
    """`tf.contrib.layers.l2_regularizer`: weights -> scale * tf.nn.l2_loss(weights), i.e.
    scale * sum(weights ** 2) / 2 (not Keras' L2, which has no 1/2). A scale of 0.0 returns
    a regularizer that returns None.

    Raises:
      ValueError: `scale` is an integer or negative.
    """
    return _regularizer(scale, scope, "l2_regularizer", tf.nn.l2_loss)


def sum_regularizer(regularizer_list, scope=None):
    """`tf.contrib.layers.sum_regularizer`: weights -> the sum of the regularizers' values
    (None entries left out); None when none is left."""
    regularizers = [r for r in regularizer_list if r is not None]
    if not regularizers:
        return None

    def regularize(weights):
        with v1.name_scope(scope, "sum_regularizer", [weights]) as name:
            return tf.add_n([r(weights) for r in regularizers], name=name)
    return regularize


def l1_l2_regularizer(scale_l1=1.0, scale_l2=1.0, scope=None):
    """`tf.contrib.layers.l1_l2_regularizer`: the sum of the L1 and L2 regularizers.

    Raises:
      ValueError: a scale is an integer or negative.
    """
    return sum_regularizer([l1_regularizer(scale_l1), l2_regularizer(scale_l2)],
                           scope=scope or "l1_l2_regularizer")


def apply_regularization(regularizer, weights_list=None):
    """`tf.contrib.layers.apply_regularization`: the sum of `regularizer` over
    `weights_list` (default: the graph's `GraphKeys.WEIGHTS`), a None penalty counting 0,
    added to `GraphKeys.REGULARIZATION_LOSSES`; returns that scalar.

    Raises:
      ValueError: no weights, or a penalty that is not a scalar.
    """
    weights_list = weights_list or v1.get_collection(v1.GraphKeys.WEIGHTS)
    if not weights_list:
        raise ValueError("No weights to regularize.")
    with v1.name_scope("get_regularization_penalty", values=weights_list) as scope:
        penalties = [regularizer(w) for w in weights_list]
        penalties = [tf.constant(0.0) if p is None else p for p in penalties]
        for p in penalties:
            if p.get_shape().ndims != 0:
                raise ValueError("regularizer must return a scalar Tensor instead of a "
                                 f"Tensor with rank {p.get_shape().ndims}.")
        summed = tf.add_n(penalties, name=scope)
        v1.add_to_collection(v1.GraphKeys.REGULARIZATION_LOSSES, summed)
        return summed


# `tf.contrib.<key>` -> its TF 2.21 home (with contrib's semantics).
CONTRIB = {
    "framework.get_or_create_global_step": v1.train.get_or_create_global_step,
    "framework.get_global_step": v1.train.get_global_step,
    "framework.create_global_step": v1.train.create_global_step,
    "layers.xavier_initializer": xavier_initializer,
    "layers.xavier_initializer_conv2d": xavier_initializer,
    "layers.variance_scaling_initializer": variance_scaling_initializer,
    "layers.l1_regularizer": l1_regularizer,
    "layers.l2_regularizer": l2_regularizer,
    "layers.l1_l2_regularizer": l1_l2_regularizer,
    "layers.sum_regularizer": sum_regularizer,
    "layers.apply_regularization": apply_regularization,
}
# Where the rest of `tf.contrib` went (the longest key that is a prefix of a name wins).
REPLACEMENTS = {
    "slim": "the tf_slim package (pip install tf-slim; import tf_slim as slim)",
    "framework": "tf_slim (arg_scope, get_variables_to_restore, ...: pip install tf-slim)",
    "layers": "tf_slim.layers (pip install tf-slim)",
    "learn": "tf.estimator (lowlevel.estimator under this runner)",
    "rnn": "tf.compat.v1.nn.rnn_cell",
    "data": "tf.data and tf.data.experimental",
    "distribute": "tf.distribute",
    "lookup": "tf.lookup",
    "losses": "tf.compat.v1.losses",
    "metrics": "tf.compat.v1.metrics",
    "cluster_resolver": "tf.distribute.cluster_resolver",
    "tpu": "tf.compat.v1.tpu",
    "summary": "tf.compat.v2.summary",
}


def contrib_error(key: str) -> ContribUnavailable:
    """The error for `tf.contrib.<key>`, a name not in `CONTRIB`: its one line names it and
    its replacement (`REPLACEMENTS`) where one is known."""
    name = "tf.contrib." + key
    known = [k for k in REPLACEMENTS if key == k or key.startswith(k + ".")]
    if known:
        home = REPLACEMENTS[max(known, key=len)]
        return ContribUnavailable(f"{name} is not in TensorFlow 2.21: use {home}")
    return ContribUnavailable(f"{name} is not in TensorFlow 2.21, and lowlevel maps only a "
                              "few tf.contrib functions (docs/tf1-programs.md)")


class _Contrib(types.ModuleType):
    """`tf.contrib` (key "") or one of its modules: a name of `CONTRIB` under it, a module
    holding some, or `ContribUnavailable` for any other name."""

    def __init__(self, key: str = ""):
        super().__init__("tensorflow.contrib" + (f".{key}" if key else ""),
                         "lowlevel's stand-in for tf.contrib (lowlevel.tf1_namespace)")
        self._key = key

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        key = f"{self._key}.{name}" if self._key else name
        if key in CONTRIB:
            return CONTRIB[key]
        if any(k.startswith(key + ".") for k in CONTRIB):
            module = _Contrib(key)
            setattr(self, name, module)
            return module
        raise contrib_error(key)

    def __dir__(self):
        prefix = f"{self._key}." if self._key else ""
        return sorted({k[len(prefix):].split(".")[0] for k in CONTRIB if k.startswith(prefix)})


def _examples() -> types.ModuleType:
    """`tensorflow.examples`, of which only `tutorials.mnist.input_data` (the MNIST reader
    TF1's tutorials and `mnist_replica.py` import): `lowlevel.data.mnist_tutorial`."""
    from lowlevel.data import mnist_tutorial
    modules = [types.ModuleType(f"{TF}.examples" + ".tutorials.mnist"[:k])
               for k in (0, len(".tutorials"), len(".tutorials.mnist"))]
    modules[0].tutorials, modules[1].mnist = modules[1], modules[2]
    modules[2].input_data = mnist_tutorial
    return modules[0]


class _TF1Namespace(types.ModuleType):
    """`tf.compat.v1`, every name its own, plus `contrib` and `examples` (`_examples`);
    named "tensorflow" (so that `import tensorflow.X as Y` finds TensorFlow's modules
    under it)."""

    def __init__(self):
        super().__init__(TF, "tf.compat.v1 with tf.contrib's mapped functions "
                             "(lowlevel.tf1_namespace)")
        self.contrib = _Contrib()
        self.examples = _examples()

    def __getattr__(self, name):
        return getattr(v1, name)

    def __dir__(self):
        return sorted(set(dir(v1)) | {"contrib", "examples"})


_namespace: Optional[_TF1Namespace] = None


def tf1_namespace() -> types.ModuleType:
    """What `import tensorflow` gives a TF1 script: `tf.compat.v1` (every attribute is its
    own: `train.Server` is the runner's once `lowlevel.train.install` has run) plus
    `contrib` (`CONTRIB`). One object per process."""
    global _namespace
    if _namespace is None:
        _namespace = _TF1Namespace()
    return _namespace


def _importer(namespace, real_import=builtins.__import__):
    """An `__import__` giving `namespace` for `tensorflow` (module doc); anything else is
    `real_import`'s."""
    def __import__(name, globals=None, locals=None, fromlist=(), level=0):  # noqa: A002
        if level or not (name == TF or name.startswith(TF + ".")):
            return real_import(name, globals, locals, fromlist, level)
        if name != TF and name.split(".")[1] in ("contrib", "examples"):
            found = namespace
            for part in name.split(".")[1:]:
                found = getattr(found, part, None)  # ContribUnavailable: a contrib name not mapped
                if found is None:
                    raise ModuleNotFoundError(f"No module named '{name}'", name=name)
            return found if fromlist else namespace
        if name != TF:
            module = real_import(name, globals, locals, fromlist, level)
            if fromlist:
                return module
        return namespace
    return __import__


def script_globals(namespace=None) -> dict:
    """`init_globals` for `runpy.run_path` that make the script's `import tensorflow` give
    `namespace` (default `tf1_namespace()`): `__builtins__`, a copy of the builtins with
    that `__import__`. Only the script's module (its functions and classes included)
    gets it."""
    hooked = dict(vars(builtins))
    hooked["__import__"] = _importer(namespace if namespace is not None else tf1_namespace())
    return {"__builtins__": hooked}


def prepare(script: str, prog: str = "lowlevel") -> Optional[dict]:
    """For the runner, before `script` runs: None for a script of TF 2.21's namespace (it
    runs as before); for one that uses TF1 names (`tf1_names`), disables v2 behaviour
    (graph mode, as `tf.disable_v2_behavior()`), writes one line to stderr naming the
    first of them, and returns `script_globals()`.

    Raises:
      OSError: the script cannot be read.
    """
    with open(script, "rb") as f:
        names = tf1_names(f.read().decode("utf-8", "replace"), script)
    if not names:
        return None
    logger = tf.get_logger()
    level = logger.level
    logger.setLevel("ERROR")  # its deprecation warning is lowlevel's call, not the script's
    try:
        v1.disable_v2_behavior()
    finally:
        logger.setLevel(level)
    shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
    sys.stderr.write(f"{prog}: {script} uses TF1's own namespace ({shown}): its `import "
                     "tensorflow` is tf.compat.v1 in graph mode, tf.contrib the few functions "
                     "mapped (docs/tf1-programs.md)\n")
    sys.stderr.flush()
    return script_globals()
