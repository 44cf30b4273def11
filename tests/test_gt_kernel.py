"""The compiled size choice and path calibration (engine/decoding/gt_kernel.py, calibration_kernel.py) against their
Python statement (gt.py, calibration.py, core/estimates.py): every output field equal bit for bit, on random trees,
ghosts, cost curves and rates, and along long random sessions of recorded trees and a growing stream."""
from __future__ import annotations

import random

import numpy as np
import pytest

import engine.sources  # noqa: F401  (declares the pld and tr tags)
from engine.core.estimates import AcceptanceStats
from engine.core.tree import DraftTree, GhostNode, Source
from engine.decoding.calibration import CALIBRATION_EDGES, PathCalibration
from engine.decoding.calibration_kernel import DMAX, N_SOURCES, CalibrationArrays, StatsArrays, node_arrays
from engine.decoding.cost import CostCurve
from engine.decoding.gt import calibrated_choice, size_choice, speedup_optimal
from engine.decoding.gt_kernel import choose, choose_calibrated, ghost_arrays, price

TAGS = (Source.ROOT, Source("pld"), Source("tr"))  # by source code
STEEP = CostCurve(nodes=(1, 2, 4, 8, 64), ms=(1.0, 1.6, 2.0, 2.6, 4.2))


def bits(values) -> bytes:
    """Floats as their bytes: equal only when bit-identical (-0.0 differs from 0.0)."""
    return np.asarray(values, np.float64).tobytes()


class Curve:
    """A cost curve given as its latencies (``size_choice`` reads ``latencies`` alone)."""

    def __init__(self, costs) -> None:
        self.costs = [float(c) for c in costs]

    def latencies(self, upto: int) -> list[float]:
        assert upto <= len(self.costs)
        return self.costs[:upto]


def random_tree(rng: random.Random, n: int, vocab: int = 4, clamped: bool = True) -> DraftTree:
    """Random parents in topological order (often chains, so paths run deep), tokens of a small alphabet (siblings may
    repeat one), pld or tr nodes, scores and estimates with ties and zeros; ``clamped`` False: estimates may rise."""
    parents, est, sources = [None], [1.0], [Source.ROOT]
    chain = rng.random() < 0.5
    for i in range(1, n):
        p = i - 1 if chain and rng.random() < 0.7 else rng.randrange(i)
        parents.append(p)
        rate = rng.choice([1.0, 0.9, 0.6, 0.5, 0.3, 0.1, 0.02, 0.0, rng.random()])
        est.append(est[p] * rate if clamped else rng.choice([rate, est[p] * rate]))
        sources.append(TAGS[1] if (p == 0 or sources[p] is TAGS[1]) and rng.random() < 0.6 else rng.choice(TAGS[1:]))
    tokens = tuple(rng.randrange(vocab) for _ in range(n))
    scores = (1.0, *(rng.choice([0.5, rng.random(), 0.0]) for _ in range(n - 1)))
    return DraftTree(tokens, tuple(parents), tuple(sources), scores, tuple(est))


def random_ghosts(rng: random.Random, n: int) -> tuple[GhostNode, ...]:
    return tuple(GhostNode(rng.randrange(n), rng.randrange(9), rng.choice(TAGS[1:]), rng.random(), rng.random() * 0.1)
                 for _ in range(rng.choice([0, 0, 1, 5])))


def random_costs(rng: random.Random, m: int) -> list[float]:
    kind = rng.choice(["flat", "steep", "wild", "curve"])
    if kind == "flat":
        return [rng.choice([1.0, 5.0, 0.3])] * m
    if kind == "steep":
        return list(np.cumsum([rng.uniform(0.5, 2.0), *(rng.uniform(0.0, 0.4) for _ in range(m - 1))]))
    if kind == "wild":  # not monotone
        return [rng.uniform(0.5, 6.0) for _ in range(m)]
    return STEEP.latencies(m)


def same_nodes(arrays, tree: DraftTree) -> None:
    want = node_arrays(tree)
    for got, exp in zip(arrays, want):
        assert got.dtype == exp.dtype and got.tobytes() == exp.tobytes()


def same_choice(got, want, n: int) -> None:
    """A kernel ``Choice`` against a ``GtChoice``."""
    assert (got.nodes, got.candidates, tuple(got.kept.tolist())) == (want.nodes, want.candidates, want.kept) == \
        (want.nodes, n, want.kept)
    assert bits(got.expected) == bits(want.expected) and bits(got.cost_ms) == bits(want.cost_ms)
    assert bits(got.read) == bits(want.read)


def same_outcome(got, kept: DraftTree, ghosts: tuple[GhostNode, ...]) -> None:
    """A kernel ``Choice``'s kept tree and ghosts against ``speedup_optimal``'s."""
    same_nodes(got.tree, kept)
    want = ghost_arrays(ghosts)
    for a, b in zip(got.ghosts, want):
        assert a.tobytes() == b.tobytes()


