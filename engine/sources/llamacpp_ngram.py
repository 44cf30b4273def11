"""llama.cpp's ``ngram-simple`` drafter (``llama-server --spec-type ngram-simple``), as a draft source.

Source: llama.cpp, ``common/ngram-map.cpp`` ``common_ngram_simple_draft`` (read at commit 82bb48500, build b10309;
the function is unchanged since it came in b7864) and the server's call in ``tools/server/server-context.cpp``;
our own code.  With n = ``spec-ngram-simple-size-n`` and m = ``spec-ngram-simple-size-m``:

- the pattern is the context's last n tokens; it is looked for in the context before the token just sampled,
  backwards from the latest start that leaves it room, down to position 1 (position 0 is never matched): the
  *most recent* earlier occurrence wins;
- nothing is drafted while the context before that token is n + m + 1 tokens or fewer, nor when fewer than n
  tokens follow the occurrence;
- otherwise up to m tokens that followed it are the draft, one chain.

The server then cuts the draft to the context and the request's ``n_predict`` budget only (here the decoding loop
fits every tree to the model's positions and the run's length).  ``--spec-ngram-simple-min-hits`` is accepted by the
server and read by nothing (so it is not a setting here).  Builds b7864 to b8954 named the flags
``--spec-ngram-size-n`` / ``-m`` and also cut drafts to ``--draft-max`` (16).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from ..core.checks import check
from ..core.estimates import AcceptanceStats
from .base import Candidates, Request, Role, RunConfig, SourceInfo, SourceMemory, Verified
from .engines import Serve


@dataclass(frozen=True)
class LlamacppNgramConfig:
    """llama.cpp's ngram-simple settings under its own names (``common/common.h``
    ``common_params_speculative_ngram_map`` defaults)."""

    spec_ngram_simple_size_n: int = 12  # n: the pattern's length (llama.cpp default 12)
    spec_ngram_simple_size_m: int = 48  # m: most tokens drafted (llama.cpp default 48)

    FLAT: ClassVar[dict[str, str]] = {"spec_ngram_simple_size_n": "spec_ngram_simple_size_n",
                                      "spec_ngram_simple_size_m": "spec_ngram_simple_size_m"}
    extra_rows: ClassVar[int] = 0

    def __post_init__(self) -> None:
        check([(1 <= self.spec_ngram_simple_size_n <= 1024 and 1 <= self.spec_ngram_simple_size_m <= 1024,
                "spec_ngram_simple_size_n and spec_ngram_simple_size_m must be in 1..1024 (llama.cpp's range)")])

    def serve(self) -> Serve:
        """llama-server's flags that run this drafter, as build b10309 names them (b7864 to b8954: see the module)."""
        return Serve("llama.cpp", {"spec-type": "ngram-simple",
                                   "spec-ngram-simple-size-n": self.spec_ngram_simple_size_n,
                                   "spec-ngram-simple-size-m": self.spec_ngram_simple_size_m})


def simple_draft(context: Sequence[int], n: int, m: int) -> tuple[int, ...]:
    """``common_ngram_simple_draft``: the draft after the most recent earlier occurrence of ``context``'s last
    ``n`` tokens (the module's rules; () for none).  ``context`` ends with the token just sampled."""
    history = len(context) - 1  # the server's "tokens": the context before the token just sampled
    if history <= n + m + 1:
        return ()
    pattern = list(context[len(context) - n:])
    for j in range(history - n - 1, 0, -1):
        if list(context[j:j + n]) == pattern:
            copy = min(m, history - (j + n))
            return tuple(context[j + n:j + n + copy]) if copy >= n else ()
    return ()


class LlamacppNgramSource:
    """Proposes llama.cpp's ngram-simple draft as a chain; each token's estimate is this run's per-depth
    acceptance rate (llama.cpp verifies the whole chain)."""

    info = SourceInfo("llamacpp-ngram", "llama.cpp ngram-simple", "llama.cpp", "#C3B469", Role.SPINE,
                      "copied after the most recent earlier occurrence of the last n tokens (llama.cpp's "
                      "ngram-simple drafter)", tint="#e1bb8e", method_label="llama.cpp ngram-simple (engine's "
                      "drafter, chain)")
    top_k = 0

    config_type = LlamacppNgramConfig

    def __init__(self, cfg: RunConfig, stats: AcceptanceStats, memory: SourceMemory) -> None:
        own: LlamacppNgramConfig = cfg.source_config(self.info.name)
        self.n, self.m = own.spec_ngram_simple_size_n, own.spec_ngram_simple_size_m
        self.counter = stats.counter(self.info.source)

    def prefill(self, prompt: Sequence[int], back) -> None:
        pass  # stateless: llama.cpp's begin / process / accept do nothing for this type

    def propose(self, request: Request) -> Candidates:
        if request.path:  # below a drafted path (a Goose tree's extension): the path extends the context
            draft = simple_draft([*request.context, *request.path], self.n, self.m)[:request.budget]
        else:
            draft = simple_draft(request.context, self.n, self.m)
        first = request.depth + 1
        pooled = self.counter.pooled()
        return Candidates.chain(draft, [self.counter.rate(first + i, pooled) for i in range(len(draft))],
                                match=self.n if draft else 0)

    def observe(self, verified: Verified) -> None:
        pass
