"""Run summaries derived from cycle traces: tau, tokens/s, tokens by source, p_s / p_t, overhead.

Definitions (Goose §5.1): tau = generated tokens / verification forwards, bonus tokens included;
the prefill forward counts (it yields the first token), so plain AR has tau = 1.0 exactly.
"""
from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from engine.decoding.trace import TIMING_KEYS, CycleTrace
from engine.sources import REGISTRY, Role


def committed_sources(trace: CycleTrace) -> list[str]:
    """Source name of each committed token of a cycle ('pld', 'tr', ... of ``REGISTRY``) or 'bonus'."""
    labels = [s.value for s in trace.accepted_sources] + ["bonus"]
    return labels[: len(trace.new_tokens)]


@dataclass(frozen=True)
class RunSummary:
    """One run's figures, from its cycle traces (``summarize``): tokens, τ, time (s; ms per stage), what each source
    drafted and had accepted, and the median cycle's host and forward time (ms).  What the bench, the page's stats and
    the sweep report read of a run; ``to_dict`` is its JSON form."""

    new_tokens: int  # tokens generated
    cycles: int  # decoding cycles after prefill
    forwards: int  # verification forwards, prefill included
    tau: float  # tokens per forward, bonus included
    seconds: float  # wall time, prefill included (s)
    tok_per_s: float  # new_tokens / seconds
    accepted_by_source: dict  # {source name: n, ..., "bonus": n} over ``REGISTRY``; sums to new_tokens
    p_s: float  # accepted / proposed spine draft tokens (``DraftTree.spine``)
    p_t: float  # accepted / proposed branch draft tokens (sources of ``Role.BRANCH``: TR)
    drafted: dict  # {source name: [accepted, proposed], ...} draft-token counts
    spine_drafted: list  # [accepted, proposed] spine draft tokens (p_s's counts)
    branch_drafted: list  # [accepted, proposed] branch draft tokens (p_t's counts)
    modes: dict  # cycles per mode
    paths: dict  # cycles per path category (pure PLD / spine continuation / pure TR / none)
    tokens_by_path: dict  # committed draft tokens per path category (bonus tokens excluded)
    stage_ms: dict  # total engine ms per stage (TIMING_KEYS) over the run, prefill included
    median_overhead_ms: float  # median per-cycle time outside the forward (ms)
    median_forward_ms: float  # median per-cycle verification forward (ms)
    mean_tree_nodes: float  # mean verified nodes per cycle, root included
    mean_forward_rows: float  # mean rows per cycle's forward: the tree plus ride-along rows (PTD)
    prefill_s: float  # the prefill forward and its harvest (s): the same for every method on a prompt
    planner: str  # whose stages planned the run: "compiled" or "python" (``CycleTrace.planner``, the prefill's)

    def to_dict(self) -> dict:
        return asdict(self)


def summarize(traces: Sequence[CycleTrace]) -> RunSummary:
    """Summarise a complete run (prefill trace first). Raises ValueError on an empty sequence."""
    if not traces:
        raise ValueError("no cycles to summarise")
    cycles = [t for t in traces if t.mode != "prefill"]
    by_source = {**{i.name: 0 for i in REGISTRY}, "bonus": 0}
    drafted = {i.name: [0, 0] for i in REGISTRY}  # [accepted, proposed]
    spine, branch = [0, 0], [0, 0]  # [accepted, proposed] spine / branch tokens
    branch_sources = {i.source for i in REGISTRY if i.role is Role.BRANCH}
    modes: dict[str, int] = {}
    paths: dict[str, int] = {}
    tokens_by_path: dict[str, int] = {}
    stage_ms = {k: 0.0 for k in TIMING_KEYS}
    for t in traces:
        labels = committed_sources(t)
        for label in labels:
            by_source[label] += 1
        for k in TIMING_KEYS:
            stage_ms[k] += t.timings_ms.get(k, 0.0)
        if t.mode == "prefill":
            continue
        modes[t.mode] = modes.get(t.mode, 0) + 1
        paths[t.path_category] = paths.get(t.path_category, 0) + 1
        drafted_here = sum(label != "bonus" for label in labels)
        tokens_by_path[t.path_category] = tokens_by_path.get(t.path_category, 0) + drafted_here
        on_path, on_spine = set(t.accepted), set(t.tree.spine)
        for i, src in enumerate(t.tree.sources):
            if src.value in drafted:
                drafted[src.value][0] += i in on_path
                drafted[src.value][1] += 1
            for counts, member in ((spine, i in on_spine), (branch, src in branch_sources)):
                if member:
                    counts[0] += i in on_path
                    counts[1] += 1
    new_tokens = sum(len(t.new_tokens) for t in traces)
    seconds = traces[-1].elapsed_s
    overhead = [t.timings_ms["total"] - t.timings_ms["forward"] for t in cycles]
    return RunSummary(
        new_tokens=new_tokens, cycles=len(cycles), forwards=len(traces), tau=new_tokens / len(traces),
        seconds=seconds, tok_per_s=new_tokens / seconds if seconds > 0 else 0.0, accepted_by_source=by_source,
        p_s=_rate(spine), p_t=_rate(branch), drafted=drafted, spine_drafted=spine, branch_drafted=branch,
        modes=modes, paths=paths, tokens_by_path=tokens_by_path, stage_ms=stage_ms,
        median_overhead_ms=statistics.median(overhead) if overhead else 0.0,
        median_forward_ms=statistics.median(t.timings_ms["forward"] for t in cycles) if cycles else 0.0,
        mean_tree_nodes=statistics.fmean(len(t.tree) for t in cycles) if cycles else 1.0,
        mean_forward_rows=statistics.fmean(len(t.tree) + t.ptd_rows for t in cycles) if cycles else 1.0,
        prefill_s=traces[0].timings_ms["total"] / 1000.0, planner=traces[0].planner,
    )


def _rate(counts: list[int]) -> float:
    accepted, proposed = counts
    return accepted / proposed if proposed else 0.0
