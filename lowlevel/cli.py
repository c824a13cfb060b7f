"""The command lines: the trainer's flags, flag parsing with `--help`, and the exit-status mains.

The trainer's flags are defined here (`define_trainer_flags`), not by importing
`lowlevel.trainer`, so the launcher (which passes them on to every task), the
forked tasks and the benchmarks share one definition: the cluster flags
(`--ps_hosts`, `--worker_hosts`, `--job_name`, `--task_index`, `--schedule`) and
one flag per `TrainConfig` field (`lowlevel.config`). Every CLI parses its
flags through `flags_parser`, so a bad flag is one line on stderr and exit 2,
and `--help` lists that CLI's own flags. No TensorFlow import here.
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Callable, Optional, Sequence

from absl import flags

from lowlevel import config as config_lib
from lowlevel import errors
from lowlevel.cluster import spec as cluster_lib
from lowlevel.cluster import tf_config as tf_config_lib
from lowlevel.config import SCHEDULES, TrainConfig
from lowlevel.errors import UsageError

FLAGS = flags.FLAGS
TRAINER = "lowlevel.trainer"  # the module the trainer's flags belong to (their --help group)
CLUSTER_FLAGS = ("ps_hosts", "worker_hosts", "job_name", "task_index", "schedule")


def define_trainer_flags(flag_values=FLAGS) -> None:
    """Defines the trainer's flags in `flag_values` (once; later calls do nothing).

    The cluster flags, then one flag per `TrainConfig` field (`config.define_flags`),
    all belonging to module `TRAINER`.
    """
    if "ps_hosts" in flag_values:
        return
    common = {"flag_values": flag_values, "module_name": TRAINER}
    flags.DEFINE_string("ps_hosts", "", "Comma-separated host:port of the ps tasks.", **common)
    flags.DEFINE_string("worker_hosts", "", "Comma-separated host:port of the worker tasks; "
                        "worker 0 is the chief. (A separate chief job: TF_CONFIG.)", **common)
    flags.DEFINE_string("job_name", None, "This task's job: worker, ps, evaluator (or chief/"
                        "master with TF_CONFIG). Default: from TF_CONFIG.", **common)
    flags.DEFINE_integer("task_index", 0, "This task's index within its job.", **common)
    flags.DEFINE_enum("schedule", None, SCHEDULES, "What this task does. Default by job: "
                      "train (chief, worker), run_std_server (ps), continuous_eval (evaluator: "
                      "evaluates each new checkpoint in --output_dir on the test split until "
                      "the one of --train_steps; continuous_eval_on_train_data: on the "
                      "training split).", **common)
    config_lib.define_flags(flag_values, TRAINER)


def trainer_flag_names(flag_values=FLAGS) -> list[str]:
    """The names of the trainer's flags (`define_trainer_flags`), cluster flags first."""
    return [f.name for f in flag_values.get_key_flags_for_module(TRAINER)]


def config_from_flags(num_workers: Optional[int]) -> TrainConfig:
    """The validated `TrainConfig` of the parsed flags.

    Raises:
      UsageError: a value is out of range or unknown.
    """
    return config_lib.from_flags(FLAGS, num_workers)


def task_from_flags():
    """(cluster or None, task, schedule) from the flags and `TF_CONFIG`.

    Raises:
      UsageError: bad or conflicting cluster flags, TF_CONFIG or --schedule.
    """
    given = cluster_lib.ClusterFlags(
        FLAGS.ps_hosts, FLAGS.worker_hosts, FLAGS.job_name,
        FLAGS.task_index if FLAGS["task_index"].present else None)
    cluster, task = tf_config_lib.resolve(given, os.environ.get("TF_CONFIG"))
    if task is None:  # no cluster: in-process training, or an evaluator
        evaluating = FLAGS.schedule in (config_lib.CONTINUOUS_EVAL,
                                        config_lib.CONTINUOUS_EVAL_ON_TRAIN_DATA)
        task = cluster_lib.Task(cluster_lib.EVALUATOR if evaluating else cluster_lib.WORKER, 0)
    return cluster, task, config_lib.check_schedule(FLAGS.schedule, task.job_name)


