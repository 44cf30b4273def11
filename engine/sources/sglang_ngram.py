"""SGLang's NGRAM drafter (``--speculative-algorithm NGRAM``), as a draft source: the one production drafter that
verifies a tree.

Source: SGLang 0.5.23 (PyPI wheel), ``sglang/kernels/jit/csrc/ngram_corpus/trie.cpp`` (``Trie::insert``,
``Trie::match``, ``buildRecency``, ``buildFrequency``), ``sglang/srt/speculative/ngram_worker.py`` and the flags of
``sglang/srt/arg_groups/fields/spec.py``; our own code.

- One trie, kept across requests (a server's is shared by all; here it is one visitor's, ``SourceMemory``).  After
  every verification step the last ``max_trie_depth`` tokens of prompt and output are inserted, every suffix of
  them as a path from the root: a node's ``freq`` grows by one per insertion (so once per step while its n-gram
  stays in that window) and it moves to the front of its parent's recency list.  The prompt is not inserted at
  prefill (SGLang's FIXME: "not much difference"), so the first cycle drafts from earlier requests only.
- Matching: every suffix of the context's last ``max_trie_depth`` tokens, longest first, whose node has children,
  is an anchor; all anchors write into one tree under the last token, equal tokens under one parent merged, until
  ``speculative_num_draft_tokens - 1`` draft nodes.
- ``BFS`` (default): an anchor matched on w tokens starts at breadth ``(M - w) x scale + min_bfs_breadth`` (M =
  ``max_trie_depth - 1``, scale = ``(max_bfs_breadth - min_bfs_breadth) / M``), one scale less per level, at least
  1; a node's children are taken most recently seen first.  ``PROB``: best first by the product of
  ``freq / sum of freq`` over a node's ``max_bfs_breadth`` most frequent children (ties: smaller token first).
- Capacity: a bound on nodes, the root included; before each suffix is inserted, the least recently used leaves
  go until all its tokens would fit as new nodes (SGLang's ``--speculative-ngram-capacity``, 10,000,000 per
  server; here ``memory_nodes`` per visitor).

Checked against SGLang 0.5.23's compiled corpus on random requests, BFS and PROB, with and without eviction: the
same trees, node for node (``tests/test_engine_drafters.py``).  What differs here: SGLang pads the tree to exactly
N slots with token 0 under the root (a static shape for CUDA graphs); unused slots are not verified here.  Its
sibling order is a hash map's; here it is insertion order (greedy acceptance does not depend on it).  The decoding
loop bounds every tree by D: set D >= N - 1 for SGLang's trees.
"""
from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from ..core.checks import check, one_of
from ..core.estimates import AcceptanceStats
from .base import Candidates, Locked, Request, Role, RunConfig, SourceInfo, SourceMemory, Verified
from .engines import Serve

#: ``--speculative-ngram-match-type`` values.
MATCH_TYPES = ("BFS", "PROB")


@dataclass(frozen=True)
class SglangNgramConfig:
    """SGLang's NGRAM launch flags under their own names (without ``--``, ``_`` for ``-``), its defaults."""

    speculative_num_draft_tokens: int = 12  # N: tree slots, the root included (SGLang: 12 for NGRAM)
    speculative_ngram_min_bfs_breadth: int = 1
    speculative_ngram_max_bfs_breadth: int = 10
    speculative_ngram_match_type: str = "BFS"  # BFS (recency) | PROB (frequency)
    speculative_ngram_max_trie_depth: int = 18  # inserted window, longest path and match
    memory_nodes: int = 100_000  # trie nodes kept, least recently used leaves evicted beyond: goose-lens's bound
    # on one visitor's trie (~20 MB), not a flag (SGLang's --speculative-ngram-capacity, 10,000,000, is per server)

    FLAT: ClassVar[dict[str, str]] = {name: name for name in (
        "speculative_num_draft_tokens", "speculative_ngram_min_bfs_breadth", "speculative_ngram_max_bfs_breadth",
        "speculative_ngram_match_type", "speculative_ngram_max_trie_depth")} | {"memory_nodes": "sglang_memory_nodes"}
    extra_rows: ClassVar[int] = 0

    def __post_init__(self) -> None:
        check([(self.speculative_num_draft_tokens >= 2, "speculative_num_draft_tokens must be >= 2 (the root and "
                                                        "one draft)"),
               (1 <= self.speculative_ngram_min_bfs_breadth <= self.speculative_ngram_max_bfs_breadth,
                "speculative_ngram_min_bfs_breadth must be >= 1 and <= speculative_ngram_max_bfs_breadth"),
               one_of(self.speculative_ngram_match_type, MATCH_TYPES, "speculative_ngram_match_type"),
               (self.speculative_ngram_max_trie_depth >= 2, "speculative_ngram_max_trie_depth must be >= 2"),
               (self.memory_nodes > self.speculative_ngram_max_trie_depth, "the memory bound must be more nodes than "
                "speculative_ngram_max_trie_depth (the root and one whole n-gram)")])

    def serve(self) -> Serve:
        """SGLang's launch flags that run this drafter."""
        flags = {"speculative-algorithm": "NGRAM"}
        flags.update({k.replace("_", "-"): v for k, v in self.__dict__.items() if k != "memory_nodes"})
        return Serve("SGLang", flags, differs="SGLang (0.5.10 or later, for --speculative-ngram-max-trie-depth) keeps "
                                              "one trie for the whole server and pads every tree to N slots; here the "
                                              "trie is this visitor's and padding is not verified.")


