"""The decoding loop: draft -> build tree -> verify -> accept -> commit -> learn, one frozen trace per cycle.

Source: Goose paper, Algorithm 2 (GOOSE decoding loop) with the routing of Appendix B.2 and the
confidence-adaptive topology of §4.3.  The same loop runs every method of ``config.METHODS``:
a method only switches draft sources on or off, so AR, PLD-only and TR-only baselines share the
verification, cache and timing code with Goose.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace

import torch

from ..core import compat
from ..core.estimates import AcceptanceStats, spine_ratio_tier
from ..core.forward import EagerPath, ForwardPath, TreeForward
from ..core.tree import DraftTree, Source
from ..core.verify import ReadBack, greedy_walk, hsd_chain_walk, read_back, sample_walk
from ..sources import Candidates, DraftSource, Request, Role, SourceMemory, Verified, make_sources
from ..sources.base import extend_chain
from .config import CANDIDATE_TREE_METHODS, Resolved
from .cost import CostCurve
from .gt import calibrated_choice
from .records import Committed, Drafts, Outcome, Plan, Walk, fit_to_room, ghost_hits
from .sampling import make_rows_warper, make_warper, new_generator
from .spine_tree import Built, Proposals, build_candidate_tree, build_chain, build_isotropic_tree, build_spine_tree
from .trace import CycleTrace


@dataclass
class Generation:
    """Mutable state of one generation; never shared between generations or users."""

    forward: TreeForward  # the model on this generation's trees; owns its KV cache and committed length
    tokens: list[int]  # prompt + generated tokens: the context sources are asked about
    sources: tuple[DraftSource, ...]  # this generation's draft sources (engine/sources)
    stats: AcceptanceStats
    generator: torch.Generator | None = None  # sampling mode: every random draw of this generation
    output: list[int] = field(default_factory=list)
    cycles: int = 0
    busy_s: float = 0.0  # engine time so far (s): prefill + every cycle, time spent by the consumer excluded
    curve_ms: float = 0.0  # verification time of every cycle so far by the cost curve (ms), for the GT rate λ
    streak: int = 0  # cycles in a row whose drafts the size choice priced down to the anchor (``_resting``)

    @property
    def past_len(self) -> int:
        """Committed cache positions (the prompt and every committed token before the anchor)."""
        return self.forward.length

    @property
    def anchor(self) -> int:
        return self.tokens[-1]

    @property
    def prev(self) -> int | None:
        return self.tokens[-2] if len(self.tokens) > 1 else None


class Stopwatch:
    """Stage timings of one cycle, in ms: ``lap(stage)`` charges the time since the previous lap to ``stage``.

    ``sync`` (profiling on a CUDA device): every lap first waits for that device (``torch.cuda.synchronize``),
    so a kernel is charged to the stage that enqueued it, at the price of one more host sync per stage.  None
    (the default): no waiting; a stage's kernels that are still running when it ends are charged to the next
    stage that waits for the device (the forward's read-back).
    """

    def __init__(self, sync: torch.device | None = None) -> None:
        self.sync = sync
        self.start = self.last = time.perf_counter()
        self.ms: dict[str, float] = {}

    def lap(self, stage: str) -> None:
        if self.sync is not None:
            torch.cuda.synchronize(self.sync)
        now = time.perf_counter()
        self.ms[stage] = self.ms.get(stage, 0.0) + (now - self.last) * 1000.0
        self.last = now

    def total(self) -> dict[str, float]:
        """The laps plus ``total`` (ms since the stopwatch started)."""
        return {**self.ms, "total": (time.perf_counter() - self.start) * 1000.0}


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
        self.positions = compat.PositionLimits.of(model)  # trees are trimmed to these (``_build``)
        self.model = model
        device = torch.device(model.device)
        self._sync = device if profile and device.type == "cuda" else None  # Stopwatch(sync): profiling on CUDA
        self.extra_rows = config.extra_rows  # rows that ride along in every forward (PTD)
        self.cost_curve = cost_curve
        self.config, self.resolved = config, resolved
        self._rate_tracked = config.gt.auto and config.gt.rate == "session"  # λ is tracked
        self._ar_ms = cost_curve.latency(1 + self.extra_rows) if self._rate_tracked else None  # λ's prior: one AR step
        # what sources keep across requests, per model (the page's model picker may switch models)
        self.memory = (memory if memory is not None else SourceMemory()).scope(str(getattr(model, "name_or_path", "")))
        self.eos = frozenset(int(t) for t in eos_token_ids)
        self.priority = tuple(Source(s) for s in config.tree.walk_priority)
        # candidates asked of a source at once: the largest tree, or the longest chain a lookup copies
        self._draft_budget = max(config.max_budget - 1, config.tree.max_spine)
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
        gen, trace = self._prefill(list(prompt_ids))
        yield trace
        while not trace.finished and not (should_stop and should_stop()):
            clock = Stopwatch(self._sync)
            drafts = self._draft(gen)  # 1. draft: every source's candidates for the anchor
            clock.lap("draft")
            plan = self._build(gen, drafts)  # 2. build: bypass chain, spine tree or AR (+ ride-along rows)
            clock.lap("build")
            logits = gen.forward.verify(plan.grafted.padded(plan.rows))[: len(plan.grafted)]  # 3. verify: (n, |V|)
            observers = [src for src, _ in drafts.proposals]  # a resting source reads nothing back
            back = read_back(logits, self._read_k(observers), self._probs(plan, logits))  # the cycle's one host sync
            clock.lap("forward")
            walk = self._accept(gen, plan, logits, back.greedy[: len(plan.tree)], back.probs)  # 4. accept
            clock.lap("walk")
            done = self._commit(gen, plan, walk, clock)  # 5. commit: the accepted path's cache rows, the tokens
            self._learn(gen, plan, back, walk, done, clock)  # 6. learn: sources observe, estimates update
            trace = self._trace(gen, drafts, plan, back, Outcome(walk, done), clock.total())
            yield trace

    # -- stages -------------------------------------------------------------------------------

    @torch.no_grad()
    def _prefill(self, prompt: list[int]) -> tuple[Generation, CycleTrace]:
        """Alg. 2 lines 1-3: one forward over the prompt, its rows read back for the sources, first token = argmax."""
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
        clock.lap("harvest")
        timings = clock.total()
        gen.busy_s = timings["total"] / 1000
        return gen, CycleTrace(
            index=0, mode="prefill", tree=DraftTree.root_only(prompt[-1]), ghosts=(), greedy=(first,), accepted=(),
            bonus=first, new_tokens=done.tokens, spine_ratio=None, p_s_ema=stats.p_s_ema, timings_ms=timings,
            elapsed_s=gen.busy_s, total_tokens=len(gen.output), finished=done.finished)

    def _draft(self, s: Generation) -> Drafts:
        """Alg. 2 line 5: every source's candidates for the anchor; the spine goes to the spine source offering the
        longest chain (its candidates' main path), or the longest match (``TreeShape.spine_rule``); ties go to
        ``REGISTRY`` order, PLD first."""
        cfg, resting = self.config, self._resting(s)
        proposals = tuple((src, src.propose(Request(s.tokens, (), self._draft_budget))) for src in s.sources
                          if src not in resting)
        chains = [(src, c.main_chain()) for src, c in proposals if src.info.role is Role.SPINE and len(c)]
        if not chains:
            return Drafts(proposals, resting=resting)
        by_chain = cfg.tree.spine_rule == "longest-chain"
        spine, chain = max(chains, key=lambda pair: len(pair[1]) if by_chain else pair[1].match)  # ties: the first
        return Drafts(proposals, spine, chain, resting)

    def _resting(self, s: Generation) -> tuple[DraftSource, ...]:
        """GT's promise on a steep curve (``GtConfig.rest_after`` = k, GT "auto"): after k cycles in a row that the
        size choice priced down to the anchor, the branch sources rest in all but every k-th cycle until a draft is
        verified again: they draft nothing, their top-k successors are not read back and they observe nothing.  A
        node's cost includes harvesting its row (GT principle paper, §3.1 Eq. 6), and a harvest feeds only trees
        that no longer pay; the k-th cycles keep the estimates and the calibration learning."""
        k = self.config.gt.rest_after
        rest = bool(k and self.config.gt.auto and s.streak >= k and s.streak % k)
        return tuple(src for src in s.sources if rest and src.info.role is Role.BRANCH)

    def _build(self, s: Generation, drafts: Drafts) -> Plan:
        """Draft tree for this cycle, then the rows sources ride along grafted under its root (PTD §3.2).  Nothing
        deeper than the model's positions allow this cycle (``compat.PositionLimits.room``): the tree is trimmed, and
        ride-along rows that would pass the limit sit this forward out (their source does not observe it)."""
        room = self.positions.room(s.past_len)
        plan = self._choose_size(s, fit_to_room(self._route(s, drafts), room))  # GT "auto": the speedup-optimal top
        grafted, left_out = plan.tree, list(drafts.resting)
        for src, cands in drafts.proposals:  # the rows sources ride along
            trial = grafted.graft(list(cands.rows.tokens), list(cands.rows.parents), cands.rows.tag)
            if room is not None and max(trial.depths[len(grafted):], default=0) > room:
                left_out.append(src)
                continue
            grafted = trial
        pad = self.cost_curve is not None and (room is None or room >= 1)  # a slow size: padded, rows at depth 1
        rows = self.cost_curve.verify_rows(len(grafted)) if pad else len(grafted)
        return replace(plan, grafted=grafted, left_out=tuple(left_out), rows=rows)

    def _route(self, s: Generation, drafts: Drafts) -> Plan:
        """Alg. 2 lines 6-13: bypass (``Variant.bypass_rule``), else a tree shaped by the match confidence, else AR.
        The ptd and suffix methods verify their source's candidate tree alone."""
        cfg, chain = self.config, drafts.chain
        built: Built | None = None
        mode, r, budget = "ar", None, None
        if cfg.method in CANDIDATE_TREE_METHODS:
            src, cands = drafts.proposals[0]
            mode, built = "tree", build_candidate_tree(s.anchor, src.info.source, cands, cfg, self.resolved.prune_at)
        elif len(chain) and (cfg.drafts_alone or self._bypass(drafts)):  # alone: a spine source's chain (PLD)
            mode, built = "bypass", build_chain(s.anchor, chain, drafts.spine.info.source, self.resolved.prune_at)
        elif drafts.any() or cfg.iso_k is not None:
            budget, r, chain = self._shape(s, drafts)
            proposals = self._proposals(s, drafts, chain)
            if cfg.iso_k is not None:
                r = None
                if not cfg.variant.iso_spine:
                    proposals = replace(proposals, spine=Candidates())
                built = build_isotropic_tree(proposals, cfg, cfg.iso_k, budget, self.resolved.prune_at)
            else:
                built = build_spine_tree(proposals, cfg, r, budget, self.resolved.prune_at)
            mode = "tree"
        if built is None or len(built.tree) == 1:  # nothing to verify beyond the anchor: plain AR step
            return Plan("ar", DraftTree.root_only(s.anchor), built.ghosts if built else ())
        return Plan(mode, built.tree, built.ghosts, r, budget=budget, chain_tokens=len(chain))

    def _proposals(self, s: Generation, drafts: Drafts, chain: Candidates) -> Proposals:
        """Alg. 1's inputs: the spine's ``chain``; the anchor candidates of pool sources and what spine sources
        offer off the spine (the losing spine sources' whole candidates); the branch sources."""
        pool = []
        for src, cands in drafts.proposals:
            if src.info.role is Role.POOL or (src.info.role is Role.SPINE and src is not drafts.spine and len(cands)):
                pool.append((src.info.source, cands))
            elif src is drafts.spine and len(cands) > len(cands.main_path):
                pool.append((src.info.source, cands))  # its branches off the main path (merged into the spine)
        branch = tuple(src for src, _ in drafts.proposals if src.info.role is Role.BRANCH)
        return Proposals(s.tokens, chain, drafts.spine.info.source if drafts.spine else None, tuple(pool), branch)

    def _bypass(self, drafts: Drafts) -> bool:
        """Whether this cycle verifies the bare spine chain (§4.3 bypass), per ``Variant.bypass_rule``;
        "no-adjacency": no branch source has successors of the anchor."""
        cfg = self.config
        if not cfg.tree.bypass:
            return False
        if cfg.variant.bypass_rule == "no-adjacency":
            return not any(len(c) for src, c in drafts.proposals if src.info.role is Role.BRANCH)
        return cfg.iso_k is None and (len(drafts.chain) >= cfg.tree.bypass_threshold or drafts.chain.consensus)

    def _shape(self, s: Generation, drafts: Drafts) -> tuple[int, float, Candidates]:
        """§4.3 confidence schedule, as the authors' code applies it: budget ``B + int(m * budget_extension)``,
        spine ratio ``r + m (1 - r)`` (r from the EMA tier, or fixed), and, when m > ``extend_above``, the
        chain grown by asking the spine source again below it, to ``int(max_extended_chain * m)`` tokens (a
        saturated match, m = 1, only while each further match is saturated too), and no longer than
        ``Resolved.chain_cap`` (a forward within ``gt.chain_steps`` AR steps; never shorter than the match).  Returns
        (budget, r, chain); with the schedule off, m = 0: (B, r, the match)."""
        shape, variant, cap = self.config.tree, self.config.variant, self.resolved.chain_cap
        m = drafts.confidence if variant.confidence_schedule else 0.0
        r = shape.spine_ratio if shape.spine_ratio is not None else spine_ratio_tier(s.stats.p_s_ema)
        chain = drafts.chain
        limit = int(variant.max_extended_chain * m) if cap is None else min(int(variant.max_extended_chain * m), cap)
        if len(chain) and m > variant.extend_above and limit > len(chain):
            chain = extend_chain(drafts.spine, s.tokens, chain, limit, self._draft_budget, saturated=m >= 1.0)
            if cap is not None and len(chain) > cap:  # the last lookup overshot the cap
                chain = Candidates.chain(chain.tokens[:cap], chain.p[:cap], match=chain.match,
                                         confidence=chain.confidence, consensus=chain.consensus)
        return shape.budget + int(m * variant.budget_extension), r + m * (1.0 - r), chain

    def _choose_size(self, s: Generation, plan: Plan) -> Plan:
        """GT principle §3 with the whole cost curve (``gt_threshold`` "auto"): keep the top-n* nodes of
        the built tree, n* maximising expected (accepted + 1) − λ T(n), λ the generation's rate (``gt_rate``
        "session"), or (accepted + 1) / T(n) ("cycle"); AR when n* = 1.  With ``path_calibration`` the estimates
        are first mapped through this generation's measured outcomes (``gt.calibrated_choice``); the built tree is
        kept for that until the output decides it."""
        if not self.config.gt.auto or plan.mode == "ar":
            return plan
        calibration = s.stats.paths if self.resolved.path_calibration else None
        tree, ghosts, choice, trusted = calibrated_choice(plan.tree, self.cost_curve, self.extra_rows, calibration,
                                                          rate=self._rate(s), ghosts=plan.ghosts)
        built = plan.tree if calibration is not None or s.stats.counterfactual else None
        priced_out = {"mode": "ar", "spine_ratio": None} if len(tree) == 1 else {}  # AR when n* = 1
        candidates = plan.tree.with_estimates(choice.read)  # the drafts as GT priced them (the ledger's replay)
        return replace(plan, tree=tree, ghosts=ghosts, gt=choice, built=built, trusted=trusted, candidates=candidates,
                       **priced_out)

    def _rate(self, s: Generation) -> float | None:
        """λ for the size choice (``gt_rate`` "session"): tokens committed per ms of verification so far, the
        cycles' times read off the cost curve (so a run's trees depend on the curve, not the machine's load),
        one AR step as the prior.  None for "cycle": each tree's own ratio."""
        if not self._rate_tracked:
            return None
        return len(s.output) / (s.curve_ms + self._ar_ms)  # output[0]: the prefill's token

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

    def _learn(self, s: Generation, plan: Plan, back: ReadBack, walk: Walk, done: Committed,
               clock: Stopwatch) -> None:
        """Alg. 2 line 16: every source observes the forward; the acceptance estimates and the GT rate update."""
        at = len(s.tokens) - len(done.tokens)  # where this cycle's tokens start; the anchor is at at - 1
        if plan.built is not None:  # the whole built tree, pruned nodes too, is judged by the output to come
            s.stats.paths.record(plan.built, at, plan.trusted.kept if plan.trusted else (),
                                 plan.trusted.expected if plan.trusted else 0.0)
        verified = Verified(forward=plan.grafted, tree_rows=len(plan.tree), prev=s.tokens[at - 2] if at > 1 else None,
                            back=back, accepted=walk.accepted, committed=done.tokens, output=s.output,
                            finished=done.finished)
        for src in s.sources:  # every row, rejected branches and ride-along rows included (C.1)
            if not any(src is out for out in plan.left_out):
                src.observe(verified)
        s.stats.update(plan.tree, walk.accepted, ema=plan.mode == "tree" or self.config.variant.ema_on_chains)
        s.streak = s.streak + 1 if plan.mode == "ar" else 0
        if s.stats.paths.pending:
            s.stats.paths.resolve(s.tokens, s.stats if s.stats.counterfactual else None, self.resolved.path_calibration)
        if self._rate_tracked:
            s.curve_ms += self.cost_curve.latency(len(plan.grafted))
        clock.lap("harvest")

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
            **(plan.gt.trace_fields() if plan.gt else {}))
