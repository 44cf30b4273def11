"""One compiled entry per cycle (numba): stage 6 of cycle k (learn) and stages 1-2 of cycle k + 1 (draft, build, GT's
size choice) for the default Goose configuration, sources PLD + TR, in one call over the generation's arrays.

Source: Goose paper, Algorithm 2 (lines 5-16: draft, route, build, verify, accept, commit, learn) with the routing of
Appendix B.2 and the confidence schedule of §4.3; Algorithm 1 (``build_kernel``); GT principle paper, §3.1 (the size
choice and the path calibration: ``gt_kernel``, ``calibration_kernel``).  Each stage is the kernel of the module that
states it in arrays; this one only runs them in the order ``decode.SpecDecoder``'s loop and ``planner.Planner`` run the
Python stages, so the trees, ghosts, estimates and choices are the same (tests/test_compiled_cycle.py compares whole
generations field by field).  Issue 71: after each forward the host's caches are cold, and every separate entry into
compiled code pays for it; one entry a cycle pays once.

The state travels in NamedTuples (``Settings``, ``Cycle``, ``Tables``), held together as one compiled object
(``cycle_state.CycleState``), so a call from Python unboxes one pointer, not the ~80 arrays.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from numba import njit

from ..sources import pld_kernel
from ..sources.adjacency import _store, room_for
from .build_kernel import (
    AR,
    BYPASS,
    TREE,
    BypassRule,
    Schedule,
    SpineShape,
    anchor_has_row,
    build_chain,
    build_spine,
    capped,
    planned_mode,
    route,
    shape,
)
from .calibration_kernel import PLD, NodeArrays, record, resolve, update_stats
from .calibration_kernel import room_for as pending_room
from .gt_kernel import GhostArrays, calibrated_choice, speedup_optimal
from .spine_kernel import TreeArrays

# ``Settings.ints``: the configuration's integers and flags
(S_BUDGET, S_EXTENSION, S_MAX_EXTENDED, S_SCHEDULE, S_BYPASS, S_CONFIDENT_RULE, S_BYPASS_THRESHOLD, S_MAX_DEPTH,
 S_DEPTH_BOUNDS_SPINE, S_SPINE_BRANCH_MIN, S_CHAIN_CAP, S_DRAFT_BUDGET, S_REST_AFTER, S_RATE_TRACKED, S_CALIBRATE,
 S_COUNTERFACTUAL, S_EMA_ON_CHAINS, S_BIGRAM_CAPACITY, S_RENORMALISE) = range(19)
N_SETTINGS_INTS = 19
# ``Settings.floats``
F_EXTEND_ABOVE, F_SPINE_RATIO, F_PRUNE_AT, F_MIN_SCORE, F_RHO, F_AR_MS = range(6)
N_SETTINGS_FLOATS = 6
# ``Cycle.ints``: the generation's counters and the planned cycle's facts
(C_STREAM, C_OUTPUT, C_STREAK, C_MODE, C_RESTING, C_NODES, C_GHOSTS, C_BUILT, C_HAS_BUILT, C_HAS_GT, C_BUDGET,
 C_CHAIN, C_MATCH, C_GT_CANDIDATES, C_TRUSTED, C_ROWS, C_ROOM, C_VOCAB) = range(18)
N_CYCLE_INTS = 18
# ``Cycle.floats``
(D_CURVE_MS, D_SPINE_RATIO, D_CONFIDENCE, D_GT_EXPECTED, D_GT_COST, D_TRUSTED_EXPECTED) = range(6)
N_CYCLE_FLOATS = 6


class Settings(NamedTuple):
    """The resolved configuration, as numbers (``compiled_cycle.settings_of``)."""

    ints: np.ndarray  # (N_SETTINGS_INTS,) int64, see S_BUDGET ...
    floats: np.ndarray  # (N_SETTINGS_FLOATS,) float64, see F_EXTEND_ABOVE ...
    costs: np.ndarray  # (m,) float64 T(1) .. T(m) (``CostCurve.latencies``), m >= the largest tree
    rows: np.ndarray  # (m,) int64 the rows a forward of n rows runs as (``CostCurve.verify_rows``), at [n - 1]
    pld: pld_kernel.PldSettings


class Cycle(NamedTuple):
    """The generation's counters and the planned cycle: its built tree, its kept tree and ghosts, its chain."""

    stream: np.ndarray  # (cap,) int64 prompt + output, its first ints[C_STREAM] filled
    ints: np.ndarray  # (N_CYCLE_INTS,) int64, see C_STREAM ...
    floats: np.ndarray  # (N_CYCLE_FLOATS,) float64, see D_CURVE_MS ...
    ema: np.ndarray  # (2,) float64 alpha, p_s_ema (``AcceptanceStats``)
    built: NodeArrays  # (B_max,) each: the tree as Alg. 1 built it (before GT)
    ghosts: GhostArrays  # (B_max,) each: the candidates c kept out of it
    kept: NodeArrays  # (B_max,) each: the tree verified (after GT)
    lost: GhostArrays  # (2 B_max,) each: its ghosts
    read: np.ndarray  # (B_max,) float64 the estimates GT read per built node (``GtChoice.read``)
    kept_at: np.ndarray  # (B_max,) int64 the kept nodes' indices in the built tree
    trusted: tuple  # ((B_max,) float64 calibrated estimates, (B_max,) float64 read, (B_max,) int64 kept)
    chain: tuple  # ((cap,) int64 tokens, (cap,) float64 estimates) the spine's chain, extended
    empty: np.ndarray  # (0,) int64


