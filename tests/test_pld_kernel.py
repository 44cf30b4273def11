"""The compiled PLD matcher (engine/sources/pld_kernel.py) against its Python statement (engine/sources/pld.py and
``base.extend_chain``): the same matches, confidences, chains and estimates, bit for bit, on random streams (small
vocabularies and copied spans, so repeats, ties, unanimity and consensus all occur), random settings and counters,
hash keys narrowed until they all collide, and a code snippet's tokens."""
from __future__ import annotations

import inspect
import random
import re
from collections import Counter

import numpy as np
from numba import njit

from engine.core.estimates import AcceptanceStats, DepthCounter
from engine.decoding.config import DecodeConfig
from engine.sources import Candidates, Request, SourceMemory
from engine.sources import pld_kernel as kernel
from engine.sources.base import extend_chain
from engine.sources.pld import OCCURRENCES, NgramIndex, PldSource, match_confidence
from engine.sources.pld_kernel import DMAX, SRC_ANCHOR, SRC_PLD, SRC_TR, PldArrays, depth_arrays

SIZES = [(5, 4, 3), (5, 4, 3), (3,), (4, 2), (6, 3, 1), (3, 3, 2), (2, 1), (1,)]
MASKS = [-1, -1, -1, 3, 0]  # 0: every n-gram's key is 0, one chain holds them all


def bits(c: Candidates) -> tuple:
    """Every field of a proposal, floats as their bits."""
    return (c.tokens, c.parents, tuple(x.hex() for x in c.p), tuple(x.hex() for x in c.scores), c.match,
            c.confidence.hex(), c.consensus, c.rows)


def grow_stream(rng: random.Random, tokens: list[int], vocab: int) -> list[int]:
    """New tokens: random ones, or a span copied from earlier (possibly cut short or with a changed token)."""
    if tokens and rng.random() < 0.5:
        start = rng.randrange(len(tokens))
        span = tokens[start: start + rng.randint(1, 25)]
        if span and rng.random() < 0.3:
            span[rng.randrange(len(span))] = rng.randrange(vocab)
        return span
    return [rng.randrange(vocab) for _ in range(rng.choice([0, 1, 1, 2, 3, 5, 9]))]


def suffix_of(rng: random.Random, tokens: list[int], vocab: int) -> list[int] | None:
    """A query: none (the sequence), its tail plus a drafted path past it, or a short random one."""
    kind = rng.random()
    if kind < 0.3:
        return None
    if kind < 0.85:
        path = [rng.randrange(vocab) for _ in range(rng.choice([0, 1, 2, 4, 8]))]
        return tokens[len(tokens) - rng.randint(0, 7):] + path
    return [rng.randrange(vocab) for _ in range(rng.randint(0, 3))]


def _same_matches(seed: int) -> Counter:
    rng = random.Random(seed)
    sizes, occurrence, vocab = rng.choice(SIZES), rng.choice(OCCURRENCES), rng.choice([2, 3, 4, 6, 12, 50])
    ref, arr = NgramIndex(sizes, occurrence), PldArrays(sizes, occurrence, hash_mask=rng.choice(MASKS))
    seen = Counter()
    length = rng.randint(20, 260)
    while len(ref.tokens) < length:
        new = grow_stream(rng, ref.tokens, vocab)
        ref.extend(new)
        arr.extend(new)
        for _ in range(3):
            max_len, suffix = rng.choice([1, 2, 5, 20, 40]), suffix_of(rng, ref.tokens, vocab)
            want = ref.match(max_len, suffix)
            assert arr.match(max_len, suffix) == want, (seed, len(ref.tokens), max_len, suffix)
            seen.update(match=bool(want.draft), unanimous=want.unanimous, consensus=want.consensus,
                        past=bool(want.draft) and suffix is not None and len(suffix) > 0)
    assert arr.tokens == ref.tokens
    a = arr.arrays
    chained = a.ent[: a.meta[kernel._N_ENTRIES], kernel._CHAIN] != -1  # entries sharing a key with an earlier one
    seen["chained"] += int(chained.sum())
    return seen


def test_index_matches_the_python_index():
    seen = sum((_same_matches(seed) for seed in range(160)), Counter())
    # not vacuous: thousands of matches, hundreds unanimous or in consensus, thousands of colliding keys
    assert seen["match"] >= 3000 and seen["unanimous"] >= 300 and seen["consensus"] >= 1000, seen
    assert seen["past"] >= 1000 and seen["chained"] >= 1000, seen


def test_match_confidence_is_the_python_one():
    for length in range(-1, 42):
        for long_match in range(1, 13):
            for max_len in range(1, 31):
                for unanimous in (False, True):
                    want = match_confidence(length, unanimous, long_match, max_len)
                    assert kernel.match_confidence(length, unanimous, long_match, max_len).hex() == want.hex()


def random_source(rng: random.Random) -> tuple[PldSource, DepthCounter]:
    cfg = DecodeConfig.of(method=rng.choice(["goose", "goose", "pld"]), ngram_sizes=rng.choice(SIZES),
                          match_occurrence=rng.choice(["auto", *OCCURRENCES]), max_spine=rng.choice([1, 4, 20, 32]),
                          pld_chain_tokens=rng.choice([1, 3, 10, 20]), pooled_pld_prior=rng.random() < 0.7,
                          bypass_threshold=rng.choice([1, 4, 8, 12]), confidence_schedule=rng.random() < 0.7)
    stats = AcceptanceStats()
    return PldSource(cfg, stats, SourceMemory()), stats.counter(PldSource.info.source)


def count_at_random(rng: random.Random, counter: DepthCounter) -> None:
    for _ in range(rng.randint(0, 12)):
        counter.add(rng.randrange(1, 60), rng.random() < 0.6, rng.random())


