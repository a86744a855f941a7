"""One registry per kind of component: built-ins, installed plug-ins and import strings.

Wherever raysearch takes the name of a model, a dataset, a loss, a post-hoc calibrator, an
optimizer or a metric (a CLI option, a space file, a recipe, an exported config, the Python API)
it accepts three spellings, resolved in this order:

1. a **registered name** (``resnet20``, ``cifar10``, ``acls``, ``ts``): a built-in, or a name an
   installed package declares as an entry point in the group of that kind
   (:data:`ENTRY_POINT_GROUPS`: ``raysearch.models``, ``raysearch.datasets``,
   ``raysearch.losses``, ``raysearch.calibrators``, ``raysearch.metrics``,
   ``raysearch.optimizers``). Built-ins and plug-ins form one registry
   per kind; a name declared twice (a plug-in shadowing a built-in, or two plug-ins) is an error
   that names both sources, never a silent choice;
2. an **import string** ``package.module:attr`` (``attr`` may be dotted, ``Outer.Inner``),
   imported the way Python would from where the command runs: the current directory first,
   then ``PYTHONPATH`` and the installed packages (:func:`import_object`);
3. in the Python API, the **object itself** (a class or a function), used as given.

Importing an import string runs the user's code with the user's rights, as ``pickle`` or
Hydra's ``_target_`` do: only name modules you trust.

This module is plain Python (``importlib``, ``importlib.metadata``); it imports no torch, Ray
or MLflow, so every layer may use it.

The registry of each kind lives with its built-ins (``raysearch.training.models.MODEL_REGISTRY``,
...); :func:`raysearch.training.registries.registry` finds one by kind.

Example:
    >>> from raysearch.training.registries import registry
    >>> registry("models").get("mypkg.models:make_net")          # doctest: +SKIP
    <function make_net at 0x...>
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import inspect
import os
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
        "ENTRY_POINT_GROUPS",
    "Entry",
    "Registry",
    "RegistryError",
    "accepted_keywords",
    "check_keywords",
    "code_module",
    "ensure_cwd_on_path",
    "code_root",
    "import_object",
    "is_import_string",
    "object_label",
]

#: Entry-point group of each kind that installed packages can add names to.
ENTRY_POINT_GROUPS = {
    "models": "raysearch.models",
    "datasets": "raysearch.datasets",
    "losses": "raysearch.losses",
    "calibrators": "raysearch.calibrators",
    "metrics": "raysearch.metrics",
    "optimizers": "raysearch.optimizers",
}

#: The singular of each kind, for messages.
_NOUNS = {"models": "model", "datasets": "dataset", "losses": "loss",
          "calibrators": "calibrator", "metrics": "metric", "optimizers": "optimizer"}

#: Source of the names raysearch ships.
BUILT_IN = "built-in"

# every installed distribution's entry points, read once per state of sys.path: reading them
# opens each distribution's metadata (~10 ms with ~200 installed), and a trial asks a registry
# for its names several times (calibrators, metrics); a distribution installed meanwhile
# changes the mtime of the folder it went into, a folder added to sys.path changes the key
_ENTRY_POINTS: dict[tuple, Any] = {}
_ENTRY_POINTS_LOCK = threading.Lock()


def _path_state() -> tuple:
    """``sys.path`` with each folder's modification time (ns): changes when a package lands."""
    state = []
    for entry in sys.path:
        try:
            state.append((entry, os.stat(entry or ".").st_mtime_ns))
        except OSError:
            state.append((entry, None))
    return tuple(state)


def _entry_points(group: str) -> tuple[Any, ...]:
    """``importlib.metadata.entry_points(group=group)``, from a scan shared by every group."""
    key = _path_state()
    with _ENTRY_POINTS_LOCK:
        groups = _ENTRY_POINTS.get(key)
        if groups is None:
            _ENTRY_POINTS.clear()
            groups = _ENTRY_POINTS[key] = {"": importlib.metadata.entry_points()}
        if group not in groups:
            groups[group] = tuple(groups[""].select(group=group))
        return groups[group]


class RegistryError(ValueError):
    """An unknown name, a name declared twice, or an import string that does not import.

    The message is one line: what was asked for, why it failed, and what would work.
    """