class Tables(NamedTuple):
    """What the sources and the estimates keep: PLD's index, TR's table, the depth counters, the calibration."""

    pld: pld_kernel.NgramArrays
    tr: tuple  # (``adjacency.TableArrays``, the bigram map): TR's table (``ArrayTable``)
    calib: np.ndarray  # (0,) float64: TR's estimates are its scores
    counters: tuple  # ``calibration_kernel.DepthArrays``
    cal: tuple  # ``calibration_kernel.CalState``
    pend: tuple  # ``calibration_kernel.Pending``


@njit(cache=True)
def learn(s, c, t, verified):
    """Alg. 2 line 16 for the cycle just verified (``SpecDecoder._learn``, in its order): its built tree recorded for
    the calibration, the committed tokens appended, TR's store of every row unless TR rested, the acceptance
    statistics, the AR streak, the decided trees resolved, and the curve's time of the forward for λ.

    ``verified`` = (accepted (a,) int64 the accepted nodes, root excluded; committed (k,) int64 the tokens appended
    to the output; ids (n, K) int64 and scores (n, K) float64, each forward row's top-K successors: ``ReadBack``).
    """
    accepted, committed, ids, scores = verified
    si, ci = s.ints, c.ints
    n = ci[C_NODES]
    tree = NodeArrays(c.kept.tokens[:n], c.kept.parents[:n], c.kept.source[:n], c.kept.scores[:n], c.kept.est[:n],
                      c.kept.depth[:n])
    at = ci[C_STREAM]  # where this cycle's tokens start; the anchor is at at - 1
    if ci[C_HAS_BUILT]:
        b = ci[C_BUILT]
        built = NodeArrays(c.built.tokens[:b], c.built.parents[:b], c.built.source[:b], c.built.scores[:b],
                           c.built.est[:b], c.built.depth[:b])
        trusted = c.trusted[2][: ci[C_TRUSTED]] if ci[C_HAS_GT] and si[S_CALIBRATE] else c.empty
        expected = c.floats[D_TRUSTED_EXPECTED] if ci[C_HAS_GT] and si[S_CALIBRATE] else 0.0
        record(t.pend, built, at, trusted, expected)
    k = committed.shape[0]
    c.stream[at: at + k] = committed
    ci[C_STREAM] = at + k
    ci[C_OUTPUT] += k
    if not ci[C_RESTING]:  # TR observes every row (C.1)
        prev = np.empty(n, np.int64)  # (n,) the token before each row's input on its path
        prev[0] = c.stream[at - 2] if at > 1 else -1
        for i in range(1, n):
            prev[i] = tree.tokens[tree.parents[i]]
        _store(t.tr[0], t.tr[1], (si[S_BIGRAM_CAPACITY], si[S_RENORMALISE] != 0), (prev, tree.tokens, ids[:n],
                                                                                    scores[:n]))
    ema = ci[C_MODE] == TREE or si[S_EMA_ON_CHAINS] != 0
    update_stats(tree, accepted, t.counters, c.ema, (si[S_COUNTERFACTUAL] != 0, ema))
    ci[C_STREAK] = ci[C_STREAK] + 1 if ci[C_MODE] == AR else 0
    if t.pend.fill[0]:
        resolve(t.cal, t.pend, c.stream[: ci[C_STREAM]], t.counters,
                (si[S_COUNTERFACTUAL] != 0, si[S_CALIBRATE] != 0))
    if si[S_RATE_TRACKED]:
        c.floats[D_CURVE_MS] += s.costs[n - 1]


