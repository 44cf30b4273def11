"""Spine-tree construction (Goose Alg. 1), tree buffers, and the greedy walk (Alg. 3)."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from engine.core.estimates import AcceptanceStats, spine_ratio_tier
from engine.core.tree import DraftTree, Source
from engine.core.verify import greedy_walk
from engine.decoding.config import WALK_PRIORITY, DecodeConfig
from engine.decoding.spine_tree import Proposals, build_chain, build_isotropic_tree, build_spine_tree
from engine.sources import Candidates, SourceMemory
from engine.sources.tr import AdjacencyTable, TrSource

PRIORITY = tuple(Source(name) for name in WALK_PRIORITY)  # the walk's default order (Goose Alg. 3)

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


def drafts(anchor: int, prev: int, spine: tuple[int, ...], table: AdjacencyTable | None,
           cfg: DecodeConfig = DecodeConfig()) -> Proposals:
    """Alg. 1's inputs without a model: a PLD spine (estimate 0.5 per token, a fresh session's) and the real TR
    source reading ``table``."""
    branches = ()
    if table is not None:
        tr = TrSource(cfg, AcceptanceStats(), SourceMemory())
        tr.table = table
        branches = (tr,)
    chain = Candidates.chain(spine, [0.5] * len(spine))
    return Proposals((prev, anchor), chain, Source("pld") if spine else None, (), branches)


def ancestors(tree: DraftTree, i: int) -> set[int]:
    out = {i}
    while tree.parents[i] is not None:
        i = tree.parents[i]
        out.add(i)
    return out


@pytest.mark.parametrize("seed", range(40))
def test_spine_tree_invariants(seed):
    rng = random.Random(seed)
    cfg = DecodeConfig.of(budget=rng.choice([1, 2, 5, 8, 20, 60, 128]), max_depth=rng.choice([1, 2, 6, 16]),
                             gt_threshold=rng.choice([0.0, 0.0, 0.01, 0.2]), depth_bounds_spine=rng.random() < 0.5,
                             spine_branch_min=rng.choice([0, 1, 2]),
                             branch_growth=rng.choice(["best-first", "score-width"]))
    spine = tuple(rng.randrange(VOCAB) for _ in range(rng.choice([0, 1, 3, 7, 20, 90])))
    r = rng.choice([0.15, 0.3, 0.5, 0.95])
    budget = rng.choice([None, cfg.tree.budget + 30])
    built = build_spine_tree(drafts(rng.randrange(VOCAB), rng.randrange(VOCAB), spine, random_table(seed), cfg), cfg, r,
                             budget=budget, prune_at=cfg.gt.threshold)
    tree, ghosts = built.tree, built.ghosts
    n, B = len(tree), budget or cfg.tree.budget
    assert 1 <= n <= B
    assert all(e >= cfg.gt.threshold for e in tree.est_accept)
    assert all(g.est_accept < cfg.gt.threshold for g in ghosts)
    # spine laid first, as a chain of PLD nodes following the draft
    spine_nodes = [i for i in range(n) if tree.sources[i] is Source("pld")]
    assert [tree.tokens[i] for i in spine_nodes] == list(spine[: len(spine_nodes)])
    assert len(spine_nodes) <= min(len(spine), int(B * r), cfg.tree.max_depth if cfg.variant.depth_bounds_spine else B)
    # D bounds every node, or (authors' reading) branch growth only: a branch deeper than D is a leaf
    # hanging off a spine node
    for i in range(1, n):
        if tree.depths[i] > cfg.tree.max_depth:
            assert not cfg.variant.depth_bounds_spine
            assert tree.sources[i] is Source("pld") or (tree.sources[tree.parents[i]] is Source("pld")
                                                     and not tree.children[i])
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_cpu_inputs_equal_the_pointer_doubling_ones(dtype):
    """On a CPU a tree's ancestry is read off the host's arrays; an accelerator derives it by pointer doubling
    (``DraftTree._doubled``): the same tokens, depths and ancestors, so the same forward inputs in every float dtype,
    for random trees."""
    rng = random.Random(5)
    for n in (1, 2, 9, 40):
        parents = [None] + [rng.randrange(i) for i in range(1, n)]
        tree = DraftTree(tuple(rng.randrange(VOCAB) for _ in range(n)), tuple(parents),
                         (Source.ROOT,) + (Source("tr"),) * (n - 1), (1.0,) * n, (1.0,) * n)
        tokens, depth, anc = tree._doubled("cpu")  # (n,), (n,), (n, n): the accelerator's derivation
        for have, want in zip(tree.device_ancestry("cpu"), (tokens, depth, anc)):
            assert have.dtype == want.dtype and torch.equal(have, want)
        mask = torch.zeros(n, 7 + n, dtype=dtype)
        mask[:, 7:].masked_fill_(~anc, torch.finfo(dtype).min)
        got = tree.device_inputs(7, dtype, "cpu")
        for have, want in ((got.input_ids, tokens[None]), (got.position_ids, (depth + 7)[None]),
                           (got.attention_mask, mask[None, None])):
            assert have.dtype == want.dtype and torch.equal(have, want)


def test_tr_only_tree_uses_the_budget_and_spine_branches_decay():
    cfg = DecodeConfig.of(budget=60, gt_threshold=0.0)
    table = random_table(3)
    tr_only = build_spine_tree(drafts(1, 2, (), table, cfg), cfg, 0.5).tree
    assert len(tr_only) == 60 and set(tr_only.sources[1:]) == {Source("tr")}
    tree = build_spine_tree(drafts(1, 2, (5, 6, 7, 8, 9, 10), table, cfg), cfg, 0.3).tree
    spine = [i for i in range(len(tree)) if tree.sources[i] is Source("pld")]
    assert len(spine) == 6
    widths = [sum(tree.sources[c] is Source("tr") for c in tree.children[i]) for i in spine]
    assert widths[0] >= widths[-1]  # harmonic decay: wider near the root


def test_spine_runs_past_depth_when_depth_bounds_branches_only():
    """Authors' reading of D: the spine is bounded by floor(B r) alone; branches still stop at depth D."""
    table, spine = random_table(5), tuple(range(1, 31))
    cfg = DecodeConfig.of(budget=60, max_depth=6, gt_threshold=0.0, depth_bounds_spine=False)
    tree = build_spine_tree(drafts(40, 41, spine, table, cfg), cfg, 0.5).tree
    assert sum(s is Source("pld") for s in tree.sources) == 30  # floor(60 * 0.5) = 30 spine nodes, depth 30
    assert all(d <= 6 for d, s, p in zip(tree.depths, tree.sources, tree.parents)
               if s is Source("tr") and tree.sources[p] is not Source("pld"))
    capped_cfg = cfg.with_(depth_bounds_spine=True)
    capped = build_spine_tree(drafts(40, 41, spine, table, capped_cfg), capped_cfg, 0.5).tree
    assert sum(s is Source("pld") for s in capped.sources) == 6 and max(capped.depths) <= 6
    raised = build_spine_tree(drafts(40, 41, spine, table, cfg), cfg, 0.9, budget=96).tree
    assert len(raised) <= 96 and sum(s is Source("pld") for s in raised.sources) == 30  # the whole chain fits


