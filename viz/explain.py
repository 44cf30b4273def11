"""One plain sentence per decoding cycle, for the page under the tree ("Explain this cycle")."""
from __future__ import annotations

from typing import Callable

from engine.trace import CycleTrace
from engine.tree import Source


def _q(token_text: Callable[[int], str], token: int) -> str:
    text = token_text(token).replace("\n", "↵").replace("\t", "→")
    return f"'{text}'"


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
    parts.append(f"bonus {q(trace.bonus)} → {n_new} token{'s' * (n_new != 1)} from one forward of {n_nodes} nodes")
    return f"{trace.mode}: " + "; ".join(parts)
