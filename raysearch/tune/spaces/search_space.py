"""The validated search space: Optuna define-by-run, trial configs turned into run configs.

:class:`SearchSpace` holds the parsed specs of a space (see :mod:`raysearch.tune.spaces` for the
file format and for :func:`~raysearch.tune.spaces.load_space`, which builds it) and answers what the
sweep asks of it: the define-by-run function Ray's ``OptunaSearch`` calls, a flat trial config
turned into a :class:`~raysearch.config.RunConfig`, the parameters MLflow logs, a readable table.
:func:`_rebuild_space` is what a pickled space (Ray pickles the searcher and the trainable's
parameters) is rebuilt with. :data:`CONFIG_ID_KEY` and :data:`SEED_INDEX_KEY` are the trial
keys of a repeated sweep.

This module imports :mod:`raysearch.config` and the leaf :mod:`raysearch.tune.spaces.specs` only,
never :mod:`raysearch.tune.spaces` (which re-exports every name defined here); neither Ray nor
MLflow, and Optuna only through the trial :meth:`SearchSpace.define_by_run` is given.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from raysearch.config import RunConfig, sections_from_flat
from raysearch.config.flat import deep_merge
from raysearch.training.records import CONFIG_ID_KEY, SEED_INDEX_KEY
from raysearch.tune.spaces.specs import SpaceError, Spec, spec_doc

if TYPE_CHECKING:
    import optuna

__all__ = ["CONFIG_ID_KEY", "SEED_INDEX_KEY", "SearchSpace", "TrialConfigs"]

# CONFIG_ID_KEY, SEED_INDEX_KEY: the trial-config keys of a repeated sweep (``--repeats``), the
# configuration a trial is a seed of and which seed (raysearch.training.records; imported above)


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
    _branches: Mapping[str, Mapping[str, Spec]] = field(repr=False)
    _descriptions: Mapping[str, str] = field(repr=False)
    _train: Mapping[str, Spec] = field(repr=False)
    recipe: str | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        # Ray pickles the space (searcher state, trainable parameters); mappingproxy cannot be
        # pickled, so rebuild it from plain dicts.
        return (_rebuild_space, (self.name, self.path, self.description, self.conditional,
                                 {m: dict(b) for m, b in self._branches.items()},
                                 dict(self._descriptions), dict(self._train), self.recipe))

    def with_train(self, train: Mapping[str, Spec], recipe: str | None) -> SearchSpace:
        """The same space with other training specs (a recipe's merged in).

        See :func:`raysearch.tune.recipes.apply_recipe`.
        """
        return dataclasses.replace(self, _train=MappingProxyType(dict(train)), recipe=recipe)

    @property
    def train_specs(self) -> Mapping[str, Spec]:
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
                    out[self._key(branch, key)] = spec_doc(spec)
        out.update({k: spec_doc(s) for k, s in self._train.items() if s.sampled})
        return out

    def to_dict(self) -> dict[str, Any]:
        """The space as plain JSON-ready data (every branch's specs), for :meth:`from_dict`.

        A sweep stores it with its record, so ``raysearch sweep --resume`` samples from the
        same space even if its YAML files changed or are not on the resuming machine.
        """
        def specs(mapping: Mapping[str, Spec]) -> dict[str, dict[str, Any]]:
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
        def specs(mapping: Mapping[str, Any]) -> dict[str, Spec]:
            return {k: Spec(**{**v, "choices": tuple(v.get("choices", ()))})
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

        def take(key: str, spec: Spec) -> Any:
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

    def resolve(self, config: Mapping[str, Any],
                overrides: Mapping[str, Any] | None = None) -> RunConfig:
        """The run config of one trial: the searcher's suggestion placed into its sections.

        The one place a suggestion changes form: the loss and its parameters go into the
        ``loss`` section, every training value (sampled or fixed, the recipe's included) into
        the section its name says (``lr`` -> ``optimizer.lr``, ``model.hidden`` ->
        ``model.params.hidden``; :func:`raysearch.config.flat.sections_from_flat`), and
        `overrides` (the sweep's settings, already in sections) replace what they set.

        Args:
            config: sampled and fixed values under their Optuna-style names (``method``,
                ``margin`` or ``acls.margin``, ``lr``, ``model.hidden``, ...), as Ray hands them
                to a trainable. Fixed values missing from it are taken from the space; other
                keys (``dataset``, ``seed``, ...) are read as flat run-config keys.
            overrides: partial sections that replace everything else
                (:meth:`raysearch.tune.settings.SweepSettings.config_overrides`).

        A repeated sweep's trial config also holds :data:`CONFIG_ID_KEY` (ignored here) and
        :data:`SEED_INDEX_KEY` k: for k > 0 the run trains with ``seed + k`` and keeps the data
        split of ``seed`` (``data.seed``), so the seeds of a configuration differ only in their
        initialisation and batch order.

        Returns:
            The validated run config; the loss's parameters under plain names (``margin``).

        Raises:
            SpaceError: if `method` is missing or not in this space, or a sampled parameter is
                missing.
            ValueError: if RunConfig rejects a key or a value.
        """
        values = dict(config)
        values.pop(CONFIG_ID_KEY, None)
        index = values.pop(SEED_INDEX_KEY, 0)
        method, loss_params, train, rest = self._split(values)
        sections = deep_merge(sections_from_flat({**train, **rest}),
                              {"loss": {"name": method, "params": loss_params}})
        sections = deep_merge(sections, overrides or {})
        if index:  # seed k of a repeated configuration: same data split, seed + k
            if isinstance(index, bool) or not isinstance(index, int) or index < 0:
                raise SpaceError(f"{self.name}: `{SEED_INDEX_KEY}` must be an int >= 0, "
                                 f"got {index!r}")
            base = int(sections.get("seed", 0))
            sections.setdefault("data", {}).setdefault("seed", base)
            sections["seed"] = base + index
        return RunConfig(**sections)

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


@dataclass(frozen=True)
class TrialConfigs:
    """A sweep's space and the sections its settings fix: the run config of each suggestion.

    What a sweep's trials (and its tracking, which names their runs) are given instead of the
    whole sweep: small, picklable, plain data.

    Attributes:
        space: the search space (with its recipe applied).
        overrides: partial sections every trial takes from the sweep's settings
            (:meth:`raysearch.tune.settings.SweepSettings.config_overrides`).
    """

    space: SearchSpace
    overrides: Mapping[str, Any] = field(default_factory=dict)

    def resolve(self, suggestion: Mapping[str, Any]) -> RunConfig:
        """The trial's run config (:meth:`SearchSpace.resolve` with :attr:`overrides`).

        Raises:
            ValueError: (a SpaceError included) if the suggestion does not fit the space or
                RunConfig rejects a value.
        """
        return self.space.resolve(suggestion, self.overrides)

    @property
    def epochs(self) -> int | None:
        """The epochs every trial trains when the settings fix them (``--epochs``), else None."""
        value = self.overrides.get("epochs")
        return int(value) if value is not None else None


def _rebuild_space(name: str, path: Path, description: str, conditional: bool,
                   branches: dict[str, dict[str, Any]], descriptions: dict[str, str],
                   train: dict[str, Any], recipe: str | None = None) -> SearchSpace:
    return SearchSpace(
        name=name, path=path, description=description, conditional=conditional,
        _branches=MappingProxyType({m: MappingProxyType(b) for m, b in branches.items()}),
        _descriptions=MappingProxyType(descriptions), _train=MappingProxyType(train),
        recipe=recipe)
