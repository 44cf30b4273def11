"""Stages 4-5 of a cycle compiled (numba): the greedy walk over a verified draft tree, and the committed tokens cut at
EOS and at the output's room, over arrays, for the one compiled entry a cycle makes (issue 71).

Source: Goose paper, Algorithm 3 (the greedy walk: the longest path whose every token is the target's greedy choice,
children tried in source priority, then in insertion order) and Algorithm 2 line 15 (commit the accepted tokens and
the bonus).  ``engine.core.verify.greedy_walk`` and ``decode.SpecDecoder._append`` state the same in Python; the two
must change together (tests/test_walk_kernel.py compares them).

Trees travel as the compiled cycle's node arrays: ``tokens`` (n,) int64, ``parents`` (n,) int64 (-1 for the root),
``source`` (n,) int64 source codes, in topological order (a parent's index below its children's), so a node's
children in index order are its children in insertion order.
"""
from __future__ import annotations

import numpy as np
from numba import njit

_NONE = -1


@njit(cache=True)
def greedy_walk(tokens: np.ndarray, parents: np.ndarray, source: np.ndarray, n: int, greedy: np.ndarray,
                rank: np.ndarray, accepted: np.ndarray) -> tuple[int, int]:
    """Goose Algorithm 3 on the first ``n`` nodes: from the root, accept the child carrying the target's greedy token,
    the first in source priority, then in index order, until no child does.

    Args:
        tokens, parents, source: (>= n,) int64 node arrays (see the module's docstring).
        greedy: (>= n,) int64 the target's argmax after each node's row.
        rank: (codes,) int64 each source code's place in the walk's priority (``TreeShape.walk_priority``); -1: a
            source the walk never accepts (the anchor, padding).
        accepted: (>= depth,) int64 output: the accepted nodes, root excluded, in path order.

    Returns:
        (accepted nodes written to ``accepted``, the bonus token: the target's greedy token at the last of them).
    """
    node, m = 0, 0
    while True:
        want = greedy[node]
        best, best_rank = _NONE, 0
        for c in range(node + 1, n):  # children follow their parent
            if parents[c] != node or tokens[c] != want:
                continue
            r = rank[source[c]]
            if r == _NONE:
                continue
            if best == _NONE or r < best_rank:  # the first in priority, then in index order
                best, best_rank = c, r
        if best == _NONE:
            return m, want
        accepted[m] = best
        m += 1
        node = best


@njit(cache=True)
def cut(tokens: np.ndarray, m: int, eos: np.ndarray, room: int) -> tuple[int, bool]:
    """``SpecDecoder._append``'s cut of a cycle's ``m`` tokens (the accepted ones, then the bonus): at most ``room`` of
    them (the output's room left under max new tokens), and none past the first end-of-sequence token.

    Args:
        tokens: (>= m,) int64 the cycle's tokens in order.
        eos: (e,) int64 the end-of-sequence token ids.
        room: max new tokens minus the output's length.

    Returns:
        (tokens kept, whether an end-of-sequence token was kept: the generation ends at it).
    """
    kept = min(m, max(room, 0))
    for i in range(kept):
        for e in eos:
            if tokens[i] == e:
                return i + 1, True
    return kept, False
