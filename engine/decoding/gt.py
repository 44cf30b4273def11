"""GT principle, speedup-optimal: the tree size that maximises expected tokens per unit of verification time.

Source: GT principle paper, §3.1 (Eqs. 6-9).  A node's benefit is its estimated acceptance
α̂ (the product of the per-source, per-depth estimates along its path, ``DraftTree.est_accept``, or
that mapped through the session's measured outcomes, ``calibration.PathCalibration``); its cost is the
time it adds to the verification forward, Φ(N) in Eq. 6.  Eq. 9 turns this into one threshold c, which
needs Φ linear in N.  On a CPU it is not (SmolLM2: T(2) ≈ 1.5 T(1), then nearly flat to 8, then
growing), so instead of one chord of the curve we choose n over the whole measured curve T(n).  What a
run wants is the most tokens per unit of time over all its cycles, a ratio of sums; Dinkelbach's rule
maximises it cycle by cycle as

    n* = argmax_n (1 + Σ_{k < n} α̂_(k)) − λ · T(n + R)

with λ the run's rate (tokens per ms) so far (``rate``; ``GtConfig.rate = "session"``): a node
stays while it brings tokens faster than the run does.  The cycle's own ratio
(1 + Σ α̂) / T(n + R) (``gt_rate = "cycle"``, the earlier rule) prunes a promising tree as hard as a
poor one and measured worse (docs/results.md).  α̂_(1) ≥ α̂_(2) ≥ ... are the built nodes' path
estimates in decreasing order, the 1 is the bonus token, and R counts rows that ride along in every
forward (PTD drafting rows).  In a tree whose siblings carry distinct tokens at most one node per depth
is accepted, so Σ α̂ over the kept nodes is the expected number of accepted draft tokens.  Path
estimates are clamped never to increase from a parent to its child, so the top-n nodes form an
ancestor-closed subtree: the kept tree is a valid tree.  On a flat (GPU-like) curve every node has
positive net benefit and the whole tree is kept.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..core.tree import DraftTree, GhostNode
from .calibration import PathCalibration
from .cost import CostCurve


@dataclass(frozen=True)
class GtChoice:
    """Why a cycle's tree has the size it has (recorded in ``CycleTrace.gt_*``).

    Attributes:
        nodes: n*, the nodes kept, root included.
        candidates: the nodes the builder offered, root included.
        expected: expected accepted draft tokens of the kept tree (Σ α̂ over its non-root nodes).
        cost_ms: T(n* + R), the curve's verification time of the kept tree (ms).
        kept: the kept nodes' indices in the built tree, root included, ascending.
        read: the path estimate the choice read for each node of the built tree (root 1.0), clamped never to rise
            from a parent to its child: ``est_accept``, or the calibrated estimates times the session's trust
            (``calibrated_choice``); what GT believed, so a replay of the choice (``ledger.price_on``) reads it too.
    """

    nodes: int
    candidates: int
    expected: float
    cost_ms: float
    kept: tuple[int, ...] = (0,)
    read: tuple[float, ...] = ()

    def trace_fields(self) -> dict:
        """The choice's ``CycleTrace`` fields (``gt_*``)."""
        return {"gt_nodes": self.nodes, "gt_candidates": self.candidates, "gt_expected": self.expected,
                "gt_cost_ms": self.cost_ms}


def speedup_optimal(tree: DraftTree, curve: CostCurve, extra_rows: int = 0, *,
                    estimates: tuple[float, ...] | None = None,
                    rate: float | None = None,
                    ghosts: tuple[GhostNode, ...] = ()) -> tuple[DraftTree, tuple[GhostNode, ...], GtChoice]:
    """Keep the top-n* nodes of ``tree`` by path estimate, n* the most tokens per unit of verification time.

    Args:
        tree: the built tree (no threshold applied), estimates in ``est_accept``.
        curve: the verification cost curve T(n) (ms per forward of n rows).
        extra_rows: R, rows every forward carries besides the tree (PTD drafting rows).
        estimates: α̂ per node to rank and price by (e.g. ``PathCalibration.tree``); default ``tree.est_accept``.
        rate: λ, the session's throughput so far (tokens per ms of verification).  Given, n* maximises
            (1 + expected accepted) − λ · T(n + R): a node is worth its time when it brings tokens faster
            than the run does on average, which maximises the run's tokens / time (Dinkelbach's rule for a
            ratio of sums).  None: n* maximises this cycle's own ratio (1 + expected) / T(n + R), which prunes
            a promising tree as hard as a poor one.
        ghosts: the candidates the builder already left out (parents index ``tree``); those hanging off
            kept nodes stay ghosts, re-indexed.

    Returns:
        (kept tree, ghosts: the removed nodes hanging off kept ones, the choice).  Ties keep the larger
        tree, so a flat curve keeps every node.
    """
    n = len(tree)
    choice = size_choice(tree, curve, extra_rows, estimates=estimates, rate=rate)
    keep = choice.kept
    new_index = {old: new for new, old in enumerate(keep)}
    earlier = tuple(g.moved(new_index[g.parent]) for g in ghosts if g.parent in new_index)
    ghosts = earlier + tuple(GhostNode(new_index[tree.parents[i]], tree.tokens[i], tree.sources[i], tree.scores[i],
                                       tree.est_accept[i])
                             for i in range(1, n) if i not in new_index and tree.parents[i] in new_index)
    return tree.subtree(keep), ghosts, choice


