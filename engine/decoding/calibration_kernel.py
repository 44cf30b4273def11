"""The path calibration and the acceptance statistics compiled (numba), over arrays: GT's estimates judged by the output
to come, for one compiled entry per cycle (issue 71).

Source: GT principle paper, §3.1 (Eqs. 6-9): each node priced at its path estimate α̂, the product of per-source,
per-depth estimates along its path, mapped through the session's measured outcomes.  ``calibration.py``
(``PathCalibration``: record, resolve, ``_undecided``, conditional, ``_add``, ratio, calibrate, tree, trust) and
``core/estimates.py`` (``DepthCounter.add``, ``AcceptanceStats.update``) state the same in Python; these kernels
reproduce them bit for bit (the same float operations in the same order; tests/test_gt_kernel.py compares every
field).  They must change together.  GT's size choice on these estimates is ``gt_kernel``'s.

Conventions of the compiled cycle:
    - source codes int64: 0 anchor, 1 pld (the one spine source), 2 tr; pld and tr are verified;
    - a tree (``NodeArrays``) is n nodes in topological order: token, parent (-1 for the root), source code, score,
      path estimate (``DraftTree.est_accept``), depth;
    - a kind (source, first draft token or deeper) is (source code, 0 or 1); its bins are bisect_right(
      CALIBRATION_EDGES, est), slot ``TOTAL`` its total (``PathCalibration.counts``' bin None);
    - depth counters (``DepthArrays``) are (3, DMAX) per source and depth, as ``DepthCounter``'s dictionaries.

Kernels write into arrays the caller provides and return scalars; they never reallocate state: the Python classes
(``CalibrationArrays``, ``StatsArrays``, mirroring ``PathCalibration`` and ``AcceptanceStats``) grow it (doubling)
before a kernel needs room (a kernel's scratch, a tree's hits, is allocated per call).  Arrays travel in named tuples
(an njit caller passes them for free; from Python they unbox slower, which only the tests pay).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
from numba import njit

from ..core.tree import DraftTree
from .calibration import CALIBRATION_EDGES

ANCHOR, PLD, TR = 0, 1, 2
N_SOURCES = 3
SOURCE_CODES = {"anchor": ANCHOR, "pld": PLD, "tr": TR}
DMAX = 256  # depth counters' second axis: depths 0 .. DMAX - 1
N_BINS = len(CALIBRATION_EDGES) + 1  # bisect_right(CALIBRATION_EDGES, est) in 0 .. N_BINS - 1
TOTAL = N_BINS  # the calibration counts' slot of a kind's total (``PathCalibration.counts``' bin None)
_EDGES = np.array(CALIBRATION_EDGES, np.float64)  # (N_BINS - 1,)
_WEIGHT, _START, _START_WEIGHT, _TRUST_START, _TRUST_WEIGHT = range(5)  # ``CalState.params``
_TREES, _NODES, _KEPT = range(3)  # ``Pending.fill``
_AT, _OFF, _N, _KOFF, _KN = range(5)  # ``Pending.meta`` columns


class NodeArrays(NamedTuple):
    """A tree's n nodes, root first, topological (a ``DraftTree``; ``node_arrays``)."""

    tokens: np.ndarray  # (n,) int64
    parents: np.ndarray  # (n,) int64, -1 for the root
    source: np.ndarray  # (n,) int64 source code
    scores: np.ndarray  # (n,) float64 draft score
    est: np.ndarray  # (n,) float64 path estimate (est_accept)
    depth: np.ndarray  # (n,) int64


class CalState(NamedTuple):
    """``PathCalibration``'s counts, trusted sets and parameters; a kind is (source code, first draft token?)."""

    counts: np.ndarray  # (N_SOURCES, 2, N_BINS + 1, 2) int64 [source, first, bin or TOTAL, (decided, accepted)]
    est_sum: np.ndarray  # (N_SOURCES, 2, N_BINS + 1) float64 Σ conditional estimates, same slots
    trusted: np.ndarray  # (2,) float64 accepted, expected of the trusted sets
    params: np.ndarray  # (5,) float64 weight, start, start_weight, trust_start, trust_weight


class Pending(NamedTuple):
    """``PathCalibration.pending``: the recorded trees, in order, their nodes packed one after another."""

    meta: np.ndarray  # (T, 5) int64 per tree: stream index of depth 1, first node, nodes, first kept, kept count
    expected: np.ndarray  # (T,) float64 the trusted set's expected accepted draft tokens
    nodes: NodeArrays  # (P,) each; parents index the tree's own nodes
    kept: np.ndarray  # (K,) int64 the trusted set's nodes, root left out (kept[1:]), per tree
    fill: np.ndarray  # (3,) int64 trees, nodes, kept entries in use


