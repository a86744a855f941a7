"""YAML search spaces turned into Optuna define-by-run functions, with validation on load.

A search space is a YAML file that reads like a paper's hyperparameter table. A single-method
file (``acls.yaml``)::

    method: acls                          # a loss name of raysearch.losses.build_loss
    description: Adaptive and conditional label smoothing
    params:                               # loss hyperparameters (build_loss keywords)
      margin: {low: 6.0, high: 10.0}      # float range
      lambda1: {low: 0.01, high: 0.3, log: true}
      variant: paper                      # a scalar is a fixed value
    train:                                # training hyperparameters (config.TRAIN_KEYS)
      lr: {low: 0.01, high: 0.2, log: true}
      batch_size: {choices: [32, 64, 128]}   # categorical
      epochs: 10

Sections ``model:``, ``data:`` and ``optimizer:`` hold the keyword arguments of the model
factory, the dataset factory and the optimizer, fixed or searched with the same syntax;
``name`` in each names the factory (a registered name or an import string), ``lr`` and
``weight_decay`` of the optimizer are its own. A list is a fixed value there (``betas``)::

    method: mypkg.losses:FocalPlus        # an import string works wherever a name does
    params: {gamma: {low: 1.0, high: 3.0}}
    model:
      name: mypkg.models:make_net
      hidden: {low: 16, high: 128}        # int range: the factory's own argument
    data:
      name: mypkg.data:load_table
      n_features: 20
    optimizer:
      name: adamw
      lr: {low: 1.0e-4, high: 1.0e-2, log: true}
      weight_decay: {low: 1.0e-4, high: 0.1, log: true}
      betas: [0.9, 0.999]

Their trial-config and MLflow names are ``model.hidden``, ``data.n_features``,
``optimizer.weight_decay`` (the factory names: ``model``, ``dataset``, ``optimizer``).

The conditional file (``all.yaml``) picks the method first and takes each branch's ``params``
from ``<method>.yaml`` (the file next to ``all.yaml`` if there is one, else the bundled one)::

    methods: [ce, ls, focal, flsd, mbls, acls]
    train: {...}                          # shared by every branch: the same budget per method

Spec kinds (allowed keys: ``type``, ``low``, ``high``, ``log``, ``step``, ``choices``):

- a scalar (number, string, bool or null): a fixed value, never sampled;
- ``{low, high}`` with optional ``log: true`` or ``step``: a range. It is an **int** range
  when ``type: int`` is given, or when ``type`` is absent, both bounds are YAML integers
  (``6``, not ``6.0``) and ``step`` is absent or an integer; otherwise a **float** range
  (``type: float`` forces float). A range inferred as int for a parameter whose default is a
  float warns, since ``{low: 6, high: 10}`` for a margin is then sampled from {6, ..., 10};
- ``{choices: [...]}``: categorical over None/bool/int/float/str values.

Optuna parameter names: single-method files use plain names (``margin``, ``lr``); ``all.yaml``
samples a categorical ``method`` and names each branch's loss parameters ``<method>.<param>``
(``acls.margin``) so that branches never share a name with different distributions; training
parameters keep plain names. Numbers such as ``1e-3`` are read as floats (YAML 1.2), not strings.

Every problem found on load raises :class:`SpaceError`, one line naming the file, the key path
and the problem: ``acls.yaml: params.margin: low (10.0) must be <= high (6.0)``. Loss values
are checked by building the loss with the low and the high end of every range, each choice and
each fixed value; training values by building a :class:`~raysearch.config.RunConfig`.

This module imports neither Ray nor MLflow; Optuna only inside :meth:`SearchSpace.define_by_run`
(through the trial it is given).
"""

from __future__ import annotations

import contextvars
import dataclasses
import decimal
import importlib.resources
import math
import os
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import yaml

from raysearch.config import TRAIN_KEYS, RunConfig
from raysearch.registry import RegistryError, is_import_string

if TYPE_CHECKING:
    import optuna

__all__ = [
    "SPACE_KINDS",
    "SearchSpace",
    "SpaceError",
    "available_spaces",
    "load_space",
    "space_kind",
    "training_specs",
    "validate_space",
]

_SPEC_KEYS = ("type", "low", "high", "log", "step", "choices")
#: Sections holding a factory's keyword arguments, and the trial-config key of their ``name``.
_FACTORY_SECTIONS = {"model": "model", "data": "dataset", "optimizer": "optimizer"}
_SINGLE_KEYS = ("method", "description", "params", "train", *_FACTORY_SECTIONS)
_CONDITIONAL_KEYS = ("methods", "description", "train", *_FACTORY_SECTIONS)
_RANGE_KINDS = ("float", "int")
#: Trial-config keys of a repeated sweep (``--repeats``): the configuration a trial is a seed
#: of, and which seed (0-based; the trial trains with ``seed + index`` on the split of ``seed``).
CONFIG_ID_KEY = "_config_id"
SEED_INDEX_KEY = "_seed_index"
#: Values of a file's top-level ``kind`` (absent means ``train``).
SPACE_KINDS = ("train", "posthoc")


class SpaceError(ValueError):
    """A search-space file is malformed or holds a value the loss or the run config rejects.

    The message is one line: ``<file>: <key path>: <problem>``.
    """


# --------------------------------------------------------------------------------------------
# YAML loading: YAML 1.2 floats (1e-3), duplicate keys rejected, errors as one line.
# --------------------------------------------------------------------------------------------


