"""One plain sentence per decoding cycle, for the page under the tree ("Explain this cycle")."""
from __future__ import annotations

import html
import re
from collections.abc import Callable, Sequence

from engine.decoding.trace import CycleTrace
from engine.product.runs.ledger import CycleLedger
from engine.product.runs.run import SPEEDUP_PHASE
from engine.sources import REGISTRY, info
from viz.tree_figure import GhostMarks
from viz.tree_layout import visible_token
from viz.tree_title import chain_words, count_words

_MARKDOWN = re.compile(r"([\\`*_\[\]#|~])")


def _q(token_text: Callable[[int], str], token: int) -> str:
    """A token quoted for the Markdown line: whitespace visible, HTML and Markdown characters escaped."""
    return "'" + _MARKDOWN.sub(r"\\\1", visible_token(token_text(token))) + "'"


def confidence_note(trace: CycleTrace) -> str | None:
    """How the §4.3 confidence shaped a tree cycle, in the title's words (``tree_title.chain_words``), e.g.
    "confident match (0.90): chain extended 20 → 90 tokens, 2 laid as the spine, budget 84"; None when the match
    was not extended (or the trace predates these fields)."""
    if trace.mode != "tree" or trace.confidence is None or not trace.extended:
        return None
    return f"confident match ({trace.confidence:.2f}): {chain_words(trace)}, budget {trace.budget}"


def ghost_words(pruned: int, marks: GhostMarks | None = None) -> str:
    """Where the drawing has a cycle's ``pruned`` candidates (``marks``, ``tree_figure.ghost_marks``; None: each a
    ghost of its own), in the legend's words: " (the 7 ghosts)", " (3 drawn as ghosts, 4 in the +N folds)",
    " (1 drawn as a ghost, 1 in a +N fold)", " (all in the +N folds)", " (not drawn: ghosts are switched off)"; ""
    when none was pruned."""
    if not pruned:
        return ""
    drawn, folded, hidden = marks or (pruned, 0, 0)
    if hidden:
        return " (not drawn: ghosts are switched off)"
    if not folded:
        return f" ({'the ghost' if pruned == 1 else f'the {pruned} ghosts'})"
    if not drawn:
        return f" ({'in a +N fold' if pruned == 1 else 'all in the +N folds'})"
    drawn_words = "1 drawn as a ghost" if drawn == 1 else f"{drawn} drawn as ghosts"
    return f" ({drawn_words}, {'1 in a +N fold' if folded == 1 else f'{folded} in the +N folds'})"


def rest_note(trace: CycleTrace) -> str:
    """Which sources sat the cycle out and why (``CycleTrace.resting``), e.g. "; TR branch rested: GT had priced the
    drafts of the cycles before down to the anchor, so its successors were neither drafted nor read back"; ""
    when every source drafted."""
    if not trace.resting:
        return ""
    names = " and ".join(info(name).label for name in trace.resting)
    return (f"; {names} rested: GT had priced the drafts of the cycles before down to the anchor, so its successors "
            "were neither drafted nor read back")


def gt_note(trace: CycleTrace, marks: GhostMarks | None = None) -> str | None:
    """Why GT "auto" gave the cycle its size, counted on what the tree draws: e.g. "GT kept 9 nodes, pruned 52 (the 52
    ghosts): 2.4 tokens expected for 5.1 ms on the cost curve" (the bonus token counted).  Kept = the verified
    tree's nodes (anchor included), pruned = ``trace.ghosts``, so the sentence, the title and the dotted ghosts read
    one list (both the chord floor the builders prune at and the size choice make ghosts: GT §3,
    engine/decoding/gt.py); ``marks`` says where the drawing has them (``ghost_words``).  None when GT "auto" did
    not size the cycle (a fixed c, or a trace without the fields)."""
    if trace.gt_nodes is None or trace.gt_candidates is None:
        return None
    pruned = len(trace.ghosts)
    drawn = ghost_words(pruned, marks)
    if len(trace.tree) == 1:
        return f"GT pruned every draft{drawn}: none was expected to pay for its time"
    return (f"GT kept {count_words(len(trace.tree), 'node')}, pruned {pruned}{drawn}: "
            f"{1 + trace.gt_expected:.1f} tokens expected for {trace.gt_cost_ms:.1f} ms on the cost curve")


