"""vLLM's suffix drafter (``--speculative-config '{"method": "suffix", ...}'``), as a draft source.

Source: vLLM, ``vllm/v1/spec_decode/suffix_decoding.py`` (read at commit 044ac3a0), over Arctic Inference's
``SuffixDecodingCache`` (``arctic_inference/suffix_decoding/cache.py``) and ``SuffixTree::speculate`` /
``_speculate_path`` (``csrc/suffix_decoding/suffix_tree.cc``, unchanged since v0.1.0); our own code:

- two counted suffix trees cut at ``suffix_decoding_max_tree_depth``: the request's own (prompt and output as one
  sequence) and a global one over responses only (earlier requests' and this one's so far), the oldest evicted
  beyond ``suffix_decoding_max_cached_requests``; a node counts every occurrence of its substring, the one ending
  at the sequence's end included, so a continuation's probability is its count over its parent's;
- the pattern is the context's last ``max_tree_depth`` tokens; every match length from 1 up to the pattern's
  length less one is tried, shortest first, stopping at the first that does not occur; each drafts the *path*
  (vLLM does not ask for Arctic's tree) of most frequent children, at most ``int(match_len x max_spec_factor)``
  and ``num_speculative_tokens`` tokens, while the running product of count ratios stays at or above
  ``suffix_decoding_min_token_prob``; its score is the sum of those products; the best score wins, a tie going to
  the longer match;
- of the two trees' drafts the higher score wins, a tie going to the request's own tree;
- among children of equal count the first in Arctic's sibling list is the most frequent: a new child joins the
  list's end, and a child whose count grows moves to the head of its new count group (``OrderedTrie``).

goose-lens's own suffix source (``suffix.py``) drafts a best-first *tree* from the longest match only; this module
is the engine's drafter, for people who deploy it.  The global tree belongs to one user (``SourceMemory``) and is
also bounded in tokens (``memory_tokens``, not a vLLM flag) on a shared server.
"""
from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from ..core.checks import check
from ..core.estimates import AcceptanceStats
from .base import Candidates, Request, Role, RunConfig, Serve, SourceInfo, SourceMemory, Verified


@dataclass(frozen=True)
class VllmSuffixConfig:
    """vLLM's suffix settings under its own names (``DecodeConfig.source_config("vllm-suffix")``), its defaults
    (``vllm/config/speculative.py``; ``num_speculative_tokens`` defaults to the tree depth there)."""

    num_speculative_tokens: int = 24  # most tokens drafted (vLLM: suffix_decoding_max_tree_depth when unset)
    suffix_decoding_max_tree_depth: int = 24  # depth of both trees: match plus draft
    suffix_decoding_max_cached_requests: int = 10000  # responses the global tree keeps (0: no global tree)
    suffix_decoding_max_spec_factor: float = 1.0  # draft at most factor x match length tokens
    suffix_decoding_min_token_prob: float = 0.1  # stop where the path's estimated probability falls below this
    memory_tokens: int = 4096  # goose-lens's bound on one visitor's global tree (not a vLLM flag; ~27 MB)

    FLAT: ClassVar[dict[str, str]] = {"num_speculative_tokens": "vllm_suffix_num_speculative_tokens",
                                      "suffix_decoding_max_tree_depth": "vllm_suffix_decoding_max_tree_depth",
                                      "suffix_decoding_max_cached_requests": "vllm_suffix_decoding_max_cached_requests",
                                      "suffix_decoding_max_spec_factor": "vllm_suffix_decoding_max_spec_factor",
                                      "suffix_decoding_min_token_prob": "vllm_suffix_decoding_min_token_prob",
                                      "memory_tokens": "vllm_suffix_memory_tokens"}
    extra_rows: ClassVar[int] = 0

    def __post_init__(self) -> None:
        check([(self.num_speculative_tokens >= 1 and self.suffix_decoding_max_tree_depth >= 1,
                "num_speculative_tokens and suffix_decoding_max_tree_depth must be >= 1"),
               (self.suffix_decoding_max_cached_requests >= 0 and self.memory_tokens >= 0,
                "suffix_decoding_max_cached_requests and the memory bound must be >= 0"),
               (self.suffix_decoding_max_spec_factor >= 0 and 0.0 <= self.suffix_decoding_min_token_prob <= 1.0,
                "suffix_decoding_max_spec_factor must be >= 0 and suffix_decoding_min_token_prob in [0, 1]")])

    def serve(self) -> Serve:
        """vLLM's ``--speculative-config`` that runs this drafter (``memory_tokens`` is ours, not vLLM's)."""
        return Serve("vLLM", {"method": "suffix", "num_speculative_tokens": self.num_speculative_tokens,
                              **{k: getattr(self, k) for k in ("suffix_decoding_max_tree_depth",
                                                               "suffix_decoding_max_cached_requests",
                                                               "suffix_decoding_max_spec_factor",
                                                               "suffix_decoding_min_token_prob")}})


