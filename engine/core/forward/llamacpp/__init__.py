"""llama.cpp's kernels behind the forward seam: ``GgmlPath`` ("llamacpp") runs the decoding loop's trees with ggml,
through llama-cpp-python's low-level C API (``llama_decode`` on the model's own GGUF file), one llama context per
generation.  The transformers model converted from the same file stays the loop's description of the model (config,
name); its weights are not used here.

The package, by concern: ``binding`` (llama-cpp-python loaded once, a GGUF file's weights), ``context`` (one llama
context: its KV cache and the batch it decodes), ``forward`` (``GgmlForward``: tree attention by sequence ids, cells in
position order), ``path`` (``GgmlPath`` and its variants: the KV cache's types, the attention kernel, the contexts a
finished generation hands to the next).
llama-cpp-python is optional, imported lazily (``binding``): ``GgmlPath`` raises ``GgmlUnavailable`` (the install
line) without it.
"""
from __future__ import annotations

from .binding import INSTALL, GgmlUnavailable, LlamaModel, installed, library, physical_cores, weight_type
from .context import CTX_STEP, PREFILL_CHUNK, ROWS_STEP, ContextKind, LlamaContext
from .forward import TREE_CHUNK, GgmlForward
from .path import GgmlNoFlashPath, GgmlPath, GgmlQ8CachePath

__all__ = ["CTX_STEP", "INSTALL", "PREFILL_CHUNK", "ROWS_STEP", "TREE_CHUNK", "ContextKind", "GgmlForward",
           "GgmlNoFlashPath", "GgmlPath", "GgmlQ8CachePath", "GgmlUnavailable", "LlamaContext", "LlamaModel",
           "installed", "library", "physical_cores", "weight_type"]