class TrieNode:
    __slots__ = ("token", "parent", "freq", "kids")

    def __init__(self, token: int, parent: TrieNode | None) -> None:
        self.token, self.parent, self.freq = token, parent, 0
        self.kids: OrderedDict[int, TrieNode] = OrderedDict()  # most recently touched first


class NgramTrie(Locked):
    """SGLang's n-gram trie: frequency and recency per child, least recently used leaves evicted beyond
    ``capacity`` nodes.  Thread-safe: one visitor's race runs two generations at once."""

    def __init__(self, depth: int, capacity: int) -> None:
        self.depth, self.capacity = depth, capacity
        self.root = TrieNode(-1, None)
        self.lru: OrderedDict[TrieNode, None] = OrderedDict()  # every node, most recently used first
        self.lock = threading.Lock()

    def insert(self, window: Sequence[int]) -> None:
        """``Trie::insert``: every suffix of ``window`` as a root path (``depth`` tokens at most); before each, room
        for all its tokens is made, as if each were new (``Trie::squeeze``: least recently used leaves go first)."""
        with self.lock:
            for i in range(len(window)):
                suffix = window[i:i + self.depth]
                self._squeeze(len(suffix) - (self.capacity - 1 - len(self.lru)))  # the root takes one node
                node, path = self.root, []
                for tok in suffix:
                    child = node.kids.get(tok)
                    if child is None:
                        child = node.kids[tok] = TrieNode(tok, node)
                    child.freq += 1
                    node.kids.move_to_end(tok, last=False)
                    node = child
                    path.append(child)
                for n in reversed(path):  # ancestors end up in front of their descendants
                    self.lru[n] = None
                    self.lru.move_to_end(n, last=False)

    def _squeeze(self, count: int) -> None:
        """Evict ``count`` least recently used nodes (leaves: ancestors are always more recent)."""
        for _ in range(count):
            leaf, _ = self.lru.popitem()
            del leaf.parent.kids[leaf.token]

    def anchors(self, context: Sequence[int]) -> list[tuple[TrieNode, int]]:
        """``Trie::match``: (node, w) for every suffix of ``context`` (w tokens, longest first) whose node has
        children."""
        found = []
        for w in range(min(len(context), self.depth), 0, -1):
            node: TrieNode | None = self.root
            for tok in context[len(context) - w:]:
                node = node.kids.get(tok)
                if node is None:
                    break
            if node is not None and node.kids:
                found.append((node, w))
        return found


class SglangNgramSource:
    """Proposes SGLang's NGRAM draft tree (``candidate_tree``: the method verifies it as proposed)."""

    info = SourceInfo("sglang-ngram", "SGLang ngram", "SGLang", "#785A2D", Role.SPINE,
                      "from a trie of the n-grams of recent outputs, matched on every suffix (SGLang's NGRAM "
                      "drafter, a tree)", tint="#9f744f", method_label="SGLang NGRAM (engine's drafter, tree)",
                      candidate_tree=True)
    top_k = 0

    config_type = SglangNgramConfig

    def __init__(self, cfg: RunConfig, stats: AcceptanceStats, memory: SourceMemory) -> None:
        self.own: SglangNgramConfig = cfg.source_config(self.info.name)
        depth, capacity = self.own.speculative_ngram_max_trie_depth, self.own.memory_nodes
        self.trie: NgramTrie = memory.kept(self.info.name, (depth, capacity), lambda: NgramTrie(depth, capacity))
        self.prompt: list[int] = []

    def prefill(self, prompt: Sequence[int], back) -> None:
        self.prompt = list(prompt)  # not inserted: the first verification step inserts its tail

    def propose(self, request: Request) -> Candidates:
        own = self.own
        context = request.tail(own.speculative_ngram_max_trie_depth)
        slots = own.speculative_num_draft_tokens - 1
        if request.path:
            slots = min(slots, request.budget)
        with self.trie.lock:
            anchors = self.trie.anchors(context)
            build = _bfs if own.speculative_ngram_match_type == "BFS" else _prob
            return build(anchors, slots, own)

    def observe(self, verified: Verified) -> None:
        window = [*self.prompt, *verified.output][-self.own.speculative_ngram_max_trie_depth:]
        self.trie.insert(window)


