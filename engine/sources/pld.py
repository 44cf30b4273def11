"""PLD spine source: n-gram prompt lookup over the prompt and the output.

Source: Goose paper, Appendix B.2 (CONTEXTMATCH, Alg. 2 line 5) and §4.3 (confidence); PLD is Saxena
(2023).  The matching itself is ``engine/context_match.py``; this module adapts it to the protocol.
Asked below a drafted path (the confident extension of §4.3), it matches the context plus that path.
"""
from __future__ import annotations

from collections.abc import Sequence

from ..config import DecodeConfig
from ..context_match import NgramIndex, match_confidence
from ..estimates import AcceptanceStats
from ..tree import Source
from .base import Candidates, Request, Role, SourceInfo, SourceMemory, Verified


class PldSource:
    """Proposes the continuation of the longest earlier n-gram match, as a chain.

    Each chain token's estimate is the per-depth PLD acceptance rate; with ``pooled_pld_prior`` its Beta
    prior (weight 2) is centred on the rate pooled over all depths, so deep nodes of extended chains,
    rarely reached, start from what the spine achieves instead of 0.5 (docs/results.md, "GT principle").
    """

    info = SourceInfo(Source.PLD, "PLD spine", "PLD", "#0072B2", Role.SPINE,
                      "copied from an earlier n-gram match in the prompt or the output (prompt lookup)",
                      tint="#b2d5e8")
    top_k = 0

    def __init__(self, cfg: DecodeConfig, stats: AcceptanceStats, memory: SourceMemory) -> None:
        self.index = NgramIndex(cfg.ngram_sizes, cfg.occurrence)
        self.chain_tokens = cfg.pld_chain_tokens if cfg.method == "pld" else cfg.max_spine  # one lookup's length
        self.long_match, self.max_spine, self.pooled_prior = cfg.bypass_threshold, cfg.max_spine, cfg.pooled_pld_prior
        self.counter = stats.counter(Source.PLD)

    def prefill(self, prompt: Sequence[int], back) -> None:
        pass  # the index catches up with the context it is asked about (``propose``)

    def propose(self, request: Request) -> Candidates:
        self.index.extend(list(request.context[len(self.index.tokens):]))  # the tokens committed since last asked
        suffix = None if not request.path else request.tail(self.index.ngram_sizes[0])
        match = self.index.match(min(self.chain_tokens, request.budget), suffix)
        if not match.draft:
            return Candidates()
        confidence = match_confidence(len(match.draft), match.unanimous, self.long_match, self.max_spine)
        first = request.depth + 1
        return Candidates.chain(match.draft, [self.rate(first + i) for i in range(len(match.draft))],
                                match=match.n, confidence=confidence, consensus=match.consensus)

    def rate(self, depth: int) -> float:
        """Estimated acceptance of a spine token at ``depth`` given its parent was accepted."""
        return self.counter.rate(depth, self.counter.pooled() if self.pooled_prior else 0.5)

    def observe(self, verified: Verified) -> None:
        pass  # PLD learns nothing from the forward: it copies the context
