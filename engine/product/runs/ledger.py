"""GT's ledger of a run: for every cycle what the draft sources proposed, what GT's size choice kept and why, what the
drafts it pruned would have won, and the same drafts priced on another device's cost curve.

In greedy decoding the verdict on every draft is known once the output is: a candidate node would have been accepted
exactly when its path from the anchor equals the output after the anchor (the greedy tree walk, SpecInfer §4.2).  So
a finished run can say, cycle by cycle, how many tokens verifying every candidate would have accepted, and price any
size choice over the same candidates on any cost curve with no model call:

* ``CycleLedger`` (``cycle_ledger``): a cycle's drafts, their expected tokens (Σ of their path estimates, GT §3.1)
  and what verifying all of them costs on the curve in AR steps (T(n + R) / T(1)), the nodes GT kept, and, once the
  output is known, the tokens all of them would have accepted;
* ``price_on``: GT's size choice (``engine.decoding.gt.size_choice``, the session rate λ as the loop tracks it)
  redone on another curve over each cycle's candidate tree, each kept tree's outcome read off the output: the
  predicted τ and decode-phase speedup there.  The drafts are priced at the estimates GT read in the run (its
  calibration by the session's outcomes and trust included: ``GtChoice.read``, kept in ``CycleTrace.candidates``),
  so on the run's own curve the choice is the run's; each cycle is priced where the run's cycle stood: a rate over
  the same drafts, not a replay of another run's text.

Sources: GT principle paper §3.1 (the size choice, Eqs. 6-9); Goose Algorithm 2 (the cycle); SpecInfer §4.2 (the
greedy tree walk).  Ours: the verdict on pruned drafts from the output, the pricing on another device.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from engine.core.tree import DraftTree
from engine.decoding.cost import CostCurve
from engine.decoding.gt import size_choice
from engine.decoding.trace import CycleTrace

#: Cost curves of other devices a run's drafts can be priced on: name -> (spec, where it was measured).  T(n) in ms
#: over 128 cached tokens, SmolLM2-135M's configuration; the page offers them beside the curve the run read.
DEVICE_CURVES: dict[str, tuple[str, str]] = {
    "an H200 (CUDA graphs, bf16)": (
        "past=128;1:3.79,2:4.14,4:4.26,8:4.39,16:4.47,32:4.72,64:4.99,128:5.58",
        "docs/results.md, \"On a GPU: the graphed path\": SmolLM2's configuration in bf16 on one H200, the graphed "
        "path, medians of interleaved rounds (commit d1eede4, 2026-11-28)"),
    "an H200 (eager, bf16)": (
        "past=128;1:33.7,2:35.9,4:36.6,8:36.2,16:37.3,32:36.2,64:38.1,128:37.7",
        "docs/results.md, \"On a GPU: the graphed path\": the same model and GPU without CUDA graphs (the host's "
        "kernel launches: a flat curve)"),
    "a 2-core CPU (llama.cpp, Q4_1)": (
        "past=128;1:15,2:27,4:40,8:67,16:130,32:240,64:428,128:850",
        "docs/results.md, \"The llamacpp path\": SmolLM2's Q4_1 file on llama.cpp's kernels on a 2-core AVX2 "
        "machine (a second row costs 0.8 of a first)"),
}


def device_curve(name: str) -> CostCurve:
    """The shipped cost curve ``name`` (a ``DEVICE_CURVES`` key).  Raises KeyError for another name."""
    return CostCurve.from_spec(DEVICE_CURVES[name][0])


def outputs_after(traces: Sequence[CycleTrace]) -> list[tuple[int, ...]]:
    """For each cycle, the tokens the run wrote after that cycle's anchor (its own new tokens and every later
    cycle's), capped at the deepest draft any cycle offered (a node deeper than that is never judged)."""
    output = [t for trace in traces for t in trace.new_tokens]
    depth = max((max(proposals(t).depths) for t in traces), default=0) + 1
    starts, at = [], 0
    for trace in traces:
        starts.append(at)
        at += len(trace.new_tokens)
    return [tuple(output[s: s + depth]) for s in starts]


def matched(tree: DraftTree, after: Sequence[int], keep: Sequence[int] | None = None) -> int:
    """Draft tokens greedy verification of ``tree`` (only the nodes ``keep``, ancestor-closed; None: all) accepts
    when the model's output after the anchor is ``after``: the depth of the deepest node whose path equals it."""
    kept = set(range(len(tree))) if keep is None else set(keep)
    on_output = {0}
    best = 0
    for i in range(1, len(tree)):  # a parent precedes its children (``DraftTree``)
        d = tree.depths[i]
        if i in kept and tree.parents[i] in on_output and d <= len(after) and tree.tokens[i] == after[d - 1]:
            on_output.add(i)
            best = max(best, d)
    return best


