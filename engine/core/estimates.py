"""Online acceptance statistics: one per-depth counter per draft source, and the spine-ratio EMA.

Sources: Goose §3 (p_s, p_t: acceptance rates of spine and branch tokens), §4.3 and Appendix C.3
(EMA of spine acceptance, alpha 0.3; tiers p_s < 0.2 -> r 0.15, < 0.4 -> 0.30, else 0.50), and
the GT principle (node acceptance estimates as the product of per-source, per-depth estimates along
the path, kept online).
"""
from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field

from .tree import DraftTree, Source

#: (upper bound on EMA p_s, spine ratio r) — Goose Table 5 "spine ratio tiers".
SPINE_RATIO_TIERS = ((0.2, 0.15), (0.4, 0.30), (float("inf"), 0.50))


def spine_ratio_tier(p_s: float) -> float:
    """SPINERATIOTIER of Goose Alg. 2 line 9."""
    return next(r for bound, r in SPINE_RATIO_TIERS if p_s < bound)


@dataclass
class DepthCounter:
    """Per-depth acceptance counts of one source's nodes whose parent was accepted ("reached").

    ``reached[d]``, ``accepted[d]``: such nodes at depth d and how many of them were accepted;
    ``score_sum[d]``: the sum of their draft scores (what TR's score calibration divides by).
    """

    reached: dict[int, int] = field(default_factory=dict)
    accepted: dict[int, int] = field(default_factory=dict)
    score_sum: dict[int, float] = field(default_factory=dict)

    def add(self, depth: int, accepted: bool, score: float) -> None:
        self.reached[depth] = self.reached.get(depth, 0) + 1
        self.accepted[depth] = self.accepted.get(depth, 0) + accepted
        self.score_sum[depth] = self.score_sum.get(depth, 0.0) + score

    def rate(self, depth: int, prior: float = 0.5, weight: float = 2.0) -> float:
        """Posterior mean acceptance at ``depth`` under a Beta prior of mean ``prior`` and weight ``weight``."""
        return (self.accepted.get(depth, 0) + weight * prior) / (self.reached.get(depth, 0) + weight)

    def pooled(self) -> float:
        """Acceptance pooled over all depths, Beta(1, 1) prior."""
        return (sum(self.accepted.values()) + 1) / (sum(self.reached.values()) + 2)

    def calibration(self, depth: int) -> float:
        """(accepted + 1) / (score sum + 1) at ``depth``: how far scores over- or under-state acceptance."""
        return (self.accepted.get(depth, 0) + 1) / (self.score_sum.get(depth, 0.0) + 1)


#: Upper edges of the path-estimate bins ``PathCalibration`` counts in (the last bin ends at 1).  Finer at the
#: low end, where deep TR nodes' estimates (products of probabilities) crowd.
CALIBRATION_EDGES = (0.01, 0.03, 0.06, 0.1, 0.2, 0.3, 0.45, 0.6, 0.75, 0.9)


