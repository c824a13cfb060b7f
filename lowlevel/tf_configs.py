"""Prints the `TF_CONFIG` and trainer flags of every task of a cluster.

    lowlevel-make-tf-configs --chief=10.0.0.1:2222 --workers=10.0.0.2:2222,10.0.0.3:2222 \\
        --ps=10.0.0.4:2222 --sync --evaluator --output_dir=/shared/run1 -- --train_steps=5000
    lowlevel-make-tf-configs --workers=h1:2222,h2:2222,h3:2222 --ps=h4:2222,h5:2222

Each line is one task, ready to paste on its machine:

    TF_CONFIG='{"cluster": {...}, "task": {"type": "worker", "index": 1}}' python -m lowlevel.trainer --schedule=train ...

The counterpart of tensor2tensor's `t2t-make-tf-configs`, whose `--masters`
and `--ps` mean different things in its sync and async layouts; here the
flags say what each address is. Both of its layouts are covered: sync
training with a single chief (`--chief` and `--workers`, `--sync`), and async
training with several workers and ps tasks (`--workers`, worker 0 being the
chief). Flags after `--` are passed to every task. `--format=json` prints a
JSON list of {job, task_index, tf_config, flags, command} for tools.
"""

from __future__ import annotations

import json
import shlex
import sys

from absl import app, flags

from lowlevel.cluster import CHIEF, EVALUATOR, PS, WORKER, Cluster, parse_hosts
from lowlevel.config import UsageError, check_schedule, exit_status_main

FLAGS = flags.FLAGS
flags.DEFINE_string("chief", "", "host:port of the chief (a job of its own). Without it, "
                    "worker 0 is the chief.")
flags.DEFINE_string("workers", "", "Comma-separated host:port of the workers.")
flags.DEFINE_string("ps", "", "Comma-separated host:port of the ps tasks.")
flags.DEFINE_boolean("sync", False, "Synchronous training (adds --sync to every task).")
flags.DEFINE_boolean("evaluator", False, "Add an evaluator task (continuous_eval); it needs "
                     "no address: it reads the checkpoints in --output_dir.")
flags.DEFINE_string("output_dir", None, "--output_dir of every task: a directory all tasks "
                    "share (required with --evaluator).")
flags.DEFINE_enum("format", "shell", ["shell", "json"], "shell: one command line per task; "
                  "json: a list of objects.")
flags.DEFINE_string("python", "python", "The Python command in the printed lines.")


def make_tasks(cluster: Cluster, sync: bool, evaluator: bool, output_dir: str | None,
               extra: list[str], python: str = "python") -> list[dict]:
    """One dict per task: job, task_index, tf_config (dict), flags (list), command (str)."""
    spec = cluster.as_dict()
    common = ([f"--output_dir={output_dir}"] if output_dir else []) + (
        ["--sync"] if sync else []) + list(extra)
    jobs = [(CHIEF, i) for i in range(len(cluster.chief_hosts))]
    jobs += [(WORKER, i) for i in range(len(cluster.worker_hosts))]
    jobs += [(PS, i) for i in range(cluster.num_ps)]
    jobs += [(EVALUATOR, 0)] if evaluator else []
    tasks = []
    for job, index in jobs:
        tf_config = {"cluster": spec, "task": {"type": job, "index": index}}
        argv = [f"--schedule={check_schedule(None, job)}", *common]
        command = (f"TF_CONFIG={shlex.quote(json.dumps(tf_config))} {python} -m "
                   f"lowlevel.trainer {' '.join(shlex.quote(a) for a in argv)}")
        tasks.append({"job": job, "task_index": index, "tf_config": tf_config, "flags": argv,
                      "command": command})
    return tasks


def main(argv) -> int:
    extra = argv[1:]
    for arg in extra:
        if not arg.startswith("--"):
            raise UsageError(f"unexpected argument {arg!r}: trainer flags go after '--' "
                                 "as --name=value")
        if arg.split("=")[0] in ("--job_name", "--task_index", "--ps_hosts", "--worker_hosts",
                                 "--schedule"):
            raise UsageError(f"{arg}: set by TF_CONFIG and this tool; drop it")
    chief = parse_hosts(FLAGS.chief, "--chief")
    try:
        cluster = Cluster(parse_hosts(FLAGS.ps, "--ps"), parse_hosts(FLAGS.workers, "--workers"),
                          chief)
    except UsageError as e:
        raise UsageError(str(e).replace("--ps_hosts", "--ps").replace(
            "--worker_hosts", "--workers")) from None
    if FLAGS.evaluator and not FLAGS.output_dir:
        raise UsageError("--evaluator needs --output_dir: the evaluator reads the "
                             "checkpoints the chief writes there")
    tasks = make_tasks(cluster, FLAGS.sync, FLAGS.evaluator, FLAGS.output_dir, extra,
                       FLAGS.python)
    mode = "sync" if FLAGS.sync else "async"
    chief_note = "a chief job" if chief else "worker 0 as the chief"
    sys.stderr.write(f"# {mode} training, {chief_note}: {cluster.num_workers} training "
                     f"task(s), {cluster.num_ps} ps{', an evaluator' if FLAGS.evaluator else ''}"
                     "; run each line on its machine, in any order\n")
    if FLAGS.format == "json":
        print(json.dumps(tasks, indent=2))
    else:
        for task in tasks:
            print(task["command"])
    return 0


def _parse_flags(argv):
    try:
        return FLAGS(argv)
    except flags.Error as e:
        sys.stderr.write(f"lowlevel-make-tf-configs: error: {e}\n")
        sys.exit(2)


def run():
    """Console-script entry point (`lowlevel-make-tf-configs`)."""
    app.run(exit_status_main("lowlevel-make-tf-configs", main), flags_parser=_parse_flags)


if __name__ == "__main__":
    run()