class Node:
    """A trie node: how many times its substring occurs, its children by token, and their order (Arctic's)."""

    __slots__ = ("count", "kids", "order")

    def __init__(self) -> None:
        self.count = 0
        self.kids: dict[int, Node] = {}
        self.order: list[int] = []  # children's tokens, most frequent first, ties in Arctic's sibling order

    def bump(self, tok: int) -> Node:
        """Count one more occurrence of child ``tok`` (made at the list's end if new), moved as Arctic moves it."""
        child = self.kids.get(tok)
        if child is None:
            child = self.kids[tok] = Node()
            child.count = 1
            self.order.append(tok)
            return child
        i = self.order.index(tok)
        if i and self.kids[self.order[i - 1]].count <= child.count + 1:  # joins or passes the group before it
            group = self.kids[self.order[i - 1]].count
            head = i - 1
            while head and self.kids[self.order[head - 1]].count == group:
                head -= 1
            self.order.insert(head, self.order.pop(i))
        child.count += 1
        return child

    def drop(self, tok: int) -> Node | None:
        """Count one occurrence fewer of child ``tok``; it goes to the head of its new count group, or away at 0."""
        child = self.kids[tok]
        i = self.order.index(tok)
        child.count -= 1
        if child.count == 0:
            del self.kids[tok]
            self.order.pop(i)
            return None
        after = i + 1
        while after < len(self.order) and self.kids[self.order[after]].count == child.count + 1:
            after += 1
        self.order.insert(after - 1, self.order.pop(i))
        return child


class OrderedTrie:
    """Counted suffix trie of token sequences cut at ``depth``, children in Arctic's order; the root counts
    every token appended (each starts a suffix)."""

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.root = Node()
        self._open: list[Node] = []

    def start(self) -> None:
        self._open = []

    def append(self, tokens: Sequence[int]) -> None:
        """Extend the sequence ``start`` began."""
        self._open = self.grow(tokens, self._open)

    def grow(self, tokens: Sequence[int], opened: list[Node]) -> list[Node]:
        """Extend a sequence whose open suffixes' nodes are ``opened`` (longest suffix first); returns them after
        ``tokens`` (a sequence kept open across calls, as the global tree's running response)."""
        for tok in tokens:
            self.root.count += 1
            opened = [node.bump(tok) for node in [*opened, self.root]][-(self.depth - 1):] if self.depth > 1 else []
            if self.depth == 1:
                self.root.bump(tok)
        return opened

    def remove(self, tokens: Sequence[int]) -> None:
        for start in range(len(tokens)):
            self.root.count -= 1
            node: Node | None = self.root
            for tok in tokens[start:start + self.depth]:
                node = node.drop(tok)
                if node is None:
                    break

    def find(self, pattern: Sequence[int]) -> Node | None:
        node: Node | None = self.root
        for tok in pattern:
            node = node.kids.get(tok)
            if node is None:
                return None
        return node

    def speculate(self, context: Sequence[int], most: int, factor: float, min_prob: float) -> tuple[list, list, int]:
        """Arctic's ``SuffixTree::speculate`` with a path: (tokens, path probabilities, match length), best score."""
        best: tuple[list, list, int] = ([], [], 0)
        best_score = 0.0
        for m in range(1, len(context)):
            node = self.find(context[len(context) - m:])
            if node is None:
                break
            tokens, probs = _path(node, max(0, min(most, int(m * factor + 1e-6))), min_prob)
            if sum(probs) >= best_score:
                best, best_score = (tokens, probs, m), sum(probs)
        return best


def _path(node: Node, most: int, min_prob: float) -> tuple[list[int], list[float]]:
    """Arctic's ``_speculate_path``: the most frequent child at each step while the running product of count
    ratios stays >= ``min_prob``, at most ``most`` tokens."""
    tokens: list[int] = []
    probs: list[float] = []
    prob = 1.0
    while len(tokens) < most and node.order:
        tok = node.order[0]
        child = node.kids[tok]
        prob *= child.count / node.count
        if prob < min_prob:
            break
        tokens.append(tok)
        probs.append(prob)
        node = child
    return tokens, probs


