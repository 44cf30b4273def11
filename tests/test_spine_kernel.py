"""The compiled Alg. 1 steps 2-4 (engine/decoding/spine_kernel.py) against their Python statement
(engine/decoding/spine_tree.py): node for node, ghost for ghost, on random tables and shapes; and TR's array table
(engine/sources/adjacency.py) against the LRU dictionary it replaced."""
from __future__ import annotations

import random
from collections import OrderedDict

import pytest

from engine.decoding.config import DecodeConfig
from engine.decoding.spine_tree import Proposals, build_spine_tree
from engine.sources import Candidates, Request
from engine.sources.adjacency import AdjacencyTable
from engine.sources.tr import TrSource
from tests.test_tree import VOCAB, drafts, random_table


class PythonOnly:
    """TR as the Python builder sees it: its successors, without the compiled table (so Alg. 1 runs in Python)."""

    def __init__(self, tr: TrSource) -> None:
        self.tr, self.info, self.top_k = tr, tr.info, tr.top_k

    def propose(self, request: Request) -> Candidates:
        return self.tr.propose(request)


def fields(built) -> tuple:
    t = built.tree
    return t.tokens, t.parents, t.sources, t.scores, t.est_accept, built.ghosts


def test_compiled_steps_build_the_python_tree():
    grown = sum(_same_tree(seed) for seed in range(80))
    assert grown >= 40  # most shapes grew TR branches: the comparison is not of empty steps


def _same_tree(seed: int) -> bool:
    """One random shape, table and spine built both ways; whether TR nodes were grown."""
    rng = random.Random(seed)
    cfg = DecodeConfig.of(budget=rng.choice([1, 2, 5, 8, 20, 60, 128]), max_depth=rng.choice([1, 2, 6, 16]),
                          gt_threshold=rng.choice([0.0, 0.0, 0.01, 0.2]), depth_bounds_spine=rng.random() < 0.5,
                          spine_branch_min=rng.choice([0, 1, 2]), spine_branch_ratio=rng.choice([0.0, 0.5, 1.0]),
                          tr_calibration=rng.random() < 0.3, min_score=rng.choice([0.0, 0.01, 0.1]))
    spine = tuple(rng.randrange(VOCAB) for _ in range(rng.choice([0, 1, 3, 7, 20, 90])))
    proposals = drafts(rng.randrange(VOCAB), rng.randrange(VOCAB), spine, random_table(seed, scale=rng.choice([1, 3])),
                       cfg)
    tr = proposals.branch_sources[0]
    for depth in range(1, 8):  # a calibrated TR's estimates differ from its scores, per depth
        tr.counter.accepted[depth], tr.counter.score_sum[depth] = rng.randrange(5), rng.random() * 5
    python = Proposals(proposals.context, proposals.spine, proposals.spine_source, (), (PythonOnly(tr),))
    assert proposals.table_source is tr and python.table_source is None
    r = rng.choice([0.15, 0.3, 0.5, 0.95])
    budget = rng.choice([None, cfg.tree.budget + 30])
    compiled = build_spine_tree(proposals, cfg, r, budget=budget, prune_at=cfg.gt.threshold)
    reference = build_spine_tree(python, cfg, r, budget=budget, prune_at=cfg.gt.threshold)
    assert fields(compiled) == fields(reference), seed
    return tr.info.source in compiled.tree.sources


def test_a_root_without_a_previous_token_reads_its_unigram_row():
    table = random_table(3)
    cfg = DecodeConfig()
    proposals = drafts(5, 0, (), table, cfg)
    alone = Proposals((5,), Candidates(), None, (), proposals.branch_sources)
    python = Proposals((5,), Candidates(), None, (), (PythonOnly(proposals.branch_sources[0]),))
    assert fields(build_spine_tree(alone, cfg, 0.5, prune_at=0.0)) == \
        fields(build_spine_tree(python, cfg, 0.5, prune_at=0.0))


class DictTable:
    """The adjacency table's tiers as they were: dictionaries, the bigram one an LRU of writes."""

    def __init__(self, capacity: int, renormalise: bool) -> None:
        self.unigram, self.bigram, self.capacity, self.renormalise = {}, OrderedDict(), capacity, renormalise

    def store(self, prev_tokens, tokens, ids, scores) -> None:
        for prev, tok, ri, rp in zip(prev_tokens, tokens, ids, scores):
            if self.renormalise:
                total = sum(rp)
                rp = [p / total for p in rp]
            row = (tuple(ri), tuple(rp))
            self.unigram[tok] = row
            if prev is None:
                continue
            self.bigram[(prev, tok)] = row
            self.bigram.move_to_end((prev, tok))
        while len(self.bigram) > self.capacity:
            self.bigram.popitem(last=False)

    def row(self, prev, token):
        row = self.bigram.get((prev, token)) if prev is not None else None
        return row if row is not None else self.unigram.get(token)


@pytest.mark.parametrize("seed", range(12))
def test_array_table_keeps_the_rows_and_the_lru_of_the_dictionaries(seed):
    rng = random.Random(seed)
    capacity, renormalise, k = rng.choice([0, 1, 3, 17, 65536]), rng.random() < 0.5, rng.choice([1, 3, 10])
    table, reference = AdjacencyTable(0, k, capacity, renormalise), DictTable(capacity, renormalise)
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
