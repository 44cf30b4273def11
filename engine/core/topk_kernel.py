"""Each row's top-k logits, read from its blocks' maxima (numba): the selection half of the CPU read-back
(``verify._read_back_here``), after torch's vectorised reduction has found every block's maximum.

Source: Goose paper, Appendix C.1 ("Aggressive logit harvesting": every verified row's top-K successors feed the
adjacency table), which makes a top-K over every row's logits part of each cycle.  Issue 71: on a CPU it cost more
than the rest of the read-back (``torch.topk`` sorts each row's whole vocabulary), and the numpy form of the same
two passes paid a dozen array operations a call (docs/results.md, "Goose's cost per cycle").

The two passes, per row: t is the k-th largest block maximum (each of those k blocks holds a logit >= t, so no logit
below t is in the top-k); only the blocks whose maximum reaches t are read, their logits >= t kept in a buffer of k
ordered by value, ties lowest id first (ids are read in increasing order and a later equal value never displaces an
earlier one).  The first id is the row's argmax as ``torch.argmax`` defines it (the lowest index among tied maxima).
"""
from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def _kth_largest(a, k, buf):
    """The k-th largest of ``a`` ((m,) float32, m >= k, no NaN), by an insertion buffer ``buf`` ((k,) float32)."""
    fill = 0
    for i in range(a.shape[0]):
        v = a[i]
        if fill < k:
            p = fill
            fill += 1
        elif v > buf[k - 1]:
            p = k - 1
        else:
            continue
        while p > 0 and buf[p - 1] < v:
            buf[p] = buf[p - 1]
            p -= 1
        buf[p] = v
    return buf[k - 1]


@njit(cache=True)
def _has_nan(a):
    """Whether ``a`` ((m,) float32) holds a NaN."""
    for i in range(a.shape[0]):
        if a[i] != a[i]:
            return True
    return False


@njit(cache=True)
def _keep(vals, ids, fill, v, i):
    """Put logit ``v`` of id ``i`` into the top buffer (``vals`` (k,) float32 and ``ids`` (k,) int64, best first,
    ``fill`` of k filled) after the entries it does not beat; returns the new fill.  A full buffer drops its last."""
    k = vals.shape[0]
    if fill == k and not v > vals[k - 1]:
        return fill
    p = fill if fill < k else k - 1
    while p > 0 and vals[p - 1] < v:
        vals[p] = vals[p - 1]
        ids[p] = ids[p - 1]
        p -= 1
    vals[p] = v
    ids[p] = i
    return fill + 1 if fill < k else fill


@njit(cache=True)
def top_rows(top, blocks, probs, ids, scores):
    """Each row's k largest logits' ids, by value, ties lowest id first, into ``ids``, and their probabilities read
    from ``probs`` into ``scores`` (the gather in the same call: a torch gather after a forward cost 0.03 ms).

    Args:
        top: (n, nb) float32 each block's maximum (NaN where the block holds one, as torch's ``amax`` gives it).
        blocks: (n, nb, B) float32 the logits in blocks of B (a vocabulary padded with -inf to a multiple of B).
        probs: (n, |V|) float32 each row's softmax.
        ids: (n, k) int64, written; 1 <= k <= the real vocabulary.
        scores: (n, k) float64, written: ``probs`` at ``ids``, exactly (float32 widened).  A row holding a NaN is
            left unwritten in both.

    Returns:
        (n,) bool: the rows holding a NaN (``torch.topk`` ranks NaN the largest: the caller reads those rows so).
    """
    n, nb, width = blocks.shape
    k = ids.shape[1]
    nan = np.zeros(n, np.bool_)
    vals = np.empty(k, np.float32)
    for r in range(n):
        if _has_nan(top[r]):
            nan[r] = True
            continue
        t = _kth_largest(top[r], k, vals) if nb > k else -np.inf  # fewer blocks than k: every logit a candidate
        fill = 0
        for b in range(nb):
            if top[r, b] >= t:
                for j in range(width):
                    v = blocks[r, b, j]
                    if v >= t:
                        fill = _keep(vals, ids[r], fill, v, b * width + j)
        for j in range(k):
            scores[r, j] = probs[r, ids[r, j]]
    return nan
