"""The package's architecture holds: import contracts, no circle, one home each, short functions.

The contracts are in pyproject.toml ([tool.importlinter]); the rules the import
graph cannot express (who reaches into TensorFlow's private state, who classifies
TensorFlow's errors, function length, docstrings) are read from the source here.
"""

import ast
import os
import re
import subprocess
import sys

import clusters
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "lowlevel")
MAX_FUNCTION_LINES = 60


def _sources(*tops):
    for top in tops:
        for dirpath, _, names in os.walk(os.path.join(ROOT, top)):
            for name in sorted(names):
                if name.endswith(".py"):
                    path = os.path.join(dirpath, name)
                    yield os.path.relpath(path, ROOT), open(path).read()


def test_import_contracts_hold():
    """lint-imports: layers, ops' imports, no TensorFlow below the runtime (pyproject.toml)."""
    lint = os.path.join(os.path.dirname(sys.executable), "lint-imports")
    result = subprocess.run([lint, "--no-cache"], cwd=ROOT, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "BROKEN" not in result.stdout and " KEPT" in result.stdout


def test_the_import_graph_has_no_circle():
    """No two lowlevel modules import each other, directly or through others (imports inside
    functions count: grimp reads them all)."""
    import grimp
    graph = grimp.build_graph("lowlevel")
    edges = {m: {d for d in graph.find_modules_directly_imported_by(m)
                 if d.startswith("lowlevel")} for m in graph.modules if m.startswith("lowlevel")}
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(m):  # Tarjan's strongly connected components
        index[m] = low[m] = len(index)
        stack.append(m)
        on_stack.add(m)
        for d in edges.get(m, ()):
            if d not in index:
                visit(d)
                low[m] = min(low[m], low[d])
            elif d in on_stack:
                low[m] = min(low[m], index[d])
        if low[m] == index[m]:
            component = []
            while True:
                d = stack.pop()
                on_stack.discard(d)
                component.append(d)
                if d == m:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10000))
    for m in sorted(edges):
        if m not in index:
            visit(m)
    assert not circles, circles
    assert len(edges) > 40  # the graph was really read


def test_only_sessions_reaches_into_tensorflows_private_session_state():
    pattern = re.compile(r"\._tf_sess\b|\._coordinated_creator\b|\._sess\._sess\b")
    found = [path for path, text in _sources("lowlevel")
             if pattern.search(text) and path != os.path.join("lowlevel", "runtime", "sessions.py")]
    assert found == []


def test_only_errors_classifies_tensorflows_errors():
    """TensorFlow's errors are sorted into kinds in `lowlevel.errors` alone: no other module
    catches a tuple of them, lists them, or imports their private module."""
    tuple_of_errors = re.compile(r"\(\s*(tf\.errors\.\w+\s*,\s*)+tf\.errors\.\w+")
    found = []
    for path, text in _sources("lowlevel"):
        if path == os.path.join("lowlevel", "errors.py"):
            continue
        if "errors_impl" in text or tuple_of_errors.search(text):
            found.append(path)
    assert found == []


def test_nothing_in_the_runtime_branches_on_a_built_in_models_name():
    """Built-in models are model_fns of the catalogue (`models/catalogue.py`); the runtime,
    the modes, the outputs and the entry points treat them as any model: no comparison
    with "mlp", "cnn", "softmax" or "wide_deep" there."""
    from lowlevel.config import MODELS
    found = []
    for path, text in _sources("lowlevel"):
        if path.startswith(os.path.join("lowlevel", "models")) or path.endswith("config.py"):
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Compare):
                names = [c.value for c in [node.left, *node.comparators]
                         if isinstance(c, ast.Constant)]
                if any(n in MODELS for n in names):
                    found.append(f"{path}:{node.lineno}")
    assert found == []


def test_no_function_over_60_lines_outside_tests():
    long = []
    for path, text in _sources("lowlevel", "benchmarks", "scripts"):
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path}:{node.lineno} {node.name} ({lines} lines)")
    assert long == []


def test_every_module_public_function_and_class_has_a_docstring():
    missing = []
    for path, text in _sources("lowlevel"):
        tree = ast.parse(text)
        if not ast.get_docstring(tree):
            missing.append(path)
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and \
                    not node.name.startswith("_") and not ast.get_docstring(node):
                missing.append(f"{path}: {node.name}")
    assert missing == []


@pytest.mark.parametrize("command, own_flag", [
    (["-m", "lowlevel.trainer"], "--ps_hosts"),
    (["-m", "lowlevel.launch"], "--num_workers"),
    (["-m", "lowlevel.predict"], "--export_dir"),
    (["-m", "lowlevel.tf_configs"], "--workers"),
])
def test_every_cli_help_lists_its_own_flags(command, own_flag):
    result = subprocess.run([sys.executable, *command, "--help"], capture_output=True,
                            text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("usage: ")
    assert own_flag in result.stdout
    assert "--helpfull" in result.stdout


def test_the_trainers_flags_are_shown_by_the_launcher_that_passes_them_on():
    result = clusters.run([sys.executable, "-m", "lowlevel.launch", "--help"], timeout=120,
                          cold=True)  # --help imports no TensorFlow: no fork server
    assert "lowlevel.trainer (passed on):" in result.stdout
    assert "--step_timeout_secs" in result.stdout
