"""Stage 2 of a cycle compiled (numba), for the default Goose configuration (sources PLD + TR, best-first branch
growth, no candidate pool): the routing and shape decisions of the planner, the bypass chain, and the whole spine
tree (Alg. 1 steps 1-4), built into preallocated arrays, so one compiled entry per cycle can plan without Python
(issue 71).

Source: Goose paper, Algorithm 1 (BUILDSPINETREE) step 1 and, through ``spine_kernel.steps_2_to_4``, steps 2-4;
Algorithm 2 lines 6-13 (routing: bypass, tree, AR; Appendix B.2's rules), §4.3 (the bypass chain and the confidence
schedule: budget, spine ratio, chain extension), Appendix C.1 (successors scored below the minimum pruned) and C.3
(the spine-ratio tiers); GT principle paper, §3 (the threshold c: a node whose path estimate is below it is a ghost).

This module mirrors ``spine_tree.py`` (``build_spine_tree``, ``_lay_spine``, ``_lay_chain``, ``build_chain``) and
``planner.py`` (``Planner._route``, ``_bypass``, ``_shape``) for that configuration, node for node, ghost for ghost
and decision for decision (tests/test_build_kernel.py compares them on random shapes, tables and drafts): they must
change together.  What the Python does that this does not: the candidate pool (step 1b: PTD, a losing spine
source's candidates), several branch sources or one without a table, score-width growth (``Variant.branch_growth``),
the candidate-tree methods and Iso(k); the chain extension itself (the PLD kernel's: here only its limit).

Trees travel as ``spine_kernel.TreeArrays``, one array at a time (numba unboxes a NamedTuple of arrays slowly), each
at least the budget long: ``tokens``, ``parents`` (-1 for the root), ``source`` (codes: 0 anchor, 1 PLD, 2 TR,
``spine_kernel.SOURCE_CODES``), ``scores``, ``est`` (``DraftTree.est_accept``), ``depth``; the ghosts' ``parent``,
``token``, ``source``, ``score``, ``est``.  The kernels return (nodes, ghosts) written; ``built_of`` wraps them as a
``Built`` for Python callers (``build_spine_built``, ``build_chain_built``: ``build_spine_tree`` and ``build_chain``'s
signatures).
"""
from __future__ import annotations

import math
from functools import cache
from typing import NamedTuple

import numpy as np
from numba import njit

from ..core.estimates import SPINE_RATIO_TIERS
from ..core.tree import Built, DraftTree, GhostNode, Source
from ..sources import Candidates
from ..sources.adjacency import ArrayTable, row_slot
from .config import DecodeConfig
from .spine_kernel import ROOT, SOURCE_CODES, TR, TreeArrays, _add, steps_2_to_4
from .spine_tree import Proposals

#: Plan modes (``Plan.mode``) as the compiled cycle codes them.
AR, BYPASS, TREE = 0, 1, 2
MODES = ("ar", "bypass", "tree")  # code -> ``Plan.mode``


@njit(cache=True)
def _start(t, anchor, length):
    """The tree of the anchor alone (``TreeBuilder.__post_init__``) and its children's lists (first child, next
    sibling, last child: (length,) int64 each) for ``spine_kernel._add``."""
    tokens, parents, source, scores, est, depth = t[0], t[1], t[2], t[3], t[4], t[5]
    tokens[0], parents[0], source[0], scores[0], est[0], depth[0] = anchor, -1, ROOT, 1.0, 1.0, 0
    return np.full(length, -1, np.int64), np.full(length, -1, np.int64), np.full(length, -1, np.int64)


class SpineShape(NamedTuple):
    """What Alg. 1 builds to this cycle (``build_spine``), all scalars."""

    r: float  # the spine ratio
    budget: int  # B, root included
    max_depth: int  # the builder's depth bound (D when ``depth_bounds_spine``, else B)
    branch_depth: int  # D: branch leaves at it are not extended
    c: float  # the GT threshold the builder prunes at (``prune_at``)
    min_score: float  # TR successors scored below it are skipped (C.1)
    rho: float  # ``spine_branch_ratio``
    spine_branch_min: int  # ``Variant.spine_branch_min``
    branches: bool  # whether TR grows branches (False: TR rests, or no branch source)


@njit(cache=True)
def _lay(b, chain, n, nodes):
    """``spine_tree._lay_chain``: the first ``n`` tokens of ``chain`` = (tokens (m,) int64, estimates (m,) float64,
    source code) as a path from the root, each scored and estimated at its p, until the builder ``b``
    (``spine_kernel._add``) refuses one (budget, depth, or c: then a ghost); ``nodes[:k]`` gets the path's node
    indices, root first; returns k."""
    chain_tokens, chain_p, code = chain
    nodes[0] = 0
    k = 1
    for i in range(min(n, chain_tokens.shape[0])):
        node = _add(b, nodes[k - 1], (chain_tokens[i], code, chain_p[i], chain_p[i]))
        if node == -1:
            break
        nodes[k] = node
        k += 1
    return k