def test_size_choice_and_ghosts_equal_the_python():
    seen = {"pruned": 0, "whole": 0, "anchor": 0, "ghosts": 0, "earlier": 0, "tie": 0}
    for seed in range(500):
        rng = random.Random(seed)
        n = rng.choice([1, 2, 3, 8, 20, 60])
        tree = random_tree(rng, n, clamped=rng.random() < 0.6)
        extra, rate = rng.randrange(4), rng.choice([None, None, 0.0, 0.05, 0.3, 1.0, 3.0])
        costs = random_costs(rng, n + extra + rng.randrange(3))
        estimates = None if rng.random() < 0.6 else tuple(rng.choice([0.5, 0.3, rng.random(), 0.0]) for _ in range(n))
        ghosts = random_ghosts(rng, n)
        kept, lost, choice = speedup_optimal(tree, Curve(costs), extra, estimates=estimates, rate=rate, ghosts=ghosts)
        assert size_choice(tree, Curve(costs), extra, estimates=estimates, rate=rate) == choice
        est = None if estimates is None else np.array(estimates)
        got = choose(node_arrays(tree), price(costs, extra, rate), ghost_arrays(ghosts), est)
        same_choice(got, choice, n)
        same_outcome(got, kept, lost)
        seen["pruned"] += 1 < choice.nodes < n
        seen["whole"] += choice.nodes == n > 1
        seen["anchor"] += choice.nodes == 1 < n
        seen["ghosts"] += len(lost) > 0
        seen["earlier"] += any(g in lost for g in ghosts)
        seen["tie"] += len(set(choice.read[1:])) < n - 1
    assert min(seen.values()) >= 20, seen


class Session:
    """One random session run both ways: the Python objects and their array counterparts, side by side."""

    def __init__(self, seed: int) -> None:
        rng = self.rng = random.Random(seed)
        params = dict(weight=rng.choice([4.0, 1.0, 2.5]), start=rng.choice([0.5, 0.8]), start_weight=2.0,
                      trust_start=rng.choice([0.7, 1.0]), trust_weight=rng.choice([4.0, 1.5]))
        self.py, self.arr = PathCalibration(**params), CalibrationArrays(**params)
        counterfactual = rng.random() < 0.5
        self.stats_py = AcceptanceStats(counterfactual=counterfactual)
        self.stats_arr = StatsArrays(counterfactual=counterfactual)
        self.stream = [rng.randrange(4) for _ in range(rng.randrange(2, 8))]
        self.queue: list[int] = []  # tokens still to come along a followed path
        self.waited: dict[int, int] = {}  # a recorded tree's id -> resolves it survived
        self.extra, self.rate = rng.randrange(4), rng.choice([None, 0.1, 0.5])

    def step(self) -> None:
        rng, start = self.rng, len(self.stream)
        tree = random_tree(rng, rng.choice([1, 2, 5, 12, 30, 60]), clamped=rng.random() < 0.8)
        tree = DraftTree(tuple((self.stream[-1], *tree.tokens[1:])), tree.parents, tree.sources, tree.scores,
                         tree.est_accept)
        costs = random_costs(rng, len(tree) + self.extra)
        kept, ghosts, choice, trusted = calibrated_choice(tree, Curve(costs), self.extra, self.py, rate=self.rate)
        made, full = choose_calibrated(self.arr, node_arrays(tree), price(costs, self.extra, self.rate))
        same_choice(made, choice, len(tree))
        same_outcome(made, kept, ghosts)
        same_choice(full, trusted, len(tree))
        self._extend(tree)
        self.py.record(tree, start, trusted.kept, trusted.expected)
        self.arr.record(node_arrays(tree), start, trusted.kept, trusted.expected)
        accepted = walk(kept, self.stream, start)
        ema = rng.random() < 0.8
        self.stats_py.update(kept, accepted, ema=ema)
        self.stats_arr.update(node_arrays(kept), accepted, ema=ema)
        counters, calibrate = rng.random() < 0.7, rng.random() < 0.8
        self.py.resolve(self.stream, self.stats_py if counters else None, calibrate)
        self.arr.resolve(self.stream, self.stats_arr if counters else None, calibrate)
        for entry in self.py.pending:
            self.waited[id(entry[1])] = self.waited.get(id(entry[1]), 0) + 1

    def _extend(self, tree: DraftTree) -> None:
        """The output goes on: along a deep path of this tree (a few tokens a cycle, so trees wait), or at random."""
        rng = self.rng
        if not self.queue and len(tree) > 1 and rng.random() < 0.6:
            deepest = max(range(1, len(tree)), key=lambda i: (tree.depths[i], rng.random()))
            node = deepest if rng.random() < 0.6 else rng.randrange(1, len(tree))
            self.queue = [tree.tokens[i] for i in tree.path_to(node)] + [rng.randrange(4)] * (rng.random() < 0.5)
        take = rng.choice([1, 1, 2, 3, 8])
        if self.queue:
            self.stream += self.queue[:take]
            del self.queue[:take]
        else:
            self.stream += [rng.randrange(4) for _ in range(take)]

    def compare(self) -> None:
        py, arr = self.py, self.arr
        want = {((TAGS.index(s), first), b): v for ((s, first), b), v in py.counts.items()}
        got = arr.counts()
        assert got.keys() == want.keys()
        for key, (decided, accepted, est) in want.items():
            assert got[key][:2] == [decided, accepted] and bits(got[key][2]) == bits(est), key
        assert bits(arr.cal.trusted) == bits(py.trusted) and bits(arr.trust()) == bits(py.trust())
        assert len(arr.pending) == len(py.pending)
        for (at, nodes, kept, expected), (start, tree, trusted, priced) in zip(arr.pending, py.pending):
            same_nodes(nodes, tree)
            assert (at, kept, bits(expected)) == (start, trusted[1:], bits(priced))
        for s in range(N_SOURCES):
            for first in (True, False):
                assert bits(arr.ratio(s, first)) == bits(py.ratio((TAGS[s], first)))
                for est in (0.0, 1.0, *CALIBRATION_EDGES, self.rng.random(), self.rng.random() * 0.05):
                    assert bits(arr.calibrate(s, est, first)) == bits(py.calibrate(TAGS[s], est, first))
        probe = random_tree(self.rng, 25)
        assert bits(arr.tree(node_arrays(probe))) == bits(py.tree(probe))
        self._compare_stats()

    def _compare_stats(self) -> None:
        counters, a = self.stats_py.counters, self.stats_arr.counters
        for s in range(N_SOURCES):
            c = counters.get(TAGS[s])
            reached, accepted, score_sum = (np.zeros(DMAX, np.int64), np.zeros(DMAX, np.int64), np.zeros(DMAX))
            for d, v in (c.reached.items() if c else ()):
                reached[d], accepted[d], score_sum[d] = v, c.accepted[d], c.score_sum[d]
            assert (a.reached[s] == reached).all() and (a.accepted[s] == accepted).all()
            assert a.score_sum[s].tobytes() == score_sum.tobytes()
        assert bits(self.stats_arr.p_s_ema) == bits(self.stats_py.p_s_ema)


