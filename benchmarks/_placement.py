"""How evenly lowlevel spreads a model's bytes over the ps tasks (run as its own process).

    python -m benchmarks._placement --hidden_units=512,512 --num_ps=2

prints one JSON line: {"tensorflow": version, "num_ps", "mlp": {...}, "cnn": {...}}, each
model with `variables` ({variable: [bytes, ps index]}), `loads` (bytes per ps),
`params` and `imbalance` (largest load / mean load).

It builds worker 0's real training graph the way the trainer does
(`lowlevel.cli.task_from_flags` / `config_from_flags`, `lowlevel.runtime.graph.build`) for
a cluster of `--num_ps` ps and 2 workers on unused addresses (nothing connects), and reads
where each trainable variable landed. So the figure follows whatever placement the runtime
uses (whole variables, or shards), not a copy of its rule. Every step moves each trainable
ps variable's bytes once each way (the worker reads the value, the ps reads the gradient),
so a ps's share of the bytes per step is its share of those bytes; optimizer slots never
cross the wire. Separate process: the benchmark driver never imports TensorFlow.
"""

from __future__ import annotations

import json
import re
import sys

from absl import flags

BENCH_FLAGS = {"--num_ps": "2", "--hidden_units": "512,512"}


def main(argv) -> int:
    opts = dict(BENCH_FLAGS)
    for a in argv[1:]:
        key, _, value = a.partition("=")
        if key not in opts:
            sys.stderr.write(f"_placement: unknown argument {a!r}; expected --num_ps=, "
                             "--hidden_units=\n")
            return 2
        opts[key] = value
    num_ps = int(opts["--num_ps"])
    from lowlevel import cli
    cli.define_trainer_flags()
    from lowlevel.tf_import import import_tensorflow
    tf = import_tensorflow()
    from lowlevel.data import images as data_lib
    from lowlevel.runtime import graph as graph_lib
    from lowlevel.runtime import placement, trainables

    data = data_lib.load("synthetic")
    ps = ",".join(f"127.0.0.1:{1 + k}" for k in range(num_ps))
    out = {"tensorflow": tf.__version__, "num_ps": num_ps,
           "hidden_units": [int(h) for h in opts["--hidden_units"].split(",")]}
    for model in ("mlp", "cnn"):
        flags.FLAGS(["_placement", f"--ps_hosts={ps}",
                     f"--worker_hosts=127.0.0.1:{num_ps + 1},127.0.0.1:{num_ps + 2}",
                     "--job_name=worker", "--task_index=0", "--dataset=synthetic",
                     f"--model={model}", f"--hidden_units={opts['--hidden_units']}"])
        cluster, task, _ = cli.task_from_flags()
        config = cli.config_from_flags(cluster.num_workers)
        g = graph_lib.build(config, trainables.Builtin(config, data), cluster, task, 0)
        variables, loads = {}, [0] * num_ps
        for v in g.graph.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES):
            m = re.search(r"/job:ps/task:(\d+)", v.device or "")
            if not m:
                continue
            k, size = int(m.group(1)), placement.op_bytes(v.op)
            variables[v.op.name] = [size, k]
            loads[k] += size
        mean = sum(loads) / num_ps
        out[model] = {"variables": variables, "loads": loads,
                      "params": sum(loads) // 4,
                      "imbalance": round(max(loads) / mean, 4) if mean else None}
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
