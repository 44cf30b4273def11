"""goose-lens's engine, in four layers, each importing only those below it (``lint-imports`` checks it):

* ``core``: the primitives: the draft tree, verification and its read-back, the KV cache, attention, model
  compatibility, host transfers, estimates and the theory's bounds;
* ``sources``: the draft-source protocol, one module per source, and the registry;
* ``decoding``: the decoding loop and its config, the tree builders, the GT size choice, the cycle's trace;
* ``product``: model loading and precision, the cost curve's measurement and disk cache, the CLIs, the bench and
  sweep, the page's contract, trace files.

``viz`` (figures and text of a run) sits above the engine, and ``page`` (the Gradio page) above ``viz``.
"""
from pathlib import Path

#: the repository's ``assets`` folder (the demo model, the benchmark prompt sets, the page's presets)
ASSETS = Path(__file__).resolve().parent.parent / "assets"
