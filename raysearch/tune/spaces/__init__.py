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

Modules: this one locates, loads and caches the files (:func:`load_space`,
:func:`available_spaces`, :func:`space_kind`, :func:`space_from_dict`);
:mod:`raysearch.tune.spaces.document` checks a document key by key (sections, loss parameters,
training keys; :func:`training_specs`); :mod:`raysearch.tune.spaces.specs` holds one parameter
spec, the YAML reader and :class:`SpaceError`; :mod:`raysearch.tune.spaces.search_space` the
:class:`SearchSpace` and :class:`TrialConfigs` that turn a suggestion into a run config.

This module imports neither Ray nor MLflow; Optuna only inside :meth:`SearchSpace.define_by_run`
(through the trial it is given).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from raysearch.tune.spaces.document import (
    SPACE_KINDS,
    check_top_level,
    given_components,
    space_from_document,
    training_specs,
)
from raysearch.tune.spaces.search_space import (
    CONFIG_ID_KEY,
    SEED_INDEX_KEY,
    SearchSpace,
    TrialConfigs,
)
from raysearch.tune.spaces.specs import (
    SpaceError,
    Spec,
    bundled_spaces_dir,
    format_value,
    one_line,
    parse_spec,
    read_yaml,
    spec_doc,
)

__all__ = [
    "CONFIG_ID_KEY",
    "SEED_INDEX_KEY",
    "SPACE_KINDS",
    "SearchSpace",
    "SpaceError",
    "Spec",
    "TrialConfigs",
    "available_spaces",
    "bundled_spaces_dir",
    "format_value",
    "locate_space",
    "one_line",
    "parse_spec",
    "read_yaml",
    "spec_doc",
    "load_space",
    "space_kind",
    "training_specs",
    "validate_space",
]

#: Sections holding a factory's keyword arguments, and the trial-config key of their ``name``.


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
    folder = bundled_spaces_dir()
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
    path, label = locate_space(name_or_path)
    doc = read_yaml(path, label)
    kind = doc.get("kind", "train") if isinstance(doc, dict) else "train"
    if kind not in SPACE_KINDS:
        raise SpaceError(f"{label}: kind: must be 'train' or 'posthoc', got {kind!r}")
    return kind


def locate_space(name_or_path: str | Path) -> tuple[Path, str]:
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
            path = bundled_spaces_dir() / f"{name_or_path}.yaml"
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


def _stamp(path: Path) -> tuple[str, int, int]:
    stat = path.stat()
    return str(path.resolve()), stat.st_mtime_ns, stat.st_size


_CACHE: dict[str, tuple[tuple[tuple[str, int, int], ...], SearchSpace]] = {}
def _load(path: Path, label: str) -> tuple[SearchSpace, list[Path]]:
    """Parse and validate one file; returns the space and the files it was built from."""
    doc = check_top_level(read_yaml(path, label), label)
    return space_from_document(doc, path, label)


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
    path, label = locate_space(name_or_path)
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
    with given_components(components):
        checked = check_top_level(dict(doc), name)
        return space_from_document(checked, Path(f"{name}.yaml"), name)[0]


def validate_space(name_or_path: str | Path) -> SearchSpace:
    """Validate a search space and return it (same as :func:`load_space`; for the CLI).

    Raises:
        SpaceError: as :func:`load_space`.
        FileNotFoundError: if a given path does not exist.
    """
    return load_space(name_or_path)
