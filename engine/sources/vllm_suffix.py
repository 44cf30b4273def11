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
  list's end, and a child whose count grows moves to the head of its new count group (``OrderedTrie``);
- probabilities, scores and the token cap are computed in single precision, as Arctic's C++ ``float`` computes
  them (``f32``): in double precision, 3/10 x 1/3 falls below a ``min_token_prob`` of 0.1 and equal scores such as
  4/7 + 2/7 + 1/7 and 1 compare differently, which drafted other tokens than the engine on 11 of 300 random
  trie histories (``tests/test_engine_drafters.py``, against Arctic Inference 0.3.0 built from its source).

goose-lens's own suffix source (``suffix.py``) drafts a best-first *tree* from the longest match only; this module
is the engine's drafter, for people who deploy it.  The global tree belongs to one user (``SourceMemory``) and is
also bounded in tokens (``memory_tokens``, not a vLLM flag) on a shared server.
"""
from __future__ import annotations

import struct
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
               (0 <= self.suffix_decoding_max_spec_factor <= 1e6 and 0.0 <= self.suffix_decoding_min_token_prob <= 1.0,
                "suffix_decoding_max_spec_factor must be in [0, 1e6] and suffix_decoding_min_token_prob in [0, 1]")])

    def serve(self) -> Serve:
        """vLLM's ``--speculative-config`` that runs this drafter (``memory_tokens`` is ours, not vLLM's)."""
        flags = {k: getattr(self, k) for k in ("suffix_decoding_max_tree_depth", "suffix_decoding_max_cached_requests",
                                               "suffix_decoding_max_spec_factor", "suffix_decoding_min_token_prob")}
        return Serve("vLLM", {"method": "suffix", "num_speculative_tokens": self.num_speculative_tokens, **flags},
                     differs=f"vLLM's global tree holds the whole server's responses; here it holds this visitor's, "
                             f"at most {self.memory_tokens} tokens.")


#: A child's key in ``OrderedTrie.child``: parent * STRIDE + token (token ids stay below it).
STRIDE = 1 << 32

_FLOAT = struct.Struct("f")


def f32(x: float) -> float:
    """``x`` rounded to single precision, as a C++ ``float`` holds it.  One rounding of the exact double result
    of ``+ - x /`` on two floats is the float operation's own result (53 >= 2 x 24 + 2 bits)."""
    return _FLOAT.unpack(_FLOAT.pack(x))[0]


