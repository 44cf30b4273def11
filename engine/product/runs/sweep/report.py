"""A sweep's sentence, its table's cells and rows, and its JSON form."""
from __future__ import annotations

from engine.product.runs.lossless import Divergence
from engine.product.runs.run import NO_GAIN_TAU, SPEEDUP_PHASE
from engine.product.runs.sweep.records import Sweep, SweepRun


def summary(sweep: Sweep, divergences: dict[int, Divergence] | None = None) -> str:
    """One sentence on the sweep's texts: "All 6 runs produced AR's text token for token.", "B = 128 parted
    from AR at token 37 (a precision tie)." (token 0 = the first new token; the verdict from ``divergences``,
    ``Attributions``, where known), a stop, or, in sampling mode, that texts differ by design and nothing was
    compared."""
    if sweep.sampling:
        return (f"Sampling (temperature {sweep.base.sampler.temperature:g}): each run draws its own text by design, "
                "so no text is compared with AR's.")
    if sweep.ar is None:
        return "Stopped while AR was timed: no run to compare." if sweep.stopped else "AR is being timed."
    runs = sweep.runs
    head = ""
    if sweep.stopped and runs:
        head = f"Stopped during run {len(runs)} of {sweep.total} ({runs[-1].label}): "
    elif sweep.stopped:
        head = f"Stopped before run 1 of {sweep.total}: "
    parted = [r for r in runs if r.first_difference is not None]
    if parted:
        first, *rest = parted
        verdict = {r.index: _verdict(divergences, r) for r in parted}
        return _sentence(head, _join([f"{first.label} parted from AR at token {first.first_difference}"
                                      f"{verdict[first.index]}",
                                      *(f"{r.label} at token {r.first_difference}{verdict[r.index]}"
                                        for r in rest)]))
    if not runs:
        return _sentence(head, "no run yet")
    so_far = " so far" if sweep.stopped else ""
    if len(runs) == 1:
        return _sentence(head, f"the run{so_far} produced AR's text token for token")
    return _sentence(head, f"{'the' if sweep.stopped else 'all'} {len(runs)} runs{so_far} produced AR's text "
                           "token for token")


def _verdict(divergences: dict[int, Divergence] | None, run: SweepRun) -> str:
    """" (a precision tie)", " (NOT a tie: a bug)", " (one output stops earlier)", or "" where not attributed."""
    found = (divergences or {}).get(run.index)
    if found is None:
        return ""
    return {"precision tie": " (a precision tie)", "bug": " (NOT a tie: a bug)"}.get(found.kind,
                                                                                  " (one output stops earlier)")


def _join(parts: list[str]) -> str:
    """'a', 'a and b', 'a, b and c'."""
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def _sentence(head: str, body: str) -> str:
    text = head + body if head else body[0].upper() + body[1:]
    return text + "."


def same_text_cell(run: SweepRun, sampling: bool = False, divergences: dict[int, Divergence] | None = None) -> str:
    """The table's "same text as AR" cell: "yes", "no: token 37", "no: token 37 (a precision tie)" (attributed in
    ``divergences``), "not compared" (sampling); "(stopped)" after a partial run's."""
    if sampling:
        cell = "not compared (sampling)"
    else:
        cell = ("yes" if run.first_difference is None
                else f"no: token {run.first_difference}{_verdict(divergences, run)}")
    return cell if run.finished else f"{cell} (stopped)"


def speedup_cell(run: SweepRun) -> str:
    """A run's speedup over AR as the table and the figure's hover say it: "1.52×", "no speedup" where its τ could
    give none (``run.NO_GAIN_TAU``: the clocks' reading is noise there), "–" when not measured."""
    if run.speedup is not None:
        return f"{run.speedup:.2f}×"
    return "no speedup" if run.cycles > 1 and run.tau < NO_GAIN_TAU else "–"


def markdown_table(sweep: Sweep, divergences: dict[int, Divergence] | None = None) -> str:
    """The sweep as a markdown table: AR's row first, then one row per run (value, τ, decode-phase tok/s, speedup,
    nodes, same text as AR: attributed where ``divergences`` has the run)."""
    rows = [f"| {sweep.spec.info.what} | τ | tok/s ({SPEEDUP_PHASE}) | speedup over AR ({SPEEDUP_PHASE}) | mean nodes "
            "| same text as AR |",
            "|---|---|---|---|---|---|"]
    if sweep.ar is not None:
        rows.append(f"| AR (reference) | 1.00 | {sweep.ar.tok_per_s:.1f} | 1.00× | 1.0 | – |")
    for r in sweep.runs:
        rows.append(f"| {r.label} | {r.tau:.2f} | {r.tok_per_s:.1f} | {speedup_cell(r)} | {r.mean_nodes:.1f} | "
                    f"{same_text_cell(r, sweep.sampling, divergences)} |")
    return "\n".join(rows) + "\n"


def to_dict(sweep: Sweep, divergences: dict[int, Divergence] | None = None) -> dict:
    """The sweep as JSON-ready data: parameter, values, base config, cost curve, AR and one row per run (no
    traces: a run's cycles are the trace files' business)."""
    divergences = divergences or {}
    ar = sweep.ar
    return {
        "parameter": sweep.spec.parameter, "values": [sweep.spec.text(v) for v in sweep.spec.values],
        "base_config": sweep.base.to_dict(),
        "cost_curve": sweep.cost_curve.to_dict() if sweep.cost_curve is not None else None,
        "ar": None if ar is None else {"tokens": len(sweep.ar_tokens), "decode_tokens": ar.tokens,
                                       "decode_seconds": ar.seconds, "tok_per_s": ar.tok_per_s},
        "runs": [{"index": r.index, "value": r.text, "label": r.label, "tau": r.tau, "tok_per_s": r.tok_per_s,
                  "speedup": r.speedup, "mean_nodes": r.mean_nodes, "tokens": len(r.tokens), "cycles": r.cycles,
                  "accepted_drafts": r.accepted_drafts, "first_difference": r.first_difference,
                  "same_as_ar": None if sweep.sampling else r.first_difference is None, "finished": r.finished,
                  "gt_threshold": r.config.gt.threshold if r.config is not None else None,
                  "divergence": divergences[r.index].to_dict() if r.index in divergences else None}
                 for r in sweep.runs],
        "stopped": sweep.stopped, "seconds": sweep.seconds, "summary": summary(sweep, divergences),
    }
