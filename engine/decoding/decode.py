"""The decoding loop: draft -> build tree -> verify -> accept -> commit -> learn, one frozen trace per cycle.

Source: Goose paper, Algorithm 2 (GOOSE decoding loop) with the routing of Appendix B.2 and the
confidence-adaptive topology of §4.3.  The same loop runs every method of ``config.METHODS``:
a method only switches draft sources on or off, so AR, PLD-only and TR-only baselines share the
verification, cache and timing code with Goose.  Stages 1-2 (drafting, routing, the tree's shape and GT's size
choice) are the ``Planner``'s (``planner.py``); the records the stages pass are in ``records.py``.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import torch

from ..core import compat
from ..core.estimates import AcceptanceStats
from ..core.forward import EagerPath, ForwardPath
from ..core.tree import DraftTree, Source
from ..core.verify import ReadBack, greedy_walk, hsd_chain_walk, read_back, sample_walk
from ..sources import DraftSource, SourceMemory, make_sources
from .compiled_cycle import CompiledPlanner
from .config import Resolved
from .cost import CostCurve
from .planner import Planner
from .records import Committed, Drafts, Generation, Outcome, Plan, Stopwatch, Walk, ghost_hits
from .sampling import make_rows_warper, make_warper, new_generator
from .trace import CycleTrace


class SpecDecoder:
    """Lossless speculative decoder over a stock transformers causal LM.

    Greedy mode (temperature 0) commits exactly the tokens of ``generate(do_sample=False)``; sampling
    mode commits tokens distributed exactly as ``generate(do_sample=True, ...)`` with the same
    temperature / top-k / top-p (tree walk: PTD App. B-C; chains optionally HSD).

    Every stage reads the one resolved config; the decoder neither measures nor loads a cost curve: the caller
    resolves both (``engine.product.runs.decoder.make_decoder`` does, for the page, the CLI and the bench).

    Args:
        model: ``PreTrainedModel`` with a full-attention KV cache (Llama, Qwen2, Mistral, ...), run on the eager
            forward path; or a ``ForwardPath`` of one (``engine.core.forward``: eager, static, compiled, graphed),
            shared by the model's generations (``self.path``).  Every path gives the same tokens in fp32.
        resolved: a ``Resolved`` config (``DecodeConfig.resolved``): GT "auto" keeps the speedup-optimal top of each
            tree (engine/decoding/gt.py); the builders prune at ``resolved.prune_at``.  ``self.config`` is its
            ``DecodeConfig`` and ``self.resolved`` the whole.
        eos_token_ids: token ids that end generation (included in the output, as ``generate`` does).
        cost_curve: the verification cost curve GT "auto" reads (the one ``resolved`` was made with); None
            when c is a number.  ``self.cost_curve`` is it.
        memory: what draft sources keep across this user's requests (the suffix source's tree of earlier
            outputs), per model; default: one of this decoder's own, so only its own ``generate`` calls share
            it.  Never share one between users.
        profile: stage timings for profiling (``Stopwatch``): on a CUDA device each stage waits for the device
            before its lap, so every kernel is charged to its own stage (one more sync per stage: slower).  Off
            (default), or on a CPU, nothing waits beyond the cycle's one read-back.

    Raises:
        compat.UnsupportedModelError: a model tree verification cannot serve (``compat.model_problem``: its
            attention kernel, ALiBi positions, recurrent or shared-KV layers), before any forward; one sentence.
        ValueError: ``resolved`` is no ``Resolved``, or GT "auto" has no ``cost_curve``.
    """

    def __init__(self, model, resolved: Resolved, eos_token_ids: Iterable[int] = (),
                 cost_curve: CostCurve | None = None, memory: SourceMemory | None = None,
                 profile: bool = False) -> None:
        self.path = model if isinstance(model, ForwardPath) else EagerPath(model)  # how trees are run
        model = self.path.model
        compat.check_model(model)  # first: what cannot be served says why
        if not isinstance(resolved, Resolved):
            raise ValueError("the decoder takes a resolved config: config.resolved(cost_curve) "
                             "(engine.product.runs.decoder.make_decoder resolves both)")
        config = resolved.config
        if config.gt.auto and cost_curve is None:
            raise ValueError("GT 'auto' sizes trees from a cost curve: give the one the config was resolved with")
        self.positions = compat.PositionLimits.of(model)  # trees are trimmed to these (``Planner.build``)
        self.model = model
        device = torch.device(model.device)
        self._sync = device if profile and device.type == "cuda" else None  # Stopwatch(sync): profiling on CUDA
        self.extra_rows = config.extra_rows  # rows that ride along in every forward (PTD)
        self.cost_curve = cost_curve
        self.config, self.resolved = config, resolved
        self.planner = Planner(resolved, cost_curve, self.positions, self.extra_rows)  # stages 1-2 and 6
        # a run the compiled planner serves plans with it (``CompiledPlanner.covers``: the default Goose configuration,
        # one compiled call a cycle); False plans every run in Python: the same trees and tokens, more host time
        self.compiled = True
        # what sources keep across requests, per model (the page's model picker may switch models)
        self.memory = (memory if memory is not None else SourceMemory()).scope(str(getattr(model, "name_or_path", "")))
        self.eos = frozenset(int(t) for t in eos_token_ids)
        self.priority = tuple(Source(s) for s in config.tree.walk_priority)
        self.warp = make_warper(config) if config.sampling else None
        # sampling on an accelerator: the tree rows' distributions come back with the cycle's one read-back (one
        # copy); on a CPU, where nothing is copied, only the rows the walk visits are warped, lazily
        self.warp_rows = make_rows_warper(config) if config.sampling and device.type != "cpu" else None

    def generate(self, prompt_ids: list[int], should_stop: Callable[[], bool] | None = None) -> Iterator[CycleTrace]:
        """Yield one ``CycleTrace`` per forward (prefill first) until EOS, max new tokens or ``should_stop()``.

        Raises:
            ValueError: empty prompt.
            compat.UnsupportedModelError: prompt + max new tokens pass the model's context or sliding window
                (``compat.PositionLimits.problem``); one sentence with the remedy.
        """
        if not prompt_ids:
            raise ValueError("the prompt is empty: give at least one token")
        problem = self.positions.problem(len(prompt_ids), self.config.max_new_tokens)
        if problem:
            raise compat.UnsupportedModelError(problem)
        gen, planner, trace = self._prefill(list(prompt_ids))
        yield trace
        while not trace.finished and not (should_stop and should_stop()):
            clock = Stopwatch(self._sync)
            drafts = planner.draft(gen)  # 1. draft: every source's candidates for the anchor
            clock.lap("draft")
            plan = planner.build(gen, drafts)  # 2. build: bypass chain, spine tree or AR (+ ride-along rows)
            clock.lap("build")
            logits = gen.forward.verify(plan.grafted.padded(plan.rows))[: len(plan.grafted)]  # 3. verify: (n, |V|)
            observers = [src for src, _ in drafts.proposals]  # a resting source reads nothing back
            back = read_back(logits, self._read_k(observers), self._probs(plan, logits))  # the cycle's one host sync
            clock.lap("forward")
            walk = self._accept(gen, plan, logits, back.greedy[: len(plan.tree)], back.probs)  # 4. accept
            clock.lap("walk")
            done = self._commit(gen, plan, walk, clock)  # 5. commit: the accepted path's cache rows, the tokens
            planner.learn(gen, plan, back, walk, done)  # 6. learn: sources observe, estimates update
            clock.lap("harvest")
            trace = self._trace(gen, drafts, plan, back, Outcome(walk, done), clock.total())
            yield trace

    # -- stages -------------------------------------------------------------------------------

    @torch.no_grad()
    def _prefill(self, prompt: list[int]) -> tuple[Generation, Planner | CompiledPlanner, CycleTrace]:
        """Alg. 2 lines 1-3: one forward over the prompt, its rows read back for the sources, first token = argmax;
        then the generation's planner: the compiled one where it serves the run (``CompiledPlanner.covers``), which
        plans the first cycle at once, else ``self.planner``."""
        cfg, clock = self.config, Stopwatch(self._sync)
        stats = AcceptanceStats(ema_alpha=cfg.tree.ema_alpha, p_s_ema=cfg.tree.ema_init,
                                counterfactual=cfg.gt.counterfactual_rates and cfg.gt.auto)
        forward = self.path.open(len(prompt) + cfg.max_new_tokens, cfg.max_budget + self.extra_rows)
        gen = Generation(forward=forward, tokens=list(prompt), sources=make_sources(cfg, stats, self.memory),
                             stats=stats)
        if cfg.sampling:
            gen.generator = new_generator(cfg.sampler.seed)
        logits = forward.prefill(prompt)  # (L, |V|)
        if cfg.sampling:  # the first token, sampled as generate() samples it
            first = int(torch.multinomial(self.warp(logits[-1]), 1, generator=gen.generator))
        else:
            first = int(logits[-1].argmax())
        clock.lap("forward")
        k = self._read_k(gen.sources)
        back = read_back(logits, k) if k else None  # (L rows): every prompt row's successors, when a source reads them
        for src in gen.sources:
            src.prefill(prompt, back)
        done = self._append(gen, [first])
        planner = self.planner
        if self.compiled and CompiledPlanner.covers(self.resolved, self.cost_curve, self.positions, len(prompt)):
            planner = CompiledPlanner(self.resolved, self.cost_curve, gen, prompt, back, logits.shape[-1])
        gen.planned_by = planner.name
        clock.lap("harvest")
        timings = clock.total()
        gen.busy_s = timings["total"] / 1000
        return gen, planner, CycleTrace(
            index=0, mode="prefill", tree=DraftTree.root_only(prompt[-1]), ghosts=(), greedy=(first,), accepted=(),
            bonus=first, new_tokens=done.tokens, spine_ratio=None, p_s_ema=stats.p_s_ema, timings_ms=timings,
            elapsed_s=gen.busy_s, total_tokens=len(gen.output), finished=done.finished, planner=gen.planned_by)

    def _probs(self, plan: Plan, logits: torch.Tensor) -> torch.Tensor | None:
        """Sampling on an accelerator: (n, |V|) float32 warped distributions of the tree's n rows, still on the
        device, for ``read_back`` to copy with the rest; None otherwise (greedy, or a CPU: ``_accept`` warps)."""
        return self.warp_rows(logits[: len(plan.tree)]) if self.warp_rows is not None else None

    def _accept(self, s: Generation, plan: Plan, logits: torch.Tensor, greedy: list[int],
                probs: torch.Tensor | None = None) -> Walk:
        """Greedy: Goose Alg. 3.  Sampling: HSD on chains when selected, else the recursive tree sampling, over
        ``probs`` (the tree rows' distributions, read back on the host) when given, else rows of ``logits`` warped
        as the walk visits them (the same values: ``sampling.make_rows_warper``)."""
        if not self.config.sampling:
            return Walk(*greedy_walk(plan.tree, greedy, self.priority))
        dists: dict[int, torch.Tensor] = {}

        def dist(node: int) -> torch.Tensor:  # (|V|,) float64 warped target distribution, computed once
            if node not in dists:
                dists[node] = probs[node].double() if probs is not None else self.warp(logits[node])
            return dists[node]

        if self.config.sampler.verifier == "hsd" and plan.mode == "bypass":
            return Walk(*hsd_chain_walk(plan.tree, dist, s.generator))
        return Walk(*sample_walk(plan.tree, dist, s.generator, self.priority))

    def _commit(self, s: Generation, plan: Plan, walk: Walk, clock: Stopwatch) -> Committed:
        """Alg. 2 line 15: keep the accepted path's KV rows, append the accepted tokens and the bonus."""
        s.forward.commit([0, *walk.accepted])
        clock.lap("cache")
        return self._append(s, [*(plan.tree.tokens[i] for i in walk.accepted), walk.bonus])

    def _append(self, s: Generation, tokens: list[int]) -> Committed:
        """Append tokens to the output, cut at the first EOS and at ``max_new_tokens``."""
        room = self.config.max_new_tokens - len(s.output)
        kept = tokens[:room]
        eos_at = next((i for i, t in enumerate(kept) if t in self.eos), None)
        if eos_at is not None:
            kept = kept[: eos_at + 1]
        s.output.extend(kept)
        s.tokens.extend(kept)
        return Committed(tuple(kept), eos_at is not None or len(s.output) >= self.config.max_new_tokens)

    def _read_k(self, sources: Iterable[DraftSource]) -> int:
        """Successors per row a read-back carries: the most any of ``sources`` (those observing it) needs."""
        return max((src.top_k for src in sources), default=0)

    def _trace(self, s: Generation, drafts: Drafts, plan: Plan, back: ReadBack, outcome: Outcome,
               timings: dict[str, float]) -> CycleTrace:
        """Close the cycle's books and freeze its record."""
        walk, done = outcome.walk, outcome.done
        s.cycles += 1
        s.busy_s += timings["total"] / 1000
        return CycleTrace(
            index=s.cycles, mode=plan.mode, tree=plan.tree, ghosts=plan.ghosts,
            greedy=tuple(back.greedy[: len(plan.tree)]), accepted=walk.accepted, bonus=walk.bonus,
            new_tokens=done.tokens, spine_ratio=plan.spine_ratio, p_s_ema=s.stats.p_s_ema, timings_ms=timings,
            elapsed_s=s.busy_s, total_tokens=len(s.output), finished=done.finished,
            ptd_rows=len(plan.grafted) - len(plan.tree), pad_rows=plan.rows - len(plan.grafted),
            confidence=drafts.confidence, match_tokens=len(drafts.chain), chain_tokens=plan.chain_tokens,
            budget=plan.budget, resting=tuple(src.info.name for src in drafts.resting),
            candidates=plan.candidates, ghost_hits=() if self.config.sampling else ghost_hits(plan, walk, back.greedy),
            planner=s.planned_by,
            **(plan.gt.trace_fields() if plan.gt else {}))