class GlobalTree:
    """One user's global tree: responses only, one sequence each, oldest evicted beyond ``max_requests``
    responses or ``max_tokens`` tokens (thread-safe: one user's race runs two generations at once).  Pickled (a
    ZeroGPU worker's copy) between requests, when no response is running."""

    def __init__(self, depth: int) -> None:
        self.trie = OrderedTrie(depth)
        self.responses: deque[list[int]] = deque()
        self.opened: dict[int, list[Node]] = {}  # id of a running response -> its open suffixes' nodes
        self.lock = threading.Lock()

    def __getstate__(self) -> dict:
        with self.lock:
            return {k: v for k, v in self.__dict__.items() if k not in ("lock", "opened")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.lock, self.opened = threading.Lock(), {}

    def start(self, max_requests: int, max_tokens: int) -> list[int] | None:
        """A new response sequence (None when the global tree is off), the oldest evicted to stay in bounds."""
        with self.lock:
            if max_requests == 0:
                return None
            response: list[int] = []
            self.responses.append(response)
            self.opened[id(response)] = []
            while len(self.responses) > max_requests or (
                    len(self.responses) > 1 and sum(map(len, self.responses)) > max_tokens):
                old = self.responses.popleft()
                self.opened.pop(id(old), None)
                self.trie.remove(old)
            return response

    def extend(self, response: list[int], tokens: Sequence[int]) -> None:
        """Append to a running response (nothing once it was evicted)."""
        with self.lock:
            if tokens and any(r is response for r in self.responses):
                self.opened[id(response)] = self.trie.grow(tokens, self.opened.get(id(response), []))
                response.extend(tokens)

    def speculate(self, context: Sequence[int], most: int, factor: float, min_prob: float):
        with self.lock:
            return self.trie.speculate(context, most, factor, min_prob)


class VllmSuffixSource:
    """Proposes vLLM's suffix draft as a chain; each token's estimate is its step's count ratio (the path
    probability over its parent's)."""

    info = SourceInfo("vllm-suffix", "vLLM suffix", "vLLM-suffix", "#9678FF", Role.SPINE,
                      "the most frequent continuation of the best-scoring suffix match, over this request and this "
                      "visitor's earlier responses (vLLM's suffix drafter, Arctic Inference)",
                      tint="#8796E1", method_label="vLLM suffix (engine's drafter, chain)")
    top_k = 0

    config_type = VllmSuffixConfig

    def __init__(self, cfg: RunConfig, stats: AcceptanceStats, memory: SourceMemory) -> None:
        self.own: VllmSuffixConfig = cfg.source_config(self.info.name)
        depth = self.own.suffix_decoding_max_tree_depth
        self.local = OrderedTrie(depth)
        self.memory: GlobalTree = memory.slot(f"vllm-suffix/depth={depth}", lambda: GlobalTree(depth))
        self.response: list[int] | None = None
        self.seen = self.prompt_len = 0

    def prefill(self, prompt: Sequence[int], back) -> None:
        self.prompt_len = len(prompt)
        self.response = self.memory.start(self.own.suffix_decoding_max_cached_requests, self.own.memory_tokens)

    def propose(self, request: Request) -> Candidates:
        context = request.context
        self.local.append(context[self.seen:])
        if self.response is not None:
            self.memory.extend(self.response, context[max(self.seen, self.prompt_len):])
        self.seen = len(context)
        own = self.own
        pattern = request.tail(own.suffix_decoding_max_tree_depth)
        most = min(own.num_speculative_tokens, request.budget) if request.path else own.num_speculative_tokens
        args = (pattern, most, own.suffix_decoding_max_spec_factor, own.suffix_decoding_min_token_prob)
        local = self.local.speculate(*args)
        best = local
        if self.response is not None:
            other = self.memory.speculate(*args)
            best = local if sum(local[1]) >= sum(other[1]) else other
        tokens, probs, m = best
        p = [q / prev for q, prev in zip(probs, [1.0, *probs])]
        return Candidates.chain(tokens, p, match=m)

    def observe(self, verified: Verified) -> None:
        pass  # the trees catch up with the context when next asked
