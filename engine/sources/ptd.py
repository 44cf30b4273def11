"""PTD — progressive tree drafting: perturbation rows that ride along in every verification forward.

Source: PTD paper (progressive tree drafting), §3.2 (progressive draft tree, width cap, stepping
mechanism, recursive merge M into a candidate pool keyed by root token), §3.3 (the candidate tree
C_X for the current context is verified in the same forward), Algorithm 1 (steps 1-4).

How the pieces map onto this engine:

* The **progressive tree** T is a small tree of token rows appended to the verification forward
  under the anchor (node 0): every row attends to the committed context, the anchor and its own T
  ancestors, at position ``past_len + depth`` (``DraftTree.graft``).  After the forward, each row v
  gets the target's greedy token d_v as a new child (Alg. 1 step 3), at most ``width`` children per
  node; when T grows deeper than ``max_depth`` the stepping mechanism keeps only the root's
  earliest-added child and its subtree, which becomes the new root.  T also steps when it reaches
  its row cap (our addition: a full tree that never steps stops producing new drafts).
* Every subtree of T is merged into the **candidate pool** under its root's token (Alg. 1 step 4,
  merge M).  The pool's tree for the current anchor token is the PTD candidate tree; the tree
  builders add its nodes as ``Source("ptd")`` (spine_tree.py).
* T⁰ (the paper's "randomly initialized shallow tree") is a root with ``init_width`` children whose
  tokens are drawn at random (fixed seed) from the prompt, so perturbations stay in the prompt's
  vocabulary.

The rows do **not** count against the node budget B: B bounds the verified draft tree (Goose
Alg. 1) so that trees stay comparable across methods, while PTD's rows are a fixed, separate cost
(``PtdConfig.rows``) that produces drafts for later cycles and is never itself verified.  The
GT threshold "auto" is derived for the whole forward (B + rows), see ``DecodeConfig.resolved``.

``PtdSource`` adapts the pool to the draft-source protocol (``engine.sources.base``).
"""
from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from ..core.checks import check
from ..core.estimates import AcceptanceStats
from ..core.tree import Source
from .base import Candidates, Request, Role, Rows, RunConfig, SourceInfo, SourceMemory, Verified
from .engines import Serve

#: The tag of PTD's drafting rows: they ride along in the forward and are never verified (PTD §3.2).
ROW_TAG = Source.declare("ptd-row", verified=False)


@dataclass(frozen=True)
class PtdConfig:
    """PTD's own settings (``DecodeConfig.source_config("ptd")``); the share of a goose tree its candidates may
    take is ``TreeShape.pool_share``.  ``FLAT`` names each field as the CLI and trace files do."""

    rows: int = 16  # drafting rows per forward (not counted in B: the module's docstring says why)
    width: int = 4  # children per node of the PTD tree and of pool tries (PTD §4 setup: 4)
    depth: int = 6  # depth cap of the PTD tree before stepping (PTD §4 setup: 6)

    FLAT: ClassVar[dict[str, str]] = {"rows": "ptd_rows", "width": "ptd_width", "depth": "ptd_depth"}

    def __post_init__(self) -> None:
        check([(self.rows >= 2 and self.width >= 1 and self.depth >= 1,
                "PTD rows must be >= 2, PTD width and depth >= 1")])

    def serve(self) -> Serve:
        """The nearest engine drafter: SGLang's NGRAM, the production drafter that verifies a tree."""
        return Serve("SGLang", {"speculative-algorithm": "NGRAM"},
                     differs="No serving engine rides PTD's drafting rows along the verification forward; SGLang's "
                             "NGRAM is the nearest training-free tree drafter, from a trie of earlier outputs.")

    @property
    def extra_rows(self) -> int:
        """Rows every verification forward carries besides the draft tree while PTD drafts (PTD §3.2)."""
        return self.rows


@dataclass
class Trie:
    """A candidate tree node: ordered children by token (oldest first), bounded width."""

    children: OrderedDict[int, Trie] = field(default_factory=OrderedDict)

    def size(self) -> int:
        return sum(1 + c.size() for c in self.children.values())


class CandidatePool:
    """Candidate trees keyed by root token; the recursive merge M of PTD §3.2.

    Args:
        width: children kept per trie node; merging a new child into a full node evicts the oldest
            (least recently merged) child, so the pool follows the current context.
        max_depth: deepest trie level kept below a root (PTD: 6).
        capacity: root tokens kept (least recently merged evicted); bounds memory per session.
    """

    def __init__(self, width: int = 4, max_depth: int = 6, capacity: int = 4096) -> None:
        self.width, self.max_depth, self.capacity = width, max_depth, capacity
        self.roots: OrderedDict[int, Trie] = OrderedDict()

    def get(self, token: int) -> Trie | None:
        """The candidate tree C_X whose root is ``token`` (the anchor), or None."""
        return self.roots.get(token)

    def merge(self, root_token: int, paths: list[list[int]]) -> None:
        """M(pool[root], T'): add every root-to-leaf token path of T' below ``root_token``."""
        trie = self.roots.pop(root_token, None) or Trie()
        self.roots[root_token] = trie  # most recently merged last
        while len(self.roots) > self.capacity:
            self.roots.popitem(last=False)
        for path in paths:
            node = trie
            for tok in path[: self.max_depth]:
                child = node.children.pop(tok, None) or Trie()
                node.children[tok] = child  # re-merged children move to the end (most recent)
                while len(node.children) > self.width:
                    node.children.popitem(last=False)
                node = child


