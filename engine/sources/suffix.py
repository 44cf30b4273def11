"""Suffix source: frequency-counted suffix trees over this request and over the user's earlier outputs.

Source: SuffixDecoding (Oliaro et al., arXiv 2411.04975), as in Snowflake's ArcticInference and vLLM's
``method: suffix``: a per-request tree over the prompt and the output so far, a global tree over earlier
outputs; the longest suffix of the context found in a tree is its match, and the speculation tree grows
best-first from the matched node by continuation frequency, up to ``factor x match length`` nodes (the
adaptive size), stopping at candidates less likely than ``min_prob``.

The trees are counted suffix tries cut at ``depth`` (``SuffixTrie``): every substring of up to ``depth``
tokens is a path, each node counting the occurrences of its substring, so a continuation's probability
is its count over its siblings'.  No maintained Python suffix-tree library keeps counts and removes
sequences (ArcticInference's C++ tree ships inside its vLLM plugin), so this is ~150 lines of our own.

The global tree belongs to one user (the page keeps it in ``gr.State`` through ``SourceMemory``) and
holds at most ``suffix_memory_tokens`` tokens of their earlier outputs of runs that used this source,
oldest evicted; it is never shared.
"""
from __future__ import annotations

import heapq
import itertools
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from ..core.checks import check
from ..core.estimates import AcceptanceStats
from .base import Candidates, Locked, Request, Role, RunConfig, SourceInfo, SourceMemory, Verified
from .engines import Serve


@dataclass(frozen=True)
class SuffixConfig:
    """The suffix source's own settings (``DecodeConfig.source_config("suffix")``); ``FLAT`` names each field as the
    CLI and trace files do."""

    max_depth: int = 24  # depth of the suffix tries, which bounds the matched suffix plus the speculation below it
    # (vLLM's suffix_decoding_max_tree_depth default, 24)
    spec_factor: float = 4.0  # adaptive size: at most factor x (match length) candidates; vLLM's default 1.0 lost
    # tau on every dataset, demo model and SmolLM2 (docs/results.md, "Suffix source": +0.05 to +0.4)
    min_prob: float = 0.1  # candidates whose estimated path probability is below this are not proposed (vLLM's
    # suffix_decoding_min_token_prob default, 0.1)
    memory_tokens: int = 4096  # earlier output tokens one user's suffix tree keeps (oldest outputs evicted);
    # bounds what a visitor holds on a shared server (~6.7 KB per token at depth 24: ~27 MB)

    FLAT: ClassVar[dict[str, str]] = {"max_depth": "suffix_max_depth", "spec_factor": "suffix_spec_factor",
                                      "min_prob": "suffix_min_prob", "memory_tokens": "suffix_memory_tokens"}
    extra_rows: ClassVar[int] = 0  # the suffix source rides no rows along in the forward

    def __post_init__(self) -> None:
        check([(self.max_depth >= 1 and self.spec_factor > 0 and 0.0 <= self.min_prob < 1.0
                and self.memory_tokens >= 0, "suffix depth must be >= 1, spec factor > 0, min probability in "
                "[0, 1), memory >= 0 tokens")])

    def serve(self) -> Serve:
        """The nearest engine drafter: vLLM's suffix method with the same depth, factor and probability floor."""
        return Serve("vLLM", {"method": "suffix", "num_speculative_tokens": self.max_depth,
                              "suffix_decoding_max_tree_depth": self.max_depth,
                              "suffix_decoding_max_spec_factor": self.spec_factor,
                              "suffix_decoding_min_token_prob": self.min_prob},
                     differs="vLLM verifies one path, the best-scoring over every match length; this suffix method "
                             "verifies a best-first tree below the longest match (the vllm-suffix method is vLLM's).")


class SuffixTrie:
    """Counted suffix trie of one or more token sequences, cut at ``depth``.

    A node is ``[count, children]`` (``children``: token -> node); ``count`` is how many times the path's
    substring occurs.  ``append`` extends the last sequence incrementally (O(depth) per token);
    ``remove`` takes a whole sequence back out.
    """

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.root: list = [0, {}]
        self._open: list[list] = []  # nodes of the suffixes of the open sequence that can still grow

    def start(self) -> None:
        """Begin a new sequence: no substring spans two sequences."""
        self._open = []

    def append(self, tokens: Sequence[int]) -> None:
        for tok in tokens:
            grown = []
            for node in [*self._open, self.root]:
                child = node[1].get(tok)
                if child is None:
                    child = node[1][tok] = [0, {}]
                child[0] += 1
                grown.append(child)
            self._open = grown[-(self.depth - 1):] if self.depth > 1 else []

    def remove(self, tokens: Sequence[int]) -> None:
        """Take one earlier-added sequence back out (counts decremented, empty nodes dropped)."""
        for start in range(len(tokens)):
            node = self.root
            for tok in tokens[start:start + self.depth]:
                child = node[1][tok]
                child[0] -= 1
                if child[0] == 0:
                    del node[1][tok]
                    break
                node = child

    def find(self, pattern: Sequence[int]) -> list | None:
        """The node of ``pattern``, or None when it never occurred."""
        node = self.root
        for tok in pattern:
            node = node[1].get(tok)
            if node is None:
                return None
        return node

    def longest_match(self, context: Sequence[int]) -> tuple[int, list | None]:
        """(m, node): the longest suffix of ``context`` (m < depth, so one more token fits below it) that
        occurs in the trie with a continuation, and its node; (0, None) when none does."""
        for m in range(min(self.depth - 1, len(context)), 0, -1):
            node = self.find(context[len(context) - m:])
            if node is not None and node[1]:
                return m, node
        return 0, None


