"""A first lesson: what speculative decoding is, and one cycle played in stages ("step through").

The stages are ``viz.tree_figure.STAGES``; ``stage_sentence`` gives each one plain sentence drawn from
the cycle itself (Goose Alg. 2: draft -> build -> verify -> accept -> commit).
"""
from __future__ import annotations

from collections.abc import Callable

from engine.decoding.trace import CycleTrace
from engine.sources import REGISTRY, tags
from viz.explain import _q

_LESSON = """
A language model writes one token per forward pass, and {cost}
**Speculative decoding** uses this. Each cycle it

1. **guesses** several next tokens cheaply: here by copying what followed an earlier occurrence of the
   last words (**PLD**, blue) and from a table of what the model predicted after each token before
   (**Token Recycling**, orange), arranged as a tree;
2. **checks every guess in one forward** of the model over the whole tree;
3. **keeps the longest path of correct guesses**, plus **one token the model adds itself** (the bonus ★).

{promise} It writes **τ** tokens per forward; it is faster by τ divided by what a forward over the tree costs in
one-token passes (the speedup beside τ is measured).
Press **Generate**, then **Step through** to watch one cycle in four stages.
"""
FLAT = 1.1  # T(16) / T(1) below this reads "about as much" (a GPU's flat curve)


def pass_cost(curve, rows: int = 16) -> str:
    """How a pass over ``rows`` tokens compares with a one-token pass on ``curve`` (``engine.decoding.cost.CostCurve``),
    in words: "on this CPU one pass over **16** tokens costs **1.5×** a one-token pass" (or "about as much" on a flat
    curve); a generic sentence without a curve."""
    if curve is None:
        return ("one pass over **many** tokens costs much less than that many passes over **one** token: the weights "
                "are read once either way.")
    where = "this GPU" if "|cuda" in curve.key else "this CPU" if "|cpu" in curve.key else "this device"
    ratio = curve.latency(rows) / curve.latency(1)
    if ratio < FLAT:
        return (f"on {where} one pass over **{rows}** tokens costs about as much as one pass over **one** token "
                f"({ratio:.2f}×, measured): the weights are read once either way.")
    return (f"on {where} one pass over **{rows}** tokens costs **{ratio:.1f}×** a one-token pass (measured), "
            f"far less than {rows} passes: the weights are read once either way.")


def promise(precision: str | None) -> str:
    """What the lesson promises of the output, true of the model's ``precision`` ("fp32", "bf16", "fp16", "q4"; None:
    not known): exactly plain decoding's output in fp32; in half precision or q4 the same except at a precision tie,
    named as such, with where a run shows it and the one click that makes it exact (the Exact mode button)."""
    if precision == "fp32":
        return "The output is exactly what plain decoding would write (this model runs in fp32, the exact mode)."
    here = f"this model runs in **{precision}**" if precision else "in half precision or q4"
    return (f"In fp32 the output is exactly what plain decoding would write; {here}, where a forward over the tree "
            f"rounds differently from a one-token forward, so where two next tokens are almost equally likely the "
            f"output may take the other one: a *precision tie*, not a bug (the **Race** below names where). "
            f"**Exact mode (fp32)** makes it token for token plain decoding's output.")


def what_is_it(curve=None, precision: str | None = None) -> str:
    """The first lesson (Markdown): its cost sentence read off the page's cost curve (``pass_cost``), its promise
    of the output true of the model's ``precision`` (``promise``)."""
    return _LESSON.format(cost=pass_cost(curve), promise=promise(precision))


WHAT_IS_IT = what_is_it()  # the lesson with no curve (generic cost sentence)

_WAYS = """
**Two ways to see trees, one click each** (below): the **demo model**, tiny and fast, where trees pay almost every
cycle, and **Exact mode (fp32)**, this model unquantized, whose output is plain decoding's token for token.  Where a
forward over many tokens costs many one-token passes (a fast CPU forward), GT keeps few trees for the default model
and draws the drafts it priced out as ghosts.  What Generate measured on this server, model beside model (tokens/s
end to end, τ, the speedup over AR; the medians of its last runs):
"""


