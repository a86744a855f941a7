"""Reading the YAML files users give raysearch: no alias expansion, no duplicate keys.

:func:`read_yaml_file` reads a search space, a recipe or an exported config as plain data with
a safe loader that also reads ``1e-3`` as a float (YAML 1.2), refuses duplicate mapping keys,
refuses aliases (``*name``: a few lines of chained aliases expand to more values than memory
holds) and files over :data:`MAX_YAML_BYTES`; every problem is one line (a ValueError) naming
the file, with the line and column where YAML gives them.

A leaf beside :mod:`raysearch.config.base`: PyYAML and the standard library only.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

__all__ = ["MAX_YAML_BYTES", "read_yaml_file"]

#: The largest YAML file raysearch reads (a space, a recipe, an export), in bytes.
MAX_YAML_BYTES = 1 << 20


class _AliasError(yaml.composer.ComposerError):
    """A YAML alias (``*name``) in a raysearch file."""


class _Loader(yaml.SafeLoader):
    """Safe loader that reads ``1e-3`` as a float and rejects duplicate keys and aliases.

    Aliases are refused outright: a few lines of aliases chained inside allowed keys (a "billion
    laughs" document) expand to more values than memory holds once the parsed document is
    walked. An anchor (``&name``) alone is harmless and kept.
    """

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        if self.check_event(yaml.events.AliasEvent):
            event = self.peek_event()
            raise _AliasError(None, None, f"YAML aliases (*{event.anchor}) are not allowed in "
                              "raysearch files (chained aliases expand without limit); write "
                              "the value out", event.start_mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # unhashable key: let PyYAML report it
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"found duplicate key {key!r}",
                    key_node.start_mark,
                )
        return super().construct_mapping(node, deep=deep)


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def read_yaml_file(path: str | Path, label: str | None = None) -> Any:
    """The YAML document of a file users give raysearch (plain data: dicts, lists, scalars).

    Args:
        path: the file.
        label: how errors name it (default: the path).

    Raises:
        FileNotFoundError: if `path` does not exist.
        ValueError: one line naming `label`: not UTF-8, over :data:`MAX_YAML_BYTES`, nested
            too deeply, an alias (``*name``), a duplicate key or malformed YAML (with the line
            and column).
    """
    path = Path(path)
    label = str(path) if label is None else label
    size = path.stat().st_size
    if size > MAX_YAML_BYTES:
        raise ValueError(f"{label}: {size} bytes; a raysearch YAML file is at most "
                         f"{MAX_YAML_BYTES} bytes")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{label}: not a UTF-8 text file ({exc.reason})") from None
    if len(text.encode("utf-8")) > MAX_YAML_BYTES:  # a file that grew while being read
        raise ValueError(f"{label}: a raysearch YAML file is at most {MAX_YAML_BYTES} bytes")
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 (a SafeLoader subclass)
    except RecursionError:
        raise ValueError(f"{label}: the YAML is nested too deeply") from None
    except _AliasError as exc:
        mark = exc.problem_mark
        raise ValueError(f"{label}: line {mark.line + 1}, column {mark.column + 1}: "
                         f"{exc.problem}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = _one_line(getattr(exc, "problem", None) or exc)
        context, context_mark = getattr(exc, "context", None), getattr(exc, "context_mark", None)
        if context and context_mark is not None and context_mark.line != getattr(mark, "line", -1):
            problem += f" ({_one_line(context)} at line {context_mark.line + 1})"
        raise ValueError(f"{label}: malformed YAML{where}: {problem}") from None
