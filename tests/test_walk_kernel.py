"""The compiled greedy walk and commit cut (engine/decoding/walk_kernel.py) against their Python statement
(``verify.greedy_walk``, ``SpecDecoder._append``), on random trees: the same accepted path and bonus, the same
tokens kept."""
from __future__ import annotations

import random

import numpy as np

from engine.core.tree import DraftTree, Source
from engine.core.verify import greedy_walk
from engine.decoding.walk_kernel import cut
from engine.decoding.walk_kernel import greedy_walk as compiled_walk
from tests.test_tree import PRIORITY

CODES = (Source.ROOT, Source("pld"), Source("tr"), Source.PAD)  # the compiled cycle's source codes 0-2, then padding


def _random_tree(rng: random.Random, n: int) -> DraftTree:
    parents = [None] + [rng.randrange(i) if rng.random() < 0.7 else max(0, i - 1) for i in range(1, n)]
    tokens = [rng.randrange(6) for _ in range(n)]  # a small vocabulary: siblings may share a token
    sources = [Source.ROOT] + [rng.choice(CODES[1:]) for _ in range(1, n)]
    return DraftTree(tuple(tokens), tuple(parents), tuple(sources), (1.0,) * n, (1.0,) * n)


def test_walk_matches_python():
    rank = np.array([-1, PRIORITY.index(Source("pld")), PRIORITY.index(Source("tr")), -1], np.int64)
    long_paths = 0
    for seed in range(3000):
        rng = random.Random(seed)
        tree = _random_tree(rng, rng.choice([1, 2, 5, 20, 100]))
        greedy = []
        for i in range(len(tree)):  # mostly a child's token, so paths are accepted
            kids = tree.children[i]
            greedy.append(tree.tokens[rng.choice(kids)] if kids and rng.random() < 0.8 else rng.randrange(6))
        expected = greedy_walk(tree, greedy, PRIORITY)
        parents = np.array([-1, *tree.parents[1:]], np.int64)
        source = np.array([CODES.index(s) for s in tree.sources], np.int64)
        out = np.zeros(len(tree), np.int64)
        m, bonus = compiled_walk(np.array(tree.tokens, np.int64), parents, source, len(tree),
                                 np.array(greedy, np.int64), rank, out)
        assert (tuple(out[:m].tolist()), bonus) == expected, seed
        long_paths += m >= 3
    assert long_paths > 150  # the comparison walks deep paths, not only the root


def _python_cut(tokens: list[int], eos: set[int], room: int) -> tuple[int, bool]:
    """``SpecDecoder._append``'s cut, as it slices."""
    kept = tokens[:room]
    eos_at = next((i for i, t in enumerate(kept) if t in eos), None)
    return (eos_at + 1, True) if eos_at is not None else (len(kept), False)


def test_cut_matches_python():
    for seed in range(2000):
        rng = random.Random(seed)
        tokens = [rng.randrange(8) for _ in range(rng.randrange(1, 12))]
        eos = set(rng.sample(range(8), rng.randrange(0, 3)))
        room = rng.randrange(0, 14)
        got = cut(np.array(tokens, np.int64), len(tokens), np.array(sorted(eos), np.int64), room)
        assert got == _python_cut(tokens, eos, room), seed