def arrays_of(rng: random.Random, pld: DepthCounter):
    """The counter arrays: PLD's row, and other rows the kernels must not read."""
    others = {src: DepthCounter() for src in (SRC_ANCHOR, SRC_TR)}
    for c in others.values():
        count_at_random(rng, c)
    return depth_arrays({**others, SRC_PLD: pld})


def _same_proposals(seed: int) -> Counter:
    rng = random.Random(seed)
    src, counter = random_source(rng)
    arr, vocab = PldArrays.like(src, hash_mask=rng.choice(MASKS)), rng.choice([2, 3, 5, 12])
    context, seen = [], Counter()
    count_at_random(rng, counter)
    depth = arrays_of(rng, counter)
    while len(context) < rng.randint(30, 200):
        context = context + grow_stream(rng, context, vocab)
        if rng.random() < 0.3:
            count_at_random(rng, counter)
            depth = arrays_of(rng, counter)
        if not context:
            continue
        first = src.propose(Request(tuple(context), (), rng.randint(1, 40)))
        for path in ((), first.tokens, first.tokens[: rng.randint(0, 3)],
                     tuple(rng.randrange(vocab) for _ in range(rng.randint(1, 6)))):
            request = Request(tuple(context), path, rng.randint(1, 40))
            want = src.propose(request)
            assert bits(arr.propose(request, depth)) == bits(want), (seed, request)
            seen.update(proposed=bool(want), below=bool(want) and bool(path), saturated=want.confidence == 1.0)
        if len(first):
            seen += _same_growth(rng, src, arr, (context, first), depth)
    return seen


def _same_growth(rng: random.Random, src: PldSource, arr: PldArrays, asked: tuple, depth) -> Counter:
    """``extend_chain`` both ways, from the chain proposed at the anchor."""
    context, chain = asked
    limit, budget = rng.choice([1, 5, 20, 40, 90]), rng.randint(1, 40)
    saturated = chain.confidence >= 1.0 if rng.random() < 0.5 else rng.random() < 0.5
    want = extend_chain(src, context, chain, limit, budget, saturated)
    assert bits(arr.extend_chain(context, chain, limit, budget, saturated, depth)) == bits(want)
    return Counter(grown=len(want) > len(chain), stopped_saturated=saturated and len(chain) < len(want) < limit)


def test_proposals_and_grown_chains_are_the_sources():
    seen = sum((_same_proposals(seed) for seed in range(60)), Counter())
    assert seen["proposed"] >= 1000 and seen["below"] >= 500 and seen["saturated"] >= 100, seen
    assert seen["grown"] >= 150 and seen["stopped_saturated"] >= 10, seen


def code_tokens() -> list[int]:
    """A code snippet's words and symbols as ids, repeated as a model rewrites code: as is, with a name changed,
    as is again."""
    text = inspect.getsource(NgramIndex.match)
    ids: dict[str, int] = {}
    stream = []
    for version in (text, text.replace("query", "q"), text):
        stream += [ids.setdefault(w, len(ids)) for w in re.findall(r"\w+|[^\w\s]", version)]
    return stream


def test_a_code_snippet_decodes_alike():
    stream = code_tokens()
    cfg = DecodeConfig.of(method="goose", max_spine=20, bypass_threshold=8)
    src = PldSource(cfg, AcceptanceStats(), SourceMemory())
    counter, rng = src.counter, random.Random(0)
    arr, seen = PldArrays.like(src), Counter()
    for end in range(2, len(stream)):
        context = stream[:end]
        depth = arrays_of(rng, counter)
        chain = src.propose(Request(context, (), 64))
        assert bits(arr.propose(Request(context, (), 64), depth)) == bits(chain)
        if len(chain):
            seen += _same_growth(rng, src, arr, (context, chain), depth)
            seen.update(long=len(chain) >= 8, saturated=chain.confidence == 1.0, consensus=chain.consensus)
        counter.add(rng.randrange(1, 30), rng.random() < 0.8, 0.5)
    assert seen["long"] >= 400 and seen["saturated"] >= 150 and seen["consensus"] >= 400 and seen["grown"] >= 150, seen


@njit
def _driver(idx, s, depth, context, out, plan):
    """What the compiled cycle does: propose at the anchor, then grow the chain, all in one compiled call."""
    m, n, confidence, consensus = kernel.propose(idx, s, depth, (context, context[:0]), plan[1], out)
    if m == 0:
        return 0, 0, 0.0, False
    return kernel.extend_chain(idx, s, depth, context, out, (m, plan[0], plan[1], plan[2])), n, confidence, consensus


def test_the_kernels_run_inside_another_compiled_function():
    stream = code_tokens()
    ref = PldSource(DecodeConfig.of(method="goose"), AcceptanceStats(), SourceMemory())
    arr, depth = PldArrays.like(ref), depth_arrays({})
    arr.reserve(len(stream))
    grown = 0
    for end in range(40, len(stream), 3):
        context = stream[:end]
        chain = ref.propose(Request(context, (), 30))
        want = extend_chain(ref, context, chain, 50, 30, False) if len(chain) else chain
        out = (np.zeros(50 + 30, np.int64), np.zeros(50 + 30, np.float64))
        length, n, confidence, consensus = _driver(arr.arrays, arr.settings, depth, np.array(context, np.int64), out,
                                                   (50, 30, 0))
        got = Candidates.chain(out[0][:length].tolist(), out[1][:length].tolist(), match=int(n),
                               confidence=float(confidence), consensus=bool(consensus)) if length else Candidates()
        assert bits(got) == bits(want)
        grown += len(want) > len(chain)
    assert grown >= 20 and DMAX == 256
