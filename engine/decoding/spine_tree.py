"""BUILDSPINETREE, the linear (bypass) chain, Iso(k) and the single-source candidate tree.

Source: Goose paper, Algorithm 1 (BUILDSPINETREE), Appendix B.1 (duplicate exclusion, BFS
extension) and C.1 (successors scored < 0.01 pruned).  The GT threshold c (GT principle paper,
§3) is enforced by ``TreeBuilder.add``: a node whose estimated path acceptance is below c is not
added (it becomes a ghost) and its budget goes to the next candidate.

The builders read the draft sources only through ``Proposals``: the spine's chain, the candidate
trees offered at the anchor, and the successors the branch sources offer at any node
(``engine/sources``: a source's ``Role`` says which of the three it feeds).

Alg. 1 step 4 (``Variant.branch_growth``) expands branch leaves either best-first by estimated path
acceptance (a priority-queue BFS, so the remaining budget goes to the candidates most likely to be accepted
wherever they are) or breadth-first with a score-proportional width (the authors' code, C.1 "confidence-aware
branch width").
"""
from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from itertools import repeat
from typing import NamedTuple

from ..core.tree import Built, Source, TreeBuilder
from ..sources.base import Candidates, DraftSource, Request
from .config import DecodeConfig


class Branch(NamedTuple):
    """One successor a branch source offers at a node (a NamedTuple: step 4 makes hundreds per cycle)."""

    token: int
    source: Source
    score: float  # the score shown (TR: adjacency probability)
    p: float  # estimated acceptance given the parent was accepted


_branch = partial(tuple.__new__, Branch)  # a Branch of a (token, source, score, p) tuple, made without a Python call


@dataclass(frozen=True)
class Proposals:
    """What the draft sources offer one cycle's tree (the inputs of Alg. 1).

    Attributes:
        context: committed tokens (prompt + output), ending with the anchor.
        spine: the spine's chain (``Candidates.chain``; empty: no spine) and ``spine_source`` its source.
        pool: candidate trees at the anchor, with their sources (step 1b: PTD; a spine source's
            candidates off the spine, e.g. the suffix tree's other branches, or PLD's chain when the
            suffix match won the spine).
        branch_sources: the sources asked for successors at any node (steps 2-4: TR).
    """

    context: Sequence[int]
    spine: Candidates = Candidates()
    spine_source: Source | None = None
    pool: tuple[tuple[Source, Candidates], ...] = ()
    branch_sources: tuple[DraftSource, ...] = ()

    @property
    def anchor(self) -> int:
        return self.context[-1]

    def successors(self, path: tuple[int, ...]) -> list[Branch]:
        """Every branch source's successors of the node reached by ``path`` (draft tokens below the anchor),
        unfiltered, best first per source."""
        out: list[Branch] = []
        for src in self.branch_sources:
            found = src.propose(Request(self.context, path))
            if found.parents.count(None) == len(found):  # all below the node (TR's rows): made in C, no loop of ours
                out += map(_branch, zip(found.tokens, repeat(src.info.source), found.scores, found.p))
            else:
                out += [Branch(t, src.info.source, s, p) for t, s, p, parent in
                        zip(found.tokens, found.scores, found.p, found.parents) if parent is None]
        return out


def build_chain(anchor: int, chain: Candidates, source: Source, gt_threshold: float | None = 0.0) -> Built:
    """Linear chain anchor -> chain[0] -> ... (bypass mode, Goose §4.3; also the PLD baseline)."""
    n = len(chain)
    builder = TreeBuilder(anchor, budget=n + 1, max_depth=max(1, n), gt_threshold=gt_threshold)
    _lay_chain(builder, chain, source, n)
    return builder.freeze()


def _lay_chain(b: TreeBuilder, chain: Candidates, source: Source | None, n: int) -> list[int]:
    """Add the first ``n`` tokens of ``chain`` as a path from the root, until the builder refuses one (budget,
    depth or GT threshold); returns the path's node indices, root first."""
    nodes = [0]
    for tok, p in zip(chain.tokens[:n], chain.p):
        node = b.add(nodes[-1], tok, source, p)
        if node is None:
            break
        nodes.append(node)
    return nodes


