"""PLD's context matcher compiled (numba): the n-gram index, the match confidence, the chain ``PldSource.propose``
returns and its growth by re-asking below it, over preallocated arrays, so a cycle's lookups cost no Python
(issue 71: one compiled entry per decoding cycle).

Source: Goose paper, Appendix B.2 (CONTEXTMATCH) and §4.3 (the confidence signal, and the chain grown past one
lookup, ``engine.sources.base.extend_chain``); PLD itself is Saxena (2023).  ``pld.py`` states the same in Python
(``NgramIndex``, ``match_confidence``, ``PldSource.propose``); these kernels are its exact equivalent, draft for
draft and estimate for estimate, bit for bit (tests/test_pld_kernel.py compares them).  The two must change together.

The index (``NgramArrays``), K = the distinct n-gram sizes, longest first:
    - ``tokens[:meta[_N_TOKENS]]`` the indexed sequence;
    - one entry per distinct n-gram seen (any n): a row of ``ent`` holding its n, its first and last end positions,
      how many times it ended, the token after its first end, whether some later end was followed by another
      token (so unanimity is read, never rescanned), and the next entry sharing its hash key;
    - ``table``, a numba typed dict: the int64 hash of (n, the n tokens), cut to ``meta[_MASK]``, to the last entry
      made with that key; entries sharing a key are chained (``_CHAIN``) and told apart by n and their tokens, so
      identity is exact, never probabilistic (tests narrow the mask to make every key collide);
    - per position p and size k: ``prev_end[p, k]`` the previous end of the n-gram ending at p (-1: none), and
      ``entry_of[p, k]`` its entry, so the latest occurrence and the token after each end are found in O(1).

A lookup hashes n tokens per size and follows one chain; ``extend`` does the same per new token.  The arrays grow
(doubling) on the Python side before a kernel needs room (``PldArrays.reserve``): a kernel never reallocates.

Depth counters are arrays here (the compiled cycle's convention): ``reached[src, d]``, ``accepted[src, d]`` int64
and ``score_sum[src, d]`` float64, shape (3, DMAX), source codes ``SRC_ANCHOR``, ``SRC_PLD``, ``SRC_TR``; they hold
what ``DepthCounter``'s dictionaries hold (``depth_arrays``), a depth past DMAX reading as never reached.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np
from numba import njit, types
from numba.typed import Dict

from ..core.estimates import DepthCounter
from .base import Candidates, Request
from .pld import OCCURRENCES, PldMatch, PldSource
from .pld import match_confidence as _match_confidence

DMAX = 256  # depths the counter arrays hold
SRC_ANCHOR, SRC_PLD, SRC_TR = 0, 1, 2  # the counter arrays' source rows
_NONE = -1
# meta: indexed tokens, entries made, the hash mask, the occurrence copied (0 earliest, 1 latest)
_N_TOKENS, _N_ENTRIES, _MASK, _OCCURRENCE = range(4)
# an entry's fields: n, first end, last end, ends, token after the first end, another follower seen, next in its chain
_N, _HEAD, _TAIL, _COUNT, _FOLLOW, _MIXED, _CHAIN = range(7)
_MIX1, _MIX2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9)  # odd multipliers of the hash


class NgramArrays(NamedTuple):
    """The index's arrays, as the kernels take them (see the module's docstring): one argument, so each kernel keeps
    to six (numba unboxes a tuple of arrays slower from Python than the arrays one by one; a compiled caller, the
    cycle's driver, passes it for free)."""

    tokens: np.ndarray  # (cap,) int64 the indexed sequence, its first meta[_N_TOKENS] filled
    meta: np.ndarray  # (4,) int64, see _N_TOKENS ... _OCCURRENCE
    sizes: np.ndarray  # (K,) int64 distinct n-gram sizes, longest first
    mult: np.ndarray  # (K,) int64 how many times each is listed (``NgramIndex`` indexes a repeated size twice)
    ent: np.ndarray  # (entries, 7) int64, see _N ... _CHAIN
    prev_end: np.ndarray  # (cap, K) int64
    entry_of: np.ndarray  # (cap, K) int64
    table: Dict  # int64 hash key -> int64 entry, the last made with that key


class PldSettings(NamedTuple):
    """What ``PldSource.propose`` reads of its settings (all scalars)."""

    chain_tokens: int  # one lookup's length
    alone: bool  # the PLD method: a lookup copies chain_tokens whatever the budget
    long_match: int  # ``TreeShape.bypass_threshold``: a long match for ``match_confidence``
    max_spine: int  # ``TreeShape.max_spine``: where ``match_confidence`` reaches 0.9
    pooled_prior: bool  # per-depth estimates shrink to the pooled PLD rate, not 0.5


class DepthArrays(NamedTuple):
    """The depth counters of the compiled cycle, one row per source code."""

    reached: np.ndarray  # (3, DMAX) int64
    accepted: np.ndarray  # (3, DMAX) int64
    score_sum: np.ndarray  # (3, DMAX) float64


@njit(cache=True)
def _at(a, b, i):
    """Token i of the sequence a + b."""
    return a[i] if i < a.shape[0] else b[i - a.shape[0]]


@njit(cache=True)
def _find(idx, n, a, b):
    """(key, entry) of the last n tokens of a + b ((n,) at least): the table key of the n-gram, and its entry
    (-1: never indexed).  The key mixes n and the tokens; entries sharing it are told apart by n and tokens."""
    total = a.shape[0] + b.shape[0]
    h = np.uint64(n) * _MIX1
    for i in range(total - n, total):
        h = (h ^ np.uint64(_at(a, b, i))) * _MIX2
        h ^= h >> np.uint64(29)
    key = np.int64(h) & idx.meta[_MASK]
    e = idx.table[key] if key in idx.table else _NONE
    while e != _NONE:
        if idx.ent[e, _N] == n:
            head = idx.ent[e, _HEAD]
            j = 0
            while j < n and idx.tokens[head - n + 1 + j] == _at(a, b, total - n + j):
                j += 1
            if j == n:
                return key, e
        e = idx.ent[e, _CHAIN]
    return key, e


@njit(cache=True)
def _index_end(idx, k, p):
    """Index the size-k n-gram ending at position p (its tokens already in place)."""
    n = idx.sizes[k]
    key, e = _find(idx, n, idx.tokens[: p + 1], idx.tokens[:0])
    ent = idx.ent
    if e == _NONE:
        e = idx.meta[_N_ENTRIES]
        idx.meta[_N_ENTRIES] = e + 1
        ent[e, _N], ent[e, _HEAD], ent[e, _COUNT], ent[e, _FOLLOW], ent[e, _MIXED] = n, p, 0, _NONE, 0
        ent[e, _CHAIN] = idx.table[key] if key in idx.table else _NONE
        idx.table[key] = e
        idx.prev_end[p, k] = _NONE
    else:
        idx.prev_end[p, k] = ent[e, _TAIL]
    ent[e, _TAIL] = p
    ent[e, _COUNT] += 1
    idx.entry_of[p, k] = e


@njit(cache=True)
def extend(idx, new):
    """``NgramIndex.extend``: append ``new`` ((m,) int64) and index every n-gram ending at one of its tokens; each
    new token is also the follower of the n-grams ending just before it (their entries' unanimity).  Room for m
    more tokens and K * m more entries was made beforehand (``PldArrays.reserve``)."""
    start = idx.meta[_N_TOKENS]
    for j in range(new.shape[0]):
        p = start + j
        t = new[j]
        idx.tokens[p] = t
        idx.meta[_N_TOKENS] = p + 1
        for k in range(idx.sizes.shape[0]):
            n = idx.sizes[k]
            if p >= n:  # an n-gram ended at p - 1: t follows it
                e = idx.entry_of[p - 1, k]
                if idx.ent[e, _HEAD] == p - 1:
                    idx.ent[e, _FOLLOW] = t
                elif t != idx.ent[e, _FOLLOW]:
                    idx.ent[e, _MIXED] = 1
            if p + 1 >= n:
                _index_end(idx, k, p)


@njit(cache=True)
def match(idx, max_len, a, b, out):
    """``NgramIndex.match``: look up the last n tokens of the query a + b, longest n first, the draft copied into
    ``out`` ((max_len,) int64 at least).  ``b`` may run past the indexed tokens (a drafted path; the Python's
    ``suffix``), and a + b is the Python's query (the indexed tokens themselves when it has no suffix).

    Only occurrences ending before the last indexed token count; for each n the earliest (or latest, per
    ``meta[_OCCURRENCE]``) supplies up to ``max_len`` (>= 1) continuation tokens.  Returns (draft length, n,
    consensus, unanimous), as ``PldMatch`` defines them (0, 0, False, False without a match).
    """
    if max_len < 1:
        raise ValueError("max_len must be >= 1")
    n_tok = idx.meta[_N_TOKENS]
    last = n_tok - 1  # an occurrence ending here has nothing after it to copy
    total = a.shape[0] + b.shape[0]
    m, best_n, unanimous, first, agree = 0, 0, False, _NONE, 0
    for k in range(idx.sizes.shape[0]):
        n = idx.sizes[k]
        if total < n:
            continue
        e = _find(idx, n, a, b)[1]
        if e == _NONE:
            continue
        tail = idx.ent[e, _TAIL]
        ends = idx.ent[e, _COUNT] - (tail == last)
        if ends == 0:
            continue
        if idx.meta[_OCCURRENCE] == 0:
            end = idx.ent[e, _HEAD]
        else:
            end = tail if tail != last else idx.prev_end[tail, k]
        if m == 0:
            m, best_n, first = min(max_len, last - end), n, idx.tokens[end + 1]
            if m > out.shape[0]:
                raise ValueError("the output array is shorter than the draft")
            out[:m] = idx.tokens[end + 1: end + 1 + m]
            unanimous = ends * idx.mult[k] >= 2 and idx.ent[e, _MIXED] == 0
        if idx.tokens[end + 1] == first:
            agree += idx.mult[k]
    return m, best_n, m > 0 and agree >= 2, unanimous


#: ``pld.match_confidence`` compiled as it stands (Goose §4.3): the same floats in the same order, one statement.
match_confidence = njit(cache=True)(_match_confidence)


@njit(cache=True)
def rate(depth, src, d, prior):
    """``DepthCounter.rate(d, prior)`` (weight 2) of source row ``src`` of ``depth`` (``DepthArrays``)."""
    reached, accepted = depth[0], depth[1]
    if d < reached.shape[1]:
        return (accepted[src, d] + 2.0 * prior) / (reached[src, d] + 2.0)
    return (0 + 2.0 * prior) / (0 + 2.0)


@njit(cache=True)
def pooled(depth, src):
    """``DepthCounter.pooled()`` of source row ``src``: acceptance over all depths, Beta(1, 1) prior."""
    return (depth[1][src].sum() + 1) / (depth[0][src].sum() + 2)


@njit(cache=True)
def propose(idx, s, depth, query, budget, out):
    """``PldSource.propose`` for a request of ``query`` = (context, path) ((c,), (d,) int64) and ``budget``: the index
    catches up with the context (room made beforehand), then the chain is written into ``out`` = (tokens, p)
    ((max_len,) int64, (max_len,) float64 at least, max_len = ``s.chain_tokens``, or at most ``budget`` in a tree),
    p the PLD rate at each depth (``rate``, prior ``pooled`` or 0.5).

    Args: ``s`` the ``PldSettings``; ``depth`` the ``DepthArrays`` (row ``SRC_PLD`` read).
    Returns (chain length, match n, confidence, consensus); (0, 0, 0.0, False) without a match.
    """
    return _propose(idx, s, depth, query, out, (budget, _prior(s, depth)))


@njit(cache=True)
def _prior(s, depth):
    """``PldSource.prior``: the mean of each depth's Beta prior, the rate pooled over all depths or 0.5 (a sum over
    the counters' depths: computed once per lookup, or once per chain extension, whose lookups share it)."""
    return pooled(depth, SRC_PLD) if s.pooled_prior else 0.5


@njit(cache=True)
def _propose(idx, s, depth, query, out, ask):
    """``propose`` with ``ask`` = (budget, the prior: ``_prior``)."""
    budget, prior = ask
    context, path = query
    if context.shape[0] > idx.meta[_N_TOKENS]:  # the tokens committed since last asked
        extend(idx, context[idx.meta[_N_TOKENS]:])
    max_len = s.chain_tokens if s.alone else min(s.chain_tokens, budget)
    if path.shape[0] == 0:  # the Python matches its index's own tokens
        m, n, consensus, unanimous = match(idx, max_len, idx.tokens[: idx.meta[_N_TOKENS]], path, out[0])
    else:  # the tail of context + path
        m, n, consensus, unanimous = match(idx, max_len, context, path, out[0])
    if m == 0:
        return 0, 0, 0.0, False
    confidence = match_confidence(m, unanimous, s.long_match, s.max_spine)
    first = path.shape[0] + 1
    for i in range(m):
        out[1][i] = rate(depth, SRC_PLD, first + i, prior)
    return m, n, confidence, consensus


@njit(cache=True)
def extend_chain(idx, s, depth, context, out, plan):
    """``base.extend_chain`` for PLD (Goose §4.3, as the authors' code): the chain of ``plan[0]`` tokens in
    ``out`` = (tokens, p) ((cap,) int64, (cap,) float64) grows by ``propose`` below it while shorter than
    ``plan[1]`` (limit), each lookup with budget ``plan[2]``; when ``plan[3]`` (saturated) is nonzero, growth stops
    after the first lookup whose confidence is below 1.0.  ``context``: (c,) int64.  cap >= limit - 1 + one
    lookup's length.  Returns the grown chain's length (its match facts are the original chain's)."""
    length, limit, budget, saturated = plan
    tokens, p = out
    max_len = s.chain_tokens if s.alone else min(s.chain_tokens, budget)
    prior = _prior(s, depth)  # the counters do not change while the chain grows
    while length < limit:
        if length + max_len > tokens.shape[0]:
            raise ValueError("the output arrays are too short for the chain's growth")
        m, _, confidence, _ = _propose(idx, s, depth, (context, tokens[:length]), (tokens[length:], p[length:]),
                                       (budget, prior))
        if m == 0:
            break
        length += m
        if saturated and confidence < 1.0:
            break
    return length


def _room(array: np.ndarray, size: int, fill: int = 0) -> np.ndarray:
    """``array`` with its first axis at least ``size`` (doubling), new entries ``fill``."""
    if array.shape[0] >= size:
        return array
    new = np.full((max(size, 2 * array.shape[0]), *array.shape[1:]), fill, array.dtype)
    new[: array.shape[0]] = array
    return new


def depth_arrays(counters: Mapping[int, DepthCounter]) -> DepthArrays:
    """The counter arrays holding each source code's ``DepthCounter`` (codes absent: empty rows).  Raises ValueError
    for a depth the arrays do not hold (>= DMAX)."""
    reached, accepted = np.zeros((3, DMAX), np.int64), np.zeros((3, DMAX), np.int64)
    score_sum = np.zeros((3, DMAX), np.float64)
    for src, c in counters.items():
        for d in {*c.reached, *c.accepted, *c.score_sum}:
            if not 0 <= d < DMAX:
                raise ValueError(f"depth {d} is outside the counter arrays (0 to {DMAX - 1})")
            reached[src, d], accepted[src, d] = c.reached.get(d, 0), c.accepted.get(d, 0)
            score_sum[src, d] = c.score_sum.get(d, 0.0)
    return DepthArrays(reached, accepted, score_sum)


def _ints(tokens: Sequence[int]) -> np.ndarray:
    return np.ascontiguousarray(tokens, np.int64).reshape(-1)


class PldArrays:
    """PLD's index and settings in arrays, with ``NgramIndex``'s and ``PldSource``'s calls on top of the kernels
    (the tests', and the compiled cycle's state: ``arrays`` and ``settings`` go to its kernels as they are).

    Args:
        ngram_sizes: query lengths n, any order (queried longest first; a size listed twice counts twice, as in
            ``NgramIndex``).
        occurrence: "earliest" or "latest" (``OCCURRENCES``).
        settings: ``propose``'s (``PldSettings``); None: the defaults of a PLD in a tree.
        hash_mask: bits of the hash kept as the table key (tests narrow it so that keys collide).
    """

    def __init__(self, ngram_sizes: Sequence[int] = (5, 4, 3), occurrence: str = "earliest",
                 settings: PldSettings | None = None, hash_mask: int = -1) -> None:
        if occurrence not in OCCURRENCES:
            raise ValueError(f"occurrence must be one of {', '.join(OCCURRENCES)} (got {occurrence!r})")
        sizes = sorted(set(ngram_sizes), reverse=True)
        k = len(sizes)
        self.settings = settings or PldSettings(20, False, 8, 20, True)
        self.arrays = NgramArrays(
            tokens=np.zeros(0, np.int64), meta=np.array([0, 0, hash_mask, OCCURRENCES.index(occurrence)], np.int64),
            sizes=np.array(sizes, np.int64), mult=np.array([list(ngram_sizes).count(n) for n in sizes], np.int64),
            ent=np.zeros((0, 7), np.int64), prev_end=np.zeros((0, k), np.int64), entry_of=np.zeros((0, k), np.int64),
            table=Dict.empty(types.int64, types.int64))

    @classmethod
    def like(cls, source: PldSource, hash_mask: int = -1) -> PldArrays:
        """Empty arrays with ``source``'s sizes, occurrence and settings."""
        s = PldSettings(source.chain_tokens, source.alone, source.long_match, source.max_spine, source.pooled_prior)
        return cls(source.index.ngram_sizes, source.index.occurrence, s, hash_mask)

    def __len__(self) -> int:
        """Tokens indexed."""
        return int(self.arrays.meta[_N_TOKENS])

    @property
    def tokens(self) -> list[int]:
        return self.arrays.tokens[: len(self)].tolist()

    def reserve(self, more: int) -> None:
        """Grow the arrays so ``more`` tokens can be indexed (``extend`` never reallocates)."""
        a, n = self.arrays, len(self) + max(0, more)
        entries = int(a.meta[_N_ENTRIES]) + a.sizes.shape[0] * max(0, more)
        self.arrays = a._replace(tokens=_room(a.tokens, n), ent=_room(a.ent, entries),
                                 prev_end=_room(a.prev_end, n, _NONE), entry_of=_room(a.entry_of, n, _NONE))

    def extend(self, new_tokens: Sequence[int]) -> None:
        """``NgramIndex.extend``."""
        new = _ints(new_tokens)
        self.reserve(new.shape[0])
        extend(self.arrays, new)

    def match(self, max_len: int, suffix: Sequence[int] | None = None) -> PldMatch:
        """``NgramIndex.match``."""
        a = self.arrays.tokens[: len(self)] if suffix is None else _ints(suffix)
        draft = np.zeros(max(max_len, 0), np.int64)
        m, n, consensus, unanimous = match(self.arrays, max_len, a, a[:0], draft)
        return PldMatch(tuple(draft[:m].tolist()), int(n), bool(consensus), bool(unanimous))

    def _max_len(self, budget: int) -> int:
        s = self.settings
        return s.chain_tokens if s.alone else min(s.chain_tokens, budget)

    def propose(self, request: Request, depth: DepthArrays) -> Candidates:
        """``PldSource.propose``, the estimates read off ``depth`` (row ``SRC_PLD``)."""
        context = _ints(request.context)
        self.reserve(context.shape[0] - len(self))
        size = max(self._max_len(request.budget), 0)
        out = (np.zeros(size, np.int64), np.zeros(size, np.float64))
        m, n, confidence, consensus = propose(self.arrays, self.settings, depth, (context, _ints(request.path)),
                                              request.budget, out)
        if m == 0:
            return Candidates()
        return Candidates.chain(out[0][:m].tolist(), out[1][:m].tolist(), match=int(n), confidence=float(confidence),
                                consensus=bool(consensus))

    def extend_chain(self, context: Sequence[int], chain: Candidates, limit: int, budget: int, saturated: bool,
                     depth: DepthArrays) -> Candidates:
        """``base.extend_chain(self, context, chain, limit, budget, saturated)``, the estimates read off ``depth``;
        ``chain`` is a chain (its main path)."""
        ctx = _ints(context)
        self.reserve(ctx.shape[0] - len(self))
        cap = max(limit, len(chain)) + max(self._max_len(budget), 0)
        out = (np.zeros(cap, np.int64), np.zeros(cap, np.float64))
        out[0][: len(chain)], out[1][: len(chain)] = chain.tokens, chain.p
        length = extend_chain(self.arrays, self.settings, depth, ctx, out, (len(chain), limit, budget, int(saturated)))
        return Candidates.chain(out[0][:length].tolist(), out[1][:length].tolist(), match=chain.match,
                                confidence=chain.confidence, consensus=chain.consensus)
