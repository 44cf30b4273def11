"""Alg. 1 steps 2-4 compiled (numba): the root and spine branches, then the best-first extension, reading TR's
adjacency table in its arrays, so a tree's hundreds of lookups, comparisons and heap operations cost no Python.

Source: Goose paper, Algorithm 1 (BUILDSPINETREE) steps 2-4, Appendix B.1 (duplicate exclusion) and C.1
(successors scored < 0.01 pruned; the table); GT principle paper, §3 (the threshold c, ``TreeBuilder.add``).

``spine_tree.py`` states the same steps in Python (``_spine_branches``, ``_attach``, ``_extend_best_first``), for
any branch sources; this kernel is their exact equivalent for the one table-backed branch source (TR), node for
node and ghost for ghost (tests/test_spine_kernel.py compares them on random tables).  The two must change together.

Tree state travels as arrays of the builder's budget B (``TreeArrays``): node i's token, parent (-1 for the root),
source code (``SOURCE_CODES``), score, path estimate and depth; ghosts (parent, token, source code, score, estimate)
in their own arrays.  Each node's children are a linked list in insertion order (``first_child``, ``next_sibling``),
so "the first child carrying a token" is the builder's ``child_with``.  ``engine.decoding.build_kernel`` lays step 1
in the same arrays and calls ``steps_2_to_4``: the whole of Alg. 1 in one compiled call.
"""
from __future__ import annotations

import heapq
import math
from typing import NamedTuple

import numpy as np
from numba import njit

from ..sources.adjacency import row_slot

_NONE = -1
#: Node source codes of the compiled cycle (``TreeArrays.source``, ``ghost_source``): the anchor, PLD, TR.
ROOT, PLD, TR = 0, 1, 2
SOURCE_CODES = ("anchor", "pld", "tr")  # code -> its ``Source`` tag's name ("anchor": ``Source.ROOT``)


class TreeArrays(NamedTuple):
    """A tree under construction, as the kernels take it (each (B,) sized or larger, B the budget).  Source codes:
    ``SOURCE_CODES`` (0 the anchor, 1 PLD, 2 TR)."""

    tokens: np.ndarray  # (B,) int64
    parents: np.ndarray  # (B,) int64, -1 for the root
    source: np.ndarray  # (B,) int64 source code
    scores: np.ndarray  # (B,) float64 the score shown
    est: np.ndarray  # (B,) float64 path estimate (``DraftTree.est_accept``)
    depth: np.ndarray  # (B,) int64
    ghost_parent: np.ndarray  # (B,) int64
    ghost_token: np.ndarray  # (B,) int64
    ghost_source: np.ndarray  # (B,) int64 source code
    ghost_score: np.ndarray  # (B,) float64
    ghost_est: np.ndarray  # (B,) float64


class Limits(NamedTuple):
    """The builder's limits and Alg. 1's shares (all scalars)."""

    budget: int  # B, root included
    max_depth: int  # the builder's depth bound (D, or B when D bounds branches only)
    branch_depth: int  # D: branch leaves at this depth are not extended (step 4)
    min_est: float  # c: a node whose path estimate is below it becomes a ghost
    min_score: float  # successors scored below it are skipped (C.1)
    spine_branch_ratio: float  # rho
    spine_branch_min: int  # branches a spine node gets at least, while the share lasts
    prev_of_root: int  # the token before the anchor (-1: none)


@njit(cache=True)
def _add(b, parent, node):
    """``TreeBuilder.add`` of ``node`` = (token, source code, score, p) below ``parent``: the new node's index, or -1
    when the budget, the depth or c refuses it (c: a ghost, while fewer than B ghosts were kept).  ``b`` is the
    builder: (``TreeArrays``, children's lists, count (2,) int64 nodes and ghosts, ``Limits``)."""
    t, kids, count, lim = b
    tokens, parents, source, scores, est, depth, ghost_parent, ghost_token, ghost_source, ghost_score, ghost_est = t
    token, src, score, p = node
    n = count[0]
    if n >= lim[0] or depth[parent] >= lim[1]:
        return -1
    path_est = est[parent] * p
    if path_est < lim[3]:
        g = count[1]
        if g < lim[0]:
            ghost_parent[g], ghost_token[g], ghost_source[g] = parent, token, src
            ghost_score[g], ghost_est[g] = score, path_est
            count[1] = g + 1
        return -1
    tokens[n], parents[n], source[n], scores[n], est[n] = token, parent, src, score, path_est
    depth[n] = depth[parent] + 1
    first, nxt, last = kids
    first[n], nxt[n], last[n] = -1, -1, -1
    if first[parent] == -1:
        first[parent] = n
    else:
        nxt[last[parent]] = n
    last[parent] = n
    count[0] = n + 1
    return n


@njit(cache=True)
def _child_with(b, parent, token, below):
    """The first child of ``parent`` carrying ``token`` among nodes below index ``below``, or -1."""
    tokens, kids = b[0][0], b[1]
    c = kids[0][parent]
    while c != -1 and c < below:
        if tokens[c] == token:
            return c
        c = kids[1][c]
    return -1