class _Loader(yaml.SafeLoader):
    """Safe loader that reads ``1e-3`` as a float and rejects duplicate mapping keys."""

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


def _read_yaml(path: Path, label: str) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise SpaceError(f"{label}: not a UTF-8 text file ({exc.reason})") from None
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = _one_line(getattr(exc, "problem", None) or exc)
        context, context_mark = getattr(exc, "context", None), getattr(exc, "context_mark", None)
        if context and context_mark is not None and context_mark.line != getattr(mark, "line", -1):
            problem += f" ({_one_line(context)} at line {context_mark.line + 1})"
        raise SpaceError(f"{label}: malformed YAML{where}: {problem}") from None


# --------------------------------------------------------------------------------------------
# One parameter spec.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Spec:
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
            return "fixed", _fmt(self.value), ""
        if self.kind == "categorical":
            return "categorical", "{" + ", ".join(_fmt(c) for c in self.choices) + "}", ""
        text = f"[{_fmt(self.low)}, {_fmt(self.high)}]"
        if self.step is not None:
            text += f" step {_fmt(self.step)}"
        return self.kind, text, "log" if self.log else ""


def _fmt(value: Any) -> str:
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


def _parse_spec(raw: Any, where: str, *, expect_float: bool,
                allow_list: bool = False) -> _Spec:
    """Parse one spec; `where` is ``<file>: <key path>``; raises SpaceError.

    With `allow_list` a list of scalars is a fixed value (a factory's tuple argument, such as
    an optimizer's ``betas``).
    """

    def error(problem: str) -> SpaceError:
        return SpaceError(f"{where}: {problem}")

    if allow_list and isinstance(raw, list) and all(_is_scalar(v) for v in raw):
        return _Spec("fixed", value=list(raw))
    if _is_scalar(raw):
        if isinstance(raw, float) and not math.isfinite(raw):
            raise error(f"a fixed value must be finite, got {raw!r}")
        return _Spec("fixed", value=raw)
    if isinstance(raw, list):
        raise error(
            f"a list is not a spec; write {{choices: [...]}} for a categorical, got {raw!r}"
        )
    if not isinstance(raw, dict):
        raise error(f"expected a scalar or a mapping, got {type(raw).__name__}")

    unknown = sorted(str(k) for k in raw if k not in _SPEC_KEYS)
    if unknown:
        raise error(f"unknown key(s) {', '.join(unknown)}; allowed: {', '.join(_SPEC_KEYS)}")

    if "choices" in raw:
        extra = [k for k in _SPEC_KEYS if k != "choices" and k in raw]
        if extra:
            raise error(f"`choices` cannot be combined with {', '.join(extra)}")
        choices = raw["choices"]
        if not isinstance(choices, list):
            raise error(f"`choices` must be a list, got {choices!r}")
        if not choices:
            raise error("`choices` must not be empty")
        for choice in choices:
            if not _is_scalar(choice):
                raise error(
                    f"each choice must be null, a bool, an int, a float or a string, got {choice!r}"
                )
        if len({(type(c), c) for c in choices}) != len(choices):
            raise error(f"`choices` has duplicate values: {choices!r}")
        return _Spec("categorical", choices=tuple(choices))

    missing = [k for k in ("low", "high") if k not in raw]
    if missing:
        raise error(
            f"missing {' and '.join(missing)} (a range needs low and high; "
            "use {choices: [...]} for a categorical)"
        )
    low, high = raw["low"], raw["high"]
    for name, value in (("low", low), ("high", high)):
        if not _is_number(value):
            raise error(f"{name} must be a number, got {value!r}")
        if not math.isfinite(value):
            raise error(f"{name} must be finite, got {value!r}")
    log = raw.get("log", False)
    if not isinstance(log, bool):
        raise error(f"log must be true or false, got {log!r}")
    step = raw.get("step")
    if step is not None and (not _is_number(step) or not math.isfinite(step) or step <= 0):
        raise error(f"step must be a number > 0, got {step!r}")
    kind = raw.get("type")
    if kind is None:
        kind = (
            "int"
            if isinstance(low, int)
            and isinstance(high, int)
            and (step is None or isinstance(step, int))
            else "float"
        )
        if kind == "int" and expect_float:
            warnings.warn(
                f"{where}: both bounds are integers, so the range is sampled as int; "
                f"write {float(low)} or add `type: float` for a float range",
                UserWarning,
                stacklevel=2,
            )
    elif kind not in _RANGE_KINDS:
        raise error(f"type must be 'int' or 'float', got {kind!r}")

    if kind == "int":
        for name, value in (("low", low), ("high", high), ("step", step)):
            if isinstance(value, float) and not value.is_integer():
                raise error(f"{name} must be an integer for `type: int`, got {value!r}")
        low, high = int(low), int(high)
        step = None if step is None else int(step)
    else:
        low, high = float(low), float(high)
        step = None if step is None else float(step)

    if low > high:
        raise error(f"low ({low}) must be <= high ({high})")
    if log and step is not None:
        raise error("log and step cannot be combined (Optuna samples a log range continuously)")
    if log and low <= 0:
        raise error(f"log scale needs low > 0, got low ({low})")
    if step is not None and not _divisible(low, high, step):
        raise error(f"high - low ({high} - {low}) must be a multiple of step ({step})")
    return _Spec(kind, low=low, high=high, log=log, step=step)


# --------------------------------------------------------------------------------------------
# File parsing and validation.
# --------------------------------------------------------------------------------------------

