"""The command-line tools (``python -m cli.generate``, ``cli.bench``, ``cli.sweep``, ``cli.production``); their
shared options: ``cli.options``."""
