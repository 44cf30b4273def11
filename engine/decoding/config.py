"""Decoding configuration, nested by concern; each default with the reason beside it.

``DecodeConfig`` holds the method, the length and one dataclass per concern: the tree's shape (``TreeShape``),
the GT principle (``GtConfig``, with its rules and ``CALIBRATE_AT`` in engine/decoding/gt_config.py; re-exported
here), sampling (``SamplerConfig``), how the paper's gaps are filled (``Variant``), and each draft source's own
settings (its module's dataclass, e.g. ``PldConfig``).  Outside the engine a config is
*flat*: every setting has one flat name (the CLI flag's dest, the trace file's key: ``budget``,
``gt_threshold``, ``ptd_rows``), and ``DecodeConfig.of`` / ``with_`` / ``get`` / ``to_dict`` / ``from_dict``
speak it (found by reflection: engine/decoding/flat.py), so command lines and trace files written before the
nesting still read.  How a setting shows to people
(its CLI option, the page's range, a sweep's parse) is declared by flat name in engine/product/io/settings.py.

Defaults are the Goose paper's Table 5 / Appendix C.3 hyper-parameters (fixed across datasets and models there)
unless a comment says otherwise.  ``DecodeConfig.resolved`` turns the GT rule into the numbers the loop reads,
given a cost curve, as a separate value (``Resolved``): ``engine.decoding.decode.SpecDecoder`` takes only that.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar

from ..core.checks import ConfigError, check, one_of
from ..sources import REGISTRY, SOURCE_TYPES, Role
from . import flat
from .gt_config import CALIBRATE_AT, GT_RATES, GT_RULES, GtConfig, parse_gt_threshold

#: Draft sources a tree may mix, from the registry; ``DecodeConfig.sources`` picks among them for goose / iso(k).
SOURCES = tuple(info.name for info in REGISTRY)

#: Draft methods the engine runs with the one decoding loop: Goose's spine tree, each source alone (named after
#: it), balanced k-ary trees and plain AR (the source switches below select them).
METHODS = ("goose", *SOURCES, "iso3", "iso5", "ar")

#: Single-source methods that verify their source's candidate tree alone (PTD §3.3; SuffixDecoding).
CANDIDATE_TREE_METHODS = tuple(info.name for info in REGISTRY if info.candidate_tree)

#: Goose Alg. 3 / B.3's default order of the walk over a node's children: spine sources' first, then pool sources'
#: (PTD: measured between them, docs/results.md "PTD"), then branch sources'; registry order within a
#: role.  Greedy tau does not depend on it (a node's children carry distinct tokens); sampling tau does.
WALK_PRIORITY = tuple(i.name for i in sorted(REGISTRY, key=lambda i: (Role.SPINE, Role.POOL, Role.BRANCH).index(
    i.role)))

#: Verifiers for sampling mode: "tree" = SpecInfer-style recursive rejection over the tree (PTD
#: Appendix B-C); "hsd" = hierarchical speculative decoding on linear chains (bypass / PLD cycles),
#: trees still use "tree".
VERIFIERS = ("tree", "hsd")

#: When a cycle verifies the bare spine chain instead of a tree (``Variant.bypass_rule``): "confident" = a
#: consensus or a match of ``bypass_threshold`` tokens or more (the paper's Alg. 2 line 6);
#: "no-adjacency" = the anchor has no adjacency-table entry (the authors' code: a tree otherwise).
BYPASS_RULES = ("confident", "no-adjacency")

#: Alg. 1 step 4, extending branch leaves through the adjacency table (``Variant.branch_growth``): "best-first" =
#: one priority queue by estimated path acceptance over the whole tree (ours); "score-width" = breadth-first, each
#: node given ceil(remaining budget x its score) children, at most K // depth (the authors' code).
BRANCH_GROWTH = ("best-first", "score-width")

#: Which spine source lays the spine when several offer one (``TreeShape.spine_rule``): "longest-chain" = the one
#: whose candidates' main path is longest; "longest-match" = the one that matched the most context tokens.
SPINE_RULES = ("longest-chain", "longest-match")


def parse_names(text: str) -> tuple[str, ...]:
    """Command-line form of a list of names: 'a, b' -> ('a', 'b'); an empty list is allowed (``--sources ''``)."""
    return tuple(name.strip().lower() for name in text.split(",") if name.strip())


@dataclass(frozen=True)
class TreeShape:
    """The draft tree's shape (Goose Alg. 1, Table 5) and how it adapts per cycle (Alg. 2, §4.3).

    Budget semantics (Goose Alg. 1): ``budget`` counts every row of the verification forward, the root (anchor)
    included, so a spine tree has at most ``budget`` nodes and ``budget - 1`` draft tokens; the confidence
    schedule (``Variant``) may add to it.  The bypass chain (§4.3) is not a tree and is bounded by ``max_spine``
    instead, as in the paper.  ``max_depth`` bounds branch depth (root = 0), and the spine only with
    ``Variant.depth_bounds_spine``.
    """

    budget: int = 60  # node budget B, root included (Table 5)
    spine_ratio: float | None = None  # r; None = adapt by EMA tiers (§4.3, C.3)
    spine_branch_ratio: float = 0.5  # rho: share of the branch budget on spine nodes (Table 5)
    max_depth: int = 6  # D: deepest node, root = depth 0 (Table 5)
    top_k: int = 10  # K successors per adjacency-table row, and per branch node (Table 5)
    min_score: float = 0.01  # successors scored below this are pruned (C.1)
    max_spine: int = 20  # longest spine continuation one lookup copies (Table 5 "max spine continuation")
    pool_share: float = 0.5  # share of the non-spine budget pool sources' candidates (PTD) may take
    bypass: bool = True  # verify a consensus / long spine match as a chain (§4.3)
    bypass_threshold: int = 8  # match length that triggers bypass, and a long match for confidence (Table 5)
    ema_alpha: float = 0.3  # smoothing of the spine acceptance estimate p_s (Table 5)
    ema_init: float = 0.3  # initial p_s (Alg. 2 line 3)
    spine_rule: str = "longest-chain"  # spine source choice (see SPINE_RULES): the suffix match (up to 23 tokens)
    # is nearly always longer than PLD's n-gram (3-5), so "longest-match" hands the spine to the suffix tree's
    # shorter chains (A/B: docs/results.md, "Suffix source")
    walk_priority: tuple[str, ...] = WALK_PRIORITY  # order children are tried in (Goose Alg. 3; see WALK_PRIORITY:
    # pld, suffix, ptd, tr)

    FLAT: ClassVar[dict[str, str]] = {"pool_share": "ptd_share"}  # the rest: the field's own name

    def __post_init__(self) -> None:
        check([
            (1 <= self.budget <= 1024, f"node budget B must be in 1..1024 (got {self.budget})"),
            (self.spine_ratio is None or 0.0 < self.spine_ratio < 1.0,
             f"spine ratio r must be in (0, 1) or auto (got {self.spine_ratio})"),
            (0.0 <= self.spine_branch_ratio <= 1.0,
             f"spine-branch ratio rho must be in [0, 1] (got {self.spine_branch_ratio})"),
            (self.max_depth >= 1, f"max depth D must be at least 1 (got {self.max_depth})"),
            (self.top_k >= 1, f"top-K must be at least 1 (got {self.top_k})"),
            (self.max_spine >= 1 and self.bypass_threshold >= 1, "max spine and bypass threshold must be >= 1"),
            (0.0 <= self.pool_share <= 1.0, f"PTD share must be in [0, 1] (got {self.pool_share})"),
            (0.0 <= self.ema_init <= 1.0, f"EMA initial value must be in [0, 1] (got {self.ema_init})"),
            one_of(self.spine_rule, SPINE_RULES, "spine rule"),
            (set(self.walk_priority) <= set(SOURCES) and len(set(self.walk_priority)) == len(self.walk_priority),
             f"walk priority must order sources among {', '.join(SOURCES)}, each once (got {self.walk_priority})"),
        ])
        # a priority that omits sources (a run recorded before they existed) tries them last
        priority = tuple(self.walk_priority)
        object.__setattr__(self, "walk_priority", priority + tuple(s for s in SOURCES if s not in priority))


@dataclass(frozen=True)
class SamplerConfig:
    """Sampling mode (temperature > 0): the target distribution, as transformers' warpers shape it, and the
    verifier that keeps it exact (PTD Appendix B-C; HSD)."""

    temperature: float = 0.0  # 0 = greedy (lossless = token-identical)
    top_p: float = 1.0  # nucleus sampling mass (1 = off), as TopPLogitsWarper
    top_k: int = 0  # the k likeliest tokens when sampling (0 = off), as TopKLogitsWarper
    seed: int = 0  # the sampling generator's seed (and PTD's initial perturbation)
    verifier: str = "tree"  # sampling verifier for chains: tree (SpecInfer) | hsd

    FLAT: ClassVar[dict[str, str]] = {"top_k": "sample_top_k"}

    def __post_init__(self) -> None:
        check([
            (0.0 <= self.temperature <= 100.0, f"temperature must be in [0, 100] (got {self.temperature})"),
            (0.0 < self.top_p <= 1.0, f"top-p must be in (0, 1] (got {self.top_p})"),
            (self.top_k >= 0, f"sampling top-k must be >= 0 (got {self.top_k})"),
            one_of(self.verifier, VERIFIERS, "verifier"),
        ])

    @property
    def on(self) -> bool:
        """True in sampling mode (temperature > 0); greedy otherwise."""
        return self.temperature > 0.0


@dataclass(frozen=True)
class Variant:
    """How the loop and the tree builder fill what the Goose paper leaves unsaid, in one place.

    The authors' implementation (2kinto/GOOSE_Speculative_Decoding, read, not copied) is the reference:
    ``VARIANTS["authors"]`` reproduces it; ``VARIANTS["goose-lens"]`` (the default) keeps what won a tau A/B
    against it (docs/results.md, "Fidelity to the authors' implementation", has each choice's tau).  The sources'
    own gap-fillers (PLD's ``match_occurrence``, TR's ``adjacency_scores``) are their settings; ``PRESETS["paper"]``
    sets them with this variant.
    """

    bypass_rule: str = "no-adjacency"  # when bypass verifies the bare chain (see BYPASS_RULES): a tree on
    # every cycle with an adjacency entry (authors; trees extend, bare chains not)
    depth_bounds_spine: bool = False  # D bounds the spine too (False: branch growth only, as the authors;
    # a spine capped at 6 wastes long confident matches)
    confidence_schedule: bool = True  # §4.3 confidence m: budget + int(m * budget_extension), r -> r + m(1 - r),
    # chain grown by re-matching when m > extend_above (authors' code; it raises tau)
    budget_extension: int = 40  # extra nodes at confidence 1 (authors: max_extended_chain - B = 100 - 60)
    max_extended_chain: int = 100  # an extended chain is grown to int(this * m) tokens (authors' code)
    extend_above: float = 0.6  # confidence above which the chain is extended (authors' code)
    spine_branch_min: int = 0  # branches every spine node gets at least while the spine-branch share lasts
    # (authors: 1; slightly lower tau)
    ema_on_chains: bool = True  # bypass chains update the spine-acceptance EMA too (authors: tree cycles only,
    # from 0.5; slightly lower tau)
    branch_growth: str = "best-first"  # Alg. 1 step 4 (see BRANCH_GROWTH; the authors' score-width: lower tau)
    iso_spine: bool = True  # Iso(k) puts the spine continuation on its first path (authors: adjacency only, and
    # a cycle with no adjacency entry verifies the bare chain)

    FLAT: ClassVar[dict[str, str]] = {}

    def __post_init__(self) -> None:
        check([
            one_of(self.bypass_rule, BYPASS_RULES, "bypass rule"),
            one_of(self.branch_growth, BRANCH_GROWTH, "branch growth"),
            (0 <= self.budget_extension <= 1024, f"budget extension must be in 0..1024 (got {self.budget_extension})"),
            (self.max_extended_chain >= 1, f"max extended chain must be >= 1 (got {self.max_extended_chain})"),
            (0.0 <= self.extend_above <= 1.0, f"extend-above confidence must be in [0, 1] (got {self.extend_above})"),
            (self.spine_branch_min >= 0, f"spine branch minimum must be >= 0 (got {self.spine_branch_min})"),
        ])

    @property
    def name(self) -> str:
        """The name of the ``VARIANTS`` entry this variant is, or "custom"."""
        return next((name for name, v in VARIANTS.items() if v == self), "custom")


#: Named variants (``Variant``): this project's defaults, and the authors' implementation.
VARIANTS: dict[str, Variant] = {
    "goose-lens": Variant(),
    "authors": Variant(bypass_rule="no-adjacency", depth_bounds_spine=False, confidence_schedule=True,
                       budget_extension=40, max_extended_chain=100, extend_above=0.6, spine_branch_min=1,
                       ema_on_chains=False, branch_growth="score-width", iso_spine=False),
}

#: Each registered source's own settings at their defaults, in ``REGISTRY`` order.
DEFAULT_SOURCE_CONFIGS = tuple(t.config_type() for t in SOURCE_TYPES)


@dataclass(frozen=True)
class DecodeConfig:
    """Parameters of one speculative-decoding run: eight fields, five of them one concern's dataclass.

    Build one from flat names (``DecodeConfig.of(budget=16, gt_threshold=0.0)``: the module's docstring), or from
    groups (``DecodeConfig(tree=TreeShape(budget=16))``).  Every field is checked when made.

    Raises:
        ConfigError: a setting out of range or unknown, naming it and its range.
    """

    method: str = "goose"  # goose | pld (PLD chain) | tr (TR tree) | ptd / suffix (that source's tree alone) |
    # iso3 / iso5 | ar
    max_new_tokens: int = 128  # tokens after the prompt, bonus tokens included
    sources: tuple[str, ...] = ("pld", "tr")  # sources goose / iso(k) mix (page: toggles); PTD is off by default:
    # on the demo model / CPU its rows cost more forward time than its drafts save (docs/results.md, "PTD"); the
    # single-source methods pld / tr / ptd / suffix ignore this field
    tree: TreeShape = TreeShape()
    gt: GtConfig = GtConfig()
    sampler: SamplerConfig = SamplerConfig()
    variant: Variant = VARIANTS["goose-lens"]
    source_configs: tuple[Any, ...] = field(default=DEFAULT_SOURCE_CONFIGS)  # one per REGISTRY source, in order:
    # the source module's own dataclass (``source_config``)

    def __post_init__(self) -> None:
        check([
            one_of(self.method, METHODS, "method"),
            (self.max_new_tokens >= 1, f"max new tokens must be at least 1 (got {self.max_new_tokens})"),
            (set(self.sources) <= set(SOURCES), f"sources must be among {', '.join(SOURCES)} (got {self.sources})"),
            (len(self.source_configs) == len(SOURCE_TYPES)
             and all(isinstance(c, t.config_type) for c, t in zip(self.source_configs, SOURCE_TYPES)),
             "source configs must hold one config per registered source, in registry order"),
        ])
        object.__setattr__(self, "sources", tuple(s for s in SOURCES if s in self.sources))

    # -- flat names: the CLI's, the trace files', the page's --------------------------------------------

    @classmethod
    def of(cls, **settings) -> DecodeConfig:
        """The defaults with ``settings`` (``with_``'s names) on top.  Raises ``ConfigError``."""
        return cls().with_(**settings)

    @classmethod
    def preset(cls, name: str, **settings) -> DecodeConfig:
        """The named configuration of ``PRESETS`` with ``settings`` on top.

        Raises:
            ConfigError: unknown preset name, or a setting unknown or out of range.
        """
        if name not in PRESETS:
            raise ConfigError(f"preset must be one of {', '.join(PRESETS)} (got {name!r})")
        return cls.of(**{**PRESETS[name], **settings})

    @classmethod
    def from_dict(cls, data: dict) -> DecodeConfig:
        """A config from ``to_dict`` output, of this version or an earlier one (trace files): JSON lists become
        tuples, names this version lacks are dropped.  Raises ``ConfigError`` for a value out of range."""
        return cls.of(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in FLAT_NAMES})

    def with_(self, **settings) -> DecodeConfig:
        """This config with ``settings`` changed: flat names (``FLAT_NAMES``), a concern's whole dataclass by its
        field name (``tree=TreeShape(...)``), or ``variant`` by its name in ``VARIANTS`` (flat names of the
        variant's fields given too apply on top of it).

        Raises:
            ConfigError: an unknown name, or a value out of range.
        """
        for name, value in settings.items():
            if name == "variant" and isinstance(value, str):
                if value not in VARIANTS:
                    raise ConfigError(f"variant must be one of {', '.join(VARIANTS)} (got {value!r})")
                settings[name] = VARIANTS[value]
            elif name not in _TOP and name not in _PATHS:
                raise ConfigError(f"unknown setting {name!r}; known: {', '.join(FLAT_NAMES)}")
        return flat.apply(self, _PATHS, settings)

    def get(self, name: str):
        """The setting of flat name ``name`` ("variant": its ``VARIANTS`` name).  Raises KeyError if unknown."""
        return self.variant.name if name == "variant" else flat.read(self, _PATHS[name])

    def to_dict(self) -> dict:
        """Every setting by its flat name (what trace files and results store; ``from_dict`` reads it back)."""
        return {name: self.get(name) for name in FLAT_NAMES}

    # -- derived ------------------------------------------------------------------------------------

    def source_config(self, name: str) -> Any:
        """The settings of source ``name`` (its module's dataclass, e.g. ``PldConfig``).  Raises KeyError."""
        if name not in SOURCES:
            raise KeyError(f"unknown draft source {name!r}; known: {', '.join(SOURCES)}")
        return self.source_configs[SOURCES.index(name)]

    def _uses(self, source: str) -> bool:
        if self.method in SOURCES:
            return self.method == source
        return self.method != "ar" and source in self.sources

    @property
    def active_sources(self) -> tuple[str, ...]:
        """The sources this run drafts with: the method's own, or ``sources`` for goose / iso(k); () for AR."""
        return tuple(s for s in SOURCES if self._uses(s))

    @property
    def drafts_alone(self) -> bool:
        """The method is one source drafting alone (named after it: pld, tr, ptd, suffix)."""
        return self.method in SOURCES

    @property
    def extra_rows(self) -> int:
        """Rows every verification forward carries besides the draft tree: what active sources ride along (PTD)."""
        return sum(self.source_config(s).extra_rows for s in self.active_sources)

    @property
    def sampling(self) -> bool:
        """True in sampling mode (temperature > 0); greedy otherwise."""
        return self.sampler.on

    @property
    def iso_k(self) -> int | None:
        """k of an Iso(k) method (Goose §5.3), else None."""
        return int(self.method[3:]) if self.method.startswith("iso") else None

    @property
    def max_budget(self) -> int:
        """Most nodes one cycle's tree may have: B, plus the confidence schedule's extension."""
        return self.tree.budget + (self.variant.budget_extension if self.variant.confidence_schedule else 0)

    # -- resolution -----------------------------------------------------------------------------------

    @property
    def needs_cost_curve(self) -> bool:
        """The GT rule reads a cost curve ("auto" or "chord")."""
        return self.gt.threshold in GT_RULES

    def resolved(self, curve) -> Resolved:
        """This config's GT rule turned into numbers from ``curve`` (a ``CostCurve``; None when c is a number): the c
        the builders prune at (``Resolved.prune_at``) and the longest extended chain (``Resolved.chain_cap``).
        "chord" becomes the c of the curve's chord at B (GT §3.1, Eq. 9), in the resolved config too; under "auto"
        the builders prune at that c with ``gt.floor`` (below it no node pays at the AR rate), else at 0; a number c
        stays.  With a curve, the chain cap is the longest extended chain whose forward (root and ride-along rows
        included) costs at most ``gt.chain_steps`` AR steps, T(1); without one, None (no cap beyond
        ``max_extended_chain``).  Path calibration "auto" is on where the curve's ``row_price`` is at least
        ``CALIBRATE_AT`` (off without a curve).  ``self`` is left as it is.

        Raises:
            ConfigError: "auto" or "chord" without a curve.
        """
        gt = self.gt
        if self.needs_cost_curve and curve is None:
            raise ConfigError(f"GT threshold {gt.threshold!r} reads a cost curve; none was given")
        config = self
        if gt.threshold == "chord":
            prune_at = curve.threshold(self.tree.budget, self.extra_rows)
            config = replace(self, gt=replace(gt, threshold=prune_at))
        elif gt.auto:
            prune_at = curve.threshold(self.tree.budget, self.extra_rows) if gt.floor else 0.0
        else:
            prune_at = float(gt.threshold)
        cap = None
        calibrate = gt.path_calibration is True
        if curve is not None:
            rows = curve.max_rows(gt.chain_steps * curve.latency(1))
            cap = max(1, rows - 1 - self.extra_rows)
            calibrate = calibrate or (gt.path_calibration == "auto"
                                      and curve.row_price(self.extra_rows) >= CALIBRATE_AT)
        return Resolved(config, prune_at, cap, calibrate)


@dataclass(frozen=True)
class Resolved:
    """A config with its GT rule turned into the numbers the loop reads, from one cost curve
    (``DecodeConfig.resolved``); ``engine.decoding.decode.SpecDecoder`` takes only this."""

    config: DecodeConfig  # the config as set ("chord" holds its resolved c)
    prune_at: float  # the c the tree builders prune at: c, or under "auto" the chord c with ``gt.floor``, else 0
    chain_cap: int | None  # the longest extended chain (tokens) within ``gt.chain_steps`` AR steps; None: no curve
    path_calibration: bool = False  # the size choice reads calibrated path estimates (``gt.path_calibration``)


#: The top-level fields, which ``DecodeConfig.with_`` also takes whole (``tree=TreeShape(...)``).
_TOP = tuple(f.name for f in fields(DecodeConfig))


#: Where each flat name lives (``engine.decoding.flat``): method, length and sources, then the groups' fields, then each
#: source's own.
_PATHS = flat.paths(DecodeConfig, ("method", "max_new_tokens", "sources"), ("tree", "gt", "sampler", "variant"),
                    "source_configs", tuple(t.config_type for t in SOURCE_TYPES))
#: Every setting's flat name, in the order ``to_dict`` writes them.
FLAT_NAMES = tuple(_PATHS)
#: Named configurations: flat settings on top of the defaults (``DecodeConfig.preset``).  "default" is the
#: defaults; "paper" reproduces the authors' implementation (2kinto/GOOSE_Speculative_Decoding, Table 5
#: configuration): their ``Variant``, earliest-occurrence PLD with 20-token baseline chains, top-K-softmax
#: TR scores, the EMA from 0.5, no GT pruning.
PRESETS: dict[str, dict] = {
    "default": {},
    "paper": dict(variant="authors", match_occurrence="earliest", pld_chain_tokens=20, adjacency_scores="top-k",
                  ema_init=0.5, gt_threshold=0.0, gt_chain_steps=1000.0),  # the authors' extension: no GT cap
}

__all__ = ["BRANCH_GROWTH", "BYPASS_RULES", "CALIBRATE_AT", "CANDIDATE_TREE_METHODS", "FLAT_NAMES", "GT_RATES",
           "GT_RULES", "METHODS", "PRESETS", "SOURCES", "SPINE_RULES", "VARIANTS", "VERIFIERS", "WALK_PRIORITY",
           "ConfigError", "DecodeConfig", "GtConfig", "Resolved", "SamplerConfig", "TreeShape", "Variant",
           "parse_gt_threshold", "parse_names"]
