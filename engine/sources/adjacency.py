"""Token Recycling's adjacency table in arrays, stored and read by compiled kernels (numba): the compiled planner's
copy of TR's table (``engine.decoding.compiled_cycle``), which its tree builder reads without Python
(``engine.decoding.spine_kernel``).  ``tr.AdjacencyTable`` is the same table in dictionaries, the Python planner's;
both keep the same rows and drop the same pairs (tests/test_spine_kernel.py).

Source: Goose paper, Appendix C.1 ("Dense GPU bigram adjacency table", "Aggressive logit harvesting"), extending
Token Recycling's adjacency matrix (Luo et al., 2025) with a bigram tier.  The paper keeps the table on the GPU
beside its tree builder; ours sits on the host beside the compiled builder, so a lookup never waits for a device.

Layout (``TableArrays``, K = the table's width):
    - tier 1 (unigram): ``uni_slot[token]`` is the row slot of ``token`` (-1: never observed);
    - tier 2 (bigram): ``bigram[(prev << 32) | token]`` (a numba typed dict) is the row slot of the pair; at most
      ``capacity`` pairs are kept, the least recently written dropped first (an LRU of writes, as an
      ``OrderedDict`` moved to its end on each write), tracked by a ring of (key, stamp) writes;
    - each tier's rows: ``*_ids`` (slots, K) int64 successor ids and ``*_scores`` (slots, K) float64 scores, best
      first, ``*_len`` (slots,) int64 how many of the K are filled.

The arrays grow (doubling) before a store needs them, on the Python side: a kernel never reallocates.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
from numba import njit, types
from numba.typed import Dict

#: One table row: successor token ids and their scores, best first.
Row = tuple[tuple[int, ...], tuple[float, ...]]

_NONE = -1  # "no previous token" (the start of the sequence), and "no slot"
# counters: rows in tier 1, live pairs in tier 2, the ring's head and tail, the last stamp, free tier-2 slots
_N_UNI, _LIVE, _HEAD, _TAIL, _STAMP, _N_FREE = range(6)


class TableArrays(NamedTuple):
    """The table's arrays, as the kernels take them (see the module's docstring for the layout)."""

    uni_slot: np.ndarray  # (V_seen,) int64 token -> tier-1 slot, -1 none
    uni_ids: np.ndarray  # (slots, K) int64
    uni_scores: np.ndarray  # (slots, K) float64
    uni_len: np.ndarray  # (slots,) int64
    bi_ids: np.ndarray  # (slots, K) int64
    bi_scores: np.ndarray  # (slots, K) float64
    bi_len: np.ndarray  # (slots,) int64
    bi_stamp: np.ndarray  # (slots,) int64 the stamp of the slot's last write
    free: np.ndarray  # (slots,) int64 a stack of free tier-2 slots (counters[_N_FREE] of them)
    ring_key: np.ndarray  # (ring,) int64 tier-2 writes in order, from counters[_HEAD] to counters[_TAIL]
    ring_stamp: np.ndarray  # (ring,) int64 each write's stamp (stale when the key was written again since)
    counters: np.ndarray  # (6,) int64, see _N_UNI ... _N_FREE


@njit(cache=True)
def pair_key(prev: int, token: int) -> int:
    """The tier-2 key of (prev, token); token ids are below 2^31."""
    return (prev << 32) | token


@njit(cache=True)
def row_slot(uni_slot: np.ndarray, bigram, prev: int, token: int) -> tuple[bool, int]:
    """(in tier 2, slot) of ``token``'s row after ``prev`` (-1: none): the pair's row first, then the token's."""
    if prev != _NONE:
        key = pair_key(prev, token)
        if key in bigram:
            return True, bigram[key]
    if token < uni_slot.shape[0]:
        return False, uni_slot[token]
    return False, _NONE


@njit(cache=True)
def _store(a, bigram, settings, rows):
    """Write each row as the successors of its input token (tier 1) and of its pair (tier 2), then drop the
    least recently written pairs past the capacity.  Room was made beforehand (``ArrayTable.reserve``).

    Args:
        a: ``TableArrays``.  bigram: the tier-2 map.  settings: (capacity, renormalise).
        rows: (prev (n,) int64 the token before each row's input, -1 none; tokens (n,) int64; ids (n, k) int64;
            scores (n, k) float64).
    """
    capacity, renormalise = settings
    prev, tokens, ids, scores = rows
    for i in range(tokens.shape[0]):
        slot = _store_token(a, tokens[i], ids[i], scores[i], renormalise)
        if prev[i] != _NONE and capacity != 0:
            _store_pair(a, bigram, pair_key(prev[i], tokens[i]), slot)
    _evict(a, bigram, capacity)


