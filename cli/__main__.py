"""``python -m versiq.cli``: the same entry as the ``versiq`` script."""

from versiq.cli.main import run

run()
