"""Online acceptance statistics: one per-depth counter per draft source, and the spine-ratio EMA.

Sources: Goose §3 (p_s, p_t: acceptance rates of spine and branch tokens), §4.3 and Appendix C.3
(EMA of spine acceptance, alpha 0.3; tiers p_s < 0.2 -> r 0.15, < 0.4 -> 0.30, else 0.50), and
the GT principle (node acceptance estimates as the product of per-source, per-depth estimates along
the path, kept online).  Those path estimates calibrated by the session's measured outcomes are the decoding
layer's, beside GT's size choice (``PathCalibration``, engine/decoding/calibration.py).
"""
from __future__ import annotations

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


@dataclass
class AcceptanceStats:
    """Online estimates kept for one generation session (run totals are in ``metrics``).

    One ``DepthCounter`` per draft source (``counter(source)``), fed by ``update`` from every verified
    tree, or with ``counterfactual`` by the decoding loop's path calibration from every built one once the output
    decides it (``PathCalibration.resolve``, engine/decoding/calibration.py, which also calibrates whole-path
    estimates for GT "auto"); each source turns its counter into the acceptance estimates of its candidates
    (``engine/sources``).  ``p_s_ema`` is the EMA of spine acceptance that picks the spine ratio tier.
    """

    ema_alpha: float = 0.3
    p_s_ema: float = 0.3
    counters: dict[Source, DepthCounter] = field(default_factory=dict)
    counterfactual: bool = False  # depth counters fed by ``PathCalibration.resolve`` (every built node), not update

    def counter(self, source: Source) -> DepthCounter:
        """The per-depth counter of ``source`` (created empty on first use)."""
        return self.counters.setdefault(source, DepthCounter())

    def update(self, tree: DraftTree, accepted: tuple[int, ...], ema: bool = True) -> None:
        """Record one verified tree and the accepted node indices (root excluded).

        Every node whose parent was accepted counts for its source at its depth (unless ``counterfactual``:
        then ``PathCalibration.resolve`` counts every built node once the output decides it).  ``ema``: whether this
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
