"""Decoding configuration: one dataclass, each default with the reason beside it.

Defaults are the Goose paper's Table 5 / Appendix C.3 hyper-parameters (fixed across datasets and
models there) unless a comment says otherwise.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from ..sources import REGISTRY

#: Draft sources a tree may mix, from the registry; ``DecodeConfig.sources`` picks among them for goose / iso(k).
SOURCES = tuple(info.name for info in REGISTRY)

#: Draft methods the engine runs with the one decoding loop: Goose's spine tree, each source alone (named after
#: it), balanced k-ary trees and plain AR (the source switches below select them).
METHODS = ("goose", *SOURCES, "iso3", "iso5", "ar")

#: Single-source methods that verify their source's candidate tree alone (PTD §3.3; SuffixDecoding).
CANDIDATE_TREE_METHODS = tuple(info.name for info in REGISTRY if info.candidate_tree)

#: Verifiers for sampling mode: "tree" = SpecInfer-style recursive rejection over the tree (PTD
#: Appendix B-C); "hsd" = hierarchical speculative decoding on linear chains (bypass / PLD cycles),
#: trees still use "tree".
VERIFIERS = ("tree", "hsd")

#: Which earlier occurrence of the suffix n-gram a PLD match copies (``match_occurrence``): "earliest"
#: (the longest continuation; the authors' code and HF prompt lookup), "latest" (the most recent text),
#: or "auto" = latest when the confidence schedule grows chains by re-matching, else earliest.
OCCURRENCES = ("auto", "earliest", "latest")

#: When a cycle verifies the bare PLD chain instead of a tree (``bypass_rule``): "confident" = a
#: consensus or a match of ``bypass_threshold`` tokens or more (the paper's Alg. 2 line 6);
#: "no-adjacency" = the anchor has no adjacency-table entry (the authors' code: a tree otherwise).
BYPASS_RULES = ("confident", "no-adjacency")

#: What GT "auto" maximises when it sizes a tree (``gt_rate``; engine/core/gt.py): "session" = the run's tokens per
#: unit of verification time (a node stays while it beats the session's rate so far), "cycle" = the tree's own
#: expected (1 + accepted) / T(n).
GT_RATES = ("session", "cycle")

#: Alg. 1 step 4, extending branch leaves through the adjacency table: "best-first" = one priority queue
#: by estimated path acceptance over the whole tree (ours); "score-width" = breadth-first, each node
#: given ceil(remaining budget x its score) children, at most K // depth (the authors' code).
BRANCH_GROWTH = ("best-first", "score-width")

#: TR score definitions (``adjacency_scores``): "softmax" = probability under the full softmax;
#: "top-k" = softmax over the top-K logits only (the authors' code; a row's K scores sum to 1).
ADJACENCY_SCORES = ("softmax", "top-k")


#: Which spine source lays the spine when several offer one (``spine_rule``): "longest-chain" = the one whose
#: candidates' main path is longest; "longest-match" = the one that matched the most context tokens.
SPINE_RULES = ("longest-chain", "longest-match")


#: Named GT rules: "auto" = speedup-optimal tree size from the whole cost curve (engine/core/gt.py);
#: "chord" = one threshold c from the curve's chord (``CostCurve.threshold``), the earlier default.
GT_RULES = ("auto", "chord")


def parse_gt_threshold(text: str) -> float | str:
    """Command-line form of the GT threshold: 'auto', 'chord' or a number c."""
    word = text.strip().lower()
    return word if word in GT_RULES else float(text)


class ConfigError(ValueError):
    """A decoding parameter is out of range; the message names the parameter and the allowed range."""


@dataclass(frozen=True)
class DecodeConfig:
    """Parameters of one speculative-decoding run.

    Budget semantics (Goose Alg. 1): the node budget ``budget`` counts every row of the verification
    forward, the root (anchor) included, so a spine tree has at most ``budget`` nodes and at most
    ``budget - 1`` draft tokens.  With the confidence schedule (§4.3, ``confidence_schedule``) a cycle
    whose PLD match has confidence m uses ``budget + int(m * budget_extension)`` nodes instead.  The
    bypass chain (§4.3) is not a tree and is bounded by ``max_spine`` instead, as in the paper.
    ``max_depth`` bounds branch depth (root = 0); it bounds the spine too only with
    ``depth_bounds_spine``.

    Fields whose default differs from the authors' implementation (2kinto/GOOSE_Speculative_Decoding)
    say so; ``PRESETS["paper"]`` reproduces that implementation (docs/results.md, "Fidelity to the
    authors' implementation", has the A/B behind every default).
    """

    method: str = "goose"  # goose | pld (PLD chain) | tr (TR tree) | ptd / suffix (that source's tree alone) |
    # iso3 / iso5 | ar
    max_new_tokens: int = 128  # tokens generated after the prompt, bonus tokens included
    budget: int = 60  # node budget B, root included (Table 5)
    spine_ratio: float | None = None  # r; None = adapt by EMA tiers (§4.3, C.3)
    spine_branch_ratio: float = 0.5  # rho: share of the branch budget on spine nodes (Table 5)
    max_depth: int = 6  # D: deepest node, root = depth 0 (Table 5)
    top_k: int = 10  # K successors per adjacency-table row (Table 5)
    min_score: float = 0.01  # successors scored below this are pruned (C.1)
    gt_threshold: float | str = "auto"  # "auto": keep the speedup-optimal top of each built tree, from the
    # whole measured cost curve (GT §3, engine/core/gt.py; docs/results.md "GT principle: speedup-optimal tree
    # size"); a number c: drop nodes whose estimated path acceptance < c (0 disables); "chord": c from the
    # curve's chord at B (engine/core/cost.py)
    bypass: bool = True  # verify a consensus / long PLD match as a linear chain (§4.3)
    bypass_threshold: int = 8  # match length that triggers bypass (Table 5)
    max_spine: int = 20  # longest PLD continuation copied (Table 5 "max spine continuation")
    ngram_sizes: tuple[int, ...] = (5, 4, 3)  # context-match n, longest first (B.2)
    ema_alpha: float = 0.3  # smoothing of the spine acceptance estimate p_s (Table 5)
    ema_init: float = 0.3  # initial p_s (Alg. 2 line 3)
    tr_calibration: bool = False  # calibrate TR scores online per depth for GT estimates; off: an interleaved
    # A/B (40 prompts, demo model, CPU) measured it growing trees (6.2 -> 10 nodes for TR) and losing ~4 % tok/s
    pooled_pld_prior: bool = True  # per-depth PLD acceptance estimates shrink to the pooled PLD rate, not 0.5:
    # the GT "auto" size choice otherwise prices long spines at 0.5^k (A/B: docs/results.md, "GT principle")
    # GT "auto" (docs/results.md, "GT auto, second round"; demo model and SmolLM2, four datasets):
    gt_floor: bool = True  # the builders first prune at the chord c, so the budget goes to nodes that can pay
    # (without it the size choice trims a c = 0 tree: demo speedup 1.48 vs 1.89)
    gt_rate: str = "session"  # what the size choice maximises (see GT_RATES): the run's tokens per ms
    path_calibration: bool = True  # price nodes at their path estimate mapped through the session's measured
    # outcomes of earlier built nodes with like estimates (estimates.PathCalibration): PLD's deep nodes, priced
    # at ~0.06, were accepted ~55 % of the time
    counterfactual_rates: bool = True  # the per-depth rates count every built node's outcome, not only the
    # verified ones (which the size choice selects); measured neutral, kept as the unbiased count
    # The rest of this block settles what the paper leaves unsaid; the authors' code is the reference and
    # PRESETS["paper"] reproduces it.  Every default won a tau A/B (docs/results.md, "Fidelity to the
    # authors' implementation"; the numbers below: demo model, HumanEval 0-9, 128 tokens, c = 0).
    match_occurrence: str = "auto"  # earlier occurrence of the suffix n-gram PLD copies (see OCCURRENCES):
    # auto = latest when the confidence schedule re-matches (goose 5.77 vs earliest 5.38: re-matching grows a
    # chain the stream's end cut short, and recent text predicts better), else earliest (PLD 2.48 vs 2.21)
    bypass_rule: str = "no-adjacency"  # when bypass verifies the bare chain (see BYPASS_RULES): a tree on
    # every cycle with an adjacency entry (authors; 5.77 vs "confident" 3.62: trees extend, bare chains not)
    depth_bounds_spine: bool = False  # D bounds the spine too (False: branch growth only, as the authors;
    # 5.77 vs 4.16: a spine capped at 6 wastes long confident matches)
    confidence_schedule: bool = True  # §4.3 confidence m: budget + int(m * budget_extension), r -> r + m(1 - r),
    # chain grown by re-matching when m > extend_above (authors' code; 5.38 vs 4.96, earliest occurrence)
    budget_extension: int = 40  # extra nodes at confidence 1 (authors: max_extended_chain - B = 100 - 60)
    max_extended_chain: int = 100  # an extended chain is grown to int(this * m) tokens (authors' code)
    extend_above: float = 0.6  # confidence above which the chain is extended (authors' code)
    spine_branch_min: int = 0  # branches every spine node gets at least while the spine-branch share lasts
    # (authors: 1; 5.74 vs 5.77)
    ema_on_chains: bool = True  # bypass chains update the spine-acceptance EMA too (authors: tree cycles only,
    # from 0.5; 5.74 vs 5.77)
    adjacency_scores: str = "softmax"  # TR scores (see ADJACENCY_SCORES; the authors' top-k: 5.71 vs 5.77)
    branch_growth: str = "best-first"  # Alg. 1 step 4 (see BRANCH_GROWTH; the authors' score-width: 5.42 vs 5.77)
    iso_spine: bool = True  # Iso(k) puts the PLD continuation on its first path (authors: adjacency only, and
    # a cycle with no adjacency entry verifies the bare chain)
    bigram_capacity: int = 65536  # rows kept in the bigram tier (LRU); bounds memory per session
    pld_chain_tokens: int = 20  # chain length of the 'pld' baseline (authors' Table 5 "max spine continuation";
    # HF's default 10: tau 2.35 vs 2.48, and slower, on the demo model)
    sources: tuple[str, ...] = ("pld", "tr")  # sources goose / iso(k) mix (the page's per-source toggles); PTD
    # is off by default: on the demo model / CPU its rows cost more forward time than its drafts save
    # (docs/results.md, "PTD"); the single-source methods pld / tr / ptd / suffix ignore this field
    ptd_rows: int = 16  # PTD drafting rows per forward (not counted in B: engine/sources/ptd.py says why)
    ptd_width: int = 4  # children per node of the PTD tree and of pool tries (PTD §4 setup: 4)
    ptd_depth: int = 6  # depth cap of the PTD tree before stepping (PTD §4 setup: 6)
    ptd_share: float = 0.5  # share of the non-spine budget PTD candidates may take in a goose tree
    suffix_max_depth: int = 24  # SuffixDecoding: depth of the suffix tries, which bounds the matched suffix plus
    # the speculation below it (vLLM's suffix_decoding_max_tree_depth default, 24)
    suffix_spec_factor: float = 4.0  # adaptive size: at most factor x (match length) candidates; vLLM's default
    # 1.0 lost tau on every dataset, demo model and SmolLM2 (docs/results.md, "Suffix source": +0.05 to +0.4)
    suffix_min_prob: float = 0.1  # candidates whose estimated path probability is below this are not proposed
    # (vLLM's suffix_decoding_min_token_prob default, 0.1)
    spine_rule: str = "longest-chain"  # spine source choice (see SPINE_RULES): the suffix match (up to 23 tokens)
    # is nearly always longer than PLD's n-gram (3-5), so "longest-match" hands the spine to the suffix tree's
    # shorter chains (A/B: docs/results.md, "Suffix source")
    suffix_memory_tokens: int = 4096  # earlier output tokens one user's suffix tree keeps (oldest outputs
    # evicted); bounds what a visitor holds on a shared server (~6.7 KB per token at depth 24: ~27 MB)
    walk_priority: tuple[str, ...] = ("pld", "suffix", "ptd", "tr")  # order children are tried in (Goose Alg.
    # 3); greedy tau does not depend on it (children of a node carry distinct tokens); sampling tau does
    temperature: float = 0.0  # 0 = greedy (lossless = token-identical); > 0 = sampling mode
    top_p: float = 1.0  # nucleus sampling mass (1 = off), as transformers' TopPLogitsWarper
    sample_top_k: int = 0  # keep the k most likely tokens when sampling (0 = off), as TopKLogitsWarper
    seed: int = 0  # seed of the sampling generator (and of PTD's initial perturbation tokens)
    verifier: str = "tree"  # sampling verifier for chains: tree (SpecInfer) | hsd (HSD); see VERIFIERS

    def __post_init__(self) -> None:
        checks = [
            (self.method in METHODS, f"method must be one of {', '.join(METHODS)} (got {self.method!r})"),
            (self.max_new_tokens >= 1, f"max new tokens must be at least 1 (got {self.max_new_tokens})"),
            (1 <= self.budget <= 1024, f"node budget B must be in 1..1024 (got {self.budget})"),
            (self.spine_ratio is None or 0.0 < self.spine_ratio < 1.0,
             f"spine ratio r must be in (0, 1) or auto (got {self.spine_ratio})"),
            (0.0 <= self.spine_branch_ratio <= 1.0,
             f"spine-branch ratio rho must be in [0, 1] (got {self.spine_branch_ratio})"),
            (self.max_depth >= 1, f"max depth D must be at least 1 (got {self.max_depth})"),
            (self.top_k >= 1, f"top-K must be at least 1 (got {self.top_k})"),
            (self.gt_threshold in GT_RULES
             or (isinstance(self.gt_threshold, (int, float)) and 0.0 <= self.gt_threshold < 1.0),
             f"GT threshold c must be 'auto', 'chord' or in [0, 1) (got {self.gt_threshold!r})"),
            (self.max_spine >= 1 and self.bypass_threshold >= 1, "max spine and bypass threshold must be >= 1"),
            (len(self.ngram_sizes) >= 1 and min(self.ngram_sizes) >= 1, "n-gram sizes must be positive"),
            (set(self.sources) <= set(SOURCES), f"sources must be among {', '.join(SOURCES)} (got {self.sources})"),
            (self.ptd_rows >= 2 and self.ptd_width >= 1 and self.ptd_depth >= 1,
             "PTD rows must be >= 2, PTD width and depth >= 1"),
            (0.0 <= self.ptd_share <= 1.0, f"PTD share must be in [0, 1] (got {self.ptd_share})"),
            (set(self.walk_priority) <= set(SOURCES) and len(set(self.walk_priority)) == len(self.walk_priority),
             f"walk priority must order sources among {', '.join(SOURCES)}, each once (got {self.walk_priority})"),
            (self.spine_rule in SPINE_RULES,
             f"spine rule must be one of {', '.join(SPINE_RULES)} (got {self.spine_rule!r})"),
            (self.suffix_max_depth >= 1 and self.suffix_spec_factor > 0 and 0.0 <= self.suffix_min_prob < 1.0
             and self.suffix_memory_tokens >= 0, "suffix depth must be >= 1, spec factor > 0, min probability in "
             "[0, 1), memory >= 0 tokens"),
            (0.0 <= self.temperature <= 100.0, f"temperature must be in [0, 100] (got {self.temperature})"),
            (0.0 < self.top_p <= 1.0, f"top-p must be in (0, 1] (got {self.top_p})"),
            (self.sample_top_k >= 0, f"sampling top-k must be >= 0 (got {self.sample_top_k})"),
            (self.verifier in VERIFIERS, f"verifier must be one of {', '.join(VERIFIERS)} (got {self.verifier!r})"),
            (self.match_occurrence in OCCURRENCES,
             f"match occurrence must be one of {', '.join(OCCURRENCES)} (got {self.match_occurrence!r})"),
            (self.bypass_rule in BYPASS_RULES,
             f"bypass rule must be one of {', '.join(BYPASS_RULES)} (got {self.bypass_rule!r})"),
            (self.gt_rate in GT_RATES, f"GT rate must be one of {', '.join(GT_RATES)} (got {self.gt_rate!r})"),
            (self.branch_growth in BRANCH_GROWTH,
             f"branch growth must be one of {', '.join(BRANCH_GROWTH)} (got {self.branch_growth!r})"),
            (self.adjacency_scores in ADJACENCY_SCORES,
             f"adjacency scores must be one of {', '.join(ADJACENCY_SCORES)} (got {self.adjacency_scores!r})"),
            (0 <= self.budget_extension <= 1024, f"budget extension must be in 0..1024 (got {self.budget_extension})"),
            (self.max_extended_chain >= 1, f"max extended chain must be >= 1 (got {self.max_extended_chain})"),
            (0.0 <= self.extend_above <= 1.0, f"extend-above confidence must be in [0, 1] (got {self.extend_above})"),
            (self.spine_branch_min >= 0, f"spine branch minimum must be >= 0 (got {self.spine_branch_min})"),
            (0.0 <= self.ema_init <= 1.0, f"EMA initial value must be in [0, 1] (got {self.ema_init})"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)
        object.__setattr__(self, "ngram_sizes", tuple(sorted(self.ngram_sizes, reverse=True)))
        object.__setattr__(self, "sources", tuple(s for s in SOURCES if s in self.sources))
        # a priority that omits sources (a run recorded before they existed) tries them last
        priority = tuple(self.walk_priority)
        object.__setattr__(self, "walk_priority", priority + tuple(s for s in SOURCES if s not in priority))

    def _uses(self, source: str) -> bool:
        if self.method in SOURCES:
            return self.method == source
        return self.method != "ar" and source in self.sources

    @property
    def active_sources(self) -> tuple[str, ...]:
        """The sources this run drafts with: the method's own, or ``sources`` for goose / iso(k); () for AR."""
        return tuple(s for s in SOURCES if self._uses(s))

    @property
    def extra_rows(self) -> int:
        """Rows every verification forward carries besides the draft tree: PTD's drafting rows when PTD is on."""
        return self.ptd_rows if self._uses("ptd") else 0

    @property
    def sampling(self) -> bool:
        """True in sampling mode (temperature > 0); greedy otherwise."""
        return self.temperature > 0.0

    @property
    def iso_k(self) -> int | None:
        """k of an Iso(k) method (Goose §5.3), else None."""
        return int(self.method[3:]) if self.method.startswith("iso") else None

    @classmethod
    def preset(cls, name: str, **changes) -> DecodeConfig:
        """The named configuration of ``PRESETS`` with ``changes`` on top.

        Raises:
            ConfigError: unknown preset name, or a field out of range.
        """
        if name not in PRESETS:
            raise ConfigError(f"preset must be one of {', '.join(PRESETS)} (got {name!r})")
        return cls(**{**PRESETS[name], **changes})

    @property
    def occurrence(self) -> str:
        """The earlier occurrence a PLD match copies, "earliest" or "latest" (``match_occurrence`` resolved)."""
        if self.match_occurrence != "auto":
            return self.match_occurrence
        return "latest" if self.confidence_schedule and self.method != "pld" else "earliest"

    @property
    def max_budget(self) -> int:
        """Most nodes one cycle's tree may have: B, plus the confidence schedule's extension."""
        return self.budget + (self.budget_extension if self.confidence_schedule else 0)

    def with_(self, **changes) -> DecodeConfig:
        return replace(self, **changes)

    def to_dict(self) -> dict:
        return asdict(self)


#: Named configurations: field overrides on top of the defaults (``DecodeConfig.preset``).
#: "default" is the defaults; "paper" reproduces the authors' implementation
#: (2kinto/GOOSE_Speculative_Decoding, Table 5 configuration): earliest-occurrence PLD with 20-token
#: baseline chains, a tree whenever the anchor has an adjacency entry, a spine bounded by B r only, the
#: confidence schedule (budget and chain extension), >= 1 branch per spine node, EMA from 0.5 on tree
#: cycles, top-K-softmax scores, score-width branch growth, adjacency-only Iso(k), no GT pruning.
PRESETS: dict[str, dict] = {
    "default": {},
    "paper": dict(match_occurrence="earliest", pld_chain_tokens=20, bypass_rule="no-adjacency",
                  depth_bounds_spine=False, confidence_schedule=True, budget_extension=40, max_extended_chain=100,
                  extend_above=0.6, spine_branch_min=1, ema_init=0.5, ema_on_chains=False, adjacency_scores="top-k",
                  branch_growth="score-width", iso_spine=False, gt_threshold=0.0),
}