@njit(cache=True)
def plan(s, c, t):
    """Alg. 2 lines 5-13 for the next cycle (``Planner.draft`` then ``Planner.build``): PLD's chain and TR's row at
    the anchor (TR resting after ``rest_after`` AR cycles), the route, the shape and the chain's extension, the tree
    (``build_kernel``), then GT's size choice on it (calibrated when ``S_CALIBRATE``), and the rows the forward runs."""
    si, sf, ci, cf = s.ints, s.floats, c.ints, c.floats
    length = ci[C_STREAM]
    context = c.stream[:length]
    anchor, prev = context[length - 1], context[length - 2] if length > 1 else -1
    k = si[S_REST_AFTER]
    resting = k > 0 and ci[C_STREAK] >= k and ci[C_STREAK] % k != 0
    tokens, p = c.chain
    m, _, confidence, consensus = pld_kernel.propose(t.pld, s.pld, t.counters, (context, c.empty),
                                                     si[S_DRAFT_BUDGET], (tokens, p))
    a, bigram = t.tr
    offers = not resting and anchor_has_row(a.uni_slot, a.uni_len, a.bi_len, bigram, prev, anchor)
    mode = route(m, offers, consensus, BypassRule(False, si[S_BYPASS] != 0, si[S_CONFIDENT_RULE] != 0,
                                                  si[S_BYPASS_THRESHOLD]))
    ci[C_RESTING], ci[C_MATCH], ci[C_CHAIN], ci[C_BUDGET] = resting, m, m, -1
    cf[D_CONFIDENCE], cf[D_SPINE_RATIO] = confidence if m else 0.0, math.nan
    b, g = c.built, c.ghosts
    nodes, ghosts = 0, 0
    out = TreeArrays(b.tokens, b.parents, b.source, b.scores, b.est, b.depth, g.parent, g.token, g.source, g.score,
                     g.est)
    if mode == BYPASS:
        nodes, ghosts = build_chain(anchor, (tokens[:m], p[:m], PLD), sf[F_PRUNE_AT], out)
    elif mode == TREE:
        schedule = Schedule(si[S_SCHEDULE] != 0, sf[F_SPINE_RATIO], si[S_BUDGET], si[S_EXTENSION], si[S_MAX_EXTENDED],
                            sf[F_EXTEND_ABOVE], si[S_CHAIN_CAP])
        budget, r, limit, extend, saturated = shape(confidence if m else 0.0, c.ema[1], m, schedule)
        chain = m
        if extend:
            chain = pld_kernel.extend_chain(t.pld, s.pld, t.counters, context, (tokens, p),
                                            (m, limit, si[S_DRAFT_BUDGET], saturated))
            chain = capped(chain, si[S_CHAIN_CAP])
        depth_bound = si[S_MAX_DEPTH] if si[S_DEPTH_BOUNDS_SPINE] else budget
        spine = SpineShape(r, budget, depth_bound, si[S_MAX_DEPTH], sf[F_PRUNE_AT], sf[F_MIN_SCORE], sf[F_RHO],
                           si[S_SPINE_BRANCH_MIN], not resting)
        table = (a.uni_slot, a.uni_ids, a.uni_scores, a.uni_len, a.bi_ids, a.bi_scores, a.bi_len, bigram, t.calib)
        nodes, ghosts = build_spine((anchor, prev), (tokens[:chain], p[:chain], PLD), spine, table, out)
        ci[C_CHAIN], ci[C_BUDGET], cf[D_SPINE_RATIO] = chain, budget, r
    mode = planned_mode(mode, nodes)
    if mode == AR:  # the anchor alone; its ghosts are the build's, when there was one
        nodes = 1
        b.tokens[0], b.parents[0], b.source[0], b.scores[0], b.est[0], b.depth[0] = anchor, -1, 0, 1.0, 1.0, 0
        ci[C_BUDGET], ci[C_CHAIN], cf[D_SPINE_RATIO] = -1, 0, math.nan
    ci[C_MODE], ci[C_BUILT], ci[C_HAS_GT] = mode, nodes, mode != AR
    ci[C_HAS_BUILT] = mode != AR and (si[S_CALIBRATE] != 0 or si[S_COUNTERFACTUAL] != 0)  # its outcome teaches
    _choose_size(s, c, t, nodes, ghosts)
    ci[C_ROWS] = s.rows[ci[C_NODES] - 1]