class DepthArrays(NamedTuple):
    """One ``DepthCounter`` per source code (``AcceptanceStats.counters``); depths below DMAX (the Python owners check
    each tree they are given; the kernels do not)."""

    reached: np.ndarray  # (N_SOURCES, DMAX) int64
    accepted: np.ndarray  # (N_SOURCES, DMAX) int64
    score_sum: np.ndarray  # (N_SOURCES, DMAX) float64


_NO_COUNTERS = DepthArrays(*(np.zeros((N_SOURCES, DMAX), dt) for dt in (np.int64, np.int64, np.float64)))  # unread

# -- the path calibration (calibration.py) ----------------------------------------------------------------------------

@njit(cache=True)
def bin_of(est):
    """bisect_right(CALIBRATION_EDGES, est), the same halving."""
    lo, hi = 0, _EDGES.shape[0]
    while lo < hi:
        mid = (lo + hi) // 2
        if est < _EDGES[mid]:
            hi = mid
        else:
            lo = mid + 1
    return lo


@njit(cache=True)
def conditional(tree, i):
    """``PathCalibration.conditional`` of node i ≥ 1: min(1, est_i / est_parent), 0 when the parent's is not > 0."""
    up = tree.est[tree.parents[i]]
    if up > 0:
        x = tree.est[i] / up
        return x if x < 1.0 else 1.0
    return 0.0


@njit(cache=True)
def _add(cal, source, first, est, accepted):
    """``PathCalibration._add``: the node in its bin, then in its kind's total."""
    f = 1 if first else 0
    for slot in (bin_of(est), TOTAL):
        cal.counts[source, f, slot, 0] += 1
        cal.counts[source, f, slot, 1] += 1 if accepted else 0
        cal.est_sum[source, f, slot] += est


@njit(cache=True)
def ratio(cal, source, first):
    """``PathCalibration.ratio`` of the kind (source code, first)."""
    f = 1 if first else 0
    w = cal.params
    return (cal.counts[source, f, TOTAL, 1] + w[_START_WEIGHT] * w[_START]) / (cal.est_sum[source, f, TOTAL]
                                                                               + w[_START_WEIGHT])


@njit(cache=True)
def calibrate(cal, source, est, first):
    """``PathCalibration.calibrate``: the calibrated acceptance of a conditional estimate ``est``."""
    f = 1 if first else 0
    b = bin_of(est)
    r = ratio(cal, source, first)
    est_sum = cal.est_sum[source, f, b]
    if cal.counts[source, f, b, 0] == 0 or est_sum == 0.0:  # no slot, or ``not slot[2]``
        x = est * r
        return x if x < 1.0 else 1.0
    decided, accepted, weight = cal.counts[source, f, b, 0], cal.counts[source, f, b, 1], cal.params[_WEIGHT]
    prior = est_sum / decided
    x = est * (accepted + weight * prior * r) / (prior * (decided + weight))
    return x if x < 1.0 else 1.0


@njit(cache=True)
def calibrated_tree(cal, tree, out):
    """``PathCalibration.tree``: the calibrated path estimates into ``out`` (n,) float64 (root 1.0)."""
    out[0] = 1.0
    for i in range(1, tree.parents.shape[0]):
        out[i] = out[tree.parents[i]] * calibrate(cal, tree.source[i], conditional(tree, i), tree.depth[i] == 1)


@njit(cache=True)
def trust_of(cal):
    """``PathCalibration.trust``."""
    w = cal.params
    return (cal.trusted[0] + w[_TRUST_WEIGHT] * w[_TRUST_START]) / (cal.trusted[1] + w[_TRUST_WEIGHT])


@njit(cache=True)
def record(pend, tree, start, kept, expected):
    """``PathCalibration.record``: a tree of more than the root joins the pending ones, ``kept`` (k,) int64 the
    trusted set root included (only kept[1:] is stored).  Returns 1 recorded, 0 not (the root alone), -1 no room."""
    n = tree.parents.shape[0]
    if n <= 1:
        return 0
    kn = kept.shape[0] - 1 if kept.shape[0] > 1 else 0
    t, off, koff = pend.fill[_TREES], pend.fill[_NODES], pend.fill[_KEPT]
    if t >= pend.meta.shape[0] or off + n > pend.nodes.parents.shape[0] or koff + kn > pend.kept.shape[0]:
        return -1
    _copy_nodes(pend.nodes, off, tree, 0, n)
    pend.kept[koff: koff + kn] = kept[1: 1 + kn]
    pend.meta[t, _AT], pend.meta[t, _OFF], pend.meta[t, _N] = start, off, n
    pend.meta[t, _KOFF], pend.meta[t, _KN] = koff, kn
    pend.expected[t] = expected
    pend.fill[_TREES], pend.fill[_NODES], pend.fill[_KEPT] = t + 1, off + n, koff + kn
    return 1


