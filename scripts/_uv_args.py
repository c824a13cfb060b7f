"""Prints uv's arguments for the package sources pip is configured with on this machine.

`scripts/_venv.sh` installs with uv (`uv pip install`: the same packages as pip, resolved
and unpacked in parallel: ~9 s here where pip took ~60 s), which does not read pip's
configuration. This reads it (`pip config list`: files and PIP_* variables) and prints,
one per line, the uv arguments of the keys that say where packages come from:
index-url, extra-index-url, find-links and constraint, after pip's way of choosing among
indexes (`--index-strategy unsafe-best-match`). A file:// index or a find-links
folder that does not exist is left out (pip ignores it with a warning).
"""

import os
import shlex
import subprocess
import sys

# pip's precedence: its variables over the site's, user's and global files.
RANK = {"global": 1, "install": 1, "user": 2, "site": 3, ":env:": 4}
FLAGS = {"index-url": "--index-url", "extra-index-url": "--extra-index-url",
         "find-links": "--find-links", "constraint": "--constraint"}


def _exists(value: str) -> bool:
    if value.startswith("file://"):
        return os.path.exists(value[len("file://"):])
    return "://" in value or os.path.exists(value)


def main() -> None:
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"],
                            capture_output=True, text=True, check=True).stdout
    args, ranks = {}, {}
    for line in listed.splitlines():  # "global.find-links='/opt/wheels'", ":env:.cert=..."
        key, _, value = line.partition("=")
        where, _, name = key.rpartition(".")
        rank = RANK.get(where.split(".")[0], 0)
        if name in FLAGS and rank >= ranks.get(name, 0):
            ranks[name] = rank
            args[name] = [v for v in shlex.split(shlex.split(value)[0]) if _exists(v)]
    print("--index-strategy")  # pip's: the best version on any index (uv's default: the
    print("unsafe-best-match")  # first index that has the package, whatever its versions)
    for name, values in args.items():
        for value in values:
            print(FLAGS[name])
            print(value)


if __name__ == "__main__":
    main()
