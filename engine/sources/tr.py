"""TR branch source: Token Recycling's adjacency table, harvested from every logit row, and its adapter.

Source: Goose paper, Appendix C.1 ("Dense GPU bigram adjacency table", "Aggressive logit harvesting"),
extending Token Recycling's adjacency matrix (Luo et al., 2025) with a bigram tier.

The top-K of each logit row is taken on the model's device (``engine.core.verify.top_successors``, the score
definition of the table) and read back in the cycle's one device-to-host copy (``verify.read_back``); the table
itself lives on the host, where the tree builder reads it, so a lookup never waits for the device.  (The paper
keeps a dense GPU table because its tree builder runs on the GPU; ours is Python, and a per-lookup device read
would cost one host sync per node.)

Tier 1 (unigram) maps ``token -> top-K``; tier 2 (bigram) maps ``(prev, token) -> top-K`` and is a bounded LRU
dictionary.  Scores are the target's softmax probabilities at harvest time (in [0, 1]); a token never observed
has no row.  One table belongs to one generation session; it is never shared.  ``TrSource`` adapts the table to
the draft-source protocol (``engine.sources.base``).
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import ClassVar

import numpy as np
import torch

from ..core.checks import check, one_of
from ..core.estimates import AcceptanceStats
from ..core.verify import top_successors
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

#: One table row: successor token ids and their scores, best first.
Row = tuple[tuple[int, ...], tuple[float, ...]]


@cache
def _roots(m: int) -> tuple[None, ...]:
    """The parents of m candidates that all hang below the node asked about (made once per m, not per lookup)."""
    return (None,) * m


class AdjacencyTable:
    """Token Recycling's adjacency table on the host (Goose App. C.1): for each token, the target's top-K successors
    read off the last logit row whose input it was (tier 1), and for each (previous token, token) pair the same
    (tier 2, an LRU of ``bigram_capacity`` rows); scores are probabilities in [0, 1] (``renormalise``: over the K
    alone).  ``store`` writes a forward's rows, ``row`` / ``successors`` read one, bigram first.  One per generation.

    Args:
        vocab_size: the model's vocabulary (kept for the record; rows are sparse, keyed by token).
        top_k: K, successors per row.
        bigram_capacity: rows kept in tier 2.
        renormalise: scores as a softmax over the K logits (the authors' code) instead of the full softmax.
    """

    def __init__(self, vocab_size: int, top_k: int = 10, bigram_capacity: int = 65536,
                 renormalise: bool = False) -> None:
        self.vocab_size = vocab_size
        self.top_k = top_k
        self.unigram: dict[int, Row] = {}  # token -> latest top-K (at most |V| rows)
        self.bigram: OrderedDict[tuple[int, int], Row] = OrderedDict()
        self.bigram_capacity = bigram_capacity
        self.renormalise = renormalise  # scores: softmax over the top-K logits (authors' code), not the full softmax

    def store(self, prev_tokens: list[int | None], tokens: list[int], ids: list[list[int]],
              scores: list[list[float]]) -> None:
        """Store host rows (read back by ``verify.read_back``) as the successors of each row's input token.

        Args:
            prev_tokens: per row, the token before ``tokens[i]`` on its path (None for the first token
                of the sequence); keys the bigram tier.
            tokens: (n,) input token of each row.
            ids, scores: (n, k) successor ids and scores of each row, best first (``top_successors``): int64 and
                float64 arrays (a ``ReadBack``'s, turned into Python numbers here), or lists of lists.
        """
        if isinstance(ids, np.ndarray):  # a read-back's arrays: one conversion, the rows as Python numbers
            ids, scores = ids.tolist(), scores.tolist()
        for prev, tok, ri, rp in zip(prev_tokens, tokens, ids, scores):
            if self.renormalise:  # softmax over the top-K logits = each top-K probability over their sum
                total = sum(rp)
                rp = [p / total for p in rp]
            row = (tuple(ri), tuple(rp))
            self.unigram[tok] = row
            if prev is None:
                continue
            key = (prev, tok)
            self.bigram[key] = row
            self.bigram.move_to_end(key)
        while len(self.bigram) > self.bigram_capacity:
            self.bigram.popitem(last=False)

    @torch.no_grad()
    def harvest(self, prev_tokens: list[int | None], tokens: torch.Tensor | list[int], logits: torch.Tensor) -> None:
        """``top_successors`` of every logit row, read back in one copy, then ``store``d (the prefill's path).

        Args:
            prev_tokens: see ``store``.  tokens: (n,) int64 input token of each row.
            logits: (n, |V|) logits of the same rows (any dtype, any device).
        """
        scores, ids = top_successors(logits, self.top_k)  # (n, k), (n, k)
        both = torch.cat([ids.double(), scores.double()], dim=-1).tolist()  # one device->host copy; ids < 2^53
        k = ids.shape[-1]
        toks = tokens.tolist() if isinstance(tokens, torch.Tensor) else list(tokens)
        self.store(prev_tokens, toks, [[int(t) for t in r[:k]] for r in both], [r[k:] for r in both])

    def row(self, prev: int | None, token: int) -> Row | None:
        """The stored row of ``token`` (bigram tier first, then unigram), or None when never observed."""
        row = self.bigram.get((prev, token)) if prev is not None else None
        return row if row is not None else self.unigram.get(token)

    def successors(self, prev: int | None, token: int, min_score: float = 0.0) -> list[tuple[int, float]]:
        """Top-K ``(token id, score)`` successors of ``token``, best first, bigram tier first.

        Falls back to the unigram row when ``(prev, token)`` was never observed; returns [] when
        ``token`` was never observed either.  Successors scored below ``min_score`` are dropped.
        """
        row = self.bigram.get((prev, token)) if prev is not None else None
        if row is None:
            row = self.unigram.get(token)
            if row is None:
                return []
        return [(t, s) for t, s in zip(*row) if s >= min_score]

    def has_successors(self, prev: int | None, token: int) -> bool:
        return bool(self.successors(prev, token))


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

    def rate(self, depth: int, score: float) -> float:
        """Estimated acceptance of a successor scored ``score`` at ``depth`` given its parent was accepted."""
        return min(1.0, score * self.counter.calibration(depth)) if self.calibrate else score

    def observe(self, verified: Verified) -> None:
        # every row, rejected branches and ride-along rows included (C.1)
        self.table.store(verified.row_prev_tokens(), list(verified.forward.tokens), verified.back.successor_ids,
                         verified.back.successor_scores)