@njit(cache=True)
def _store_token(a, tok, ids, scores, renormalise):
    """Tier 1: ``tok``'s row becomes ``ids`` (k,) int64 and ``scores`` (k,) float64 (over their sum when
    ``renormalise``: a softmax over the top-K logits); returns its slot."""
    k = ids.shape[0]
    total = 0.0
    if renormalise:
        for j in range(k):
            total += scores[j]
    c = a.counters
    slot = a.uni_slot[tok]
    if slot == _NONE:
        slot = c[_N_UNI]
        c[_N_UNI] += 1
        a.uni_slot[tok] = slot
    for j in range(k):
        a.uni_ids[slot, j] = ids[j]
        a.uni_scores[slot, j] = scores[j] / total if renormalise else scores[j]
    a.uni_len[slot] = k
    return slot


@njit(cache=True)
def _store_pair(a, bigram, key, slot):
    """Tier 2: the pair ``key``'s row becomes tier-1 row ``slot``'s, written now (the LRU's newest)."""
    c = a.counters
    if key in bigram:
        b = bigram[key]
    else:
        c[_N_FREE] -= 1
        b = a.free[c[_N_FREE]]
        bigram[key] = b
        c[_LIVE] += 1
    k = a.uni_len[slot]
    for j in range(k):
        a.bi_ids[b, j] = a.uni_ids[slot, j]
        a.bi_scores[b, j] = a.uni_scores[slot, j]
    a.bi_len[b] = k
    c[_STAMP] += 1
    a.bi_stamp[b] = c[_STAMP]
    a.ring_key[c[_TAIL]] = key
    a.ring_stamp[c[_TAIL]] = c[_STAMP]
    c[_TAIL] += 1


@njit(cache=True)
def _evict(a, bigram, capacity):
    """Drop the least recently written pairs past ``capacity``; a stale ring entry (its pair written since) is
    skipped."""
    c = a.counters
    while c[_LIVE] > capacity:
        key, stamp = a.ring_key[c[_HEAD]], a.ring_stamp[c[_HEAD]]
        c[_HEAD] += 1
        if key in bigram and a.bi_stamp[bigram[key]] == stamp:
            a.free[c[_N_FREE]] = bigram.pop(key)
            c[_N_FREE] += 1
            c[_LIVE] -= 1


@njit(cache=True)
def _compact_ring(bi_stamp: np.ndarray, ring_key: np.ndarray, ring_stamp: np.ndarray, counters: np.ndarray,
                  bigram) -> None:
    """Move the ring's live writes (each pair's last) to its front, in order."""
    c = counters
    out = 0
    for i in range(c[_HEAD], c[_TAIL]):
        key = ring_key[i]
        if key in bigram and bi_stamp[bigram[key]] == ring_stamp[i]:
            ring_key[out], ring_stamp[out] = key, ring_stamp[i]
            out += 1
    c[_HEAD], c[_TAIL] = 0, out


def _grown(array: np.ndarray, size: int, fill: int = 0) -> np.ndarray:
    """``array`` with its first axis at least ``size`` (doubling), new entries ``fill``."""
    if array.shape[0] >= size:
        return array
    new = np.full((max(size, 2 * array.shape[0]), *array.shape[1:]), fill, dtype=array.dtype)
    new[: array.shape[0]] = array
    return new


@njit(cache=True)
def room_for(a, top: int, n: int, capacity: int) -> bool:
    """Whether ``n`` more rows of tokens up to ``top`` fit in ``a`` (``TableArrays``) without
    ``ArrayTable.reserve`` (``_store`` never reallocates): a tier-1 slot per token, n more tier-1 rows, n free
    tier-2 slots, n more writes in the ring."""
    c = a.counters
    if top >= a.uni_slot.shape[0] or c[_N_UNI] + n > a.uni_len.shape[0]:
        return False
    return capacity == 0 or (c[_N_FREE] >= n and c[_TAIL] + n <= a.ring_key.shape[0])


