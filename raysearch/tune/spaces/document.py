"""A search-space document checked key by key: sections, loss parameters, training keys.

The parsing behind :func:`raysearch.tune.spaces.load_space` (and the recipes'
:func:`training_specs`): the top-level keys of a file, its ``params:`` (checked by building the
loss at every end of every range), its ``train:`` (checked by building a
:class:`~raysearch.config.RunConfig` from the flat keys, through
:func:`raysearch.config.sections_from_flat`), and its ``model:``, ``data:`` and ``optimizer:``
sections (a fixed factory name is resolved and the keys it does not take are refused). Every
problem is a :class:`~raysearch.tune.spaces.specs.SpaceError` naming the file and key path.
"""

from __future__ import annotations

import contextlib
import contextvars
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from raysearch.config import TRAIN_KEYS, RunConfig, sections_from_flat
from raysearch.config.flat import flat_key_path
from raysearch.registry import RegistryError, did_you_mean, is_import_string
from raysearch.tune.spaces.search_space import SearchSpace
from raysearch.tune.spaces.specs import (
    SpaceError,
    Spec,
    bundled_spaces_dir,
    format_value,
    one_line,
    parse_spec,
    read_yaml,
)

__all__ = ["SPACE_KINDS", "check_top_level", "given_components", "parse_single",
           "space_from_document", "training_specs"]

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


def check_top_level(doc: Any, label: str) -> dict:
    """The top-level keys of a training space's document, checked; the document without ``kind``.

    Raises:
        SpaceError: for an empty document, a post-hoc one, neither or both of ``method`` and
            ``methods``, an unknown key or a description that is not a string.
    """
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


def _parse_train(raw: Any, label: str) -> dict[str, Spec]:
    """The ``train:`` section's specs, each value checked by building a RunConfig.

    Each candidate of a key is checked together with the other keys' low ends, since some keys
    only make sense together (``schedule: multistep`` needs ``milestones``); an error names the
    key whose value causes it (:func:`_train_error`), not the key being checked.
    """
    train: dict[str, Spec] = {}
    for key, value in _as_mapping(raw, f"{label}: train").items():
        where = f"{label}: train.{key}"
        if key not in TRAIN_KEYS:
            raise SpaceError(
                f"{where}: unknown training key {key!r}{did_you_mean(key, TRAIN_KEYS)}; "
                f"allowed: {', '.join(TRAIN_KEYS)}"
            )
        train[key] = parse_spec(value, where, expect_float=key in _FLOAT_TRAIN_KEYS)
    for key, spec in train.items():
        others = {k: s.end("low") for k, s in train.items() if k != key}
        for candidate in spec.candidates():
            flat = {**others, key: candidate}
            problem = _config_problem(flat)
            if problem is not None:
                raise _train_error(label, train, flat, key, problem)
    return train


def _config_problem(flat: Mapping[str, Any]) -> str | None:
    """Why the flat training keys `flat` make no RunConfig (one line), or None."""
    try:
        RunConfig(**sections_from_flat(dict(flat)))
    except (ValueError, TypeError) as exc:
        # the key path says where; the config's section prefix would repeat it
        return re.sub(r"^(loss|model|data|optimizer|schedule): ", "", one_line(exc))
    return None


def _train_error(label: str, train: Mapping[str, Spec], flat: Mapping[str, Any], key: str,
                 problem: str) -> SpaceError:
    """The error of the failing keys `flat` (checking `key`), under the key at fault.

    Every key whose removal leaves the same `problem` is dropped (`key` last); what is left
    causes it. The error names `key` when it is among them, else the first of them, and lists
    the others it needs ("with train.epochs = 5").
    """
    culprits = dict(flat)
    for other in [*(k for k in flat if k != key), key]:
        rest = {k: v for k, v in culprits.items() if k != other}
        if _config_problem(rest) == problem:
            culprits = rest
    blamed = key if key in culprits or not culprits else next(iter(culprits))
    partners = [f"train.{k} {'at its low end' if train[k].sampled else '='} {format_value(v)}"
                for k, v in culprits.items() if k != blamed]
    where = f" (with {', '.join(partners)})" if partners else ""
    return SpaceError(f"{label}: train.{blamed}: {problem}{where}")


def _parse_sections(doc: Mapping[str, Any], label: str) -> dict[str, Spec]:
    """The ``model:``, ``data:`` and ``optimizer:`` sections as flat trial-config specs.

    ``name`` becomes the factory key (``model``, ``dataset``, ``optimizer``); the optimizer's
    ``lr`` and ``weight_decay`` become ``optimizer.lr`` / ``optimizer.weight_decay``; every
    other key the factory's keyword argument ``<section>.<key>``. A fixed factory name is
    resolved now, and the keys it does not take are refused (a factory with ``**kwargs``
    takes anything). Values are checked when the sweep builds the model and the data.
    """
    from raysearch.registry import check_keywords

    out: dict[str, Spec] = {}
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
                spec = parse_spec(value, where, expect_float=False)
                if spec.kind == "fixed":
                    factory = _resolve_factory(section, spec.value, where)
                out[name_key] = spec
                continue
            flat = f"{section}.{key}"
            out[flat] = parse_spec(value, where, expect_float=flat in _FLOAT_TRAIN_KEYS,
                                    allow_list=True)
        if factory is not None:
            given = [k for k in raw if k != "name"
                     and not (section == "optimizer" and k in ("lr", "weight_decay"))]
            try:
                check_keywords(factory, given, what=f"{section} {raw['name']!r}",
                               reserved=("num_classes", "input_shape", "data_dir", "seed",
                                         "val_fraction", "params", "self"))
            except ValueError as exc:
                raise SpaceError(f"{label}: {section}: {one_line(exc)}") from None
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
            raise SpaceError(f"{where}: {one_line(exc)}") from None
    try:
        return registry(kind).get(_given(kind, name))
    except (RegistryError, ValueError) as exc:
        raise SpaceError(f"{where}: {one_line(exc)}") from None


