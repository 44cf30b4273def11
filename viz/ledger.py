"""The Theory panel's account of a finished run's ledger: how often the sources proposed drafts, how often GT kept a
tree and why not otherwise, what the pruned drafts would have won, and the same drafts priced on other devices
(``engine.product.runs.ledger``): the GT principle made visible where the device's curve keeps every tree small."""
from __future__ import annotations

from collections.abc import Sequence

from engine.decoding.cost import CostCurve, CostCurveError
from engine.decoding.trace import TIMING_KEYS, CycleTrace
from engine.product.runs.ledger import DEVICE_CURVES, cycle_ledger, device_curve, outputs_after, price_on

HOST_STAGES = tuple(k for k in TIMING_KEYS if k in ("draft", "build", "harvest"))  # the cycle's work besides the
# forward, the walk and the cache: what a source that drafts costs


def ledger_panel(traces: Sequence[CycleTrace], curve: CostCurve | None, sampling: bool, own: str = "") -> str:
    """Markdown for a run's cycles so far (``traces``, prefill first) read against ``curve`` (the one the run's GT
    read; None: no cost is stated): while it streams, the counts so far; once its last cycle is in, the output's
    verdict on the pruned drafts and a table of the same drafts priced on this curve, each ``DEVICE_CURVES`` device
    and the visitor's ``own`` curve (a spec; "" none; one that does not parse is said in a line, never raised)
    (greedy runs only: a sampled output is one draw and judges no other draft)."""
    if len(traces) < 2:
        return ""
    done = traces[-1].finished and not sampling
    afters = outputs_after(traces) if done else [None] * len(traces)
    books = [b for b in (cycle_ledger(t, curve, a) for t, a in zip(traces, afters)) if b is not None]
    proposed = sum(b.drafts > 0 for b in books)
    trees = sum(b.kept > 0 for b in books)
    lines = ["**GT's ledger** (every decoding cycle: what the draft sources proposed, what GT kept)", "",
             f"- The sources proposed drafts in {proposed} of {len(books)} cycles; GT kept a tree in {trees} of them "
             f"and verified the anchor alone in the rest, where the tokens the drafts promised cost more forward time "
             f"than they would bring on this device's cost curve (GT principle §3)."]
    host = sorted(sum(t.timings_ms.get(k, 0.0) for k in HOST_STAGES) for t in traces[1:])
    if host:
        lines.append(f"- On the page the sources never rest, so every cycle shows what they proposed: drafting, "
                     f"building and reading back cost {host[len(host) // 2]:.2f} ms of host time per cycle here "
                     f"(median).")
    if sampling:
        lines.append("- Sampling: the output is one draw, so which pruned drafts would have been accepted is unknown.")
    elif not done:
        lines.append("- Once the run is done, the output says which pruned drafts would have been accepted.")
    else:
        won = sum(b.pruned_won or 0 for b in books)
        kept = sum(b.accepted for b in books)
        lines.append(f"- The output's verdict: the kept drafts gave {kept} tokens; verifying every draft would have "
                     f"added {won} more, in forwards this curve prices above what they bring.")
        lines += ["", *_pricing_table(traces, curve, own)]
    return "\n".join(lines)


def _pricing_table(traces: Sequence[CycleTrace], curve: CostCurve | None, own: str = "") -> list[str]:
    """The same drafts, GT's choice redone on each curve (the visitor's ``own`` spec last), each kept tree's outcome
    from the output."""
    rows = ["The same drafts priced on another device (GT's choice redone on its cost curve, each tree's outcome "
            "read off the output; no model call):", "",
            "| device | predicted τ | rows per forward | predicted speedup over AR |", "|---|---|---|---|"]
    curves = ([("this device (the curve the run read)", curve)] if curve is not None else []) + [
        (name, device_curve(name)) for name in DEVICE_CURVES]
    unread = ""
    if own.strip():
        try:
            curves.append(("your curve", CostCurve.from_spec(own.strip())))
        except CostCurveError as exc:
            unread = f"Your curve was not read: {exc}."
    for name, c in curves:
        priced = price_on(traces, c)
        if priced is not None:
            rows.append(f"| {name} | {priced.tau:.2f} | {priced.rows:.1f} | {priced.speedup:.2f}× |")
    sources = "; ".join(f"{name}: {where}" for name, (_, where) in DEVICE_CURVES.items())
    return rows + ([""] + [unread] if unread else []) + ["", f"<sub>Curves: {sources}.</sub>"]