_FLOAT_TRAIN_KEYS = frozenset({"lr", "momentum", "weight_decay", "interleave_fraction",
                               "lr_decay", "mixup_alpha", "cutmix_alpha", "ricap_beta",
                               "head_lr",
                               "optimizer.lr", "optimizer.weight_decay",
                               "optimizer.momentum"})


def _as_mapping(raw: Any, where: str) -> dict:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise SpaceError(f"{where}: expected a mapping, got {type(raw).__name__}")
    return raw


def _check_top_level(doc: Any, label: str) -> dict:
    if doc is None:
        raise SpaceError(f"{label}: empty file; expected a mapping with `method` or `methods`")
    if not isinstance(doc, dict):
        raise SpaceError(
            f"{label}: expected a mapping with `method` or `methods`, got {type(doc).__name__}"
        )
    kind = doc.get("kind", "train")
    if kind == "posthoc":
        raise SpaceError(
            f"{label}: a post-hoc search space (kind: posthoc): use "
            "`raysearch calibrate FILE --search` (raysearch.posthoc_sweep), not a training sweep"
        )
    if kind != "train":
        raise SpaceError(f"{label}: kind: must be 'train' or 'posthoc', got {kind!r}")
    doc = {k: v for k, v in doc.items() if k != "kind"}
    if ("method" in doc) == ("methods" in doc):
        raise SpaceError(
            f"{label}: give exactly one of `method` (one loss) or `methods` (conditional space)"
        )
    allowed = _SINGLE_KEYS if "method" in doc else _CONDITIONAL_KEYS
    unknown = sorted(str(k) for k in doc if k not in allowed)
    if unknown:
        raise SpaceError(
            f"{label}: unknown top-level key(s) {', '.join(unknown)}; allowed: {', '.join(allowed)}"
        )
    description = doc.get("description", "")
    if description is None:
        description = ""
    if not isinstance(description, str):
        raise SpaceError(f"{label}: description: must be a string, got {description!r}")
    return doc


def _parse_train(raw: Any, label: str) -> dict[str, _Spec]:
    train: dict[str, _Spec] = {}
    for key, value in _as_mapping(raw, f"{label}: train").items():
        where = f"{label}: train.{key}"
        if key not in TRAIN_KEYS:
            raise SpaceError(
                f"{where}: unknown training key {key!r}; allowed: {', '.join(TRAIN_KEYS)}"
            )
        train[key] = _parse_spec(value, where, expect_float=key in _FLOAT_TRAIN_KEYS)
    # each value is checked together with the other keys' low ends: some keys only make sense
    # together (`schedule: multistep` needs `milestones`)
    for key, spec in train.items():
        others = {k: s.end("low") for k, s in train.items() if k != key}
        for candidate in spec.candidates():
            try:
                RunConfig(**{**others, key: candidate})
            except (ValueError, TypeError) as exc:
                # the key path says where; the config's section prefix would repeat it
                text = re.sub(r"^(loss|model|data|optimizer|schedule): ", "", _one_line(exc))
                raise SpaceError(f"{label}: train.{key}: {text}") from None
    return train


def _parse_sections(doc: Mapping[str, Any], label: str) -> dict[str, _Spec]:
    """The ``model:``, ``data:`` and ``optimizer:`` sections as flat trial-config specs.

    ``name`` becomes the factory key (``model``, ``dataset``, ``optimizer``); the optimizer's
    ``lr`` and ``weight_decay`` become ``optimizer.lr`` / ``optimizer.weight_decay``; every
    other key the factory's keyword argument ``<section>.<key>``. A fixed factory name is
    resolved now, and the keys it does not take are refused (a factory with ``**kwargs``
    takes anything). Values are checked when the sweep builds the model and the data.
    """
    from raysearch.registry import check_keywords

    out: dict[str, _Spec] = {}
    for section, name_key in _FACTORY_SECTIONS.items():
        raw = _as_mapping(doc.get(section), f"{label}: {section}")
        if not raw:
            continue
        factory = None
        for key, value in raw.items():
            where = f"{label}: {section}.{key}"
            if not isinstance(key, str) or not key:
                raise SpaceError(f"{where}: keys must be non-empty strings")
            if key == "name":
                spec = _parse_spec(value, where, expect_float=False)
                if spec.kind == "fixed":
                    factory = _resolve_factory(section, spec.value, where)
                out[name_key] = spec
                continue
            flat = f"{section}.{key}"
            out[flat] = _parse_spec(value, where, expect_float=flat in _FLOAT_TRAIN_KEYS,
                                    allow_list=True)
        if factory is not None:
            given = [k for k in raw if k != "name"
                     and not (section == "optimizer" and k in ("lr", "weight_decay"))]
            try:
                check_keywords(factory, given, what=f"{section} {raw['name']!r}",
                               reserved=("num_classes", "input_shape", "data_dir", "seed",
                                         "val_fraction", "params", "self"))
            except ValueError as exc:
                raise SpaceError(f"{label}: {section}: {_one_line(exc)}") from None
    return out


def _resolve_factory(section: str, name: Any, where: str) -> Any:
    """The factory a section's fixed ``name`` stands for (imports an import string)."""
    from raysearch.registries import registry

    kind = {"model": "models", "data": "datasets", "optimizer": "optimizers"}[section]
    if kind == "optimizers":
        from raysearch.optim import optimizer_class

        try:
            return optimizer_class(name)
        except ValueError as exc:
            raise SpaceError(f"{where}: {_one_line(exc)}") from None
    try:
        return registry(kind).get(_given(kind, name))
    except (RegistryError, ValueError) as exc:
        raise SpaceError(f"{where}: {_one_line(exc)}") from None