def flags_parser(prog: str, modules: Sequence[str] = (), hint: Optional[str] = None,
                 module: Optional[str] = None):
    """An absl `flags_parser`: `--help` lists the CLI's flags; a flag error is one line, exit 2.

    Args:
      prog: the CLI's name ("lowlevel.launch", or a console script's
        "lowlevel-make-tf-configs"): the error line starts with `<prog>: error:`.
      modules: the modules whose flags `--help` lists after the CLI's own (e.g.
        the trainer's, which the launcher passes on).
      hint: a second line after an error; default `(<command> --help lists the flags)`.
      module: the module that defines the CLI's own flags; default `prog`.

    `--help` (or `-h`, `--helpshort`) prints the usage, the module docstring's first
    line and the flags, then exits 0; `--helpfull` is absl's, with every library's
    flags.
    """
    module = module or prog
    command = f"python -m {prog}" if prog.startswith("lowlevel.") else prog
    hint = f"({command} --help lists the flags)" if hint is None else hint

    def parse(argv):
        if any(a in ("--help", "-h", "--helpshort", "-help", "-?") for a in argv[1:]):
            try:
                print(_help(command, module, modules), flush=True)
            except BrokenPipeError:  # `| head`: the reader has what it wanted
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(0)
        try:
            return FLAGS(argv)
        except flags.Error as e:
            sys.stderr.write(f"{prog}: error: {e}\n" + (f"{hint}\n" if hint else ""))
            sys.exit(2)
    return parse


def _help(command: str, module: str, modules: Sequence[str]) -> str:
    """The `--help` text: usage, the module's summary, its own flags, then those of `modules`."""
    loaded = sys.modules.get(module)
    main = sys.modules.get("__main__")
    if loaded is None and getattr(main, "__spec__", None) and main.__spec__.name == module:
        loaded = main
    doc = (getattr(loaded, "__doc__", None) or "").strip()
    lines = [f"usage: {command} [--flag=value ...]", ""]
    if doc:
        lines += [doc.splitlines()[0], ""]
    by_module = FLAGS.flags_by_module_dict()
    # A module run as __main__ registers its flags under its file's path (absl).
    own = {module, getattr(loaded, "__file__", None), sys.argv[0]}
    for name in [m for m in by_module if m in own] + [m for m in modules if m in by_module]:
        title = command if name in own else f"{name} (passed on)"
        body = FLAGS.module_help(name).strip().split("\n", 1)[-1]
        lines += [f"{title}:", body, ""]
    lines.append("All flags, TensorFlow's and absl's included: --helpfull")
    return "\n".join(lines)


def exit_status_main(prog: str, main: Callable[[list], int]) -> Callable[[list], None]:
    """An `absl.app.run` main that exits with `main(argv)`'s status.

    A `UsageError` becomes one line on stderr (`<prog>: error: ...`) and exit 2.
    """
    def run(argv):
        try:
            sys.exit(main(argv))
        except UsageError as e:
            sys.stderr.write(f"{prog}: error: {e}\n")
            sys.exit(errors.USAGE)
    return run


def task_main(prog: str, main: Callable[[list], int], hard_exit: bool = True,
              on_exit: Optional[Callable[[int], int]] = None) -> Callable[[list], None]:
    """The `absl.app.run` main of a task: exits with `main(argv)`'s status, whatever happens.

    A `UsageError` is one line on stderr and exit 2; any other exception one line
    (`<prog>: error: <what> (exit status N; retryable: restart this task)`) and
    the status of the exit-status table (`errors.status_of`); a bug, or any failure
    at `--verbosity=1`, also prints its traceback. With `hard_exit` the process
    ends with `os._exit`: a `tf.train.Server` has no working Stop(), and its
    destructors could hang the exit. `on_exit(status)` gives the status the
    process exits with (the restart budget's, `runtime.restarts.finish`).
    """
    def run(argv):
        try:
            code = main(argv)
        except UsageError as e:
            sys.stderr.write(f"{prog}: error: {e}\n")
            code = errors.USAGE
        except Exception as e:  # noqa: BLE001 - one line, not a traceback
            if FLAGS.verbosity >= 1 or not errors.is_runtime_failure(e):
                traceback.print_exc()
            code = errors.status_of(e)
            retry = ("; retryable: restart this task" if errors.is_retryable(code)
                     else "; restarting will not help")
            sys.stderr.write(f"{prog}: error: {errors.one_line(e)} (exit status {code}"
                             f"{retry})\n")
        if on_exit is not None:
            code = on_exit(code or 0)
        sys.stdout.flush()
        sys.stderr.flush()
        if hard_exit:
            os._exit(code or 0)
        sys.exit(code or 0)
    return run