@njit(cache=True)
def build_spine(root, chain, shape, table, out):
    """Goose Algorithm 1 for a PLD spine and TR branches, best-first (``spine_tree.build_spine_tree`` with no pool,
    TR the one branch source): step 1 lays b_s = min(m, floor(B r), B - 1, the depth bound) spine nodes
    (``_lay_spine``: each through ``TreeBuilder.add``, the first refused by c a ghost and the spine's end), then
    steps 2-4 (``spine_kernel.steps_2_to_4``) grow TR's branches unless ``shape.branches`` is False (TR rests, or
    no branch source: the tree is the spine alone).

    Args:
        root: (anchor, the token before it or -1), the latter keying the root's bigram row.
        chain: ((m,) int64 tokens, (m,) float64 estimates, the spine's source code: 1 PLD), already extended.
        shape: ``SpineShape``.
        table: TR's table (``successor_table``: ``ArrayTable.arrays``' first seven, its ``bigram``, then (max(B, D)
            + 2,) float64 its calibration per depth, or (0,)).
        out: ``spine_kernel.TreeArrays``, (>= B,) each.

    Returns:
        (nodes, ghosts) written, the root included.
    """
    anchor, prev = root
    budget = shape.budget
    lim = (budget, shape.max_depth, shape.branch_depth, float(shape.c), float(shape.min_score), float(shape.rho),
           shape.spine_branch_min, prev)
    b = (out, _start(out, anchor, budget), np.array([1, 0], np.int64), lim)  # the builder (``spine_kernel._add``)
    n_spine = min(chain[0].shape[0], math.floor(budget * shape.r), budget - 1, shape.max_depth)  # step 1
    nodes = np.empty(n_spine + 1, np.int64)
    laid = _lay(b, chain, n_spine, nodes)
    if shape.branches:  # steps 2-4
        steps_2_to_4(b, table, nodes[:laid])
    return b[2][0], b[2][1]


@njit(cache=True)
def build_chain(anchor, chain, c, out):
    """The bypass chain (Goose §4.3; also the PLD baseline): ``spine_tree.build_chain``, the chain's n tokens laid
    from the anchor through a builder of budget n + 1 and depth max(1, n), pruned at ``c`` (the first token below
    it a ghost, and the chain's end).

    Args:
        anchor: the root's token.  chain: ((n,) int64 tokens, (n,) float64 estimates, source code: 1 PLD).
        c: the GT threshold (``prune_at``).  out: ``spine_kernel.TreeArrays``, (>= n + 1,) each.

    Returns:
        (nodes, ghosts) written, the root included.
    """
    n = chain[0].shape[0]
    lim = (n + 1, max(1, n), max(1, n), float(c), 0.0, 0.0, 0, -1)
    b = (out, _start(out, anchor, n + 1), np.array([1, 0], np.int64), lim)
    _lay(b, chain, n, np.empty(n + 1, np.int64))
    return b[2][0], b[2][1]


@njit(cache=True)
def anchor_has_row(uni_slot, uni_len, bi_len, bigram, prev, anchor):
    """Whether TR offers successors of the anchor (``TrSource.propose`` at the anchor is not empty: its table row,
    bigram tier first); ``prev`` is the token before it (-1: none).  What ``route``'s ``branch_offers`` reads when
    TR does not rest."""
    in_bigram, slot = row_slot(uni_slot, bigram, prev, anchor)
    if slot == -1:
        return False
    return (bi_len[slot] if in_bigram else uni_len[slot]) > 0


class BypassRule(NamedTuple):
    """When a cycle verifies the bare chain (``route``), all scalars."""

    alone: bool  # the method is PLD drafting alone (``drafts_alone``): always its chain
    bypass: bool  # ``TreeShape.bypass``
    confident: bool  # the "confident" rule (``Variant.bypass_rule``); False: "no-adjacency"
    threshold: int  # ``TreeShape.bypass_threshold``: a long chain, for the "confident" rule