def test_every_spine_node_gets_a_branch_while_the_share_lasts():
    table, spine = random_table(6, scale=0.3), tuple(range(1, 11))  # flat scores: every successor passes min_score
    cfg = DecodeConfig.of(budget=60, max_depth=6, gt_threshold=0.0, depth_bounds_spine=False)
    widths = lambda tree: [sum(tree.sources[c] is Source("tr") for c in tree.children[i])  # noqa: E731
                           for i in range(len(tree)) if tree.sources[i] is Source("pld")]
    width_cfg = cfg.with_(branch_growth="score-width")
    harmonic = build_spine_tree(drafts(40, 41, spine, table, width_cfg), width_cfg, 0.5).tree
    assert 0 in widths(harmonic)  # floor(b_sp / (i H)) is 0 deep down
    floor_cfg = cfg.with_(spine_branch_min=1, branch_growth="score-width")
    floor1 = build_spine_tree(drafts(40, 41, spine, table, floor_cfg), floor_cfg, 0.5).tree
    assert min(widths(floor1)) >= 1 and widths(floor1)[0] >= widths(floor1)[-1]


def test_score_width_growth_is_breadth_first_and_narrows_with_depth():
    cfg = DecodeConfig.of(budget=60, max_depth=6, gt_threshold=0.0, branch_growth="score-width",
                             top_k=10)
    tree = build_spine_tree(drafts(1, 2, (), random_table(7, scale=0.3), cfg), cfg, 0.5).tree
    assert len(tree) == 60 and max(tree.depths) <= 6
    for i in range(1, len(tree)):  # a node of depth d has at most max(1, K // d) children
        assert len(tree.children[i]) <= max(1, 10 // tree.depths[i])


def test_ema_skips_chains_when_asked():
    chain = DraftTree((0, 1, 2), (None, 0, 1), (Source.ROOT, Source("pld"), Source("pld")), (1, .5, .5), (1, .5, .25))
    stats = AcceptanceStats(p_s_ema=0.5)
    stats.update(chain, (1, 2), ema=False)
    assert stats.p_s_ema == 0.5 and stats.counter(Source("pld")).accepted == {1: 1, 2: 1}  # per-depth rates learn
    stats.update(chain, (1, 2))
    assert stats.p_s_ema == pytest.approx(0.7 * 0.5 + 0.3 * 1.0)


def test_chain_and_gt_threshold_cut_the_chain():
    draft = Candidates.chain((1, 2, 3, 4), [0.5] * 4)  # PLD rate 0.5 per depth before any observation
    chain = build_chain(9, draft, Source("pld")).tree
    assert chain.tokens == (9, 1, 2, 3, 4) and chain.depths == (0, 1, 2, 3, 4) and chain.spine == (1, 2, 3, 4)
    cut = build_chain(9, draft, Source("pld"), gt_threshold=0.2)
    assert cut.tree.tokens == (9, 1, 2)  # 0.5, 0.25 kept; 0.125 < 0.2 removed
    assert [g.token for g in cut.ghosts] == [3]


def test_walk_prefers_pld_child_over_tr_child_with_same_token():
    # root -> TR 'a'(1) -> TR 'b'(2) ; root -> PLD 'a'(3) -> PLD 'c'(4). Target wants a, then c.
    tree = DraftTree(tokens=(0, 10, 11, 10, 12), parents=(None, 0, 1, 0, 3),
                     sources=(Source.ROOT, Source("tr"), Source("tr"), Source("pld"), Source("pld")),
                     scores=(1, .5, .5, .5, .5), est_accept=(1, .5, .25, .5, .25))
    greedy = [10, 11, 99, 12, 13]
    accepted, bonus = greedy_walk(tree, greedy, PRIORITY)
    assert accepted == (3, 4) and bonus == 13


def test_walk_spine_continuation_and_bonus():
    # spine 1-2-3 with a TR branch 7 at node 2; target wants 1, 2, 7, then 8
    tree = DraftTree(tokens=(0, 1, 2, 3, 7, 8), parents=(None, 0, 1, 2, 2, 4),
                     sources=(Source.ROOT, Source("pld"), Source("pld"), Source("pld"), Source("tr"), Source("tr")),
                     scores=(1,) * 6, est_accept=(1,) * 6)
    accepted, bonus = greedy_walk(tree, [1, 2, 7, 0, 8, 42], PRIORITY)
    assert accepted == (1, 2, 4, 5) and bonus == 42


def test_tree_rejects_bad_parent_arrays():
    with pytest.raises(ValueError):
        DraftTree((1, 2), (None, 1), (Source.ROOT, Source("tr")), (1, 1), (1, 1))
    with pytest.raises(ValueError):
        DraftTree((1, 2), (0, 0), (Source.ROOT, Source("tr")), (1, 1), (1, 1))


def test_spine_ratio_tiers():
    assert [spine_ratio_tier(p) for p in (0.0, 0.19, 0.2, 0.39, 0.4, 0.9)] == [0.15, 0.15, 0.3, 0.3, 0.5, 0.5]


def test_ancestor_matrix_is_boolean_reachability():
    tree = DraftTree((0, 1, 2, 3), (None, 0, 0, 2), (Source.ROOT,) + (Source("tr"),) * 3, (1,) * 4, (1,) * 4)
    expected = np.array([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=bool)
    assert (tree.ancestor_matrix == expected).all()
    assert tree.path_to(3) == [2, 3]


@pytest.mark.parametrize("k", [3, 5])
def test_isotropic_tree_is_balanced_k_ary(k):
    cfg = DecodeConfig.of(budget=60, max_depth=6, gt_threshold=0.0)
    tree = build_isotropic_tree(drafts(1, 2, (5, 6, 7), random_table(k, scale=0.3), cfg), cfg, k).tree
    assert len(tree) == 60 and max(tree.depths) <= cfg.tree.max_depth
    assert all(len(kids) <= k for kids in tree.children)
    # breadth first: every level but the last is full
    levels = [tree.depths.count(d) for d in range(max(tree.depths) + 1)]
    assert levels[:-1] == [k ** d for d in range(len(levels) - 1)]
    # the PLD continuation is the first child along the spine
    assert [tree.tokens[i] for i in range(len(tree)) if tree.sources[i] is Source("pld")] == [5, 6, 7]
    # the authors' control: adjacency only, and a larger budget on a confident cycle
    bare = build_isotropic_tree(drafts(1, 2, (), random_table(k, scale=0.3), cfg), cfg, k, budget=80).tree
    assert len(bare) == 80 and Source("pld") not in bare.sources


def test_tr_estimates_are_calibrated_online_per_depth():
    assert TrSource(DecodeConfig(), AcceptanceStats(), SourceMemory()).rate(1, 0.4) == 0.4  # off: the score
    stats = AcceptanceStats()
    tr = TrSource(DecodeConfig.of(tr_calibration=True), stats, SourceMemory())
    assert tr.rate(1, 0.4) == pytest.approx(0.4)  # no evidence yet: the score as it is
    # depth-1 TR nodes scored 0.5 each, reached 10 times, never accepted
    tree = DraftTree((0, 1), (None, 0), (Source.ROOT, Source("tr")), (1.0, 0.5), (1.0, 0.5))
    for _ in range(10):
        stats.update(tree, ())
    assert tr.rate(1, 0.5) == pytest.approx(0.5 * 1 / 6)  # (0 + 1) / (5 + 1)
    assert tr.rate(2, 0.5) == pytest.approx(0.5)  # other depths unaffected
    for _ in range(40):
        stats.update(tree, (1,))  # now accepted every time
    assert tr.rate(1, 0.9) == 1.0  # clamped