def speculate(node: list, room: int, limit: int, min_prob: float, match: int) -> Candidates:
    """Best-first speculation tree below a matched node, as ``Candidates`` (scores and estimates: conditional
    probabilities; ``match``: the matched suffix length).

    Candidates are expanded by path probability (the product of count / sibling-count along the path)
    until ``limit`` nodes, ``room`` levels, or a path probability below ``min_prob``.
    """
    tokens: list[int] = []
    parents: list[int | None] = []
    probs: list[float] = []
    order = itertools.count()
    heap: list = []  # (-path probability, tie, parent index, depth, token, conditional probability, its node)

    def push(at: list, index: int | None, path_p: float, depth: int) -> None:
        if depth >= room:
            return
        total = sum(child[0] for child in at[1].values())
        for tok, child in at[1].items():
            q = child[0] / total
            if path_p * q >= min_prob:
                heapq.heappush(heap, (-path_p * q, next(order), index, depth, tok, q, child))

    push(node, None, 1.0, 0)
    while heap and len(tokens) < limit:
        neg_p, _, parent, depth, tok, q, child = heapq.heappop(heap)
        tokens.append(tok)
        parents.append(parent)
        probs.append(q)
        push(child, len(tokens) - 1, -neg_p, depth + 1)
    return Candidates(tuple(tokens), tuple(parents), tuple(probs), tuple(probs), match=match)


class SuffixMemory(Locked):
    """One user's global suffix tree over their earlier outputs, bounded to ``max_tokens`` tokens.

    A request's output joins it when the request finishes (EOS or max new tokens; a stopped run's partial
    output does not); the oldest outputs are removed to stay within the bound.  Thread-safe: one user's
    race runs two generations at once.
    """

    def __init__(self, depth: int, max_tokens: int) -> None:
        self.trie = SuffixTrie(depth)
        self.max_tokens = max_tokens
        self.outputs: deque[tuple[int, ...]] = deque()
        self.tokens = 0
        self.lock = threading.Lock()

    def add(self, output: Sequence[int]) -> None:
        """Add a finished request's output, then evict the oldest outputs beyond ``max_tokens``."""
        with self.lock:
            if output and len(output) <= self.max_tokens:
                self.outputs.append(tuple(output))
                self.tokens += len(output)
                self.trie.start()
                self.trie.append(output)
            while self.tokens > self.max_tokens:
                old = self.outputs.popleft()
                self.tokens -= len(old)
                self.trie.remove(old)

    def speculate(self, context: Sequence[int], limit_of, min_prob: float) -> Candidates:
        """``speculate`` below the longest suffix of ``context`` found here (``limit_of(m)``: the size for a
        match of m tokens); empty when none is found."""
        with self.lock:
            m, node = self.trie.longest_match(context)
            return speculate(node, self.trie.depth - m, limit_of(m), min_prob, m) if node else Candidates()


class SuffixSource:
    """Proposes the better of the two trees' speculations (more expected accepted tokens), below any node.

    ``match`` is the matched suffix length; the main path (the most frequent continuation) competes with PLD's
    chain for the spine (the longer chain wins, ``Planner.draft``); a candidate's estimate and score are
    its continuation frequency over its siblings' (ours: ArcticInference's exact normalisation was not
    checked).  ``confidence`` is 0: the §4.3 schedule is defined for context-match lengths, not frequencies.
    """

    info = SourceInfo("suffix", "Suffix tree", "Suffix", "#CC79A7", Role.SPINE,
                      "the most frequent continuations of the longest suffix match, over the prompt, the output "
                      "and this visitor's earlier outputs (SuffixDecoding)",
                      tint="#d48db4", method_label="Suffix tree only (SuffixDecoding)", candidate_tree=True)
    top_k = 0

    config_type = SuffixConfig  # its own settings: DecodeConfig.source_config(info.name) holds one

    def __init__(self, cfg: RunConfig, stats: AcceptanceStats, memory: SourceMemory) -> None:
        own: SuffixConfig = cfg.source_config(self.info.name)
        self.depth, self.factor, self.min_prob = own.max_depth, own.spec_factor, own.min_prob
        self.local = SuffixTrie(self.depth)
        self.seen = 0  # context tokens already in ``local``
        self.memory: SuffixMemory = memory.slot(f"suffix/depth={self.depth}",
                                                lambda: SuffixMemory(self.depth, own.memory_tokens))
        self.memory.max_tokens = own.memory_tokens  # this run's bound applies from its output on

    def prefill(self, prompt: Sequence[int], back) -> None:
        pass  # the local tree catches up with the context it is asked about (``propose``)

    def propose(self, request: Request) -> Candidates:
        self._catch_up(request.context)
        query = request.tail(self.depth - 1)

        def limit_of(m: int) -> int:  # the adaptive size: factor x match length, within the budget
            return min(request.budget, max(1, int(self.factor * m)))

        m, node = self.local.longest_match(query)
        local = speculate(node, self.depth - m, limit_of(m), self.min_prob, m) if node else Candidates()
        earlier = self.memory.speculate(query, limit_of, self.min_prob)
        return max((local, earlier), key=_expected)  # ties: this request's own tree

    def observe(self, verified: Verified) -> None:
        if verified.finished:
            self.memory.add(verified.output)

    def _catch_up(self, context: Sequence[int]) -> None:
        """Add the context tokens the local tree has not seen (the prompt at first, then each cycle's output)."""
        self.local.append(context[self.seen:])
        self.seen = len(context)


def _expected(cands: Candidates) -> float:
    """Expected accepted tokens of a speculation tree: the sum of its path probabilities."""
    path: list[float] = []
    for parent, q in zip(cands.parents, cands.p):
        path.append(q * (1.0 if parent is None else path[parent]))
    return sum(path)
