"""No compatibility surface: a private name stays in its package, and packages re-export none.

Read with ``ast`` from the sources. A name or module starting with one underscore is private to
the package that defines it: ``from raysearch.a.b import _x`` (or ``from raysearch.a._m import
y``) is allowed only inside ``raysearch.a``. A package's ``__init__`` imports no private name
at all, so that what it offers is its public names.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import raysearch

ROOT = Path(raysearch.__file__).resolve().parent


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_imports(root: Path, package: str) -> list[str]:
    """``file:line: from module import name`` of each private name imported across packages.

    Also lists every private name a package's ``__init__`` imports (a re-export).
    """
    found = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        here = ".".join((package, *parts[:-1]))  # the package the module belongs to
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ImportFrom) or node.level or not node.module:
                continue
            if not node.module.startswith(package):
                continue
            target = node.module if (root.parent / Path(*node.module.split("."))).is_dir() \
                else node.module.rpartition(".")[0]
            for alias in node.names:
                private = _private(alias.name) or any(map(_private, node.module.split(".")))
                across = target != here and not target.startswith(f"{here}.")
                reexport = path.name == "__init__.py" and _private(alias.name)
                if private and (across or reexport):
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno}: from "
                                 f"{node.module} import {alias.name}")
    return found


def test_the_check_sees_private_imports_across_packages_and_re_exports(tmp_path):
    pkg = tmp_path / "pkg"
    for folder in (pkg / "a", pkg / "b"):
        folder.mkdir(parents=True)
        (folder / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "a" / "_impl.py").write_text("x = 1\n_y = 2\n")
    (pkg / "a" / "mod.py").write_text("from pkg.a._impl import _y, x\n")  # same package: fine
    (pkg / "b" / "use.py").write_text(textwrap.dedent("""
        from pkg.a._impl import x
        from pkg.a.mod import _z
    """))
    (pkg / "a" / "__init__.py").write_text("from pkg.a._impl import _y as _y\n")
    assert private_imports(pkg, "pkg") == [
        "pkg/a/__init__.py:1: from pkg.a._impl import _y",
        "pkg/b/use.py:2: from pkg.a._impl import x",
        "pkg/b/use.py:3: from pkg.a.mod import _z",
    ]


def test_no_private_name_crosses_a_package_boundary():
    assert private_imports(ROOT, "raysearch") == []
