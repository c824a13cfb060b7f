"""The communication-reduced mode's optimizer state, in checkpoints under the exact mode's names.

In the communication-reduced mode (`lowlevel.modes.local_sgd`) each worker's
optimizer works on its own copy of the model, so its slots (Adagrad's
accumulators, Momentum's and Adam's moments) and non-slot variables (Adam's
`beta1_power`, `beta2_power`) are worker-local variables, which a checkpoint
does not hold. A checkpoint of that mode therefore lacked what the exact mode
and in-process training restore (measured: `model.ckpt-600 has no variable
model/hidden1/kernel/Adagrad`), and a run resumed in that mode started its
optimizer cold.

`Mirrors` gives each such worker-local variable a global twin on a ps (beside
its model variable's first shard; non-slot variables beside global_step),
saved under the name the exact mode saves it under
(`model/hidden0/kernel/local/Adagrad` -> `model/hidden0/kernel/Adagrad`):

- before each checkpoint the chief copies its local state to the twins
  (`save_state`, run by `checkpoints.StateSaver`): the checkpoint holds the
  chief's optimizer state, which is one worker's view (each worker's slots
  saw only its own gradients);
- after its local init every worker loads its local state from the twins
  (`load_state`): from the restored checkpoint (any mode's), or on a fresh
  start the optimizer's initial values.

So a run resumed in any mode from a checkpoint of any mode starts warm. The
twins move only at checkpoints and session starts: no extra bytes per step.

Except the `shared` slots (async, `local_sgd.ADDITIVE_SLOTS`: Adagrad's and FTRL's
accumulators): their twins are the one state of all workers, which each
exchange adds the worker's delta to and pulls back (`shared_copies`, as a model
variable's copy), so `save_state` leaves them alone and a checkpoint holds every
worker's steps, as the exact mode's does. An exchange then moves twice the
model's bytes with Adagrad, three times with FTRL.
"""

from __future__ import annotations

import tensorflow as tf

v1 = tf.compat.v1

SCOPE = "optimizer_state"  # the twins' op names: SCOPE/<name in checkpoints>


class Mirrors:
    """Global twins of the optimizer's worker-local variables.

    Args:
      local_state: the variables the optimizer created for the worker's copies.
      copies: {name of a copy variable ("model/hidden0/kernel/local"): (name
        of its model variable, device of the model variable's first shard)}.
      default_device: where variables that belong to no copy go (global_step's
        device).

      shared: the slots among `local_state` that the async exchange shares among the
        workers (`local_sgd.ADDITIVE_SLOTS`): their twins are the shared state, which the
        exchange adds each worker's delta to and pulls from (`shared_copies`), so the
        chief's `save_state` leaves them alone.

    Attributes:
      names: {name in checkpoints: twin}, for `checkpoints.saved_names`.
      save_state: op: twins := the local state (the chief runs it before saving).
    """

    def __init__(self, local_state, copies: dict, default_device: str, shared=()):
        self.names = {}
        self._pairs = []  # (local variable, its twin)
        self._anchors = {}  # id(shared slot): (its anchor, its diff), worker-local
        shared_ids = {id(v) for v in shared}
        saves = []
        for var in local_state:
            name, device = _checkpoint_name(var.op.name, copies), default_device
            for copy_name, (model_name, model_device) in copies.items():
                if _copy_prefix(var.op.name, copy_name) is not None:
                    device = model_device
            with v1.device(None), v1.device(device):
                twin = v1.Variable(var.initial_value, trainable=False,
                                   name=f"{SCOPE}/{name}")
            if id(var) in shared_ids:
                self._anchors[id(var)] = _anchor_and_diff(var)
            else:
                saves.append(twin.assign(var.read_value(), read_value=False))
            self._pairs.append((var, twin))
            self.names[name] = twin
        self.save_state = tf.group(saves, name="save_optimizer_state")

    def load_state(self, after) -> tf.Operation:
        """Op: local state := twins, each assignment run after `after` (the local variables'
        initializer, which would otherwise race it and may overwrite a loaded slot with
        its initial value: a resumed communication-reduced run once saved fresh Adagrad
        accumulators, 0.1, in place of the restored ones)."""
        loads = []
        with tf.control_dependencies([after]):
            for var, twin in self._pairs:
                with v1.device(None), v1.device(var.device):
                    value = twin.read_value()
                    loads.append(var.assign(value, read_value=False))
                    if id(var) in self._anchors:  # the exchange's delta starts at 0
                        loads.append(self._anchors[id(var)][0].assign(value,
                                                                      read_value=False))
        return tf.group(loads, name="load_optimizer_state")

    def shared_copies(self) -> list:
        """[(twin, slot, anchor, diff)] of each shared slot: what `exchange.async_exchange`
        exchanges as it does a model variable's copy (`local_sgd.Copy`: shards [twin])."""
        return [(twin, var, *self._anchors[id(var)]) for var, twin in self._pairs
                if id(var) in self._anchors]


def _anchor_and_diff(slot):
    """A shared slot's worker-local anchor (the twin's value the last exchange brought;
    set by `load_state`) and diff (what the last exchange brought from the others), beside it."""
    with v1.device(None), v1.device(slot.device):
        return tuple(v1.Variable(tf.zeros(slot.shape, slot.dtype.base_dtype), trainable=False,
                                 name=f"{slot.op.name}/{role}",
                                 collections=[v1.GraphKeys.LOCAL_VARIABLES])
                     for role in ("anchor", "diff"))


def _checkpoint_name(local_name: str, copies: dict) -> str:
    """The exact mode's name of a local optimizer variable.

    A slot of a copy "<model variable>/local" is "<model variable>/local/<slot>"
    (Adam's second moment "<...>/local/Adam_1"), which the exact mode calls
    "<model variable>/<slot>"; other variables (beta1_power) keep their name.
    """
    for copy_name, (model_name, _) in copies.items():
        prefix = _copy_prefix(local_name, copy_name)
        if prefix is not None:
            return prefix + model_name + local_name[len(prefix) + len(copy_name):]
    return local_name


def _copy_prefix(local_name: str, copy_name: str):
    """What stands before `copy_name` in `local_name` when `local_name` is a variable of that
    copy: "" for a TF1 slot ("<copy>/Adagrad"), "training/Adagrad/" for a Keras-named one
    (a canned estimator's "training/Adagrad/<copy>/accumulator", as 2.15 names it); None
    when it is not."""
    if local_name.startswith(copy_name + "/"):
        return ""
    at = local_name.find("/" + copy_name + "/")
    return None if at < 0 else local_name[:at + 1]
