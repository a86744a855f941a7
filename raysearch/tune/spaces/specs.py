"""The search-space file format: YAML reading, one parameter spec, the error of a bad file.

The leaf of the search-space modules: :class:`SpaceError` (every problem of a space or recipe file),
:func:`read_yaml` (the YAML of a space or recipe file, read by
:func:`raysearch.config.yaml_file.read_yaml_file`), the bundled ``search_spaces`` folder, and
:class:`Spec`, one parameter (a fixed value, a float/int range or a categorical) with
:func:`parse_spec`, which checks it. The spec syntax is described in :mod:`raysearch.tune.spaces`,
which re-exports every name defined here (as do :mod:`raysearch.tune.recipes` and
:mod:`raysearch.tune.posthoc_sweep`, which import them from there).

This module imports only :mod:`raysearch.config.yaml_file` and :mod:`raysearch.registry` from
the package: :mod:`raysearch.tune.spaces.search_space` and
:mod:`raysearch.tune.spaces` import it, never the other way round. Optuna is only named for type
checking (:meth:`Spec.suggest` gets the trial).
"""

from __future__ import annotations

import decimal
import importlib.resources
import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raysearch.config.yaml_file import read_yaml_file
from raysearch.registry import did_you_mean

if TYPE_CHECKING:
    import optuna

__all__ = ["SpaceError"]

_SPEC_KEYS = ("type", "low", "high", "log", "step", "choices")
_RANGE_KINDS = ("float", "int")


class SpaceError(ValueError):
    """A search-space file is malformed or holds a value the loss or the run config rejects.

    The message is one line: ``<file>: <key path>: <problem>``.
    """


# --------------------------------------------------------------------------------------------
# YAML loading: YAML 1.2 floats (1e-3), duplicate keys and aliases rejected, errors as one line.
# --------------------------------------------------------------------------------------------


def one_line(text: object) -> str:
    return " ".join(str(text).split())


def read_yaml(path: Path, label: str) -> Any:
    """The YAML document of a space or recipe file (plain data: dicts, lists, scalars).

    Read by :func:`raysearch.config.yaml_file.read_yaml_file` (no aliases, no duplicate keys,
    YAML 1.2 floats, at most :data:`~raysearch.config.yaml_file.MAX_YAML_BYTES`).

    Raises:
        SpaceError: one line naming `label` and what is wrong.
    """
    try:
        return read_yaml_file(path, label)
    except FileNotFoundError:
        raise
    except ValueError as exc:
        raise SpaceError(str(exc)) from None


# --------------------------------------------------------------------------------------------
# The bundled search spaces.
# --------------------------------------------------------------------------------------------


def bundled_folder(package: str, folder: str) -> Path:
    """The folder of YAML files shipped as `package` (the repository's `folder` in a checkout).

    The wheel installs ``search_spaces/`` as ``raysearch.search_spaces`` and ``recipes/`` as
    ``raysearch.recipe_files``; an editable install without that mapping reads the repository.
    """
    try:
        root = importlib.resources.files(package)
    except ModuleNotFoundError:
        import raysearch

        return Path(raysearch.__file__).resolve().parent.parent / folder
    return root if isinstance(root, Path) else Path(str(root))


def bundled_spaces_dir() -> Path:
    return bundled_folder("raysearch.search_spaces", "search_spaces")


# --------------------------------------------------------------------------------------------
# One parameter spec.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    """One parameter: fixed value, float/int range or categorical."""

    kind: str  # "fixed" | "float" | "int" | "categorical"
    value: Any = None
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    step: float | int | None = None
    choices: tuple[Any, ...] = ()

    @property
    def sampled(self) -> bool:
        return self.kind != "fixed"

    def candidates(self) -> tuple[Any, ...]:
        """Values checked on load: the fixed value, both ends of a range, every choice."""
        if self.kind == "fixed":
            return (self.value,)
        if self.kind == "categorical":
            return self.choices
        return (self.low, self.high) if self.low != self.high else (self.low,)

    def end(self, which: str) -> Any:
        """The ``low`` or ``high`` end (first or last choice; the fixed value)."""
        if self.kind == "fixed":
            return self.value
        if self.kind == "categorical":
            return self.choices[0] if which == "low" else self.choices[-1]
        return self.low if which == "low" else self.high

    def suggest(self, trial: optuna.Trial, name: str) -> Any:
        """Ask `trial` for a value named `name` (only for sampled specs)."""
        if self.kind == "float":
            return trial.suggest_float(name, self.low, self.high, step=self.step, log=self.log)
        if self.kind == "int":
            step = 1 if self.step is None else self.step
            return trial.suggest_int(name, self.low, self.high, step=step, log=self.log)
        if self.kind == "categorical":
            return trial.suggest_categorical(name, list(self.choices))
        raise RuntimeError(f"a fixed parameter is not sampled ({name}={self.value!r})")

    def row(self) -> tuple[str, str, str]:
        """(kind, range/choices/value, log flag) for :meth:`SearchSpace.describe`."""
        if self.kind == "fixed":
            return "fixed", format_value(self.value), ""
        if self.kind == "categorical":
            return "categorical", "{" + ", ".join(format_value(c) for c in self.choices) + "}", ""
        text = f"[{format_value(self.low)}, {format_value(self.high)}]"
        if self.step is not None:
            text += f" step {format_value(self.step)}"
        return self.kind, text, "log" if self.log else ""


def format_value(value: Any) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))


def _divisible(low: float, high: float, step: float) -> bool:
    span = decimal.Decimal(str(high)) - decimal.Decimal(str(low))
    return span % decimal.Decimal(str(step)) == 0


