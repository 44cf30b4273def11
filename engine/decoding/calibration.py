"""Path calibration for GT's size choice: every built tree's nodes priced, then judged by the output to come.

Source: the GT principle paper, §3 (each node priced at its estimated acceptance α̂, the product of per-source,
per-depth estimates along its path; ``DraftTree.est_accept``): ``PathCalibration`` maps those estimates through
the session's measured outcomes, and ``gt.calibrated_choice`` sizes a tree on them (``GtConfig.path_calibration``).
One per generation (``records.Generation.paths``): the decoding loop records each built tree (``record``) and counts
it once the output decides it (``resolve``), feeding the per-depth counters of ``core.estimates.AcceptanceStats``
too where those count every built node (``AcceptanceStats.counterfactual``).
"""
from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..core.estimates import AcceptanceStats
from ..core.tree import DraftTree, Source

#: Upper edges of the estimate bins ``PathCalibration`` counts in (the last bin ends at 1).  Finer at the low end,
#: where TR's and PTD's low-probability candidates crowd.
CALIBRATION_EDGES = (0.01, 0.03, 0.06, 0.1, 0.2, 0.3, 0.45, 0.6, 0.75, 0.9)


@dataclass
class PathCalibration:
    """Online calibration of path estimates from every built node's outcome, the pruned ones included.

    The GT principle (§3) prices each node at its estimated acceptance α̂; the product of per-depth rates
    along a path is only a model of it (a 20-token PLD spine accepted in full still multiplies to 0.9^20;
    raw TR probabilities miss how often the target repeats itself, or repeat one loop "0 → 0 → 0" at 0.9999).
    Counting only the nodes verified would never correct an estimate that gets its nodes pruned, so each
    cycle's whole built tree is kept (``record``) until the output decides every node (``resolve``): a node's
    path is the output's continuation after the anchor, or not.

    What is calibrated is each node's estimate *given its parent accepted* (``conditional``: α̂_i / α̂_parent),
    counted over the nodes whose parent's path matched, per kind (source, first draft token or deeper: a
    match's first token and its continuation fail for different reasons) and bin; ``tree`` prices a path at the
    product of its calibrated conditionals, so a chain's deep nodes never read above its first.  ``calibrate``
    maps an estimate to its bin's posterior rate under a prior of weight ``weight`` centred on the bin's mean
    estimate times the kind's own ratio (``ratio``: accepted nodes over Σ estimates over all its bins, under a
    prior of weight ``start_weight`` at ``start``), so an empty bin borrows what its kind has shown, and a run's
    first trees, before any outcome, are priced at ``start`` · α̂.

    ``trust`` answers what calibration cannot: the nodes GT keeps are those whose estimates read highest, so
    they overstate what the kept set earns.  ``record`` also takes the set a full trust in the calibrated
    estimates keeps; ``trust`` is what those sets earned over what they were priced at, kept or pruned.

    Starting doubtful costs little: the built trees are counted whole, so estimates that hold are trusted
    again within a few cycles, while starting trusting spends whole trees on a steep curve (docs/results.md,
    "GT on a steep curve").  (In sampling mode "the output's continuation" is one draw, so the rates are those
    of the sampled text: still an estimate, never a test of acceptance.)
    """

    weight: float = 4.0  # prior weight in nodes: a bin moves half-way to its measured rate after 4 outcomes
    start: float = 0.5  # a kind's ratio of accepted nodes to Σ estimates before any outcome (doubtful, see above)
    start_weight: float = 2.0  # its prior weight in estimated tokens: 2 estimated tokens decided move it half-way
    trust_start: float = 0.7  # ``trust`` before any outcome: the kept set earns 0.7 of its price (doubtful)
    trust_weight: float = 4.0  # its prior weight in expected tokens
    counts: dict[tuple[tuple[Source, bool], int | None], list[float]] = field(default_factory=dict)
    # (kind, bin or None for the kind's total) -> [decided, accepted, Σ conditional estimates]
    trusted: list[float] = field(default_factory=lambda: [0.0, 0.0])  # [accepted, expected] of the trusted sets
    pending: list[tuple[int, DraftTree, tuple[int, ...], float]] = field(default_factory=list)
    # (stream index of depth 1, built tree, the trusted set's nodes, its expected accepted draft tokens)

    def record(self, tree: DraftTree, start: int, kept: tuple[int, ...] = (), expected: float = 0.0) -> None:
        """Keep a built tree (before any pruning) whose depth-1 nodes guess the stream token at index ``start``;
        ``kept``: the nodes (root included) a full trust keeps, priced at ``expected`` accepted draft tokens."""
        if len(tree) > 1:
            self.pending.append((start, tree, kept, expected))

    def trust(self) -> float:
        """Accepted over expected draft tokens of the sets a full trust kept (or would have), under a prior of
        weight ``trust_weight`` at ``trust_start``: the factor the size choice scales its estimates by."""
        accepted, expected = self.trusted
        return (accepted + self.trust_weight * self.trust_start) / (expected + self.trust_weight)

    def resolve(self, stream: Sequence[int], counters: AcceptanceStats | None = None, calibrate: bool = True) -> None:
        """Count every kept tree the stream (prompt + output so far) now decides in full; keep the others.
        Each node whose parent's path matched the stream ("reached") counts once, at its conditional estimate.
        ``counters``: also feed each such node to its source's depth counter.  ``calibrate`` False: only
        ``counters`` are fed (a run whose size choice never reads the calibration skips counting for it)."""
        undecided = []
        for start, tree, kept, expected in self.pending:
            if _undecided(tree, stream, start):
                undecided.append((start, tree, kept, expected))
                continue
            hit = [True] * len(tree)  # the node's path equals the stream (a node whose parent's does lies within it)
            for i in range(1, len(tree)):
                hit[i] = hit[tree.parents[i]] and tree.tokens[i] == stream[start + tree.depths[i] - 1]
            conditional = self.conditional(tree) if calibrate else None
            if len(kept) > 1:
                self.trusted[0] += sum(hit[i] for i in kept[1:])
                self.trusted[1] += expected
            for i in range(1, len(tree)):
                if hit[tree.parents[i]]:
                    if calibrate:
                        self._add((tree.sources[i], tree.depths[i] == 1), conditional[i], hit[i])
                    if counters is not None:
                        counters.counter(tree.sources[i]).add(tree.depths[i], hit[i], tree.scores[i])
        self.pending = undecided

    @staticmethod
    def conditional(tree: DraftTree) -> list[float]:
        """Each node's raw estimate given its parent accepted: α̂_i / α̂_parent(i), in [0, 1] (root 1.0)."""
        est = tree.est_accept
        return [1.0, *(min(1.0, est[i] / est[p]) if est[p] > 0 else 0.0
                       for i, p in zip(range(1, len(tree)), tree.parents[1:]))]

    def _add(self, kind: tuple[Source, bool], est: float, accepted: bool) -> None:
        for slot in (self.counts.setdefault((kind, bisect_right(CALIBRATION_EDGES, est)), [0, 0, 0.0]),
                     self.counts.setdefault((kind, None), [0, 0, 0.0])):  # its bin, and the kind's total
            slot[0] += 1
            slot[1] += accepted
            slot[2] += est

    def ratio(self, kind: tuple[Source, bool]) -> float:
        """A kind's (source, first draft token or not) accepted nodes over its summed conditional estimates, all
        bins pooled (kept beside its bins under bin ``None``), under a prior of weight ``start_weight`` at
        ``start``: how far its estimates over- (< 1) or under-state (> 1) acceptance."""
        _, accepted, est_sum = self.counts.get((kind, None), (0, 0, 0.0))
        return (accepted + self.start_weight * self.start) / (est_sum + self.start_weight)

    def calibrate(self, source: Source, est: float, first: bool = True) -> float:
        """The calibrated acceptance, given its parent accepted, of a ``source`` node whose raw conditional
        estimate is ``est`` (in [0, 1]); ``first``: the node is a first draft token (depth 1)."""
        kind = (source, first)
        slot = self.counts.get((kind, bisect_right(CALIBRATION_EDGES, est)))
        ratio = self.ratio(kind)
        if slot is None or not slot[2]:
            return min(1.0, est * ratio)
        decided, accepted, est_sum = slot
        prior = est_sum / decided  # the bin's mean raw estimate
        return min(1.0, est * (accepted + self.weight * prior * ratio) / (prior * (decided + self.weight)))

    def tree(self, tree: DraftTree) -> tuple[float, ...]:
        """Calibrated path estimates of every node of ``tree`` (root 1.0): the product of the calibrated
        conditionals along its path, so a chain's deep nodes are never priced above its first."""
        conditional = self.conditional(tree)
        out = [1.0] * len(tree)
        for i in range(1, len(tree)):  # a parent precedes its children
            out[i] = out[tree.parents[i]] * self.calibrate(tree.sources[i], conditional[i], tree.depths[i] == 1)
        return tuple(out)


def _undecided(tree: DraftTree, stream: Sequence[int], start: int) -> bool:
    """Whether the stream does not yet decide every node of ``tree``, whose depth-1 nodes guess ``stream[start]``: a
    node whose path equals all the tokens known after the anchor still has children.  Walks down the stream's path
    only (at most the tree's depth), where counting would read every node each cycle the tree waits."""
    frontier = [0]  # the nodes at depth d whose path equals the stream's first d tokens after the anchor
    for at in range(start, len(stream)):
        frontier = [c for node in frontier for c in tree.children[node] if tree.tokens[c] == stream[at]]
        if not frontier:
            return False
    return any(tree.children[node] for node in frontier)
