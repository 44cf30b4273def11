"""The compiled stage 2 (engine/decoding/build_kernel.py) against its Python statement: the whole spine tree
(Alg. 1 steps 1-4) against ``build_spine_tree`` with TR in Python, the bypass chain against ``build_chain``, and the
routing and shape decisions against ``Planner._route`` / ``_shape``, field by field, ghosts included, on random
shapes, tables and drafts."""
from __future__ import annotations

import random
from collections import Counter
from types import SimpleNamespace

import numpy as np

from engine.core.estimates import AcceptanceStats, spine_ratio_tier
from engine.core.tree import Built, Source
from engine.decoding import build_kernel as bk
from engine.decoding.config import DecodeConfig, Resolved
from engine.decoding.planner import Planner
from engine.decoding.records import Drafts
from engine.decoding.spine_tree import Proposals, build_chain, build_spine_tree
from engine.sources import Candidates, Request, SourceMemory
from engine.sources.adjacency import ArrayTable
from engine.sources.base import extend_chain
from engine.sources.pld import PldSource
from engine.sources.tr import TrSource
from tests.test_spine_kernel import PythonOnly, array_copy, fields
from tests.test_tree import VOCAB, random_table

PLD, TR = Source("pld"), Source("tr")


def table_for(rng: random.Random, seed: int) -> ArrayTable:
    """A random table (every token, some bigrams), a sparse one (a few tokens' rows) or an empty one."""
    kind = rng.choice(["random", "random", "random", "sparse", "empty"])
    if kind == "random":
        return array_copy(random_table(seed, scale=rng.choice([1, 3])))
    table = ArrayTable(VOCAB, 10, renormalise=rng.random() < 0.5)
    if kind == "sparse":
        n = rng.randint(1, 12)
        tokens = [rng.randrange(VOCAB) for _ in range(n)]
        prev = [None if rng.random() < 0.5 else rng.randrange(VOCAB) for _ in range(n)]
        ids = [rng.sample(range(VOCAB), 10) for _ in range(n)]
        scores = [sorted((rng.random() ** 2 for _ in range(10)), reverse=True) for _ in range(n)]
        table.store(prev, tokens, ids, scores)
    return table


def tr_source(cfg: DecodeConfig, table: ArrayTable, rng: random.Random) -> TrSource:
    """The real TR source reading ``table``, its per-depth counter made uneven (a calibrated TR's estimates differ
    from its scores)."""
    tr = TrSource(cfg, AcceptanceStats(), SourceMemory())
    tr.table = table
    for depth in range(1, 12):
        tr.counter.accepted[depth], tr.counter.score_sum[depth] = rng.randrange(5), rng.random() * 5
    return tr


def random_chain(rng: random.Random, length: int, **kw) -> Candidates:
    """A chain whose estimates are mostly high, some 1, some low (below c: ghosts on the spine)."""
    p = [rng.choice([1.0, rng.random() ** 0.2, rng.random() ** 0.2, rng.random()]) for _ in range(length)]
    return Candidates.chain([rng.randrange(VOCAB) for _ in range(length)], p, **kw)


def test_whole_spine_tree_is_the_python_one():
    seen = Counter()
    for seed in range(500):
        seen.update(_same_spine_tree(seed))
    # non-vacuity: spines laid, TR grown, ghosts of both sources, spines cut by c, trees with and without branches
    assert seen["spine nodes"] >= 2500 and seen["trees with spines"] >= 300, seen
    assert seen["tr nodes"] >= 4000 and seen["trees with tr"] >= 150, seen
    assert seen["pld ghosts"] >= 50 and seen["tr ghosts"] >= 1500, seen  # a PLD ghost ends its spine (c)
    assert seen["no branches"] >= 25 and seen["root alone"] >= 30, seen


def _same_spine_tree(seed: int) -> Counter:
    rng = random.Random(seed)
    cfg = DecodeConfig.of(budget=rng.randint(1, 160), max_depth=rng.choice([1, 2, 3, 6, 16, 40]),
                          gt_threshold=rng.choice([0.0, 0.0, 0.01, 0.05, 0.2, 0.5]),
                          depth_bounds_spine=rng.random() < 0.5, spine_branch_min=rng.choice([0, 0, 1, 2, 5]),
                          spine_branch_ratio=rng.choice([0.0, 0.5, 1.0, rng.random()]),
                          tr_calibration=rng.random() < 0.3, min_score=rng.choice([0.0, 0.01, 0.1]))
    length = rng.choice([0, 1, 2, 5, 20, 60, 100, rng.randint(0, 100)])
    chain = random_chain(rng, length)
    context = (rng.randrange(VOCAB),) if rng.random() < 0.1 else (rng.randrange(VOCAB), rng.randrange(VOCAB))
    tr = tr_source(cfg, table_for(rng, seed), rng)
    resting = rng.random() < 0.1  # no branch source: the tree is the spine alone
    compiled_tr, python_tr = ((), ()) if resting else ((tr,), (PythonOnly(tr),))
    spine_source = PLD if length else None
    r = rng.choice([0.15, 0.3, 0.5, 0.95, rng.random()])
    budget = rng.choice([None, rng.randint(1, 160)])
    c = cfg.gt.threshold
    kernel = bk.build_spine_built(Proposals(context, chain, spine_source, (), compiled_tr), cfg, r, budget, c)
    python = build_spine_tree(Proposals(context, chain, spine_source, (), python_tr), cfg, r, budget, c)
    assert fields(kernel) == fields(python), seed
    tree, ghosts = kernel.tree, kernel.ghosts
    spine = sum(s is PLD for s in tree.sources)
    return Counter({"spine nodes": spine, "trees with spines": spine > 0, "tr nodes": tree.sources.count(TR),
                    "trees with tr": TR in tree.sources, "pld ghosts": sum(g.source is PLD for g in ghosts),
                    "tr ghosts": sum(g.source is TR for g in ghosts),
                    "no branches": resting, "root alone": len(tree) == 1})