@njit(cache=True)
def _choose_size(s, c, t, nodes, ghosts):
    """``Planner._choose_size`` (GT "auto"): the built tree's top n* nodes for the session's rate λ (Dinkelbach) on
    estimates calibrated by the session (``S_CALIBRATE``) or raw; an AR step when n* = 1.  An AR plan keeps the
    anchor and the build's ghosts as they are."""
    si, ci, cf = s.ints, c.ints, c.floats
    b, g, k, lost = c.built, c.ghosts, c.kept, c.lost
    built = NodeArrays(b.tokens[:nodes], b.parents[:nodes], b.source[:nodes], b.scores[:nodes], b.est[:nodes],
                       b.depth[:nodes])
    left = GhostArrays(g.parent[:ghosts], g.token[:ghosts], g.source[:ghosts], g.score[:ghosts], g.est[:ghosts])
    if ci[C_MODE] == AR:
        _copy(built, k, lost, left)
        ci[C_NODES], ci[C_GHOSTS] = nodes, ghosts
        return
    rate = ci[C_OUTPUT] / (cf[D_CURVE_MS] + s.floats[F_AR_MS]) if si[S_RATE_TRACKED] else math.nan
    price = (s.costs, 0, rate)
    out = (c.read[:nodes], c.kept_at[:nodes], k, lost)
    if si[S_CALIBRATE]:
        kept, expected, cost_ms, g_out, t_nodes, t_expected, _ = calibrated_choice(
            t.cal, built, price, left, out, (c.trusted[0][:nodes], c.trusted[1][:nodes], c.trusted[2][:nodes]))
        ci[C_TRUSTED], cf[D_TRUSTED_EXPECTED] = t_nodes, t_expected
    else:
        kept, expected, cost_ms, g_out = speedup_optimal(built, built.est, price, left, out)
    ci[C_NODES], ci[C_GHOSTS], ci[C_GT_CANDIDATES] = kept, g_out, nodes
    cf[D_GT_EXPECTED], cf[D_GT_COST] = expected, cost_ms
    if kept == 1:  # priced down to the anchor: an AR step
        ci[C_MODE], cf[D_SPINE_RATIO] = AR, math.nan


@njit(cache=True)
def _copy(built, kept, lost, left):
    """The built tree and its ghosts as the verified ones (no size choice)."""
    for i in range(built.tokens.shape[0]):
        kept.tokens[i], kept.parents[i], kept.source[i] = built.tokens[i], built.parents[i], built.source[i]
        kept.scores[i], kept.est[i], kept.depth[i] = built.scores[i], built.est[i], built.depth[i]
    for j in range(left.parent.shape[0]):
        lost.parent[j], lost.token[j], lost.source[j] = left.parent[j], left.token[j], left.source[j]
        lost.score[j], lost.est[j] = left.score[j], left.est[j]


@njit(cache=True)
def advance(s, c, t, verified):
    """Learn from the cycle just verified (``verified``: see ``learn``), then plan the next: the one compiled entry of
    a cycle (``learn``, ``prepare``)."""
    learn(s, c, t, verified)
    prepare(s, c, t)


@njit(cache=True)
def prepare(s, c, t):
    """Plan the next cycle (``plan``) and say whether the next ``learn`` finds room for it (``has_room``, into
    ``Cycle.ints[C_ROOM]``): after each learn, and at the prefill for the first cycle."""
    plan(s, c, t)
    c.ints[C_ROOM] = has_room(s, c, t)


@njit(cache=True)
def has_room(s, c, t):
    """Whether the next ``learn`` finds room for the planned cycle without the Python side growing an array (TR's
    table for its rows, the calibration's pool for its built tree; PLD's index was sized for the whole stream)."""
    n = c.kept.tokens.shape[0]
    return (room_for(t.tr[0], c.ints[C_VOCAB] - 1, n, s.ints[S_BIGRAM_CAPACITY])
            and pending_room(t.pend, n))
