"""A user's functions named on the command line: `--model=package.module:function`, `--input_fn`.

The module is imported as Python imports any module (from `sys.path`: the
working directory of `python -m lowlevel.trainer`, `PYTHONPATH`, the installed
packages); the function is an attribute of it, dots allowed
(`pkg.models:Factory.model_fn`).
"""

from __future__ import annotations

import contextlib
import importlib
from typing import Callable

from lowlevel import errors
from lowlevel.errors import ModelFnError, UsageError


def resolve(spec: str, flag: str) -> Callable:
    """The callable `spec` ("package.module:function") names.

    Args:
      spec: "package.module:function".
      flag: the flag it came from ("--model"), for the message.

    Raises:
      UsageError: the module cannot be found, or has no such callable (one line naming
        `spec` and what to check). An error raised by the module's own code while it is
        imported is not caught: it is the user's, with its traceback.
    """
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and module_name.startswith(e.name):  # the module itself, not one it imports
            raise UsageError(f"{flag}={spec}: no module named {module_name!r} (is its directory "
                             "the working directory, or on PYTHONPATH?)") from None
        raise
    found = module
    for part in attr.split("."):
        if not hasattr(found, part):
            raise UsageError(f"{flag}={spec}: module {module_name} ({module.__file__}) has no "
                             f"{attr!r}")
        found = getattr(found, part)
    if not callable(found):
        raise UsageError(f"{flag}={spec}: {attr} is a {type(found).__name__}, not a function")
    return found


def name(fn) -> str:
    """"package.module:function" of `fn`, as `--model` names one (a `functools.partial`: its
    function; a callable object: its type)."""
    fn = getattr(fn, "func", fn)
    module = getattr(fn, "__module__", None) or type(fn).__module__
    qualname = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"{module}:{qualname}".replace("<locals>.", "")


@contextlib.contextmanager
def calling(what: str, fn):
    """Within the block, an exception from the user's `fn` (its `what`: "model_fn",
    "input_fn") becomes one `ModelFnError` line naming it; the original is its cause
    (`--verbosity=1` prints its traceback). Errors of lowlevel's own pass unchanged."""
    try:
        yield
    except (errors.RuntimeFailure, errors.UsageError):
        raise
    except Exception as e:  # noqa: BLE001 - the user's code: any error is theirs
        message = getattr(e, "message", None) or str(e)
        first = message.strip().splitlines()[0] if message.strip() else type(e).__name__
        raise ModelFnError(f"{what} {name(fn)}: {type(e).__name__}: {first}") from e
