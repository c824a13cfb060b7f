"""Dense layers' products computed on the ps that holds the kernel (exact mode).

An exact step moves each kernel twice: the worker reads it and sends its
gradient back, 2·n·m floats for an `[n, m]` kernel. For a dense layer
`y = x @ W` on a batch of B rows, two of its products can run on W's ps
instead, as Project Adam did for its fully connected layers (Chilimbi et al.,
"Project Adam", OSDI 2014, sec. 3.3: workers send activation and error
vectors; the parameter servers compute the weight update):

- the weight gradient `x^T @ dy`: the worker sends x and dy, B·(n + m) floats,
  instead of the gradient, n·m ("weight_gradient");
- for a layer whose input needs no gradient (the first layer, on the batch
  itself), the forward product `x @ W` as well: the worker sends x and dy and
  receives y, B·(n + 2m) floats, and never reads W ("forward").

Each layer takes whichever of classic, weight_gradient and forward moves the
fewest bytes (`choose`). The ops and their inputs are the ones the classic
step runs; only their device changes, so a step computes the same values:
bitwise when the ps and the worker compute with as many intra-op threads (by
default the ps has 1 and a worker the cores, and TensorFlow's Eigen matmul,
without oneDNN, may round differently with another thread count). The
ps does the arithmetic the worker did: `--ps_products=false` keeps it on the
worker, for a ps whose CPU, not its network, bounds a cluster (one ps serving
many workers on other machines); a GPU worker keeps it (`lowlevel.runtime.graph`).

A forward layer's bias and activation follow its product to the ps, which
sends back the layer's output; the next layer's weight gradient then finds its
input there, and its bias is read and updated there, never fused with the small
variables (`fused_transfer` fuses only reads the worker consumes). For the benchmark's MLP (784-512-512-10,
batch 128) a step moves 2.28 MB instead of 5.36 MB (benchmarks/NOTES.md): the first layer
forward, the second weight_gradient, the last (512 x 10, fused with the
biases by `lowlevel.modes.fused_transfer`) classic. A partitioned kernel (sharded over ps
tasks) is read as one concatenated tensor on the worker and stays classic.

The cost model (`choose`, `mlp_step_floats`) needs no TensorFlow, so the
benchmark harness uses it without the import; `placed` imports it.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Optional

from absl import logging

CLASSIC, WEIGHT_GRADIENT, FORWARD = "classic", "weight_gradient", "forward"
_GRADIENT = "LowlevelPsProducts"
# graph -> {forward MatMul's name: (kind, ps device)} of the chosen layers. Not a graph
# collection: the saver's meta graph cannot hold tuples and would warn at every checkpoint.
_CHOSEN: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
# graph -> {tensor name: ps device} of a forward layer's outputs computed on its ps.
_ON_PS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
# Ops that follow a forward layer's product onto the ps: its bias and activation.
_FOLLOWERS = ("BiasAdd", "Relu", "Relu6", "Elu", "Selu", "LeakyRelu", "Sigmoid", "Tanh",
              "Softplus")


def choose(batch: int, n: int, m: int, input_needs_gradient: bool,
           input_on_ps: bool = False) -> tuple[str, int]:
    """(kind, floats a step moves for the kernel) with the fewest floats; ties go to classic.

    Args:
      batch: rows of the layer's input, B.
      n, m: the kernel's shape `[n, m]`.
      input_needs_gradient: whether x depends on trainable variables (then the
        forward product stays on the worker, which needs W for `dy @ W^T`).
      input_on_ps: x is computed on the kernel's ps already (the output of a
        forward layer there), so the weight gradient needs only dy sent.
    """
    costs = {CLASSIC: 2 * n * m, WEIGHT_GRADIENT: n * m + batch * (m if input_on_ps else n + m)}
    if not input_needs_gradient:
        costs[FORWARD] = batch * (n + 2 * m)
    kind = min(costs, key=lambda k: (costs[k], k != CLASSIC))
    return kind, costs[kind]


def mlp_step_floats(widths, batch: int, small_floats: int = 0) -> int:
    """Floats a worker's exact step moves for an MLP of `widths` ([784, 512, 512, 10]).

    Both directions. A kernel of at most `small_floats` travels with the biases
    (`fused_transfer`, classic); the others by `choose`, where the output of
    a forward layer is computed on the ps (its bias never travels) and its next
    layer's input is there.
    """
    total, on_ps = 0, False
    for i, (n, m) in enumerate(zip(widths[:-1], widths[1:])):
        kind, floats = ((CLASSIC, 2 * n * m) if n * m <= small_floats else
                        choose(batch, n, m, input_needs_gradient=i > 0, input_on_ps=on_ps))
        on_ps = kind == FORWARD
        total += floats + (0 if on_ps else 2 * m)  # a forward layer's bias stays on the ps
    return total


def wanted(ps_products: bool, worker_device, towers: int) -> bool:
    """Whether a step's products may run on the ps: `--ps_products`, on a cluster
    (`worker_device` given), a CPU worker (a ps CPU would compute a GPU's products far
    slower) with one tower (a tower's product on the ps would send its inputs there once
    per tower). The built-in models' and a model_fn's rule alike."""
    return bool(ps_products and worker_device and "GPU" not in worker_device.upper()
                and towers == 1)


@contextlib.contextmanager
def placed(enabled: bool = True):
    """Within it, each new `MatMul` on a ps kernel is placed by `choose`.

    Build the model inside, and take its gradients (`tf.gradients`) anywhere
    after: the weight gradient of a chosen layer is built on its ps. Layers
    are logged with their kind and bytes a step. With `enabled` False: nothing.
    """
    if not enabled:
        yield
        return
    import tensorflow as tf
    _register_gradient(tf)
    graph = tf.compat.v1.get_default_graph()
    with graph.gradient_override_map({"MatMul": _GRADIENT}), tf.compat.v1.device(_place):
        yield


def _place(op) -> Optional[str]:
    """A device function: the op's device, or its kernel's ps for a forward layer."""
    on_ps = _ON_PS.setdefault(op.graph, {})
    ps = _follow(op, on_ps)
    if ps:
        return ps
    decided = _decide(op, on_ps)
    if decided is None:
        return op.device
    kind, ps, floats, classic = decided
    _CHOSEN.setdefault(op.graph, {})[op.name] = (kind, ps)
    logging.info("%s: %s on %s, %.2f MB a step instead of %.2f MB", op.name, kind, ps,
                 floats * 4 / 1e6, classic * 4 / 1e6)
    return ps if kind == FORWARD else op.device


def _follow(op, on_ps: dict) -> Optional[str]:
    """The ps of a forward layer's bias or activation (recorded in `on_ps`), else None.

    They follow the layer's product: the ps sends the layer's output, and the
    next layer's weight gradient finds its input there.
    """
    if op.type not in _FOLLOWERS or not op.inputs or op.inputs[0].name not in on_ps:
        return None
    ps = on_ps[op.outputs[0].name] = on_ps[op.inputs[0].name]
    return ps


def _decide(op, on_ps: dict):
    """(kind, ps, floats, classic floats) of a MatMul on a whole ps kernel not classic, else None.

    A forward layer's output is recorded in `on_ps`. A batch that is not static
    keeps the layer classic.
    """
    if op.type != "MatMul" or op.get_attr("transpose_a") or op.get_attr("transpose_b"):
        return None
    x, kernel = op.inputs
    ps = _ps_of(kernel)
    if ps is None or not (x.shape[1:].is_fully_defined() and kernel.shape.is_fully_defined()):
        return None
    if x.shape[0] is None:
        return None
    n, m = kernel.shape.as_list()
    kind, floats = choose(x.shape[0], n, m, _reads_variables(x),
                          on_ps.get(x.name) == ps)
    if kind == CLASSIC:
        return None
    if kind == FORWARD:
        on_ps[op.outputs[0].name] = ps
    return kind, ps, floats, 2 * n * m


def _ps_of(kernel) -> Optional[str]:
    """The ps device of a kernel read straight from a whole variable, else None."""
    if kernel.op.type != "ReadVariableOp":
        return None
    device = kernel.op.inputs[0].op.device  # the variable's handle
    return device if "/job:ps" in device else None


def _reads_variables(tensor, limit: int = 10_000) -> bool:
    """Whether `tensor` depends on a variable (then its gradient may be needed)."""
    seen, stack = set(), [tensor.op]
    while stack and len(seen) < limit:
        op = stack.pop()
        if op.type in ("ReadVariableOp", "VarHandleOp", "VariableV2", "Variable"):
            return True
        for t in op.inputs:
            if t.op.name not in seen:
                seen.add(t.op.name)
                stack.append(t.op)
    return len(seen) >= limit  # too deep to tell: assume it does


def _register_gradient(tf) -> None:
    """Registers `_matmul_gradient` as `_GRADIENT` once per process."""
    global _registered
    if not _registered:
        tf.RegisterGradient(_GRADIENT)(_matmul_gradient)
        _registered = True


_registered = False


def _matmul_gradient(op, grad):
    """MatMul's gradient (TensorFlow's formulas), the weight gradient on the ps if chosen."""
    import tensorflow as tf
    a, b = op.inputs
    chosen = _CHOSEN.get(op.graph, {}).get(op.name)
    if chosen:
        kind, ps = chosen
        # A forward product's input needs no gradient: none, so W is never read here.
        grad_a = None if kind == FORWARD else tf.matmul(grad, b, transpose_b=True)
        # tf.gradients colocates a gradient with its forward op (on the worker for
        # weight_gradient): the weight gradient leaves that group for the kernel's ps.
        with tf.compat.v1.colocate_with(None, ignore_existing=True), tf.device(ps):
            return grad_a, tf.matmul(a, grad, transpose_a=True)
    ta, tb = op.get_attr("transpose_a"), op.get_attr("transpose_b")
    if not ta and not tb:
        return tf.matmul(grad, b, transpose_b=True), tf.matmul(a, grad, transpose_a=True)
    if not ta and tb:
        return tf.matmul(grad, b), tf.matmul(grad, a, transpose_a=True)
    if ta and not tb:
        return tf.matmul(b, grad, transpose_b=True), tf.matmul(a, grad)
    return (tf.matmul(b, grad, transpose_a=True, transpose_b=True),
            tf.matmul(grad, a, transpose_a=True, transpose_b=True))
