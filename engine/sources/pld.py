"""PLD spine source: n-gram prompt lookup over the prompt and the output (the context matcher and the match
confidence), and its adapter.

Source: Goose paper, Appendix B.2 (CONTEXTMATCH, called at line 5 of Algorithm 2) and §4.3 (the
confidence signal: consensus and chain length); PLD itself is Saxena (2023).  The paper leaves three
things unsaid that the authors' implementation (2kinto/GOOSE_Speculative_Decoding, read, not copied)
settles, and this module follows it where the benchmark measured it better (docs/results.md,
"Fidelity to the authors' implementation"):

- which earlier occurrence is copied: the earliest one, whose continuation is the longest (the most
  recent one is often cut off by the end of the stream);
- how confidence is computed from its two indicators (``match_confidence``);
- how a confident match is grown past one lookup (``engine.sources.base.extend_chain``, asking again below
  the chain: ``NgramIndex.match`` with a ``suffix`` that runs past the indexed tokens).

``PldSource`` adapts the matcher to the draft-source protocol (``engine.sources.base``); asked below a drafted
path (the confident extension of §4.3), it matches the context plus that path.

``pld_kernel.py`` states the same compiled (numba), over arrays, for the one-entry cycle (issue 71); the two must
change together (tests/test_pld_kernel.py compares them).
"""
from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

from ..core.checks import check, one_of
from ..core.estimates import AcceptanceStats
from .base import Candidates, Request, Role, RunConfig, SourceInfo, SourceMemory, Verified
from .engines import Serve

#: Which earlier occurrence of the suffix n-gram the match copies.
OCCURRENCES = ("earliest", "latest")


@dataclass(frozen=True)
class PldConfig:
    """PLD's own settings (``DecodeConfig.source_config("pld")``); ``FLAT`` names each field as the CLI and trace
    files do."""

    ngram_sizes: tuple[int, ...] = (5, 4, 3)  # context-match n, longest first (B.2)
    chain_tokens: int = 20  # chain length of the 'pld' method, PLD alone (authors' Table 5 "max spine
    # continuation"; HF's default 10 drafts less: docs/results.md, "Fidelity"); in a tree ``TreeShape.max_spine``
    match_occurrence: str = "auto"  # earlier occurrence of the suffix n-gram copied ("auto", or OCCURRENCES):
    # auto = latest when the confidence schedule re-matches (re-matching grows a chain the stream's end cut
    # short, and recent text predicts better), else earliest (docs/results.md, "Fidelity to the authors'
    # implementation")
    pooled_prior: bool = True  # per-depth PLD acceptance estimates shrink to the pooled PLD rate, not 0.5:
    # the GT "auto" size choice otherwise prices long spines at 0.5^k (A/B: docs/results.md, "GT principle")

    FLAT: ClassVar[dict[str, str]] = {"ngram_sizes": "ngram_sizes", "chain_tokens": "pld_chain_tokens",
                                      "match_occurrence": "match_occurrence", "pooled_prior": "pooled_pld_prior"}
    extra_rows: ClassVar[int] = 0  # PLD rides no rows along in the forward

    def __post_init__(self) -> None:
        check([(len(self.ngram_sizes) >= 1 and min(self.ngram_sizes) >= 1, "n-gram sizes must be positive"),
               (self.chain_tokens >= 1, f"PLD chain tokens must be >= 1 (got {self.chain_tokens})"),
               one_of(self.match_occurrence, ("auto", *OCCURRENCES), "match occurrence")])
        object.__setattr__(self, "ngram_sizes", tuple(sorted(self.ngram_sizes, reverse=True)))

    def serve(self) -> Serve:
        """The nearest engine drafter: vLLM's ngram over the same n range and chain length."""
        return Serve("vLLM", {"method": "ngram", "num_speculative_tokens": self.chain_tokens,
                              "prompt_lookup_max": max(self.ngram_sizes), "prompt_lookup_min": min(self.ngram_sizes)},
                     differs="vLLM's ngram copies after the earliest occurrence of the longest suffix match in the "
                             "whole n range; PLD alone does the same over its listed sizes, and in a Goose tree it "
                             "takes the latest occurrence and grows confident chains.")