@dataclass(frozen=True)
class CycleLedger:
    """GT's books for one cycle.

    Attributes:
        drafts: candidate nodes the sources proposed, anchor excluded (0: no source had one).
        kept: of them, the nodes GT kept and the forward verified.
        expected: tokens the drafts were expected to bring, Σ of their path estimates (GT §3.1).
        cost_steps: verifying every draft on the run's curve, in AR steps: T(drafts + 1 + R) / T(1); None without a
            curve.
        accepted: draft tokens the cycle accepted.
        would_accept: draft tokens verifying every draft would have accepted (the output's verdict); None while the
            output is not known (a run still streaming, or sampling).
    """

    drafts: int
    kept: int
    expected: float
    cost_steps: float | None
    accepted: int
    would_accept: int | None = None

    @property
    def pruned_won(self) -> int | None:
        """Tokens the drafts GT pruned would have added (``would_accept`` − ``accepted``, 0 where the run's end cut the
        cycle's own path short); None while unknown."""
        return None if self.would_accept is None else max(0, self.would_accept - self.accepted)

    def sentence(self) -> str:
        """GT's decision in one plain sentence, e.g. "11 drafts, 0.9 tokens expected; verifying them costs 4.2 AR
        steps here, more than they promise, so GT kept the anchor alone; the output: they would have added 2
        tokens"."""
        if not self.drafts:
            return "no draft source had a candidate for this place"
        cost = f"; verifying them costs {self.cost_steps:.1f} AR steps here" if self.cost_steps is not None else ""
        head = f"{self.drafts} draft{'s' * (self.drafts != 1)}, {self.expected:.1f} tokens expected{cost}"
        if self.kept == 0:
            head += ", more than they promise, so GT kept the anchor alone"
        else:
            head += ": GT kept them all" if self.kept == self.drafts else f": GT kept {self.kept} of them"
        won = self.pruned_won
        if won is None or self.kept == self.drafts:
            return head
        return head + (f"; the output: the pruned ones would have added {won} token{'s' * (won != 1)}" if won
                       else "; the output: none of the pruned ones would have been accepted")


def cycle_ledger(trace: CycleTrace, curve: CostCurve | None, after: Sequence[int] | None = None) -> CycleLedger | None:
    """``trace``'s ledger on ``curve`` (the run's); ``after``: the output after its anchor (``outputs_after``), None
    while unknown.  None for the prefill."""
    if trace.mode == "prefill":
        return None
    cands = proposals(trace)
    drafts = len(cands) - 1
    cost = None
    if curve is not None and drafts:
        cost = curve.latency(len(cands) + trace.ptd_rows) / curve.latency(1 + trace.ptd_rows)
    expected = sum(_clamped(cands)[1:])
    would = None if after is None else matched(cands, after)
    return CycleLedger(drafts, len(trace.tree) - 1, expected, cost, len(trace.accepted), would)


def proposals(trace: CycleTrace) -> DraftTree:
    """What the sources proposed in ``trace``'s cycle, as one tree: the candidates GT's size choice chose from, else
    (no size choice ran: the builder's floor had pruned every draft, or a fixed threshold) the verified tree with its
    ghosts hung under their parents."""
    if trace.candidates is not None:
        return trace.candidates
    tree, ghosts = trace.tree, trace.ghosts
    if not ghosts:
        return tree
    return DraftTree(tree.tokens + tuple(g.token for g in ghosts), tree.parents + tuple(g.parent for g in ghosts),
                     tree.sources + tuple(g.source for g in ghosts), tree.scores + tuple(g.score for g in ghosts),
                     tree.est_accept + tuple(g.est_accept for g in ghosts))


def _clamped(tree: DraftTree) -> list[float]:
    """Path estimates clamped never to rise from a parent to its child, as GT's size choice reads them."""
    est = list(tree.est_accept)
    for i in range(1, len(tree)):
        est[i] = min(est[i], est[tree.parents[i]])
    return est


class Pricing(NamedTuple):
    """The run's drafts priced on a curve (``price_on``).

    Attributes:
        tau: predicted tokens per forward (accepted + bonus), over the decode-phase cycles.
        speedup: predicted decode-phase speedup over AR on that curve: Σ tokens / Σ T(rows) × T(1).
        rows: mean rows a forward verifies there.
        cycles: decode-phase cycles priced.
    """

    tau: float
    speedup: float
    rows: float
    cycles: int


def price_on(traces: Sequence[CycleTrace], curve: CostCurve) -> Pricing | None:
    """The run's candidate trees with GT's size choice redone on ``curve`` (λ: the priced cycles' own tokens per ms
    so far, one AR step as its prior, as ``SpecDecoder`` tracks it), each kept tree's outcome read off the output
    (greedy runs only: under sampling the output is one draw and says nothing of the other drafts).  A cycle without
    candidates is an AR step there too.  None when the run has no decode-phase cycle."""
    cycles = [(t, after) for t, after in zip(traces, outputs_after(traces)) if t.mode != "prefill"]
    if not cycles:
        return None
    tokens, ms, rows = 1, curve.latency(1), 0  # the prefill's token and λ's prior: one AR step
    for trace, after in cycles:
        cands = proposals(trace)
        choice = size_choice(cands, curve, trace.ptd_rows, rate=tokens / ms)
        got = min(matched(cands, after, choice.kept) + 1, max(1, len(after)))  # a cut at the run's end stays
        tokens, ms, rows = tokens + got, ms + curve.latency(choice.nodes + trace.ptd_rows), rows + choice.nodes
    decode_tokens, decode_ms = tokens - 1, ms - curve.latency(1)
    return Pricing(decode_tokens / len(cycles), decode_tokens / decode_ms * curve.latency(1), rows / len(cycles),
                   len(cycles))
