"""GT's size choice compiled (numba), over arrays, for one compiled entry per cycle (issue 71).

Source: GT principle paper, §3.1 (Eqs. 6-9): each node priced at its path estimate α̂, the tree cut to the top-n*
nodes maximising (1 + Σ α̂) − λ T(n + R) (Dinkelbach, λ the session's rate) or the cycle's own ratio
(1 + Σ α̂) / T(n + R), on the raw estimates or on those calibrated by the session's outcomes and discounted by its
trust (``calibration_kernel``).  ``gt.py`` (``size_choice``, ``speedup_optimal``, ``calibrated_choice``) states the
same in Python; these kernels reproduce it bit for bit (the same float operations in the same order;
tests/test_gt_kernel.py compares every field).  They must change together.

Conventions of the compiled cycle (trees, source codes: ``calibration_kernel``):
    - ghosts (``GhostArrays``): parent, token, source code, score, path estimate, (g,) each;
    - a price (``price``): (costs (m,) float64 with costs[k - 1] = T(k), what ``CostCurve.latencies`` gives, m at
      least n + R; R; λ, NaN for rate None: the cycle's own ratio).

Kernels write into arrays the caller provides and return scalars (``choose``, ``choose_calibrated`` allocate them for
a Python caller and read them back); their scratch (a sort's order, an index map) is allocated per call.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
from numba import njit

from ..core.tree import GhostNode
from .calibration_kernel import SOURCE_CODES, CalibrationArrays, NodeArrays, calibrated_tree, cut, empty_nodes, trust_of


class GhostArrays(NamedTuple):
    """g ghosts (``GhostNode``s; ``ghost_arrays``)."""

    parent: np.ndarray  # (g,) int64 the kept tree's node they hang off
    token: np.ndarray  # (g,) int64
    source: np.ndarray  # (g,) int64 source code
    score: np.ndarray  # (g,) float64
    est: np.ndarray  # (g,) float64


@njit(cache=True)
def _value(tokens, size, price):
    """What n* maximises (``size_choice``'s ``value``): tokens / T, or tokens − λ T, T = T(size + R)."""
    costs, extra_rows, rate = price
    ms = costs[size + extra_rows - 1]
    return tokens / ms if math.isnan(rate) else tokens - rate * ms


@njit(cache=True)
def size_choice(tree, est, price, read, kept):
    """``gt.size_choice``: n*, the expected accepted draft tokens and T(n* + R), returned; the clamped estimates into
    ``read`` (n,) float64 and the kept nodes, ascending, root first, into ``kept[:n*]`` ((n,) int64).  ``est`` (n,)
    float64: the estimates ranked and priced (``tree.est`` or calibrated).  Ties keep the larger tree."""
    parents = tree.parents
    n = parents.shape[0]
    for i in range(n):
        read[i] = est[i]
    for i in range(1, n):  # min(est[i], est[parent]): the parent's only when strictly lower
        up = read[parents[i]]
        if up < read[i]:
            read[i] = up
    order = np.argsort(-read[1:], kind="mergesort") + 1  # (n - 1,) by (-est, index): stable
    best_n, best_expected, best_value = 1, 0.0, _value(1.0, 1, price)
    expected = 0.0
    for k in range(n - 1):
        expected += read[order[k]]
        v = _value(1.0 + expected, k + 2, price)
        if v >= best_value:
            best_n, best_value, best_expected = k + 2, v, expected
    kept[0] = 0
    kept[1:best_n] = np.sort(order[: best_n - 1])
    return best_n, best_expected, price[0][best_n + price[1] - 1]


@njit(cache=True)
def speedup_optimal(tree, est, price, ghosts, out):
    """``gt.speedup_optimal``: returns (n*, expected, cost_ms, ghosts out).  ``out`` = (read (n,) float64, kept (n,)
    int64, the kept tree (``NodeArrays`` of n each; its first n* filled, ``DraftTree.subtree``), ghosts out
    (``GhostArrays`` of len(ghosts) + n each)): the earlier ``ghosts`` hanging off kept nodes, re-indexed, then the
    removed nodes whose parent is kept, in the tree's order, at their own ``tree.est``."""
    read, kept, small, lost = out
    nodes, expected, cost_ms = size_choice(tree, est, price, read, kept)
    n = tree.parents.shape[0]
    new_index = np.full(n, -1, np.int64)  # (n,)
    for j in range(nodes):
        i = kept[j]
        new_index[i] = j
        small.tokens[j], small.source[j], small.scores[j] = tree.tokens[i], tree.source[i], tree.scores[i]
        small.est[j], small.depth[j] = tree.est[i], tree.depth[i]
        small.parents[j] = -1 if j == 0 else new_index[tree.parents[i]]
    g = 0
    for k in range(ghosts.parent.shape[0]):
        p = ghosts.parent[k]
        if 0 <= p < n and new_index[p] != -1:
            lost.parent[g], lost.token[g], lost.source[g] = new_index[p], ghosts.token[k], ghosts.source[k]
            lost.score[g], lost.est[g] = ghosts.score[k], ghosts.est[k]
            g += 1
    for i in range(1, n):
        if new_index[i] == -1 and new_index[tree.parents[i]] != -1:
            lost.parent[g], lost.token[g], lost.source[g] = new_index[tree.parents[i]], tree.tokens[i], tree.source[i]
            lost.score[g], lost.est[g] = tree.scores[i], tree.est[i]
            g += 1
    return nodes, expected, cost_ms, g


@njit(cache=True)
def calibrated_choice(cal, tree, price, ghosts, out, trusted_out):
    """``gt.calibrated_choice`` with a calibration: the trusted choice on the calibrated estimates (``trusted_out`` =
    (their estimates (n,), read (n,), kept (n,)), as ``size_choice``), then ``speedup_optimal`` on min(1, e · trust)
    into ``out``.  Returns (n*, expected, cost_ms, ghosts out, trusted n*, trusted expected, trusted cost_ms)."""
    est, t_read, t_kept = trusted_out
    calibrated_tree(cal, tree, est)
    t_nodes, t_expected, t_cost = size_choice(tree, est, price, t_read, t_kept)
    trust = trust_of(cal)
    scaled = np.empty(est.shape[0], np.float64)  # (n,)
    for i in range(est.shape[0]):
        x = est[i] * trust
        scaled[i] = x if x < 1.0 else 1.0  # min(1.0, x)
    nodes, expected, cost_ms, g = speedup_optimal(tree, scaled, price, ghosts, out)
    return nodes, expected, cost_ms, g, t_nodes, t_expected, t_cost


# -- the Python side: conversions, and the outputs allocated and read back --------------------------------------------

def ghost_arrays(ghosts: Sequence[GhostNode]) -> GhostArrays:
    """``GhostNode``s as arrays."""
    return GhostArrays(np.array([g.parent for g in ghosts], np.int64), np.array([g.token for g in ghosts], np.int64),
                       np.array([SOURCE_CODES[g.source.value] for g in ghosts], np.int64),
                       np.array([g.score for g in ghosts], np.float64), np.array([g.est_accept for g in ghosts]))


def price(costs: Sequence[float], extra_rows: int = 0, rate: float | None = None) -> tuple:
    """The price the size choice reads: (costs (m,) float64, costs[k - 1] = T(k); R; λ, NaN for None)."""
    return np.asarray(costs, np.float64), int(extra_rows), math.nan if rate is None else float(rate)


class Choice(NamedTuple):
    """A size choice's outputs (``GtChoice``'s fields, the kept tree and its ghosts)."""

    nodes: int
    candidates: int
    expected: float
    cost_ms: float
    kept: np.ndarray  # (n*,) int64
    read: np.ndarray  # (n,) float64
    tree: NodeArrays | None  # (n*,) each: the kept tree (None for ``size_choice`` alone)
    ghosts: GhostArrays | None


def choose(tree: NodeArrays, the_price: tuple, ghosts: GhostArrays | None = None,
           estimates: np.ndarray | None = None) -> Choice:
    """``speedup_optimal`` by the kernel, its outputs allocated here."""
    n = _checked(tree, the_price)
    ghosts = ghost_arrays(()) if ghosts is None else ghosts
    out = _outputs(n, ghosts.parent.shape[0])
    nodes, expected, cost_ms, g = speedup_optimal(tree, tree.est if estimates is None else estimates, the_price,
                                                  ghosts, out)
    return Choice(nodes, n, expected, cost_ms, out[1][:nodes], out[0], cut(out[2], nodes),
                  GhostArrays(*(a[:g] for a in out[3])))


def _checked(tree: NodeArrays, the_price: tuple) -> int:
    """The tree's n, once the price covers T(n + R) (the kernels read past no array's end, unchecked)."""
    n = tree.parents.shape[0]
    if the_price[0].shape[0] < n + the_price[1]:
        raise ValueError(f"costs up to T({the_price[0].shape[0]}) for {n} nodes and {the_price[1]} extra rows")
    return n


def _outputs(n: int, g: int) -> tuple:
    """``speedup_optimal``'s ``out`` for n nodes and g earlier ghosts."""
    lost = GhostArrays(*(np.zeros(g + n, dt) for dt in (np.int64, np.int64, np.int64, np.float64, np.float64)))
    return np.zeros(n, np.float64), np.zeros(n, np.int64), empty_nodes(n), lost


def choose_calibrated(paths: CalibrationArrays, tree: NodeArrays, the_price: tuple,
                      ghosts: GhostArrays | None = None) -> tuple[Choice, Choice]:
    """``gt.calibrated_choice`` with ``paths`` by the kernel: (the choice made, the choice a full trust makes; the
    latter without a kept tree or ghosts, ``read`` its clamped calibrated estimates)."""
    n = _checked(tree, the_price)
    ghosts = ghost_arrays(()) if ghosts is None else ghosts
    out, trusted = _outputs(n, ghosts.parent.shape[0]), (np.zeros(n), np.zeros(n), np.zeros(n, np.int64))
    nodes, expected, cost_ms, g, t_nodes, t_expected, t_cost = calibrated_choice(paths.cal, tree, the_price, ghosts,
                                                                               out, trusted)
    made = Choice(nodes, n, expected, cost_ms, out[1][:nodes], out[0], cut(out[2], nodes),
                  GhostArrays(*(a[:g] for a in out[3])))
    return made, Choice(t_nodes, n, t_expected, t_cost, trusted[2][:t_nodes], trusted[1], None, None)
