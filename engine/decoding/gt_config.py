"""The GT principle's settings (GT §3; engine/decoding/gt.py): which draft nodes a cycle verifies, how its tree is
sized from the cost curve, and how far the path estimates it reads are trusted.

``GtConfig`` is ``DecodeConfig.gt`` (engine/decoding/config.py, which re-exports this module's names); its flat names
(``gt_threshold``, ``gt_rate``, ``path_calibration``, ...) are those of ``GtConfig.FLAT``.  ``DecodeConfig.resolved``
turns the rule into the numbers the loop reads (``Resolved``: the c the builders prune at, the chain cap, whether
the size choice reads calibrated estimates, ``CALIBRATE_AT``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..core.checks import check, one_of

#: What GT "auto" maximises when it sizes a tree (``GtConfig.rate``; engine/decoding/gt.py): "session" = the run's
#: tokens per unit of verification time (a node stays while it beats the session's rate so far), "cycle" = the
#: tree's own expected (1 + accepted) / T(n).
GT_RATES = ("session", "cycle")

#: Named GT rules: "auto" = speedup-optimal tree size from the whole cost curve (engine/decoding/gt.py);
#: "chord" = one threshold c from the curve's chord (``CostCurve.threshold``), the earlier default.
GT_RULES = ("auto", "chord")
#: ``GtConfig.path_calibration`` "auto" calibrates where a tree's first draft row costs at least this much of an AR
#: step (``CostCurve.row_price``): llama.cpp's curve on 2 cores reads 0.7-0.9 and torch's fp32 on an AVX2 CPU about
#: 0.7 (calibrated); torch's bf16 on an AVX-512 CPU 0.03-0.25 and a CUDA graph's 0.1 (raw estimates; docs/results.md,
#: "GT on a flat curve").
CALIBRATE_AT = 0.4


def parse_gt_threshold(text: str) -> float | str:
    """Command-line form of the GT threshold: 'auto', 'chord' or a number c."""
    word = text.strip().lower()
    return word if word in GT_RULES else float(text)


@dataclass(frozen=True)
class GtConfig:
    """The GT principle: which draft nodes a cycle verifies (GT §3; engine/decoding/gt.py).

    ``threshold`` is what the user asked for; what the tree builders prune by is resolved from the cost curve
    (``DecodeConfig.resolved``: ``Resolved.prune_at``).
    """

    threshold: float | str = "auto"  # the GT rule (GT_RULES) or a number c
    # "auto": keep the speedup-optimal top of each built tree, from the whole measured cost curve (GT §3,
    # engine/decoding/gt.py; docs/results.md "GT principle: tree size");
    # a number c: drop nodes whose estimated path acceptance < c (0 disables); "chord": c from the curve's chord
    # at B (engine/decoding/cost.py)
    # GT "auto" (docs/results.md, "GT principle: tree size"; demo model and SmolLM2, four datasets):
    floor: bool = True  # the builders first prune at the chord c, so the budget goes to nodes that can pay
    # (without it the size choice trims a c = 0 tree, a worse one)
    rate: str = "session"  # what the size choice maximises (see GT_RATES): the run's tokens per ms
    path_calibration: bool | str = "auto"  # price nodes at their path estimate mapped through the session's
    # measured outcomes of earlier built nodes with like estimates, discounted by the trust in them
    # (calibration.PathCalibration): True, False, or "auto": where a tree's first draft row costs at least
    # CALIBRATE_AT of an AR step on the curve (``CostCurve.row_price``).  There it keeps GT's promise (steep
    # llama.cpp curve, predicted: 1.000 on, 0.818 off); on flat curves its doubt prunes nodes that pay (the H200's
    # graphed curve 1.467 on, 1.726 off; the demo's 3.086 / 3.211; docs/results.md, "GT on a flat curve")
    counterfactual_rates: bool = True  # the per-depth rates count every built node's outcome, not only the
    # verified ones (which the size choice selects); measured neutral, kept as the unbiased count
    chain_steps: float = 3.0  # a confident chain is extended (``Variant.max_extended_chain``) only while one
    # forward of it costs at most this many AR steps on the curve: the path estimates of a long extension are
    # the least reliable (docs/results.md, "GT principle: tree size", the chain cap)

    rest_after: int = 32  # after this many cycles in a row that the size choice priced down to the anchor, the
    # branch sources (TR) rest in all but every rest_after-th cycle until a draft is verified again: no successors
    # drafted, none read back (GT §3.1 Eq. 6 prices a row's harvest, and on a steep curve no tree uses it); the
    # cycles between keep the estimates learning.  0: they never rest.  32: the demo's flat curve keeps its trees
    # (predicted 2.164 at 32 and off, 2.158 at 16, 2.064 at 4: docs/results.md, "GT on a steep curve")

    FLAT: ClassVar[dict[str, str]] = {"threshold": "gt_threshold", "floor": "gt_floor", "rate": "gt_rate",
                                      "chain_steps": "gt_chain_steps", "rest_after": "gt_rest_after"}

    def __post_init__(self) -> None:
        check([
            (self.threshold in GT_RULES
             or (isinstance(self.threshold, (int, float)) and 0.0 <= self.threshold < 1.0),
             f"GT threshold c must be 'auto', 'chord' or in [0, 1) (got {self.threshold!r})"),
            one_of(self.rate, GT_RATES, "GT rate"),
            (1.0 <= self.chain_steps <= 1000.0, f"GT chain steps must be in [1, 1000] (got {self.chain_steps})"),
            (self.path_calibration in (True, False, "auto"),
             f"path calibration must be true, false or 'auto' (got {self.path_calibration!r})"),
            (isinstance(self.rest_after, int) and 0 <= self.rest_after <= 1000,
             f"GT rest after must be a whole number of cycles in [0, 1000] (got {self.rest_after!r})"),
        ])

    @property
    def auto(self) -> bool:
        """The speedup-optimal size choice sizes each tree (``threshold`` "auto")."""
        return self.threshold == "auto"


__all__ = ["CALIBRATE_AT", "GT_RATES", "GT_RULES", "GtConfig", "parse_gt_threshold"]