def lesson(curve=None, precision: str | None = None, speeds=()) -> str:
    """The whole lesson (Markdown): ``what_is_it`` on ``curve`` and ``precision``, then ``ways_to_see_trees``."""
    return what_is_it(curve, precision) + ways_to_see_trees(speeds)


def ways_to_see_trees(speeds) -> str:
    """The lesson's second part (Markdown): the two one-click ways to see trees, then ``speeds`` side by side
    (``engine.product.models.speeds.RecentSpeeds.typical``: each model's name, median run and run count; tokens/s
    end to end as the big number shows it, τ, the speedup over AR), so an exact mode's large speedup stands beside its
    small tokens/s and the default's."""
    if not speeds:
        return _WAYS + "\n*No run yet: each model's tokens/s, τ and speedup show here after its first Generate.*"
    rows = [f"| {name} | {s.tok_per_s:.1f} | {s.tau:.2f} | "
            f"{'–' if s.speedup is None else f'{s.speedup:.2f}×'} | {n} |" for name, s, n in speeds]
    return (_WAYS + "\n| model | tok/s | τ | × AR | runs |\n|---|---|---|---|---|\n"
            + "\n".join(rows))


#: The source stages: each source's drafts, in ``REGISTRY`` order.
SOURCE_STAGES = {i.name: i for i in REGISTRY}
STAGE_TITLES = {"scored": "2 · one forward scores them all", "walk": "3 · the walk accepts the longest match",
                "bonus": "4 · the bonus token"}


def stage_title(trace: CycleTrace, stage: str) -> str:
    """The stage's numbered title: the source stages of the cycle are 1a, 1b, … in the order shown (just "1"
    when one source drafted), so the first is always 1 or 1a whichever sources drafted."""
    if stage not in SOURCE_STAGES:
        return STAGE_TITLES.get(stage, stage)
    shown = [s for s in stages_of(trace) if s in SOURCE_STAGES]
    k = shown.index(stage) if stage in shown else 0
    number = "1" if len(shown) <= 1 else f"1{'abcdefgh'[k]}"
    return f"{number} · drafts: {SOURCE_STAGES[stage].label}"


def stages_of(trace: CycleTrace) -> list[str]:
    """The stages worth showing for ``trace``: a source's stage only when it drafted a node."""
    if trace.mode in ("prefill", "ar"):
        return ["bonus"]
    have = set(trace.tree.sources) | {g.source for g in trace.ghosts}
    out = [i.name for i in REGISTRY if i.source in have]
    return out + ["scored", "walk", "bonus"]


def stage_sentence(trace: CycleTrace, stage: str, token_text: Callable[[int], str]) -> str:
    """One plain sentence for ``stage`` of ``trace`` (Markdown; tokens quoted and escaped)."""
    q = lambda t: _q(token_text, t)  # noqa: E731
    tree = trace.tree
    count = {s: sum(x is s for x in tree.sources) for s in tags()}
    if trace.mode in ("prefill", "ar"):
        return (f"**{stage_title(trace, stage)}** — this cycle had no drafts: one forward gave the next "
                f"token {q(trace.bonus)}.")
    if stage in SOURCE_STAGES:
        src = SOURCE_STAGES[stage]
        n = count[src.source]
        role = " — the spine" if tree.spine and tree.sources[tree.spine[0]] is src.source else ""
        return f"**{stage_title(trace, stage)}** — {n} guess{'es' * (n != 1)}{role}: {src.blurb}."
    if stage == "scored":
        return (f"**{STAGE_TITLES[stage]}** — one forward over all {len(tree)} nodes gives the model's own next "
                f"token at every node at once; ✓ marks a guess equal to what the model wanted at its place.")
    if stage == "walk":
        n = len(trace.accepted)
        return (f"**{STAGE_TITLES[stage]}** — from the anchor, the walk follows ✓ nodes as far as they go: "
                f"{n} draft token{'s' * (n != 1)} accepted (the thick sky-blue path); every other node is discarded.")
    n_new = len(trace.new_tokens)
    return (f"**{STAGE_TITLES['bonus']}** — the model's token after the last accepted one, {q(trace.bonus)}, "
            f"is free: {n_new} token{'s' * (n_new != 1)} committed from one forward (plain decoding: 1).")
