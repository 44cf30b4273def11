"""TR branch source: Token Recycling's adjacency table, harvested from every logit row, and its adapter.

Source: Goose paper, Appendix C.1 ("Dense GPU bigram adjacency table", "Aggressive logit harvesting"),
extending Token Recycling's adjacency matrix (Luo et al., 2025) with a bigram tier.

The top-K of each logit row is taken on the model's device (``engine.core.verify.top_successors``, the score
definition of the table) and read back in the cycle's one device-to-host copy (``verify.read_back``); the table
itself (``engine.sources.adjacency``) lives on the host in arrays, where the compiled tree builder
(``engine.decoding.spine_kernel``) reads it, so a lookup never waits for the device.  (The paper keeps a dense GPU
table because its tree builder runs on the GPU; a per-lookup device read here would cost one host sync per node.)

Tier 1 (unigram) maps ``token -> top-K``; tier 2 (bigram) maps ``(prev, token) -> top-K`` and is a bounded LRU
of writes.  Scores are the target's softmax probabilities at harvest time (in [0, 1]); a token never observed
has no row.  One table belongs to one generation session; it is never shared.  ``TrSource`` adapts the table to
the draft-source protocol (``engine.sources.base``).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import ClassVar

import numpy as np

from ..core.checks import check, one_of
from ..core.estimates import AcceptanceStats
from .adjacency import AdjacencyTable
from .base import Candidates, Request, Role, RunConfig, SourceInfo, SourceMemory, Verified
from .engines import Serve

#: TR score definitions (``TrConfig.adjacency_scores``): "softmax" = probability under the full softmax;
#: "top-k" = softmax over the top-K logits only (the authors' code; a row's K scores sum to 1).
ADJACENCY_SCORES = ("softmax", "top-k")


@dataclass(frozen=True)
class TrConfig:
    """TR's own settings (``DecodeConfig.source_config("tr")``); the table's width K is ``TreeShape.top_k``
    (Table 5 names it with the tree's shape).  ``FLAT`` names each field as the CLI and trace files do."""

    adjacency_scores: str = "softmax"  # see ADJACENCY_SCORES (the authors' top-k softmax: docs/results.md,
    # "Fidelity to the authors' implementation")
    bigram_capacity: int = 65536  # rows kept in the bigram tier (LRU); bounds memory per session
    calibration: bool = False  # calibrate TR scores online per depth for GT estimates; off: it grew trees
    # that cost more than they earned (docs/history.md, "Ideas tried and not kept")

    FLAT: ClassVar[dict[str, str]] = {"adjacency_scores": "adjacency_scores", "bigram_capacity": "bigram_capacity",
                                      "calibration": "tr_calibration"}
    extra_rows: ClassVar[int] = 0  # TR rides no rows along in the forward

    def __post_init__(self) -> None:
        check([one_of(self.adjacency_scores, ADJACENCY_SCORES, "adjacency scores"),
               (self.bigram_capacity >= 0, f"bigram capacity must be >= 0 (got {self.bigram_capacity})")])

    def serve(self) -> Serve:
        """The nearest engine drafter: SGLang's NGRAM, the production drafter that verifies a tree."""
        return Serve("SGLang", {"speculative-algorithm": "NGRAM"},
                     differs="No serving engine drafts from the model's own logits (Token Recycling's adjacency "
                             "table); SGLang's NGRAM is the nearest tree drafter, from a trie of earlier outputs.")

_NO_CALIBRATION = np.zeros(0, np.float64)  # TR's estimates are its scores


@cache
def _roots(m: int) -> tuple[None, ...]:
    """The parents of m candidates that all hang below the node asked about (made once per m, not per lookup)."""
    return (None,) * m


class TrSource:
    """Proposes a node's top-K successors from the table (bigram tier first), best first, unfiltered and
    whatever the request's budget: the tree builder prunes those scored below ``min_score`` (C.1) and takes
    as many as its step allows.

    Estimates: the adjacency score as it is, or with ``TrConfig.calibration`` the score times, per depth,
    (TR nodes accepted + 1) / (sum of their scores + 1) over TR nodes whose parent was accepted.
    """

    info = SourceInfo("tr", "TR branch", "TR", "#E69F00", Role.BRANCH,
                      "the target's own top-K successors of a token, recycled from earlier logits (Token Recycling)",
                      tint="#e8a91a", method_label="TR only (tree)")

    config_type = TrConfig  # its own settings: DecodeConfig.source_config(info.name) holds one

    def __init__(self, cfg: RunConfig, stats: AcceptanceStats, memory: SourceMemory) -> None:
        own: TrConfig = cfg.source_config(self.info.name)
        self.top_k = cfg.tree.top_k
        self.calibrate = own.calibration
        self.renormalise = own.adjacency_scores == "top-k"
        self.bigram_capacity = own.bigram_capacity
        self.table: AdjacencyTable | None = None  # made at prefill, when the vocabulary size is known
        self.counter = stats.counter(self.info.source)

    def prefill(self, prompt: Sequence[int], back) -> None:
        self.table = AdjacencyTable(0, self.top_k, self.bigram_capacity, renormalise=self.renormalise)
        self.table.store([None, *prompt[:-1]], list(prompt), back.successor_ids, back.successor_scores)

    def propose(self, request: Request) -> Candidates:
        row = self.table.row(request.prev, request.token)
        if row is None:
            return Candidates()
        tokens, scores = row
        p = tuple(self.rate(request.depth + 1, s) for s in scores) if self.calibrate else scores
        return Candidates(tokens, _roots(len(tokens)), scores, p)

    def successor_table(self, depths: int) -> tuple:
        """The table as the compiled tree builder reads it (``engine.decoding.spine_kernel.grow``): its arrays and
        bigram map (``AdjacencyTable.arrays``), then (depths,) float64 calibration factors per depth (``rate``), or
        (0,) when the estimates are the scores."""
        a = self.table.arrays
        calib = (np.array([self.counter.calibration(d) for d in range(depths)], np.float64) if self.calibrate
                 else _NO_CALIBRATION)
        return (a.uni_slot, a.uni_ids, a.uni_scores, a.uni_len, a.bi_ids, a.bi_scores, a.bi_len, self.table.bigram,
                calib)

    def rate(self, depth: int, score: float) -> float:
        """Estimated acceptance of a successor scored ``score`` at ``depth`` given its parent was accepted."""
        return min(1.0, score * self.counter.calibration(depth)) if self.calibrate else score

    def observe(self, verified: Verified) -> None:
        # every row, rejected branches and ride-along rows included (C.1)
        self.table.store(verified.row_prev_tokens(), list(verified.forward.tokens), verified.back.successor_ids,
                         verified.back.successor_scores)