def explain_cycle(trace: CycleTrace, token_text: Callable[[int], str], marks: GhostMarks | None = None,
                  ledger: CycleLedger | None = None) -> str:
    """E.g. "spine matched 6 tokens and broke at '1' (the target wanted '2'); TR branch '2' continued for
    2 more; bonus ')' → 9 tokens from one forward of 40 nodes"; ``marks``: where the drawing has the cycle's
    ghosts (``gt_note``); ``ledger``: GT's books for the cycle (``engine.product.runs.ledger``), which say in plain
    words why an AR step is one and, once the output is known, what its pruned drafts would have won (a tree cycle's
    sentence keeps to its tree, three lines at most: the Theory panel totals the rest)."""
    q = lambda t: _q(token_text, t)  # noqa: E731
    n_new, n_nodes = len(trace.new_tokens), len(trace.tree)
    if trace.mode == "prefill":
        return f"prefill: one forward over the prompt gives the first token {q(trace.bonus)}"
    if trace.mode == "ar":
        if ledger is not None:
            return f"AR step, token {q(trace.bonus)}: {ledger.sentence()}{hits_note(trace)}{rest_note(trace)}"
        why = gt_note(trace, marks) or "no draft source had a candidate"
        return f"{why}: plain AR step, token {q(trace.bonus)}{rest_note(trace)}"
    tree, accepted = trace.tree, trace.accepted
    note = confidence_note(trace)
    spine = tree.spine
    n_spine = 0
    while n_spine < len(accepted) and n_spine < len(spine) and accepted[n_spine] == spine[n_spine]:
        n_spine += 1
    parts = [note] if note else []
    last_spine = accepted[n_spine - 1] if n_spine else 0
    next_spine = spine[n_spine] if n_spine < len(spine) else None
    if n_spine or next_spine is not None:
        broke = (f" and broke at {q(tree.tokens[next_spine])} (the target wanted {q(trace.greedy[last_spine])})"
                 if next_spine is not None else " to its end")
        parts.append(f"spine matched {n_spine} token{'s' * (n_spine != 1)}{broke}")
    rest = accepted[n_spine:]
    if rest:
        src = info(tree.sources[rest[0]]).label
        more = f" and continued for {len(rest) - 1} more" if len(rest) > 1 else ""
        parts.append(f"{src} {q(tree.tokens[rest[0]])} was accepted{more}")
    elif not n_spine:
        parts.append("no draft token matched")
    cut = " (cut by EOS / max new tokens)" if n_new < len(accepted) + 1 else ""
    parts.append(f"bonus {q(trace.bonus)} → {n_new} token{'s' * (n_new != 1)} from one forward of {n_nodes} nodes{cut}")
    if gt_note(trace, marks):
        parts.append(gt_note(trace, marks))
    return f"{trace.mode}: " + "; ".join(parts) + hits_note(trace) + rest_note(trace)


def hits_note(trace: CycleTrace) -> str:
    """"; the ringed ghost 'x' would have been accepted had GT kept it" for a cycle with ``ghost_hits``; ""
    without."""
    if not trace.ghost_hits:
        return ""
    one = len(trace.ghost_hits) == 1
    return (f"; {'the ringed ghost' if one else f'{len(trace.ghost_hits)} ringed ghosts'} would have been accepted "
            f"had GT kept {'it' if one else 'them'}")


#: Output-token colours by the source that produced each token (the page's coloured output): each source's
#: ``tint``, the bonus token's in the bonus star's vermillion, plain AR steps a light grey.
TOKEN_COLORS = {**{i.short: i.tint for i in REGISTRY}, "bonus": "#db7626", "AR": "#f3f4f6"}


def cycle_segments(trace: CycleTrace, token_text: Callable[[int], str]) -> list[tuple[str, str]]:
    """(text, source label) for each token a cycle committed; labels are the keys of ``TOKEN_COLORS``.

    Prefill and AR-fallback cycles are labelled "AR"; otherwise each accepted draft token carries its
    node's source and the last token is the "bonus".
    """
    if trace.mode in ("prefill", "ar"):
        return [(token_text(t), "AR") for t in trace.new_tokens]
    labels = [info(s).short for s in trace.accepted_sources] + ["bonus"]
    return [(token_text(t), label) for t, label in zip(trace.new_tokens, labels)]