@njit(cache=True)
def _copy_nodes(dst, at, src, start, n):
    """Nodes ``start`` .. ``start + n`` of ``src`` into ``dst`` from ``at``, forwards (at ≤ start may overlap)."""
    for j in range(n):
        a, b = at + j, start + j
        dst.tokens[a], dst.parents[a], dst.source[a] = src.tokens[b], src.parents[b], src.source[b]
        dst.scores[a], dst.est[a], dst.depth[a] = src.scores[b], src.est[b], src.depth[b]


@njit(cache=True)
def _view(nodes, off, n):
    """A pending tree's nodes (views)."""
    end = off + n
    return NodeArrays(nodes.tokens[off:end], nodes.parents[off:end], nodes.source[off:end], nodes.scores[off:end],
                      nodes.est[off:end], nodes.depth[off:end])


@njit(cache=True)
def hits(tree, stream, start, hit):
    """``_undecided`` and ``resolve``'s hits in one pass: whether ``stream`` (L,) int64 leaves a node undecided (a
    node whose path equals every token after index ``start`` still has children); when not, ``hit`` (n,) bool holds
    whether each node's path equals the stream's.  Undecided iff a node whose parent matched sits one below the
    stream's end (the walk of ``_undecided``, read node by node)."""
    n, room = tree.parents.shape[0], stream.shape[0] - start
    if room < 0:  # the walk never starts: the root's children wait
        return n > 1
    hit[0] = True
    for i in range(1, n):
        d, up = tree.depth[i], hit[tree.parents[i]]
        if up and d == room + 1:
            return True
        hit[i] = up and d <= room and tree.tokens[i] == stream[start + d - 1]
    return False


@njit(cache=True)
def _count(cal, tree, hit, counters, flags):
    """``resolve`` of one decided tree's reached nodes: each into its kind's bin (``calibrate``) and its source's
    depth counter (``use_counters``); ``flags`` = (use_counters, calibrate)."""
    use_counters, calibrating = flags
    for i in range(1, tree.parents.shape[0]):
        if hit[tree.parents[i]]:
            s, d = tree.source[i], tree.depth[i]
            if calibrating:
                _add(cal, s, d == 1, conditional(tree, i), hit[i])
            if use_counters:
                counters.reached[s, d] += 1
                counters.accepted[s, d] += 1 if hit[i] else 0
                counters.score_sum[s, d] += tree.scores[i]


@njit(cache=True)
def _move(pend, t, to, off, koff):
    """Pending tree ``t`` moved to slot ``to``, its nodes to ``off``, its kept entries to ``koff`` (each at or before
    where it is: copied forwards)."""
    src, n, ksrc, kn = pend.meta[t, _OFF], pend.meta[t, _N], pend.meta[t, _KOFF], pend.meta[t, _KN]
    _copy_nodes(pend.nodes, off, pend.nodes, src, n)
    for j in range(kn):
        pend.kept[koff + j] = pend.kept[ksrc + j]
    pend.meta[to, _AT], pend.meta[to, _OFF], pend.meta[to, _N] = pend.meta[t, _AT], off, n
    pend.meta[to, _KOFF], pend.meta[to, _KN] = koff, kn
    pend.expected[to] = pend.expected[t]


