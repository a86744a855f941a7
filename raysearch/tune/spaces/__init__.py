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

Layers: this module parses and checks whole documents (sections, loss parameters, training
keys) and locates, loads and caches the files (:func:`load_space`, :func:`available_spaces`,
:func:`space_kind`, :func:`space_from_dict`, :func:`training_specs`). One parameter spec, the
YAML reader and :class:`SpaceError` live in the leaf :mod:`raysearch.tune.spaces.specs`, the
:class:`SearchSpace` class in :mod:`raysearch.tune.spaces.search_space`; both are imported from here
and re-exported (every name, private ones included, stays importable from
``raysearch.tune.spaces``), and neither imports this module.

This module imports neither Ray nor MLflow; Optuna only inside :meth:`SearchSpace.define_by_run`
(through the trial it is given).
"""

from __future__ import annotations

import contextvars
import os
import re
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from raysearch.config import TRAIN_KEYS, RunConfig
from raysearch.registry import RegistryError, did_you_mean, is_import_string

# The spec and YAML layer (raysearch.tune.spaces.specs) and the SearchSpace class
# (raysearch.tune.spaces.search_space) live in their own modules; every name stays importable from
# here.
from raysearch.tune.spaces.search_space import CONFIG_ID_KEY as CONFIG_ID_KEY
from raysearch.tune.spaces.search_space import SEED_INDEX_KEY as SEED_INDEX_KEY
from raysearch.tune.spaces.search_space import SearchSpace as SearchSpace
from raysearch.tune.spaces.search_space import _rebuild_space as _rebuild_space
from raysearch.tune.spaces.specs import _RANGE_KINDS as _RANGE_KINDS
from raysearch.tune.spaces.specs import _SPEC_KEYS as _SPEC_KEYS
from raysearch.tune.spaces.specs import SpaceError as SpaceError
from raysearch.tune.spaces.specs import _bundled_dir as _bundled_dir
from raysearch.tune.spaces.specs import _divisible as _divisible
from raysearch.tune.spaces.specs import _fmt as _fmt
from raysearch.tune.spaces.specs import _is_number as _is_number
from raysearch.tune.spaces.specs import _is_scalar as _is_scalar
from raysearch.tune.spaces.specs import _Loader as _Loader
from raysearch.tune.spaces.specs import _one_line as _one_line
from raysearch.tune.spaces.specs import _parse_spec as _parse_spec
from raysearch.tune.spaces.specs import _read_yaml as _read_yaml
from raysearch.tune.spaces.specs import _Spec as _Spec
from raysearch.tune.spaces.specs import _spec_doc as _spec_doc

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

#: Sections holding a factory's keyword arguments, and the trial-config key of their ``name``.
_FACTORY_SECTIONS = {"model": "model", "data": "dataset", "optimizer": "optimizer"}
_SINGLE_KEYS = ("method", "description", "params", "train", *_FACTORY_SECTIONS)
_CONDITIONAL_KEYS = ("methods", "description", "train", *_FACTORY_SECTIONS)
#: Values of a file's top-level ``kind`` (absent means ``train``).
SPACE_KINDS = ("train", "posthoc")


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
            "`raysearch calibrate FILE --search` (raysearch.tune.posthoc_sweep), "
            "not a training sweep"
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
            f"{label}: unknown top-level key(s) {', '.join(unknown)}"
            f"{did_you_mean(unknown, allowed)}; allowed: {', '.join(allowed)}"
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
                f"{where}: unknown training key {key!r}{did_you_mean(key, TRAIN_KEYS)}; "
                f"allowed: {', '.join(TRAIN_KEYS)}"
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
    from raysearch.training.registries import registry

    kind = {"model": "models", "data": "datasets", "optimizer": "optimizers"}[section]
    if kind == "optimizers":
        from raysearch.training.optim import optimizer_class

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
# Locating and loading files.
# --------------------------------------------------------------------------------------------


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
    :func:`raysearch.tune.posthoc_sweep.load_posthoc_space`. The rest of the file is not validated.

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
