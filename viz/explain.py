"""One plain sentence per decoding cycle, for the page under the tree ("Explain this cycle")."""
from __future__ import annotations

import re
from typing import Callable

from engine.trace import CycleTrace
from engine.tree import Source
from viz.tree_figure import visible_token


_MARKDOWN = re.compile(r"([\\`*_\[\]#|~])")


def _q(token_text: Callable[[int], str], token: int) -> str:
    """A token quoted for the Markdown line: whitespace visible, HTML and Markdown characters escaped."""
    return "'" + _MARKDOWN.sub(r"\\\1", visible_token(token_text(token))) + "'"


def explain_cycle(trace: CycleTrace, token_text: Callable[[int], str]) -> str:
    """E.g. "spine matched 6 tokens and broke at '1' (the target wanted '2'); TR branch '2' continued for
    2 more; bonus ')' → 9 tokens from one forward of 40 nodes"."""
    q = lambda t: _q(token_text, t)  # noqa: E731
    n_new, n_nodes = len(trace.new_tokens), len(trace.tree)
    if trace.mode == "prefill":
        return f"prefill: one forward over the prompt gives the first token {q(trace.bonus)}"
    if trace.mode == "ar":
        return f"no draft source had a candidate: plain AR step, token {q(trace.bonus)}"
    tree, accepted = trace.tree, trace.accepted
    n_spine = 0
    while n_spine < len(accepted) and tree.sources[accepted[n_spine]] is Source.PLD:
        n_spine += 1
    parts = []
    last_spine = accepted[n_spine - 1] if n_spine else 0
    next_spine = next((c for c in tree.children[last_spine] if tree.sources[c] is Source.PLD), None)
    if n_spine or next_spine is not None:
        broke = (f" and broke at {q(tree.tokens[next_spine])} (the target wanted {q(trace.greedy[last_spine])})"
                 if next_spine is not None else " to its end")
        parts.append(f"spine matched {n_spine} token{'s' * (n_spine != 1)}{broke}")
    rest = accepted[n_spine:]
    if rest:
        src = "TR branch" if tree.sources[rest[0]] is Source.TR else f"{tree.sources[rest[0]].value} branch"
        more = f" and continued for {len(rest) - 1} more" if len(rest) > 1 else ""
        parts.append(f"{src} {q(tree.tokens[rest[0]])} was accepted{more}")
    elif not n_spine:
        parts.append("no draft token matched")
    cut = " (cut by EOS / max new tokens)" if n_new < len(accepted) + 1 else ""
    parts.append(f"bonus {q(trace.bonus)} → {n_new} token{'s' * (n_new != 1)} from one forward of {n_nodes} nodes{cut}")
    return f"{trace.mode}: " + "; ".join(parts)


#: Output-token colours by the source that produced each token (the page's coloured output).
TOKEN_COLORS = {"PLD": "#93c5fd", "TR": "#fcd34d", "PTD": "#6ee7b7", "bonus": "#fca5a5", "AR": "#e5e7eb"}


def cycle_segments(trace: CycleTrace, token_text: Callable[[int], str]) -> list[tuple[str, str]]:
    """(text, source label) for each token a cycle committed; labels are the keys of ``TOKEN_COLORS``.

    Prefill and AR-fallback cycles are labelled "AR"; otherwise each accepted draft token carries its
    node's source and the last token is the "bonus".
    """
    if trace.mode in ("prefill", "ar"):
        return [(token_text(t), "AR") for t in trace.new_tokens]
    labels = [s.value.upper() for s in trace.accepted_sources] + ["bonus"]
    return [(token_text(t), label) for t, label in zip(trace.new_tokens, labels)]
