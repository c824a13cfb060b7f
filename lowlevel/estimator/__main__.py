"""`python -m lowlevel.estimator SCRIPT.py [ARGS...]`: runs a TF <= 2.15 Estimator script unmodified.

Sets up the Keras environment (importing lowlevel.estimator does, before
TensorFlow) and the import aliases (`lowlevel.estimator.alias`),
then runs SCRIPT as `__main__` with `sys.argv = [SCRIPT, ARGS...]` and its
directory first on `sys.path` (`runpy.run_path`), as `python SCRIPT.py ARGS`
would. The exit status is the script's (SystemExit passes through), except:
a use of `tf.compat.v1.layers` without the legacy-keras extra prints ONE line
naming the extra and exits 2; a failure of lowlevel's runtime (a peer that does
not answer, a checkpoint of another model, ...) is one line and the status of the
exit-status table (`lowlevel.errors`: 200 retryable, 1 permanent); a bug keeps its
traceback (status 1). SIGTERM and SIGINT stop a distributed task at a safe point
with 128 + N (`runtime.preemption`, made first). The process ends with
`os._exit`: a task's `tf.train.Server` has no working Stop(), and its destructors
could hang the interpreter's exit. Also installed as the console script
`lowlevel-estimator`.
"""

from __future__ import annotations

import os
import runpy
import sys
import traceback

import lowlevel.estimator as estimator
from lowlevel import errors
from lowlevel.estimator import alias

USAGE = ("usage: python -m lowlevel.estimator SCRIPT.py [ARGS...]\n\n"
         "Runs a TensorFlow <= 2.15 tf.estimator script unmodified on TensorFlow 2.21:\n"
         "tf.estimator, tf.compat.v1.estimator, tensorflow_estimator resolve to "
         "lowlevel.estimator.\n")


def main(argv=None, prog: str = "lowlevel.estimator", usage: str = USAGE,
         prepare=None) -> int:
    """Runs the script named by argv[0] with argv[1:]; returns the exit status. `prog` and
    `usage` name the runner in its messages (`python -m lowlevel` shares this one);
    `prepare(script)`, if given, runs just before the script and returns its `init_globals`
    for `runpy.run_path` (or None), its errors the script's (`python -m lowlevel` passes
    `tf1_namespace.prepare`)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        sys.stdout.write(usage)
        return errors.SUCCESS if argv else errors.USAGE
    script = argv[0]
    if not os.path.isfile(script):
        sys.stderr.write(f"{prog}: no such script: {script}\n")
        return errors.USAGE
    alias.install(estimator)
    sys.argv = [script] + argv[1:]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    try:
        init_globals = prepare(script) if prepare is not None else None
        runpy.run_path(script, init_globals=init_globals, run_name="__main__")
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except errors.LegacyKerasMissing as e:
        sys.stderr.write(f"{prog}: {e}\n")
        return errors.USAGE
    except Exception as e:  # noqa: BLE001 - one line for the runtime's failures
        if not errors.is_runtime_failure(e) or isinstance(e, errors.UsageError):
            traceback.print_exc()
        code = errors.status_of(e)
        sys.stderr.write(f"{prog}: error: {errors.one_line(e)} (exit status "
                         f"{code})\n")
        return code
    return errors.SUCCESS


def run(main=main):
    """Console-script entry point (`lowlevel-estimator`); `main` returns the exit status."""
    from lowlevel.runtime.preemption import Preemption
    Preemption("estimator")  # first: before TensorFlow starts any thread
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code if isinstance(code, int) else 1)


if __name__ == "__main__":
    run()
