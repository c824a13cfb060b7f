"""What an exact step on 1 ps + 1 worker can cost at least, in TensorFlow's own distributed runtime.

    python -m benchmarks.exact_floor                 # 3 rounds, ~2.5 minutes on 2 cores
    python -m benchmarks.exact_floor --rounds=5 --window_secs=10

The performance issue's item 2 asks the exact mode for >= 0.55x the in-process trainer
on 1 ps + 1 worker. This takes the runtime out of the question: the quick benchmark's
model (MLP 784-512-512-10, 0.67 M float32 parameters, 2.7 MB; batch 128, a constant
in-graph batch, Adagrad lr 0.05) as bare TF1 graphs run by `make_callable`, one
`session.run` a step, a ps process with one intra-op thread (as `lowlevel.launch` gives
it) and the worker's client in the worker's process. Steps:

  local     one process, no server: compute and apply (the in-process reference).
  classic   read the 2.7 MB from the ps, compute, push 2.7 MB of gradients, the ps
            applies: the exact step as TensorFlow runs it.
  mirror    the read skipped: the worker keeps a copy of the parameters and Adagrad's
            accumulators and applies each step's update to it too; it computes on the
            copy while ps's version counter equals its own (no other worker pushed),
            else reads the ps. Push and apply as classic.
  floor     the same compute as `local` on the worker's copy plus one 8-byte read and
            one increment of a counter on the ps: nothing of the model crosses. Any step
            that touches the ps costs at least this.

Each launch warms up 200 steps, then counts steps in a `--window_secs` window and the CPU
of both processes (psutil). Rounds alternate the order (reversed every other round: this
machine's speed drifts). It prints one JSON line per launch and, per step, the median over
rounds of its examples/s over `local`'s in the same round.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time

import numpy as np
import portpicker
import psutil
from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_integer("rounds", 3, "Rounds of the four steps, each launched once a round.")
flags.DEFINE_float("window_secs", 5.0, "Seconds a launch is timed for, after 200 warm-up steps.")
flags.DEFINE_string("step", None, "Run one launch of this step and print its JSON line "
                    "(what a round runs; `ps:PORT:PORT` is the ps process).")

STEPS = ("local", "classic", "mirror", "floor")
LAYERS = (784, 512, 512, 10)
BATCH, LEARNING_RATE, INITIAL_ACCUMULATOR = 128, 0.05, 0.1
WARMUP_STEPS = 200
PS, WORKER = "/job:ps/task:0/device:CPU:0", "/job:worker/task:0/device:CPU:0"


def _tf():
    import tensorflow as tf
    tf.compat.v1.disable_eager_execution()
    tf.compat.v1.disable_control_flow_v2()  # a cond's untaken read crosses as a dead tensor
    return tf


def _shapes():
    out = []
    for fan_in, fan_out in zip(LAYERS[:-1], LAYERS[1:]):
        out += [(fan_in, fan_out), (fan_out,)]
    return out


def _variables(tf, prefix, local=False):
    """(parameters, Adagrad accumulators), float32, the MLP's shapes, seeded."""
    rng = np.random.RandomState(0)
    collections = [tf.compat.v1.GraphKeys.LOCAL_VARIABLES] if local else None
    params = [tf.compat.v1.get_variable(f"{prefix}w{i}", collections=collections,
                                        initializer=(rng.randn(*s) * 0.05).astype(np.float32))
              for i, s in enumerate(_shapes())]
    accumulators = [tf.compat.v1.get_variable(
        f"{prefix}acc{i}", collections=collections,
        initializer=np.full(s, INITIAL_ACCUMULATOR, np.float32)) for i, s in enumerate(_shapes())]
    return params, accumulators


def _loss(tf, params):
    x = tf.constant(np.random.RandomState(1).rand(BATCH, LAYERS[0]).astype(np.float32))
    y = tf.constant(np.random.RandomState(2).randint(0, LAYERS[-1], BATCH).astype(np.int32))
    h = x
    for i in range(len(LAYERS) - 1):
        h = tf.matmul(h, params[2 * i]) + params[2 * i + 1]
        h = tf.nn.relu(h) if i < len(LAYERS) - 2 else h
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=h))


def _apply(tf, params, accumulators, grads):
    lr = tf.constant(LEARNING_RATE)
    return [tf.raw_ops.ResourceApplyAdagrad(var=v.handle, accum=a.handle, lr=lr, grad=g)
            for v, a, g in zip(params, accumulators, grads)]


