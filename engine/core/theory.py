"""Expected-yield formulas for the theory panel.

Source: Goose paper, Proposition 1 (Eq. 1, spine tree expected yield, proof in Appendix E.1) and
Appendix E.4 (the isotropic fan-out-3 yield with the same budget, using the branch rate alone).
Yields are in tokens per verification forward (the bonus token included), comparable with τ.
"""
from __future__ import annotations

from .tree import DraftTree


def spine_yield_bound(p_s: float, p_t: float, spine_len: int, widths: list[int], max_depth: int) -> float:
    """Eq. 1: E[τ] >= sum_{i=1..m} p_s^i + sum_{i=0..m-1} p_s^i (1 - p_s) φ_i (1 + ℓ) + 1.

    Args:
        p_s, p_t: spine and branch acceptance rates.  spine_len: m.  widths: w_i, branch candidates at
        spine node i (i = 0 is the anchor), len(widths) = m (missing entries count as 0).
        max_depth: D, the depth a branch chain may reach from its branching point.

    φ_i = 1 - (1 - p_t)^{w_i}; ℓ = sum_{k=1..D-1} p_t^k.
    """
    ell = sum(p_t ** k for k in range(1, max_depth))
    if spine_len == 0:  # no spine: the anchor's branches alone (the i = 0 term with nothing to break)
        return 1.0 + (1 - (1 - p_t) ** (widths[0] if widths else 0)) * (1 + ell)
    spine = sum(p_s ** i for i in range(1, spine_len + 1))
    synergy = sum(p_s ** i * (1 - p_s) * (1 - (1 - p_t) ** (widths[i] if i < len(widths) else 0)) * (1 + ell)
                  for i in range(spine_len))
    return spine + synergy + 1.0


def isotropic_yield(p: float, budget: int, k: int = 3, max_depth: int = 6) -> float:
    """Yield of a balanced k-ary tree of ``budget`` nodes (root included): 1 + sum_d φ^d, φ = 1 - (1 - p)^k.

    A last, partly filled level counts with its average width per parent.
    """
    phi_full = 1 - (1 - p) ** k
    total, reach, level, left = 1.0, 1.0, 1, budget - 1
    while left > 0 and level <= max_depth:
        parents = k ** (level - 1)
        width = min(k, left / parents)
        reach *= 1 - (1 - p) ** width if width < k else phi_full
        total += reach
        left -= parents * k
        level += 1
    return total


def tree_shape(tree: DraftTree) -> tuple[int, list[int]]:
    """(m, [w_0 .. w_{m-1}]): the spine's length (``DraftTree.spine``) and the non-spine children at the anchor
    and at each spine node but the last."""
    on_spine = set(tree.spine)
    nodes = [0, *tree.spine]
    m = len(nodes) - 1
    widths = [sum(c not in on_spine for c in tree.children[node]) for node in nodes[:max(m, 1)]]
    return m, widths
