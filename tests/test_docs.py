"""The docs cannot drift from the code: every command they show parses, every link resolves.

Every line of a fenced code block in README.md and docs/*.md (lines ending in `\\`
joined) that runs `scripts/...`, `.venv/bin/python -m lowlevel.X`,
`.venv/bin/lowlevel-...` or `.venv/bin/python -m benchmarks.X` (after any leading
`NAME=value` assignments) has its flags parsed, without running the program: a
subprocess imports the CLI's module, so that it defines its absl flags, and parses
the command's arguments with `absl.flags.FLAGS` — an unknown flag, or a value absl or
`TrainConfig` rejects, fails the test named by the doc's file and line.
`scripts/run` is parsed as `lowlevel.launch`; `scripts/make_tf_configs.py` as
`lowlevel.tf_configs`; any other script (`scripts/test`, whose arguments go to pytest)
only has to exist. With `--script`, the launcher's and the generator's arguments after
`--` are the script's, not parsed (the launcher's script must exist). A `--help` argument and a literal `...` are left out of the parse.

Also: README.md is at most 250 lines, no doc says "issue <number>", and every relative
link of the docs names a file (and heading) that exists.
"""

import functools
import json
import os
import re
import shlex
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
DOCS_DIR = os.path.join(ROOT, "docs")
MAX_README_LINES = 250
PYTHON = ".venv/bin/python"
# Scripts that are a CLI of the package under another name.
# CLIs that run a user's script with the script's own arguments, not flags of theirs.
SCRIPT_RUNNERS = {"lowlevel.estimator"}
SCRIPT_MODULES = {"scripts/run": "lowlevel.launch",
                  "scripts/make_tf_configs.py": "lowlevel.tf_configs"}
HELP = {"--help", "-h", "--helpshort", "--helpfull", "-help", "-?"}
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
SHELL_OPERATORS = set("|&;<>()")


def _doc_files() -> list:
    docs = sorted(os.path.join(DOCS_DIR, name) for name in os.listdir(DOCS_DIR)
                  if name.endswith(".md")) if os.path.isdir(DOCS_DIR) else []
    return [README] + docs


def _console_scripts() -> dict:
    """{console script: module} from pyproject.toml's [project.scripts]."""
    text = open(os.path.join(ROOT, "pyproject.toml")).read()
    section = text.split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    return dict(re.findall(r'^([\w-]+)\s*=\s*"([\w.]+):\w+"', section, re.M))


def _fenced_lines(path: str):
    """(line number, text) of every line inside a fenced code block; continued lines joined."""
    in_block, pending, start = False, "", 0
    with open(path) as f:
        for number, line in enumerate(f, 1):
            text = line.strip()
            if text.startswith("```"):
                in_block, pending = not in_block, ""
                continue
            if not in_block:
                continue
            if not pending:
                start = number
            if text.endswith("\\"):
                pending += text[:-1] + " "
                continue
            yield start, pending + text
            pending = ""


def _words(text: str) -> list:
    """The shell words of one command, up to its first operator (`|`, `>`, `&&`, ...)."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    words = []
    for word in lexer:
        if set(word) <= SHELL_OPERATORS:
            break
        words.append(word)
    while words and ASSIGNMENT.match(words[0]):
        words.pop(0)
    return words


def _command(words: list):
    """(program, module or None, arguments) of a command the docs must keep working, or None."""
    if len(words) >= 3 and words[:2] == [PYTHON, "-m"]:
        module = words[2]
        if module.startswith(("lowlevel.", "benchmarks.")):
            return module, module, words[3:]
        return None
    if words and words[0].startswith(".venv/bin/lowlevel-"):
        name = words[0][len(".venv/bin/"):]
        return words[0], _console_scripts().get(name, "?" + name), words[1:]
    if words and words[0].startswith("scripts/"):
        return words[0], SCRIPT_MODULES.get(words[0]), words[1:]
    return None


def _collect() -> list:
    commands = []
    for path in _doc_files():
        for number, text in _fenced_lines(path):
            try:
                found = _command(_words(text))
            except ValueError:  # an unbalanced quote: not a command line
                continue
            if found:
                commands.append((os.path.relpath(path, ROOT), number, *found))
    return commands


COMMANDS = _collect()

# Run in a subprocess per CLI module: reads [[args], ...] as JSON on stdin, prints one
# error message (or null) per command as JSON.
CHECKER = r"""
import importlib, json, os, sys
from absl import flags
module = sys.argv[1]
importlib.import_module(module)
FLAGS = flags.FLAGS

def trainer_config(flag_values, num_workers):
    from lowlevel import config
    config.from_flags(flag_values, num_workers)

