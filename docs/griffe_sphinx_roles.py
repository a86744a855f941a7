"""A griffe extension for the API reference: Sphinx roles in docstrings read as code.

The docstrings cross-reference with Sphinx roles (``:func:`~raysearch.metrics.ece```,
``:math:`T_n```), which Markdown would show as raw text. This extension, loaded by mkdocs.yml,
rewrites each role to inline code when griffe loads an object: the last part of the name with
``~`` (``ece``), else the whole name. It changes only the text the site renders, never the code.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:func|mod|class|math|data|meth|attr|exc|obj|const):`(~?)([^`]+)`")


def plain(text: str) -> str:
    """`text` with every Sphinx role written as inline code."""
    return ROLE.sub(lambda m: f"`{m[2].rsplit('.', 1)[-1] if m[1] else m[2]}`", text)


class SphinxRoles(griffe.Extension):
    """Rewrite the Sphinx roles of every loaded object's docstring as inline code."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        """Called by griffe for each module, class, function and attribute it loads."""
        if obj.docstring is not None:
            obj.docstring.value = plain(obj.docstring.value)
