"""The decoding loop: draft -> build tree -> verify -> accept -> commit, one frozen trace per cycle.

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

from . import kv_cache
from .adjacency import AdjacencyTable
from .config import DecodeConfig
from .context_match import NgramIndex, PldMatch, match_confidence
from .cost import CostCurve, cached_cost_curve
from .estimates import AcceptanceStats, spine_ratio_tier
from .gt import GtChoice, speedup_optimal
from .ptd import CandidatePool, ProgressiveTree, Trie
from .sampling import make_warper, new_generator
from .spine_tree import Built, build_chain, build_isotropic_tree, build_ptd_tree, build_spine_tree
from .trace import CycleTrace
from .tree import DraftTree, Source
from .verify import ReadBack, forward_tree, greedy_walk, hsd_chain_walk, read_back, sample_walk


@dataclass
class Drafts:
    """Output of stage 1: what the draft sources propose for the current anchor."""

    pld: PldMatch  # PLD context match (empty when PLD is off)
    ptd: Trie | None = None  # PTD candidate tree for the anchor (None when PTD is off or has none)
    confidence: float = 0.0  # Goose §4.3 confidence of the match in [0, 1] (context_match.match_confidence)


@dataclass
class Plan:
    """What one cycle verifies (output of stages 1-2)."""

    mode: str  # bypass | tree | ar
    tree: DraftTree  # the draft tree the walk verifies
    ghosts: tuple
    spine_ratio: float | None = None
    forward: DraftTree | None = None  # ``tree`` plus PTD drafting rows when PTD is on (what the forward sees)
    budget: int | None = None  # node budget the tree was built with (None: bypass chain or AR step)
    chain_tokens: int = 0  # PLD chain offered to the tree: the match, extended on a confident cycle
    gt: GtChoice | None = None  # the speedup-optimal size choice (gt_threshold "auto"), None otherwise


@dataclass
class Session:
    """Mutable state of one generation; never shared between generations or users."""

    cache: object  # transformers DynamicCache (see kv_cache)
    index: NgramIndex  # prompt + generated tokens, n-gram indexed
    table: AdjacencyTable | None
    stats: AcceptanceStats
    ptd: ProgressiveTree | None = None  # PTD drafting tree T (PTD §3.2), when PTD is on
    pool: CandidatePool | None = None  # PTD candidate pool, when PTD is on
    generator: torch.Generator | None = None  # sampling mode: every random draw of this generation
    output: list[int] = field(default_factory=list)
    past_len: int = 0
    cycles: int = 0
    busy_s: float = 0.0  # engine time so far (s): prefill + every cycle, time spent by the consumer excluded

    @property
    def anchor(self) -> int:
        return self.index.tokens[-1]

    @property
    def prev(self) -> int | None:
        return self.index.tokens[-2] if len(self.index.tokens) > 1 else None


class SpecDecoder:
    """Lossless speculative decoder over a stock transformers causal LM.

    Greedy mode (temperature 0) commits exactly the tokens of ``generate(do_sample=False)``; sampling
    mode commits tokens distributed exactly as ``generate(do_sample=True, ...)`` with the same
    temperature / top-k / top-p (tree walk: PTD App. B-C; chains optionally HSD).

    Args:
        model: ``PreTrainedModel`` with a full-attention KV cache (Llama, Qwen2, Mistral, ...).
        config: ``DecodeConfig``.  ``gt_threshold`` "auto" keeps the speedup-optimal top of each tree
            (engine/gt.py) and stays "auto"; "chord" is resolved here to the number c it gives.
        eos_token_ids: token ids that end generation (included in the output, as ``generate`` does).
        cost_curve: the verification cost curve "auto" / "chord" read (e.g. a page session's own
            re-measured curve, or ``cost.load_cost_curve`` to reproduce a run); default: the model's
            shared curve (measured once per model, device, dtype and torch version, cached on disk).
            ``self.cost_curve`` is the curve in use (None when c is a number and none was given).
    """

    def __init__(self, model, config: DecodeConfig, eos_token_ids: Iterable[int] = (),
                 cost_curve: CostCurve | None = None) -> None:
        self.model = model
        self.extra_rows = config.ptd_rows if config.use_ptd else 0  # PTD rows ride along in every forward
        if cost_curve is None and config.gt_threshold in ("auto", "chord"):
            cost_curve = cached_cost_curve(model)
        self.cost_curve = cost_curve
        if config.gt_threshold == "chord":  # one c from the curve's chord at B (GT §3.1, Eq. 9)
            config = config.with_(gt_threshold=cost_curve.threshold(config.budget, self.extra_rows))
        self.config = config  # gt_threshold: "auto" or the number c in use
        self.eos = frozenset(int(t) for t in eos_token_ids)
        self.priority = tuple(Source(s) for s in config.walk_priority)
        self.warp = make_warper(config) if config.sampling else None

    def generate(self, prompt_ids: list[int], should_stop: Callable[[], bool] | None = None) -> Iterator[CycleTrace]:
        """Yield one ``CycleTrace`` per forward (prefill first) until EOS, max new tokens or ``should_stop()``.

        Raises:
            ValueError: empty prompt.
            kv_cache.UnsupportedCacheError: the model's cache cannot be compacted to a tree path.
        """
        if not prompt_ids:
            raise ValueError("the prompt is empty: give at least one token")
        session, trace = self._prefill(list(prompt_ids))
        yield trace
        while not trace.finished and not (should_stop and should_stop()):
            t = {}
            t_start = time.perf_counter()
            drafts = self._draft(session)  # 1. draft: PLD context match, PTD candidate tree
            t["draft"] = _ms(t_start)
            plan = self._build(session, drafts)  # 2. build: bypass chain, spine tree or AR (+ PTD rows)
            t["build"] = _ms(t_start) - t["draft"]
            logits = forward_tree(self.model, session.cache, plan.forward, session.past_len)  # 3. verify
            back = read_back(logits, self.config.top_k if session.table is not None else 0)  # the one host sync
            greedy = back.greedy[: len(plan.tree)]  # (n,) target greedy token at the draft tree's rows
            t["forward"] = _ms(t_start) - t["draft"] - t["build"]
            accepted, bonus = self._accept(session, plan, logits, greedy)  # 4. accept
            t["walk"] = _ms(t_start) - sum(t.values())
            new_tokens, finished = self._commit(session, plan, back, accepted, bonus, t)  # 5. commit
            t["total"] = _ms(t_start)
            session.cycles += 1
            session.busy_s += t["total"] / 1000
            trace = CycleTrace(
                index=session.cycles, mode=plan.mode, tree=plan.tree, ghosts=plan.ghosts, greedy=tuple(greedy),
                accepted=accepted, bonus=bonus, new_tokens=new_tokens, spine_ratio=plan.spine_ratio,
                p_s_ema=session.stats.p_s_ema, timings_ms=t, elapsed_s=session.busy_s,
                total_tokens=len(session.output), finished=finished, ptd_rows=len(plan.forward) - len(plan.tree),
                confidence=drafts.confidence, match_tokens=len(drafts.pld.draft), chain_tokens=plan.chain_tokens,
                budget=plan.budget, **_gt_fields(plan.gt))
            yield trace

    # -- stages -------------------------------------------------------------------------------

    @torch.no_grad()
    def _prefill(self, prompt: list[int]) -> tuple[Session, CycleTrace]:
        """Alg. 2 lines 1-3: index the prompt, one forward, harvest its logits, first token = argmax."""
        cfg, t_start = self.config, time.perf_counter()
        # the most rows one forward adds: the largest tree or chain, plus the PTD drafting rows
        rows = max(cfg.max_budget, cfg.max_spine + 1) + (cfg.ptd_rows if cfg.use_ptd else 0)
        cache = kv_cache.new_cache(self.model, len(prompt) + cfg.max_new_tokens + rows)
        session = Session(cache=cache, index=NgramIndex(cfg.ngram_sizes, cfg.occurrence), table=None,
                          stats=AcceptanceStats(ema_alpha=cfg.ema_alpha, p_s_ema=cfg.ema_init,
                                                calibrate_tr=cfg.tr_calibration,
                                                pooled_pld_prior=cfg.pooled_pld_prior))
        if cfg.use_ptd:
            session.ptd = ProgressiveTree(prompt, width=cfg.ptd_width, max_depth=cfg.ptd_depth,
                                          max_rows=cfg.ptd_rows, seed=cfg.seed)
            session.pool = CandidatePool(width=cfg.ptd_width, max_depth=cfg.ptd_depth)
        if cfg.sampling:
            session.generator = new_generator(cfg.seed)
        ids = torch.tensor([prompt], dtype=torch.long, device=self.model.device)  # (1, L)
        logits = self.model(input_ids=ids, past_key_values=session.cache, use_cache=True).logits[0]  # (L, |V|)
        if cfg.sampling:  # the first token, sampled as generate() samples it
            first = int(torch.multinomial(self.warp(logits[-1]), 1, generator=session.generator))
        else:
            first = int(logits[-1].argmax())
        t_forward = _ms(t_start)
        if cfg.use_tr:
            session.table = AdjacencyTable(logits.shape[-1], cfg.top_k, cfg.bigram_capacity,
                                           renormalise=cfg.adjacency_scores == "top-k")
            session.table.harvest([None, *prompt[:-1]], ids[0], logits)
        session.past_len = len(prompt)
        session.index.extend(prompt)
        new_tokens, finished = self._append(session, [first])
        root = DraftTree.root_only(prompt[-1])
        timings = {"forward": t_forward, "harvest": _ms(t_start) - t_forward, "total": _ms(t_start)}
        session.busy_s = timings["total"] / 1000
        return session, CycleTrace(
            index=0, mode="prefill", tree=root, ghosts=(), greedy=(first,), accepted=(), bonus=first,
            new_tokens=new_tokens, spine_ratio=None, p_s_ema=session.stats.p_s_ema, timings_ms=timings,
            elapsed_s=session.busy_s, total_tokens=len(session.output), finished=finished)

    def _draft(self, s: Session) -> Drafts:
        """Alg. 2 line 5: context match (with its §4.3 confidence) and the PTD pool's candidates."""
        cfg = self.config
        chain = cfg.pld_chain_tokens if cfg.method == "pld" else cfg.max_spine
        pld = s.index.match(chain) if cfg.use_pld else PldMatch()
        confidence = match_confidence(len(pld.draft), pld.unanimous, cfg.bypass_threshold, cfg.max_spine)
        return Drafts(pld, s.pool.get(s.anchor) if s.pool is not None else None, confidence)

    def _build(self, s: Session, drafts: Drafts) -> Plan:
        """Draft tree for this cycle, then the PTD drafting rows grafted under its root (PTD §3.2)."""
        plan = self._choose_size(self._route(s, drafts))  # GT "auto": the speedup-optimal top of the tree
        plan.forward = plan.tree.graft(*s.ptd.rows(), Source.PTD_ROW) if s.ptd is not None else plan.tree
        return plan

    def _route(self, s: Session, drafts: Drafts) -> Plan:
        """Alg. 2 lines 6-13: bypass (``bypass_rule``), else a tree shaped by the match confidence, else AR."""
        cfg, match = self.config, drafts.pld
        has_adjacency = s.table is not None and s.table.has_successors(s.prev, s.anchor)
        built: Built | None = None
        mode, r, budget, chain = "ar", None, None, match.draft
        if cfg.method == "ptd":
            mode, built = "tree", build_ptd_tree(s.anchor, drafts.ptd, cfg, s.stats)
        elif match.draft and (cfg.method == "pld" or self._bypass(match, has_adjacency)):
            mode, built = "bypass", build_chain(s.anchor, match.draft, s.stats, cfg.gt_threshold)
        elif match.draft or drafts.ptd is not None or has_adjacency or cfg.iso_k is not None:
            budget, r, chain = self._shape(s, drafts)
            if cfg.iso_k is not None:
                r, spine = None, chain if cfg.iso_spine else ()
                built = build_isotropic_tree(s.anchor, s.prev, spine, s.table, cfg, cfg.iso_k, s.stats, budget)
            else:
                built = build_spine_tree(s.anchor, s.prev, chain, s.table, cfg, r, s.stats, drafts.ptd, budget)
            mode = "tree"
        if built is None or len(built[0]) == 1:  # nothing to verify beyond the anchor: plain AR step
            return Plan("ar", DraftTree.root_only(s.anchor), built[1] if built else ())
        return Plan(mode, built[0], built[1], r, budget=budget, chain_tokens=len(chain))

    def _bypass(self, match: PldMatch, has_adjacency: bool) -> bool:
        """Whether this cycle verifies the bare PLD chain (§4.3 bypass), per ``DecodeConfig.bypass_rule``."""
        cfg = self.config
        if not cfg.bypass:
            return False
        if cfg.bypass_rule == "no-adjacency":
            return not has_adjacency
        return cfg.iso_k is None and (len(match.draft) >= cfg.bypass_threshold or match.consensus)

    def _shape(self, s: Session, drafts: Drafts) -> tuple[int, float, tuple[int, ...]]:
        """§4.3 confidence schedule, as the authors' code applies it: budget ``B + int(m * budget_extension)``,
        spine ratio ``r + m (1 - r)`` (r from the EMA tier, or fixed), and, when m > ``extend_above``, the
        chain grown by re-matching to ``int(max_extended_chain * m)`` tokens.  Returns (budget, r, chain);
        with the schedule off, m = 0: (B, r, the match)."""
        cfg = self.config
        m = drafts.confidence if cfg.confidence_schedule else 0.0
        r = cfg.spine_ratio if cfg.spine_ratio is not None else spine_ratio_tier(s.stats.p_s_ema)
        chain = drafts.pld.draft
        if chain and m > cfg.extend_above:
            chain = s.index.extend_chain(chain, int(cfg.max_extended_chain * m), cfg.max_spine, saturated=m >= 1.0)
        return cfg.budget + int(m * cfg.budget_extension), r + m * (1.0 - r), chain

    def _choose_size(self, plan: Plan) -> Plan:
        """GT principle §3 with the whole cost curve (``gt_threshold`` "auto"): keep the top-n* nodes of
        the built tree, n* maximising expected (accepted + 1) / T(n) (engine/gt.py); AR when n* = 1."""
        if self.config.gt_threshold != "auto" or plan.mode == "ar":
            return plan
        tree, ghosts, choice = speedup_optimal(plan.tree, self.cost_curve, self.extra_rows)
        if len(tree) == 1:
            return replace(plan, mode="ar", tree=tree, ghosts=plan.ghosts + ghosts, spine_ratio=None, gt=choice)
        return replace(plan, tree=tree, ghosts=plan.ghosts + ghosts, gt=choice)

    def _accept(self, s: Session, plan: Plan, logits: torch.Tensor, greedy: list[int]) -> tuple[tuple[int, ...], int]:
        """Greedy: Goose Alg. 3.  Sampling: HSD on chains when selected, else the recursive tree sampling."""
        if not self.config.sampling:
            return greedy_walk(plan.tree, greedy, self.priority)
        rows: dict[int, torch.Tensor] = {}

        def dist(node: int) -> torch.Tensor:  # (|V|,) float64 warped target distribution, computed once
            if node not in rows:
                rows[node] = self.warp(logits[node])
            return rows[node]

        if self.config.verifier == "hsd" and plan.mode == "bypass":
            return hsd_chain_walk(plan.tree, dist, s.generator)
        return sample_walk(plan.tree, dist, s.generator, self.priority)

    def _commit(self, s: Session, plan: Plan, back: ReadBack, accepted: tuple[int, ...],
                bonus: int, timings: dict) -> tuple[tuple[int, ...], bool]:
        """Alg. 2 lines 15-16: compact the KV cache, harvest every logit row, grow PTD, update estimates, append."""
        t_start = time.perf_counter()
        tree, rows = plan.tree, plan.forward
        kv_cache.keep_path(s.cache, s.past_len, [0, *accepted])
        s.past_len += 1 + len(accepted)
        timings["cache"] = _ms(t_start)
        if s.table is not None:  # every row, rejected branches and PTD rows included (C.1)
            prev_tokens = [s.prev, *(rows.tokens[p] for p in rows.parents[1:])]
            s.table.store(prev_tokens, list(rows.tokens), back.successor_ids, back.successor_scores)
        if s.ptd is not None:  # PTD Alg. 1 steps 3-4: extend T by each row's greedy token, merge into the pool
            s.ptd.grow(back.greedy[len(tree):], s.pool)
        s.stats.update(tree, accepted, ema=plan.mode == "tree" or self.config.ema_on_chains)
        result = self._append(s, [*(tree.tokens[i] for i in accepted), bonus])
        timings["harvest"] = _ms(t_start) - timings["cache"]
        return result

    def _append(self, s: Session, tokens: list[int]) -> tuple[tuple[int, ...], bool]:
        """Append tokens to the output, cut at the first EOS and at ``max_new_tokens``."""
        room = self.config.max_new_tokens - len(s.output)
        kept = tokens[:room]
        eos_at = next((i for i, t in enumerate(kept) if t in self.eos), None)
        if eos_at is not None:
            kept = kept[: eos_at + 1]
        s.output.extend(kept)
        s.index.extend(kept)
        finished = eos_at is not None or len(s.output) >= self.config.max_new_tokens
        return tuple(kept), finished


def _gt_fields(choice: GtChoice | None) -> dict:
    """``CycleTrace`` fields of a cycle's speedup-optimal size choice (all None without one)."""
    if choice is None:
        return {}
    return {"gt_nodes": choice.nodes, "gt_candidates": choice.candidates, "gt_expected": choice.expected,
            "gt_cost_ms": choice.cost_ms}


def _ms(since: float) -> float:
    return (time.perf_counter() - since) * 1000.0
