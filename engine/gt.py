"""GT principle, speedup-optimal: the tree size that maximises expected tokens per unit of verification time.

Source: GT principle paper, §3.1 (Eqs. 6-9).  A node's benefit is its estimated acceptance
α̂ (the product of the per-source, per-depth estimates along its path, ``DraftTree.est_accept``);
its cost is the time it adds to the verification forward, Φ(N) in Eq. 6.  Eq. 9 turns this into one
threshold c, which needs Φ linear in N.  On a CPU it is not (T(8) ≈ 2.6 T(1) but T(64) ≈ 4.2 T(1)
for SmolLM2), so instead of one chord of the curve we maximise the quantity Eqs. 4 and 8 optimise,
the expected speedup of the cycle, over the whole measured curve T(n):

    n* = argmax_n (1 + Σ_{k < n} α̂_(k)) / T(n + R)

where α̂_(1) ≥ α̂_(2) ≥ ... are the built nodes' path estimates in decreasing order, the 1 is the
bonus token, and R counts rows that ride along in every forward (PTD drafting rows).  In a tree
whose siblings carry distinct tokens at most one node per depth is accepted, so Σ α̂ over the kept
nodes is the expected number of accepted draft tokens.  Path estimates never increase from a parent
to its child, so the top-n nodes form an ancestor-closed subtree: the kept tree is a valid tree.
On a flat (GPU-like) curve every node has positive net benefit and the whole tree is kept.
"""
from __future__ import annotations

from dataclasses import dataclass

from .cost import CostCurve
from .tree import DraftTree, GhostNode


@dataclass(frozen=True)
class GtChoice:
    """Why a cycle's tree has the size it has (recorded in ``CycleTrace.gt_*``).

    Attributes:
        nodes: n*, the nodes kept, root included.
        candidates: the nodes the builder offered, root included.
        expected: expected accepted draft tokens of the kept tree (Σ α̂ over its non-root nodes).
        cost_ms: T(n* + R), the curve's verification time of the kept tree (ms).
    """

    nodes: int
    candidates: int
    expected: float
    cost_ms: float


def speedup_optimal(tree: DraftTree, curve: CostCurve,
                    extra_rows: int = 0) -> tuple[DraftTree, tuple[GhostNode, ...], GtChoice]:
    """Keep the top-n* nodes of ``tree`` by path estimate, n* maximising (1 + expected accepted) / T(n + R).

    Args:
        tree: the built tree (no threshold applied), estimates in ``est_accept``.
        curve: the verification cost curve T(n) (ms per forward of n rows).
        extra_rows: R, rows every forward carries besides the tree (PTD drafting rows).

    Returns:
        (kept tree, ghosts: the removed nodes hanging off kept ones, the choice).  Ties keep the larger
        tree, so a flat curve keeps every node.
    """
    n = len(tree)
    est = list(tree.est_accept)  # clamped to the parent's, so the order below is ancestor-closed by construction
    for i in range(1, n):
        est[i] = min(est[i], est[tree.parents[i]])
    order = sorted(range(1, n), key=lambda i: (-est[i], i))  # a parent precedes its children
    best_n, best_expected = 1, 0.0
    best_rate = 1.0 / curve.latency(1 + extra_rows)
    expected = 0.0
    for size, node in enumerate(order, 2):
        expected += est[node]
        rate = (1.0 + expected) / curve.latency(size + extra_rows)  # expected tokens per ms
        if rate >= best_rate:
            best_n, best_rate, best_expected = size, rate, expected
    keep = sorted([0, *order[: best_n - 1]])
    new_index = {old: new for new, old in enumerate(keep)}
    ghosts = tuple(GhostNode(new_index[tree.parents[i]], tree.tokens[i], tree.sources[i], tree.scores[i],
                             tree.est_accept[i])
                   for i in range(1, n) if i not in new_index and tree.parents[i] in new_index)
    choice = GtChoice(best_n, n, best_expected, curve.latency(best_n + extra_rows))
    return tree.subtree(keep), ghosts, choice
