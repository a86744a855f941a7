"""What the run config and the sweep settings share: the section base class and its checks.

:class:`Section` is the pydantic base of every config section (unknown keys are an error,
assignments are validated, numeric fields are checked against the class's ``_BOUNDS`` by
:func:`bounded`); :func:`one_line_error` turns a pydantic ValidationError into one readable
line (it names a section of :data:`SECTIONS` as such); :func:`plain_data`,
:func:`absolute_path` and :func:`first_line` turn values into plain data, absolute paths and
one-line messages; :func:`metric_name` is the name a user's metric is logged under.

A leaf: imports pydantic and the standard library only, nothing of the package.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

__all__ = ["DEFAULT_EXPERIMENT", "SECTIONS", "SELECTIONS", "Section", "absolute_path",
           "bounded", "first_line", "metric_name", "one_line_error", "plain_data"]

#: ``--selection``: the rule applied to a repeated sweep's configurations (see
#: :mod:`raysearch.metrics.repeats`): ``mean`` (lowest mean ECE within the tolerance of the best
#: mean accuracy) or ``robust`` (lowest mean + 1 SEM of ECE, same accuracy constraint).
SELECTIONS = ("mean", "robust")
#: Experiment of every sweep unless ``--experiment`` says otherwise.
DEFAULT_EXPERIMENT = "raysearch"

#: The sections of a RunConfig and the prefix of their dotted flat keys.
SECTIONS = ("loss", "model", "data", "optimizer", "schedule")


def one_line_error(exc: ValidationError, what: str = "run config") -> str:
    """The first error of a pydantic ValidationError as one readable line."""
    err = exc.errors()[0]
    loc = [str(p) for p in err.get("loc", ())]
    msg = str(err.get("msg", "invalid"))
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    if err.get("type") == "extra_forbidden":
        section = ".".join(loc[:-1])
        return (f"unknown {what} key {'.'.join(loc)!r}"
                + (f" in section {section!r}" if section else ""))
    if err.get("type") == "missing":
        return f"{what}: `{'.'.join(loc)}` is required"
    if not loc:
        return msg
    if loc[-1] in SECTIONS:  # a section's own check (fields that go together)
        return f"{'.'.join(loc)}: {msg}"
    if not msg.startswith("`"):
        msg = f"`{loc[-1]}`: {msg} (got {err.get('input')!r})"
    prefix = ".".join(loc[:-1])
    return f"{prefix}: {msg}" if prefix else msg


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _as_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ValueError(f"`{name}` must be an integer, got {value!r}")
    return value


def _as_float(name: str, value: Any) -> float:
    if not _is_number(value):
        raise ValueError(f"`{name}` must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"`{name}` must be finite, got {value!r}")
    return float(value)


def bounded(name: str, value: Any, *, low: float, high: float | None = None,
             low_open: bool = False, high_open: bool = False, integer: bool = False,
             optional: bool = False, note: str = "") -> Any:
    """`value` as an int or a float within its bounds, or a ValueError naming `name`.

    The message states the range as written in the field's docs: ``must be >= 0``, ``must be
    > 0``, ``must be in (0, 1]``, with `note` after it.
    """
    if value is None and optional:
        return None
    value = _as_int(name, value) if integer else _as_float(name, value)
    too_low = value <= low if low_open else value < low
    too_high = high is not None and (value >= high if high_open else value > high)
    if too_low or too_high:
        if high is None:
            wanted = f"{'>' if low_open else '>='} {low}"
        else:
            wanted = f"in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
        raise ValueError(f"`{name}` must be {wanted}{note}, got {value}")
    return value


class Section(BaseModel):
    """Base of every section: unknown keys are an error; assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    #: Numeric fields and their bounds (:func:`bounded`'s keywords), checked on input.
    _BOUNDS: ClassVar[dict[str, dict[str, Any]]] = {}

    @field_validator("*", mode="before")
    @classmethod
    def _check_bounds(cls, value: Any, info: Any) -> Any:
        spec = cls._BOUNDS.get(info.field_name)
        return value if spec is None else bounded(info.field_name, value, **spec)

    def __setattr__(self, name: str, value: Any) -> None:
        try:
            super().__setattr__(name, value)
        except ValidationError as exc:
            raise ValueError(one_line_error(exc, type(self).__name__)) from None


def plain_data(value: Any) -> Any:
    """Turn numpy scalars and tuples into plain Python values so YAML and MLflow see them."""
    if hasattr(value, "item") and callable(value.item) and not isinstance(value, (list, dict)):
        try:
            return value.item()
        except (TypeError, ValueError):
            return value
    if isinstance(value, Mapping):
        return {k: plain_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_data(v) for v in value]
    return value


def first_line(exc: Exception) -> str:
    """The message of `exc` on one line (runs of whitespace, newlines included, as one space)."""
    return " ".join(str(exc).split())


def absolute_path(path: str | None) -> str | None:
    """Trials on other nodes or in other working directories need an absolute data path."""
    return None if path is None else str(Path(path).expanduser().resolve())


def metric_name(spec: Any) -> str:
    """The name a user's metric is logged under: the function's name (``val_<name>``)."""
    if isinstance(spec, str):
        return spec.rsplit(":", 1)[-1].rsplit(".", 1)[-1]
    return getattr(spec, "__name__", type(spec).__name__)
