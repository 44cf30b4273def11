"""TR adjacency table: top-K successors per token, harvested from every logit row.

Source: Goose paper, Appendix C.1 ("Dense GPU bigram adjacency table", "Aggressive logit
harvesting"), extending Token Recycling's adjacency matrix (Luo et al., 2025) with a bigram tier.

Tier 1 (unigram) is dense: ``ids`` and ``scores`` tensors of shape (|V|, K) on the model's device.
Tier 2 (bigram) maps ``(prev, token) -> top-K`` and is a bounded LRU dictionary.
Scores are the target's softmax probabilities at harvest time (float32, in [0, 1]); a row of zeros
means "never observed".  One table belongs to one generation session; it is never shared.
"""
from __future__ import annotations

from collections import OrderedDict

import torch


class AdjacencyTable:
    def __init__(self, vocab_size: int, top_k: int = 10, device: torch.device | str = "cpu",
                 bigram_capacity: int = 65536) -> None:
        self.vocab_size = vocab_size
        self.top_k = top_k
        self.ids = torch.zeros(vocab_size, top_k, dtype=torch.long, device=device)  # (|V|, K)
        self.scores = torch.zeros(vocab_size, top_k, dtype=torch.float32, device=device)  # (|V|, K)
        self.bigram: OrderedDict[tuple[int, int], tuple[tuple[int, ...], tuple[float, ...]]] = OrderedDict()
        self.bigram_capacity = bigram_capacity

    @torch.no_grad()
    def harvest(self, prev_tokens: list[int | None], tokens: torch.Tensor, logits: torch.Tensor) -> None:
        """Store the top-K of every logit row as the successors of that row's input token.

        Args:
            prev_tokens: per row, the token before ``tokens[i]`` on its path (None for the first
                token of the sequence); keys the bigram tier.
            tokens: (n,) int64 input token of each row.
            logits: (n, |V|) float logits of the same rows (any dtype, any device).
        """
        k = min(self.top_k, logits.shape[-1])
        probs = torch.softmax(logits.float(), dim=-1)  # (n, |V|)
        top_p, top_i = probs.topk(k, dim=-1)  # (n, k), (n, k)
        tokens = tokens.to(self.ids.device)
        self.ids[tokens, :k] = top_i.to(self.ids.device)
        self.scores[tokens, :k] = top_p.to(self.scores.device)
        rows_i, rows_p, toks = top_i.tolist(), top_p.tolist(), tokens.tolist()  # one device->host copy
        for prev, tok, ri, rp in zip(prev_tokens, toks, rows_i, rows_p):
            if prev is None:
                continue
            key = (prev, tok)
            self.bigram[key] = (tuple(ri), tuple(rp))
            self.bigram.move_to_end(key)
        while len(self.bigram) > self.bigram_capacity:
            self.bigram.popitem(last=False)

    def successors(self, prev: int | None, token: int, min_score: float = 0.0) -> list[tuple[int, float]]:
        """Top-K ``(token id, score)`` successors of ``token``, best first, bigram tier first.

        Falls back to the unigram row when ``(prev, token)`` was never observed; returns [] when
        ``token`` was never observed either.  Successors scored below ``min_score`` are dropped.
        """
        row = self.bigram.get((prev, token)) if prev is not None else None
        if row is None:
            scores = self.scores[token].tolist()
            if scores[0] <= 0.0:
                return []
            row = (tuple(self.ids[token].tolist()), tuple(scores))
        return [(t, s) for t, s in zip(*row) if s >= min_score]

    def has_successors(self, prev: int | None, token: int) -> bool:
        return bool(self.successors(prev, token))