@njit(cache=True)
def resolve(cal, pend, stream, counters, flags):
    """``PathCalibration.resolve``: every pending tree the ``stream`` (prompt + output, (L,) int64) decides is counted
    (the trusted set's hits, then each reached node), in record order; the others stay, in order.  ``flags`` =
    (feed ``counters``, ``calibrate``)."""
    size = 0
    for t in range(pend.fill[_TREES]):
        size = max(size, pend.meta[t, _N])
    hit = np.empty(size, np.bool_)  # (n_max,)
    to, off, koff = 0, 0, 0
    for t in range(pend.fill[_TREES]):
        n, ksrc, kn = pend.meta[t, _N], pend.meta[t, _KOFF], pend.meta[t, _KN]
        tree = _view(pend.nodes, pend.meta[t, _OFF], n)
        if hits(tree, stream, pend.meta[t, _AT], hit):
            _move(pend, t, to, off, koff)
            to, off, koff = to + 1, off + n, koff + kn
            continue
        if kn > 0:
            got = 0
            for j in range(ksrc, ksrc + kn):
                got += 1 if hit[pend.kept[j]] else 0
            cal.trusted[0] += got
            cal.trusted[1] += pend.expected[t]
        _count(cal, tree, hit, counters, flags)
    pend.fill[_TREES], pend.fill[_NODES], pend.fill[_KEPT] = to, off, koff


@njit(cache=True)
def room_for(pend, nodes):
    """Whether one more tree of up to ``nodes`` nodes can be recorded without ``CalibrationArrays.reserve``."""
    t, used, kn = pend.fill[_TREES], pend.fill[_NODES], pend.fill[_KEPT]
    return (t + 1 <= pend.meta.shape[0] and used + nodes <= pend.nodes.parents.shape[0]
            and kn + nodes <= pend.kept.shape[0])


# -- the acceptance statistics (core/estimates.py) --------------------------------------------------------------------

@njit(cache=True)
def update_stats(tree, accepted, counters, ema, flags):
    """``AcceptanceStats.update``: each verified node whose parent is on the accepted path into its source's depth
    counter (unless counterfactual), then the spine's hit share into the EMA.  ``accepted`` (k,) int64 the accepted
    nodes (root excluded); ``ema`` (2,) float64 (alpha, p_s_ema), p_s_ema updated in place; ``flags`` =
    (counterfactual, ema).  The spine (``DraftTree.spine``): from the root, each node's first pld child."""
    counterfactual, use_ema = flags
    n = tree.parents.shape[0]
    on = np.zeros(n, np.bool_)  # (n,) on the accepted path
    on[0] = True
    for a in accepted:
        on[a] = True
    if not counterfactual:
        for i in range(1, n):
            s, d = tree.source[i], tree.depth[i]
            if on[tree.parents[i]] and (s == PLD or s == TR):
                counters.reached[s, d] += 1
                counters.accepted[s, d] += 1 if on[i] else 0
                counters.score_sum[s, d] += tree.scores[i]
    at, length, hit = 0, 0, 0
    for i in range(1, n):  # a child's index is above its parent's: one pass finds each first child
        if tree.parents[i] == at and tree.source[i] == PLD:
            at, length, hit = i, length + 1, hit + (1 if on[i] else 0)
    if length and use_ema:
        alpha = ema[0]
        ema[1] = (1 - alpha) * ema[1] + alpha * hit / length


# -- the Python side: the state's owners ------------------------------------------------------------------------------

def node_arrays(tree: DraftTree) -> NodeArrays:
    """A ``DraftTree``'s nodes as arrays (its tags pld, tr and the anchor's)."""
    return NodeArrays(np.array(tree.tokens, np.int64), np.array([-1, *tree.parents[1:]], np.int64),
                      np.array([SOURCE_CODES[s.value] for s in tree.sources], np.int64),
                      np.array(tree.scores, np.float64), np.array(tree.est_accept, np.float64),
                      np.array(tree.depths, np.int64))


def empty_nodes(n: int) -> NodeArrays:
    """n nodes of zeros (outputs, a pool)."""
    return NodeArrays(*(np.zeros(n, dt) for dt in (np.int64, np.int64, np.int64, np.float64, np.float64, np.int64)))


def cut(nodes: NodeArrays, n: int) -> NodeArrays:
    """The first n nodes (views)."""
    return NodeArrays(*(a[:n] for a in nodes))


def _grown(array: np.ndarray, size: int) -> np.ndarray:
    """``array`` with its first axis at least ``size`` (doubling)."""
    if array.shape[0] >= size:
        return array
    new = np.zeros((max(size, 2 * array.shape[0]), *array.shape[1:]), array.dtype)
    new[: array.shape[0]] = array
    return new


