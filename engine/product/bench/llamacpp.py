"""llama.cpp as a CPU peer in the benchmark: the same GGUF file, the same prompt token ids, the same threads.

    python -m cli.bench --methods ar,goose,llamacpp-ar,llamacpp-lookup ...

Two methods, run through ``llama-cpp-python`` (an optional extra: ``CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAVA_BUILD=OFF"
pip install llama-cpp-python==0.3.36``, built from its sdist, about 3 minutes on 2 cores):

* ``llamacpp-ar``: greedy decoding (``Llama.generate`` with ``temp=0``: llama.cpp's greedy sampler).
* ``llamacpp-lookup``: the same with llama-cpp-python's prompt lookup decoding as its draft model
  (``llama_cpp.llama_speculative.LlamaPromptLookupDecoding``: the longest n-gram of at most ``max_ngram_size`` tokens
  at the end of the text matched earlier in it, the ``num_pred_tokens`` tokens after the match drafted as one chain and
  verified in one batch).  ``num_pred_tokens=2``: the package's README advises 2 for CPU-only machines (10 for GPUs).

Both read the model's own Q4_1 weights with llama.cpp's kernels, so their text may part from our AR's (other
arithmetic, not a speculative-decoding error): the bench reports how far they agree instead of a lossless check.
Each run starts from an empty KV cache (no prefix reuse between runs), so its prefill is timed like ours.
Source: llama-cpp-python 0.3.36, ``llama_cpp/llama.py`` (``Llama.generate``, ``Llama.reset``) and
``llama_cpp/llama_speculative.py``.
"""
from __future__ import annotations

import time
from pathlib import Path

from engine.core.forward.llamacpp import weight_type

METHODS = ("llamacpp-ar", "llamacpp-lookup")
LOOKUP = {"max_ngram_size": 2, "num_pred_tokens": 2}  # LlamaPromptLookupDecoding's settings (its README: 2 on a CPU)
INSTALL = ('llama.cpp methods need the optional package llama-cpp-python: CMAKE_ARGS="-DGGML_NATIVE=ON '
           '-DLLAVA_BUILD=OFF" pip install llama-cpp-python==0.3.36 (built from source, about 3 minutes on 2 cores; '
           'docs/command-line.md)')


class LlamaCppMissing(RuntimeError):
    """llama-cpp-python is not installed, or the model has no GGUF file; the message says what to do."""


def check_installed() -> None:
    """Raises ``LlamaCppMissing`` (how to install it) when llama-cpp-python cannot be imported."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError as exc:
        raise LlamaCppMissing(INSTALL) from exc


class LlamaCpp:
    """The two llama.cpp methods on one GGUF file.

    Args:
        gguf: the model's GGUF file (``engine.product.models.named.ensure_gguf``).
        threads: CPU threads for llama.cpp's decode and batch work (the bench passes torch's).
        n_ctx: context length to allocate (tokens): the longest prompt plus the new tokens.

    Raises:
        LlamaCppMissing: llama-cpp-python is not importable (``INSTALL`` says how to get it).
    """

    def __init__(self, gguf: Path, threads: int, n_ctx: int) -> None:
        check_installed()
        import llama_cpp
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        common = dict(model_path=str(gguf), n_threads=threads, n_threads_batch=threads, n_ctx=n_ctx, verbose=False)
        self.models = {"llamacpp-ar": Llama(**common),
                       "llamacpp-lookup": Llama(**common, draft_model=LlamaPromptLookupDecoding(**LOOKUP))}
        self.weight_type = weight_type(llama_cpp, self.models["llamacpp-ar"].model)  # e.g. "Q4_1": what ran


    def run(self, method: str, prompt_ids: list[int], max_new_tokens: int, eos: tuple[int, ...]) -> dict:
        """One greedy run: {"tokens": new token ids, "seconds": wall time (s), "prefill_s": time to the first new
        token (s)}, the bench's record of a run (``cli.bench.Runner``)."""
        llm = self.models[method]
        llm.reset()  # an empty KV cache: no prefix of an earlier run is reused
        tokens: list[int] = []
        start = time.perf_counter()
        first = None
        for token in llm.generate(prompt_ids, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0,
                                  reset=True):
            first = first if first is not None else time.perf_counter() - start
            tokens.append(token)  # an end-of-sequence token counts, as in our runs
            if token in eos:
                break
            if len(tokens) >= max_new_tokens:
                break
        seconds = time.perf_counter() - start
        return {"tokens": tokens, "seconds": seconds, "prefill_s": first if first is not None else seconds}