def check(args):
    FLAGS.unparse_flags()
    rest = FLAGS(["prog", *args])[1:]
    if module in ("lowlevel.tf_configs", "lowlevel.launch") and FLAGS.script:
        # after --: the script's own arguments; the launcher's script is on this machine
        if module == "lowlevel.launch" and not os.path.isfile(FLAGS.script):
            raise ValueError(f"--script={FLAGS.script}: no such file")
        rest = []
    elif module == "lowlevel.tf_configs":  # after --: trainer flags for every task
        from lowlevel import cli
        trainer = flags.FlagValues()
        cli.define_trainer_flags(trainer)
        rest = trainer(["prog", *rest])[1:]
        trainer_config(trainer, None)
    elif module == "lowlevel.launch":
        trainer_config(FLAGS, FLAGS.num_workers)
    elif module == "lowlevel.trainer":
        trainer_config(FLAGS, None)
    if rest:
        raise ValueError(f"unexpected argument {rest[0]!r} (flags are --name=value)")

results = []
for args in json.load(sys.stdin):
    try:
        check(args)
        results.append(None)
    except Exception as e:
        results.append(f"{type(e).__name__}: {e}")
print(json.dumps(results))
"""


@functools.lru_cache(maxsize=None)
def _parse_all(module: str) -> dict:
    """{(doc, line): error or None} for every command of `module` in the docs."""
    mine = [c for c in COMMANDS if c[3] == module]
    argvs = [[a for a in c[4] if a not in HELP and a != "..."] for c in mine]
    result = subprocess.run([sys.executable, "-c", CHECKER, module], input=json.dumps(argvs),
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"checker for {module} failed:\n{result.stderr[-3000:]}"
    errors = json.loads(result.stdout.strip().splitlines()[-1])
    return {(c[0], c[1]): error for c, error in zip(mine, errors)}


def test_the_docs_show_commands():
    """The collector finds the commands (a broken collector would pass every check)."""
    programs = {c[2] for c in COMMANDS}
    assert len(COMMANDS) >= 10, COMMANDS
    assert {"scripts/run", "scripts/test", "lowlevel.trainer", "lowlevel.launch"} <= programs


@pytest.mark.parametrize("doc,line,program,module,args", COMMANDS,
                         ids=[f"{c[0]}:{c[1]}" for c in COMMANDS])
def test_a_documented_command_parses(doc, line, program, module, args):
    """The command's flags are ones its CLI defines, with values it accepts."""
    where = f"{doc}:{line}: {program} {' '.join(args)}"
    if module is None:  # a script that is no CLI of ours: it must exist and be runnable
        path = os.path.join(ROOT, program)
        assert os.path.isfile(path) and os.access(path, os.X_OK), f"{where}: no such script"
        return
    assert not module.startswith("?"), f"{where}: no console script {module[1:]} in pyproject.toml"
    if module in SCRIPT_RUNNERS:  # SCRIPT.py, then the script's own arguments
        assert args and os.path.isfile(os.path.join(ROOT, args[0])), f"{where}: no such script"
        return
    error = _parse_all(module)[(doc, line)]
    assert error is None, f"{where}\n  {error}"


def test_readme_is_short():
    """README.md is the way in; the rest lives in docs/."""
    with open(README) as f:
        lines = sum(1 for _ in f)
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines (at most {MAX_README_LINES})"


def test_no_doc_says_issue_n():
    """The docs describe what is, not the history of the tracker."""
    found = []
    for path in _doc_files():
        for number, line in enumerate(open(path), 1):
            if re.search(r"\bissues?\s+#?\d+", line, re.I):
                found.append(f"{os.path.relpath(path, ROOT)}:{number}: {line.strip()}")
    assert found == []


def _anchors(path: str) -> set:
    """GitHub's heading anchors of a Markdown file."""
    anchors, in_block = set(), False
    for line in open(path):
        if line.strip().startswith("```"):
            in_block = not in_block
        elif not in_block and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


def test_every_relative_link_resolves():
    """A link to a file of this repository names one that exists, and a heading it has."""
    broken = []
    for path in _doc_files():
        text = re.sub(r"```.*?```", "", open(path).read(), flags=re.S)  # code blocks
        text = re.sub(r"`[^`\n]*`", "", text)  # code spans
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            linked = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
            if not os.path.exists(linked):
                broken.append(f"{os.path.relpath(path, ROOT)}: {target} (no such file)")
            elif anchor and linked.endswith(".md") and anchor not in _anchors(linked):
                broken.append(f"{os.path.relpath(path, ROOT)}: {target} (no such heading)")
    assert broken == []
