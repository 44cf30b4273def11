"""goose-lens's engine, in three layers: ``core`` (the algorithm), ``sources`` (the draft sources, each with its
internals) and ``product`` (model loading, the CLI, the bench and sweep, the page's contract, trace files)."""
from pathlib import Path

#: the repository's ``assets`` folder (the demo model, the benchmark prompt sets, the page's presets)
ASSETS = Path(__file__).resolve().parent.parent / "assets"
