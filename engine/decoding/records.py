"""The cycle's records: one generation's mutable state (``Generation``), each stage's timings (``Stopwatch``), what
each stage of the decoding loop hands the next (``decode.SpecDecoder``'s six stages), frozen, and the one operation on
a plan that knows nothing of the loop (``fit_to_room``).

Source: Goose paper, Algorithm 2 (the stages: draft, build, verify, accept, commit, learn).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import torch

from ..core.estimates import AcceptanceStats
from ..core.forward import TreeForward
from ..core.tree import DraftTree
from ..sources import Candidates, DraftSource
from .calibration import PathCalibration
from .gt import GtChoice
from .trace import Mode


@dataclass
class Generation:
    """Mutable state of one generation; never shared between generations or users."""

    forward: TreeForward  # the model on this generation's trees; owns its KV cache and committed length
    tokens: list[int]  # prompt + generated tokens: the context sources are asked about
    sources: tuple[DraftSource, ...]  # this generation's draft sources (engine/sources)
    stats: AcceptanceStats  # per-source, per-depth counters and the spine EMA (the sources read them)
    paths: PathCalibration = field(default_factory=PathCalibration)  # every built tree's outcome, for GT's size
    # choice (``gt.calibrated_choice``); it feeds ``stats``' counters where they count every built node
    generator: torch.Generator | None = None  # sampling mode: every random draw of this generation
    output: list[int] = field(default_factory=list)
    cycles: int = 0
    busy_s: float = 0.0  # engine time so far (s): prefill + every cycle, time spent by the consumer excluded
    curve_ms: float = 0.0  # verification time of every cycle so far by the cost curve (ms), for the GT rate λ
    streak: int = 0  # cycles in a row whose drafts the size choice priced down to the anchor (``Planner._resting``)
    planned_by: str = "python"  # whose draft and build stages plan it: "python" (``Planner``) or "compiled"
    # (``CompiledPlanner``, the compiled cycle); the same trees either way, only the host's time differs

    @property
    def past_len(self) -> int:
        """Committed cache positions (the prompt and every committed token before the anchor)."""
        return self.forward.length

    @property
    def anchor(self) -> int:
        return self.tokens[-1]

    @property
    def prev(self) -> int | None:
        return self.tokens[-2] if len(self.tokens) > 1 else None


class Stopwatch:
    """Stage timings of one cycle, in ms: ``lap(stage)`` charges the time since the previous lap to ``stage``.

    ``sync`` (profiling on a CUDA device): every lap first waits for that device (``torch.cuda.synchronize``),
    so a kernel is charged to the stage that enqueued it, at the price of one more host sync per stage.  None
    (the default): no waiting; a stage's kernels that are still running when it ends are charged to the next
    stage that waits for the device (the forward's read-back).
    """

    def __init__(self, sync: torch.device | None = None) -> None:
        self.sync = sync
        self.start = self.last = time.perf_counter()
        self.ms: dict[str, float] = {}

    def lap(self, stage: str) -> None:
        if self.sync is not None:
            torch.cuda.synchronize(self.sync)
        now = time.perf_counter()
        self.ms[stage] = self.ms.get(stage, 0.0) + (now - self.last) * 1000.0
        self.last = now

    def total(self) -> dict[str, float]:
        """The laps plus ``total`` (ms since the stopwatch started)."""
        return {**self.ms, "total": (time.perf_counter() - self.start) * 1000.0}


@dataclass(frozen=True)
class Drafts:
    """Output of stage 1: every active source's candidates for the anchor, and which source lays the spine."""

    proposals: tuple[tuple[DraftSource, Candidates], ...]
    spine: DraftSource | None = None  # the spine source offering the longest chain (ties: ``REGISTRY`` order)
    chain: Candidates = Candidates()  # the spine's chain: the main path of the spine source's candidates
    resting: tuple[DraftSource, ...] = ()  # sources sitting this cycle out (``GtConfig.rest_after``): unobserved

    @property
    def confidence(self) -> float:
        """Goose §4.3 confidence of the spine's match in [0, 1] (0 without a spine)."""
        return self.chain.confidence

    def any(self) -> bool:
        return any(len(c) for _, c in self.proposals)


@dataclass(frozen=True)
class Plan:
    """What one cycle verifies (output of stages 1-2)."""

    mode: Mode  # bypass | tree | ar (``trace.Mode``)
    tree: DraftTree  # the draft tree the walk verifies
    ghosts: tuple
    spine_ratio: float | None = None
    grafted: DraftTree | None = None  # ``tree`` plus the rows sources ride along under its root: what the forward sees
    budget: int | None = None  # node budget the tree was built with (None: bypass chain or AR step)
    chain_tokens: int = 0  # spine chain offered to the tree: the match, extended on a confident cycle
    gt: GtChoice | None = None  # the speedup-optimal size choice (gt_threshold "auto"), None otherwise
    built: DraftTree | None = None  # the tree before the size choice, when its outcome calibrates the estimates
    left_out: tuple = ()  # sources whose ride-along rows would pass a position limit: out of this forward, unobserved
    trusted: GtChoice | None = None  # the choice a full trust in the calibrated estimates makes (its outcome teaches)
    rows: int = 0  # rows the forward runs: ``grafted`` padded to a cheaper size (``CostCurve.verify_rows``)
    candidates: DraftTree | None = None  # the tree GT's size choice chose from (the trace's ``candidates``)


@dataclass(frozen=True)
class Walk:
    """Output of stage 4: the accepted path and the bonus token."""

    accepted: tuple[int, ...]  # accepted node indices, root excluded, in path order
    bonus: int  # the target's token after the last accepted node


@dataclass(frozen=True)
class Committed:
    """Output of stage 5: what the cycle appended to the output."""

    tokens: tuple[int, ...]  # accepted tokens + bonus, cut at EOS and at max new tokens
    finished: bool


@dataclass(frozen=True)
class Outcome:
    """Outputs of stages 4-5 together, for the cycle's record."""

    walk: Walk
    done: Committed


def fit_to_room(plan: Plan, room: int | None) -> Plan:
    """``plan`` without its nodes deeper than ``room`` (their positions would pass a limit of the model:
    ``compat.PositionLimits``), ghosts re-indexed; an AR step when only the anchor is left.  Fewer drafts, same
    greedy tokens: the output does not change."""
    depths = plan.tree.depths
    if room is None or max(depths) <= room:
        return plan
    keep = [i for i, d in enumerate(depths) if d <= room]
    index = {old: new for new, old in enumerate(keep)}
    ghosts = tuple(g.moved(index[g.parent]) for g in plan.ghosts if depths[g.parent] < room)
    tree = plan.tree.subtree(keep)
    return Plan("ar", tree, ghosts) if len(tree) == 1 else replace(plan, tree=tree, ghosts=ghosts)


def ghost_hits(plan: Plan, walk: Walk, greedy: list[int]) -> tuple[int, ...]:
    """Indices into ``plan.ghosts`` of the ghosts greedy verification would have accepted had the size choice kept
    them: under the anchor or an accepted node, carrying the model's greedy token there (``greedy[parent]``; siblings
    carry distinct tokens, so at most one a parent).  Only the bonus token's place can hold one: an accepted node's
    greedy token is its accepted child's.  Source: the greedy tree walk (SpecInfer §4.2) applied to the pruned nodes."""
    on_path = {0, *walk.accepted}
    return tuple(k for k, g in enumerate(plan.ghosts) if g.parent in on_path and g.token == greedy[g.parent])
