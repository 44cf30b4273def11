"""One llama context: a KV cache of cells in one pool for several sequence ids, and the batch ``llama_decode`` reads,
numpy arrays written in place.

Source: llama.cpp ``include/llama.h`` (``llama_context_params``, ``llama_batch``, ``llama_decode``,
``llama_get_logits``, the ``llama_memory_seq_*`` API).
"""
from __future__ import annotations

import ctypes
import weakref
from dataclasses import dataclass

import numpy as np

from .binding import LlamaModel

#: Rows per ``llama_decode`` at least (the prompt is decoded in chunks of ``n_batch`` rows); also ``n_ubatch``.
PREFILL_CHUNK = 256
#: A context's cells (``n_ctx``) are rounded up to a multiple of this.
CTX_STEP = 256
#: ``max_rows`` is rounded up to a multiple of this (the tree rows a context is sized for).
ROWS_STEP = 16

_I32P = ctypes.POINTER(ctypes.c_int32)


@dataclass(frozen=True)
class ContextKind:
    """What every context of one path shares: llama-cpp-python's library (``binding.library``), the weights, the
    threads of its decodes, and its attention and KV cache (``GgmlPath``: the package docstring).

    Attributes:
        lib: the ``llama_cpp`` module.
        model: the GGUF file's ``LlamaModel``.
        threads: threads for one row and batches alike.
        flash_attn: ggml's flash attention (cells visited in cache order, masked ones skipped) or matrix products.
        cache: the KV cache's (key, value) ggml type names, e.g. ("Q8_0", "F16").
    """

    lib: object
    model: LlamaModel
    threads: int
    flash_attn: bool
    cache: tuple[str, str]


def _free_context(lib, ctx, model: LlamaModel) -> None:
    lib.llama_free(ctx)  # ``model`` rides along: the weights outlive every context on them


class LlamaContext:
    """One llama context: a KV cache of ``n_ctx`` cells in one pool (``kv_unified``) for ``n_seq`` sequence ids, at
    most ``n_batch`` rows per ``llama_decode``, and the batch it decodes: numpy arrays the ``llama_batch`` points
    into (tokens, positions, seq id counts and ids, output flags), written in place."""

    def __init__(self, kind: ContextKind, n_ctx: int, n_batch: int, n_seq: int) -> None:
        lib, model = kind.lib, kind.model
        params = lib.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_ubatch, params.n_seq_max = n_ctx, n_batch, n_batch, n_seq
        params.n_threads = params.n_threads_batch = kind.threads
        params.kv_unified = True  # one cell pool: a cell holds several seq ids, seq_cp copies metadata only
        params.flash_attn_type = (lib.LLAMA_FLASH_ATTN_TYPE_ENABLED if kind.flash_attn  # cells in cache order,
                                  else lib.LLAMA_FLASH_ATTN_TYPE_DISABLED)  # masked ones skipped
        params.no_perf = True
        params.type_k, params.type_v = (getattr(lib, f"GGML_TYPE_{t}") for t in kind.cache)  # the package docstring
        ctx = lib.llama_init_from_model(model.ptr, params)
        if not ctx:
            raise RuntimeError(f"llama.cpp could not create a context of {n_ctx} cells (see its log on stderr)")
        self.lib, self.ctx, self.model = lib, ctx, model
        self.n_ctx, self.n_batch, self.n_seq = n_ctx, n_batch, n_seq
        self.mem = lib.llama_get_memory(ctx)
        weakref.finalize(self, _free_context, lib, ctx, model)
        self.tokens = np.zeros(n_batch, np.int32)  # (n_batch,)
        self.pos = np.zeros(n_batch, np.int32)  # (n_batch,)
        self.n_seq_id = np.zeros(n_batch, np.int32)  # (n_batch,)
        self.seq_ids = np.zeros((n_batch, n_seq), np.int32)  # (n_batch, n_seq): row i's ids in its first n_seq_id[i]
        self.outputs = np.ones(n_batch, np.int8)  # (n_batch,): every row's logits
        row = self.seq_ids.strides[0]
        base = self.seq_ids.ctypes.data
        self._rows = (_I32P * (n_batch + 1))(*(ctypes.cast(base + i * row, _I32P) for i in range(n_batch)))
        batch = lib.llama_batch()
        batch.n_tokens = 0
        batch.token = self.tokens.ctypes.data_as(_I32P)
        batch.embd = None
        batch.pos = self.pos.ctypes.data_as(_I32P)
        batch.n_seq_id = self.n_seq_id.ctypes.data_as(_I32P)
        batch.seq_id = ctypes.cast(self._rows, ctypes.POINTER(_I32P))
        batch.logits = self.outputs.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))
        self.batch = batch

    def fits(self, n_ctx: int, n_batch: int, n_seq: int) -> bool:
        return self.n_ctx >= n_ctx and self.n_batch >= n_batch and self.n_seq >= n_seq

    def clear(self) -> None:
        """An empty cache (every cell of every sequence dropped)."""
        self.lib.llama_memory_clear(self.mem, True)

    def decode(self, n: int) -> np.ndarray:
        """``llama_decode`` of the batch's first ``n`` rows (n <= n_batch): (n, |V|) float32, a view of llama.cpp's
        output buffer, valid until the next decode on this context (or its end)."""
        self.batch.n_tokens = n
        status = self.lib.llama_decode(self.ctx, self.batch)
        if status != 0:
            raise RuntimeError(f"llama_decode failed (status {status}) on a batch of {n} rows")
        ptr = self.lib.llama_get_logits(self.ctx)
        return np.ctypeslib.as_array(ptr, shape=(n, self.model.n_vocab))  # (n, |V|)

    # the sequence operations: p0 < 0 is 0, p1 < 0 is the end
    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        self.lib.llama_memory_seq_cp(self.mem, src, dst, p0, p1)

    def seq_rm(self, seq: int, p0: int, p1: int) -> None:
        self.lib.llama_memory_seq_rm(self.mem, seq, p0, p1)