def build_spine_tree(drafts: Proposals, cfg: DecodeConfig, spine_ratio: float, budget: int | None = None,
                     prune_at: float = 0.0) -> Built:
    """Goose Algorithm 1: lay the spine (step 1), the candidate pool (1b), root and spine branches (2-3),
    then extend the branch leaves (4).

    Args:
        drafts: the spine (possibly empty: then the tree is branches only), the candidate pool and the
            branch sources (none: the tree is the spine and the pool alone).
        cfg: the ``DecodeConfig``: ``tree`` (rho, D, K, min score, ``pool_share``) and ``variant``
            (``depth_bounds_spine``, ``spine_branch_min``, ``branch_growth``).
        spine_ratio: r for this cycle.
        budget: node budget of this cycle, root included (default ``cfg.tree.budget``; the confidence
            schedule of §4.3 raises it on confident cycles).
        prune_at: the GT threshold c nodes are pruned at (``Resolved.prune_at``; 0: none).

    Returns:
        ``Built``: at most ``budget`` nodes (root included); branch nodes at depth <= D, spine nodes
        too when ``cfg.variant.depth_bounds_spine`` (otherwise the spine is bounded by ``floor(budget r)`` only,
        as in the authors' code, where D bounds branch extension).

    The candidate pool (our extension; the Goose paper has two sources): after the spine, pool candidates
    take up to ``TreeShape.pool_share`` of the remaining budget, best-first by their estimates (step 1b); steps 2-4
    share what is left by the paper's ratios (``_spine_branches``, ``_extend_best_first``, ``_extend_score_width``).
    """
    B = cfg.tree.budget if budget is None else budget
    b = TreeBuilder(drafts.anchor, budget=B, max_depth=cfg.tree.max_depth if cfg.variant.depth_bounds_spine else B,
                    gt_threshold=prune_at)
    spine_nodes = _lay_spine(b, drafts, cfg, spine_ratio)  # step 1
    if drafts.pool:  # step 1b: the candidate pool (merged into the spine where it shares its tokens)
        add_candidates(b, drafts.pool, math.floor((B - len(spine_nodes)) * cfg.tree.pool_share))
    if not drafts.branch_sources:
        return b.freeze()
    branches = _spine_branches(b, drafts, cfg, spine_nodes)  # steps 2-3
    grow = _extend_best_first if cfg.variant.branch_growth == "best-first" else _extend_score_width
    grow(b, branches, drafts, cfg)  # step 4: extend all branch leaves up to depth D within the remaining budget
    return b.freeze()


def _lay_spine(b: TreeBuilder, drafts: Proposals, cfg: DecodeConfig, spine_ratio: float) -> list[int]:
    """Alg. 1 step 1: lay the spine, b_s = min(m, floor(B r)) nodes (also bounded by B - 1, and by D if asked);
    returns the spine's node indices, root first (fewer when the builder refuses one)."""
    B, D = b.budget, cfg.tree.max_depth
    n_spine = min(len(drafts.spine), math.floor(B * spine_ratio), B - 1, D if cfg.variant.depth_bounds_spine else B)
    return _lay_chain(b, drafts.spine, drafts.spine_source, n_spine)


def _spine_branches(b: TreeBuilder, drafts: Proposals, cfg: DecodeConfig, spine_nodes: list[int]) -> list[int]:
    """Alg. 1 steps 2-3: root branches, then spine branches; returns the branch nodes added (step 4's seeds).

    Step 2: b_r = floor((B - 1 - b_s)(1 - rho)) root branches (B - 1 - b_s: what steps 1-1b left); with no
    spine the root takes it all.  Step 3 gives spine node i ``floor(b_sp (1/i) / H)`` branches (harmonic decay,
    H = sum_j 1/j), at least ``cfg.variant.spine_branch_min`` while the spine-branch share b_sp lasts.
    """
    n_spine, path = len(spine_nodes) - 1, drafts.spine.tokens  # path[:i] leads to spine node i
    left = b.budget - len(b.tokens)
    n_root = math.floor(left * (1 - cfg.tree.spine_branch_ratio)) if n_spine else left
    branches = _attach(b, drafts, cfg.tree.min_score, 0, path[:0], n_root)
    share = left - n_root
    harmonic = sum(1 / j for j in range(1, n_spine + 1))
    for i in range(1, n_spine + 1):
        count = min(share, max(cfg.variant.spine_branch_min, math.floor((left - n_root) * (1 / i) / harmonic)))
        if count <= 0:  # the share is spent: no spine node below this one gets a branch
            break
        share -= count
        branches += _attach(b, drafts, cfg.tree.min_score, spine_nodes[i], path[:i], count)
    return branches