class StatsArrays:
    """``AcceptanceStats`` in arrays: the depth counters (``DepthArrays``) and the spine EMA."""

    def __init__(self, ema_alpha: float = 0.3, p_s_ema: float = 0.3, counterfactual: bool = False) -> None:
        self.counters = DepthArrays(np.zeros((N_SOURCES, DMAX), np.int64), np.zeros((N_SOURCES, DMAX), np.int64),
                                    np.zeros((N_SOURCES, DMAX), np.float64))
        self.ema = np.array([ema_alpha, p_s_ema], np.float64)  # (2,) alpha, p_s_ema
        self.counterfactual = counterfactual

    @property
    def p_s_ema(self) -> float:
        return float(self.ema[1])

    def update(self, tree: NodeArrays, accepted: Sequence[int], ema: bool = True) -> None:
        """``AcceptanceStats.update`` by ``update_stats``."""
        _check_depth(tree)
        update_stats(tree, np.array(accepted, np.int64), self.counters, self.ema, (self.counterfactual, ema))


def _check_depth(tree: NodeArrays) -> None:
    if tree.depth.shape[0] and int(tree.depth.max()) >= DMAX:
        raise ValueError(f"a tree {int(tree.depth.max())} deep: the depth counters end at {DMAX - 1}")


class CalibrationArrays:
    """``PathCalibration`` in arrays (``CalState``, ``Pending``), its methods by the kernels; same arguments."""

    def __init__(self, weight: float = 4.0, start: float = 0.5, start_weight: float = 2.0, trust_start: float = 0.7,
                 trust_weight: float = 4.0) -> None:
        self.cal = CalState(np.zeros((N_SOURCES, 2, N_BINS + 1, 2), np.int64),
                            np.zeros((N_SOURCES, 2, N_BINS + 1), np.float64), np.zeros(2, np.float64),
                            np.array([weight, start, start_weight, trust_start, trust_weight], np.float64))
        self.pend = Pending(np.zeros((4, 5), np.int64), np.zeros(4, np.float64), empty_nodes(64),
                            np.zeros(64, np.int64), np.zeros(3, np.int64))

    def reserve(self, nodes: int) -> None:
        """Room for one more recorded tree of up to ``nodes`` nodes (``record`` never reallocates)."""
        p, (t, used, kn) = self.pend, self.pend.fill
        if t + 1 > p.meta.shape[0] or used + nodes > p.nodes.parents.shape[0] or kn + nodes > p.kept.shape[0]:
            self.pend = Pending(_grown(p.meta, t + 1), _grown(p.expected, t + 1),
                                NodeArrays(*(_grown(a, used + nodes) for a in p.nodes)), _grown(p.kept, kn + nodes),
                                p.fill)

    def record(self, tree: NodeArrays, start: int, kept: Sequence[int] = (), expected: float = 0.0) -> None:
        _check_depth(tree)
        self.reserve(max(len(tree.parents), len(kept)))
        if record(self.pend, tree, start, np.array(kept, np.int64), expected) < 0:
            raise RuntimeError("no room for a recorded tree")  # the pool was grown just above: never

    def resolve(self, stream: Sequence[int], counters: StatsArrays | None = None, calibrate: bool = True) -> None:
        use = counters is not None
        resolve(self.cal, self.pend, np.asarray(stream, np.int64),
                counters.counters if use else _NO_COUNTERS, (use, calibrate))

    def trust(self) -> float:
        return trust_of(self.cal)

    def ratio(self, source: int, first: bool) -> float:
        return ratio(self.cal, source, first)

    def calibrate(self, source: int, est: float, first: bool = True) -> float:
        return calibrate(self.cal, source, est, first)

    def tree(self, tree: NodeArrays) -> np.ndarray:
        out = np.zeros(tree.parents.shape[0], np.float64)  # (n,)
        calibrated_tree(self.cal, tree, out)
        return out

    @property
    def pending(self) -> list[tuple[int, NodeArrays, tuple[int, ...], float]]:
        """(stream index of depth 1, the tree, the trusted set's nodes root left out, its expected), in order."""
        p = self.pend
        return [(int(at), cut(NodeArrays(*(a[off:] for a in p.nodes)), n), tuple(p.kept[ko: ko + kn].tolist()),
                 float(p.expected[t])) for t, (at, off, n, ko, kn) in enumerate(p.meta[: p.fill[_TREES]].tolist())]

    def counts(self) -> dict[tuple[tuple[int, bool], int | None], list]:
        """``PathCalibration.counts`` as its dictionary would hold it (source codes for tags)."""
        c, e = self.cal.counts, self.cal.est_sum
        return {((s, bool(f)), None if b == TOTAL else b): [int(c[s, f, b, 0]), int(c[s, f, b, 1]), float(e[s, f, b])]
                for s in range(N_SOURCES) for f in range(2) for b in range(N_BINS + 1) if c[s, f, b, 0]}

