"""The forward seam: every forward of the model on a draft tree, and every way of running it.

* ``seam``: the interface, ``TreeForward`` (one generation's KV cache: ``prefill`` → ``verify`` → ``commit``) and
  ``ForwardPath`` (a model's way of running trees, shared by its generations), and the sizes the paths share.
* One module per path: ``eager`` (transformers' ``DynamicCache``, the reference), ``static`` (a ``StaticCache`` sized
  to the run, and its ``torch.compile`` form), ``graphs`` (the static forward captured as CUDA graphs, one
  ``GraphRunner`` per set of buffers), ``fused`` (the static and graphed paths with a decoder step of concatenated
  projections), ``llamacpp`` (llama.cpp's kernels on the model's own GGUF file: binding,
  contexts, tree attention by sequence ids, the paths).
* ``pool``: the buffers a finished generation hands to the next, the same on every path that keeps them.
* ``registry``: ``SPECS``, one explicit ``PathSpec`` of facts per path (what it needs, what its weights are, how
  ``auto`` treats it, what preparing it costs); callers decide by these facts, never by a path's name or class
  (tests/test_forward.py checks it).  A new path is one module here plus one ``PathSpec`` line.

The names below are what the layers above use; a path's own module is imported for what only it offers.
"""
from __future__ import annotations

from .eager import EagerForward, EagerPath
from .registry import SPECS, PathSpec, baseline, make_path, path_names, runs_file, spec
from .seam import BUCKETS, CAPACITY_STEP, PROMPT_ROOM, ForwardPath, Longer, TreeForward, bucket
from .static import CompiledPath, StaticPath, static_problem

__all__ = ["BUCKETS", "CAPACITY_STEP", "PROMPT_ROOM", "SPECS", "CompiledPath", "EagerForward", "EagerPath",
           "ForwardPath", "Longer", "PathSpec", "StaticPath", "TreeForward", "baseline", "bucket", "make_path",
           "path_names", "runs_file", "spec", "static_problem"]