def _check_method(method: Any, where: str) -> str:
    from raysearch.losses import LOSS_REGISTRY

    if not isinstance(method, str) or not method:
        raise SpaceError(f"{where}: `method` must be a loss name or an import string "
                         f"package.module:attr, got {method!r}")
    try:
        LOSS_REGISTRY.get(_given("losses", method))
    except RegistryError as exc:
        text = _one_line(exc)
        if not is_import_string(method):
            text = text.replace("Unknown loss", "unknown method", 1)
        raise SpaceError(f"{where}: {text}") from None
    return method


def _parse_params(method: str, raw: Any, label: str) -> dict[str, _Spec]:
    from raysearch.losses import build_loss, loss_parameters

    loss_label, method = method, _given("losses", method)
    accepted = dict(loss_parameters(method))
    params: dict[str, _Spec] = {}
    for key, value in _as_mapping(raw, f"{label}: params").items():
        where = f"{label}: params.{key}"
        if key not in accepted:
            names = ", ".join(accepted) if accepted else "none"
            raise SpaceError(
                f"{where}: loss {loss_label!r} has no parameter {key!r}; accepted: {names}"
            )
        if key == "method" or key in TRAIN_KEYS:
            raise SpaceError(f"{where}: name clashes with the training key {key!r}")
        default = accepted[key]
        spec = _parse_spec(
            value, where, expect_float=isinstance(default, float) and not isinstance(default, bool)
        )
        for candidate in spec.candidates():
            try:
                build_loss(method, **{key: candidate})
            except (ValueError, TypeError) as exc:
                raise SpaceError(f"{where}: {_one_line(exc)}") from None
        params[key] = spec
    # Parameters can constrain each other (e.g. an ordering); try the all-low and all-high ends.
    if any(spec.sampled for spec in params.values()):
        for which in ("low", "high"):
            combo = {key: spec.end(which) for key, spec in params.items()}
            try:
                build_loss(method, **combo)
            except (ValueError, TypeError) as exc:
                shown = ", ".join(f"{k}={v!r}" for k, v in combo.items())
                raise SpaceError(f"{label}: params: {_one_line(exc)} (with {shown})") from None
    return params