class OrderedTrie:
    """Counted suffix trie of token sequences cut at ``depth``, children in Arctic's sibling order; the root (node 0)
    counts every token appended (each starts a suffix).

    Nodes are ints: their counts in one list, the children in one int-keyed dict (``node * STRIDE + token``), a
    node's only child's token in another, and the order of a node's children in a list only once it has two.  A trie
    of ints is no work for the garbage collector, whose full collections scan the model's whole heap (one object
    per node made a sweep's run slower than AR: docs/results.md, "The engines' drafters").
    Arctic's order: a new child joins the end; a child whose count grows moves before the head of the group of
    equal counts it joins or passes (``bump``); one whose count falls moves to the head of its new group (``drop``).
    """

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.count: list[int] = [0]  # node -> occurrences of its substring
        self.child: dict[int, int] = {}  # node * STRIDE + token -> child node
        self.first: dict[int, int] = {}  # node with one child -> that child's token
        self.order: dict[int, list[int]] = {}  # node with two or more children -> their tokens, Arctic's order
        self.free: list[int] = []  # removed nodes, reused
        self.opened: list[int] = []  # the open sequence's suffixes' nodes, longest first

    def children(self, node: int) -> list[int]:
        """``node``'s children's tokens, most frequent first (ties in Arctic's order)."""
        if node in self.order:
            return self.order[node]
        return [self.first[node]] if node in self.first else []

    def bump(self, node: int, tok: int) -> int:
        """Count one more occurrence of ``node``'s child ``tok`` (made at the end if new), moved as Arctic moves it."""
        count, key = self.count, node * STRIDE + tok
        kid = self.child.get(key)
        if kid is None:
            kid = self.free.pop() if self.free else len(count)
            if kid == len(count):
                count.append(0)
            count[kid] = 1
            self.child[key] = kid
            if node in self.order:
                self.order[node].append(tok)
            elif node in self.first:
                self.order[node] = [self.first.pop(node), tok]
            else:
                self.first[node] = tok
            return kid
        order = self.order.get(node)
        if order is not None:
            i = order.index(tok)
            at = lambda j: count[self.child[node * STRIDE + order[j]]]  # noqa: E731 - the j-th sibling's count
            if i and at(i - 1) <= count[kid] + 1:  # joins or passes the group before it: goes to that group's head
                group, head = at(i - 1), i - 1
                while head and at(head - 1) == group:
                    head -= 1
                order.insert(head, order.pop(i))
        count[kid] += 1
        return kid

    def drop(self, node: int, tok: int) -> int:
        """Count one occurrence fewer of ``node``'s child ``tok``: it moves to the head of its new count group, or is
        unlinked and freed at 0 (walking on from it frees the rest of the removed occurrence's path)."""
        count, key = self.count, node * STRIDE + tok
        kid = self.child[key]
        count[kid] -= 1
        order = self.order.get(node)
        if count[kid] == 0:
            del self.child[key]
            self.free.append(kid)
            if order is None:
                del self.first[node]
            else:
                order.remove(tok)
                if len(order) == 1:
                    self.first[node] = self.order.pop(node)[0]
        elif order is not None:
            i = order.index(tok)
            after = i + 1
            while after < len(order) and count[self.child[node * STRIDE + order[after]]] == count[kid] + 1:
                after += 1
            order.insert(after - 1, order.pop(i))
        return kid

    def start(self) -> None:
        self.opened = []

    def append(self, tokens: Sequence[int]) -> None:
        """Extend the sequence ``start`` began."""
        self.opened = self.grow(tokens, self.opened)

    def grow(self, tokens: Sequence[int], opened: list[int]) -> list[int]:
        """Extend a sequence whose open suffixes' nodes are ``opened`` (longest suffix first); returns them after
        ``tokens`` (a sequence kept open across calls, as the global tree's running response)."""
        keep = self.depth - 1
        for tok in tokens:
            self.count[0] += 1
            grown = [self.bump(node, tok) for node in [*opened, 0]]
            opened = grown[-keep:] if keep else []
        return opened

    def remove(self, tokens: Sequence[int]) -> None:
        """Take one earlier-added sequence back out."""
        for start in range(len(tokens)):
            self.count[0] -= 1
            node = 0
            for tok in tokens[start:start + self.depth]:
                node = self.drop(node, tok)

    def find(self, pattern: Sequence[int]) -> int | None:
        node: int | None = 0
        for tok in pattern:
            node = self.child.get(node * STRIDE + tok)
            if node is None:
                return None
        return node

    def speculate(self, context: Sequence[int], most: int, factor: float, min_prob: float,
                  known: Sequence[int] = ()) -> tuple[list, list, int, float]:
        """Arctic's ``SuffixTree::speculate`` with a path: (tokens, path probabilities, match length, score), the
        best score's, a tie going to the longer match; in single precision, as Arctic computes it.
        ``known``: the nodes of ``context``'s shortest suffixes, longest first (the open nodes of a sequence that ends
        as ``context`` does), read instead of walked from the root."""
        best: tuple[list, list, int, float] = ([], [], 0, 0.0)
        factor = f32(factor)
        for m in range(1, len(context)):
            node = known[-m] if m <= len(known) else self.find(context[len(context) - m:])
            if node is None:
                break
            cap = int(f32(m * factor) + 1e-6)  # Arctic: (int)(match_len * factor + offset + 1e-6), offset 0
            tokens, probs, score = self.path(node, max(0, min(most, cap)), min_prob)
            if score >= best[3]:
                best = (tokens, probs, m, score)
        return best

    def path(self, node: int, most: int, min_prob: float) -> tuple[list[int], list[float], float]:
        """Arctic's ``_speculate_path``: the most frequent child at each step while the running product of count
        ratios stays >= ``min_prob``, at most ``most`` tokens; (tokens, path probabilities, their sum: the score),
        in single precision."""
        tokens: list[int] = []
        probs: list[float] = []
        prob, score, floor = 1.0, 0.0, f32(min_prob)
        while len(tokens) < most:
            order = self.order.get(node)
            tok = order[0] if order else self.first.get(node)
            if tok is None:
                break
            kid = self.child[node * STRIDE + tok]
            prob = f32(prob * f32(self.count[kid] / self.count[node]))
            if prob < floor:
                break
            tokens.append(tok)
            probs.append(prob)
            score = f32(score + prob)
            node = kid
        return tokens, probs, score