def theory_panel(summary, trace: CycleTrace | None, budget: int, max_depth: int,
                 traces: Sequence[CycleTrace] = ()) -> str:
    """Markdown: measured p_s, p_t and τ next to Goose Prop. 1's bound (Eq. 1), like with like: the mean of the
    bound over the shapes of the run's tree cycles (``traces``; rates p_s, p_t the run's) beside the tokens those
    same cycles committed per forward (accepted + bonus), the cycle on screen's own tokens beside its shape's bound,
    and the Iso(3) yield for the same budget (Goose App. E.4); a sentence says which side of the bound the run
    is and what that shows.  See ``engine.core.theory``."""
    from engine.core.theory import isotropic_yield

    if summary is None or summary.cycles == 0:
        return "Generate first: the panel compares the measured τ with the expected yield of the tree shape."
    p_s, p_t = summary.p_s or 0.0, summary.p_t or 0.0
    lines = [f"Rates: the whole run so far ({summary.forwards} forwards, as the big numbers).\n",
             "| quantity | value |", "|---|---|",
             f"| measured p_s (spine acceptance) | {summary.p_s:.3f} |" if summary.p_s is not None else
             "| measured p_s (spine acceptance) | – (no spine token verified yet) |",
             f"| measured p_t (branch acceptance) | {summary.p_t:.3f} |" if summary.p_t is not None else
             "| measured p_t (branch acceptance) | – (no branch token verified yet) |",
             f"| measured τ, every forward (prefill and AR steps too) | **{summary.tau:.2f}** |"]
    rows, verdict = _bound_rows(traces, trace, p_s, p_t, max_depth)
    lines += rows
    lines.append(f"| Iso(3) yield, B = {budget}, rate p_t | {isotropic_yield(p_t, budget, 3, max_depth):.2f} |")
    return "\n".join([*lines, "", verdict])


def _bound_rows(traces: Sequence[CycleTrace], trace: CycleTrace | None, p_s: float, p_t: float,
                max_depth: int) -> tuple[list[str], str]:
    """The theory panel's Eq. 1 rows (the run's tree cycles, then the cycle on screen) and its closing sentence."""
    from engine.core.theory import spine_yield_bound, tree_shape

    def bound(t: CycleTrace) -> float:
        return spine_yield_bound(p_s, p_t, *tree_shape(t.tree), max_depth)

    trees = [t for t in traces if t.mode in ("tree", "bypass")]
    rows = []
    if trace is not None and trace.mode in ("tree", "bypass"):
        m, widths = tree_shape(trace.tree)
        shown = f"{widths[:6]}{'…' * (len(widths) > 6)}"
        rows.append(f"| cycle {trace.index}: its tokens (accepted + bonus) / Eq. 1 bound for its shape (m = {m}, "
                    f"w = {shown}) | {len(trace.accepted) + 1} / {bound(trace):.2f} |")
    if not trees:
        return rows, ("No tree cycle in this run so far, so Eq. 1, which bounds a tree's yield, has nothing to "
                      "measure: GT verified the anchor alone in every cycle (GT's ledger below says why)."
                      if len(traces) > 1 else "No tree cycle yet: Eq. 1 bounds a tree's yield.")
    measured = sum(len(t.accepted) + 1 for t in trees) / len(trees)
    expected = sum(bound(t) for t in trees) / len(trees)
    rows[:0] = [f"| measured τ over the {len(trees)} tree cycles (accepted + bonus per forward) | **{measured:.2f}** |",
                f"| Eq. 1 bound, mean over the same {len(trees)} cycles' shapes | **{expected:.2f}** |"]
    if measured >= expected:
        return rows, (f"Over the same {len(trees)} tree cycles the measured τ, {measured:.2f}, is at or above Eq. 1's "
                      f"{expected:.2f}, as a lower bound should be: Eq. 1 (Goose Prop. 1) assumes independent "
                      "acceptances at fixed rates, and positively correlated acceptances in real text yield more.")
    return rows, (f"Over the same {len(trees)} tree cycles the measured τ, {measured:.2f}, is below Eq. 1's "
                  f"{expected:.2f}: this run's acceptances are not the independent, fixed-rate ones Eq. 1 (Goose "
                  "Prop. 1) assumes (for example, acceptance that falls along the spine), so here the bound does not "
                  "hold.")


