"""The ``versiq`` command line: argument parsing, the demo and the sample generator (the top layer)."""
