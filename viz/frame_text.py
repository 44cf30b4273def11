"""The words a frame of the page shows about a run and the cycle on screen: the stats line above the tree, the line
under it, the output's labels, the methods' names.

A run here is ``engine.product.runs.run.Run`` (or anything with its ``config``, ``prompt_format``, ``traces``,
``segments`` and ``token_cycles``); a summary is ``engine.product.runs.metrics.summarize``'s.
"""
from __future__ import annotations

from engine.product.runs.run import decode_phase
from engine.sources import REGISTRY
from viz.explain import TOKEN_COLORS, ghost_words
from viz.tree_figure import GhostMarks
from viz.tree_title import count_words

METHOD_LABELS = {"goose": "Goose (spine tree of the chosen sources)", **{i.name: i.method_label for i in REGISTRY},
                 "iso3": "Iso(3): balanced 3-ary tree", "iso5": "Iso(5): balanced 5-ary tree", "ar": "AR (no drafting)"}
FORMAT_NAMES = {"chat": "prompt through the chat template", "raw": "raw completion prompt"}
SHOWN = "▶ shown cycle"  # output label of the tokens the cycle on screen committed
COLOR_MAP = {**TOKEN_COLORS, SHOWN: "#f2e755"}  # a highlighter's yellow, apart from every source's tint
#: the output's label: its chips are the model's tokens, not words (issue 56: "Jan et ' s" read as a bug)
OUTPUT_LABEL = ("Output so far: each chip is one of the model's tokens (a word can be several tokens), coloured by "
                "the source that drafted it; click a token to see its cycle")


def run_colors(run) -> dict[str, str]:
    """The output's colours for ``run``: the sources that drafted in it (accepted or not, as the stats line names
    them), the bonus, AR steps and the shown cycle; the legend lists these, not every source of ``REGISTRY``."""
    drawn = {tag for t in run.traces for tag in t.tree.sources}
    used = {label for _, label in run.segments}
    return {k: v for k, v in COLOR_MAP.items() if k in used or k in ("bonus", SHOWN)
            or any(i.short == k and i.source in drawn for i in REGISTRY)}


def gt_words(gt_threshold, trace, marks: GhostMarks | None = None) -> str:
    """The GT rule, e.g. "GT: auto" (its counts are in the cycle's sentence, ``viz.explain.gt_note``) or
    "c = 0.100, 3 pruned (the 3 ghosts)" (pruned: the cycle's ghosts, where the drawing has them: ``marks``,
    ``viz.explain.ghost_words``; c = 0: pruning off); without a cycle, the rule alone."""
    pruned = (f", {len(trace.ghosts)} pruned{ghost_words(len(trace.ghosts), marks)}"
              if trace is not None and trace.ghosts else "")
    if gt_threshold == "auto":
        return "GT: auto" if trace is not None and trace.gt_nodes is not None else "GT: auto" + pruned
    try:
        return f"c = {float(gt_threshold):.3f}{pruned}"
    except (TypeError, ValueError):
        return f"GT: {gt_threshold}{pruned}"


#: ``RunSummary.planner`` in the stats line's words
PLANNER_WORDS = {"compiled": "compiled planner", "python": "Python planner"}


def stats_line(summary, run, cost: str = "") -> str:
    """The line above the tree: the run's totals so far (tokens/s end to end, prefill included, and over the decode
    phase, the figure a sweep's table and the speedup read; the time to the first new token, the prefill's; tokens
    by source, from ``REGISTRY``; the medians of a cycle's host ms outside its forward, with whose stages planned it
    (``PLANNER_WORDS``), and of the forward's: issue 71), labelled as such, then ``cost``
    (``viz.explain.cost_sentence``: τ tied to the cost curve) on a line of its own.  The cycle on screen is described
    under the tree (``cycle_line``)."""
    src = summary.accepted_by_source
    drawn = {tag for t in run.traces for tag in t.tree.sources}  # sources that drafted in this run, accepted or not
    by_source = " · ".join(f"{info.short} {src.get(info.name, 0)}" for info in REGISTRY
                           if src.get(info.name, 0) or info.source in drawn) or "no drafts"
    sent = f" · {FORMAT_NAMES[run.prompt_format]}" if run.prompt_format in FORMAT_NAMES else ""
    tokens, seconds = decode_phase(run.traces)
    decode = f" ({tokens / seconds:.1f} in the decode phase)" if tokens and seconds > 0 else ""
    host = (f"a cycle: host {summary.median_overhead_ms:.2f} ({PLANNER_WORDS[summary.planner]}) + forward "
            f"{summary.median_forward_ms:.1f} ms · " if summary.cycles else "")  # medians
    return (f"Run totals: **τ {summary.tau:.2f}** · **{summary.tok_per_s:.1f} tok/s** end to end{decode} · "
            f"first token {1000 * summary.prefill_s:.0f} ms · {host}"
            f"{count_words(summary.new_tokens, 'token')} in {summary.forwards} forwards (prefill + "
            f"{count_words(summary.cycles, 'cycle')}) — by source: {by_source} · bonus {src.get('bonus', 0)} · "
            f"{gt_words(run.config.get('gt_threshold'), None)}{sent}" + (f"  \n{cost}" if cost else ""))


def cycle_line(trace, run, marks: GhostMarks | None = None) -> str:
    """The cycle on screen in a few words, e.g. "**Cycle 20 of 60** · r = 0.91 · GT: auto" (cycle 0 is the
    prefill; its mode, nodes and tokens are in the tree's title; numbers rounded for people).  Where Goose §4.3's
    confidence schedule took the cycle's budget above the run's B, or its r above a fixed r, the line says so
    with both numbers (``_raised``); ``marks``: where the drawing has the cycle's ghosts (``gt_words``)."""
    rows = f" · +{trace.ptd_rows} PTD rows" if trace.ptd_rows else ""
    if getattr(trace, "pad_rows", 0):  # a slow size of the cost curve, verified as a cheaper larger one
        n = trace.forward_rows - trace.pad_rows
        rows += f" · {n} rows verified as {trace.forward_rows}: T({trace.forward_rows}) < T({n}) here"
    gt = f" · {gt_words(run.config.get('gt_threshold'), trace, marks)}" if trace.mode != "prefill" else ""
    return f"**Cycle {trace.index} of {len(run.traces) - 1}**{rows}{_raised(trace, run.config)}{gt}"


def _raised(trace, config: dict) -> str:
    """" · r = 0.91" and, where the match's confidence raised them (Goose §4.3: budget B + int(m × extension),
    r + m (1 − r)), " · budget 56 (B = 16 raised by …)" and "(the fixed r = 0.90 raised …)"."""
    if trace.spine_ratio is None:
        return ""
    why = f"by the spine match's confidence {trace.confidence or 0:.2f}, Goose §4.3"
    fixed, words = config.get("spine_ratio"), f" · r = {trace.spine_ratio:.2f}"
    if fixed is not None and round(trace.spine_ratio, 6) != round(float(fixed), 6):
        words += f" (the fixed r = {float(fixed):.2f} raised {why})"
    budget = config.get("budget")
    if trace.budget is not None and budget is not None and trace.budget > int(budget):
        words += f" · budget {trace.budget} (B = {int(budget)} raised {why})"
    return words


def marked_output(run, shown: int | None) -> list[tuple[str, str]]:
    """The run's output segments, the tokens committed by cycle ``shown`` labelled ``SHOWN``."""
    return [(text, SHOWN if cycle == shown else label) for (text, label), cycle in zip(run.segments, run.token_cycles)]
