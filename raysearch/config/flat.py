"""The flat layout of a run's settings, read into sections by one function at the edge.

Three inputs name a run's settings by flat keys instead of sections:

- a search space's or a recipe's ``train:`` section and the searcher's suggestions
  (``lr``, ``epochs``, ``model.hidden``, ``optimizer.weight_decay``, ``acls.margin`` -> the
  space hands the loss's own parameters over separately);
- exports and configs written before runs had sections (``method``, ``loss_params``,
  ``dataset``, ``data_dir``, ``lr``, ``momentum``, ``crop_size``, ...);
- the keyword overrides of :func:`raysearch.train` (``epochs=3``, ``**{"model.hidden": 64}``).

:func:`sections_from_flat` turns any of them into the sections of a
:class:`~raysearch.config.RunConfig`; :data:`FLAT_KEYS` says where each flat key goes, and
dotted keys ``model.<kw>``, ``data.<kw>``, ``optimizer.<kw>``, ``loss.<kw>`` and
``schedule.<field>`` go into their section (a factory's keyword arguments into its
``params``; ``optimizer.lr`` and ``optimizer.weight_decay`` into the section's own fields).
Nothing else in the package reads flat keys: a :class:`~raysearch.config.RunConfig` takes
sections only.

A leaf beside :mod:`raysearch.config.base`: imports pydantic and the standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from raysearch.config.base import SECTIONS

__all__ = ["FLAT_KEYS", "RUN_FIELDS", "TRAIN_KEYS", "as_sections", "deep_merge",
           "flat_key_path", "is_flat", "sections_from_flat"]

#: Top-level fields of a RunConfig besides its sections (the same name in both layouts).
RUN_FIELDS = ("epochs", "batch_size", "seed", "ece_bins", "mixup_alpha", "cutmix_alpha",
              "ricap_beta", "interleaved", "interleave_fraction", "compile")

#: Where each flat key goes, as (section, field) or (section, "params", keyword).
FLAT_KEYS: dict[str, tuple[str, ...]] = {
    "method": ("loss", "name"),
    "loss_params": ("loss", "params"),
    "dataset": ("data", "name"),
    "data_dir": ("data", "dir"),
    "val_fraction": ("data", "val_fraction"),
    "data_seed": ("data", "seed"),
    "test_fraction": ("data", "params", "test_fraction"),
    "imbalance_ratio": ("data", "params", "imbalance_ratio"),
    "crop_size": ("data", "params", "crop_size"),
    "model": ("model", "name"),
    "pretrained": ("model", "pretrained"),
    "freeze_backbone_epochs": ("model", "freeze_backbone_epochs"),
    "head_lr": ("model", "head_lr"),
    "pretrained_backbone": ("model", "params", "pretrained_backbone"),
    "embeddings": ("model", "params", "embeddings_path"),
    "optimizer": ("optimizer", "name"),
    "lr": ("optimizer", "lr"),
    "weight_decay": ("optimizer", "weight_decay"),
    "momentum": ("optimizer", "params", "momentum"),
    "nesterov": ("optimizer", "params", "nesterov"),
    "schedule": ("schedule", "name"),
    "milestones": ("schedule", "milestones"),
    "lr_decay": ("schedule", "lr_decay"),
    "warmup_epochs": ("schedule", "warmup_epochs"),
}

#: The flat keys a space's or a recipe's ``train:`` section may sample or fix (besides the
#: loss parameters and its ``model:``, ``data:`` and ``optimizer:`` sections).
TRAIN_KEYS = ("model", "epochs", "batch_size", "lr", "momentum", "weight_decay", "interleaved",
              "interleave_fraction", "schedule", "milestones", "lr_decay", "warmup_epochs",
              "nesterov", "mixup_alpha", "cutmix_alpha", "ricap_beta", "crop_size", "pretrained",
              "freeze_backbone_epochs", "head_lr", "embeddings", "optimizer", "compile")

# Values that configs written before sections carried for every run: dropped when they would
# be a keyword that the run's dataset or model does not take.
_ALWAYS_WRITTEN = {"crop_size": 512, "nesterov": False, "embeddings": None,
                   "pretrained_backbone": None, "test_fraction": None, "imbalance_ratio": None}


def is_flat(data: Mapping[str, Any]) -> bool:
    """True when `data` names a setting by a flat key (not only by sections and run fields)."""
    return any(key not in (*SECTIONS, *RUN_FIELDS)
               or (key in SECTIONS and not isinstance(value, (Mapping, BaseModel)))
               for key, value in data.items())


def as_sections(data: Mapping[str, Any]) -> dict[str, Any]:
    """A stored run config in either layout, as sections (plain dicts, not validated).

    Raises:
        ValueError: for a flat key :func:`sections_from_flat` does not know.
    """
    return sections_from_flat(data) if is_flat(data) else dict(data)


def deep_merge(base: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """`base` with `update` merged in, mapping by mapping (a value of `update` wins)."""
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _set(out: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node = out
    for part in path[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ValueError(f"`{'.'.join(path)}` clashes with a value of {part!r}")
    node[path[-1]] = value


def _dotted_path(key: str) -> tuple[str, ...] | None:
    """Where a dotted key ``<section>.<kw>`` goes (None: not a dotted section key)."""
    section, _, kw = key.partition(".")
    if not kw or section not in SECTIONS:
        return None
    if section == "schedule" or kw == "name" or (
            section == "optimizer" and kw in ("lr", "weight_decay")):
        return (section, kw)
    return (section, "params", kw)


def flat_key_path(key: str) -> tuple[str, ...]:
    """Where the flat key `key` goes in the sections (``lr``, ``optimizer.lr``: optimizer, lr).

    Two flat keys that set the same value have the same path (a space may not write both).

    Raises:
        ValueError: for a key that is neither a run field, a flat key nor a dotted section key.
    """
    if key in RUN_FIELDS:
        return (key,)
    if key == "loss_params":
        return ("loss", "params")
    path = FLAT_KEYS.get(key) or _dotted_path(key)
    if path is None:
        raise ValueError(f"unknown run-config key {key!r}")
    return path


def sections_from_flat(flat: Mapping[str, Any]) -> dict[str, Any]:
    """Flat keys (and sections given as mappings) -> the sections of a RunConfig.

    Sections given as mappings (``{"model": {"name": ..., "params": ...}}``) are taken first;
    flat keys then set single fields, in their order. Values that configs written before
    sections carried for every run and that would now be a keyword nobody takes
    (``crop_size: 512``, ``nesterov: false``, a null ``embeddings``, SGD's ``momentum`` on
    another optimizer) are dropped, as is a null keyword argument (an option that is off).

    Args:
        flat: flat keys of :data:`FLAT_KEYS`, :data:`RUN_FIELDS`, dotted section keys, and
            sections as mappings.

    Returns:
        Plain dicts by section and run field, for :class:`~raysearch.config.RunConfig`.

    Raises:
        ValueError: for a key that is neither a run field, a flat key nor a dotted section
            key, or ``loss_params`` that is not a mapping.
    """
    out: dict[str, Any] = {}
    for section in SECTIONS:
        value = flat.get(section)
        if isinstance(value, BaseModel):
            value = value.model_dump()
        if isinstance(value, Mapping):
            out[section] = {k: (dict(v) if isinstance(v, Mapping) else v)
                            for k, v in value.items()}
    optimizer = flat.get("optimizer")
    optimizer_name = (optimizer if isinstance(optimizer, str)
                      else (out.get("optimizer") or {}).get("name", "sgd"))
    for key, value in flat.items():
        if key in SECTIONS and isinstance(value, (Mapping, BaseModel)):
            continue
        if key in RUN_FIELDS:
            out[key] = value
        elif key in FLAT_KEYS:
            _place_flat(out, key, value, optimizer_name)
        elif (path := _dotted_path(key)) is not None:
            _set(out, path, value)
        else:
            known = sorted({*RUN_FIELDS, *SECTIONS, *FLAT_KEYS})
            raise ValueError(f"unknown run-config key(s) {key}; known: {', '.join(known)} "
                             "(and model.<kw>, data.<kw>, optimizer.<kw>)")
    return out


def _place_flat(out: dict[str, Any], key: str, value: Any, optimizer_name: Any) -> None:
    """One key of :data:`FLAT_KEYS` into `out` (see :func:`sections_from_flat`)."""
    if key in _ALWAYS_WRITTEN and value == _ALWAYS_WRITTEN[key]:
        return
    if key == "momentum" and str(optimizer_name).lower() != "sgd":
        return  # configs written before sections carried SGD's momentum for Adam runs too
    if key == "loss_params":
        if value is None:
            return
        if not isinstance(value, Mapping):
            raise ValueError(f"`loss_params` must be a mapping, got {value!r}")
        out.setdefault("loss", {}).setdefault("params", {}).update(value)
        return
    if value is None and len(FLAT_KEYS[key]) == 3:
        return  # a keyword argument that is off: pass nothing
    _set(out, FLAT_KEYS[key], value)