# --------------------------------------------------------------------------------------------
# The search space.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class SearchSpace:
    """A validated search space, loaded by :func:`load_space`.

    Attributes:
        name: file name without ``.yaml`` (``acls``, ``all``).
        path: the YAML file.
        description: the file's ``description`` (may be empty).
        conditional: True for a ``methods:`` file (``all.yaml``): ``method`` is sampled and loss
            parameters are named ``<method>.<param>``.
    """

    name: str
    path: Path
    description: str
    conditional: bool
    _branches: Mapping[str, Mapping[str, _Spec]] = field(repr=False)
    _descriptions: Mapping[str, str] = field(repr=False)
    _train: Mapping[str, _Spec] = field(repr=False)
    recipe: str | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        # Ray pickles the space (searcher state, trainable parameters); mappingproxy cannot be
        # pickled, so rebuild it from plain dicts.
        return (_rebuild_space, (self.name, self.path, self.description, self.conditional,
                                 {m: dict(b) for m, b in self._branches.items()},
                                 dict(self._descriptions), dict(self._train), self.recipe))

    @property
    def bundled(self) -> bool:
        """True for a space shipped with raysearch (its ``train:`` is the digits protocol)."""
        try:
            return self.path.resolve().parent == Path(_bundled_dir()).resolve()
        except OSError:
            return False

    def with_train(self, train: Mapping[str, _Spec], recipe: str | None) -> SearchSpace:
        """The same space with other training specs (a recipe's, :mod:`raysearch.recipes`)."""
        return dataclasses.replace(self, _train=MappingProxyType(dict(train)), recipe=recipe)

    @property
    def train_specs(self) -> Mapping[str, _Spec]:
        """The training specs by flat trial-config key (read-only)."""
        return self._train

    def searched(self, method: str | None = None) -> dict[str, dict[str, Any]]:
        """The sampled parameters under their trial-config names, each as its spec's fields.

        Args:
            method: the branch of a conditional space (default: every branch).

        Returns:
            ``{name: {"type": "float", "low": 6.0, "high": 10.0, "log": False}, ...}`` (a
            categorical as ``{"type": "categorical", "choices": [...]}``).
        """
        out: dict[str, dict[str, Any]] = {}
        if self.conditional:
            out["method"] = {"type": "categorical", "choices": list(self.methods)}
        for branch in [method] if method else self.methods:
            for key, spec in self._branches[branch].items():
                if spec.sampled:
                    out[self._key(branch, key)] = _spec_doc(spec)
        out.update({k: _spec_doc(s) for k, s in self._train.items() if s.sampled})
        return out

    def to_dict(self) -> dict[str, Any]:
        """The space as plain JSON-ready data (every branch's specs), for :meth:`from_dict`.

        A sweep stores it with its record, so ``raysearch sweep --resume`` samples from the
        same space even if its YAML files changed or are not on the resuming machine.
        """
        def specs(mapping: Mapping[str, _Spec]) -> dict[str, dict[str, Any]]:
            return {k: {**dataclasses.asdict(v), "choices": list(v.choices)}
                    for k, v in mapping.items()}

        return {"name": self.name, "path": str(self.path), "description": self.description,
                "conditional": self.conditional,
                "branches": {m: specs(b) for m, b in self._branches.items()},
                "descriptions": dict(self._descriptions), "train": specs(self._train),
                "recipe": self.recipe}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> SearchSpace:
        """Rebuild a space written by :meth:`to_dict`.

        Raises:
            SpaceError: if `doc` lacks a key or holds a malformed spec.
        """
        def specs(mapping: Mapping[str, Any]) -> dict[str, _Spec]:
            return {k: _Spec(**{**v, "choices": tuple(v.get("choices", ()))})
                    for k, v in mapping.items()}

        try:
            return _rebuild_space(
                str(doc["name"]), Path(doc["path"]), str(doc["description"]),
                bool(doc["conditional"]),
                {m: specs(b) for m, b in doc["branches"].items()},
                dict(doc["descriptions"]), specs(doc["train"]), doc.get("recipe"))
        except (KeyError, TypeError, AttributeError) as exc:
            raise SpaceError(f"stored search space is malformed: {exc!r}") from None

    @property
    def methods(self) -> list[str]:
        """Loss names this space can choose (one for a single-method file)."""
        return list(self._branches)

    def _key(self, method: str, param: str) -> str:
        return f"{method}.{param}" if self.conditional else param

    def define_by_run(self, trial: optuna.Trial) -> dict[str, Any]:
        """Define-by-run function for ``OptunaSearch(space=space.define_by_run)``.

        Calls ``trial.suggest_float``/``suggest_int``/``suggest_categorical`` for every sampled
        parameter (``method`` first in a conditional space, then the chosen branch's loss
        parameters, then the training parameters) and returns the fixed values only, as Ray
        requires; the sampled values are in ``trial.params``.

        Args:
            trial: an Optuna trial (or Ray's wrapper around one).

        Returns:
            The fixed values under their Optuna-style names (``lr``, ``acls.variant``); a
            single-method space also returns ``method`` (fixed there), so every trial config
            names its method. A conditional space returns only the chosen branch's fixed values.
        """
        fixed: dict[str, Any] = {}
        if self.conditional:
            method = trial.suggest_categorical("method", self.methods)
        else:
            method = self.methods[0]
            fixed["method"] = method
        named = [(self._key(method, k), s) for k, s in self._branches[method].items()]
        named += list(self._train.items())
        for key, spec in named:
            if spec.sampled:
                spec.suggest(trial, key)
            else:
                fixed[key] = spec.value
        return fixed

    def _split(
        self, flat: Mapping[str, Any]
    ) -> tuple[str, dict[str, Any], dict[str, Any], dict[str, Any]]:
        """(method, loss params, train values, remaining keys) of a flat trial config."""
        rest = dict(flat)
        if self.conditional:
            if "method" not in rest:
                raise SpaceError(f"{self.name}: the trial config has no `method`")
            method = rest.pop("method")
            if method not in self._branches:
                raise SpaceError(
                    f"{self.name}: `method` {method!r} is not one of {', '.join(self.methods)}"
                )
        else:
            method = self.methods[0]
            given = rest.pop("method", method)
            if given != method:
                raise SpaceError(
                    f"{self.name}: `method` {given!r} does not match this space's {method!r}"
                )

        def take(key: str, spec: _Spec) -> Any:
            if key in rest:
                return rest.pop(key)
            if not spec.sampled:
                return spec.value
            raise SpaceError(f"{self.name}: the trial config has no sampled parameter {key!r}")

        loss_params = {k: take(self._key(method, k), s) for k, s in self._branches[method].items()}
        train = {k: take(k, s) for k, s in self._train.items()}
        if self.conditional:  # drop other branches' keys if a caller passed them
            for other, params in self._branches.items():
                for k in params:
                    rest.pop(self._key(other, k), None)
        return method, loss_params, train, rest

    def resolve(self, flat: Mapping[str, Any], **overrides: Any) -> RunConfig:
        """Turn a flat trial config (as Ray hands it to the trainable) into a RunConfig.

        Args:
            flat: sampled and fixed values under their Optuna-style names (``method``,
                ``margin`` or ``acls.margin``, ``lr``, ...). Fixed values missing from it are
                taken from the space. Other keys (``dataset``, ``seed``, ``ece_bins``,
                ``data_dir``, ...) are passed to :class:`~raysearch.config.RunConfig`.
            **overrides: RunConfig fields that replace everything else (``epochs=3`` from
                ``--epochs``); a value of None is ignored.

        A repeated sweep's trial config also holds :data:`CONFIG_ID_KEY` (ignored here) and
        :data:`SEED_INDEX_KEY` k: for k > 0 the run trains with ``seed + k`` and keeps the data
        split of ``seed`` (``data_seed``), so the seeds of a configuration differ only in their
        initialisation and batch order.

        Returns:
            The validated run config; ``loss_params`` uses plain names (``margin``).

        Raises:
            SpaceError: if `method` is missing or not in this space, or a sampled parameter is
                missing.
            ValueError: if RunConfig rejects a key or a value.
        """
        flat = dict(flat)
        flat.pop(CONFIG_ID_KEY, None)
        index = flat.pop(SEED_INDEX_KEY, 0)
        method, loss_params, train, rest = self._split(flat)
        data = {"method": method, "loss_params": loss_params, **train, **rest}
        data.update({k: v for k, v in overrides.items() if v is not None})
        if index:  # seed k of a repeated configuration: same data split, seed + k
            if isinstance(index, bool) or not isinstance(index, int) or index < 0:
                raise SpaceError(f"{self.name}: `{SEED_INDEX_KEY}` must be an int >= 0, "
                                 f"got {index!r}")
            base = int(data.get("seed", 0))
            data.setdefault("data_seed", base)
            data["seed"] = base + index
        return RunConfig.from_dict(data)

    def end_config(self, which: str = "low", method: str | None = None) -> dict[str, Any]:
        """A flat trial config with every parameter at its `which` end (``low`` or ``high``).

        The low (high) end of every range, the first (last) choice, every fixed value: what
        the sweep's driver builds before Ray starts, to fail early on values a factory rejects.

        Args:
            which: ``"low"`` or ``"high"``.
            method: the branch of a conditional space (default: the first).
        """
        method = method or self.methods[0]
        flat: dict[str, Any] = {"method": method}
        flat.update({self._key(method, k): s.end(which) for k, s in self._branches[method].items()})
        flat.update({k: s.end(which) for k, s in self._train.items()})
        return flat

    def train_values(self, key: str) -> tuple[Any, ...]:
        """Values a training key can take in this space (empty: left at its default).

        The fixed value, both ends of a range or every choice.
        """
        spec = self._train.get(key)
        return () if spec is None else spec.candidates()

    def plain_params(self, flat: Mapping[str, Any]) -> dict[str, Any]:
        """Sampled and fixed hyperparameters under plain names, as MLflow logs them.

        Args:
            flat: a trial config as for :meth:`resolve`; keys the space does not know are left
                out.

        Returns:
            ``{"method": ..., <loss params>, <train params>}``, e.g. ``{"method": "acls",
            "margin": 8.1, "lambda1": 0.1, ..., "lr": 0.05, "momentum": 0.9, ...}``.
        """
        method, loss_params, train, _ = self._split(flat)
        return {"method": method, **loss_params, **train}

    def describe(self) -> str:
        """Readable table of the space, one row per parameter, grouped by method."""
        header = ("parameter", "kind", "range / choices / value", "log")
        groups: list[tuple[str, list[tuple[str, str, str, str]]]] = []
        if self.conditional:
            groups.append(
                ("[method]", [("method", "categorical", "{" + ", ".join(self.methods) + "}", "")])
            )
        for method, params in self._branches.items():
            title = f"[{method}]"
            if self.conditional and self._descriptions.get(method):
                title += f" {self._descriptions[method]}"
            rows = [(self._key(method, k), *spec.row()) for k, spec in params.items()]
            groups.append((title, rows or [("(none)", "", "", "")]))
        def section_of(key: str) -> str:
            head = key.split(".", 1)[0]
            if head not in ("model", "dataset", "data", "optimizer"):
                return "train"
            return "data" if head == "dataset" else head

        train_rows = [(k, *spec.row()) for k, spec in self._train.items()
                      if section_of(k) == "train"]
        title = "[train] shared by every method" if self.conditional else "[train]"
        groups.append((title, train_rows or [("(none: RunConfig defaults)", "", "", "")]))
        for section in ("model", "data", "optimizer"):
            rows = [(k, *spec.row()) for k, spec in self._train.items()
                    if section_of(k) == section]
            if rows:
                groups.append((f"[{section}]", rows))

        all_rows = [header] + [r for _, rows in groups for r in rows]
        widths = [max(len(r[i]) for r in all_rows) for i in range(3)]

        def line(row: tuple[str, str, str, str], indent: str = "  ") -> str:
            cells = [row[i].ljust(widths[i]) for i in range(3)] + [row[3]]
            return (indent + "  ".join(cells)).rstrip()

        out = [f"{self.name}: {self.description}" if self.description else self.name]
        out.append(f"file: {self.path}")
        if self.recipe:
            out.append(f"recipe: {self.recipe}")
        out.append("")
        out.append(line(header))
        out.append(line(tuple("-" * len(h) for h in header)))  # type: ignore[arg-type]
        for title, rows in groups:
            out.append(title)
            out.extend(line(r) for r in rows)
        return "\n".join(out)


