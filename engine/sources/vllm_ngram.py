"""vLLM's n-gram drafter (``--speculative-config '{"method": "ngram", ...}'``), as a draft source.

Source: vLLM, ``vllm/v1/spec_decode/ngram_proposer.py``, ``_find_longest_matched_ngram_and_propose_tokens``
(read at commit adce4e9a, v0.11 line; our own code): the longest suffix of the context, of
``prompt_lookup_min`` to ``prompt_lookup_max`` tokens, that occurred earlier; its *earliest* occurrence (the
code's KMP over the reversed tokens keeps the last, i.e. farthest back, position of the longest match); the
``num_speculative_tokens`` tokens that followed it are the draft, one chain, fewer where the context ends
first.  A suffix longer than the context less one token is never looked up, and an occurrence may overlap the
suffix itself (``1 2 1 2 1 2`` drafts ``1 2 1 2`` after the first ``1 2``).  vLLM also cuts the draft at the
model's length; here the decoding loop fits every tree to the model's positions.

Differences from goose-lens's own PLD source (``pld.py``): one n-gram range instead of a list of sizes, no
confidence signal (vLLM has none), and the chain's length is the engine's k, not Table 5's 20.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from ..core.checks import check
from ..core.estimates import AcceptanceStats
from .base import Candidates, Request, Role, RunConfig, SourceInfo, SourceMemory, Verified
from .engines import Serve


@dataclass(frozen=True)
class VllmNgramConfig:
    """vLLM's n-gram settings under its own names (``DecodeConfig.source_config("vllm-ngram")``), its defaults
    (``vllm/config/speculative.py``): with both lookup bounds unset vLLM takes 5 for each, with one unset it takes the
    other's value (``UNSET``); ``num_speculative_tokens`` has no default there (required), 5 is its docs' example."""

    prompt_lookup_min: int = field(default=5)  # shortest suffix n-gram looked up (vLLM: the max when unset)
    prompt_lookup_max: int = field(default=5)  # longest suffix n-gram looked up (vLLM default 5)
    num_speculative_tokens: int = field(default=5)  # k: tokens copied after the match (required by vLLM; the
    # docs' example value)

    FLAT: ClassVar[dict[str, str]] = {"prompt_lookup_min": "vllm_prompt_lookup_min",
                                      "prompt_lookup_max": "vllm_prompt_lookup_max",
                                      "num_speculative_tokens": "vllm_ngram_num_speculative_tokens"}
    extra_rows: ClassVar[int] = 0  # no rows ride along in the forward
    #: vLLM's rule for a bound left out of the settings given: it takes the other's value (``--drafter
    #: prompt_lookup_max=4``, its docs' example, is 4..4, not 5..4)
    UNSET: ClassVar[dict[str, str]] = {"prompt_lookup_min": "prompt_lookup_max",
                                       "prompt_lookup_max": "prompt_lookup_min"}

    def __post_init__(self) -> None:
        check([(1 <= self.prompt_lookup_min <= self.prompt_lookup_max,
                f"prompt_lookup_min must be >= 1 and <= prompt_lookup_max (got {self.prompt_lookup_min}, "
                f"{self.prompt_lookup_max})"),
               (self.num_speculative_tokens >= 1,
                f"num_speculative_tokens must be >= 1 (got {self.num_speculative_tokens})")])

    def serve(self) -> Serve:
        """vLLM's ``--speculative-config`` that runs this drafter."""
        return Serve("vLLM", {"method": "ngram", "num_speculative_tokens": self.num_speculative_tokens,
                              "prompt_lookup_max": self.prompt_lookup_max, "prompt_lookup_min": self.prompt_lookup_min})


class FirstOccurrences:
    """Incremental index ``n-gram -> end position of its first occurrence`` for n in ``lo..hi``.

    ``extend`` indexes the newly appended tokens only; ``draft`` answers vLLM's query without a rescan.
    """

    def __init__(self, lo: int, hi: int) -> None:
        self.sizes = range(hi, lo - 1, -1)  # longest first
        self.tokens: list[int] = []
        self.first: dict[tuple[int, ...], int] = {}

    def extend(self, new: Sequence[int]) -> None:
        start = len(self.tokens)
        self.tokens.extend(int(t) for t in new)
        for end in range(start, len(self.tokens)):
            for n in self.sizes:
                if end + 1 >= n:
                    self.first.setdefault(tuple(self.tokens[end + 1 - n:end + 1]), end)

    def draft(self, k: int, query: Sequence[int]) -> tuple[tuple[int, ...], int]:
        """(draft, n): up to ``k`` tokens after the earliest occurrence of the longest suffix n-gram of ``query``
        (default: the indexed tokens) that some indexed token follows; ((), 0) when none of ``lo..hi`` matches.
        Suffixes longer than ``len(query) - 1`` are not looked up (vLLM's loop never reaches them)."""
        last = len(self.tokens) - 1
        for n in self.sizes:
            if n > len(query) - 1:
                continue
            end = self.first.get(tuple(query[len(query) - n:]))
            if end is not None and end < last:
                return tuple(self.tokens[end + 1:end + 1 + k]), n
        return (), 0


class VllmNgramSource:
    """Proposes vLLM's n-gram draft as a chain; each token's estimate is this run's per-depth acceptance rate
    (the GT rule reads it; vLLM verifies the whole chain)."""

    info = SourceInfo("vllm-ngram", "vLLM ngram", "vLLM-ngram", "#9600FF", Role.SPINE,
                      "copied after the earliest earlier occurrence of the longest suffix n-gram (vLLM's ngram "
                      "drafter)", tint="#ff00fb", method_label="vLLM ngram (engine's drafter, chain)")
    top_k = 0

    config_type = VllmNgramConfig

    def __init__(self, cfg: RunConfig, stats: AcceptanceStats, memory: SourceMemory) -> None:
        own: VllmNgramConfig = cfg.source_config(self.info.name)
        self.k = own.num_speculative_tokens
        self.index = FirstOccurrences(own.prompt_lookup_min, own.prompt_lookup_max)
        self.counter = stats.counter(self.info.source)

    def prefill(self, prompt: Sequence[int], back) -> None:
        pass  # the index catches up with the context it is asked about

    def propose(self, request: Request) -> Candidates:
        self.index.extend(request.context[len(self.index.tokens):])
        query = [*request.context, *request.path] if request.path else request.context
        draft, n = self.index.draft(min(self.k, request.budget) if request.path else self.k, query)
        first = request.depth + 1
        pooled = self.counter.pooled()
        return Candidates.chain(draft, [self.counter.rate(first + i, pooled) for i in range(len(draft))], match=n)

    def observe(self, verified: Verified) -> None:
        pass  # copies the context; learns nothing from the forward
