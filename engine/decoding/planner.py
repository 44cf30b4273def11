"""Stages 1-2 and 6 of a decoding cycle: every source's drafts for the anchor, then the plan the forward verifies (the
bypass chain, a spine tree sized by GT, or an AR step, with the rows sources ride along); after the forward, what the
sources and the estimates learn from it.

Source: Goose paper, Algorithm 2 lines 5-13 (routing: Appendix B.2; the confidence schedule: §4.3) and Algorithm 1
(``spine_tree``), line 16 (learning); GT principle paper, §3 (the size choice: ``gt``).  ``decode.SpecDecoder`` owns
one ``Planner`` and runs the loop around it; ``compiled_cycle.CompiledPlanner`` runs the same three stages compiled,
for the runs it serves.
"""
from __future__ import annotations

from dataclasses import replace

from ..core import compat
from ..core.estimates import spine_ratio_tier
from ..core.tree import DraftTree
from ..core.verify import ReadBack
from ..sources import Candidates, DraftSource, Request, Role, Verified
from ..sources.base import extend_chain
from .config import CANDIDATE_TREE_METHODS, Resolved
from .cost import CostCurve
from .gt import calibrated_choice
from .records import Committed, Drafts, Generation, Plan, Walk, fit_to_room
from .spine_tree import Built, Proposals, build_candidate_tree, build_chain, build_isotropic_tree, build_spine_tree


class Planner:
    """What a cycle verifies, from one resolved config: ``draft`` (stage 1) and ``build`` (stage 2); and ``learn``
    (stage 6).

    Args:
        resolved: the run's ``Resolved`` config (``config`` its ``DecodeConfig``).
        cost_curve: the verification cost curve GT "auto" reads; None when c is a number.
        positions: the model's position limits (trees are trimmed to them).
        extra_rows: rows that ride along in every forward (PTD).
    """

    name = "python"  # the trace's ``planner``

    def __init__(self, resolved: Resolved, cost_curve: CostCurve | None, positions: compat.PositionLimits,
                 extra_rows: int) -> None:
        config = resolved.config
        self.config, self.resolved, self.cost_curve = config, resolved, cost_curve
        self.positions, self.extra_rows = positions, extra_rows
        self.rate_tracked = config.gt.auto and config.gt.rate == "session"  # λ is tracked
        self._ar_ms = cost_curve.latency(1 + extra_rows) if self.rate_tracked else None  # λ's prior: one AR step
        # candidates asked of a source at once: the largest tree, or the longest chain a lookup copies
        self._draft_budget = max(config.max_budget - 1, config.tree.max_spine)

    def draft(self, s: Generation) -> Drafts:
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

    def build(self, s: Generation, drafts: Drafts) -> Plan:
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
        calibration = s.paths if self.resolved.path_calibration else None
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
        if not self.rate_tracked:
            return None
        return len(s.output) / (s.curve_ms + self._ar_ms)  # output[0]: the prefill's token

    def learn(self, s: Generation, plan: Plan, back: ReadBack, walk: Walk, done: Committed) -> None:
        """Alg. 2 line 16: every source observes the forward; the acceptance estimates and the GT rate update."""
        at = len(s.tokens) - len(done.tokens)  # where this cycle's tokens start; the anchor is at at - 1
        if plan.built is not None:  # the whole built tree, pruned nodes too, is judged by the output to come
            s.paths.record(plan.built, at, plan.trusted.kept if plan.trusted else (),
                           plan.trusted.expected if plan.trusted else 0.0)
        verified = Verified(forward=plan.grafted, tree_rows=len(plan.tree), prev=s.tokens[at - 2] if at > 1 else None,
                            back=back, accepted=walk.accepted, committed=done.tokens, output=s.output,
                            finished=done.finished)
        for src in s.sources:  # every row, rejected branches and ride-along rows included (C.1)
            if not any(src is out for out in plan.left_out):
                src.observe(verified)
        s.stats.update(plan.tree, walk.accepted, ema=plan.mode == "tree" or self.config.variant.ema_on_chains)
        s.streak = s.streak + 1 if plan.mode == "ar" else 0
        if s.paths.pending:
            s.paths.resolve(s.tokens, s.stats if s.stats.counterfactual else None, self.resolved.path_calibration)
        if self.rate_tracked:
            s.curve_ms += self.cost_curve.latency(len(plan.grafted))
