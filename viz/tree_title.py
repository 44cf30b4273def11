"""The draft-tree figure's title in words, and the words ``viz.explain`` and ``viz.frame_text`` share with it.

``default_title`` names one cycle: its number, mode, size and outcome (``CycleTrace.path_category``), and for a tree
cycle how the spine's match shaped it (Goose §4.3: the confidence, the chain, extended or not, and the node budget) on
a second, smaller line after ``SUBTITLE``; ``viz.tree_figure`` lays it out.  ``count_words`` and ``chain_words`` say a
count and the spine's chain in the same words for the title and the sentences under the tree.
"""
from __future__ import annotations

from engine.decoding.trace import CycleTrace

SUBTITLE = "<br><sup>"  # in a title text: what follows goes on the second, smaller line (``tree_figure._title``)


def default_title(trace: CycleTrace) -> str:
    """Cycle number, mode, size and outcome, e.g. "cycle 3 · tree · 40 nodes · 5 tokens (spine continuation)";
    a tree cycle adds how the spine's match shaped it (Goose §4.3): its confidence, the chain (extended or not,
    ``chain_words``) and the node budget on a second, smaller line, e.g. "confidence 0.90, chain extended 20 → 34
    tokens, 9 laid as the spine, budget 96".  When EOS or max new tokens cut the accepted path, the title says how
    many of its tokens were kept."""
    n = len(trace.new_tokens)
    cut = (f", cut at {n} of {len(trace.accepted) + 1} by EOS / max new tokens"
           if trace.mode in ("tree", "bypass") and n < len(trace.accepted) + 1 else "")
    note = _shape_note(trace)
    return (f"cycle {trace.index} · {trace.mode} · {count_words(len(trace.tree), 'node')} · "
            f"{count_words(n, 'token')} ({_outcome(trace)}{cut})" + (f"{SUBTITLE}{note[3:]}" if note else ""))


def _outcome(trace: CycleTrace) -> str:
    """The accepted path's kind in words (``CycleTrace.path_category``), its "none" said for what it is."""
    if trace.path_category != "none":
        return trace.path_category
    if trace.mode == "prefill":
        return "the prefill's own next token"
    if trace.mode == "ar":  # drafts GT priced out are drawn as ghosts: the title says so instead of "no drafts"
        ghosts = len(trace.ghosts)
        would = f", {len(trace.ghost_hits)} would have been accepted" if trace.ghost_hits else ""
        return (f"one AR step: GT kept none of {count_words(ghosts, 'draft')}{would}" if ghosts
                else "one AR step: no drafts")
    return "no draft accepted: the bonus token only"


def count_words(n: int, noun: str) -> str:
    """'1 token', '2 tokens'."""
    return f"{n} {noun}{'s' * (n != 1)}"


def _shape_note(trace: CycleTrace) -> str:
    """Title suffix: the match confidence, the spine chain (extended or not) and the budget of a tree cycle."""
    if trace.mode != "tree" or trace.budget is None:
        return ""
    if not trace.match_tokens or trace.confidence is None:
        return f" · budget {trace.budget}"
    return f" · confidence {trace.confidence:.2f}, {chain_words(trace)}, budget {trace.budget}"


def chain_words(trace: CycleTrace) -> str:
    """The spine's chain in the same words for the title and the sentence under the tree (``viz.explain``): what
    the match offered, extended or not, and how much of it the tree laid as its spine (B r and GT bound it), e.g.
    "chain extended 20 → 90 tokens, 2 laid as the spine" or "match 4 tokens, all laid as the spine"."""
    laid = len(trace.tree.spine)
    offered = (f"chain extended {trace.match_tokens} → {trace.chain_tokens} tokens" if trace.extended
               else f"match {count_words(trace.match_tokens, 'token')}")
    return offered + (", all laid as the spine" if laid >= trace.chain_tokens else f", {laid} laid as the spine")
