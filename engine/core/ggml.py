"""llama.cpp's kernels behind the forward seam: ``GgmlPath`` ("llamacpp") runs the decoding loop's trees with ggml,
through llama-cpp-python's low-level C API (``llama_decode`` on the model's own GGUF file), one llama context per
generation.  The transformers model converted from the same file stays the loop's description of the model (config,
name); its weights are not used here.

Tree attention by sequence ids.  llama.cpp masks by sequence: a batch row attends to the cache cells that hold the
row's (first) sequence id at positions <= its own.  A cell may hold several ids (``kv_unified``: one cell pool, so
copying a sequence is metadata only).  So:

* the committed prefix holds sequence ids 0 .. s-1 (``prefill`` writes it in 0; ids are added as trees need them);
* ``verify``: the tree's leaves are numbered 1 .. m; node i is one batch row at position ``length + depth(i)``
  carrying the id of every leaf below it.  Row i's view (its first id j, a leaf below it) is the prefix and the
  nodes of the path to leaf j at depths <= depth(i): its ancestors and itself, the tree attention mask;
* ``commit(keep)``: the kept rows are a root path at positions length .. length+k-1; the path's cells join sequence
  0 (``seq_cp`` from a leaf below ``keep[-1]``), the tree's ids leave positions >= length, and the path's cells rejoin
  ids 1 .. s-1.  1 + m + s metadata calls, none touching the prefix's cells (examples/speculative's way, ``seq_cp``
  of the prefix to every draft sequence each cycle and ``seq_keep`` after, costs O(length x m) per cycle).

Cells in position order.  ggml's CPU flash attention (on here) visits a row's cells in cache order, skipping masked
ones; every matmul of SmolLM2's Q4_1 weights quantizes its activations to 8 bits, so a different order of the same
cells (a later tree filling the holes a dropped branch left) moves logits by up to ~1, not by rounding.  So a dropped
row before the kept path's last one is moved to the ``trash`` seq id (never a row's: never attended) instead of
being freed; the rows after it are freed, and each tree takes the cells after the last used one (llama.cpp's
head).  When those cannot hold the next tree, seq 0 is compacted (saved, cleared, restored in order: a copy of the
committed K and V, rare).  ggml's CPU flash attention tiles a batch of 64 query rows or more over an f16 cache
(rounding unlike one row), so a tree is decoded in chunks of ``TREE_CHUNK`` = 63 rows, each chunk's rows seeing the
earlier ones' cells (a guard: the Q8_0 keys below never take the tiled kernel).  A tree row's logits then equal,
bit for bit, those of its path decoded as a chain, one row at a time or batched (tests/test_ggml.py), and greedy
decoding on this path gives the ids of AR on it.

The KV cache holds 8-bit (Q8_0) keys and f16 values (llama.cpp's default: f16 both).  With K and V of one type f16
(or f32), ggml's CPU flash attention has two more kernels a batch's row never takes: one query row over 512 cells or
more is split across threads and its partial sums reduced (``use_split_kv_path``), and 64 query rows or more are
tiled; each rounds unlike the row-by-row kernel, and the 8-bit activations make that a logit difference of up to
~0.7 (measured: an AR step past 256 used cells against the same row in a tree, 2 threads).  Both kernels need K and
V of the same f16 or f32 type, so with Q8_0 keys every row takes the row-by-row kernel, and an AR step and a tree
row are bit-identical at any length (tests/test_ggml.py).  The value type that costs less depends on the CPU (Q8_0
values: an AR step 1.03-1.13x of f16's on one AVX-512 machine, 0.75-0.88x on another; docs/results.md, "The KV
cache's types"), so each is a path (``llamacpp``, ``llamacpp-q8cache``) and the forward choice times both.  Over a
long context attention without flash attention costs less on a 2-core CPU, but rounds a batch's rows unlike one
row: ``llamacpp-noflash``, asked for by name, its divergences attributed as ties within ``TIE_LOGITS``.  The
price of Q8_0 keys: this path's text may part from llama.cpp's default (``llamacpp-ar``) where f16 would round
otherwise.

Sources: llama.cpp ``examples/speculative`` (draft trees as ``n_seq_dft`` sequences sharing the prefix through
``llama_memory_seq_cp``), ``include/llama.h`` (``llama_batch`` seq ids, the ``llama_memory_seq_*`` and
``llama_state_seq_*`` API), ``src/llama-kv-cache.cpp`` (``set_input_kq_mask``: the mask by a row's first seq id;
``find_slot``: free cells taken from the head), ``ggml-cpu/ops.cpp`` (``flash_attn_ext``).  Ours: the leaves' ids on
the prefix once, the trash id that keeps cells in order, the compaction.
llama-cpp-python is optional, imported lazily (``ggml_lib``): ``GgmlPath`` raises ``GgmlUnavailable`` (the install line)
without it.
"""
from __future__ import annotations

