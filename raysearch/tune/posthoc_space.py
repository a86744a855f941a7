"""A post-hoc search space: which calibrators, objectives and parameters a sweep samples.

A post-hoc search space (``search_spaces/posthoc.yaml``, ``kind: posthoc``) samples a
calibrator, its objective, class-wise loss scaling on/off and the objective's parameters::

    kind: posthoc
    calibrator: {choices: [ts, ets, cts, pts, ts_sbece]}
    loss: {choices: [nll, mse, ls, focal]}      # not sampled for ts_sbece (always sbece);
                                                # absent: each calibrator's default objective
    classwise_scaling: {choices: [false, true]}
    epsilon: {low: 0.01, high: 0.2, log: true}  # only sampled when loss == ls
    gamma: {low: 1.0, high: 5.0}                 # only sampled when loss == focal

Specs follow :mod:`raysearch.tune.spaces` (a scalar is fixed, ``{low, high, log}`` a range,
``{choices}`` a categorical). Without ``loss`` every calibrator fits its default objective
(:func:`raysearch.calibration.default_objective`: its authors'), and class-wise scaling always
runs as the released code does (``variant="official"``, the wrapper's default).
:func:`load_posthoc_space` reads and checks a space; :class:`PosthocSpace` samples it
conditionally (Optuna define-by-run) and turns a trial's config into ``fit_calibrator``
keywords. :mod:`raysearch.tune.posthoc_sweep` runs the sweep.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raysearch.registry import did_you_mean
from raysearch.tune.spaces import (
    SpaceError,
    Spec,
    format_value,
    locate_space,
    one_line,
    parse_spec,
    read_yaml,
)

if TYPE_CHECKING:
    import optuna

__all__ = ["FIXED_OBJECTIVE", "PARAM_LOSS", "PosthocSpace", "load_posthoc_space"]

#: The top-level keys a post-hoc space file may hold.
_KEYS = ("kind", "description", "calibrator", "loss", "classwise_scaling", "epsilon", "gamma")
#: Objective parameter -> the only loss that takes it.
PARAM_LOSS = {"epsilon": "ls", "gamma": "focal"}
#: Calibrators whose objective is part of the method: ``loss`` is never sampled for them.
FIXED_OBJECTIVE = {"ts_sbece": "sbece", "ts_hb_ece": "hbece"}


@dataclass(frozen=True, eq=False)
class PosthocSpace:
    """A validated post-hoc search space, loaded by :func:`load_posthoc_space`.

    Attributes:
        name: file name without ``.yaml``.
        path: the YAML file.
        description: the file's ``description`` (may be empty).
        specs: ``calibrator``, ``classwise_scaling`` and, when given, ``loss``, ``epsilon``
            and ``gamma`` (parsed specs of :mod:`raysearch.tune.spaces`; without ``loss`` each
            calibrator fits its default objective).
    """

    name: str
    path: Path
    description: str
    specs: dict[str, Spec]

    @classmethod
    def load(cls, name_or_path: str | Path) -> PosthocSpace:
        """Same as :func:`load_posthoc_space`."""
        return load_posthoc_space(name_or_path)

    def define_by_run(self, trial: optuna.Trial) -> dict[str, Any]:
        """Optuna define-by-run function: sample one configuration, conditionally.

        ``loss`` is not sampled for a calibrator of :data:`FIXED_OBJECTIVE` (``ts_sbece``
        fits ``sbece``, ``ts_hb_ece`` ``hbece``), nor when the space has no
        ``loss`` (the calibrator's default objective is fixed); ``epsilon`` only when the loss
        is ``ls``; ``gamma`` only when it is ``focal``.

        Returns:
            The fixed (not sampled) values of this configuration, which Tune adds to the
            trial config.
        """
        from raysearch.calibration import default_objective

        fixed: dict[str, Any] = {}

        def take(name: str) -> Any:
            spec = self.specs[name]
            if spec.sampled:
                return spec.suggest(trial, name)
            fixed[name] = spec.value
            return spec.value

        calibrator = take("calibrator")
        if calibrator in FIXED_OBJECTIVE:
            fixed["loss"] = FIXED_OBJECTIVE[calibrator]
        else:
            if "loss" in self.specs:
                loss = take("loss")
            else:
                loss = fixed["loss"] = default_objective(calibrator)
            for param, needs in PARAM_LOSS.items():
                if loss == needs and param in self.specs:
                    take(param)
        take("classwise_scaling")
        return fixed

    def fit_arguments(self, config: dict[str, Any]) -> dict[str, Any]:
        """``fit_calibrator`` keywords of a trial config: name, loss, flag, loss parameters."""
        loss = FIXED_OBJECTIVE.get(config["calibrator"], config["loss"])
        out = {
            "name": config["calibrator"],
            "loss": loss,
            "classwise_scaling": bool(config["classwise_scaling"]),
        }
        out.update(
            {
                p: config[p]
                for p, needs in PARAM_LOSS.items()
                if loss == needs and _present(config.get(p))
            }
        )
        return out

    def describe(self) -> str:
        """Readable table of the space, one row per parameter."""
        rows = [(key, *spec.row()) for key, spec in self.specs.items()]
        widths = [max(len(r[i]) for r in rows) for i in range(3)]
        lines = [
            f"{self.name}: {self.description}" if self.description else self.name,
            f"file: {self.path}",
            "kind: posthoc",
        ]
        for row in rows:
            lines.append(
                (
                    "  " + "  ".join(row[i].ljust(widths[i]) for i in range(3)) + "  " + row[3]
                ).rstrip()
            )
        return "\n".join(lines)


def _present(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def _choice_values(spec: Spec, where: str, allowed: list[Any]) -> tuple[Any, ...]:
    if spec.kind in ("float", "int"):
        raise SpaceError(f"{where}: must be a fixed value or {{choices: [...]}}, not a range")
    for value in spec.candidates():
        if value not in allowed or isinstance(value, bool) != isinstance(allowed[0], bool):
            shown = ", ".join(format_value(a) for a in allowed)
            raise SpaceError(f"{where}: unknown value {value!r}; allowed: {shown}")
    return spec.candidates()


def load_posthoc_space(name_or_path: str | Path) -> PosthocSpace:
    """Load and validate a post-hoc search space.

    Args:
        name_or_path: a bundled name (``posthoc``) or the path of a YAML file.

    Returns:
        The validated :class:`PosthocSpace`.

    Raises:
        SpaceError: one line ``<file>: <key>: <problem>`` for malformed YAML, a missing or
            wrong ``kind``, an unknown key, an unknown calibrator or loss, a non-bool
            ``classwise_scaling``, a bad range, a value the objective rejects, or ``epsilon`` /
            ``gamma`` given while ``loss`` never takes ``ls`` / ``focal``.
        FileNotFoundError: if a given path does not exist.
    """
    from raysearch.calibration import available_calibrators, default_objective
    from raysearch.calibration.objectives import OBJECTIVES as LOSSES
    from raysearch.calibration.objectives import build_objective

    path, label = locate_space(name_or_path)
    doc = read_yaml(path, label)
    if not isinstance(doc, dict):
        raise SpaceError(f"{label}: expected a mapping with `kind: posthoc` and `calibrator`")
    if doc.get("kind") != "posthoc":
        raise SpaceError(
            f"{label}: kind: expected 'posthoc', got {doc.get('kind')!r} "
            "(training spaces load with raysearch.tune.spaces.load_space)"
        )
    unknown = sorted(str(k) for k in doc if k not in _KEYS)
    if unknown:
        raise SpaceError(
            f"{label}: unknown top-level key(s) {', '.join(unknown)}"
            f"{did_you_mean(unknown, _KEYS)}; allowed: {', '.join(_KEYS)}"
        )
    if "calibrator" not in doc:
        raise SpaceError(f"{label}: calibrator: missing (e.g. {{choices: [ts, ets]}})")
    description = doc.get("description") or ""
    if not isinstance(description, str):
        raise SpaceError(f"{label}: description: must be a string, got {description!r}")

    specs: dict[str, Spec] = {}
    raw = {"classwise_scaling": False, **doc}
    for key, allowed in (
        ("calibrator", available_calibrators()),
        ("loss", list(LOSSES)),
        ("classwise_scaling", [False, True]),
    ):
        if key not in raw:  # no `loss`: each calibrator's default objective
            continue
        where = f"{label}: {key}"
        specs[key] = parse_spec(raw[key], where, expect_float=False)
        _choice_values(specs[key], where, allowed)
    calibrators = set(specs["calibrator"].candidates())
    if "loss" in specs:
        losses = set(specs["loss"].candidates())
    else:
        losses = {default_objective(name) for name in calibrators - set(FIXED_OBJECTIVE)}
    if calibrators <= set(FIXED_OBJECTIVE):
        losses = {FIXED_OBJECTIVE[name] for name in calibrators}
    for key, needs in PARAM_LOSS.items():
        if key not in doc:
            continue
        where = f"{label}: {key}"
        if needs not in losses:
            raise SpaceError(f"{where}: only used with loss {needs!r}, which `loss` never takes")
        spec = parse_spec(doc[key], where, expect_float=True)
        for value in spec.candidates():
            try:
                build_objective(needs, **{key: value})
            except (ValueError, TypeError) as exc:
                raise SpaceError(f"{where}: {one_line(exc)}") from None
        specs[key] = spec
    return PosthocSpace(name=path.stem, path=path, description=description, specs=specs)
