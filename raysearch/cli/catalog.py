"""``raysearch list``, ``raysearch spaces`` and ``raysearch recipes``: what can be named.

The registered models, datasets, losses, calibrators, metrics and optimizers (built-in or a
plug-in's), the bundled search spaces and the papers' recipes, listed, shown and validated.
"""

from __future__ import annotations

import sys

import click

from raysearch.cli.base import EXIT_BAD_INPUT, friendly_errors

__all__ = ["list_command", "recipes", "spaces"]


@click.command("list")
@click.argument("kind", type=click.Choice(["models", "datasets", "losses", "calibrators",
                                           "metrics", "optimizers"]))
@friendly_errors
def list_command(kind: str) -> None:
    """List the names KIND accepts and where each comes from (built-in or a plug-in).

    Installed packages add names through entry points (groups raysearch.training.models,
    raysearch.datasets, raysearch.losses, raysearch.calibrators, raysearch.metrics,
    raysearch.optimizers); any import string package.module:attr works too without being
    listed. A name declared twice is listed as an error (exit code 2).
    """
    from raysearch.training.registries import describe, registry

    reg = registry(kind)
    entries = reg.entries()
    clashes = reg.conflicts()
    width = max((len(n) for n in entries), default=0)
    source_width = max((len(e.source) for e in entries.values()), default=0)
    for name in sorted(entries):
        note = "  (declared twice: refused)" if name in clashes else ""
        about = describe(kind, entries[name])
        source = f"{entries[name].source:<{source_width}s}  {about}" if about else entries[
            name].source
        click.echo(f"{name:<{width}s}  {source}{note}")
    extra = " (and torchvision:<name>)" if kind == "models" else ""
    click.echo(f"{len(entries)} {kind}{extra}; any import string package.module:attr works too")
    for message in clashes.values():
        click.echo(f"error: {message}", err=True)
    if clashes:
        sys.exit(EXIT_BAD_INPUT)


@click.group()
def spaces() -> None:
    """List, show and validate search spaces."""


@spaces.command("list")
@friendly_errors
def spaces_list() -> None:
    """List the bundled search spaces."""
    from raysearch.tune.posthoc_sweep import load_posthoc_space
    from raysearch.tune.spaces import available_spaces, load_space

    for name in available_spaces("train"):
        click.echo(f"{name:<8s} {load_space(name).description}")
    for name in available_spaces("posthoc"):
        click.echo(f"{name:<8s} {load_posthoc_space(name).description} "
                   "(post-hoc: raysearch calibrate FILE --search)")


@spaces.command("show")
@click.argument("space")
@friendly_errors
def spaces_show(space: str) -> None:
    """Show the parameters, ranges and scales of SPACE (a name or a YAML file)."""
    from raysearch.tune.posthoc_sweep import load_posthoc_space
    from raysearch.tune.spaces import load_space, space_kind

    if space_kind(space) == "posthoc":
        click.echo(load_posthoc_space(space).describe())
    else:
        click.echo(load_space(space).describe())


@click.group()
def recipes() -> None:
    """List and show the papers' training recipes (sweep --recipe NAME)."""


@recipes.command("list")
@friendly_errors
def recipes_list() -> None:
    """List the bundled recipes, the methods and datasets each is the default for."""
    from raysearch.tune.recipes import available_recipes, load_recipe

    names = available_recipes()
    width = max(map(len, names), default=0)
    for name in names:
        recipe = load_recipe(name)
        methods = "/".join(recipe.methods) or "every method"
        default = (f"  [default for {methods} on {'/'.join(recipe.datasets)}]"
                   if recipe.datasets and (recipe.methods or not recipe.baselines) else "")
        click.echo(f"{name:<{width}s}  {recipe.description}{default}")


@recipes.command("show")
@click.argument("recipe")
@friendly_errors
def recipes_show(recipe: str) -> None:
    """Show RECIPE (a name or a YAML file): its values and, in its comments, their sources."""
    from raysearch.tune.recipes import load_recipe

    loaded = load_recipe(recipe)
    click.echo(f"# {loaded.path}")
    click.echo(loaded.text(), nl=False)


@spaces.command("validate")
@click.argument("spaces_", metavar="SPACE...", nargs=-1, required=True)
@friendly_errors
def spaces_validate(spaces_: tuple[str, ...]) -> None:
    """Validate one or more spaces (names or YAML files); exit 2 on the first problem."""
    from raysearch.tune.posthoc_sweep import load_posthoc_space
    from raysearch.tune.spaces import space_kind, validate_space

    for space in spaces_:
        if space_kind(space) == "posthoc":
            load_posthoc_space(space)
            click.echo(f"ok: {space} (post-hoc)")
            continue
        loaded = validate_space(space)
        click.echo(f"ok: {space} ({', '.join(loaded.methods)})")