def _attach(b: TreeBuilder, drafts: Proposals, min_score: float, node: int, path: Sequence[int],
            count: int) -> list[int]:
    """Attach up to ``count`` top successors of ``node`` (reached by ``path``) scored at least ``min_score``
    that are not already its children; returns the nodes added."""
    taken = b.child_tokens(node)
    added = []
    for br in drafts.successors(path):
        if len(added) >= count:
            break
        if br.score < min_score:
            continue
        if br.token not in taken and (child := b.add(node, br.token, br.source, br.score, br.p)) is not None:
            added.append(child)
    return added


def _extend_best_first(b: TreeBuilder, seeds: list[int], drafts: Proposals, cfg: DecodeConfig) -> None:
    """Alg. 1 step 4, best-first: one heap of candidate children over the tree, by estimated path acceptance.

    A node's successors enter the heap one at a time (a k-way merge): each node's list is ranked by the heap's key,
    ties in the sources' order, and only its best unseen successor waits in the heap.  The heap pops the order that
    pushing every successor at once would (key, then the node's turn, then its rank), with a tenth of the pushes.
    """
    turns = itertools.count()
    heap: list[tuple[float, int, int, int, list]] = []  # (-est. acceptance, node's turn, rank, parent, its ranking)
    min_score, max_depth = cfg.tree.min_score, cfg.tree.max_depth

    def push_successors(node: int) -> None:
        if not b.can_grow(node) or b.depth[node] >= max_depth:
            return
        est = b.est[node]
        ranked = sorted((-est * br.p, i, br) for i, br in enumerate(drafts.successors(b.path_tokens(node)))
                        if br.score >= min_score)  # (-path estimate, the source's order, the successor)
        if ranked:
            heapq.heappush(heap, (ranked[0][0], next(turns), 0, node, ranked))

    for node in seeds:
        push_successors(node)
    while heap and not b.full:
        _, turn, rank, parent, ranked = heapq.heappop(heap)
        if rank + 1 < len(ranked):  # the parent's next best successor takes its place
            heapq.heappush(heap, (ranked[rank + 1][0], turn, rank + 1, parent, ranked))
        br = ranked[rank][2]
        if b.child_with(parent, br.token) is not None:
            continue
        child = b.add(parent, br.token, br.source, br.score, br.p)
        if child is None:
            break  # budget full, or the best remaining candidate is below c (so are all the others)
        push_successors(child)