class ProgressiveTree:
    """The PTD draft tree T (PTD §3.2): one parent array, rows in topological order.

    Node 0 of T is its root r; in the verification forward T hangs under the anchor, so r sits at
    position ``past_len + 1``.
    """

    def __init__(self, context: list[int], *, width: int = 4, max_depth: int = 6, max_rows: int = 24,
                 init_width: int = 3, seed: int = 0) -> None:
        if not context:
            raise ValueError("PTD needs a non-empty context to draw its initial perturbation tokens from")
        rng = random.Random(seed)
        self.width, self.max_depth, self.max_rows = width, max_depth, max_rows
        self.tokens = [rng.choice(context) for _ in range(1 + init_width)]  # T⁰: r + init_width children
        self.parents: list[int | None] = [None] + [0] * init_width

    def __len__(self) -> int:
        return len(self.tokens)

    def rows(self) -> tuple[list[int], list[int | None]]:
        """(tokens, parents) of T; the root's parent is None (the graft attaches it to the anchor)."""
        return list(self.tokens), list(self.parents)

    def children(self) -> list[list[int]]:
        """Row indices of each row's children, oldest first (derived from the parent array)."""
        kids: list[list[int]] = [[] for _ in range(len(self))]
        for i in range(1, len(self)):
            kids[self.parents[i]].append(i)
        return kids

    def depths(self) -> list[int]:
        depth = [1] * len(self)
        for i in range(1, len(self)):
            depth[i] = depth[self.parents[i]] + 1
        return depth

    def grow(self, greedy: list[int], pool: CandidatePool) -> None:
        """Alg. 1 steps 3-4: add d_v under every row v, step when too deep, merge subtrees into the pool.

        Args:
            greedy: the target's greedy token after each row of T, in row order (len(T) ints).
        """
        n, kids = len(self), self.children()
        for v in range(n):  # breadth of T is bounded by width and by max_rows (earliest rows first)
            if len(self.tokens) >= self.max_rows:
                break
            if len(kids[v]) < self.width and all(self.tokens[c] != greedy[v] for c in kids[v]):
                self.tokens.append(greedy[v])
                self.parents.append(v)
        if max(self.depths()) > self.max_depth or len(self) >= self.max_rows:
            self._step()  # too deep (PTD §3.2), or full: a full tree that no longer steps would go stale
        self._merge_into(pool)

    def _step(self) -> None:
        """Stepping mechanism: keep the root's earliest child and its subtree as the new T."""
        first = next(i for i in range(1, len(self)) if self.parents[i] == 0)
        keep, remap = [], {}
        for i in range(len(self)):  # topological order: a kept node's parent is remapped before it
            if i == first or (self.parents[i] is not None and self.parents[i] in remap):
                remap[i] = len(keep)
                keep.append(i)
        self.tokens = [self.tokens[i] for i in keep]
        self.parents = [None if i == first else remap[self.parents[i]] for i in keep]

    def _merge_into(self, pool: CandidatePool) -> None:
        """Merge the subtree of every row v into ``pool[token(v)]`` (PTD §3.2, merge M)."""
        kids = self.children()

        def paths(v: int) -> list[list[int]]:
            if not kids[v]:
                return [[]]
            return [[self.tokens[c], *rest] for c in kids[v] for rest in paths(c)]

        for v in range(len(self)):
            if kids[v]:
                pool.merge(self.tokens[v], paths(v))


class PtdSource:
    """Proposes, at the anchor, the pool's candidate tree for the anchor token (the whole tree: the builder
    keeps its best nodes), with T's rows to ride along; nothing below other nodes.  A candidate's estimate
    is the per-depth PTD acceptance rate, Beta(1, 1) prior."""

    info = SourceInfo("ptd", "PTD perturbation", "PTD", "#009E73", Role.POOL,
                      "a candidate from the pool progressive tree drafting grows in the forward's extra rows",
                      tint="#1aa881", method_label="PTD only (progressive tree drafting)",
                      candidate_tree=True)
    top_k = 0

    config_type = PtdConfig  # its own settings: DecodeConfig.source_config(info.name) holds one

    def __init__(self, cfg: RunConfig, stats: AcceptanceStats, memory: SourceMemory) -> None:
        self.own: PtdConfig = cfg.source_config(self.info.name)
        self.seed = cfg.sampler.seed
        self.pool = CandidatePool(width=self.own.width, max_depth=self.own.depth)
        self.tree: ProgressiveTree | None = None
        self.counter = stats.counter(self.info.source)

    def prefill(self, prompt: Sequence[int], back) -> None:
        own = self.own
        self.tree = ProgressiveTree(list(prompt), width=own.width, max_depth=own.depth, max_rows=own.rows,
                                    seed=self.seed)

    def propose(self, request: Request) -> Candidates:
        if request.depth:
            return Candidates()
        tokens, parents = self.tree.rows()
        rows = Rows(tuple(tokens), tuple(parents), ROW_TAG)
        trie = self.pool.get(request.token)
        if trie is None:
            return Candidates(rows=rows)
        tokens, parents, depths = _flatten(trie, request.depth)
        p = tuple(self.counter.rate(d, 0.5) for d in depths)
        return Candidates(tuple(tokens), tuple(parents), p, p, rows=rows)

    def observe(self, verified: Verified) -> None:
        # PTD Alg. 1 steps 3-4: extend T by each row's greedy token, merge its subtrees into the pool
        self.tree.grow(verified.greedy_of(ROW_TAG), self.pool)


def _flatten(trie: Trie, depth: int) -> tuple[list[int], list[int | None], list[int]]:
    """(tokens, parents, depths) of a trie's nodes in breadth-first order; depths count from the anchor."""
    tokens, parents, depths = [], [], []
    queue: list[tuple[Trie, int | None, int]] = [(trie, None, depth)]
    for node, index, d in queue:
        for tok, sub in node.children.items():
            tokens.append(tok)
            parents.append(index)
            depths.append(d + 1)
            queue.append((sub, len(tokens) - 1, d + 1))
    return tokens, parents, depths