@njit(cache=True)
def _row(b, table, node):
    """(ids, scores, estimated acceptances) of ``node``'s successors in TR's table, best first; empty when none.
    The estimate is the score, or min(1, score x calibration[depth + 1]) (``TrSource.rate``)."""
    t, lim = b[0], b[3]
    tokens, parents, depth = t[0], t[1], t[5]
    uni_slot, uni_ids, uni_scores, uni_len, bi_ids, bi_scores, bi_len, bigram, calib = table
    prev = lim[7] if node == 0 else tokens[parents[node]]
    in_bigram, slot = row_slot(uni_slot, bigram, prev, tokens[node])
    if slot == _NONE:  # empty views that index no row (the table may have none)
        return uni_ids.reshape(-1)[:0], uni_scores.reshape(-1)[:0], np.empty(0, np.float64)
    if in_bigram:
        ids, scores = bi_ids[slot, : bi_len[slot]], bi_scores[slot, : bi_len[slot]]
    else:
        ids, scores = uni_ids[slot, : uni_len[slot]], uni_scores[slot, : uni_len[slot]]
    if calib.shape[0] == 0:  # the estimates are the scores: the row itself, no copy
        return ids, scores, scores
    p = np.empty(scores.shape[0], np.float64)  # (k,)
    for j in range(p.shape[0]):
        p[j] = min(1.0, scores[j] * calib[depth[node] + 1])
    return ids, scores, p


@njit(cache=True)
def _attach(b, table, node, n_wanted, seeds):
    """``spine_tree._attach``: up to ``n_wanted`` top successors of ``node`` scored at least the minimum, not
    already its children when the call began; the nodes added join ``seeds``."""
    count, lim = b[2], b[3]
    below = count[0]  # children added from here on are not "taken"
    ids, scores, p = _row(b, table, node)
    added = 0
    for j in range(ids.shape[0]):
        if added >= n_wanted:
            break
        if scores[j] < lim[4]:
            continue
        if _child_with(b, node, ids[j], below) == -1:
            child = _add(b, node, (ids[j], TR, scores[j], p[j]))
            if child != -1:
                seeds.append(child)
                added += 1


@njit(cache=True)
def _push_successors(b, table, node, queue, turn):
    """Step 4's k-way merge: rank ``node``'s successors by path estimate (ties in the table's order) into the
    ``queue``'s ranking (keys, ids, scores, estimates, how many) and put the best in its heap; returns the next
    turn.  ``queue`` = (heap, ranking)."""
    t, count, lim = b[0], b[2], b[3]
    heap, ranked = queue
    est, depth = t[4], t[5]
    if count[0] >= lim[0] or depth[node] >= lim[1] or depth[node] >= lim[2]:
        return turn
    ids, scores, p = _row(b, table, node)
    keys, toks, scs, ps = ranked[0][node], ranked[1][node], ranked[2][node], ranked[3][node]
    m = 0
    for j in range(ids.shape[0]):
        if scores[j] >= lim[4]:
            key = -est[node] * p[j]
            i = m  # insertion sort, stable: equal keys keep the table's order
            while i > 0 and keys[i - 1] > key:
                keys[i], toks[i], scs[i], ps[i] = keys[i - 1], toks[i - 1], scs[i - 1], ps[i - 1]
                i -= 1
            keys[i], toks[i], scs[i], ps[i] = key, ids[j], scores[j], p[j]
            m += 1
    ranked[4][node] = m
    if m:
        heapq.heappush(heap, (keys[0], turn, 0, node))
        return turn + 1
    return turn


@njit(cache=True)
def steps_2_to_4(b, table, spine_nodes):
    """Alg. 1 steps 2-4 (best-first) on the builder ``b`` (see ``_add``; its children's lists hold the laid nodes),
    in place; the branch nodes are TR's (code 2).  ``table``: TR's (``build_kernel.successor_table``);
    ``spine_nodes``: (n_spine + 1,) int64 the spine's nodes, root first."""
    _step_4(b, table, _steps_2_3(b, table, spine_nodes))


@njit(cache=True)
def _steps_2_3(b, table, spine_nodes):
    """Alg. 1 steps 2-3: the root's branches, then the spine's by harmonic decay; returns the branch nodes added
    (step 4's seeds)."""
    count, lim = b[2], b[3]
    seeds = [0]
    seeds.pop()
    n_spine = spine_nodes.shape[0] - 1
    left = lim[0] - count[0]
    n_root = math.floor(left * (1 - lim[5])) if n_spine else left
    _attach(b, table, 0, n_root, seeds)
    share = left - n_root
    harmonic = 0.0
    for j in range(1, n_spine + 1):
        harmonic += 1 / j
    for i in range(1, n_spine + 1):
        n_wanted = min(share, max(lim[6], math.floor((left - n_root) * (1 / i) / harmonic)))
        if n_wanted <= 0:
            break
        share -= n_wanted
        _attach(b, table, spine_nodes[i], n_wanted, seeds)
    return seeds


@njit(cache=True)
def _step_4(b, table, seeds):
    """Alg. 1 step 4, best-first: one heap over the tree; each node's ranked successors enter it one at a time."""
    count, budget = b[2], b[3][0]
    width = table[1].shape[1]
    ranked = (np.empty((budget, width), np.float64), np.empty((budget, width), np.int64),
              np.empty((budget, width), np.float64), np.empty((budget, width), np.float64), np.zeros(budget, np.int64))
    heap = [(0.0, 0, 0, 0)]
    heap.pop()
    queue = (heap, ranked)
    turn = 0
    for node in seeds:
        turn = _push_successors(b, table, node, queue, turn)
    while len(heap) and count[0] < budget:
        _, node_turn, rank, parent = heapq.heappop(heap)
        if rank + 1 < ranked[4][parent]:  # the parent's next best successor takes its place
            heapq.heappush(heap, (ranked[0][parent, rank + 1], node_turn, rank + 1, parent))
        token = ranked[1][parent, rank]
        if _child_with(b, parent, token, budget) != -1:
            continue
        child = _add(b, parent, (token, TR, ranked[2][parent, rank], ranked[3][parent, rank]))
        if child == -1:
            break  # budget full, or the best remaining candidate is below c (so are all the others)
        turn = _push_successors(b, table, child, queue, turn)