# --------------------------------------------------------------------------------------------
# Locating and loading files.
# --------------------------------------------------------------------------------------------


def _bundled_dir() -> Path:
    try:
        root = importlib.resources.files("raysearch.search_spaces")
    except ModuleNotFoundError:
        import raysearch

        return Path(raysearch.__file__).resolve().parent.parent / "search_spaces"
    return root if isinstance(root, Path) else Path(str(root))


def available_spaces(kind: str | None = None) -> list[str]:
    """Sorted names of the bundled search spaces (file names without ``.yaml``).

    Args:
        kind: None for every file; ``"train"`` or ``"posthoc"`` for the files of that kind
            (see :func:`space_kind`). Defaults to None.

    Raises:
        ValueError: if ``kind`` is not None, ``"train"`` or ``"posthoc"``.
    """
    if kind not in (None, *SPACE_KINDS):
        raise ValueError(f"`kind` must be None, 'train' or 'posthoc', got {kind!r}")
    folder = _bundled_dir()
    if not folder.is_dir():
        return []
    names = sorted(p.stem for p in folder.glob("*.yaml") if p.is_file())
    if kind is None:
        return names
    return [name for name in names if space_kind(folder / f"{name}.yaml") == kind]


def space_kind(name_or_path: str | Path) -> str:
    """Whether a search space is a training space or a post-hoc one, from its ``kind`` key.

    A file without ``kind`` (or with ``kind: train``) is a training space, loaded by
    :func:`load_space`; ``kind: posthoc`` is loaded by
    :func:`raysearch.posthoc_sweep.load_posthoc_space`. The rest of the file is not validated.

    Args:
        name_or_path: a bundled name or the path of a YAML file (as :func:`load_space`).

    Returns:
        ``"train"`` or ``"posthoc"``.

    Raises:
        SpaceError: if the name is unknown, the YAML is malformed or ``kind`` has another value.
        FileNotFoundError: if a given path does not exist.
    """
    path, label = _locate(name_or_path)
    doc = _read_yaml(path, label)
    kind = doc.get("kind", "train") if isinstance(doc, dict) else "train"
    if kind not in SPACE_KINDS:
        raise SpaceError(f"{label}: kind: must be 'train' or 'posthoc', got {kind!r}")
    return kind