class ArrayTable:
    """Token Recycling's adjacency table on the host (Goose App. C.1): for each token, the target's top-K successors
    read off the last logit row whose input it was (tier 1), and for each (previous token, token) pair the same
    (tier 2, an LRU of ``bigram_capacity`` rows); scores are probabilities in [0, 1] (``renormalise``: over the K
    alone).  ``store`` writes a forward's rows, ``row`` / ``successors`` read one, bigram first; the compiled tree
    builder reads ``arrays`` and ``bigram`` directly (``row_slot``).  One per generation, never shared.

    Args: those of ``tr.AdjacencyTable`` (``vocab_size`` kept for the record: tier 1 grows with the largest token
    seen).
    """

    def __init__(self, vocab_size: int, top_k: int = 10, bigram_capacity: int = 65536,
                 renormalise: bool = False) -> None:
        self.vocab_size = vocab_size
        self.top_k = top_k
        self.bigram_capacity = bigram_capacity
        self.renormalise = renormalise
        k = top_k
        self.bigram = Dict.empty(types.int64, types.int64)  # (prev << 32) | token -> tier-2 slot
        self.arrays = TableArrays(
            uni_slot=np.full(0, _NONE, np.int64), uni_ids=np.zeros((0, k), np.int64),
            uni_scores=np.zeros((0, k), np.float64), uni_len=np.zeros(0, np.int64),
            bi_ids=np.zeros((0, k), np.int64), bi_scores=np.zeros((0, k), np.float64), bi_len=np.zeros(0, np.int64),
            bi_stamp=np.zeros(0, np.int64), free=np.zeros(0, np.int64), ring_key=np.zeros(0, np.int64),
            ring_stamp=np.zeros(0, np.int64), counters=np.zeros(6, np.int64))

    def __len__(self) -> int:
        """Pairs in tier 2 now."""
        return int(self.arrays.counters[_LIVE])

    def has_pair(self, prev: int, token: int) -> bool:
        """Whether tier 2 holds a row for (prev, token)."""
        return (prev << 32) | token in self.bigram

    def store(self, prev_tokens: Sequence[int | None], tokens: Sequence[int], ids: Sequence[Sequence[int]],
              scores: Sequence[Sequence[float]]) -> None:
        """``tr.AdjacencyTable.store`` (the same arguments; rows wider than K widen the table), by ``_store``."""
        n = len(tokens)
        if n == 0:
            return
        prev = np.array([_NONE if p is None else p for p in prev_tokens], np.int64)  # (n,)
        toks = np.array(tokens, np.int64)  # (n,)
        row_ids = np.asarray(ids, np.int64).reshape(n, -1)  # (n, k): a read-back's array as it is
        row_scores = np.asarray(scores, np.float64).reshape(n, -1)  # (n, k)
        if row_ids.shape[1] > self.arrays.uni_ids.shape[1]:  # rows wider than K (another source reads more)
            self._widen(row_ids.shape[1])
        self._make_room(toks, n)
        _store(self.arrays, self.bigram, (self.bigram_capacity, self.renormalise), (prev, toks, row_ids, row_scores))

    def _widen(self, k: int) -> None:
        """Every row array ``k`` columns wide."""
        a = self.arrays

        def wide(array: np.ndarray) -> np.ndarray:
            new = np.zeros((array.shape[0], k), array.dtype)
            new[:, : array.shape[1]] = array
            return new

        self.arrays = a._replace(uni_ids=wide(a.uni_ids), uni_scores=wide(a.uni_scores), bi_ids=wide(a.bi_ids),
                                 bi_scores=wide(a.bi_scores))

    def reserve(self, top: int, n: int) -> None:
        """Room for ``n`` more rows of tokens up to ``top`` (a compiled caller's ``_store`` never reallocates)."""
        self._make_room(np.array([top], np.int64), n)

    def _make_room(self, tokens: np.ndarray, n: int) -> None:
        """Grow the arrays so ``n`` more rows fit (``_store`` never reallocates); most stores find the room there."""
        a = self.arrays
        c = a.counters
        top = int(tokens.max())
        if top >= a.uni_slot.shape[0] or c[_N_UNI] + n > a.uni_len.shape[0]:  # tier 1: n more rows, each token a slot
            rows = int(c[_N_UNI]) + n
            a = a._replace(uni_slot=_grown(a.uni_slot, top + 1, _NONE), uni_ids=_grown(a.uni_ids, rows),
                           uni_scores=_grown(a.uni_scores, rows), uni_len=_grown(a.uni_len, rows))
        if self.bigram_capacity and c[_N_FREE] < n:  # tier 2: n more free slots
            old = a.bi_len.shape[0]
            size = old + n - int(c[_N_FREE])
            a = a._replace(bi_ids=_grown(a.bi_ids, size), bi_scores=_grown(a.bi_scores, size),
                           bi_len=_grown(a.bi_len, size), bi_stamp=_grown(a.bi_stamp, size))
            new = a.bi_len.shape[0]
            free = _grown(a.free, new)
            free[c[_N_FREE]: c[_N_FREE] + new - old] = np.arange(new - 1, old - 1, -1)  # the lowest slot on top
            c[_N_FREE] += new - old
            a = a._replace(free=free)
        if self.bigram_capacity and c[_TAIL] + n > a.ring_key.shape[0]:  # the ring: n more writes
            _compact_ring(a.bi_stamp, a.ring_key, a.ring_stamp, a.counters, self.bigram)
            if c[_TAIL] + n > a.ring_key.shape[0]:
                a = a._replace(ring_key=_grown(a.ring_key, int(c[_TAIL]) + n),
                               ring_stamp=_grown(a.ring_stamp, int(c[_TAIL]) + n))
        self.arrays = a

    def row(self, prev: int | None, token: int) -> Row | None:
        """The stored row of ``token`` (bigram tier first, then unigram), or None when never observed."""
        a = self.arrays
        if prev is not None and self.bigram_capacity:
            slot = self.bigram.get((prev << 32) | token)
            if slot is not None:
                n = a.bi_len[slot]
                return tuple(a.bi_ids[slot, :n].tolist()), tuple(a.bi_scores[slot, :n].tolist())
        slot = a.uni_slot[token] if 0 <= token < a.uni_slot.shape[0] else _NONE
        if slot == _NONE:
            return None
        n = a.uni_len[slot]
        return tuple(a.uni_ids[slot, :n].tolist()), tuple(a.uni_scores[slot, :n].tolist())