def walk(tree: DraftTree, stream: list[int], start: int) -> tuple[int, ...]:
    """The accepted nodes of a greedy walk along the stream after index ``start`` (first matching child)."""
    node, accepted = 0, []
    for token in stream[start:]:
        node = next((c for c in tree.children[node] if tree.tokens[c] == token), None)
        if node is None:
            break
        accepted.append(node)
    return tuple(accepted)


def test_sessions_calibrate_and_count_as_the_python():
    hits = deep = waited = 0
    bins: set = set()
    for seed in range(14):
        session = Session(seed)
        for _ in range(70):
            session.step()
            session.compare()
        counts = session.py.counts
        hits += sum(v[1] for (_, b), v in counts.items() if b is None)
        bins |= {(kind, b) for kind, b in counts if b is not None}
        deep += int(session.stats_arr.counters.accepted[:, 4:].sum())
        waited += sum(w >= 2 for w in session.waited.values())
    assert hits >= 200 and deep >= 50 and waited >= 30 and len(bins) >= 25, (hits, deep, waited, len(bins))


def test_the_pool_grows_and_keeps_its_order():
    """Many trees waiting at once (a stream that never moves decides nothing): the arrays double, the order holds."""
    rng = random.Random(7)
    py, arr = PathCalibration(), CalibrationArrays()
    stream = [1, 2]
    for _ in range(40):
        tree = random_tree(rng, rng.choice([2, 30, 90]))
        kept = tuple(sorted(rng.sample(range(len(tree)), rng.randrange(len(tree)))))
        py.record(tree, len(stream), kept, rng.random())
        arr.record(node_arrays(tree), len(stream), kept, py.pending[-1][3])
        py.resolve(stream)
        arr.resolve(stream)
    assert len(arr.pending) == len(py.pending) == 40 and arr.pend.meta.shape[0] >= 40
    for (at, nodes, kept, expected), (start, tree, trusted, priced) in zip(arr.pending, py.pending):
        same_nodes(nodes, tree)
        assert (at, kept, expected) == (start, trusted[1:], priced)


def test_what_the_kernels_cannot_check_is_refused_before_them():
    tree = node_arrays(random_tree(random.Random(1), 8))
    with pytest.raises(ValueError, match="costs up to T"):
        choose(tree, price([1.0] * 9, extra_rows=2))  # T(10) is needed
    deep = node_arrays(DraftTree.chain(list(range(DMAX + 1)), Source("pld")))
    with pytest.raises(ValueError, match="deep"):
        StatsArrays().update(deep, ())
    with pytest.raises(ValueError, match="deep"):
        CalibrationArrays().record(deep, 1)
