"""How evenly lowlevel's placement spreads a model's bytes over the ps tasks (run as a process).

    python -m benchmarks._placement --hidden_units=512,512 --num_ps=2

prints one JSON line: {"tensorflow": version, "mlp": {...}, "cnn": {...}}, each model with
`sizes` ({variable: bytes}), `assignment` ({variable: ps index}), `loads` (bytes per ps)
and `imbalance` (largest load / mean load). It uses the runtime's own
`lowlevel.placement.measure_variables` and `plan` on `lowlevel.models.build` for 28x28x1
images (the synthetic data's shape), so it is the plan the workers follow. Every step moves
each variable's bytes once each way (the worker reads the value, the ps reads the
gradient), so a ps's share of the bytes per step is its share of the variable bytes
(optimizer slots never cross the wire). It runs in its own process so the benchmark
driver never imports TensorFlow.
"""

from __future__ import annotations

import json

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_list("hidden_units", ["512", "512"], "MLP hidden widths; the CNN uses the first.")
flags.DEFINE_integer("num_ps", 2, "Number of ps tasks to plan for.")


def main(_):
    from lowlevel._tf import import_tensorflow
    tf = import_tensorflow()
    from lowlevel import models, placement

    hidden = [int(h) for h in FLAGS.hidden_units]
    out = {"tensorflow": tf.__version__, "num_ps": FLAGS.num_ps, "hidden_units": hidden}
    for name in ("mlp", "cnn"):
        sizes = placement.measure_variables(
            lambda: models.build(name, tf.zeros([1, 28, 28, 1]), 10, hidden))
        assignment = placement.plan(sizes, FLAGS.num_ps)
        loads = placement.loads(sizes, assignment, FLAGS.num_ps)
        mean = sum(loads) / len(loads)
        out[name] = {"sizes": sizes, "assignment": assignment, "loads": loads,
                     "params": sum(sizes.values()) // 4,
                     "imbalance": round(max(loads) / mean, 4) if mean else None}
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    app.run(main)
