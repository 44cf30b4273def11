"""BUILDSPINETREE and the linear (bypass) chain.

Source: Goose paper, Algorithm 1 (BUILDSPINETREE), Appendix B.1 (duplicate exclusion, BFS
extension) and C.1 (successors scored < 0.01 pruned).  The GT threshold c (GT principle paper,
§3) is enforced by ``TreeBuilder.add``: a node whose estimated path acceptance is below c is not
added (it becomes a ghost) and its budget goes to the next candidate.
"""
from __future__ import annotations

import heapq
import itertools
import math
from collections import deque

from .adjacency import AdjacencyTable
from .config import DecodeConfig
from .estimates import AcceptanceStats
from .ptd import Trie
from .tree import DraftTree, GhostNode, Source, TreeBuilder

Built = tuple[DraftTree, tuple[GhostNode, ...]]


def build_chain(anchor: int, draft: tuple[int, ...], stats: AcceptanceStats, gt_threshold: float = 0.0) -> Built:
    """Linear chain anchor -> draft[0] -> ... (bypass mode, Goose §4.3; also the PLD baseline)."""
    builder = TreeBuilder(anchor, budget=len(draft) + 1, max_depth=max(1, len(draft)), gt_threshold=gt_threshold)
    node = 0
    for depth, tok in enumerate(draft, 1):
        node = builder.add(node, tok, Source.PLD, stats.pld_rate(depth))
        if node is None:
            break
    return builder.freeze()


def build_spine_tree(anchor: int, prev: int | None, spine: tuple[int, ...], table: AdjacencyTable | None,
                     cfg: DecodeConfig, spine_ratio: float, stats: AcceptanceStats, ptd: Trie | None = None,
                     budget: int | None = None) -> Built:
    """Goose Algorithm 1.

    Args:
        anchor: token id at the root (the last committed token).
        prev: the token before ``anchor`` (bigram context of the root), or None.
        spine: PLD draft chain d (possibly empty: then the tree is TR-only).
        table: adjacency table A, or None when TR is disabled (then the tree is the spine alone).
        cfg: spine-branch ratio rho, max depth D, min score, GT threshold c (a float here: ``SpecDecoder``
            resolves "auto"), ``depth_bounds_spine``, ``spine_branch_min``, ``branch_growth``.
        spine_ratio: r for this cycle.
        stats: supplies the per-depth PLD (and PTD) acceptance estimates.
        ptd: the PTD candidate tree for ``anchor`` (PTD §3.3), or None.
        budget: node budget of this cycle, root included (default ``cfg.budget``; the confidence
            schedule of §4.3 raises it on confident cycles).

    Returns:
        (tree, ghosts): at most ``budget`` nodes (root included); branch nodes at depth <= D, spine nodes
        too when ``cfg.depth_bounds_spine`` (otherwise the spine is bounded by ``floor(budget r)`` only,
        as in the authors' code, where D bounds branch extension).

    Step 3 gives spine node i ``floor(b_sp (1/i) / H)`` branches, at least ``cfg.spine_branch_min`` while
    the spine-branch share lasts.  Step 4 (``cfg.branch_growth``) expands branch leaves either best-first
    by estimated path acceptance (a priority-queue BFS, so the remaining budget goes to the candidates
    most likely to be accepted wherever they are) or breadth-first with a score-proportional width
    (the authors' code, C.1 "confidence-aware branch width").

    PTD (our extension; the Goose paper has two sources): after the spine, PTD candidates take up to
    ``ptd_share`` of the remaining budget, best-first by their per-depth estimate (step 1b); steps
    2-4 share what is left by the paper's ratios.
    """
    B, rho, D = cfg.budget if budget is None else budget, cfg.spine_branch_ratio, cfg.max_depth
    b = TreeBuilder(anchor, budget=B, max_depth=D if cfg.depth_bounds_spine else B, gt_threshold=cfg.gt_threshold)

    # Step 1: lay the PLD spine, b_s = min(m, floor(B r)) nodes (also bounded by B - 1, and by D if asked).
    n_spine = min(len(spine), math.floor(B * spine_ratio), B - 1, D if cfg.depth_bounds_spine else B)
    spine_nodes = [0]
    for depth, tok in enumerate(spine[:n_spine], 1):
        node = b.add(spine_nodes[-1], tok, Source.PLD, stats.pld_rate(depth))
        if node is None:
            break
        spine_nodes.append(node)
    n_spine = len(spine_nodes) - 1
    # Step 1b: PTD candidates (merged into the spine where they share its tokens).
    if ptd is not None:
        add_ptd_candidates(b, ptd, math.floor((B - 1 - n_spine) * cfg.ptd_share), stats)
    if table is None:
        return b.freeze()
    context = [prev, anchor, *spine[:n_spine]]  # context[i + 1] is the token of spine node i

    def attach(node: int, count: int) -> list[int]:
        """Attach up to ``count`` top successors of ``node`` that are not already its children."""
        taken = b.child_tokens(node)
        added = []
        for tok, score in table.successors(context[node_pos[node]], context[node_pos[node] + 1], cfg.min_score):
            if len(added) >= count:
                break
            p = stats.tr_rate(b.depth[node] + 1, score)
            if tok not in taken and (child := b.add(node, tok, Source.TR, score, p)) is not None:
                added.append(child)
        return added

    node_pos = {node: i for i, node in enumerate(spine_nodes)}
    # Step 2: root branches, b_r = floor((B - 1 - b_s)(1 - rho)) (B - 1 - b_s: what steps 1-1b left);
    # with no spine the root takes it all.
    left = B - len(b.tokens)
    n_root = math.floor(left * (1 - rho)) if n_spine else left
    branches = attach(0, n_root)
    # Step 3: spine branches with harmonic decay, a_i = floor(b_sp (1/i) / sum_j 1/j), at least
    # spine_branch_min each while the share b_sp lasts.
    share = left - n_root
    harmonic = sum(1 / j for j in range(1, n_spine + 1))
    for i in range(1, n_spine + 1):
        count = min(share, max(cfg.spine_branch_min, math.floor((left - n_root) * (1 / i) / harmonic)))
        share -= count
        branches += attach(spine_nodes[i], count)
    # Step 4: extend all branch leaves through A up to depth D within the remaining budget.
    grow = _extend_best_first if cfg.branch_growth == "best-first" else _extend_score_width
    grow(b, branches, table, cfg, stats)
    return b.freeze()