class GlobalTree(Locked):
    """One user's global tree: responses only, one sequence each, oldest evicted beyond ``max_requests``
    responses or ``max_tokens`` tokens (thread-safe: one user's race runs two generations at once).  Pickled (a
    ZeroGPU worker's copy) between requests, when no response is running."""

    TRANSIENT = {"opened": dict}  # a running response's open nodes: none cross a pickle (between requests)

    def __init__(self, depth: int) -> None:
        self.trie = OrderedTrie(depth)
        self.responses: deque[list[int]] = deque()
        self.opened: dict[int, list[int]] = {}  # id of a running response -> its open suffixes' nodes
        self.lock = threading.Lock()

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

    def speculate(self, context: Sequence[int], most: int, factor: float, min_prob: float,
                  response: list[int] | None = None):
        """``OrderedTrie.speculate`` (``response``: the running response ``context`` ends with, whose open nodes
        are read)."""
        with self.lock:
            known = self.opened.get(id(response), ()) if response is not None else ()
            return self.trie.speculate(context, most, factor, min_prob, known)


class VllmSuffixSource:
    """Proposes vLLM's suffix draft as a chain; each token's estimate is its step's count ratio (the path
    probability over its parent's)."""

    info = SourceInfo("vllm-suffix", "vLLM suffix", "vLLM-suffix", "#9678FF", Role.SPINE,
                      "the most frequent continuation of the best-scoring suffix match, over this request and this "
                      "visitor's earlier responses (vLLM's suffix drafter, Arctic Inference)",
                      tint="#5b7ae8", method_label="vLLM suffix (engine's drafter, chain)")
    top_k = 0

    config_type = VllmSuffixConfig

    def __init__(self, cfg: RunConfig, stats: AcceptanceStats, memory: SourceMemory) -> None:
        self.own: VllmSuffixConfig = cfg.source_config(self.info.name)
        depth = self.own.suffix_decoding_max_tree_depth
        self.local = OrderedTrie(depth)
        self.memory: GlobalTree = memory.kept(self.info.name, depth, lambda: GlobalTree(depth))
        self.response: list[int] | None = None
        self.prompt: Sequence[int] = ()
        self.seen = 0

    def prefill(self, prompt: Sequence[int], back) -> None:
        self.prompt = prompt
        self.response = self.memory.start(self.own.suffix_decoding_max_cached_requests, self.own.memory_tokens)

    def propose(self, request: Request) -> Candidates:
        context = request.context
        self._catch_up(context)
        own = self.own
        pattern = request.tail(own.suffix_decoding_max_tree_depth)
        most = min(own.num_speculative_tokens, request.budget) if request.path else own.num_speculative_tokens
        args = (pattern, most, own.suffix_decoding_max_spec_factor, own.suffix_decoding_min_token_prob)
        local = self.local.speculate(*args, () if request.path else self.local.opened)
        best = local
        if self.response is not None:
            other = self.memory.speculate(*args, None if request.path else self.response)
            best = local if local[3] >= other[3] else other  # Arctic: the request's own tree wins a tie
        tokens, probs, m, _ = best
        p = [q / prev for q, prev in zip(probs, [1.0, *probs])]
        return Candidates.chain(tokens, p, match=m)

    def observe(self, verified: Verified) -> None:
        """The trees catch up with the context when next asked; the last cycle's tokens join the global tree when
        the generation ends (vLLM adds every step's sampled tokens, the last step's included)."""
        if verified.finished:
            self._catch_up([*self.prompt, *verified.output])

    def _catch_up(self, context: Sequence[int]) -> None:
        """Add the context tokens not yet seen: to the request's own tree, and the output's to the running
        response in the global tree."""
        self.local.append(context[self.seen:])
        if self.response is not None:
            self.memory.extend(self.response, context[max(self.seen, len(self.prompt)):])
        self.seen = len(context)
