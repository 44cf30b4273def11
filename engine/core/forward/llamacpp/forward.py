"""``GgmlForward``: one generation's trees on a llama context.

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

Sources: llama.cpp ``examples/speculative`` (draft trees as ``n_seq_dft`` sequences sharing the prefix through
``llama_memory_seq_cp``), ``include/llama.h`` (``llama_batch`` seq ids, the ``llama_memory_seq_*`` and
``llama_state_seq_*`` API), ``src/llama-kv-cache.cpp`` (``set_input_kq_mask``: the mask by a row's first seq id;
``find_slot``: free cells taken from the head), ``ggml-cpu/ops.cpp`` (``flash_attn_ext``).  Ours: the leaves' ids on
the prefix once, the trash id that keeps cells in order, the compaction.
"""
from __future__ import annotations

import ctypes
from collections.abc import Callable

import numpy as np
import torch

from ...tree import DraftTree
from ..pool import Lease
from ..seam import TreeForward
from .context import LlamaContext

#: Rows per ``llama_decode`` of a tree: ggml's CPU flash attention tiles a batch of ``GGML_FA_TILE_Q`` = 64 query rows
#: or more, rounding unlike one row; a larger tree is decoded in chunks of this many (its later rows see the earlier).
TREE_CHUNK = 63


class GgmlForward(TreeForward):
    """``TreeForward`` on a llama context: tree attention by sequence ids (this module's docstring).

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

    def __init__(self, context: LlamaContext, give_back: Callable[[LlamaContext], None]) -> None:
        """One generation on ``context`` (empty, or cleared), which ``give_back`` receives when this forward is done
        (``GgmlPath.keep``: it serves the next generation)."""
        self._lease: Lease[LlamaContext] = Lease(self, context, give_back)
        self.trash = self.context.n_seq - 1  # the seq id of dropped rows that sit before a kept one
        self.length = 0
        self._end = 0  # cells 0 .. _end - 1 hold the committed positions and trash, in order; the rest are free
        self._seqs = 1  # the committed prefix holds seq ids 0 .. _seqs - 1
        self._tree: DraftTree | None = None  # the last verified tree, uncommitted, in cells _end .. _end + n - 1
        self._below: np.ndarray | None = None  # its (n, m) bool: node i lies on the path to leaf j (seq id j + 1)

    @property
    def context(self) -> LlamaContext:
        return self._lease.value

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