@dataclass
class PathCalibration:
    """Online calibration of path estimates from every built node's outcome, the pruned ones included.

    The GT principle (§3) prices each node at its estimated acceptance α̂; the product of per-depth rates
    along a path is only a model of it (a 20-token PLD spine accepted in full still multiplies to 0.9^20;
    raw TR probabilities miss how often the target repeats itself).  Counting only the nodes verified would
    never correct an estimate that gets its nodes pruned, so each cycle's whole built tree is kept
    (``record``) until the output decides every node (``resolve``): a node's path is the output's
    continuation after the anchor, or not.  Outcomes are counted per (source, bin of α̂); ``calibrate``
    maps α̂ to its bin's posterior rate under a prior of weight ``weight`` centred on the bin's mean α̂ times
    the source's own ratio (``ratio``: accepted nodes over Σ α̂ over all its bins, under a prior of weight
    ``start_weight`` at ``start``), so an empty bin borrows what its source has shown, and a run's first trees,
    before any outcome, are priced at ``start`` · α̂.  Starting doubtful costs little: the built trees are counted
    whole, the pruned nodes too, so a source whose estimates hold is trusted again within a few cycles, while
    starting trusting spends whole trees on a steep curve (docs/results.md, "GT on a steep curve").  (In sampling
    mode "the output's continuation" is one draw, so the rates are those of the sampled text: still an estimate,
    never a test of acceptance.)
    """

    weight: float = 4.0  # prior weight in nodes: a bin moves half-way to its measured rate after 4 outcomes
    start: float = 0.5  # a source's ratio of accepted nodes to Σ α̂ before any outcome (doubtful, see above)
    start_weight: float = 2.0  # its prior weight in estimated tokens: 2 estimated tokens decided move it half-way
    counts: dict[tuple[Source, int], list[float]] = field(default_factory=dict)  # [decided, accepted, Σ α̂]
    pending: list[tuple[int, DraftTree]] = field(default_factory=list)  # (stream index of depth 1, built tree)

    def record(self, tree: DraftTree, start: int) -> None:
        """Keep a built tree (before any pruning) whose depth-1 nodes guess the stream token at index ``start``."""
        if len(tree) > 1:
            self.pending.append((start, tree))

    def resolve(self, stream: Sequence[int], counters: AcceptanceStats | None = None) -> None:
        """Count every kept tree the stream (prompt + output so far) now decides in full; keep the others.
        ``counters``: also feed each decided node whose parent's path matched to its source's depth counter."""
        undecided = []
        for start, tree in self.pending:
            known = len(stream) - start  # output tokens after the tree's anchor
            hit = [True] * len(tree)  # the node's path equals the stream so far
            for i in range(1, len(tree)):
                d = tree.depths[i]
                hit[i] = hit[tree.parents[i]] and (d > known or tree.tokens[i] == stream[start + d - 1])
                if hit[i] and d > known:
                    break
            else:
                for i in range(1, len(tree)):
                    self._add(tree.sources[i], tree.est_accept[i], hit[i])
                    if counters is not None and hit[tree.parents[i]]:
                        counters.counter(tree.sources[i]).add(tree.depths[i], hit[i], tree.scores[i])
                continue
            undecided.append((start, tree))
        self.pending = undecided

    def _add(self, source: Source, est: float, accepted: bool) -> None:
        for slot in (self.counts.setdefault((source, bisect_right(CALIBRATION_EDGES, est)), [0, 0, 0.0]),
                     self.counts.setdefault((source, None), [0, 0, 0.0])):  # its bin, and the source's total
            slot[0] += 1
            slot[1] += accepted
            slot[2] += est

    def ratio(self, source: Source) -> float:
        """The ``source``'s accepted nodes over its summed raw estimates, all bins pooled (its total, kept beside
        its bins under bin ``None``), under a prior of weight ``start_weight`` at ``start``: how far its estimates
        over- (< 1) or under-state (> 1) acceptance."""
        _, accepted, est_sum = self.counts.get((source, None), (0, 0, 0.0))
        return (accepted + self.start_weight * self.start) / (est_sum + self.start_weight)

    def calibrate(self, source: Source, est: float) -> float:
        """The calibrated acceptance estimate of a ``source`` node whose raw path estimate is ``est`` (in [0, 1])."""
        slot = self.counts.get((source, bisect_right(CALIBRATION_EDGES, est)))
        ratio = self.ratio(source)
        if slot is None or not slot[2]:
            return min(1.0, est * ratio)
        decided, accepted, est_sum = slot
        prior = est_sum / decided  # the bin's mean raw estimate
        return min(1.0, est * (accepted + self.weight * prior * ratio) / (prior * (decided + self.weight)))

    def tree(self, tree: DraftTree) -> tuple[float, ...]:
        """Calibrated estimates of every node of ``tree`` (root 1.0)."""
        return (1.0, *(self.calibrate(s, e) for s, e in zip(tree.sources[1:], tree.est_accept[1:])))


@dataclass
class AcceptanceStats:
    """Online estimates kept for one generation session (run totals are in ``metrics``).

    One ``DepthCounter`` per draft source (``counter(source)``), fed by ``update`` from every verified
    tree, or with ``counterfactual`` by ``paths.resolve`` from every built one; each source turns its
    counter into the acceptance estimates of its candidates (``engine/sources``).  ``paths`` calibrates
    whole-path estimates for GT "auto".  ``p_s_ema`` is the EMA of spine acceptance that picks the spine
    ratio tier.
    """

    ema_alpha: float = 0.3
    p_s_ema: float = 0.3
    counters: dict[Source, DepthCounter] = field(default_factory=dict)
    paths: PathCalibration = field(default_factory=PathCalibration)
    counterfactual: bool = False  # depth counters fed by ``paths.resolve`` (every built node), not ``update``

    def counter(self, source: Source) -> DepthCounter:
        """The per-depth counter of ``source`` (created empty on first use)."""
        return self.counters.setdefault(source, DepthCounter())

    def update(self, tree: DraftTree, accepted: tuple[int, ...], ema: bool = True) -> None:
        """Record one verified tree and the accepted node indices (root excluded).

        Every node whose parent was accepted counts for its source at its depth (unless ``counterfactual``:
        then ``paths.resolve`` counts every built node once the output decides it).  ``ema``: whether this
        tree's spine acceptance (``DraftTree.spine``) enters the EMA p_s (the authors' code leaves bypass
        chains out of it; ``Variant.ema_on_chains``).
        """
        on_path = set(accepted) | {0}
        for i in range(1, len(tree)):
            if tree.parents[i] in on_path and tree.sources[i].verified and not self.counterfactual:
                self.counter(tree.sources[i]).add(tree.depths[i], i in on_path, tree.scores[i])
        spine = tree.spine
        if spine and ema:
            hit = sum(i in on_path for i in spine)
            self.p_s_ema = (1 - self.ema_alpha) * self.p_s_ema + self.ema_alpha * hit / len(spine)
