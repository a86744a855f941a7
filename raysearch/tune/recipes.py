"""Training recipes: the training protocol of one paper on one benchmark.

A search space says which *loss* hyperparameters a sweep searches; a recipe says how each trial
*trains*: the model, epochs, batch size, optimizer and its arguments, learning-rate schedule,
data (long tail, validation share) and augmentation, each with the paper, section and quote it
comes from (the comments of the file). The five source papers fix this protocol per benchmark
and search only the calibration hyperparameters; their numbers can only be compared with runs of
the same protocol.

A recipe is a YAML file (the bundled ones are ``recipes/<paper>-<benchmark>.yaml``)::

    description: MbLS on CIFAR-10 (ResNet-50, 350 epochs, SGD 0.1, /10 at 150 and 250)
    source: Liu et al., CVPR 2022 (MbLS), App. B "CIFAR-10" and Sec. 5 (Table 1)
    methods: [mbls]              # the paper's own methods: its default recipe for `datasets`
    baselines: [ce, ls, focal]   # the methods it compares with (default when no own recipe)
    datasets: [cifar10]          # the dataset names it is chosen for by default
    augmentation: random crop (padding 4) + horizontal flip   # what the loader does (text)
    train: {model: resnet50, epochs: 350, batch_size: 128, lr: 0.1, ...}  # a space's keys
    model: {...}; data: {name: cifar10, imbalance_ratio: 10}; optimizer: {betas: [0.9, 0.999]}
    val_fraction: 0.1

How a sweep combines a space with a recipe (:func:`apply_recipe`), weakest first:

1. :class:`~raysearch.config.RunConfig`'s defaults;
2. the recipe;
3. the space's own training values (``train:``, ``model:``, ``data:``, ``optimizer:``):
   every key it writes, a fixed value or a range, wins over the recipe (the bundled spaces
   write none: they hold the loss parameters they search);
4. the command line (``--epochs``, ``--model``, ``--val-fraction``, ``--dataset``, ...).

Without ``--recipe`` the sweep takes the recipe whose ``methods`` name the space's method and
whose ``datasets`` name the sweep's dataset, else one whose ``baselines`` do, else one that
names the dataset and no method at all (``digits``: the embedded default's protocol for every
method) (:func:`default_recipe`); a dataset no recipe names (your own) gets none, and
``--recipe none`` turns the choice off. Plain Python and YAML: no Ray, no MLflow.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from raysearch.config.flat import flat_key_path
from raysearch.registry import did_you_mean
from raysearch.tune.spaces import SpaceError, Spec, read_yaml, spec_doc, training_specs
from raysearch.tune.spaces.specs import bundled_folder

if TYPE_CHECKING:
    from raysearch.tune.settings import SweepSettings
    from raysearch.tune.spaces import SearchSpace

__all__ = [
    "NO_RECIPE",
    "Recipe",
    "RecipeError",
    "apply_recipe",
    "available_recipes",
    "choose_recipe",
    "default_recipe",
    "load_recipe",
    "sweep_dataset",
    "with_recipe",
]

#: ``--recipe none``: no recipe, not even the default one.
NO_RECIPE = "none"
_KEYS = ("description", "source", "methods", "baselines", "datasets", "augmentation", "train",
         "model", "data", "optimizer", "val_fraction")


class RecipeError(SpaceError):
    """A recipe that does not exist or whose file is malformed (a ValueError)."""


@dataclass(frozen=True)
class Recipe:
    """One training protocol, loaded by :func:`load_recipe`.

    Attributes:
        name: the file name without ``.yaml`` (``mbls-cifar10``).
        path: the YAML file.
        description: one line.
        source: the paper and section(s) the values come from.
        methods: the paper's own methods (the recipe is their default on `datasets`).
        baselines: the methods the paper compares with under this protocol.
        datasets: dataset names the recipe is chosen for by default (may be empty: then only
            ``--recipe NAME`` selects it).
        augmentation: what the dataset's loader does to training images (text).
        train: flat trial-config keys (``lr``, ``model``, ``optimizer.betas``,
            ``val_fraction``, ...) to their specs: fixed values, or ranges the recipe
            searches (soft calibration's weight decay).
    """

    name: str
    path: Path
    description: str
    source: str
    methods: tuple[str, ...]
    baselines: tuple[str, ...]
    datasets: tuple[str, ...]
    augmentation: str
    train: Mapping[str, Spec]

    def values(self) -> dict[str, Any]:
        """The training values: a fixed value as itself, a range as its spec mapping."""
        return {k: (s.value if not s.sampled else spec_doc(s)) for k, s in self.train.items()}

    def text(self) -> str:
        """The recipe file as written (its comments hold the papers' quotes)."""
        return self.path.read_text(encoding="utf-8")


def _bundled_dir() -> Path:
    return bundled_folder("raysearch.recipe_files", "recipes")


def available_recipes() -> list[str]:
    """Sorted names of the bundled recipes (file names without ``.yaml``)."""
    folder = _bundled_dir()
    if not folder.is_dir():
        return []
    return sorted(p.stem for p in folder.glob("*.yaml") if p.is_file())


def _names(raw: Any, where: str) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(v, str) and v for v in raw):
        raise RecipeError(f"{where}: must be a list of names, got {raw!r}")
    return tuple(raw)


def _text(doc: Mapping[str, Any], key: str, label: str, *, required: bool) -> str:
    value = doc.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or not value.strip():
        raise RecipeError(f"{label}: {key}: must be a non-empty string, got {value!r}")
    return value.strip()


def load_recipe(name_or_path: str | Path) -> Recipe:
    """Load and check a recipe: a bundled name (``mbls-cifar10``) or a YAML file's path.

    Returns:
        The :class:`Recipe`.

    Raises:
        RecipeError: if the name is unknown (naming the closest ones), the file is malformed,
            a key is unknown, ``source`` is missing or a value is rejected as in a space file.
    """
    text = str(name_or_path)
    if isinstance(name_or_path, Path) or text.endswith((".yaml", ".yml")) or "/" in text:
        path = Path(text).expanduser()
        if not path.is_file():
            raise RecipeError(f"recipe file not found: {path}")
        label = text
    else:
        names = available_recipes()
        if text not in names:
            close = difflib.get_close_matches(text, names, n=3, cutoff=0.5)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise RecipeError(f"unknown recipe {text!r}{hint}; `raysearch recipes list` shows "
                              f"them, or give the path of a YAML file")
        path = _bundled_dir() / f"{text}.yaml"
        label = path.name
    doc = read_yaml(path, label)
    if not isinstance(doc, dict):
        raise RecipeError(f"{label}: expected a mapping with `source` and `train`, got "
                          f"{type(doc).__name__}")
    unknown = sorted(str(k) for k in doc if k not in _KEYS)
    if unknown:
        raise RecipeError(f"{label}: unknown key(s) {', '.join(unknown)}"
                          f"{did_you_mean(unknown, _KEYS)}; allowed: "
                          f"{', '.join(_KEYS)}")
    try:
        train = training_specs(doc, label, val_fraction=doc.get("val_fraction"))
    except SpaceError as exc:
        raise RecipeError(str(exc)) from None
    if not train:
        raise RecipeError(f"{label}: sets no training value (train:, model:, data:, "
                          f"optimizer: or val_fraction:)")
    return Recipe(
        name=path.stem, path=path, description=_text(doc, "description", label, required=False),
        source=_text(doc, "source", label, required=True),
        methods=_names(doc.get("methods"), f"{label}: methods"),
        baselines=_names(doc.get("baselines"), f"{label}: baselines"),
        datasets=_names(doc.get("datasets"), f"{label}: datasets"),
        augmentation=_text(doc, "augmentation", label, required=False), train=train)


def default_recipe(methods: Sequence[str], dataset: str | None) -> tuple[Recipe | None, str]:
    """The bundled recipe a sweep of `methods` on `dataset` takes when none is named.

    The first (by name) whose ``datasets`` holds `dataset` and whose ``methods`` holds a method
    of `methods` (in their order); else the first whose ``baselines`` holds one.

    Returns:
        (recipe or None, a short reason for the progress line and ``--dry-run``).
    """
    if not isinstance(dataset, str):
        return None, "no default recipe for a dataset given as an object"
    # only the recipes that name the dataset are loaded: loading checks the dataset factories,
    # which imports torchvision (~1.5 s of a sweep on digits, which no recipe names)
    matching = [load_recipe(name) for name in available_recipes()
                if dataset in _declared_datasets(name)]
    for role, attr in (("own method", "methods"), ("baseline", "baselines")):
        for method in methods:
            found = [r for r in matching if method in getattr(r, attr)]
            if found:
                others = [r.name for r in found[1:]]
                also = f"; also {', '.join(others)}" if others else ""
                return found[0], (f"default for {method} on {dataset} (the paper's {role}"
                                  f"{also})")
    general = [r for r in matching if not r.methods and not r.baselines]
    if general:
        return general[0], f"default for every method on {dataset}"
    if matching:
        return None, (f"no recipe names {'/'.join(methods)} on {dataset} (recipes for "
                      f"{dataset}: {', '.join(r.name for r in matching)}; name one with "
                      f"--recipe)")
    return None, f"no recipe for dataset {dataset!r}: the space's training values"


_DECLARED: dict[Path, tuple[int, tuple[str, ...]]] = {}  # path -> (mtime_ns, its datasets)
#: PyYAML's safe loader, on libyaml's parser where PyYAML was built with it.
_FAST_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _declared_datasets(name: str) -> tuple[str, ...]:
    """The ``datasets`` a bundled recipe file lists, read without checking the recipe.

    Read with libyaml's safe loader where PyYAML has it (the bundled files are the package's
    own: no alias or duplicate key to refuse; ~10 ms for all of them instead of ~150 ms with
    the checking loader) and kept per process while the file is unchanged: every sweep asks
    it of every recipe file before the Tuner starts.
    """
    path = _bundled_dir() / f"{name}.yaml"
    stamp = path.stat().st_mtime_ns
    if path in _DECLARED and _DECLARED[path][0] == stamp:
        return _DECLARED[path][1]
    doc = yaml.load(path.read_text(encoding="utf-8"), Loader=_FAST_LOADER)  # noqa: S506
    raw = doc.get("datasets") if isinstance(doc, dict) else None
    found = tuple(str(d) for d in raw) if isinstance(raw, (list, tuple)) else \
        ((str(raw),) if isinstance(raw, str) else ())
    _DECLARED[path] = (stamp, found)
    return found


def apply_recipe(space: SearchSpace, recipe: Recipe) -> SearchSpace:
    """`space` trained with `recipe` (the order of precedence in the module docstring).

    A value the space writes wins over the recipe's value for the same setting, whatever name
    either gives it (``lr`` and ``optimizer.lr`` are one setting).

    Args:
        space: a loaded search space.
        recipe: the recipe.

    Returns:
        A new space whose training specs are the merge and whose ``recipe`` is the recipe's
        name (kept in the sweep's record, so ``--resume`` trains the same way).
    """
    own = dict(space.train_specs)
    written = {flat_key_path(k) for k in own}
    train = {**{k: v for k, v in recipe.train.items() if flat_key_path(k) not in written},
             **own}
    return space.with_train(train, recipe.name)


def choose_recipe(space: SearchSpace, recipe: str | Path | None,
                  dataset: str | None) -> tuple[SearchSpace, Recipe | None, str]:
    """Apply the named recipe, the default one (`recipe` None) or none (``"none"``).

    Args:
        space: the loaded search space.
        recipe: a recipe name or file, None for the default, or :data:`NO_RECIPE`.
        dataset: the sweep's dataset name (``--dataset``, else the space's, else digits).

    Returns:
        (the space to sweep, the recipe or None, why: one line for the progress output).

    Raises:
        RecipeError: for an unknown or malformed recipe.
    """
    if space.recipe is not None:  # already applied (a resumed sweep's stored space)
        return space, None, f"recipe {space.recipe} (recorded with the sweep)"
    if recipe == NO_RECIPE:
        return space, None, "no recipe (--recipe none): the space's training values"
    if recipe is None:
        found, why = default_recipe(space.methods, dataset)
        if found is None:
            return space, None, why
        return apply_recipe(space, found), found, f"recipe {found.name}: {why}"
    loaded = load_recipe(recipe)
    return apply_recipe(space, loaded), loaded, f"recipe {loaded.name} (--recipe)"


def sweep_dataset(space: SearchSpace, settings: SweepSettings) -> str:
    """The dataset name the sweep's trials use (``--dataset``, else the space's, else digits)."""
    cfg = space.resolve(space.end_config("low"), settings.config_overrides())
    return str(cfg.data.name)


def with_recipe(space: SearchSpace, settings: SweepSettings) -> tuple[SearchSpace, Any, str]:
    """`space` with the sweep's recipe (``settings.recipe``, else the default one).

    Returns:
        (space, recipe or None, one line saying which recipe and why); the space's
        ``recipe`` names the recipe applied.

    Raises:
        ValueError: an unknown or malformed recipe, or a recipe value the space's keys reject.
    """
    dataset = sweep_dataset(space, settings)
    # the recipe may set the dataset (acls-imagenet: imagefolder) when the command line did not
    return choose_recipe(space, settings.recipe, dataset)