@njit(cache=True)
def route(chain_len, branch_offers, consensus, rule):
    """Goose Alg. 2 lines 6-13 before the build (``Planner._route`` for sources PLD + TR): what the cycle builds,
    ``BYPASS`` (the bare chain), ``TREE`` (the spine tree) or ``AR`` (nothing: a plain step).

    Bypass needs a chain and either ``rule.alone`` or the bypass rule (``Planner._bypass``, App. B.2): with
    ``rule.bypass`` on, "no-adjacency" bypasses when no branch source offers successors of the anchor, "confident"
    when the chain has ``rule.threshold`` tokens or more, or a ``consensus``.  Otherwise a tree when any source
    drafted (the chain, or TR's row at the anchor: ``branch_offers``, False when TR rests), else AR.
    ``planned_mode`` settles it after the build.  ``rule``: ``BypassRule``.
    """
    if chain_len > 0:
        if rule.alone:
            return BYPASS
        if rule.bypass:
            if rule.confident:
                if chain_len >= rule.threshold or consensus:
                    return BYPASS
            elif not branch_offers:
                return BYPASS
    if chain_len > 0 or branch_offers:
        return TREE
    return AR


@njit(cache=True)
def planned_mode(mode, nodes):
    """``Planner._route``'s last line: an AR step when nothing was built or the built tree is the anchor alone (its
    ghosts are kept, as the plan keeps them); else ``mode``."""
    return AR if mode == AR or nodes <= 1 else mode


@njit(cache=True)
def spine_ratio_tier(p_s):
    """SPINERATIOTIER of Goose Alg. 2 line 9 (``estimates.spine_ratio_tier``, its tiers ``SPINE_RATIO_TIERS``, C.3)."""
    for bound, r in SPINE_RATIO_TIERS:
        if p_s < bound:
            return r
    return SPINE_RATIO_TIERS[-1][1]  # p_s NaN (the Python raises StopIteration)


class Schedule(NamedTuple):
    """Goose §4.3's confidence schedule's settings (``shape``), all scalars."""

    on: bool  # ``Variant.confidence_schedule``
    r_fixed: float  # ``TreeShape.spine_ratio``, or <= 0 when None (the EMA's tier)
    budget: int  # B
    extension: int  # ``Variant.budget_extension``
    max_extended: int  # ``Variant.max_extended_chain``
    extend_above: float  # ``Variant.extend_above``
    cap: int  # ``Resolved.chain_cap``, < 0 when None


@njit(cache=True)
def shape(confidence, p_s_ema, chain_len, schedule):
    """Goose §4.3's confidence schedule as the authors' code applies it (``Planner._shape``): with the schedule on,
    m = the match's confidence (else 0); the budget ``B + int(m * extension)``; r = ``r_fixed`` or, when it is <= 0,
    the tier of ``p_s_ema``, then ``r + m (1 - r)``; the extension's limit ``int(max_extended * m)``, at most ``cap``
    (< 0: none), and whether to extend: a chain (``chain_len`` > 0), m > ``extend_above`` and the limit past the
    chain.  ``schedule``: ``Schedule``.

    Returns:
        (budget, r, limit, extend, saturated): ``saturated`` (m >= 1) is ``extend_chain``'s flag; an extended chain
        is then cut to ``capped(len, cap)``.
    """
    m = confidence if schedule.on else 0.0
    r = schedule.r_fixed if schedule.r_fixed > 0.0 else spine_ratio_tier(p_s_ema)
    limit = int(schedule.max_extended * m)
    if schedule.cap >= 0:
        limit = min(limit, schedule.cap)
    extend = chain_len > 0 and m > schedule.extend_above and limit > chain_len
    return schedule.budget + int(m * schedule.extension), r + m * (1.0 - r), limit, extend, m >= 1.0


@njit(cache=True)
def capped(chain_len, cap):
    """The length an extended chain keeps (``Planner._shape``: the last lookup may overshoot ``cap``; < 0: none).
    Only an extended chain is cut: a match is never shorter than itself (the limit was past it)."""
    return chain_len if cap < 0 or chain_len <= cap else cap


def tree_arrays(size: int) -> TreeArrays:
    """Fresh output arrays for the kernels (``TreeArrays``), (size,) each."""
    ints, floats = np.int64, np.float64
    return TreeArrays(*(np.zeros(size, dtype) for dtype in (ints, ints, ints, floats, floats, ints, ints, ints, ints,
                                                            floats, floats)))


def built_of(arrays: tuple[np.ndarray, ...], nodes: int, ghosts: int) -> Built:
    """The kernels' output (``tree_arrays``, ``nodes`` nodes, ``ghosts`` ghosts) as the ``Built`` the Python builders
    return: a ``DraftTree`` (the root's parent None) and ``GhostNode``s, source codes as their ``Source`` tags."""
    tokens, parents, source, scores, est, _, ghost_parent, ghost_token, ghost_source, ghost_score, ghost_est = arrays
    tags = _tags()
    tree = DraftTree.derived(tuple(tokens[:nodes].tolist()), (None, *parents[1:nodes].tolist()),
                             tuple(tags[c] for c in source[:nodes].tolist()), tuple(scores[:nodes].tolist()),
                             tuple(est[:nodes].tolist()))
    return Built(tree, tuple(map(GhostNode, ghost_parent[:ghosts].tolist(), ghost_token[:ghosts].tolist(),
                                 [tags[c] for c in ghost_source[:ghosts].tolist()], ghost_score[:ghosts].tolist(),
                                 ghost_est[:ghosts].tolist())))


