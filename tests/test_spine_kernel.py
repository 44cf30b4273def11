"""TR's array table (engine/sources/adjacency.py, the compiled planner's) against its dictionaries
(``tr.AdjacencyTable``, the Python planner's): the same rows, the same pairs dropped; and the helpers the compiled
builder's tests share (tests/test_build_kernel.py: the whole tree, Alg. 1 steps 1-4, against the Python builder)."""
from __future__ import annotations

import random

import pytest

from engine.core.estimates import AcceptanceStats
from engine.decoding.build_kernel import build_spine_built
from engine.decoding.config import DecodeConfig
from engine.decoding.spine_tree import Proposals, build_spine_tree
from engine.sources import Candidates, Request, SourceMemory
from engine.sources.adjacency import ArrayTable
from engine.sources.tr import AdjacencyTable, TrSource
from tests.test_tree import random_table


class PythonOnly:
    """TR as the Python builder sees it: its successors, without the compiled table (so Alg. 1 runs in Python)."""

    def __init__(self, tr: TrSource) -> None:
        self.tr, self.info, self.top_k = tr, tr.info, tr.top_k

    def propose(self, request: Request) -> Candidates:
        return self.tr.propose(request)


def fields(built) -> tuple:
    t = built.tree
    return t.tokens, t.parents, t.sources, t.scores, t.est_accept, built.ghosts


def array_copy(table: AdjacencyTable) -> ArrayTable:
    """``table`` (the Python planner's dictionaries) as the compiled planner's array table: its pairs' rows stored in
    their LRU order, then every token's own row (a pair's store writes its token's row too)."""
    copy = ArrayTable(0, table.top_k, table.bigram_capacity)  # the rows as stored: renormalised already, if at all
    for (prev, tok), (ids, scores) in table.bigram.items():
        copy.store([prev], [tok], [list(ids)], [list(scores)])
    for tok, (ids, scores) in table.unigram.items():
        copy.store([None], [tok], [list(ids)], [list(scores)])
    return copy


def test_a_root_without_a_previous_token_reads_its_unigram_row():
    table = array_copy(random_table(3))
    cfg = DecodeConfig()
    tr = TrSource(cfg, AcceptanceStats(), SourceMemory())
    tr.table = table
    alone = Proposals((5,), Candidates(), None, (), (tr,))
    python = Proposals((5,), Candidates(), None, (), (PythonOnly(tr),))
    assert fields(build_spine_built(alone, cfg, 0.5, prune_at=0.0)) == \
        fields(build_spine_tree(python, cfg, 0.5, prune_at=0.0))


@pytest.mark.parametrize("seed", range(12))
def test_array_table_keeps_the_rows_and_the_lru_of_the_dictionaries(seed):
    rng = random.Random(seed)
    capacity, renormalise, k = rng.choice([0, 1, 3, 17, 65536]), rng.random() < 0.5, rng.choice([1, 3, 10])
    table, reference = ArrayTable(0, k, capacity, renormalise), AdjacencyTable(0, k, capacity, renormalise)
    for _ in range(rng.choice([1, 5, 40])):  # stores of 1 to 30 rows, tokens and pairs repeating
        n = rng.randint(1, 30)
        prev = [None if rng.random() < 0.1 else rng.randrange(12) for _ in range(n)]
        tokens = [rng.randrange(rng.choice([12, 3000])) for _ in range(n)]
        width = rng.choice([k, max(1, k - 1)]) if rng.random() < 0.9 else k + 2  # narrower, or wider than K
        ids = [[rng.randrange(5000) for _ in range(width)] for _ in range(n)]
        scores = [sorted((rng.random() for _ in range(width)), reverse=True) for _ in range(n)]
        table.store(prev, tokens, ids, scores)
        reference.store(prev, tokens, ids, scores)
        assert len(table) == len(reference.bigram)
        for prev_tok in [None, *range(12)]:
            for tok in [*range(12), 2999, 4000]:
                assert table.row(prev_tok, tok) == reference.row(prev_tok, tok)
