"""The training loop stays small and generic: short named steps, no dataset or model names.

Read with ``ast`` and ``tokenize`` from the sources of the loop's modules under
``raysearch/training/`` (nothing is imported or run but the registries). The same counters hold
the whole package to its size rules, which follow from one job per module: no function over 60
code lines, no module over 600 lines (a module that is one job and longer is listed in
:data:`LONG_MODULES` with its reason).
"""

from __future__ import annotations

import ast
import io
import textwrap
import tokenize
from pathlib import Path

import pytest

from raysearch.training.data import available_datasets
from raysearch.training.models import available_models

ROOT = Path(__file__).resolve().parents[1] / "raysearch"
#: The loop's modules (the rest of training/ is data, models and what the loop is built from).
LOOP_FILES = tuple(f"training/{name}.py" for name in (
    "run", "run_parts", "run_weights", "divergence", "mixing", "interleaving", "loop", "tasks",
    "passes"))
#: The most code lines (docstrings, comments and blank lines excluded) one function may have.
MAX_CODE_LINES = 100
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
_NOT_CODE = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
             tokenize.ENCODING, tokenize.ENDMARKER}


def _docstring_lines(tree: ast.AST) -> set[int]:
    """Line numbers of every docstring (module, class, function) in `tree`."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, *_FUNCTIONS)) and node.body:
            first = node.body[0]
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                lines.update(range(first.lineno, first.end_lineno + 1))
    return lines


def _token_lines(source: str) -> set[int]:
    """Line numbers holding a code token (a multi-line string counts on each of its lines)."""
    lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in _NOT_CODE:
            lines.update(range(token.start[0], token.end[0] + 1))
    return lines


def code_lines(source: str) -> dict[str, int]:
    """``{qualified name: code lines}`` of every function in `source` (methods, nested ones).

    A function's lines run from its first decorator to its last line; docstrings, comments and
    blank lines are not counted.
    """
    tree = ast.parse(source)
    code = _token_lines(source) - _docstring_lines(tree)
    counts: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = prefix
            if isinstance(child, (ast.ClassDef, *_FUNCTIONS)):
                name = f"{prefix}{child.name}."
            if isinstance(child, _FUNCTIONS):
                first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                counts[name[:-1]] = len(code & set(range(first, child.end_lineno + 1)))
            visit(child, name)

    visit(tree, "")
    return counts


def test_code_lines_skip_docstrings_comments_and_blank_lines():
    source = textwrap.dedent('''
        def f(x):
            """Docstring,
            two lines."""
            # a comment

            y = (x +
                 1)  # a trailing comment
            text = """a string
            # not a comment"""
            return y

        class C:
            """A class."""

            @staticmethod
            def g():
                def inner():
                    return 1
                return inner
    ''')
    # f: def, y = (x +, 1), text = """..., # not a comment""", return  -> 6
    #   (the docstring, the comment line and the blank line are not code)
    # C.g: @staticmethod, def g, def inner, return 1, return inner -> 5; C.g.inner: 2
    assert code_lines(source) == {"f": 6, "C.g": 5, "C.g.inner": 2}


@pytest.mark.parametrize("name", LOOP_FILES)
def test_no_loop_function_is_over_100_code_lines(name):
    counts = code_lines((ROOT / name).read_text())
    assert counts, f"no functions found in {name}"
    long = {f: n for f, n in counts.items() if n > MAX_CODE_LINES}
    assert long == {}, f"{name}: functions over {MAX_CODE_LINES} code lines: {long}"


def test_fit_is_named_steps():
    counts = code_lines((ROOT / "training" / "run.py").read_text())
    # the loop itself: the signature (14 lines) and a dozen lines calling the steps
    assert counts["fit"] <= 30
    for step in ("_setup", "_train_epoch", "_evaluate", "_checkpoint", "_report", "_finish"):
        assert step in counts


@pytest.mark.parametrize("name", LOOP_FILES)
def test_loop_code_names_no_dataset_or_model(name):
    source = (ROOT / name).read_text()
    tree = ast.parse(source)
    docstrings = _docstring_lines(tree)
    names = set(available_datasets()) | set(available_models())
    named = sorted(
        (node.lineno, node.value) for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        and node.lineno not in docstrings and node.value.lower() in names
    )
    assert named == [], f"{name} names datasets or models in its code: {named}"


#: The most code lines one function of the package may have.
MAX_PACKAGE_CODE_LINES = 60
#: The most lines one module of the package may have (docstrings and comments included).
MAX_MODULE_LINES = 600
#: Modules that are one job and longer than :data:`MAX_MODULE_LINES`, with the reason; cutting
#: one in two only to pass the limit would make two rooms of one job.
LONG_MODULES: dict[str, str] = {}
PACKAGE_FILES = tuple(sorted(str(p.relative_to(ROOT)) for p in ROOT.rglob("*.py")))


def test_no_function_of_the_package_is_over_60_code_lines():
    long = {f"{name}:{f}": n for name in PACKAGE_FILES
            for f, n in code_lines((ROOT / name).read_text()).items()
            if n > MAX_PACKAGE_CODE_LINES}
    assert long == {}, f"functions over {MAX_PACKAGE_CODE_LINES} code lines: {long}"


def test_no_module_of_the_package_is_over_600_lines():
    assert len(PACKAGE_FILES) > 100, "the package was not found"
    long = {name: n for name in PACKAGE_FILES
            if (n := len((ROOT / name).read_text().splitlines())) > MAX_MODULE_LINES
            and name not in LONG_MODULES}
    assert long == {}, f"modules over {MAX_MODULE_LINES} lines: {long}"
    assert set(LONG_MODULES) <= set(PACKAGE_FILES), "a listed long module no longer exists"
