"""GT principle, speedup-optimal size (engine/decoding/gt.py): synthetic curves and trees, then the decoder."""
from __future__ import annotations

import random

import pytest

from engine.core.estimates import AcceptanceStats
from engine.core.tree import DraftTree, GhostNode, Source
from engine.decoding.calibration import PathCalibration
from engine.decoding.config import DecodeConfig
from engine.decoding.cost import CostCurve
from engine.decoding.gt import calibrated_choice, speedup_optimal
from engine.product.runs.decoder import make_decoder

FLAT = CostCurve(nodes=(1, 128), ms=(5.0, 5.0))  # GPU-like: every row rides free
STEEP = CostCurve(nodes=(1, 2, 4, 8, 64), ms=(1.0, 1.6, 2.0, 2.6, 4.2))  # SmolLM2 on a CPU (issue 10)


def random_tree(seed: int, n: int = 60) -> DraftTree:
    """A random tree whose path estimates are products of per-node rates in (0, 1]."""
    rng = random.Random(seed)
    parents, est = [None], [1.0]
    for i in range(1, n):
        p = rng.randrange(i)
        parents.append(p)
        est.append(est[p] * rng.choice([0.9, 0.6, 0.3, 0.1, 0.02]))
    sources = (Source.ROOT,) + tuple(rng.choice([Source("pld"), Source("tr")]) for _ in range(n - 1))
    return DraftTree(tuple(range(100, 100 + n)), tuple(parents), sources, tuple(est), tuple(est))


@pytest.mark.parametrize("seed", range(20))
def test_flat_curve_keeps_the_whole_tree(seed):
    tree = random_tree(seed)
    kept, ghosts, choice = speedup_optimal(tree, FLAT)
    assert kept == tree and ghosts == () and choice.nodes == choice.candidates == len(tree)
    assert choice.expected == pytest.approx(sum(tree.est_accept[1:]))


def expected_ghosts(tree: DraftTree, kept: DraftTree) -> list[GhostNode]:
    """The pruned candidates, worked out from the unpruned tree and the kept one alone (random_tree's tokens are
    unique, so a kept node is found in ``tree`` by its token): every removed node whose parent was kept, hanging off
    that parent's index in ``kept``, with its own token, source, score and estimate; in ``tree``'s order, which is
    token order here."""
    origin = [tree.tokens.index(t) for t in kept.tokens]  # kept index -> index in tree
    assert [None if p is None else origin[p] for p in kept.parents] == [tree.parents[i] for i in origin]
    return [GhostNode(origin.index(tree.parents[i]), tree.tokens[i], tree.sources[i], tree.scores[i],
                      tree.est_accept[i])
            for i in range(1, len(tree)) if i not in origin and tree.parents[i] in origin]


@pytest.mark.parametrize("seed", range(20))
def test_steep_curve_keeps_the_best_ancestor_closed_top(seed):
    """The kept tree is the top-n* by estimate, and its ghosts are exactly the pruned children of kept nodes."""
    tree = random_tree(seed)
    kept, ghosts, choice = speedup_optimal(tree, STEEP)
    assert 1 <= len(kept) < len(tree) and choice.nodes == len(kept) and choice.candidates == len(tree)
    # the kept nodes are the top-n by estimate, and the kept tree is the original restricted to them
    best = sorted(tree.est_accept[1:], reverse=True)[: len(kept) - 1]
    assert sorted(kept.est_accept[1:], reverse=True) == best
    # n* maximises (1 + expected) / T(n) over every n
    rates = [(1 + sum(sorted(tree.est_accept[1:], reverse=True)[: n - 1])) / STEEP.latency(n)
             for n in range(1, len(tree) + 1)]
    assert (1 + choice.expected) / choice.cost_ms == pytest.approx(max(rates))
    # the ghosts are exactly the removed nodes hanging off kept ones (by parent, token, source, score, estimate):
    # none missing, none extra, none twice, none re-parented
    want = expected_ghosts(tree, kept)
    assert want, "nothing pruned next to a kept node: inconclusive"
    assert sorted(ghosts, key=lambda g: g.token) == want


