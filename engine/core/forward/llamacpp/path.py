"""``GgmlPath`` ("llamacpp") and its variants: the GGUF file's model loaded once, a llama context per generation, the
KV cache's types and the attention kernel each variant runs.

The KV cache holds 8-bit (Q8_0) keys and f16 values (llama.cpp's default: f16 both).  With K and V of one type f16
(or f32), ggml's CPU flash attention has two more kernels a batch's row never takes: one query row over 512 cells or
more is split across threads and its partial sums reduced (``use_split_kv_path``), and 64 query rows or more are
tiled; each rounds unlike the row-by-row kernel, and the 8-bit activations make that a logit difference of up to
~0.7 (measured: an AR step past 256 used cells against the same row in a tree, 2 threads).  Both kernels need K and
V of the same f16 or f32 type, so with Q8_0 keys every row takes the row-by-row kernel, and an AR step and a tree
row are bit-identical at any length (tests/test_ggml.py).  The value type that costs less depends on the CPU (Q8_0
values: an AR step 1.03-1.13x of f16's on one AVX-512 machine, 0.75-0.88x on another; docs/results.md, "A second
AVX-512 machine: the KV cache's values"), so each is a path (``llamacpp``, ``llamacpp-q8cache``) and the forward
choice times both.  Over a long context attention without flash attention costs less on a 2-core CPU, but rounds a
batch's rows unlike one row: ``llamacpp-noflash``, asked for by name, its divergences attributed as ties within
``TIE_LOGITS``.  The price of Q8_0 keys: this path's text may part from llama.cpp's default (``llamacpp-ar``) where
f16 would round otherwise.

Source: llama.cpp ``include/llama.h`` (``llama_context_params``: ``type_k``, ``type_v``, ``flash_attn_type``),
``ggml-cpu/ops.cpp`` (``flash_attn_ext``).
"""
from __future__ import annotations

from pathlib import Path

import torch

from ..pool import Spares
from ..seam import ForwardPath, TreeForward, round_up
from .binding import INSTALL, GgmlUnavailable, LlamaModel, library, physical_cores
from .context import CTX_STEP, PREFILL_CHUNK, ROWS_STEP, ContextKind, LlamaContext
from .forward import GgmlForward


