"""The documentation site builds offline with `mkdocs build --strict`, and the README stays a
start page.

Strict mode turns every warning into a failure: a broken link or anchor between pages, a page
missing from the nav, and a docstring of the API reference (mkdocstrings, Google style) that
griffe cannot parse. The build runs with the proxies pointed at a closed local port, so a theme
or plugin that fetched anything at build time would fail it too.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
DEAD_PROXY = "http://127.0.0.1:9"  # the discard port: nothing listens there


def installed(module: str) -> bool:
    """Whether `module` (dotted names included) can be imported."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def test_mkdocs_build_strict_passes_offline(tmp_path):
    needed = [m for m in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python")
              if not installed(m)]
    assert needed == [], f'the docs build needs {needed}: pip install -e ".[dev]"'
    env = {**os.environ, "HTTP_PROXY": DEAD_PROXY, "HTTPS_PROXY": DEAD_PROXY,
           "http_proxy": DEAD_PROXY, "https_proxy": DEAD_PROXY, "NO_PROXY": "", "no_proxy": "",
           "NO_MKDOCS_2_WARNING": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
         "-d", str(tmp_path / "site")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    problems = "\n".join(line for line in out.stderr.splitlines()
                         if line.startswith(("WARNING", "ERROR")) or "Error" in line)
    assert out.returncode == 0, f"mkdocs build --strict failed:\n{problems or out.stderr[-3000:]}"
    site = tmp_path / "site"
    assert (site / "index.html").is_file()
    api = (site / "api" / "metrics" / "index.html").read_text()
    assert 'id="raysearch.metrics.ece"' in api  # the reference is generated from the docstrings


def test_readme_is_a_start_page_of_at_most_300_lines():
    lines = README.read_text().splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines; move detail into docs/"
    # the title, then at once the two set-up commands
    assert lines[:5] == ["# raysearch", "", "```bash",
                         'pip install -e ".[dev]" && raysearch sweep acls --num-samples 8',
                         "python -m pytest -q"]


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lower case, punctuation dropped, - for space."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_readme_links_resolve_to_files_and_headings_of_the_repository():
    text = README.read_text()
    links = re.findall(r"\]\(([^)#\s]+)(?:#([^)\s]*))?\)", text)
    local = [(path, anchor) for path, anchor in links if "://" not in path]
    assert ("docs/img/pareto.png", "") in local
    missing = [path for path, _ in local if not (ROOT / path).exists()]
    assert missing == []
    for path, anchor in local:
        if anchor:
            headings = re.findall(r"^#+ (.+)$", (ROOT / path).read_text(), flags=re.M)
            assert anchor in {github_anchor(h) for h in headings}, f"{path}#{anchor}"


def test_the_docs_name_no_folder_only_the_project_has():
    pages = [README, ROOT / "CHANGELOG.md", *DOCS.rglob("*.md")]
    leaks = [p.name for p in pages if "shared/data" in p.read_text()]
    assert leaks == []


def test_the_pareto_picture_is_small():
    assert (DOCS / "img" / "pareto.png").stat().st_size < 200_000


def test_sphinx_roles_read_as_inline_code_in_the_reference():
    spec = importlib.util.spec_from_file_location("roles", DOCS / "griffe_sphinx_roles.py")
    roles = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(roles)
    text = "see :func:`~raysearch.metrics.ece`, :mod:`raysearch.registry` and :math:`T_n`."
    assert roles.plain(text) == "see `ece`, `raysearch.registry` and `T_n`."