def test_steeper_curve_keeps_fewer_nodes_and_extra_rows_count():
    tree = random_tree(3)
    sizes = [speedup_optimal(tree, CostCurve((1, 64), (1.0, 1.0 + slope * 63)))[2].nodes
             for slope in (0.0, 0.01, 0.05, 0.2, 1.0)]
    assert sizes == sorted(sizes, reverse=True) and sizes[0] == len(tree) and sizes[-1] < 5
    knee = CostCurve((1, 16, 17, 128), (1.0, 1.0, 3.0, 4.0))  # free up to 16 rows, then a step
    assert speedup_optimal(tree, knee)[2].nodes >= 16
    with_rows = speedup_optimal(tree, knee, extra_rows=16)[2]  # 16 PTD rows use up the free rows
    assert with_rows.cost_ms == knee.latency(with_rows.nodes + 16) >= 3.0


def test_estimates_that_rise_along_a_path_still_give_a_valid_tree():
    # a child estimated above its parent (not produced by the builders, but must not break the tree)
    tree = DraftTree((1, 2, 3), (None, 0, 1), (Source.ROOT, Source("tr"), Source("tr")), (1, .1, .9), (1, .1, .9))
    kept, _, choice = speedup_optimal(tree, CostCurve((1, 2, 3), (1.0, 1.05, 1.2)))
    assert kept.parents[0] is None and all(p is not None and p < i for i, p in enumerate(kept.parents[1:], 1))
    assert choice.nodes == 2 and kept.tokens == (1, 2)


def test_curve_latency_is_monotone_and_extrapolates():
    curve = CostCurve((1, 2, 3, 4, 5, 8), (2.0, 3.4, 2.6, 2.7, 2.8, 4.0))  # 2 rows cost more than 3-5: 2 is slow
    assert curve.slow == (2,) and curve.verify_rows(2) == 3 and curve.verify_rows(3) == 3
    assert curve.latency(2) == curve.latency(3) == 2.6  # priced where it is verified
    assert curve.latency(16) == pytest.approx(4.0 + 0.1 * 8)  # the median of the last three segments' slopes
    assert curve.latencies(40) == sorted(curve.latencies(40))
    noisy = CostCurve((1, 2, 4, 8), (2.0, 2.6, 2.4, 4.0))  # a dip within the band: smoothed, not lifted
    assert noisy.slow == () and (noisy.latency(2), noisy.latency(4)) == (2.4, 2.6)


@pytest.mark.full  # several seconds of decoding (the quick tier keeps what issue 32 names and the sub-second tests)
def test_decoder_auto_records_the_choice_and_a_flat_curve_equals_no_pruning(demo_lm):
    ids = demo_lm.encode_prompt("def add(a, b):\n    return a + b\n\n\n"
                                "def sub(a, b):\n    return a - b\n\n\ndef mul(a, b):\n")
    run = lambda c, curve: list(make_decoder(demo_lm.model, DecodeConfig.of(max_new_tokens=40, gt_threshold=c), (),  # noqa: E731
                                            cost_curve=curve).generate(ids))
    flat, none = run("auto", FLAT), run(0.0, None)
    assert [t.tree for t in flat] == [t.tree for t in none]  # same trees, so the same tau
    steep = run("auto", CostCurve((1, 2, 128), (1.0, 1.9, 250.0)))
    chosen = [t for t in steep if t.gt_nodes is not None]
    assert chosen and all(len(t.tree) == t.gt_nodes <= t.gt_candidates for t in chosen)
    assert all(t.gt_cost_ms > 0 and t.gt_expected >= 0 for t in chosen)
    assert sum(len(t.tree) for t in steep) < sum(len(t.tree) for t in none)
    # the builder's ghosts (the chord floor) and the size choice's both hang off kept nodes
    assert any(t.ghosts for t in steep) and all(g.parent < len(t.tree) for t in steep for g in t.ghosts)
    assert [x for t in steep for x in t.new_tokens] == [x for t in none for x in t.new_tokens]


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("rate", [0.05, 0.3, 1.0])
def test_session_rate_keeps_the_top_that_maximises_tokens_minus_rate_times_time(seed, rate):
    tree = random_tree(seed)
    kept, _, choice = speedup_optimal(tree, STEEP, rate=rate)
    top = sorted(tree.est_accept[1:], reverse=True)
    values = [1 + sum(top[: n - 1]) - rate * STEEP.latency(n) for n in range(1, len(tree) + 1)]
    assert 1 + choice.expected - rate * choice.cost_ms == pytest.approx(max(values))
    assert speedup_optimal(tree, FLAT, rate=rate)[0] == tree  # a flat curve keeps every node at any rate