def parse_spec(raw: Any, where: str, *, expect_float: bool,
               allow_list: bool = False) -> Spec:
    """Parse one spec: a fixed value, a float/int range or a categorical.

    Args:
        raw: the spec as read from YAML.
        where: ``<file>: <key path>``, the start of every error.
        expect_float: the parameter's default is a float (an int range warns).
        allow_list: a list of scalars is a fixed value (a factory's tuple argument, such as
            an optimizer's ``betas``).

    Raises:
        SpaceError: naming `where` and what is wrong.
    """
    if allow_list and isinstance(raw, list) and all(_is_scalar(v) for v in raw):
        return Spec("fixed", value=list(raw))
    if _is_scalar(raw):
        if isinstance(raw, float) and not math.isfinite(raw):
            raise SpaceError(f"{where}: a fixed value must be finite, got {raw!r}")
        return Spec("fixed", value=raw)
    if isinstance(raw, list):
        raise SpaceError(f"{where}: a list is not a spec; write {{choices: [...]}} for a "
                         f"categorical, got {raw!r}")
    if not isinstance(raw, dict):
        raise SpaceError(f"{where}: expected a scalar or a mapping, got {type(raw).__name__}")
    unknown = sorted(str(k) for k in raw if k not in _SPEC_KEYS)
    if unknown:
        raise SpaceError(f"{where}: unknown key(s) {', '.join(unknown)}"
                         f"{did_you_mean(unknown, _SPEC_KEYS)}; allowed: {', '.join(_SPEC_KEYS)}")
    if "choices" in raw:
        return _parse_choices(raw, where)
    return _parse_range(raw, where, expect_float)


def _parse_choices(raw: dict, where: str) -> Spec:
    """``{choices: [...]}``: a categorical over scalars, none repeated."""
    extra = [k for k in _SPEC_KEYS if k != "choices" and k in raw]
    if extra:
        raise SpaceError(f"{where}: `choices` cannot be combined with {', '.join(extra)}")
    choices = raw["choices"]
    if not isinstance(choices, list):
        raise SpaceError(f"{where}: `choices` must be a list, got {choices!r}")
    if not choices:
        raise SpaceError(f"{where}: `choices` must not be empty")
    for choice in choices:
        if not _is_scalar(choice):
            raise SpaceError(f"{where}: each choice must be null, a bool, an int, a float or a "
                             f"string, got {choice!r}")
    if len({(type(c), c) for c in choices}) != len(choices):
        raise SpaceError(f"{where}: `choices` has duplicate values: {choices!r}")
    return Spec("categorical", choices=tuple(choices))


def _parse_range(raw: dict, where: str, expect_float: bool) -> Spec:
    """``{low, high}`` with ``log``, ``step`` and ``type``: an int or a float range."""
    missing = [k for k in ("low", "high") if k not in raw]
    if missing:
        raise SpaceError(f"{where}: missing {' and '.join(missing)} (a range needs low and "
                         "high; use {choices: [...]} for a categorical)")
    low, high = raw["low"], raw["high"]
    for name, value in (("low", low), ("high", high)):
        if not _is_number(value):
            raise SpaceError(f"{where}: {name} must be a number, got {value!r}")
        if not math.isfinite(value):
            raise SpaceError(f"{where}: {name} must be finite, got {value!r}")
    log = raw.get("log", False)
    if not isinstance(log, bool):
        raise SpaceError(f"{where}: log must be true or false, got {log!r}")
    step = raw.get("step")
    if step is not None and (not _is_number(step) or not math.isfinite(step) or step <= 0):
        raise SpaceError(f"{where}: step must be a number > 0, got {step!r}")
    kind = _range_kind(raw.get("type"), low, high, step, where, expect_float)
    if kind == "int":
        for name, value in (("low", low), ("high", high), ("step", step)):
            if isinstance(value, float) and not value.is_integer():
                raise SpaceError(f"{where}: {name} must be an integer for `type: int`, got "
                                 f"{value!r}")
    cast = int if kind == "int" else float
    low, high = cast(low), cast(high)
    step = None if step is None else cast(step)
    if low > high:
        raise SpaceError(f"{where}: low ({low}) must be <= high ({high})")
    if log and step is not None:
        raise SpaceError(f"{where}: log and step cannot be combined (Optuna samples a log range "
                         "continuously)")
    if log and low <= 0:
        raise SpaceError(f"{where}: log scale needs low > 0, got low ({low})")
    if step is not None and not _divisible(low, high, step):
        raise SpaceError(f"{where}: high - low ({high} - {low}) must be a multiple of step "
                         f"({step})")
    return Spec(kind, low=low, high=high, log=log, step=step)


def _range_kind(kind: Any, low: Any, high: Any, step: Any, where: str,
                expect_float: bool) -> str:
    """``type`` of a range, or the one its bounds imply (an int range of a float warns)."""
    if kind is not None:
        if kind not in _RANGE_KINDS:
            raise SpaceError(f"{where}: type must be 'int' or 'float', got {kind!r}")
        return kind
    ints = isinstance(low, int) and isinstance(high, int) and (step is None
                                                              or isinstance(step, int))
    if ints and expect_float:
        warnings.warn(f"{where}: both bounds are integers, so the range is sampled as int; "
                      f"write {float(low)} or add `type: float` for a float range",
                      UserWarning, stacklevel=4)
    return "int" if ints else "float"


def spec_doc(spec: Spec) -> dict[str, Any]:
    """A sampled spec as the plain mapping a space file would write."""
    if spec.kind == "categorical":
        return {"type": "categorical", "choices": list(spec.choices)}
    doc: dict[str, Any] = {"type": spec.kind, "low": spec.low, "high": spec.high}
    if spec.log:
        doc["log"] = True
    if spec.step is not None:
        doc["step"] = spec.step
    return doc
