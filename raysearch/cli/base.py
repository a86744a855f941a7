"""The ``raysearch`` command group and what every command shares: one-line errors, output.

Bad input (ValueError, FileNotFoundError) becomes one line on stderr and exit code 2
(:data:`EXIT_BAD_INPUT`), without a traceback (:func:`friendly_errors`). The exit codes of
``raysearch sweep``: 0 every trial completed, :data:`EXIT_SOME_FAILED` (3),
:data:`EXIT_NONE_COMPLETED` (4), :data:`EXIT_BAD_INPUT` (2), :data:`EXIT_TRACKING_AWAY` (5),
:data:`EXIT_INTERRUPTED` (130).
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

import click

__all__ = ["EXIT_BAD_INPUT", "EXIT_INTERRUPTED", "EXIT_NONE_COMPLETED", "EXIT_SOME_FAILED",
           "EXIT_TRACKING_AWAY", "echo", "friendly_errors", "main", "one_line"]

#: Exit status of bad input (a one-line error).
EXIT_BAD_INPUT = 2
#: Exit status of a sweep that ran and selected among its completed trials, but in which some
#: trials failed (raised after their retries, or diverged).
EXIT_SOME_FAILED = 3
#: Exit status of a sweep that ran but in which no trial completed (nothing selected).
EXIT_NONE_COMPLETED = 4
#: Exit status of a sweep whose trials ended while its tracking store did not answer: its
#: records wait in Tune's storage for ``raysearch sync NAME``.
EXIT_TRACKING_AWAY = 5
#: Exit status of a sweep stopped by Ctrl-C (128 + SIGINT, as shells report it).
EXIT_INTERRUPTED = 130


def one_line(exc: BaseException) -> str:
    """`exc` as one line (a missing file as ``file not found: PATH``)."""
    text = str(exc) or type(exc).__name__
    if isinstance(exc, FileNotFoundError) and exc.filename:
        text = f"file not found: {exc.filename}"
    return " ".join(text.split())


def friendly_errors(func: Callable) -> Callable:
    """Map bad-input exceptions to one line on stderr and exit code 2."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except (ValueError, FileNotFoundError, IsADirectoryError, KeyError) as exc:
            click.echo(f"error: {one_line(exc)}", err=True)
            sys.exit(EXIT_BAD_INPUT)

    return wrapper


def echo(line: str) -> None:
    """Print one progress line (the sweep's `progress` callback)."""
    click.echo(line)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="raysearch")
def main() -> None:
    """Ray-distributed hyperparameter search for network calibration.

    Sweeps calibration regularizers (label smoothing, focal, MbLS, ACLS, ...) with Ray Tune and
    Optuna, tracks every trial in MLflow, and selects the lowest-ECE trial within 1% of the best
    validation accuracy.
    """
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")  # no "Creating initial tables" noise
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