def size_choice(tree: DraftTree, curve: CostCurve, extra_rows: int = 0, *,
                estimates: tuple[float, ...] | None = None, rate: float | None = None) -> GtChoice:
    """``speedup_optimal``'s choice alone (n*, the kept nodes, their expected tokens), the tree left as it is: what
    the session's calibration records of the choice a full trust makes (``calibrated_choice``).  Arguments as
    ``speedup_optimal``'s."""
    n = len(tree)
    est = list(tree.est_accept if estimates is None else estimates)
    for i in range(1, n):  # clamped to the parent's, so the order below is ancestor-closed by construction
        est[i] = min(est[i], est[tree.parents[i]])
    order = sorted(range(1, n), key=lambda i: (-est[i], i))  # a parent precedes its children

    costs = curve.latencies(n + extra_rows)  # costs[k - 1] = T(k)

    def value(tokens: float, size: int) -> float:  # what n* maximises
        ms = costs[size + extra_rows - 1]
        return tokens / ms if rate is None else tokens - rate * ms

    best_n, best_expected, best_value = 1, 0.0, value(1.0, 1)
    expected = 0.0
    for size, node in enumerate(order, 2):
        expected += est[node]
        v = value(1.0 + expected, size)
        if v >= best_value:
            best_n, best_value, best_expected = size, v, expected
    keep = tuple(sorted([0, *order[: best_n - 1]]))
    return GtChoice(best_n, n, best_expected, costs[best_n + extra_rows - 1], keep, tuple(est))


def calibrated_choice(tree: DraftTree, curve: CostCurve, extra_rows: int, paths: PathCalibration | None, *,
                      rate: float | None, ghosts: tuple[GhostNode, ...] = ()
                      ) -> tuple[DraftTree, tuple[GhostNode, ...], GtChoice, GtChoice | None]:
    """``speedup_optimal`` on estimates calibrated by the session's outcomes, discounted by its trust in them.

    Two corrections, both learnt from every built tree's outcome (``PathCalibration``):

    1. each node's estimate given its parent accepted is mapped through the outcomes of earlier nodes of its
       source, first draft token or not, with a like estimate; a path is priced at the product along it
       (``PathCalibration.tree``), so a chain of equal raw estimates (TR's adjacency loop "0 → 0 → 0" at 0.9999)
       is priced as a chain, not as independent nodes;
    2. the nodes GT keeps are those whose estimates read highest, so even calibrated estimates overstate the kept
       set (the optimiser's curse, Smith & Winkler 2006): the choice a full trust makes (``trusted``) is
       recorded, and what its nodes earned over what they were priced at (``PathCalibration.trust``) scales the
       estimates the size choice reads.  The trusted set is judged whether kept or pruned, so a run whose trees
       stop still learns when they would pay again.

    Args:
        tree, curve, extra_rows, rate, ghosts: as ``speedup_optimal``.
        paths: the session's calibration; None prices nodes at their raw ``est_accept`` (no trust recorded).

    Returns:
        (kept tree, ghosts, the choice made, the choice a full trust makes, or None without ``paths``).
    """
    if paths is None:
        return (*speedup_optimal(tree, curve, extra_rows, rate=rate, ghosts=ghosts), None)
    est = paths.tree(tree)
    trusted = size_choice(tree, curve, extra_rows, estimates=est, rate=rate)  # recorded, never pruned to
    trust = paths.trust()
    kept, ghosts, choice = speedup_optimal(tree, curve, extra_rows, estimates=tuple(min(1.0, e * trust) for e in est),
                                           rate=rate, ghosts=ghosts)
    return kept, ghosts, choice, trusted