def _extend_best_first(b: TreeBuilder, seeds: list[int], table: AdjacencyTable, cfg: DecodeConfig,
                       stats: AcceptanceStats) -> None:
    """Alg. 1 step 4, best-first: one heap of candidate children over the tree, by estimated path acceptance."""
    order = itertools.count()
    heap: list[tuple[float, int, int, int, float, float]] = []  # (-est. acceptance, tie, parent, token, score, p)

    def push_successors(node: int) -> None:
        if not b.can_grow(node) or b.depth[node] >= cfg.max_depth:
            return
        prev = b.tokens[b.parents[node]] if b.parents[node] is not None else None
        for tok, score in table.successors(prev, b.tokens[node], cfg.min_score):
            p = stats.tr_rate(b.depth[node] + 1, score)
            heapq.heappush(heap, (-b.est[node] * p, next(order), node, tok, score, p))

    for node in seeds:
        push_successors(node)
    while heap and not b.full:
        _, _, parent, tok, score, p = heapq.heappop(heap)
        if tok in b.child_tokens(parent):
            continue
        child = b.add(parent, tok, Source.TR, score, p)
        if child is None:
            break  # budget full, or the best remaining candidate is below c (so are all the others)
        push_successors(child)


def _extend_score_width(b: TreeBuilder, seeds: list[int], table: AdjacencyTable, cfg: DecodeConfig,
                        stats: AcceptanceStats) -> None:
    """Alg. 1 step 4 as the authors' code does it: breadth-first from the branch seeds; a node of depth d
    and adjacency score s gets its top ``max(1, min(K, ceil(remaining budget * s)))`` successors, at most
    ``max(1, K // d)``, skipping those scored below ``min_score``; nodes at depth D are not extended."""
    queue = deque(seeds)
    while queue and not b.full:
        node = queue.popleft()
        depth = b.depth[node]
        if depth >= cfg.max_depth:
            continue
        prev = b.tokens[b.parents[node]] if b.parents[node] is not None else None
        successors = table.successors(prev, b.tokens[node])
        width = max(1, min(len(successors), math.ceil((b.budget - len(b.tokens)) * b.scores[node])))
        for tok, score in successors[: min(width, max(1, cfg.top_k // depth))]:
            if b.full or score < cfg.min_score:
                break
            child = b.add(node, tok, Source.TR, score, stats.tr_rate(depth + 1, score))
            if child is not None:
                queue.append(child)


def add_ptd_candidates(b: TreeBuilder, trie: Trie, quota: int, stats: AcceptanceStats) -> None:
    """Add up to ``quota`` nodes of the PTD candidate tree below the root, best-first by estimated path
    acceptance (per-depth PTD rate, ``AcceptanceStats.ptd_rate``).  A candidate whose token is already
    a child of its parent (e.g. on the spine) reuses that node at no budget cost."""
    order = itertools.count()
    heap: list[tuple[float, int, int, int, Trie]] = []  # (-est. acceptance, tie, parent node, token, its trie)

    def push_children(node: int, at: Trie) -> None:
        for tok, sub in at.children.items():
            p = stats.ptd_rate(b.depth[node] + 1)
            heapq.heappush(heap, (-b.est[node] * p, next(order), node, tok, sub))

    push_children(0, trie)
    added = 0
    while heap and added < quota and not b.full:
        _, _, parent, tok, sub = heapq.heappop(heap)
        node = b.child_with(parent, tok)
        if node is None:
            node = b.add(parent, tok, Source.PTD, stats.ptd_rate(b.depth[parent] + 1))
            if node is None:
                continue  # too deep, or below c (its subtree would be too)
            added += 1
        if b.depth[node] < b.max_depth:
            push_children(node, sub)


def build_ptd_tree(anchor: int, trie: Trie | None, cfg: DecodeConfig, stats: AcceptanceStats) -> Built:
    """The PTD-only method: the anchor plus its candidate tree from the pool (PTD §3.3), within B and D."""
    b = TreeBuilder(anchor, budget=cfg.budget, max_depth=cfg.max_depth, gt_threshold=cfg.gt_threshold)
    if trie is not None:
        add_ptd_candidates(b, trie, cfg.budget - 1, stats)
    return b.freeze()


def build_isotropic_tree(anchor: int, prev: int | None, spine: tuple[int, ...], table: AdjacencyTable | None,
                         cfg: DecodeConfig, k: int, stats: AcceptanceStats, budget: int | None = None) -> Built:
    """Iso(k): a balanced k-ary tree with the same budget and draft sources (Goose §5.3, Table 1).

    Breadth-first, every node gets up to ``k`` children until B nodes or depth D: the PLD
    continuation first while the node is on the spine, then the adjacency table's top successors.
    Source-blind in shape (uniform rate), unlike the spine tree.  ``budget`` defaults to ``cfg.budget``;
    pass ``spine=()`` for the authors' control, built from the adjacency table alone.
    """
    b = TreeBuilder(anchor, budget=cfg.budget if budget is None else budget, max_depth=cfg.max_depth,
                    gt_threshold=cfg.gt_threshold)
    frontier = [(0, prev, 0)]  # (node, its parent's token, spine depth or -1 when off the spine)
    while frontier and not b.full:
        next_frontier = []
        for node, node_prev, spine_depth in frontier:
            if not b.can_grow(node):
                continue
            candidates: list[tuple[int, Source, float, float, int]] = []  # (token, source, score, p, spine depth)
            if 0 <= spine_depth < len(spine):
                rate = stats.pld_rate(spine_depth + 1)
                candidates.append((spine[spine_depth], Source.PLD, rate, rate, spine_depth + 1))
            if table is not None:
                candidates += [(t, Source.TR, s, stats.tr_rate(b.depth[node] + 1, s), -1)
                               for t, s in table.successors(node_prev, b.tokens[node], cfg.min_score)]
            taken: set[int] = set()
            for tok, src, score, p, child_spine in candidates:
                if len(taken) >= k or b.full:
                    break
                if tok in taken:
                    continue
                child = b.add(node, tok, src, score, p)
                if child is not None:
                    taken.add(tok)
                    next_frontier.append((child, b.tokens[node], child_spine))
        frontier = next_frontier
    return b.freeze()
