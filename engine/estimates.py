"""Online acceptance statistics: per-depth PLD rates, p_s / p_t counters and the spine-ratio EMA.

Sources: Goose §3 (p_s, p_t: acceptance rates of spine and branch tokens), §4.3 and Appendix C.3
(EMA of spine acceptance, alpha 0.3; tiers p_s < 0.2 -> r 0.15, < 0.4 -> 0.30, else 0.50), and
the GT principle (node acceptance estimates as the product of per-source estimates along the path).
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
    that its parent was accepted, with a Beta(1, 1) prior so unseen depths start at 0.5.
    """

    ema_alpha: float = 0.3
    p_s_ema: float = 0.3
    pld_reached: dict[int, int] = field(default_factory=dict)
    pld_accepted: dict[int, int] = field(default_factory=dict)

    def pld_rate(self, depth: int) -> float:
        return (self.pld_accepted.get(depth, 0) + 1) / (self.pld_reached.get(depth, 0) + 2)

    def update(self, tree: DraftTree, accepted: tuple[int, ...]) -> None:
        """Record one verified tree and the accepted node indices (root excluded)."""
        on_path = set(accepted) | {0}
        spine_total = spine_acc = 0
        for i in range(1, len(tree)):
            if tree.sources[i] is Source.PLD:  # PLD nodes form the spine (chains from the root)
                spine_total += 1
                if tree.parents[i] in on_path:  # reached: its parent was accepted
                    d = tree.depths[i]
                    self.pld_reached[d] = self.pld_reached.get(d, 0) + 1
                    self.pld_accepted[d] = self.pld_accepted.get(d, 0) + (i in on_path)
                    spine_acc += i in on_path
        if spine_total:
            self.p_s_ema = (1 - self.ema_alpha) * self.p_s_ema + self.ema_alpha * spine_acc / spine_total