def test_bypass_chain_is_the_python_one():
    seen = Counter()
    for seed in range(300):
        rng = random.Random(seed)
        chain = random_chain(rng, rng.choice([0, 1, 2, 8, 30, 100, rng.randint(0, 100)]))
        c = rng.choice([0.0, 0.01, 0.2, 0.5, 0.9])
        anchor = rng.randrange(VOCAB)
        kernel, python = bk.build_chain_built(anchor, chain, PLD, c), build_chain(anchor, chain, PLD, c)
        assert fields(kernel) == fields(python), seed
        seen.update({"nodes": len(kernel.tree) - 1, "ghosts": len(kernel.ghosts),
                     "cut": len(kernel.tree) - 1 < len(chain)})
    assert seen["nodes"] >= 2000 and seen["ghosts"] >= 80 and seen["cut"] >= 80, seen


def test_spine_ratio_tier_and_anchor_rows():
    values = [0.0, 0.1, 0.2 - 1e-12, 0.2, 0.3, 0.4 - 1e-12, 0.4, 0.5, 1.0, *np.random.default_rng(0).random(50)]
    assert [bk.spine_ratio_tier(p) for p in values] == [spine_ratio_tier(p) for p in values]
    found = 0
    for seed in range(20):
        rng = random.Random(seed)
        cfg = DecodeConfig()
        tr = tr_source(cfg, table_for(rng, seed), rng)
        a = tr.table.arrays
        for _ in range(20):
            context = [rng.randrange(VOCAB) for _ in range(rng.choice([1, 2, 5]))]
            prev = context[-2] if len(context) > 1 else -1
            has = bk.anchor_has_row(a.uni_slot, a.uni_len, a.bi_len, tr.table.bigram, prev, context[-1])
            assert has == bool(len(tr.propose(Request(context, (), 59))))
            found += has
    assert 50 <= found < 400


class FakePld:
    """A spine source answering each request with a chain drawn from (seed, path): the same answer to the planner's
    extension and to the kernel's emulated one (the PLD kernel's part)."""

    info = PldSource.info

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def propose(self, request: Request) -> Candidates:
        rng = random.Random(f"{self.seed}/{request.path}")
        if rng.random() < 0.15:
            return Candidates()
        return random_chain(rng, rng.randint(1, 12), match=3, confidence=rng.choice([0.5, 0.9, 1.0, 1.0, 1.0]))


def test_route_and_shape_make_the_planner_plan():
    seen = Counter()
    for seed in range(800):
        seen.update(_same_plan(seed))
    # non-vacuity: every mode, AR after a build (ghosts kept), extended and cap-trimmed chains, both bypass rules
    assert seen["ar"] >= 100 and seen["bypass"] >= 100 and seen["tree"] >= 150, seen
    assert seen["ar after a build"] >= 50 and seen["ar with ghosts"] >= 50, seen
    assert seen["extended"] >= 30 and seen["trimmed"] >= 8 and seen["saturated"] >= 10, seen
    assert seen["bypass confident"] >= 50 and seen["bypass no-adjacency"] >= 30, seen