def did_you_mean(unknown: Any, allowed: Any) -> str:
    """`` (did you mean epochs?)`` for the closest allowed names of the unknown ones ('' if none).

    Args:
        unknown: a misspelt name, or several.
        allowed: the names that exist.
    """
    names = [unknown] if isinstance(unknown, str) else list(unknown)
    close = list(dict.fromkeys(c for name in names  # best match first, each once
                               for c in difflib.get_close_matches(str(name), list(allowed), n=2)))
    return f" (did you mean {', '.join(close)}?)" if close else ""

def is_import_string(name: object) -> bool:
    """True for ``package.module:attr`` (a str with one ``:`` and text on both sides)."""
    if not isinstance(name, str) or name.count(":") != 1:
        return False
    module, attr = name.split(":")
    return bool(module.strip()) and bool(attr.strip()) and "/" not in module and " " not in name


def ensure_cwd_on_path() -> None:
    """Put the current directory first on ``sys.path``, as ``python -m`` does (once).

    A console script (``raysearch``) starts with its own ``bin/`` folder there instead, so a
    package next to the user would not be found although ``python -c "import mypkg"`` finds it.
    """
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)


def import_object(spec: str, *, what: str = "object") -> Any:
    """Import ``package.module:attr`` and return the attribute.

    The module is found as Python would from the current directory: the current directory is
    put first on ``sys.path`` (where a console script would not have it), then ``PYTHONPATH``
    and the installed packages are searched. ``attr`` may be dotted (``Class.factory``).

    Args:
        spec: the import string.
        what: what the object is, for messages (``"model"``, ``"dataset"``, ...).

    Returns:
        The imported attribute.

    Raises:
        RegistryError: one line if `spec` is not an import string, its module cannot be found
            or raises on import, or the attribute is missing (with close matches).
    """
    if not is_import_string(spec):
        raise RegistryError(f"{what} {spec!r} is not an import string (package.module:attr)")
    module_name, attr = (part.strip() for part in spec.split(":"))
    ensure_cwd_on_path()
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or module_name
        raise RegistryError(
            f"{what} {spec!r}: cannot import module {module_name!r} (no module named "
            f"{missing!r} in the current directory {os.getcwd()} or on PYTHONPATH)"
        ) from None
    except Exception as exc:  # noqa: BLE001 (the user's module failed: say so in one line)
        raise RegistryError(
            f"{what} {spec!r}: importing module {module_name!r} raised "
            f"{type(exc).__name__}: {_one_line(exc)}"
        ) from None
    value: Any = module
    for i, part in enumerate(attr.split(".")):
        if not hasattr(value, part):
            owner = module_name if i == 0 else f"{module_name}:{'.'.join(attr.split('.')[:i])}"
            names = [n for n in dir(value) if not n.startswith("_")]
            close = difflib.get_close_matches(part, names, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise RegistryError(f"{what} {spec!r}: {owner!r} has no attribute {part!r}{hint}")
        value = getattr(value, part)
    return value


def object_label(obj: Any) -> str:
    """The import string of a class or function (``module:qualname``), e.g. for an export.

    Objects defined in a script or a notebook get ``__main__:name``; a ``functools.partial``
    gets its function's label.
    """
    func = getattr(obj, "func", obj)  # functools.partial
    module = getattr(func, "__module__", None) or type(func).__module__
    qualname = getattr(func, "__qualname__", None) or type(func).__qualname__
    return f"{module}:{qualname}"


def code_root(obj: Any) -> str | None:
    """The folder a user's object was imported from: the parent of its top-level package.

    None for objects of the standard library, of installed packages (site-packages), of
    raysearch itself, and for objects defined in ``__main__`` (a script or a notebook: they
    travel by value). A sweep puts these folders on the trial workers' ``sys.path``.
    """
    module = code_module(obj)
    return None if module is None else os.path.dirname(module)


def code_module(obj: Any) -> str | None:
    """The user's top-level package folder (or module file) an object comes from.

    What a sweep ships to a remote cluster (Ray ``runtime_env`` ``py_modules``). None as for
    :func:`code_root`.
    """
    module_name = (getattr(getattr(obj, "func", obj), "__module__", None) or "").split(".")[0]
    if not module_name or module_name in ("__main__", "raysearch", "builtins"):
        return None
    module = sys.modules.get(module_name)
    path = getattr(module, "__file__", None)
    if path is None:
        return None
    path = os.path.abspath(path)
    if any(part in ("site-packages", "dist-packages") for part in path.split(os.sep)):
        return None
    if path.startswith(os.path.abspath(sys.base_prefix) + os.sep) or path.startswith(
            os.path.abspath(sys.prefix) + os.sep):
        return None
    if os.path.basename(path) == "__init__.py":  # a package: its folder
        return os.path.dirname(path)
    return path


@dataclass(frozen=True)
class Entry:
    """One registered name: where it comes from and how to load it.

    Attributes:
        name: the registered name.
        source: ``"built-in"`` or the distribution that declares it (``"mypkg 0.1.0"``).
        target: what the name stands for: an import string, or the object itself.
    """

    name: str
    source: str
    target: Any

    def load(self) -> Any:
        """The object (the import string imported; entry points are loaded here, once)."""
        if hasattr(self.target, "load") and callable(self.target.load):  # an EntryPoint
            return self.target.load()
        if isinstance(self.target, str) and is_import_string(self.target):
            return import_object(self.target, what=self.name)
        return self.target


class Registry:
    """Names of one kind: the built-ins plus the installed packages' entry points.

    Args:
        kind: the plural noun of the kind, for messages and ``raysearch list`` (``"models"``).
        builtins: ``{name: object or import string}``; an import string is imported on first
            use (so a registry lists names without importing, say, torchvision).
        group: the entry-point group (default: :data:`ENTRY_POINT_GROUPS` of `kind`).
        prefixes: ``{prefix: factory(rest)}`` for families of names resolved by a prefix
            (``torchvision:<name>`` for models); such names are not listed.
    """

    def __init__(self, kind: str, builtins: Mapping[str, Any], *, group: str | None = None,
                 prefixes: Mapping[str, Callable[[str], Any]] | None = None,
                 hint: str = "") -> None:
        self.kind = kind
        self.noun = _NOUNS.get(kind, kind)
        self.group = group or ENTRY_POINT_GROUPS.get(kind, f"raysearch.{kind}")
        self._builtins = dict(builtins)
        self._prefixes = dict(prefixes or {})
        self._hint = hint
        self._loaded: dict[str, Any] = {}
        self._lock = threading.Lock()

    # -- what is registered ---------------------------------------------------------------
    def _plugins(self) -> list[Entry]:
        try:
            points = _entry_points(self.group)
        except Exception:  # noqa: BLE001 (a broken installation must not hide the built-ins)
            return []
        entries = []
        for point in points:
            dist = getattr(point, "dist", None)
            source = (f"{dist.metadata['Name']} {dist.version}" if dist is not None
                      else f"entry point {point.value}")
            entries.append(Entry(point.name, source, point))
        return entries

    def entries(self) -> dict[str, Entry]:
        """Every registered name with its source, built-ins first.

        A name declared twice keeps its first source here; :meth:`conflicts` lists it, and
        :meth:`get` refuses it.
        """
        return self._scan()[0]

    def conflicts(self) -> dict[str, str]:
        """``{name: message}`` of the names declared twice; each message names both sources.

        A name is declared twice by a built-in and a plug-in, or by two plug-ins.
        """
        return self._scan()[1]

    def _scan(self) -> tuple[dict[str, Entry], dict[str, str]]:
        out = {name: Entry(name, BUILT_IN, target) for name, target in self._builtins.items()}
        clashes: dict[str, str] = {}
        seen_values: dict[tuple[str, str], str] = {}
        for entry in self._plugins():
            key = (entry.name, str(getattr(entry.target, "value", entry.target)))
            if key in seen_values and seen_values[key] == entry.source:
                continue  # the same distribution seen twice on sys.path
            seen_values[key] = entry.source
            if entry.name in out:
                clashes[entry.name] = (
                    f"{self.noun} name {entry.name!r} is declared twice: by "
                    f"{out[entry.name].source} and by {entry.source} (entry-point group "
                    f"{self.group}); uninstall one of them, or name the object by its import "
                    "string package.module:attr")
                continue
            out[entry.name] = entry
        return out, clashes

    def names(self) -> list[str]:
        """Sorted registered names (built-ins and plug-ins)."""
        return sorted(self.entries())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (name in self.entries() or self._prefix(name) is not None)

    def _prefix(self, name: str) -> Callable[[str], Any] | None:
        for prefix, factory in self._prefixes.items():
            if name.startswith(prefix):
                return factory
        return None

    # -- resolving ----------------------------------------------------------------------
    def get(self, name: Any, *, components: Mapping[str, Any] | None = None) -> Any:
        """The object a name, an import string or an object stands for.

        Args:
            name: a registered name, an import string ``package.module:attr``, a prefixed name
                (``torchvision:resnet18``), or an object (returned as is).
            components: objects given through the Python API, by label; they win over
                everything else (a callable defined in a notebook travels this way).

        Returns:
            The class or function.

        Raises:
            RegistryError: for an unknown name (with the closest registered names and their
                sources), a name declared twice (naming both sources), or an import string that
                fails to import.
        """
        if not isinstance(name, str):
            if callable(name):
                return name
            raise RegistryError(f"a {self.noun} must be a name, an import string "
                                f"(package.module:attr) or a callable, got {name!r}")
        if components and name in components:
            return components[name]
        factory = self._prefix(name)
        if factory is not None:
            return factory(name)
        with self._lock:
            if name in self._loaded:
                return self._loaded[name]
        entries, clashes = self._scan()
        if name in clashes:
            raise RegistryError(clashes[name])
        if name in entries:
            value = entries[name].load()
        elif is_import_string(name):
            value = import_object(name, what=self.noun)
        else:
            raise RegistryError(self.unknown_message(name, entries))
        with self._lock:
            self._loaded[name] = value
        return value

    def source(self, name: str) -> str:
        """Where a name comes from: ``built-in``, a distribution, or ``import string``."""
        entries = self.entries()
        if name in entries:
            return entries[name].source
        if self._prefix(name) is not None:
            return BUILT_IN
        return "import string" if is_import_string(name) else "unknown"

    def unknown_message(self, name: str, entries: Mapping[str, Entry] | None = None) -> str:
        """``Unknown model 'resnt20'; did you mean resnet20? available: ... (built-in), ...``."""
        entries = self.entries() if entries is None else entries
        close = difflib.get_close_matches(name, list(entries), n=3, cutoff=0.6)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        by_source: dict[str, list[str]] = {}
        for entry_name, entry in sorted(entries.items()):
            by_source.setdefault(entry.source, []).append(entry_name)
        listed = "; ".join(f"{', '.join(names)} ({source})"
                           for source, names in by_source.items())
        extra = f"; {self._hint}" if self._hint else ""
        return (f"Unknown {self.noun} {name!r}{hint}; available: {listed}{extra}; or an import "
                "string package.module:attr")


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def accepted_keywords(factory: Any) -> tuple[set[str], bool]:
    """The keyword names `factory` accepts, and whether it also takes ``**kwargs``.

    For a class, its ``__init__`` (without ``self``). Unreadable signatures (some builtins) count
    as taking anything.
    """
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return set(), True
    names, var_kw = set(), False
    for param in signature.parameters.values():
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            var_kw = True
        elif param.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                            inspect.Parameter.KEYWORD_ONLY):
            names.add(param.name)
    return names, var_kw


def check_keywords(factory: Any, keys: Iterable[str], *, what: str, option: str = "",
                   reserved: Iterable[str] = ()) -> None:
    """Refuse keywords that `factory` would not take (instead of dropping them).

    Args:
        factory: a class or function.
        keys: the keyword names to be passed.
        what: the object in the message (``"dataset 'cifar10'"``).
        option: how the user set it, for the message (``"--crop-size"``); default: the key.
        reserved: names the caller passes itself (left out of the listed alternatives).

    Raises:
        ValueError: one line naming the first key the factory does not take and the ones it
            does.
    """
    names, var_kw = accepted_keywords(factory)
    if var_kw:
        return
    for key in keys:
        if key not in names:
            shown = sorted(names - set(reserved))
            close = difflib.get_close_matches(key, shown, n=2)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise ValueError(
                f"{option + ': ' if option else ''}{what} takes no argument {key!r}{hint}; "
                f"it takes: {', '.join(shown) or '(nothing else)'}"
            )
