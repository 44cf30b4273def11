"""TR branch source: Token Recycling's adjacency table, harvested from every logit row.

Source: Goose paper, Appendix C.1 (bigram adjacency table, aggressive logit harvesting), extending
Token Recycling (Luo et al., 2025).  The table is ``engine/adjacency.py``; this module adapts it.
"""
from __future__ import annotations

from collections.abc import Sequence

from ..adjacency import AdjacencyTable
from ..config import DecodeConfig
from ..estimates import AcceptanceStats
from ..tree import Source
from .base import Candidates, Request, Role, SourceInfo, SourceMemory, Verified


class TrSource:
    """Proposes a node's top-K successors from the table (bigram tier first), best first, unfiltered and
    whatever the request's budget: the tree builder prunes those scored below ``min_score`` (C.1) and takes
    as many as its step allows.

    Estimates: the adjacency score as it is, or with ``tr_calibration`` the score times, per depth,
    (TR nodes accepted + 1) / (sum of their scores + 1) over TR nodes whose parent was accepted.
    """

    info = SourceInfo(Source.TR, "TR branch", "TR", "#E69F00", Role.BRANCH,
                      "the target's own top-K successors of a token, recycled from earlier logits (Token Recycling)",
                      tint="#e8a91a")

    def __init__(self, cfg: DecodeConfig, stats: AcceptanceStats, memory: SourceMemory) -> None:
        self.top_k = cfg.top_k
        self.calibrate = cfg.tr_calibration
        self.renormalise = cfg.adjacency_scores == "top-k"
        self.bigram_capacity = cfg.bigram_capacity
        self.table: AdjacencyTable | None = None  # made at prefill, when the vocabulary size is known
        self.counter = stats.counter(Source.TR)

    def prefill(self, prompt: Sequence[int], back) -> None:
        self.table = AdjacencyTable(0, self.top_k, self.bigram_capacity, renormalise=self.renormalise)
        self.table.store([None, *prompt[:-1]], list(prompt), back.successor_ids, back.successor_scores)

    def propose(self, request: Request) -> Candidates:
        row = self.table.row(request.prev, request.token)
        if row is None:
            return Candidates()
        tokens, scores = row
        p = tuple(self.rate(request.depth + 1, s) for s in scores) if self.calibrate else scores
        return Candidates(tokens, (None,) * len(tokens), scores, p)

    def rate(self, depth: int, score: float) -> float:
        """Estimated acceptance of a successor scored ``score`` at ``depth`` given its parent was accepted."""
        return min(1.0, score * self.counter.calibration(depth)) if self.calibrate else score

    def observe(self, verified: Verified) -> None:
        # every row, rejected branches and ride-along rows included (C.1)
        self.table.store(verified.row_prev_tokens(), list(verified.forward.tokens), verified.back.successor_ids,
                         verified.back.successor_scores)