def _same_plan(seed: int) -> Counter:
    rng = random.Random(seed)
    method = rng.choice(["goose"] * 6 + ["pld", "tr"])
    cfg = DecodeConfig.of(method=method, budget=rng.randint(1, 100), max_depth=rng.choice([2, 6, 16]),
                          gt_threshold=rng.choice([0.0, 0.01, 0.1, 0.3, 0.95]), bypass=rng.random() < 0.85,
                          bypass_rule=rng.choice(["no-adjacency", "confident"]),
                          bypass_threshold=rng.choice([1, 4, 8, 30]), confidence_schedule=rng.random() < 0.8,
                          spine_ratio=rng.choice([None, None, 0.3, 0.7]), budget_extension=rng.choice([0, 40, 100]),
                          max_extended_chain=rng.choice([1, 20, 50, 100]),
                          extend_above=rng.choice([0.0, 0.6, 0.6, 1.0]),
                          spine_branch_min=rng.choice([0, 1]), depth_bounds_spine=rng.random() < 0.3,
                          tr_calibration=rng.random() < 0.3)
    cap = rng.choice([None, None, 1, 5, 10, 12, 20, 30, 200])
    planner = Planner(Resolved(cfg, cfg.gt.threshold, cap), None, None, 0)
    context = [rng.randrange(VOCAB) for _ in range(rng.choice([1, 2, 10]))]
    stats = SimpleNamespace(p_s_ema=rng.choice([0.1, 0.2, 0.3, 0.4, 0.9, rng.random()]))
    s = SimpleNamespace(anchor=context[-1], tokens=context, stats=stats)
    pld = FakePld(seed)
    tr = tr_source(cfg, table_for(rng, seed), rng)
    python_tr = PythonOnly(tr)
    length = rng.choice([0, 0, 1, 3, 8, 20, 40])
    chain = random_chain(rng, length, match=rng.randint(1, 5),
                         confidence=rng.choice([0.0, 0.2, 0.5, 0.6, 0.61, 0.7, 0.9, 0.9, 1.0, 1.0, 1.0]),
                         consensus=rng.random() < 0.3)
    tr_rests = rng.random() < 0.15
    proposals = []
    if method != "tr":
        proposals.append((pld, chain))
    if method != "pld" and not tr_rests:
        proposals.append((python_tr, tr.propose(Request(context, (), planner._draft_budget))))
    drafts = Drafts(tuple(proposals), pld if length and method != "tr" else None,
                    chain if method != "tr" else Candidates())
    plan = planner._route(s, drafts)

    # the compiled cycle's part, as its driver will call it (the extension itself by Python here)
    a = tr.table.arrays
    prev = context[-2] if len(context) > 1 else -1
    branch = method != "pld" and not tr_rests
    offers = branch and bk.anchor_has_row(a.uni_slot, a.uni_len, a.bi_len, tr.table.bigram, prev, context[-1])
    spine = drafts.chain
    mode = bk.route(len(spine), offers, spine.consensus, bk.BypassRule(
        cfg.drafts_alone, cfg.tree.bypass, cfg.variant.bypass_rule == "confident", cfg.tree.bypass_threshold))
    nodes, ghosts, r, budget, seen = 0, 0, None, None, Counter()
    size = max(cfg.max_budget, len(spine) + 1)
    arrays = bk.tree_arrays(max(size, 500))
    if mode == bk.BYPASS:
        nodes, ghosts = bk.build_chain(s.anchor, (np.array(spine.tokens, np.int64), np.array(spine.p, np.float64), 1),
                                       float(planner.resolved.prune_at), arrays)
    elif mode == bk.TREE:
        schedule = bk.Schedule(cfg.variant.confidence_schedule, cfg.tree.spine_ratio or -1.0, cfg.tree.budget,
                               cfg.variant.budget_extension, cfg.variant.max_extended_chain, cfg.variant.extend_above,
                               -1 if cap is None else cap)
        budget, r, limit, extend, saturated = bk.shape(spine.confidence, stats.p_s_ema, len(spine), schedule)
        if extend:
            grown = extend_chain(pld, context, spine, limit, planner._draft_budget, saturated=saturated)
            keep = bk.capped(len(grown), -1 if cap is None else cap)
            seen.update({"extended": 1, "trimmed": keep < len(grown), "saturated": saturated})
            spine = Candidates.chain(grown.tokens[:keep], grown.p[:keep])
        D = cfg.tree.max_depth
        table = bk.successor_table(tr, max(budget, D) + 2)
        shape = bk.SpineShape(float(r), budget, D if cfg.variant.depth_bounds_spine else budget, D,
                              float(planner.resolved.prune_at), float(cfg.tree.min_score),
                              float(cfg.tree.spine_branch_ratio), cfg.variant.spine_branch_min, branch)
        nodes, ghosts = bk.build_spine((s.anchor, prev), (np.array(spine.tokens, np.int64),
                                                          np.array(spine.p, np.float64), 1), shape, table, arrays)
    final = bk.planned_mode(mode, nodes)
    built = bk.built_of(arrays, nodes, ghosts)
    assert bk.MODES[final] == plan.mode, seed
    assert plan.ghosts == built.ghosts, seed
    if final == bk.AR:
        assert len(plan.tree) == 1 and plan.tree.tokens == (s.anchor,) and plan.spine_ratio is None, seed
        assert plan.budget is None and plan.chain_tokens == 0, seed
    else:
        assert fields(built) == fields(Built(plan.tree, plan.ghosts)), seed
        assert (r, budget, len(spine)) == (plan.spine_ratio, plan.budget, plan.chain_tokens), seed
    seen.update({bk.MODES[final]: 1, "ar after a build": final == bk.AR and mode != bk.AR,
                 "ar with ghosts": final == bk.AR and ghosts > 0,
                 f"bypass {cfg.variant.bypass_rule}": final == bk.BYPASS and not cfg.drafts_alone})
    return seen
