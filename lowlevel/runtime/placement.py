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

from lowlevel.cluster.spec import CHIEF, WORKER

v1 = tf.compat.v1

PS_CPU = "/job:ps/device:CPU:0"
SHARDS_PER_PS = 8  # shards of a ps's fair share: max/mean <= 1.075 on the models here
MIN_SHARD_BYTES = 64 << 10  # no point in splitting smaller than this
# An embedding table is split into a multiple of num_ps shards of at most this: one
# shard per ps for the tables here (few shards: each is one gather and one sparse
# update per step), more only where one would be unwieldy to save and restore.
TABLE_SHARD_BYTES = 1 << 30


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


def partitioner(num_ps: int, total_bytes: int, table_bytes: int = 0):
    """The variable partitioner for a model of `total_bytes` on `num_ps` ps tasks, or None.

    Shards of at most max(total_bytes / (SHARDS_PER_PS * num_ps),
    MIN_SHARD_BYTES) bytes, split along axis 0; None with one ps.

    With embedding tables (`table_bytes` of the total), every table is split
    by rows into a multiple of `num_ps` equal shards of at most
    `TABLE_SHARD_BYTES` (`.for_tables` of the result, which `embeddings.table`
    uses): each ps holds the same share of every table, and a batch's rows,
    spread over a table by `embeddings.FieldTable`, cost each ps the same.
    The other variables get an `EvenShards` partitioner of their own bytes:
    they are read and updated whole every step while a table moves only the
    rows a batch touches, so per-step traffic is balanced only if the dense
    part is spread evenly too.
    """
    if num_ps <= 1:
        return None
    max_shard = max(total_bytes // (SHARDS_PER_PS * num_ps), MIN_SHARD_BYTES)
    if not table_bytes:
        return v1.variable_axis_size_partitioner(max_shard_bytes=max_shard)
    dense = EvenShards(num_ps, max(MIN_SHARD_BYTES, (total_bytes - table_bytes) //
                                   (SHARDS_PER_PS * num_ps)), split_above=None)
    dense.for_tables = EvenShards(num_ps, TABLE_SHARD_BYTES, split_above=0)
    return dense


class EvenShards:
    """Splits a variable into a multiple of `num_ps` shards along axis 0 (a partitioner).

    A variable above `split_above` bytes (default max_shard / num_ps) gets
    num_ps x ceil(bytes / (num_ps x max_shard)) shards, so the per-group plan
    gives every ps the same share of it (wide & deep's 429 x 128 kernel on 2
    ps: 4 shards, its 128 x 128 one: 2); smaller ones stay whole.
    `for_tables`: the partitioner of the embedding tables, if this one is the
    dense variables'.
    """

    def __init__(self, num_ps: int, max_shard: int, split_above=None):
        self.num_ps = num_ps
        self.max_shard = max_shard
        self.split_above = max_shard // num_ps if split_above is None else split_above
        self.for_tables = None

    def __call__(self, shape, dtype, **_):
        shape = tf.TensorShape(shape)
        parts = [1] * shape.rank
        size = (shape.num_elements() or 0) * tf.as_dtype(dtype).size
        if shape.rank and size > self.split_above:
            k = -(-size // (self.max_shard * self.num_ps)) * self.num_ps
            parts[0] = min(k, shape[0])
        return parts


def measure(build: Callable[[], object], partitioner=None) -> tuple[dict[str, int], set]:
    """As `measure_variables`, plus the names of the variables that are embedding tables."""
    variables, tables = _scratch(build, partitioner=partitioner)
    return {name: op_bytes(v.op) for name, v in variables.items()}, tables


def _scratch(build: Callable[[], object], **scope) -> tuple[dict, set]:
    """({variable op name: variable}, names of the embedding tables) of `build()` in a
    scratch graph, under a variable scope with `scope` (a partitioner, a custom getter)."""
    from lowlevel.models import embeddings  # noqa: PLC0415 (placement does not need it otherwise
    with tf.Graph().as_default() as graph:
        with v1.variable_scope(v1.get_variable_scope(), **scope):
            build()
        return ({v.op.name: v for v in v1.global_variables()},
                {t.op.name for t in graph.get_collection(embeddings.TABLES)})


def measure_sharded(build: Callable[[object], object], partitioner_of: Callable[[int, int], object]
                    ) -> tuple[dict[str, int], set, object]:
    """(sizes, tables, partitioner): `measure(lambda: build(p), p)` for the partitioner
    `p = partitioner_of(total bytes, table bytes)` of the model's own size, from one build.

    Sizing the shards needs the model's bytes, so this took two scratch builds of the
    model: whole, then sharded (7-13 % of a worker's graph build, paid at every start,
    restart and join; benchmarks/NOTES.md, twenty-seventh stop). Here `build` gets a
    stand-in partitioner that splits nothing and notes which variables ask for it, or
    for its `.for_tables` (`embeddings.table`); the model is measured whole, `p` made
    from its bytes, and each variable that asked is cut as TensorFlow's variable store
    cuts it with `p` (`_shards`). tests/test_placement.py checks this against two builds
    for the built-in models.
    """
    stand_in = _AsksFor(_AsksFor())
    asked = {}  # variable name -> "dense" | "tables"

    def note(getter, name, **kwargs):
        role = ("dense" if kwargs.get("partitioner") is stand_in else
                "tables" if kwargs.get("partitioner") is stand_in.for_tables else None)
        if role:
            asked[name] = role
            kwargs["partitioner"] = None
        return getter(name=name, **kwargs)

    whole, tables = _scratch(lambda: build(stand_in), custom_getter=note)
    sizes = {name: op_bytes(v.op) for name, v in whole.items()}
    partitioner = partitioner_of(sum(sizes.values()), sum(sizes[n] for n in tables))
    sharded, sharded_tables = {}, set()
    for name, v in whole.items():
        role = asked.get(name)
        cut = (partitioner if role == "dense" else
               getattr(partitioner, "for_tables", None) if role == "tables" else None)
        whole_only = cut is None or not v.shape.rank  # TensorFlow cuts no scalar
        shards = {name: sizes[name]} if whole_only else _shards(name, v.shape,
                                                                v.dtype.base_dtype, cut)
        sharded.update(shards)
        if name in tables:
            sharded_tables.update(shards)
    return sharded, sharded_tables, partitioner


class _AsksFor:
    """A partitioner that splits nothing (`measure_sharded`'s stand-in); `.for_tables`: the
    tables' one, or None."""

    def __init__(self, for_tables=None):
        self.for_tables = for_tables

    def __call__(self, shape, dtype, **_):
        return [1] * tf.TensorShape(shape).rank


def _shards(name: str, shape: tf.TensorShape, dtype, partitioner) -> dict[str, int]:
    """{"<name>/part_<i>": bytes} of a variable of `shape` cut by `partitioner`, as
    TensorFlow 2.21's variable store cuts it (`variable_scope._get_slice_dim_and_num_slices`
    and `_iter_slices`): along the first axis with more than one part (none: one part),
    `rows // n` rows each and one more in the first `rows % n`."""
    slicing = partitioner(shape=shape, dtype=dtype)
    axis, n = next(((i, k) for i, k in enumerate(slicing) if k > 1), (0, 1))
    rows = shape[axis]
    per_row = shape.num_elements() // rows * tf.as_dtype(dtype).size if rows else 0
    return {f"{name}/part_{i}": (rows // n + (i < rows % n)) * per_row for i in range(n)}


def grouped_plan(sizes: Mapping[str, int], num_ps: int, group) -> dict[str, int]:
    """`plan` of the variables in `group` (names) and, separately, of the others.

    Each group is balanced on its own, so both are spread evenly (the tables'
    bytes would otherwise let the small dense part land anywhere).
    """
    inside = {n: b for n, b in sizes.items() if n in group}
    outside = {n: b for n, b in sizes.items() if n not in group}
    return {**_spread(inside, num_ps), **plan(outside, num_ps)}


def _spread(sizes: Mapping[str, int], num_ps: int) -> dict[str, int]:
    """Like `plan`, but the shards of one variable ("name/part_K") go to the ps tasks in turn.

    A table's traffic follows the rows a batch touches, which its shards share
    evenly: so each split table is spread evenly (its shard count is a multiple
    of num_ps, `EvenShards`), largest tables first, starting at the least-loaded ps.
    """
    groups: dict[str, list] = {}
    for name in sorted(sizes):
        groups.setdefault(name.rsplit("/part_", 1)[0], []).append(name)
    loads, assignment = [0] * num_ps, {}
    for _, names in sorted(groups.items(), key=lambda kv: (-sum(sizes[n] for n in kv[1]), kv[0])):
        order = sorted(range(num_ps), key=lambda i: (loads[i], i))
        for j, name in enumerate(sorted(names, key=lambda n: (-sizes[n], n))):
            k = order[j % num_ps] if len(names) > 1 else order[0]
            assignment[name] = k
            loads[k] += sizes[name]
    return assignment


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


def with_slots_folded(sizes: Mapping[str, int]) -> dict[str, int]:
    """`sizes` with each optimizer slot folded into its variable's bytes.

    A slot ("model/hidden0/kernel/Adagrad", ".../Adam_1": a name below another variable's)
    is made colocated with its variable (`slot_creator`), so it lives where its variable
    does; planned apart, it would move nothing and only unbalance the plan. A model
    measured in TRAIN mode (a user's model_fn, `trainables.ModelFn.placed`) has them: before
    this, every variable of a 2-ps model_fn's plan went to ps 0 and its slot to ps 1, and so
    all of them to ps 0.
    """
    folded: dict[str, int] = {}
    for name in sorted(sizes, key=len):  # a variable before the slots below it
        parts = name.split("/")
        owner = next((o for o in ("/".join(parts[:k]) for k in range(1, len(parts)))
                      if o in folded), None)
        if owner is None:
            folded[name] = sizes[name]
        else:
            folded[owner] += sizes[name]
    return folded


class ByteBalancedStrategy:
    """A `ps_strategy` for `replica_device_setter`: `__call__(op) -> ps task index`.

    Follows `plan(sizes, num_ps)` (`grouped_plan` with the names of the embedding
    `tables`; each variable's slots folded into its bytes, `with_slots_folded`) for the
    variables it knows and sends any other
    variable op to the currently least-loaded ps.
    """

    def __init__(self, sizes: Mapping[str, int], num_ps: int, tables=()):
        self._num_ps = num_ps
        sizes = with_slots_folded(sizes)
        self.assignment = grouped_plan(sizes, num_ps, set(tables)) if tables else \
            plan(sizes, num_ps)
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


def towers(requested: int, worker_gpu: int, training_tasks_on_host: int) -> int:
    """How many towers (replicas of the step, `lowlevel.modes.towers`) a training task builds.

    Args:
      requested: `--towers`; 0 chooses: the GPUs of the machine shared among its
        training tasks (`worker_gpu // training_tasks_on_host`, at least 1); 1 on a CPU.
      worker_gpu: GPUs per worker (0: none).
      training_tasks_on_host: the chief and workers on this task's machine, itself included.
    """
    if requested:
        return requested
    return max(1, worker_gpu // max(1, training_tasks_on_host)) if worker_gpu else 1


def tower_devices(task_index: int, worker_gpu: int, towers: int,
                  job_name: str = "worker") -> list:
    """The devices of a training task's towers, and its hub (where the towers' shared reads
    and summed gradients live) first.

    One tower: `[worker_device(...)]`, the hub itself. N towers on GPUs: GPU
    `(task_index x N + j) mod worker_gpu` for tower j, so N = worker_gpu uses
    every GPU and tasks on one machine with N = worker_gpu / tasks take
    disjoint GPUs; hub: the task's CPU. N towers with no GPU: the task's
    logical CPU devices 0 .. N-1 (its server has N: `server.session_config`).

    Returns:
      (hub, [tower device]): e.g. tower_devices(1, 4, 2) ==
      ("/job:worker/task:1/device:CPU:0", ["/job:worker/task:1/device:GPU:2",
      "/job:worker/task:1/device:GPU:3"]).
    """
    if towers <= 1:
        device = worker_device(task_index, worker_gpu, job_name)
        return device, [device]
    task = f"/job:{job_name}/task:{task_index}"
    if worker_gpu:
        return (f"{task}/device:CPU:0",
                [f"{task}/device:GPU:{(task_index * towers + j) % worker_gpu}"
                 for j in range(towers)])
    return f"{task}/device:CPU:0", [f"{task}/device:CPU:{j}" for j in range(towers)]


def task_devices(cluster, task, requested: int, worker_gpu: int):
    """(hub, [tower device]) of training task `task` (a `Cluster`'s): `towers` (with the
    training tasks on its machine) and `tower_devices`; (None, [None]) with no cluster."""
    if not cluster:
        return None, [None]
    n = towers(requested, worker_gpu,
               cluster.tasks_on_host_of(task.job_name, task.task_index, (CHIEF, WORKER)))
    return tower_devices(task.task_index, worker_gpu, n, task.job_name)


def device_setter(cluster: Mapping[str, list], task_index: int, worker_gpu: int,
                  sizes: Optional[Mapping[str, int]] = None, job_name: str = "worker",
                  tables=(), worker: Optional[str] = None):
    """A device function for `tf.device(...)` on training task `job_name`/`task_index`.

    Args:
      cluster: {"ps": [...], "worker": [...]} (as `Cluster.as_dict()`).
      task_index: this task's index in its job.
      worker_gpu: GPUs per worker (0: compute on the worker's CPU).
      sizes: {variable op name: bytes} of the model, from `measure_variables`.
      job_name: "worker", or "chief" for the task of a chief job.
      tables: the names in `sizes` that are embedding tables (planned apart).
      worker: the compute device, if not `worker_device(task_index, worker_gpu)` (the
        hub of a task's towers).
    Returns:
      The `replica_device_setter` device function.
    """
    num_ps = len(cluster["ps"])
    return v1.train.replica_device_setter(
        ps_device=PS_CPU,
        worker_device=worker or worker_device(task_index, worker_gpu, job_name),
        cluster=dict(cluster),
        ps_strategy=ByteBalancedStrategy(sizes or {}, num_ps, tables))