def _extend_score_width(b: TreeBuilder, seeds: list[int], drafts: Proposals, cfg: DecodeConfig) -> None:
    """Alg. 1 step 4 as the authors' code does it: breadth-first from the branch seeds; a node of depth d
    and adjacency score s gets its top ``max(1, min(K, ceil(remaining budget * s)))`` successors, at most
    ``max(1, K // d)``, skipping those scored below ``min_score``; nodes at depth D are not extended."""
    queue = deque(seeds)
    while queue and not b.full:
        node = queue.popleft()
        depth = b.depth[node]
        if depth >= cfg.tree.max_depth:
            continue
        successors = drafts.successors(b.path_tokens(node))
        width = max(1, min(len(successors), math.ceil((b.budget - len(b.tokens)) * b.scores[node])))
        for br in successors[: min(width, max(1, cfg.tree.top_k // depth))]:
            if b.full or br.score < cfg.tree.min_score:
                break
            child = b.add(node, br.token, br.source, br.score, br.p)
            if child is not None:
                queue.append(child)


def add_candidates(b: TreeBuilder, pool: Sequence[tuple[Source, Candidates]], quota: int) -> None:
    """Add up to ``quota`` nodes of the anchor's candidate trees, best-first by estimated path acceptance
    (the product of the candidates' estimates), trees in ``pool`` order on ties.  A candidate whose token
    is already a child of its parent (e.g. on the spine) reuses that node at no budget cost."""
    order = itertools.count()
    heap: list[tuple[float, int, int, int, int]] = []  # (-est. acceptance, tie, parent node, tree, candidate)
    kids: list[list[list[int]]] = []  # per tree, per node (0 = the anchor, i + 1 = candidate i): its children
    for _, cands in pool:
        kids.append([[] for _ in range(len(cands) + 1)])
        for i, parent in enumerate(cands.parents):
            kids[-1][0 if parent is None else parent + 1].append(i)

    def push_children(node: int, tree: int, at: int | None) -> None:
        cands = pool[tree][1]
        for i in kids[tree][0 if at is None else at + 1]:
            heapq.heappush(heap, (-b.est[node] * cands.p[i], next(order), node, tree, i))

    for t in range(len(pool)):
        push_children(0, t, None)
    added = 0
    while heap and added < quota and not b.full:
        _, _, parent, tree, i = heapq.heappop(heap)
        source, cands = pool[tree]
        node = b.child_with(parent, cands.tokens[i])
        if node is None:
            node = b.add(parent, cands.tokens[i], source, cands.scores[i], cands.p[i])
            if node is None:
                continue  # too deep, or below c (its subtree would be too)
            added += 1
        if b.depth[node] < b.max_depth:
            push_children(node, tree, i)


def build_candidate_tree(anchor: int, source: Source, candidates: Candidates, cfg: DecodeConfig,
                         prune_at: float = 0.0) -> Built:
    """A single source's candidate tree alone (the ptd and suffix methods: PTD §3.3; SuffixDecoding verifies
    its speculation tree), its best ``B - 1`` nodes within depth D, pruned at GT's ``prune_at``."""
    b = TreeBuilder(anchor, budget=cfg.tree.budget, max_depth=cfg.tree.max_depth, gt_threshold=prune_at)
    add_candidates(b, ((source, candidates),), cfg.tree.budget - 1)
    return b.freeze()


def build_isotropic_tree(drafts: Proposals, cfg: DecodeConfig, k: int, budget: int | None = None,
                         prune_at: float = 0.0) -> Built:
    """Iso(k): a balanced k-ary tree with the same budget and draft sources (Goose §5.3, Table 1).

    Breadth-first, every node gets up to ``k`` children until B nodes or depth D: the spine's
    continuation first while the node is on the spine, then the branch sources' top successors.
    Source-blind in shape (uniform rate), unlike the spine tree.  ``budget`` defaults to ``cfg.tree.budget``;
    an empty ``drafts.spine`` gives the authors' control, built from the branches alone; nodes are pruned at GT's
    ``prune_at``.
    """
    b = TreeBuilder(drafts.anchor, budget=cfg.tree.budget if budget is None else budget, max_depth=cfg.tree.max_depth,
                    gt_threshold=prune_at)
    spine = drafts.spine
    frontier = [(0, 0)]  # (node, spine depth or -1 when off the spine)
    while frontier and not b.full:
        next_frontier = []
        for node, spine_depth in frontier:
            if not b.can_grow(node):
                continue
            candidates: list[tuple[Branch, int]] = []  # (candidate, its spine depth)
            if 0 <= spine_depth < len(spine):
                p = spine.p[spine_depth]
                candidates.append((Branch(spine.tokens[spine_depth], drafts.spine_source, p, p), spine_depth + 1))
            candidates += [(br, -1) for br in drafts.successors(b.path_tokens(node)) if br.score >= cfg.tree.min_score]
            taken: set[int] = set()
            for br, child_spine in candidates:
                if len(taken) >= k or b.full:
                    break
                if br.token in taken:
                    continue
                child = b.add(node, br.token, br.source, br.score, br.p)
                if child is not None:
                    taken.add(br.token)
                    next_frontier.append((child, child_spine))
        frontier = next_frontier
    return b.freeze()