def _step(tf, step):
    """The step's op in the default graph."""
    v1 = tf.compat.v1
    v1.get_variable_scope().set_use_resource(True)
    if step == "local":
        params, accumulators = _variables(tf, "")
        return tf.group(_apply(tf, params, accumulators, tf.gradients(_loss(tf, params), params)))
    with v1.device(PS):
        params, accumulators = _variables(tf, "")
        version = v1.get_variable("version", initializer=np.int64(0))
    with v1.device(WORKER):
        if step == "classic":
            reads = [tf.identity(v.read_value()) for v in params]
            grads = tf.gradients(_loss(tf, reads), reads)
            with v1.device(PS):
                return tf.group(_apply(tf, params, accumulators, grads))
        copies, copy_accumulators = _variables(tf, "copy_", local=True)
        copy_version = v1.get_variable("copy_version", initializer=np.int64(0),
                                       collections=[v1.GraphKeys.LOCAL_VARIABLES])
        if step == "floor":
            used = [c.read_value() for c in copies]
        else:
            current = tf.equal(version.read_value(), copy_version.read_value())
            used = [tf.cond(current, c.read_value, lambda v=v: tf.identity(v.read_value()))
                    for c, v in zip(copies, params)]
        grads = tf.gradients(_loss(tf, used), used)
        with v1.device(PS):
            pushed = [] if step == "floor" else _apply(tf, params, accumulators, grads)
            with tf.control_dependencies(pushed):
                bumped = version.assign_add(1)
        local = _apply(tf, copies, copy_accumulators, grads)
        with tf.control_dependencies(local):
            return tf.group(copy_version.assign(bumped))


def _serve_ps(ps_port: int, worker_port: int) -> None:
    """The ps of a launch, until its launch process ends (it kills this one; if the launch
    itself was killed, this one sees its parent change and exits)."""
    parent = os.getppid()

    def exit_with_parent():
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(0)
    threading.Thread(target=exit_with_parent, daemon=True).start()
    tf = _tf()
    cluster = tf.train.ClusterSpec({"ps": [f"127.0.0.1:{ps_port}"],
                                    "worker": [f"127.0.0.1:{worker_port}"]})
    config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1)
    tf.distribute.Server(cluster, "ps", 0, config=config).join()


def _launch(step: str, window_secs: float) -> dict:
    """One launch of `step`: its examples/s and CPU ms per step (worker, ps)."""
    tf = _tf()
    v1 = tf.compat.v1
    ps = None
    if step == "local":
        target = ""
    else:
        ps_port, worker_port = portpicker.pick_unused_port(), portpicker.pick_unused_port()
        ps = subprocess.Popen([sys.executable, "-m", "benchmarks.exact_floor",
                               f"--step=ps:{ps_port}:{worker_port}"], stderr=subprocess.DEVNULL)
        cluster = tf.train.ClusterSpec({"ps": [f"127.0.0.1:{ps_port}"],
                                        "worker": [f"127.0.0.1:{worker_port}"]})
        target = tf.distribute.Server(cluster, "worker", 0).target
    try:
        with tf.Graph().as_default():
            op = _step(tf, step)
            session = v1.Session(target)
            session.run([v1.global_variables_initializer(), v1.local_variables_initializer()])
            run = session.make_callable(op)
        for _ in range(WARMUP_STEPS):
            run()
        processes = [psutil.Process()] + ([psutil.Process(ps.pid)] if ps else [])
        cpu_before = [p.cpu_times() for p in processes]
        started, steps = time.perf_counter(), 0
        while time.perf_counter() - started < window_secs:
            run()
            steps += 1
        elapsed = time.perf_counter() - started
        cpu = [(a.user + a.system - b.user - b.system) / steps * 1000
               for a, b in zip((p.cpu_times() for p in processes), cpu_before)]
    finally:
        if ps is not None:
            ps.kill()
            ps.wait()
    return {"step": step, "examples_per_sec": round(steps * BATCH / elapsed),
            "ms_per_step": round(elapsed / steps * 1000, 3),
            "worker_cpu_ms_per_step": round(cpu[0], 2),
            "ps_cpu_ms_per_step": round(cpu[1], 2) if ps else 0.0}


def main(argv):
    del argv
    if FLAGS.step and FLAGS.step.startswith("ps:"):
        _, ps_port, worker_port = FLAGS.step.split(":")
        return _serve_ps(int(ps_port), int(worker_port))
    if FLAGS.step:
        print(json.dumps(_launch(FLAGS.step, FLAGS.window_secs)), flush=True)
        return
    ratios = {s: [] for s in STEPS if s != "local"}
    for r in range(FLAGS.rounds):
        rate = {}
        for step in (STEPS if r % 2 == 0 else STEPS[::-1]):
            out = subprocess.run([sys.executable, "-m", "benchmarks.exact_floor",
                                  f"--step={step}", f"--window_secs={FLAGS.window_secs}"],
                                 capture_output=True, text=True, check=True).stdout
            result = json.loads(out.strip().splitlines()[-1])
            print(json.dumps({"round": r, **result}), flush=True)
            rate[step] = result["examples_per_sec"]
        for step in ratios:
            ratios[step].append(round(rate[step] / rate["local"], 3))
    for step, values in ratios.items():
        print(f"{step} / local: median {statistics.median(values):.3f} (rounds {values})")


if __name__ == "__main__":
    app.run(main)