def test_a_lower_session_rate_keeps_a_larger_tree():
    tree = random_tree(5)
    sizes = [speedup_optimal(tree, STEEP, rate=rate)[2].nodes for rate in (2.0, 1.0, 0.3, 0.1, 0.01)]
    assert sizes == sorted(sizes) and sizes[0] < sizes[-1]


def test_path_calibration_waits_for_the_output_then_moves_estimates_towards_outcomes():
    # anchor -> 7 -> 8 -> 9 (PLD chain) and anchor -> 5 (TR); the stream after the anchor will be 7 8 9
    pld, tr = Source("pld"), Source("tr")
    tree = DraftTree((1, 7, 8, 9, 5), (None, 0, 1, 2, 0), (Source.ROOT, pld, pld, pld, tr), (1, .5, .5, .5, .2),
                     (1, .5, .25, .125, .2))
    cal = PathCalibration(weight=1.0)
    stream = [1]
    cal.record(tree, start=len(stream))
    cal.resolve(stream + [7, 8])  # node 9 at depth 3 is still undecided: nothing counted yet
    assert cal.pending and not cal.counts
    for _ in range(20):  # the same tree and outcome, many times
        cal.record(tree, start=len(stream))
    stats = AcceptanceStats()
    cal.resolve(stream + [7, 8, 9], stats)
    assert not cal.pending
    # each node is calibrated given its parent accepted: every PLD conditional .5 was accepted, the TR .2 never
    assert cal.calibrate(Source("pld"), .5) > 0.9 and cal.calibrate(Source("pld"), .5, first=False) > 0.9
    assert cal.calibrate(Source("tr"), .2) < 0.02
    assert cal.calibrate(Source("ptd"), .3) == .3 * cal.start  # a source with no outcome yet: doubted (``start``)
    assert cal.calibrate(Source("pld"), .95) > 0.9  # an empty bin of a source that has shown its worth: trusted
    assert cal.tree(tree)[3] > 0.8  # the deep PLD node: the product of its calibrated conditionals, not .125
    assert stats.counter(Source("pld")).accepted == {1: 21, 2: 21, 3: 21}  # depth counters see every built node
    assert stats.counter(Source("tr")).reached == {1: 21} and stats.counter(Source("tr")).accepted == {1: 0}
    assert cal.tree(tree)[0] == 1.0 and all(0.0 <= e <= 1.0 for e in cal.tree(tree))


@pytest.mark.parametrize("seed", range(12))
def test_a_waiting_tree_is_counted_exactly_when_the_output_decides_every_reached_node(seed):
    """``resolve`` counts a built tree once no node whose parent's path matched the output lies deeper than the output
    known so far (the definition, read node by node here), and only then; child tokens repeat (an alphabet of 3)."""
    rng = random.Random(seed)
    parents = [None, *(rng.randrange(i) for i in range(1, 30))]
    tokens = tuple(rng.randrange(3) for _ in parents)
    tree = DraftTree(tokens, tuple(parents), (Source.ROOT,) + (Source("tr"),) * 29, (.5,) * 30, (.5,) * 30)
    stream = [9, *(rng.randrange(3) for _ in range(12))]  # the anchor, then the output
    for known in range(13):
        hit, waiting = [True] * len(tree), False
        for i in range(1, len(tree)):
            d = tree.depths[i]
            hit[i] = hit[parents[i]] and (d > known or tokens[i] == stream[d])
            waiting |= hit[i] and d > known
        cal, stats = PathCalibration(), AcceptanceStats()
        cal.record(tree, start=1)
        cal.resolve(stream[: 1 + known], stats)
        assert bool(cal.pending) == waiting
        reached = sum(hit[parents[i]] for i in range(1, len(tree)))
        assert sum(stats.counter(Source("tr")).reached.values()) == (0 if waiting else reached)


