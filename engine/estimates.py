"""Online acceptance statistics: per-depth PLD rates, p_s / p_t counters and the spine-ratio EMA.

Sources: Goose §3 (p_s, p_t: acceptance rates of spine and branch tokens), §4.3 and Appendix C.3
(EMA of spine acceptance, alpha 0.3; tiers p_s < 0.2 -> r 0.15, < 0.4 -> 0.30, else 0.50), and
the GT principle (node acceptance estimates as the product of per-source, per-depth estimates along
the path, kept online).
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
class AcceptanceStats:
    """Online estimates kept for one generation session (run totals are in ``metrics``).

    ``pld_rate(depth)`` is the conditional acceptance of a PLD node at spine depth ``depth`` given
    that its parent was accepted.  With ``pooled_pld_prior`` its prior is centred on the rate pooled
    over all depths (a Beta prior of weight 2 with that mean), so the deep spine nodes of extended
    chains, rarely reached, start from what the spine achieves instead of 0.5 each (0.5^k made the GT
    estimates of long chains ~5x too pessimistic: docs/results.md); without it, Beta(1, 1) per depth.
    ``tr_rate(depth, score)`` (with ``calibrate_tr``) calibrates an adjacency score into a conditional
    acceptance: the score
    times, per depth, (TR nodes accepted + 1) / (sum of their scores + 1) over TR nodes whose parent
    was accepted, so scores start as they are and converge to what the target actually accepts.
    """

    ema_alpha: float = 0.3
    p_s_ema: float = 0.3
    calibrate_tr: bool = False  # False: tr_rate returns the adjacency score as it is
    pooled_pld_prior: bool = True  # per-depth PLD rates shrink to the pooled PLD rate (else to 0.5)
    pld_reached: dict[int, int] = field(default_factory=dict)
    pld_accepted: dict[int, int] = field(default_factory=dict)
    tr_score_sum: dict[int, float] = field(default_factory=dict)
    tr_accepted: dict[int, int] = field(default_factory=dict)
    ptd_reached: dict[int, int] = field(default_factory=dict)
    ptd_accepted: dict[int, int] = field(default_factory=dict)

    def pld_rate(self, depth: int) -> float:
        prior = 0.5
        if self.pooled_pld_prior:
            prior = (sum(self.pld_accepted.values()) + 1) / (sum(self.pld_reached.values()) + 2)
        return (self.pld_accepted.get(depth, 0) + 2 * prior) / (self.pld_reached.get(depth, 0) + 2)

    def ptd_rate(self, depth: int) -> float:
        """Conditional acceptance of a PTD candidate at ``depth`` whose parent was accepted, Beta(1, 1) prior."""
        return (self.ptd_accepted.get(depth, 0) + 1) / (self.ptd_reached.get(depth, 0) + 2)

    def tr_rate(self, depth: int, score: float) -> float:
        if not self.calibrate_tr:
            return score
        calibration = (self.tr_accepted.get(depth, 0) + 1) / (self.tr_score_sum.get(depth, 0.0) + 1)
        return min(1.0, score * calibration)

    def update(self, tree: DraftTree, accepted: tuple[int, ...], ema: bool = True) -> None:
        """Record one verified tree and the accepted node indices (root excluded).

        ``ema``: whether this tree's spine acceptance enters the EMA p_s (the authors' code leaves bypass
        chains out of it; ``DecodeConfig.ema_on_chains``).  The per-depth rates always learn from it.
        """
        on_path = set(accepted) | {0}
        spine_total = spine_acc = 0
        for i in range(1, len(tree)):
            reached, d = tree.parents[i] in on_path, tree.depths[i]  # reached: its parent was accepted
            if tree.sources[i] is Source.PLD:  # PLD nodes form the spine (chains from the root)
                spine_total += 1
                if reached:
                    self.pld_reached[d] = self.pld_reached.get(d, 0) + 1
                    self.pld_accepted[d] = self.pld_accepted.get(d, 0) + (i in on_path)
                    spine_acc += i in on_path
            elif tree.sources[i] is Source.PTD and reached:
                self.ptd_reached[d] = self.ptd_reached.get(d, 0) + 1
                self.ptd_accepted[d] = self.ptd_accepted.get(d, 0) + (i in on_path)
            elif tree.sources[i] is Source.TR and reached:
                self.tr_score_sum[d] = self.tr_score_sum.get(d, 0.0) + tree.scores[i]
                self.tr_accepted[d] = self.tr_accepted.get(d, 0) + (i in on_path)
        if spine_total and ema:
            self.p_s_ema = (1 - self.ema_alpha) * self.p_s_ema + self.ema_alpha * spine_acc / spine_total