@cache
def _tags() -> tuple[Source, ...]:
    """Source code -> its tag (``SOURCE_CODES``)."""
    return tuple(Source(name) for name in SOURCE_CODES)


def source_code(source: Source) -> int:
    """The code of a source's tag (``SOURCE_CODES``).  Raises ValueError for a source the kernels do not build."""
    return SOURCE_CODES.index(source)


@cache
def _no_table() -> tuple:
    """An empty table's arrays and bigram map, no calibration (the kernel's table when no branch source grows)."""
    empty = ArrayTable(0, 1)
    return (*empty.arrays[:7], empty.bigram, np.zeros(0, np.float64))


def _chain_arrays(chain: Candidates) -> tuple[np.ndarray, np.ndarray]:
    return np.array(chain.tokens, np.int64).reshape(-1), np.array(chain.p, np.float64).reshape(-1)


def successor_table(tr, depths: int) -> tuple:
    """A TR source's table as ``build_spine`` reads it: the ``ArrayTable``'s first seven arrays and bigram map, then
    (depths,) float64 its calibration factors per depth (``TrSource.rate``), or (0,) when its estimates are its
    scores.  ``tr``: a ``TrSource`` whose ``table`` is an ``ArrayTable``."""
    a = tr.table.arrays
    calib = (np.array([tr.counter.calibration(d) for d in range(depths)], np.float64) if tr.calibrate
             else np.zeros(0, np.float64))
    return (*a[:7], tr.table.bigram, calib)


def build_spine_built(drafts: Proposals, cfg: DecodeConfig, spine_ratio: float, budget: int | None = None,
                      prune_at: float = 0.0) -> Built:
    """``spine_tree.build_spine_tree`` by ``build_spine``, for the configuration it covers: no pool, and TR with an
    ``ArrayTable`` the one branch source or none; ``cfg.variant.branch_growth`` is taken as "best-first".

    Raises:
        ValueError: a candidate pool, or branch sources other than one TR reading an ``ArrayTable``.
    """
    branches = drafts.branch_sources
    if drafts.pool or len(branches) > 1 or (branches and not isinstance(getattr(branches[0], "table", None),
                                                                          ArrayTable)):
        raise ValueError("the compiled spine tree takes no candidate pool and TR as its one branch source")
    B = cfg.tree.budget if budget is None else budget
    D = cfg.tree.max_depth
    branch = branches[0] if branches else None
    table = successor_table(branch, max(B, D) + 2) if branch is not None else _no_table()
    arrays = tree_arrays(B)
    chain_tokens, chain_p = _chain_arrays(drafts.spine)
    spine_code = source_code(drafts.spine_source) if drafts.spine_source is not None else ROOT
    prev = drafts.context[-2] if len(drafts.context) > 1 else -1
    shape = SpineShape(float(spine_ratio), B, D if cfg.variant.depth_bounds_spine else B, D, float(prune_at),
                       float(cfg.tree.min_score), float(cfg.tree.spine_branch_ratio), cfg.variant.spine_branch_min,
                       branch is not None)
    nodes, ghosts = build_spine((drafts.anchor, prev), (chain_tokens, chain_p, spine_code), shape, table, arrays)
    return built_of(arrays, nodes, ghosts)


def build_chain_built(anchor: int, chain: Candidates, source: Source, gt_threshold: float | None = 0.0) -> Built:
    """``spine_tree.build_chain`` by ``build_chain``.  Raises ValueError for ``gt_threshold`` None (an unresolved
    config, as ``TreeBuilder``)."""
    if gt_threshold is None:
        raise ValueError("the builders prune at a resolved config's prune_at: use config.resolved(curve)")
    arrays = tree_arrays(len(chain) + 1)
    nodes, ghosts = build_chain(anchor, (*_chain_arrays(chain), source_code(source)), float(gt_threshold), arrays)
    return built_of(arrays, nodes, ghosts)


__all__ = ["AR", "BYPASS", "MODES", "TR", "TREE", "BypassRule", "Schedule", "SpineShape", "anchor_has_row",
           "build_chain", "build_chain_built", "build_spine", "build_spine_built", "built_of", "capped",
           "planned_mode", "route", "shape", "source_code", "spine_ratio_tier", "successor_table", "tree_arrays"]
