"""Writing files that other processes read while they are being written."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Optional


def write_json(path: str, value, indent: Optional[int] = 2) -> None:
    """Writes `value` as JSON to `path` atomically: a reader sees the old file or the new one.

    The text goes to a uniquely named file in the same directory (created if
    needed), which then replaces `path` (`os.replace`, atomic on POSIX), so
    writers in several processes never interleave either.

    Raises:
      OSError: the directory or the file cannot be written.
      TypeError: `value` is not JSON-serialisable (nothing is written).
    """
    text = json.dumps(value, indent=indent) + "\n"
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