_CELL = ('<div style="flex:none;margin-right:1em{}"{}><div style="font-size:2.2em;font-weight:700;line-height:1">{}'
         '</div><div style="opacity:.7;font-size:.85em;line-height:1.25">{}</div></div>')  # one row: the tree stays
# on the first screen at 1280×800


def big_numbers(summary, speedup=None) -> str:
    """HTML: τ, the measured speedup over AR beside it, and tokens/s in large type, for presenting.

    Args:
        summary: ``engine.product.runs.metrics.RunSummary`` of the run so far (None: nothing yet).
        speedup: ``engine.product.runs.run.Speedup`` (None: not measured); its value with its 95 % interval
            ("1.52× ± 0.06", ``Speedup.spread``),
            "no speedup" where the run could have none (τ ≈ 1), else greyed with "measuring…" or "–"; its note
            (where AR's speed comes from, what the ± covers) is the cell's tooltip and small print.
    """
    if summary is None or summary.cycles == 0:
        tau, speed = "–", "–"
    else:
        rate = summary.tok_per_s  # end to end: after a long prefill it is small at first ("0" read as broken)
        digits = 0 if rate >= 10 else 1 if rate >= 0.1 else 2
        tau, speed = f"{summary.tau:.2f}", f"{rate:.{digits}f}"
    if speedup is not None and speedup.none:  # τ ≈ 1: nothing to gain, whatever the clocks read
        shown, grey = '<span style="font-size:.5em">no speedup</span>', ""
    elif speedup is not None and speedup.undecided:  # 1× inside the interval: words, not a number read as "slower"
        shown, grey = ('<span style="font-size:.45em;white-space:nowrap">too close to call</span><span style="'
                       f'font-size:.35em;font-weight:400;white-space:nowrap"><br>{speedup.value:.2f}×'
                       f'{speedup.spread()}</span>'), ""
    elif speedup is not None and speedup.value is not None:
        margin = (f'<span style="font-size:.4em;font-weight:400">{speedup.spread()}</span>'
                  if speedup.margin is not None else "")
        shown, grey = f"{speedup.value:.2f}×{margin}", ""
    elif speedup is not None and speedup.pending:
        shown, grey = '<span style="font-size:.5em">measuring…</span>', ";opacity:.45"
    else:
        shown, grey = "–", ";opacity:.45"
    note = html.escape(speedup.note if speedup is not None else "not measured yet")
    short = (speedup.short or speedup.note) if speedup is not None else "not measured yet"
    if speedup is not None and speedup.undecided:
        short += " · the Race times both on one clock"
    lines = "<br>".join(f'<span style="white-space:nowrap">{html.escape(part)}</span>' for part in short.split(" · "))
    label = f"speedup over AR<br><small>{lines}</small>"  # one phrase a line: the cell never breaks mid-phrase
    return ('<div style="display:flex;align-items:flex-start">' + _CELL.format("", "", tau, "τ — tokens<br>per forward")
            + _CELL.format(grey, f' id="speedup" title="{note}"', shown, label)
            + _CELL.format("", "", speed, "tokens / s<br><small>end to end</small>") + "</div>")


def cost_sentence(tau: float, steps: float | None, measured: str | None = None) -> str:
    """τ tied to the cost curve, e.g. "τ 2.40 at 1.40 AR steps per forward → 1.71× predicted by the cost curve
    (measured: 1.52× ± 0.06, decode phase)": a forward of many rows costs ``steps`` one-token forwards
    (``engine.product.runs.run.ar_steps_per_forward``), so τ / steps is the speedup the curve predicts (a
    prediction, and said to be one); drafting and bookkeeping make the measured one (``measured``:
    ``Speedup.words``) lower.  "" without a curve."""
    if steps is None or steps <= 0:
        return ""
    out = f"τ {tau:.2f} at {steps:.2f} AR steps per forward → {tau / steps:.2f}× predicted by the cost curve"
    return out + (f" (measured: {measured}, {SPEEDUP_PHASE})" if measured is not None else "")