def _locate(name_or_path: str | Path) -> tuple[Path, str]:
    """(path, label used in messages) of a bundled name or a file path."""
    if isinstance(name_or_path, Path):
        is_path = True
    elif isinstance(name_or_path, str):
        is_path = name_or_path.endswith((".yaml", ".yml")) or any(
            sep in name_or_path for sep in {"/", os.sep}
        )
    else:
        raise TypeError(f"`name_or_path` must be a str or a Path, got {name_or_path!r}")
    if not is_path:
        available = available_spaces()
        if name_or_path in available:
            path = _bundled_dir() / f"{name_or_path}.yaml"
            return path, path.name
        if not Path(name_or_path).is_file():
            raise SpaceError(
                f"unknown search space {name_or_path!r}; available: {', '.join(available)} "
                "(or give the path of a YAML file)"
            )
    path = Path(name_or_path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"search space file not found: {path}")
    return path, str(name_or_path)


def _branch_path(folder: Path, method: str) -> tuple[Path, str] | None:
    sibling = folder / f"{method}.yaml"
    if sibling.is_file():
        return sibling, sibling.name
    bundled = _bundled_dir() / f"{method}.yaml"
    if bundled.is_file():
        return bundled, bundled.name
    return None


def _stamp(path: Path) -> tuple[str, int, int]:
    stat = path.stat()
    return str(path.resolve()), stat.st_mtime_ns, stat.st_size


_CACHE: dict[str, tuple[tuple[tuple[str, int, int], ...], SearchSpace]] = {}
#: Objects given through the Python API while a space is parsed (see :func:`space_from_dict`).
_COMPONENTS: contextvars.ContextVar[Mapping[str, Mapping[str, Any]] | None] = \
    contextvars.ContextVar("raysearch_space_components", default=None)


def _given(kind: str, name: Any) -> Any:
    """The API's object for `name` when one was given, else `name`."""
    return ((_COMPONENTS.get() or {}).get(kind) or {}).get(name, name)


def _parse_single(doc: dict, label: str) -> tuple[str, str, dict[str, _Spec], dict[str, _Spec]]:
    """(method, description, params, train) of a checked single-method document."""
    if "method" not in doc:
        raise SpaceError(f"{label}: expected a single-method file with `method:`")
    method = _check_method(doc["method"], f"{label}: method")
    params = _parse_params(method, doc.get("params"), label)
    train = _merge_sections(_parse_train(doc.get("train"), label), doc, label)
    return method, doc.get("description") or "", params, train


def _merge_sections(train: dict[str, _Spec], doc: Mapping[str, Any],
                    label: str) -> dict[str, _Spec]:
    """`train` plus the ``model:``/``data:``/``optimizer:`` sections (a key set once only)."""
    sections = _parse_sections(doc, label)
    for key in sections:
        legacy = {"optimizer.lr": "lr", "optimizer.weight_decay": "weight_decay",
                  "optimizer.momentum": "momentum"}.get(key, key)
        if legacy in train:
            raise SpaceError(f"{label}: {key} is set twice (in train: as {legacy!r} and in its "
                             "section): keep one")
    return {**train, **sections}


def training_specs(doc: Mapping[str, Any], label: str, *,
                   val_fraction: Any = None) -> dict[str, _Spec]:
    """A document's ``train:``, ``model:``, ``data:`` and ``optimizer:`` as flat trial specs.

    The same parsing and checks as a space file's (a recipe file uses it too); a
    `val_fraction` is added as the fixed key ``val_fraction``.

    Raises:
        SpaceError: naming `label` and the key path.
    """
    train = _merge_sections(_parse_train(doc.get("train"), label), doc, label)
    if val_fraction is not None:
        spec = _parse_spec(val_fraction, f"{label}: val_fraction", expect_float=True)
        if spec.sampled or not isinstance(spec.value, (int, float)) or isinstance(
                spec.value, bool) or not 0 < spec.value < 1:
            raise SpaceError(f"{label}: val_fraction: must be a fixed number in (0, 1), "
                             f"got {val_fraction!r}")
        train["val_fraction"] = spec
    return train


def _load(path: Path, label: str) -> tuple[SearchSpace, list[Path]]:
    """Parse and validate one file; returns the space and the files it was built from."""
    doc = _check_top_level(_read_yaml(path, label), label)
    return _from_doc(doc, path, label)


