"""One sweep engine: a single Ray Tune ``Tuner`` construction, post-hoc functions kept short.

Read from the source with :mod:`ast`, so a ``Tuner(`` inside a docstring (an example) does not
count, and no Ray is started.
"""

import ast
from pathlib import Path

import pytest

import raysearch

PACKAGE = Path(raysearch.__file__).parent
#: Most code lines (docstring, comments and blank lines excluded) a function may have.
MAX_CODE_LINES = 100


def tuner_calls(source: str) -> list[tuple[int, str]]:
    """(line, enclosing function) of every call that constructs a Tune ``Tuner``.

    ``Tuner(...)``, ``tune.Tuner(...)`` and a name imported as ``from ... import Tuner as X``
    count; ``tune.Tuner.restore(...)`` and ``Tuner.can_restore(...)`` do not (they construct
    no new experiment).
    """
    tree = ast.parse(source)
    names = {"Tuner"} | {alias.asname for node in ast.walk(tree)
                         if isinstance(node, ast.ImportFrom) for alias in node.names
                         if alias.name == "Tuner" and alias.asname}
    owner: dict[ast.AST, str] = {}
    # ast.walk is breadth-first: an outer function is seen first, an inner one overwrites it
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for child in ast.walk(node):
                if child is not node:
                    owner[child] = node.name
    calls = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
        if name in names:
            calls.append((node.lineno, owner.get(node, "<module>")))
    return sorted(calls)


def code_lines(source: str) -> dict[str, int]:
    """Code lines of every function (qualified by its class, if any) of `source`.

    A function's lines run from its ``def`` to its last line; its docstring's lines, blank lines
    and comment-only lines are left out.
    """
    tree = ast.parse(source)
    text = source.splitlines()
    out = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = set(range(child.lineno, child.end_lineno + 1))
                first = child.body[0]
                if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                        and isinstance(first.value.value, str)):
                    lines -= set(range(first.lineno, first.end_lineno + 1))
                out[prefix + child.name] = sum(
                    1 for i in lines if text[i - 1].strip()
                    and not text[i - 1].strip().startswith("#"))
                visit(child, prefix + child.name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")

    visit(tree, "")
    return out


SAMPLE = '''
from ray import tune
from ray.tune import Tuner as T


def one(x):
    """Build it: ``tune.Tuner(trainable)`` (an example, not a call)."""
    # a comment
    t = tune.Tuner(x)

    return t


def two(x):
    return T(x), tune.Tuner.restore("/p", trainable=x), tune.Tuner.can_restore("/p")
'''


def test_the_counters_on_a_hand_checked_sample():
    # Tuner constructions: tune.Tuner(x) in one (line 9), T(x) in two (line 15); the docstring's
    # example, .restore and .can_restore are not constructions -> 2
    assert tuner_calls(SAMPLE) == [(9, "one"), (15, "two")]
    # one: lines 6-11 = def, docstring, comment, `t = ...`, blank, return -> 3 code lines;
    # two: def + return -> 2
    assert code_lines(SAMPLE) == {"one": 3, "two": 2}


def test_exactly_one_tuner_construction_in_the_package():
    calls = {str(path.relative_to(PACKAGE)): tuner_calls(path.read_text())
             for path in sorted(PACKAGE.rglob("*.py"))}
    found = [(module, line, function) for module, hits in calls.items()
             for line, function in hits]
    assert len(found) == 1, f"Tuner constructed in several places: {found}"
    module, _, function = found[0]
    assert (module, function) == ("tune/engine.py", "build_tuner")


@pytest.mark.parametrize("module", ["tune/engine.py", "tune/posthoc_sweep.py"])
def test_training_and_posthoc_sweeps_build_their_tuner_with_build_tuner(module):
    tree = ast.parse((PACKAGE / module).read_text())
    callers = {node.name for node in ast.walk(tree)
               if isinstance(node, ast.FunctionDef) and any(
                   isinstance(c, ast.Call) and getattr(c.func, "id", None) == "build_tuner"
                   for c in ast.walk(node))}
    assert callers == ({"_new_tuner"} if module == "tune/engine.py" else {"_run_trials"})


def test_no_posthoc_function_is_over_the_line_limit():
    lines = code_lines((PACKAGE / "tune/posthoc_sweep.py").read_text())
    assert "run_posthoc_sweep" in lines
    too_long = {name: n for name, n in lines.items() if n > MAX_CODE_LINES}
    assert not too_long, f"functions over {MAX_CODE_LINES} code lines: {too_long}"