def race_estimate(expected_s: float, ar_s: float, race_seconds: float) -> str:
    """The race's length on screen, said before it runs: e.g. "Expected on screen: about 49 s (AR alone needs
    about 29 s of engine time here, and the two lanes take turns on one device)"; ``race_seconds``: the length
    asked (0: real time)."""
    why = (f"AR alone needs about {ar_s:.0f} s of engine time here, and the two lanes take turns on one device"
           if expected_s > race_seconds + 0.5 else f"the {race_seconds:.0f} s asked, the engine clock scaled")
    return f"Expected on screen: about {expected_s:.0f} s ({why})."


def race_overrun(took_s: float, expected_s: float, engine_s: float) -> str:
    """After a race: "" when it took about its estimate (within 20 % or 3 s), else e.g. "It took 52 s on screen,
    past the 30 s expected: the two lanes' engine time alone was 47 s (a busier machine than the estimate's)"."""
    if took_s <= max(expected_s * 1.2, expected_s + 3):
        return ""
    why = (f"the two lanes' engine time alone was {engine_s:.0f} s, more than the estimate's (a busier machine, or "
           "a slower AR step than the cost curve's)" if engine_s > 0.8 * took_s else
           "drawing the board took the rest (a browser on the same cores)")
    return f"It took {took_s:.0f} s on screen, past the {expected_s:.0f} s expected: {why}."


def race_board(lanes, max_new_tokens: int, speedup=None, status: str = "", verdict: str = "") -> str:
    """HTML: the race's speedup in large type, one progress bar per lane (tokens done / max new tokens) with its
    engine time (ms) to its first token and after it, its tokens/s after it and τ (the speedup's basis, the decode
    phase, beside the prefill: a lane line that read "2401 ms" against "2225 ms" stood beside "0.94×", the first
    lane's colder prefill inside), a status ("stopped", "✓") and, when the outputs part, where and why.

    Args:
        lanes: ``engine.product.runs.race.Lane`` s, the baseline (AR) first.
        max_new_tokens: the race's max new tokens (a full bar).
        speedup: the last lane's ``engine.product.runs.run.Speedup`` over the first so far (None: not yet),
            measured and worded as Generate's (``SPEEDUP_WORDS``, with its margin).
        status: one line under the bars (e.g. "stopped: both outputs as of the same engine time").
        verdict: where the two outputs part, with both logits (``engine.product.runs.lossless.Divergence.sentence``).
    """
    words = speedup.words() if speedup is not None else None
    big = "–" if words is None else words if words[:1].isdigit() else f'<span style="font-size:.4em">{words}</span>'
    note = html.escape(speedup.note) if speedup is not None else "not measured yet"
    rows = []
    for k, lane in enumerate(lanes):
        colour = "#9ca3af" if k == 0 else "#0072B2"  # the baseline grey, the method blue
        done = len(lane.tokens)
        share = min(1.0, done / max(1, max_new_tokens))
        tick = " ✓" if lane.finished else ""
        rate = lane.decode_tokens / lane.decode_s if lane.decode_s > 0 else 0.0
        rows.append(
            f'<div style="margin:.3em 0"><div><b>{html.escape(lane.name)}</b>{tick} — {done} / {max_new_tokens} '
            f'tokens · engine time: first token {lane.prefill_s * 1000:.0f} ms, then {lane.decode_s * 1000:.0f} ms, '
            f'{rate:.0f} tok/s ({SPEEDUP_PHASE}) · τ {lane.tau:.2f}'
            f'</div><div style="background:#e5e7eb;border-radius:4px;height:14px;width:100%">'
            f'<div class="lane-bar" style="background:{colour};border-radius:4px;height:14px;width:{share:.1%}">'
            f'</div></div></div>')
    extra = "".join(f'<div style="margin-top:.3em">{html.escape(line)}</div>' for line in (status, verdict) if line)
    return (f'<div style="display:flex;gap:1.5em;align-items:center"><div style="min-width:9em">'
            f'<div style="font-size:3em;font-weight:700;line-height:1" id="race-speedup" title="{note}">{big}</div>'
            f'<div style="opacity:.7">speedup over AR<br><small>{SPEEDUP_PHASE} · race\'s AR lane</small></div>'
            '</div>'
            f'<div style="flex:1">{"".join(rows)}</div></div>{extra}')