class PldMatch(NamedTuple):
    """Result of one context-match query (a NamedTuple: a confident cycle's chain extension asks dozens).

    Attributes:
        draft: continuation token ids copied from the context (the spine candidates), possibly empty.
        n: n-gram length that produced ``draft`` (0 when there is no match).
        consensus: True iff at least two n-gram lengths return continuations that agree on the first
            token (the paper's wording, Appendix B.2).
        unanimous: True iff the matched n-gram occurs at least twice earlier and every occurrence
            continues with the same token (the authors' code's consensus: the match is template
            rather than content).
    """

    draft: tuple[int, ...] = ()
    n: int = 0
    consensus: bool = False
    unanimous: bool = False


def match_confidence(length: int, unanimous: bool, long_match: int = 8, max_len: int = 20) -> float:
    """Confidence in [0, 1] of a context match of ``length`` tokens (Goose §4.3).

    The two indicators of §4.3, combined as in the authors' code: a unanimous match saturates the scale
    (1.0); a long match (``length >= long_match``) starts at 0.7 and reaches 0.9 at ``max_len`` (the
    longest continuation one lookup copies); a shorter one scales linearly up to 0.6 (exclusive).
    No match: 0.0.
    """
    if length <= 0:
        return 0.0
    if unanimous:
        return 1.0
    if length >= long_match:
        return min(0.9, 0.7 + 0.2 * (length - long_match) / max(1, max_len - long_match))
    return 0.6 * length / long_match


class NgramIndex:
    """Incremental index ``n-gram -> end positions`` for every n in ``ngram_sizes``.

    ``extend`` indexes only the newly appended tokens, so a query never rescans the sequence.
    The index owns its copy of the token sequence (prompt + generated).

    Args:
        ngram_sizes: query lengths n, any order (queried longest first).
        occurrence: "earliest" or "latest" (``OCCURRENCES``): which earlier occurrence is copied.
    """

    def __init__(self, ngram_sizes: tuple[int, ...] = (5, 4, 3), occurrence: str = "earliest") -> None:
        if occurrence not in OCCURRENCES:
            raise ValueError(f"occurrence must be one of {', '.join(OCCURRENCES)} (got {occurrence!r})")
        self.ngram_sizes = tuple(sorted(ngram_sizes, reverse=True))
        self.occurrence = occurrence
        self.tokens: list[int] = []
        self._positions: dict[int, dict[tuple[int, ...], list[int]]] = {n: defaultdict(list) for n in self.ngram_sizes}

    def extend(self, new_tokens: list[int]) -> None:
        """Append tokens and index every n-gram that ends at one of them. O(len(new_tokens) * |ngram_sizes|)."""
        start = len(self.tokens)
        self.tokens.extend(int(t) for t in new_tokens)
        for end in range(start, len(self.tokens)):
            for n in self.ngram_sizes:
                if end + 1 >= n:
                    self._positions[n][tuple(self.tokens[end + 1 - n : end + 1])].append(end)

    def match(self, max_len: int, suffix: list[int] | tuple[int, ...] | None = None) -> PldMatch:
        """Look up the last n tokens of ``suffix`` (default: of the sequence), longest n first.

        Only occurrences followed by at least one indexed token count.  For each n, the earliest (or the
        most recent, per ``occurrence``) one supplies up to ``max_len`` continuation tokens.  The draft
        comes from the longest n that matches; ``consensus`` and ``unanimous`` are set as ``PldMatch``
        says.  ``suffix`` may run past the sequence (a chain drafted this cycle): the continuation is
        still copied from the indexed tokens only.
        """
        query = self.tokens if suffix is None else suffix
        last = len(self.tokens) - 1  # an occurrence ending here has nothing after it to copy
        draft: tuple[int, ...] = ()
        best_n, unanimous = 0, False
        first_tokens: list[int] = []
        for n in self.ngram_sizes:
            if len(query) < n:
                continue
            found = self._positions[n].get(tuple(query[len(query) - n :]), ())  # ascending: ``extend`` appends
            ends = found[: bisect_left(found, last)]
            if not ends:
                continue
            end = ends[0] if self.occurrence == "earliest" else ends[-1]
            cont = tuple(self.tokens[end + 1 : end + 1 + max_len])
            first_tokens.append(cont[0])
            if not draft:
                draft, best_n = cont, n
                unanimous = len(ends) >= 2 and len({self.tokens[e + 1] for e in ends}) == 1
        consensus = bool(draft) and first_tokens.count(draft[0]) >= 2
        return PldMatch(draft=draft, n=best_n, consensus=consensus, unanimous=unanimous)


