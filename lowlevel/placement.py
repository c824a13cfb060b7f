"""Where every op runs: variables on ps CPUs, balanced by bytes; compute on the worker.

`tf.compat.v1.train.replica_device_setter` places variable ops on
`/job:ps/task:K/device:CPU:0` and everything else on the worker's device. Its
default choice of K is round-robin, which piles a big layer and a small one on
the same ps; the contrib byte-size balancer is gone from TensorFlow 2. Here the
model's variables are measured first (built once in a scratch graph) and
assigned greedily, largest first, each to the least-loaded ps (the LPT rule,
within 4/3 of the best possible maximum load; Graham 1969).

Whole variables cannot be balanced when one dominates: the first kernel of
the MLP 784-512-512-10 is 60 % of its bytes, so with 2 ps the fuller one holds
1.2 times the mean whatever the assignment, and the CNN's dense layer makes it
1.8. With several ps tasks, variables are therefore split along their first
axis into shards of at most 1/`SHARDS_PER_PS` of a ps's fair share
(`partitioner`, TensorFlow's `variable_axis_size_partitioner`): 1.05 for the
MLP and 1.004 for the CNN with 2 ps. A sharded variable is read as one tensor
(its shards concatenated on the worker) and saved as one: checkpoints do not
depend on the number of ps tasks. Variables the plan
does not know (global_step, optimizer bookkeeping) go to the least-loaded ps
as they are created. Optimizer slots (Adagrad accumulators, Adam moments) are
colocated with their variable, so they follow it.
"""

from __future__ import annotations

from typing import Callable, Mapping, Optional

import tensorflow as tf

v1 = tf.compat.v1

PS_CPU = "/job:ps/device:CPU:0"
SHARDS_PER_PS = 8  # shards of a ps's fair share: max/mean <= 1.075 on the models here
MIN_SHARD_BYTES = 64 << 10  # no point in splitting smaller than this


def op_bytes(op) -> int:
    """Bytes of the variable an op creates (`VarHandleOp`, `VariableV2`, ...); 0 if unknown."""
    try:
        shape = tf.TensorShape(op.get_attr("shape"))
        dtype = tf.as_dtype(op.get_attr("dtype"))
    except (ValueError, TypeError):
        return 0
    n = shape.num_elements() if shape.is_fully_defined() else None
    return (n or 0) * dtype.size


def measure_variables(build: Callable[[], object], partitioner=None) -> dict[str, int]:
    """Builds `build()` in a scratch graph; returns {variable op name: bytes}.

    With `partitioner` the variables are built sharded, and each shard
    ("model/hidden0/kernel/part_3") is measured.
    """
    with tf.Graph().as_default():
        with v1.variable_scope(v1.get_variable_scope(), partitioner=partitioner):
            build()
        return {v.op.name: op_bytes(v.op) for v in v1.global_variables()}


def partitioner(num_ps: int, total_bytes: int):
    """The variable partitioner for a model of `total_bytes` on `num_ps` ps tasks, or None.

    Shards of at most max(total_bytes / (SHARDS_PER_PS * num_ps),
    MIN_SHARD_BYTES) bytes, split along axis 0; None with one ps.
    """
    if num_ps <= 1:
        return None
    max_shard = max(total_bytes // (SHARDS_PER_PS * num_ps), MIN_SHARD_BYTES)
    return v1.variable_axis_size_partitioner(max_shard_bytes=max_shard)


def plan(sizes: Mapping[str, int], num_ps: int) -> dict[str, int]:
    """Assigns each variable to a ps task: largest first, to the least-loaded.

    Args:
      sizes: {variable op name: bytes}.
      num_ps: number of ps tasks (>= 1).
    Returns:
      {variable op name: ps task index}. Deterministic: ties go to the lower
      task index and, among equal sizes, to the name that sorts first.
    """
    loads = [0] * num_ps
    assignment = {}
    for name, size in sorted(sizes.items(), key=lambda kv: (-kv[1], kv[0])):
        k = min(range(num_ps), key=lambda i: (loads[i], i))
        assignment[name] = k
        loads[k] += size
    return assignment


def loads(sizes: Mapping[str, int], assignment: Mapping[str, int], num_ps: int) -> list[int]:
    """Bytes held by each ps task under `assignment`."""
    out = [0] * num_ps
    for name, k in assignment.items():
        out[k] += sizes.get(name, 0)
    return out


class ByteBalancedStrategy:
    """A `ps_strategy` for `replica_device_setter`: `__call__(op) -> ps task index`.

    Follows `plan(sizes, num_ps)` for the variables it knows and sends any other
    variable op to the currently least-loaded ps.
    """

    def __init__(self, sizes: Mapping[str, int], num_ps: int):
        self._num_ps = num_ps
        self.assignment = plan(sizes, num_ps)
        self.loads = loads(sizes, self.assignment, num_ps)

    def __call__(self, op) -> int:
        if op.name in self.assignment:
            return self.assignment[op.name]
        k = min(range(self._num_ps), key=lambda i: (self.loads[i], i))
        self.loads[k] += op_bytes(op)
        self.assignment[op.name] = k
        return k


def worker_device(task_index: int, worker_gpu: int, job_name: str = "worker") -> str:
    """The device of a training task's compute: GPU `task_index mod worker_gpu`, or its CPU.

    E.g. worker_device(3, 2) == "/job:worker/task:3/device:GPU:1".
    """
    if worker_gpu > 0:
        return f"/job:{job_name}/task:{task_index}/device:GPU:{task_index % worker_gpu}"
    return f"/job:{job_name}/task:{task_index}/device:CPU:0"


def device_setter(cluster: Mapping[str, list], task_index: int, worker_gpu: int,
                  sizes: Optional[Mapping[str, int]] = None, job_name: str = "worker"):
    """A device function for `tf.device(...)` on training task `job_name`/`task_index`.

    Args:
      cluster: {"ps": [...], "worker": [...]} (as `Cluster.as_dict()`).
      task_index: this task's index in its job.
      worker_gpu: GPUs per worker (0: compute on the worker's CPU).
      sizes: {variable op name: bytes} of the model, from `measure_variables`.
      job_name: "worker", or "chief" for the task of a chief job.
    Returns:
      The `replica_device_setter` device function.
    """
    num_ps = len(cluster["ps"])
    return v1.train.replica_device_setter(
        ps_device=PS_CPU,
        worker_device=worker_device(task_index, worker_gpu, job_name),
        cluster=dict(cluster),
        ps_strategy=ByteBalancedStrategy(sizes or {}, num_ps))
