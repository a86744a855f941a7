"""The interface layer's command line: ``raysearch`` parses options and prints what the API returns.

:mod:`raysearch.cli.commands` holds the click commands (the entry point ``raysearch``, also
``python -m raysearch.cli``), :mod:`raysearch.cli.plan` the resolved sweep that
``raysearch sweep --dry-run`` prints. The CLI imports neither MLflow, PyTorch, NumPy, pandas nor
Ray (``raysearch --help`` starts in a fraction of a second) and computes nothing: it calls
:mod:`raysearch.api` and the layers below, which do. Nothing in the package imports it.
"""

from raysearch.cli.commands import main

__all__ = ["main"]