class _Tree:
    """The draft tree being filled: tokens, parents (None = the root), per-candidate estimates, dedup by parent."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.parents: list[int | None] = []
        self.p: list[float] = []
        self.index: dict[tuple[int | None, int], int] = {}

    def place(self, parent: int | None, node: TrieNode) -> tuple[int, bool]:
        """(position, new) of ``node``'s token under ``parent``."""
        key = (parent, node.token)
        if key in self.index:
            return self.index[key], False
        total = sum(k.freq for k in node.parent.kids.values())
        self.index[key] = len(self.tokens)
        self.tokens.append(node.token)
        self.parents.append(parent)
        self.p.append(node.freq / total)
        return len(self.tokens) - 1, True

    def candidates(self, match: int) -> Candidates:
        return Candidates(tuple(self.tokens), tuple(self.parents), tuple(self.p), tuple(self.p), match=match)


def _bfs(anchors: list[tuple[TrieNode, int]], slots: int, own: SglangNgramConfig) -> Candidates:
    """``buildRecency``: breadth by match length, shrinking by ``scale`` per level; children most recent first."""
    tree = _Tree()
    top = max(1, own.speculative_ngram_max_trie_depth - 1)
    scale = (own.speculative_ngram_max_bfs_breadth - own.speculative_ngram_min_bfs_breadth) / top
    for anchor, w in anchors:
        queue = deque([(None, (top - w) * scale + own.speculative_ngram_min_bfs_breadth, anchor)])
        while queue and len(tree.tokens) < slots:
            parent, breadth, node = queue.popleft()
            for child in list(node.kids.values())[:max(1, int(breadth))]:
                if len(tree.tokens) >= slots:
                    break
                pos, _ = tree.place(parent, child)
                queue.append((pos, breadth - scale, child))
    return tree.candidates(anchors[0][1] if anchors else 0)


def _prob(anchors: list[tuple[TrieNode, int]], slots: int, own: SglangNgramConfig) -> Candidates:
    """``buildFrequency``: best first by the product of normalised frequencies of the top children (``freq / sum x
    prob``, in that order, as SGLang rounds it); equal products leave the heap in the order SGLang's
    ``std::priority_queue`` leaves them (``StdMaxHeap``)."""
    tree, heap = _Tree(), StdMaxHeap()

    def push(parent: int | None, node: TrieNode, prob: float) -> None:
        top = sorted(node.kids.values(), key=lambda k: (-k.freq, k.token))[:own.speculative_ngram_max_bfs_breadth]
        total = float(sum(k.freq for k in top)) or 1.0
        for child in top:
            heap.push((child.freq / total * prob, parent, child))

    for anchor, _ in anchors:
        push(None, anchor, 1.0)
        while heap and len(tree.tokens) < slots:
            prob, parent, node = heap.pop()
            pos, _ = tree.place(parent, node)
            push(pos, node, prob)
    return tree.candidates(anchors[0][1] if anchors else 0)


class StdMaxHeap:
    """A max-heap on each entry's first item that pops equal keys in the order libstdc++'s ``std::priority_queue``
    does (``std::push_heap`` / ``std::pop_heap``, ``bits/stl_heap.h``: ``__push_heap`` and ``__adjust_heap``): the
    order among SGLang's equal-probability candidates, and so which of them fill the last slots."""

    def __init__(self) -> None:
        self.items: list[tuple] = []

    def __len__(self) -> int:
        return len(self.items)

    def push(self, value: tuple) -> None:
        self.items.append(value)
        self._sift_up(len(self.items) - 1, value)

    def pop(self) -> tuple:
        items = self.items
        top, last = items[0], items.pop()
        if items:
            self._adjust(last)
        return top

    def _sift_up(self, hole: int, value: tuple) -> None:
        """``__push_heap(first, hole, 0, value)``: parents with a smaller key move down."""
        items = self.items
        parent = (hole - 1) // 2
        while hole > 0 and items[parent][0] < value[0]:
            items[hole] = items[parent]
            hole, parent = parent, (parent - 1) // 2
        items[hole] = value

    def _adjust(self, value: tuple) -> None:
        """``__adjust_heap(first, 0, len, value)``: the hole at the top goes down to a leaf by the larger child (the
        left one on a tie), then ``value`` rises from there."""
        items, n, hole, child = self.items, len(self.items), 0, 0
        while child < (n - 1) // 2:
            child = 2 * (child + 1)
            if items[child][0] < items[child - 1][0]:
                child -= 1
            items[hole], hole = items[child], child
        if n % 2 == 0 and child == (n - 2) // 2:
            child = 2 * (child + 1)
            items[hole], hole = items[child - 1], child - 1
        self._sift_up(hole, value)