def _check_method(method: Any, where: str) -> str:
    from raysearch.losses import LOSS_REGISTRY

    if not isinstance(method, str) or not method:
        raise SpaceError(f"{where}: `method` must be a loss name or an import string "
                         f"package.module:attr, got {method!r}")
    try:
        LOSS_REGISTRY.get(_given("losses", method))
    except RegistryError as exc:
        text = one_line(exc)
        if not is_import_string(method):
            text = text.replace("Unknown loss", "unknown method", 1)
        raise SpaceError(f"{where}: {text}") from None
    return method


def _parse_params(method: str, raw: Any, label: str) -> dict[str, Spec]:
    from raysearch.losses import build_loss, loss_parameters

    loss_label, method = method, _given("losses", method)
    accepted = dict(loss_parameters(method))
    params: dict[str, Spec] = {}
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
        spec = parse_spec(
            value, where, expect_float=isinstance(default, float) and not isinstance(default, bool)
        )
        for candidate in spec.candidates():
            try:
                build_loss(method, **{key: candidate})
            except (ValueError, TypeError) as exc:
                raise SpaceError(f"{where}: {one_line(exc)}") from None
        params[key] = spec
    # Parameters can constrain each other (e.g. an ordering); try the all-low and all-high ends.
    if any(spec.sampled for spec in params.values()):
        for which in ("low", "high"):
            combo = {key: spec.end(which) for key, spec in params.items()}
            try:
                build_loss(method, **combo)
            except (ValueError, TypeError) as exc:
                shown = ", ".join(f"{k}={v!r}" for k, v in combo.items())
                raise SpaceError(f"{label}: params: {one_line(exc)} (with {shown})") from None
    return params


#: Objects given through the Python API while a space is parsed (see :func:`space_from_dict`).
_COMPONENTS: contextvars.ContextVar[Mapping[str, Mapping[str, Any]] | None] = \
    contextvars.ContextVar("raysearch_space_components", default=None)


def _given(kind: str, name: Any) -> Any:
    """The API's object for `name` when one was given, else `name`."""
    return ((_COMPONENTS.get() or {}).get(kind) or {}).get(name, name)


def parse_single(doc: dict, label: str) -> tuple[str, str, dict[str, Spec], dict[str, Spec]]:
    """(method, description, params, train) of a checked single-method document."""
    if "method" not in doc:
        raise SpaceError(f"{label}: expected a single-method file with `method:`")
    method = _check_method(doc["method"], f"{label}: method")
    params = _parse_params(method, doc.get("params"), label)
    train = _merge_sections(_parse_train(doc.get("train"), label), doc, label)
    return method, doc.get("description") or "", params, train


def _merge_sections(train: dict[str, Spec], doc: Mapping[str, Any],
                    label: str) -> dict[str, Spec]:
    """`train` plus the ``model:``/``data:``/``optimizer:`` sections (a key set once only)."""
    sections = _parse_sections(doc, label)
    paths = {flat_key_path(key): key for key in train}
    for key in sections:
        twin = paths.get(flat_key_path(key))
        if twin is not None:
            raise SpaceError(f"{label}: {key} is set twice (in train: as {twin!r} and in its "
                             "section): keep one")
    return {**train, **sections}


def training_specs(doc: Mapping[str, Any], label: str, *,
                   val_fraction: Any = None) -> dict[str, Spec]:
    """A document's ``train:``, ``model:``, ``data:`` and ``optimizer:`` as flat trial specs.

    The same parsing and checks as a space file's (a recipe file uses it too); a
    `val_fraction` is added as the fixed key ``val_fraction``.

    Raises:
        SpaceError: naming `label` and the key path.
    """
    train = _merge_sections(_parse_train(doc.get("train"), label), doc, label)
    if val_fraction is not None:
        spec = parse_spec(val_fraction, f"{label}: val_fraction", expect_float=True)
        if spec.sampled or not isinstance(spec.value, (int, float)) or isinstance(
                spec.value, bool) or not 0 < spec.value < 1:
            raise SpaceError(f"{label}: val_fraction: must be a fixed number in (0, 1), "
                             f"got {val_fraction!r}")
        train["val_fraction"] = spec
    return train


def _branch_path(folder: Path, method: str) -> tuple[Path, str] | None:
    sibling = folder / f"{method}.yaml"
    if sibling.is_file():
        return sibling, sibling.name
    bundled = bundled_spaces_dir() / f"{method}.yaml"
    if bundled.is_file():
        return bundled, bundled.name
    return None


def space_from_document(doc: dict, path: Path, label: str) -> tuple[SearchSpace, list[Path]]:
    """Parse and validate a checked document; returns the space and the files it used."""
    name = path.stem
    description = doc.get("description") or ""
    if "method" in doc:
        method, _, params, train = parse_single(doc, label)
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
    branches: dict[str, Mapping[str, Spec]] = {}
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
            branch_doc = check_top_level(read_yaml(branch_path, branch_label), branch_label)
            declared, branch_description, params, _ = parse_single(branch_doc, branch_label)
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


@contextlib.contextmanager
def given_components(components: Mapping[str, Mapping[str, Any]] | None) -> Iterator[None]:
    """While parsing, a ``method`` or factory name equal to a label of `components` is that object.

    `components` are the Python API's objects by kind and label (``{"losses": {label: cls}}``).
    """
    token = _COMPONENTS.set(components or {})
    try:
        yield
    finally:
        _COMPONENTS.reset(token)