def test_ghosts_the_builder_made_are_reindexed_or_dropped_with_their_parent():
    """The builder's ghosts follow their parent's new index, or go with it; the pruned nodes join them."""
    # anchor -> TR 2 (est .01, pruned) ; anchor -> PLD 3 -> PLD 4 (kept, re-indexed 2 -> 1 and 3 -> 2)
    tree = DraftTree((1, 2, 3, 4), (None, 0, 0, 2), (Source.ROOT, Source("tr"), Source("pld"), Source("pld")),
                     (1, .01, .9, .9), (1, .01, .9, .8))
    earlier = (GhostNode(3, 7, Source("tr"), .02, .02), GhostNode(1, 8, Source("tr"), .02, .0001))
    kept, ghosts, _ = speedup_optimal(tree, STEEP, ghosts=earlier)
    assert kept.tokens == (1, 3, 4) and kept.parents == (None, 0, 1)
    # the ghost under node 3 now hangs off its new index 2; the one under the pruned node 1 is dropped with it;
    # the pruned TR node 1 itself becomes a ghost of the anchor, with its own score and estimate
    assert sorted(ghosts, key=lambda g: g.token) == [GhostNode(0, 2, Source("tr"), .01, .01),
                                                     GhostNode(2, 7, Source("tr"), .02, .02)]


def test_latencies_in_one_pass_equal_latency_each():
    for curve in (STEEP, FLAT, CostCurve((1,), (3.0,)), CostCurve((1, 2, 4, 8), (2.0, 3.0, 2.5, 4.0))):
        assert curve.latencies(200) == pytest.approx([curve.latency(n) for n in range(1, 201)])


def test_a_loop_of_equal_estimates_is_priced_as_a_chain_and_its_failures_lower_the_trust():
    """TR's adjacency loop "0 -> 0 -> 0 ..." carries one probability at every depth: its path estimates stay 0.9999,
    but a chain is only as likely as the product of its conditionals; a trusted set that earns nothing lowers the
    trust, so the same loop is then pruned on a steep curve while a first tree of it is still kept whole."""
    tr = Source("tr")
    p = .9999
    loop = DraftTree((5, 0, 0, 0, 0, 0, 0), (None, 0, 1, 2, 3, 4, 5), (Source.ROOT, *[tr] * 6), (1, *[p] * 6),
                     (1, *[p] * 6))
    cal = PathCalibration()
    est = cal.tree(loop)
    assert all(a > b for a, b in zip(est[1:], est[2:]))  # priced as a chain: each node below its parent
    assert est[1] == pytest.approx(p * cal.start) and est[6] == pytest.approx(p * cal.start ** 6)
    # outcomes that say TR's 0.9999 holds (the loop accepted whole), then the loop failing at its first node
    stream = [5]
    for _ in range(6):
        cal.record(loop, start=len(stream))
        stream += [0] * 6 + [5]
    cal.resolve(stream)
    first = calibrated_choice(loop, STEEP, 0, cal, rate=1 / STEEP.latency(1))
    for _ in range(4):
        cal.record(loop, len(stream), first[3].kept, first[3].expected)
        stream += [9, 5]
    cal.resolve(stream)
    assert first[2].nodes > 1 and cal.trust() < 0.5
    assert calibrated_choice(loop, STEEP, 0, cal, rate=1 / STEEP.latency(1))[2].nodes == 1  # now an AR step
