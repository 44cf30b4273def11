"""Per-cycle trace: the frozen record the decoding loop yields after every verification forward."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal, get_args

from ..core.tree import DraftTree, GhostNode, Source
from ..sources import info

#: Cycle modes (Goose Alg. 2 / B.2): prefill produces the first token; then bypass (linear spine
#: chain), tree (spine tree, or TR-only / spine-only tree), or ar (no draft source available).
#: Written into traces as these strings (docs/trace-schema.md).
Mode = Literal["prefill", "bypass", "tree", "ar"]
MODES: tuple[Mode, ...] = get_args(Mode)

#: Whose stages planned a generation (``CycleTrace.planner``): the Python planner or the compiled cycle.
PLANNERS = ("python", "compiled")

#: Timing keys recorded per cycle, in ms.
TIMING_KEYS = ("draft", "build", "forward", "walk", "cache", "harvest")


@dataclass(frozen=True)
class CycleTrace:
    """One decoding cycle.

    Attributes:
        index: 0 for prefill, then 1, 2, ...
        mode: one of ``MODES`` (``Mode``).
        tree: the verified tree (node 0 = anchor).
        ghosts: candidates the GT threshold removed (never verified).
        greedy: (n,) target greedy token at each node (the token it wants next).
        accepted: accepted node indices, root excluded, in path order.
        bonus: the target's token after the last accepted node.
        new_tokens: tokens committed this cycle (accepted tokens + bonus, cut at EOS / max tokens).
        spine_ratio: r used this cycle (None when no tree was built).
        p_s_ema: EMA of spine acceptance after this cycle.
        timings_ms: ms per stage (``TIMING_KEYS``) plus ``total``.
        elapsed_s: engine seconds so far (prefill and cycles; time the consumer spends between
            cycles, e.g. drawing, is excluded).
        total_tokens: tokens generated so far, this cycle included.
        finished: True on the last cycle (EOS, max new tokens, or stop request).
        ptd_rows: PTD drafting rows that rode along in this forward (not part of ``tree``).
        pad_rows: padding rows of this forward: the tree (and its ride-along rows) verified as a cheaper, larger size
            of the cost curve (``CostCurve.verify_rows``); they see only the committed prefix and the anchor, and their
            logits are never read.
        confidence: Goose §4.3 confidence of this cycle's spine match in [0, 1] (0 = no match; None in
            traces written before it was recorded).
        match_tokens: tokens of the spine source's chain before any extension (0 = no spine).
        chain_tokens: spine chain offered to the tree: ``match_tokens``, or more when a confident match
            was extended by re-matching (the spine itself may be shorter: B r bounds it).
        budget: node budget the tree was built with, root included (B, raised on confident cycles by
            the confidence schedule); None for bypass chains, AR steps and prefill.
        gt_nodes, gt_candidates: the speedup-optimal size (GT threshold "auto", engine/decoding/gt.py): nodes kept
            (n*, root included; 1 = pruned to an AR step) of the nodes built; None for other thresholds
            and for cycles with no draft.
        gt_expected: expected accepted draft tokens of the kept tree (sum of its path estimates).
        gt_cost_ms: T(n*) from the cost curve, the predicted verification time (ms).
        resting: names of the draft sources that sat this cycle out (``GtConfig.rest_after``: branch sources after a
            run of cycles the size choice priced down to the anchor); () when every source drafted.
        candidates: the tree the sources proposed and the builder offered GT's size choice, before it chose
            (``tree`` is its kept top: node 0 the same anchor); None where no size choice ran (a fixed threshold,
            no candidate at all, an older trace), its ``est_accept`` the path estimates GT read (``GtChoice.read``:
            calibrated and trust-scaled where path calibration is on).  What the pruned drafts would have won is
            judged against it, and the choice redone on other curves (``engine.product.runs.ledger``).
        ghost_hits: indices into ``ghosts`` of those greedy verification would have accepted had GT kept them: a
            ghost whose parent is the anchor or accepted and whose token is the model's greedy token there (a
            greedy run's verdict, known at the cycle; () under sampling, where it is not).
        planner: whose draft and build stages planned the generation: "compiled" (the compiled cycle,
            ``CompiledPlanner``: the default Goose configuration once this process has its kernels) or "python"
            (``Planner``: every other run, and the default one while the kernels compile).  The same trees either
            way; only the host's time a cycle differs.  "python" in traces written before it was recorded.
    """

    index: int
    mode: Mode
    tree: DraftTree
    ghosts: tuple[GhostNode, ...]
    greedy: tuple[int, ...]
    accepted: tuple[int, ...]
    bonus: int
    new_tokens: tuple[int, ...]
    spine_ratio: float | None
    p_s_ema: float
    timings_ms: Mapping[str, float]
    elapsed_s: float
    total_tokens: int
    finished: bool
    ptd_rows: int = 0
    pad_rows: int = 0
    confidence: float | None = None
    match_tokens: int = 0
    chain_tokens: int = 0
    budget: int | None = None
    gt_nodes: int | None = None
    gt_candidates: int | None = None
    gt_expected: float | None = None
    gt_cost_ms: float | None = None
    resting: tuple[str, ...] = ()
    candidates: DraftTree | None = None
    ghost_hits: tuple[int, ...] = ()
    planner: str = "python"

    def __post_init__(self) -> None:
        object.__setattr__(self, "timings_ms", MappingProxyType(dict(self.timings_ms)))

    @property
    def forward_rows(self) -> int:
        """Rows the verification forward ran: the tree, its ride-along rows and its padding."""
        return len(self.tree) + self.ptd_rows + self.pad_rows

    def __getstate__(self) -> dict:
        """Pickled with ``timings_ms`` as a dict (a read-only mapping proxy does not pickle): a page's frames cross
        into another process on a ZeroGPU Space (app.gpu_handler)."""
        return {**self.__dict__, "timings_ms": dict(self.timings_ms)}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.__post_init__()

    @property
    def extended(self) -> bool:
        """True when a confident match was extended past one lookup this cycle."""
        return self.chain_tokens > self.match_tokens

    @property
    def accepted_sources(self) -> tuple[Source, ...]:
        return tuple(self.tree.sources[i] for i in self.accepted)

    @property
    def path_category(self) -> str:
        """Goose §4.2 outcome: 'pure PLD' (every accepted token on the spine; 'pure Suffix' for a suffix spine),
        'spine continuation' (the spine, then a branch), 'pure TR' (one source off the spine: 'pure PTD', ...),
        'mixed', or 'none' (bonus only)."""
        accepted, spine = self.accepted, self.tree.spine
        if not accepted:
            return "none"
        srcs = self.accepted_sources
        if accepted[0] in spine:
            return f"pure {info(srcs[0]).short}" if set(accepted) <= set(spine) else "spine continuation"
        return f"pure {info(srcs[0]).short}" if len(set(srcs)) == 1 else "mixed"
