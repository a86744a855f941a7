"""``python -m raysearch.cli``: the ``raysearch`` command."""

from raysearch.cli.commands import main

main()