import ctypes
import threading
import weakref
from pathlib import Path

import numpy as np
import torch

from .forward import ForwardPath, TreeForward
from .ggml_lib import INSTALL, GgmlUnavailable, LlamaModel, installed, library, physical_cores
from .tree import DraftTree

__all__ = ["INSTALL", "GgmlNoFlashPath", "GgmlForward", "GgmlPath", "GgmlQ8CachePath", "GgmlUnavailable", "installed",
           "physical_cores"]

#: Rows per ``llama_decode`` at least (the prompt is decoded in chunks of ``n_batch`` rows); also ``n_ubatch``.
PREFILL_CHUNK = 256
#: Rows per ``llama_decode`` of a tree: ggml's CPU flash attention tiles a batch of ``GGML_FA_TILE_Q`` = 64 query rows
#: or more, rounding unlike one row; a larger tree is decoded in chunks of this many (its later rows see the earlier).
TREE_CHUNK = 63
#: A context's cells (``n_ctx``) are rounded up to a multiple of this.
CTX_STEP = 256
#: ``max_rows`` is rounded up to a multiple of this (the tree rows a context is sized for).
ROWS_STEP = 16

_I32P = ctypes.POINTER(ctypes.c_int32)


def _round_up(n: int, step: int) -> int:
    return -(-n // step) * step


def _free_context(lib, ctx, model: LlamaModel) -> None:
    lib.llama_free(ctx)  # ``model`` rides along: the weights outlive every context on them


class _Context:
    """One llama context: a KV cache of ``n_ctx`` cells in one pool (``kv_unified``) for ``n_seq`` sequence ids, at
    most ``n_batch`` rows per ``llama_decode``, and the batch it decodes: numpy arrays the ``llama_batch`` points
    into (tokens, positions, seq id counts and ids, output flags), written in place."""

    def __init__(self, path: GgmlPath, n_ctx: int, n_batch: int, n_seq: int) -> None:
        lib, model = path._lib, path._model  # the path's library and weights, its threads and cache types below
        params = lib.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_ubatch, params.n_seq_max = n_ctx, n_batch, n_batch, n_seq
        params.n_threads = params.n_threads_batch = path.threads
        params.kv_unified = True  # one cell pool: a cell holds several seq ids, seq_cp copies metadata only
        params.flash_attn_type = (lib.LLAMA_FLASH_ATTN_TYPE_ENABLED if path.FLASH_ATTN  # cells in cache order,
                                  else lib.LLAMA_FLASH_ATTN_TYPE_DISABLED)  # masked ones skipped
        params.no_perf = True
        params.type_k, params.type_v = (getattr(lib, f"GGML_TYPE_{t}") for t in path.CACHE)  # the module docstring
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


class GgmlForward(TreeForward):
    """``TreeForward`` on a llama context: tree attention by sequence ids (the module docstring).

    Cells stay in position order, so the attention visits the same cells in the same order as a chain's would:
    a tree takes the cells from ``_end`` on (llama.cpp fills free cells from its head, which sits there), its kept
    path keeps its cells, the dropped rows after the path's last one are freed, and those before it move to the
    ``trash`` seq id (never a row's, so never attended) instead of leaving holes a later tree would fill out of
    order.  When the cells from ``_end`` on cannot hold the next tree, seq 0 is compacted: saved, the cache cleared
    and restored into cells 0 .. length - 1 (``llama_state_seq_get_data`` / ``set_data``: a copy of the committed
    K and V, rare).

    Logits are (n, |V|) float32 on the CPU, a view of llama.cpp's output buffer when one decode made them (no copy:
    0.08 ms a step saved), valid until this forward's next ``prefill`` or ``verify`` and while it lives; a caller that
    keeps rows across forwards copies them (``engine.product.runs.lossless.engine_ar_logits`` does), else it would
    see them overwritten, or freed when the buffer grows.
    """

    def __init__(self, path: GgmlPath, max_length: int, max_rows: int) -> None:
        rows = _round_up(max(1, max_rows), ROWS_STEP)
        want = (_round_up(max(1, max_length) + rows, CTX_STEP), PREFILL_CHUNK, min(path.max_seq, rows + 2))
        self._held = [path.take(*want) or path.new_context(*want)]
        weakref.finalize(self, path.keep, self._held)  # the context serves the next generation when this one is done
        self.trash = self.context.n_seq - 1  # the seq id of dropped rows that sit before a kept one
        self.length = 0
        self._end = 0  # cells 0 .. _end - 1 hold the committed positions and trash, in order; the rest are free
        self._seqs = 1  # the committed prefix holds seq ids 0 .. _seqs - 1
        self._tree: DraftTree | None = None  # the last verified tree, uncommitted, in cells _end .. _end + n - 1
        self._below: np.ndarray | None = None  # its (n, m) bool: node i lies on the path to leaf j (seq id j + 1)

    @property
    def context(self) -> _Context:
        return self._held[0]

    @property
    def capacity(self) -> int:
        """Cache cells: committed positions plus a verified tree's rows."""
        return self.context.n_ctx

    def prefill(self, ids: list[int]) -> torch.Tensor:
        """Forward the prompt into sequence 0 (in chunks of ``n_batch`` rows); commits it.

        Returns:
            (L, |V|) float32 logits on the CPU.

        Raises:
            ValueError: an empty prompt, or one longer than the context's cells.
        """
        ctx = self.context
        if not ids or len(ids) > ctx.n_ctx:
            raise ValueError(f"a prompt of {len(ids)} tokens does not fit this forward's {ctx.n_ctx} cells "
                             f"(1 or more tokens, at most the max_length it was opened with)")
        ctx.clear()
        self.length = self._end = 0
        self._seqs, self._tree, self._below = 1, None, None
        n = len(ids)
        logits = self._decode(np.asarray(ids, np.int32), np.arange(n, dtype=np.int32),
                              np.zeros((n, 1), np.int32), np.ones(n, np.int32), ctx.n_batch)  # (L, |V|)
        self.length = self._end = n
        return logits

    def verify(self, tree: DraftTree) -> torch.Tensor:
        """One ``llama_decode`` (``TREE_CHUNK`` rows each beyond) of every node of ``tree`` over the committed prefix.

        Returns:
            (n, |V|) float32 logits on the CPU; row i predicts the token after node i.

        Raises:
            ValueError: the tree does not fit: more cells than the context has left, or more leaves than its
                sequence ids (one sentence; nothing is decoded).
        """
        ctx = self.context
        if self._tree is not None:
            self.commit([])  # an uncommitted tree: dropped
        n = len(tree)
        leaf = np.ones(n, dtype=bool)
        leaf[list(tree.parents[1:])] = False
        leaves = np.flatnonzero(leaf)  # (m,)
        m = len(leaves)
        if self.length + n > ctx.n_ctx or m > self.trash - 1:
            raise ValueError(f"a tree of {n} nodes and {m} leaves over {self.length} committed positions does not "
                             f"fit this forward's {ctx.n_ctx} cells and {self.trash - 1} leaf sequences "
                             f"(open it with a larger max_length or max_rows)")
        if self._end + n > ctx.n_ctx:
            self._compact()
        for j in range(self._seqs, m + 1):  # the prefix joins the seq ids this tree's leaves need
            ctx.seq_cp(0, j, -1, -1)
        self._seqs = max(self._seqs, m + 1)
        below = tree.ancestor_matrix[leaves].T  # (n, m) bool: node i is leaf j or one of its ancestors
        ids = np.where(below, np.arange(1, m + 1, dtype=np.int32), np.iinfo(np.int32).max)  # (n, m)
        ids.sort(axis=1)  # (n, m): each row's leaf seq ids first
        pos = self.length + np.asarray(tree.depths, np.int32)  # (n,)
        logits = self._decode(np.asarray(tree.tokens, np.int32), pos, ids, below.sum(axis=1), TREE_CHUNK)  # (n, |V|)
        self._tree, self._below = tree, below
        return logits

    def commit(self, keep: list[int]) -> None:
        """Keep the rows ``keep`` of the last verified tree (a root path, in path order) as the next ``len(keep)``
        committed positions; drop every other row.  ``keep == []`` drops the tree.

        Raises:
            ValueError: no tree to commit from, or ``keep`` is not a root path of it.
        """
        ctx, tree, below, at = self.context, self._tree, self._below, self.length
        if tree is None:
            if keep:
                raise ValueError("commit keeps rows of the last verified tree: verify one first")
            return
        if keep and (keep[0] != 0 or any(tree.parents[b] != a for a, b in zip(keep, keep[1:]))):
            raise ValueError(f"commit keeps a root path of the verified tree, in path order (got {keep})")
        k, last = len(keep), (keep[-1] if keep else -1)
        if keep:
            ctx.seq_cp(1 + int(np.argmax(below[last])), 0, at, at + k)  # the path's cells (a leaf's below it) join 0
            kept = set(keep)
            for i in range(1, last):  # dropped rows before the path's last: to the trash, no hole
                if i not in kept:
                    depth = at + tree.depths[i]
                    ctx.seq_cp(1 + int(np.argmax(below[i])), self.trash, depth, depth + 1)
        for j in range(1, below.shape[1] + 1):  # the tree's ids off: its rows after the path's last are freed
            ctx.seq_rm(j, at, -1)
        for j in range(1, self._seqs if keep else 1):  # the path's cells rejoin every id the prefix holds
            ctx.seq_cp(0, j, at, at + k)
        self.length += k
        self._end += last + 1
        self._tree, self._below = None, None

    def _compact(self) -> None:
        """Seq 0 (the committed positions) saved, the cache cleared and seq 0 restored into cells 0 .. length - 1, in
        order; the trash is gone and the prefix rejoins its seq ids."""
        ctx = self.context
        lib = ctx.lib
        size = lib.llama_state_seq_get_size(ctx.ctx, 0)
        buf = (ctypes.c_uint8 * size)()
        if lib.llama_state_seq_get_data(ctx.ctx, buf, size, 0) != size:
            raise RuntimeError("llama.cpp could not save the committed cache for compaction")
        ctx.clear()
        if lib.llama_state_seq_set_data(ctx.ctx, buf, size, 0) != size:
            raise RuntimeError("llama.cpp could not restore the committed cache after compaction")
        for j in range(1, self._seqs):
            ctx.seq_cp(0, j, -1, -1)
        self._end = self.length

    def _decode(self, tokens: np.ndarray, pos: np.ndarray, seq_ids: np.ndarray, counts: np.ndarray,
                chunk: int) -> torch.Tensor:
        """Decode rows (tokens (N,), positions (N,), seq ids (N, w) of which row i's first counts[i]) in chunks of
        ``chunk`` rows (at most ``n_batch``), every row's logits: (N, |V|) float32 (a view of llama.cpp's buffer when
        one chunk)."""
        ctx = self.context
        total, width = len(tokens), seq_ids.shape[1]
        out = None
        for a in range(0, total, chunk):
            b = min(total, a + chunk)
            k = b - a
            ctx.tokens[:k], ctx.pos[:k], ctx.n_seq_id[:k] = tokens[a:b], pos[a:b], counts[a:b]
            ctx.seq_ids[:k, :width] = seq_ids[a:b]
            view = torch.from_numpy(ctx.decode(k))  # (k, |V|): llama.cpp's output buffer
            if k == total:
                return view
            if out is None:
                out = torch.empty(total, view.shape[1], dtype=torch.float32)  # (N, |V|)
            out[a:b].copy_(view)
        return out


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
    ROWS_EXACT = True  # Q8_0 keys: a tree row is bit-identical to its AR step (the module docstring), so no tie
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
        self.spares: list[_Context] = []
        self._lock = threading.RLock()  # a forward's finalizer may run on any thread
        self._closed = False

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
        return GgmlForward(self, max_length, max_rows)

    def new_context(self, n_ctx: int, n_batch: int, n_seq: int) -> _Context:
        if self._closed:
            raise RuntimeError("this llamacpp path is closed")
        return _Context(self, n_ctx, n_batch, n_seq)

    def take(self, n_ctx: int, n_batch: int, n_seq: int) -> _Context | None:
        """The smallest kept context that fits, cleared, now this caller's; None when none fits."""
        with self._lock:
            fits = [c for c in self.spares if c.fits(n_ctx, n_batch, n_seq)]
            if not fits:
                return None
            chosen = min(fits, key=lambda c: (c.n_ctx, c.n_batch, c.n_seq))
            self.spares.remove(chosen)
        chosen.clear()
        return chosen

    def keep(self, held: list) -> None:
        """A finished forward's context (``held[0]``) kept for the next ``open``; the smallest dropped past
        ``SPARES``."""
        with self._lock:
            if self._closed:
                return
            self.spares.append(held[0])
            self.spares.sort(key=lambda c: c.n_ctx, reverse=True)
            del self.spares[self.SPARES:]

    def close(self) -> None:
        """Free the kept contexts; no ``open`` after (open forwards keep theirs, and the weights, until gone)."""
        with self._lock:
            self._closed = True
            self.spares.clear()

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
    over Q8_0 values costs less than over f16 ones (the module docstring); rows alike in any batch all the same."""

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
