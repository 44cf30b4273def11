"""Spine-tree construction (Goose Alg. 1), tree buffers, and the greedy walk (Alg. 3)."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from engine.adjacency import AdjacencyTable
from engine.config import DecodeConfig
from engine.estimates import AcceptanceStats, spine_ratio_tier
from engine.spine_tree import build_chain, build_isotropic_tree, build_spine_tree
from engine.tree import DraftTree, Source
from engine.verify import greedy_walk

VOCAB = 64


def random_table(seed: int, top_k: int = 10, scale: float = 3.0) -> AdjacencyTable:
    """An adjacency table harvested from random logits (std ``scale``) for every token and some bigrams."""
    gen = torch.Generator().manual_seed(seed)
    table = AdjacencyTable(VOCAB, top_k)
    tokens = torch.arange(VOCAB)
    table.harvest([None] * VOCAB, tokens, torch.randn(VOCAB, VOCAB, generator=gen) * scale)
    prev = torch.randint(0, VOCAB, (VOCAB,), generator=gen).tolist()
    table.harvest(prev, tokens, torch.randn(VOCAB, VOCAB, generator=gen) * scale)
    return table


def ancestors(tree: DraftTree, i: int) -> set[int]:
    out = {i}
    while tree.parents[i] is not None:
        i = tree.parents[i]
        out.add(i)
    return out


@pytest.mark.parametrize("seed", range(40))
def test_spine_tree_invariants(seed):
    rng = random.Random(seed)
    cfg = DecodeConfig(budget=rng.choice([1, 2, 5, 8, 20, 60, 128]), max_depth=rng.choice([1, 2, 6, 16]),
                       gt_threshold=rng.choice([0.0, 0.0, 0.01, 0.2]))
    spine = tuple(rng.randrange(VOCAB) for _ in range(rng.choice([0, 1, 3, 7, 20])))
    r = rng.choice([0.15, 0.3, 0.5, 0.95])
    tree, ghosts = build_spine_tree(rng.randrange(VOCAB), rng.randrange(VOCAB), spine, random_table(seed), cfg, r,
                                    AcceptanceStats())
    n = len(tree)
    assert 1 <= n <= cfg.budget
    assert max(tree.depths) <= cfg.max_depth
    assert all(e >= cfg.gt_threshold for e in tree.est_accept)
    assert all(g.est_accept < cfg.gt_threshold for g in ghosts)
    # spine laid first, as a chain of PLD nodes following the draft
    spine_nodes = [i for i in range(n) if tree.sources[i] is Source.PLD]
    assert [tree.tokens[i] for i in spine_nodes] == list(spine[: len(spine_nodes)])
    assert len(spine_nodes) <= min(len(spine), int(cfg.budget * r), cfg.max_depth)
    # no duplicate tokens among siblings
    for kids in tree.children:
        assert len({tree.tokens[c] for c in kids}) == len(kids)
    # mask = ancestor relation including self; positions = past + depth
    past = 7
    mask = tree.attention_mask(past, torch.float32, "cpu")
    assert mask.shape == (1, 1, n, past + n)
    allowed = mask[0, 0] == 0
    assert allowed[:, :past].all()
    for i in range(n):
        assert set(torch.nonzero(allowed[i, past:]).flatten().tolist()) == ancestors(tree, i)
    assert tree.position_ids(past, "cpu").tolist() == [[past + d for d in tree.depths]]


def test_tr_only_tree_uses_the_budget_and_spine_branches_decay():
    cfg = DecodeConfig(budget=60, gt_threshold=0.0)
    table = random_table(3)
    tr_only, _ = build_spine_tree(1, 2, (), table, cfg, 0.5, AcceptanceStats())
    assert len(tr_only) == 60 and set(tr_only.sources[1:]) == {Source.TR}
    tree, _ = build_spine_tree(1, 2, (5, 6, 7, 8, 9, 10), table, cfg.with_(top_k=10), 0.3, AcceptanceStats())
    spine = [i for i in range(len(tree)) if tree.sources[i] is Source.PLD]
    assert len(spine) == 6
    widths = [sum(tree.sources[c] is Source.TR for c in tree.children[i]) for i in spine]
    assert widths[0] >= widths[-1]  # harmonic decay: wider near the root


def test_chain_and_gt_threshold_cut_the_chain():
    stats = AcceptanceStats()  # PLD rate 0.5 per depth before any observation
    chain, _ = build_chain(9, (1, 2, 3, 4), stats)
    assert chain.tokens == (9, 1, 2, 3, 4) and chain.depths == (0, 1, 2, 3, 4)
    cut, ghosts = build_chain(9, (1, 2, 3, 4), stats, gt_threshold=0.2)
    assert cut.tokens == (9, 1, 2)  # 0.5, 0.25 kept; 0.125 < 0.2 removed
    assert [g.token for g in ghosts] == [3]


def test_walk_prefers_pld_child_over_tr_child_with_same_token():
    # root -> TR 'a'(1) -> TR 'b'(2) ; root -> PLD 'a'(3) -> PLD 'c'(4). Target wants a, then c.
    tree = DraftTree(tokens=(0, 10, 11, 10, 12), parents=(None, 0, 1, 0, 3),
                     sources=(Source.ROOT, Source.TR, Source.TR, Source.PLD, Source.PLD),
                     scores=(1, .5, .5, .5, .5), est_accept=(1, .5, .25, .5, .25))
    greedy = [10, 11, 99, 12, 13]
    accepted, bonus = greedy_walk(tree, greedy)
    assert accepted == (3, 4) and bonus == 13


def test_walk_spine_continuation_and_bonus():
    # spine 1-2-3 with a TR branch 7 at node 2; target wants 1, 2, 7, then 8
    tree = DraftTree(tokens=(0, 1, 2, 3, 7, 8), parents=(None, 0, 1, 2, 2, 4),
                     sources=(Source.ROOT, Source.PLD, Source.PLD, Source.PLD, Source.TR, Source.TR),
                     scores=(1,) * 6, est_accept=(1,) * 6)
    accepted, bonus = greedy_walk(tree, [1, 2, 7, 0, 8, 42])
    assert accepted == (1, 2, 4, 5) and bonus == 42


def test_tree_rejects_bad_parent_arrays():
    with pytest.raises(ValueError):
        DraftTree((1, 2), (None, 1), (Source.ROOT, Source.TR), (1, 1), (1, 1))
    with pytest.raises(ValueError):
        DraftTree((1, 2), (0, 0), (Source.ROOT, Source.TR), (1, 1), (1, 1))


def test_spine_ratio_tiers():
    assert [spine_ratio_tier(p) for p in (0.0, 0.19, 0.2, 0.39, 0.4, 0.9)] == [0.15, 0.15, 0.3, 0.3, 0.5, 0.5]


def test_ancestor_matrix_is_boolean_reachability():
    tree = DraftTree((0, 1, 2, 3), (None, 0, 0, 2), (Source.ROOT,) + (Source.TR,) * 3, (1,) * 4, (1,) * 4)
    expected = np.array([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=bool)
    assert (tree.ancestor_matrix == expected).all()
    assert tree.path_to(3) == [2, 3]


@pytest.mark.parametrize("k", [3, 5])
def test_isotropic_tree_is_balanced_k_ary(k):
    cfg = DecodeConfig(budget=60, max_depth=6, gt_threshold=0.0)
    tree, _ = build_isotropic_tree(1, 2, (5, 6, 7), random_table(k, scale=0.3), cfg, k, AcceptanceStats())
    assert len(tree) == 60 and max(tree.depths) <= cfg.max_depth
    assert all(len(kids) <= k for kids in tree.children)
    # breadth first: every level but the last is full
    levels = [tree.depths.count(d) for d in range(max(tree.depths) + 1)]
    assert levels[:-1] == [k ** d for d in range(len(levels) - 1)]
    # the PLD continuation is the first child along the spine
    assert [tree.tokens[i] for i in range(len(tree)) if tree.sources[i] is Source.PLD] == [5, 6, 7]


def test_tr_estimates_are_calibrated_online_per_depth():
    assert AcceptanceStats().tr_rate(1, 0.4) == 0.4  # calibration off (the default): the adjacency score
    stats = AcceptanceStats(calibrate_tr=True)
    assert stats.tr_rate(1, 0.4) == pytest.approx(0.4)  # no evidence yet: the score as it is
    # depth-1 TR nodes scored 0.5 each, reached 10 times, never accepted
    tree = DraftTree((0, 1), (None, 0), (Source.ROOT, Source.TR), (1.0, 0.5), (1.0, 0.5))
    for _ in range(10):
        stats.update(tree, ())
    assert stats.tr_rate(1, 0.5) == pytest.approx(0.5 * 1 / 6)  # (0 + 1) / (5 + 1)
    assert stats.tr_rate(2, 0.5) == pytest.approx(0.5)  # other depths unaffected
    for _ in range(40):
        stats.update(tree, (1,))  # now accepted every time
    assert stats.tr_rate(1, 0.9) == 1.0  # clamped