class GgmlPath(ForwardPath):
    """llama.cpp's forward path ("llamacpp"): the GGUF file's model loaded once, a llama context per generation.

    A finished generation's context (its KV cache, compute buffers) waits in ``spares`` (at most ``SPARES``) for
    the next ``open`` it fits (cleared first), as ``StaticPath`` keeps its buffers; never two generations on one.
    ``close`` drops the spares; the weights are freed when the path and every context on them are gone.

    Args:
        model: the transformers causal LM converted from the same GGUF file (the decoding loop reads its config,
            device, dtype and name; its vocabulary size must be llama.cpp's).
        gguf: the GGUF file (``engine.product.models.named.ensure_gguf``).
        threads: threads for llama.cpp's decodes (one row and batches alike); default ``physical_cores()``.

    Raises:
        GgmlUnavailable: llama-cpp-python is not installed (the message has the install line).
        ValueError: llama.cpp cannot load ``gguf``, or its vocabulary differs from ``model``'s.
    """

    name = "llamacpp"
    ROWS_EXACT = True  # Q8_0 keys: a tree row is bit-identical to its AR step (this module's docstring), so no tie
    SPARES = 2
    CACHE = ("Q8_0", "F16")  # the KV cache's (key, value) ggml types: Q8_0 keys keep a row alike in any batch
    FLASH_ATTN = True  # ggml's flash attention: a row's cells visited in cache order, each row alone (Q8_0 keys)

    def __init__(self, model, gguf: Path, threads: int | None = None) -> None:
        super().__init__(model)
        self._lib = library()
        self.gguf = Path(gguf)
        if not self.gguf.is_file():
            raise ValueError(f"no GGUF file at {self.gguf}")
        self.threads = int(threads) if threads else physical_cores()
        self._model = LlamaModel.shared(self._lib, self.gguf)  # one copy of the weights for every path on the file
        vocab = model.config.get_text_config().vocab_size
        if vocab != self._model.n_vocab:
            raise ValueError(f"{self.gguf.name} has {self._model.n_vocab} tokens but the model {vocab}: "
                             f"give the model converted from this file")
        self.max_seq = int(self._lib.llama_max_parallel_sequences())  # llama.cpp's LLAMA_MAX_SEQ
        self.kind = ContextKind(self._lib, self._model, self.threads, self.FLASH_ATTN, self.CACHE)  # every context's
        self.spares: Spares[LlamaContext] = Spares(self.SPARES, rank=lambda c: c.n_ctx)  # the largest kept first

    def weights(self) -> str:
        """The GGUF file's weight type, which every forward here runs, e.g. "Q4_1" (never the torch model's dtype)."""
        return self._model.weight_type

    def describe(self) -> str:
        """What runs, for a model line: the file's weight type and the kernels, e.g. "Q4_1 · llama.cpp kernels"."""
        return f"{self.weights()} · llama.cpp kernels"

    def speed_identity(self) -> str:
        """The file's weight type and kernels, llama-cpp-python's release and the threads, e.g. "Q4_1 · llama.cpp
        kernels · llama-cpp-python 0.3.36 · 2 threads": the torch model's dtype never runs a forward here."""
        threads = f"{self.threads} thread" + ("s" if self.threads != 1 else "")
        return f"{self.describe()} · llama-cpp-python {self._lib.__version__} · {threads}"

    @classmethod
    def for_model(cls, model, gguf=None) -> GgmlPath:
        if gguf is None:
            raise ValueError("the llamacpp path runs a model loaded from a .gguf file (its own weights, llama.cpp's "
                             "kernels)")
        return cls(model, gguf)

    @classmethod
    def problem(cls, model, gguf=None) -> str | None:
        if gguf is None:
            return "the model was not loaded from a .gguf file"
        if torch.device(model.device).type != "cpu":
            return "it serves CPU runs (this build of llama.cpp has no GPU backend here)"
        try:
            library()
        except GgmlUnavailable:
            return f"llama-cpp-python is not installed ({INSTALL})"
        return None

    def open(self, max_length: int, max_rows: int = 1) -> TreeForward:
        """A ``GgmlForward`` of ``max_length`` + ``max_rows`` cells (rounded up: ``CTX_STEP``), trees of up to
        ``max_rows`` nodes (rounded up: ``ROWS_STEP``; a larger tree runs while its leaves and cells fit)."""
        rows = round_up(max(1, max_rows), ROWS_STEP)
        want = (round_up(max(1, max_length) + rows, CTX_STEP), PREFILL_CHUNK, min(self.max_seq, rows + 2))
        return GgmlForward(self.take(*want) or self.new_context(*want), give_back=self.keep)

    def new_context(self, n_ctx: int, n_batch: int, n_seq: int) -> LlamaContext:
        """A new llama context of this path's kind.  Raises RuntimeError once the path is closed."""
        if self.spares.closed:
            raise RuntimeError("this llamacpp path is closed")
        return LlamaContext(self.kind, n_ctx, n_batch, n_seq)

    def take(self, n_ctx: int, n_batch: int, n_seq: int) -> LlamaContext | None:
        """The smallest kept context that fits, cleared, now this caller's; None when none fits."""
        chosen = self.spares.take(lambda c: c.fits(n_ctx, n_batch, n_seq), best=lambda c: (c.n_ctx, c.n_batch, c.n_seq))
        if chosen is not None:
            chosen.clear()
        return chosen

    def keep(self, context: LlamaContext) -> None:
        """A finished forward's context kept for the next ``open``; the smallest dropped past ``SPARES`` (none kept
        once the path is closed)."""
        self.spares.keep(context)

    def close(self) -> None:
        """Free the kept contexts; no ``open`` after (open forwards keep theirs, and the weights, until gone)."""
        self.spares.close()

    def tokenize(self, text: str, special: bool = False) -> list[int]:
        """llama.cpp's token ids of ``text``, no BOS or EOS; ``special``: "<|im_end|>" and the like become tokens."""
        data = text.encode("utf-8")
        size = len(data) + 8
        for _ in range(2):
            buf = (self._lib.llama_token * size)()
            n = self._lib.llama_tokenize(self._model.vocab, data, len(data), buf, size, False, special)
            if n >= 0:
                return list(buf[:n])
            size = -n  # too small: the count it needs
        raise RuntimeError(f"llama_tokenize failed on a text of {len(data)} bytes")


class GgmlQ8CachePath(GgmlPath):
    """The llamacpp path with a Q8_0 KV cache, values too ("llamacpp-q8cache"): on some CPUs ggml's flash attention
    over Q8_0 values costs less than over f16 ones (this module's docstring); rows alike in any batch all the same."""

    name = "llamacpp-q8cache"
    CACHE = ("Q8_0", "Q8_0")


class GgmlNoFlashPath(GgmlPath):
    """The llamacpp path with attention as matrix products, no flash attention ("llamacpp-noflash"), Q8_0 keys and f16
    values; attention as llama.cpp's own AR runs it (llama-cpp-python's default: no flash attention).  Over a long
    context its AR step costs less than the flash-attention paths' (one 2-core machine: 16.7 ms at 2,000 cells against
    19.3-20.6 for ``llamacpp-q8cache`` and 16.8-17.8 for llama.cpp's AR; docs/results.md, "Long contexts: the KV cache
    and the attention kernel").  The price: the attention's matrix products take another kernel for a batch than for one
    row, and the 8-bit activations after them carry that to the logits, so a tree row may read up to ~2.2 apart from its
    AR step and move a gap between two tokens by up to 2.8 (measured, ``TIE_LOGITS``).  Where this path's output parts
    from its AR, the two tokens' logits in AR's step within ``TIE_LOGITS`` are a precision tie; wider is a bug.
    ``--forward auto`` runs long generations on it where it measured their AR step cheaper than the chosen path's
    (``forward_choice.long_rule``: from the cells where the two cross); ask for it by name to run every
    generation on it."""

    name = "llamacpp-noflash"
    FLASH_ATTN = False
    ROWS_EXACT = False
    TIE_LOGITS = 4.0  # the next power of two above the largest move of a top-2 gap from its AR step: 2.79, 29 prompts