class PldSource:
    """Proposes the continuation of the longest earlier n-gram match, as a chain.

    Each chain token's estimate is the per-depth PLD acceptance rate; with ``pooled_pld_prior`` its Beta
    prior (weight 2) is centred on the rate pooled over all depths, so deep nodes of extended chains,
    rarely reached, start from what the spine achieves instead of 0.5 (docs/results.md, "GT principle").
    """

    info = SourceInfo("pld", "PLD spine", "PLD", "#0072B2", Role.SPINE,
                      "copied from an earlier n-gram match in the prompt or the output (prompt lookup)",
                      tint="#b2d5e8", method_label="PLD only (chain)")
    top_k = 0

    config_type = PldConfig  # its own settings: DecodeConfig.source_config(info.name) holds one

    def __init__(self, cfg: RunConfig, stats: AcceptanceStats, memory: SourceMemory) -> None:
        own: PldConfig = cfg.source_config(self.info.name)
        alone = cfg.drafts_alone  # the PLD baseline: one chain, no tree, no re-matching
        occurrence = own.match_occurrence
        if occurrence == "auto":  # latest when the confidence schedule grows chains by re-matching
            occurrence = "latest" if cfg.variant.confidence_schedule and not alone else "earliest"
        self.index = NgramIndex(own.ngram_sizes, occurrence)
        self.chain_tokens = own.chain_tokens if alone else cfg.tree.max_spine  # one lookup's length
        self.alone = alone
        self.long_match, self.max_spine, self.pooled_prior = cfg.tree.bypass_threshold, cfg.tree.max_spine, \
            own.pooled_prior
        self.counter = stats.counter(self.info.source)

    def prefill(self, prompt: Sequence[int], back) -> None:
        pass  # the index catches up with the context it is asked about (``propose``)

    def propose(self, request: Request) -> Candidates:
        if len(request.context) > len(self.index.tokens):  # the tokens committed since last asked
            self.index.extend(list(request.context[len(self.index.tokens):]))
        suffix = None if not request.path else request.tail(self.index.ngram_sizes[0])
        match = self.index.match(self.chain_tokens if self.alone else min(self.chain_tokens, request.budget), suffix)
        if not match.draft:
            return Candidates()
        confidence = match_confidence(len(match.draft), match.unanimous, self.long_match, self.max_spine)
        first, prior = request.depth + 1, self.prior()
        return Candidates.chain(match.draft, [self.counter.rate(first + i, prior) for i in range(len(match.draft))],
                                match=match.n, confidence=confidence, consensus=match.consensus)

    def rate(self, depth: int) -> float:
        """Estimated acceptance of a spine token at ``depth`` given its parent was accepted."""
        return self.counter.rate(depth, self.prior())

    def prior(self) -> float:
        """The mean of each depth's Beta prior: the rate pooled over all depths, or 0.5 (``pooled_prior`` off)."""
        return self.counter.pooled() if self.pooled_prior else 0.5

    def observe(self, verified: Verified) -> None:
        pass  # PLD learns nothing from the forward: it copies the context
