"""PTD perturbation source: progressive tree drafting's pool, fed by rows that ride along in every forward.

Source: PTD paper, §3.2 (progressive draft tree, stepping, merge M into a pool keyed by root token),
§3.3 (the candidate tree of the current anchor verified in the same forward), Algorithm 1.  The tree
and the pool are ``engine/ptd.py``; this module adapts them to the protocol.
"""
from __future__ import annotations

from collections.abc import Sequence

from ..config import DecodeConfig
from ..estimates import AcceptanceStats
from ..ptd import CandidatePool, ProgressiveTree, Trie
from ..tree import Source
from .base import Candidates, Request, Role, Rows, SourceInfo, SourceMemory, Verified


class PtdSource:
    """Proposes, at the anchor, the pool's candidate tree for the anchor token (the whole tree: the builder
    keeps its best nodes), with T's rows to ride along; nothing below other nodes.  A candidate's estimate
    is the per-depth PTD acceptance rate, Beta(1, 1) prior."""

    info = SourceInfo(Source.PTD, "PTD perturbation", "PTD", "#009E73", Role.POOL,
                      "a candidate from the pool progressive tree drafting grows in the forward's extra rows",
                      tint="#1aa881")
    top_k = 0

    def __init__(self, cfg: DecodeConfig, stats: AcceptanceStats, memory: SourceMemory) -> None:
        self.cfg = cfg
        self.pool = CandidatePool(width=cfg.ptd_width, max_depth=cfg.ptd_depth)
        self.tree: ProgressiveTree | None = None
        self.counter = stats.counter(Source.PTD)

    def prefill(self, prompt: Sequence[int], back) -> None:
        cfg = self.cfg
        self.tree = ProgressiveTree(list(prompt), width=cfg.ptd_width, max_depth=cfg.ptd_depth,
                                    max_rows=cfg.ptd_rows, seed=cfg.seed)

    def propose(self, request: Request) -> Candidates:
        if request.depth:
            return Candidates()
        tokens, parents = self.tree.rows()
        rows = Rows(tuple(tokens), tuple(parents), Source.PTD_ROW)
        trie = self.pool.get(request.token)
        if trie is None:
            return Candidates(rows=rows)
        tokens, parents, depths = _flatten(trie, request.depth)
        p = tuple(self.counter.rate(d, 0.5) for d in depths)
        return Candidates(tuple(tokens), tuple(parents), p, p, rows=rows)

    def observe(self, verified: Verified) -> None:
        # PTD Alg. 1 steps 3-4: extend T by each row's greedy token, merge its subtrees into the pool
        self.tree.grow(verified.greedy_of(Source.PTD_ROW), self.pool)


def _flatten(trie: Trie, depth: int) -> tuple[list[int], list[int | None], list[int]]:
    """(tokens, parents, depths) of a trie's nodes in breadth-first order; depths count from the anchor."""
    tokens, parents, depths = [], [], []
    queue: list[tuple[Trie, int | None, int]] = [(trie, None, depth)]
    for node, index, d in queue:
        for tok, sub in node.children.items():
            tokens.append(tok)
            parents.append(index)
            depths.append(d + 1)
            queue.append((sub, len(tokens) - 1, d + 1))
    return tokens, parents, depths