def _from_doc(doc: dict, path: Path, label: str) -> tuple[SearchSpace, list[Path]]:
    """Parse and validate a checked document; returns the space and the files it used."""
    name = path.stem
    description = doc.get("description") or ""
    if "method" in doc:
        method, _, params, train = _parse_single(doc, label)
        space = SearchSpace(
            name=name,
            path=path,
            description=description,
            conditional=False,
            _branches=MappingProxyType({method: MappingProxyType(params)}),
            _descriptions=MappingProxyType({method: description}),
            _train=MappingProxyType(train),
        )
        return space, [path]

    methods = doc["methods"]
    if not isinstance(methods, list) or not methods:
        raise SpaceError(
            f"{label}: methods: must be a non-empty list of loss names, got {methods!r}"
        )
    branches: dict[str, Mapping[str, _Spec]] = {}
    descriptions: dict[str, str] = {}
    files = [path]
    for method in methods:
        _check_method(method, f"{label}: methods")
        if method in branches:
            raise SpaceError(f"{label}: methods: {method!r} is listed twice")
        found = _branch_path(path.parent, method)
        if found is None:
            raise SpaceError(
                f"{label}: methods.{method}: no {method}.yaml next to {path.name} or bundled"
            )
        branch_path, branch_label = found
        try:
            branch_doc = _check_top_level(_read_yaml(branch_path, branch_label), branch_label)
            declared, branch_description, params, _ = _parse_single(branch_doc, branch_label)
        except SpaceError as exc:
            raise SpaceError(f"{label}: methods.{method}: {exc}") from None
        if declared != method:
            raise SpaceError(
                f"{label}: methods.{method}: {branch_label} declares method {declared!r}"
            )
        branches[method] = MappingProxyType(params)
        descriptions[method] = branch_description
        files.append(branch_path)
    train = _merge_sections(_parse_train(doc.get("train"), label), doc, label)
    space = SearchSpace(
        name=name,
        path=path,
        description=description,
        conditional=True,
        _branches=MappingProxyType(branches),
        _descriptions=MappingProxyType(descriptions),
        _train=MappingProxyType(train),
    )
    return space, files


def load_space(name_or_path: str | Path) -> SearchSpace:
    """Load and validate a search space (cached per file until a file it uses changes).

    Args:
        name_or_path: a bundled name (``acls``; see :func:`available_spaces`) or the path of a
            YAML file (a str ending in ``.yaml``/``.yml`` or containing a path separator, or a
            Path).

    Returns:
        The validated :class:`SearchSpace`.

    Raises:
        SpaceError: if the name is unknown (listing the available ones), the YAML is malformed,
            a key is unknown, a range is empty or a value is rejected by the loss or by
            :class:`~raysearch.config.RunConfig`; the message names the file and the key path.
        FileNotFoundError: if a given path does not exist.
    """
    path, label = _locate(name_or_path)
    key = _stamp(path)[0]
    cached = _CACHE.get(key)
    if cached is not None:
        stamps, space = cached
        try:
            if all(_stamp(Path(s[0])) == s for s in stamps):
                return space
        except OSError:
            pass
    space, files = _load(path, label)
    _CACHE[key] = (tuple(_stamp(p) for p in files), space)
    return space


def space_from_dict(doc: Mapping[str, Any], name: str = "space", *,
                    components: Mapping[str, Mapping[str, Any]] | None = None) -> SearchSpace:
    """A search space from a Python mapping in the YAML files' format (the Python API's way).

    Args:
        doc: the document: ``method`` (or ``methods``), ``params``, ``train``, ``model``,
            ``data``, ``optimizer``, as in a file.
        name: the space's name (sweep names and MLflow show it).
        components: objects given through the Python API by label (``{"losses": {label:
            cls}}``): a ``method`` equal to a label is that object.

    Returns:
        The validated :class:`SearchSpace`.

    Raises:
        SpaceError: as :func:`load_space`, naming `name` instead of a file.
    """
    token = _COMPONENTS.set(components or {})
    try:
        checked = _check_top_level(dict(doc), name)
        return _from_doc(checked, Path(f"{name}.yaml"), name)[0]
    finally:
        _COMPONENTS.reset(token)


def validate_space(name_or_path: str | Path) -> SearchSpace:
    """Validate a search space and return it (same as :func:`load_space`; for the CLI).

    Raises:
        SpaceError: as :func:`load_space`.
        FileNotFoundError: if a given path does not exist.
    """
    return load_space(name_or_path)


def _rebuild_space(name: str, path: Path, description: str, conditional: bool,
                   branches: dict[str, dict[str, Any]], descriptions: dict[str, str],
                   train: dict[str, Any], recipe: str | None = None) -> SearchSpace:
    return SearchSpace(
        name=name, path=path, description=description, conditional=conditional,
        _branches=MappingProxyType({m: MappingProxyType(b) for m, b in branches.items()}),
        _descriptions=MappingProxyType(descriptions), _train=MappingProxyType(train),
        recipe=recipe)


def _spec_doc(spec: _Spec) -> dict[str, Any]:
    """A sampled spec as the plain mapping a space file would write."""
    if spec.kind == "categorical":
        return {"type": "categorical", "choices": list(spec.choices)}
    doc: dict[str, Any] = {"type": spec.kind, "low": spec.low, "high": spec.high}
    if spec.log:
        doc["log"] = True
    if spec.step is not None:
        doc["step"] = spec.step
    return doc
