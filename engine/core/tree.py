"""Draft tree: one parent array is the truth; depths, children, mask rows and positions derive from it.

Node 0 is the root: the anchor token (the last committed token, not yet in the KV cache).  Nodes
are stored in topological order (a parent's index is smaller than its children's), which is the
order they are fed to the verification forward.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import NamedTuple

import numpy as np
import torch

from .transfer import upload


class Source(str):
    """A node's tag: where its token came from (a string: "pld", "tr", ...; drawn in its source's colour by viz).

    Each draft source declares its own tag in its module (``SourceInfo`` does, from the source's name and role), so
    the core names no source: it knows only the anchor's tag and what a tag says of its nodes.  Tags are interned
    (``Source("pld") is Source("pld")``), so nodes compare them with ``is``; ``Source(name)`` of a name nobody
    declared raises ValueError.

    Attributes:
        spine: a spine source's tag: a root child carrying it starts the tree's spine (``DraftTree.spine``).
        verified: its nodes are draft tokens the walk may accept; False for the anchor and for rows that only ride
            along in the forward (PTD's drafting rows).
    """

    _declared: dict[str, Source] = {}
    ROOT: Source  # the anchor token, committed in the previous cycle (declared below)
    PAD: Source  # a padding row (``DraftTree.padded``)

    def __new__(cls, name: str) -> Source:
        if not isinstance(name, str):
            raise ValueError(f"a node tag is a string (got {name!r})")
        if name not in cls._declared:  # each source's module declares its tag (importing engine.sources does)
            raise ValueError(f"{name!r} is not a node tag; known: {', '.join(cls._declared)}")
        return cls._declared[name]

    @classmethod
    def declare(cls, name: str, *, spine: bool = False, verified: bool = True) -> Source:
        """The tag ``name`` (made the first time; a later declaration must say the same)."""
        tag = cls._declared.get(name)
        if tag is None:
            tag = str.__new__(cls, name)
            tag.spine, tag.verified = spine, verified
            cls._declared[name] = tag
        if (tag.spine, tag.verified) != (spine, verified):
            raise ValueError(f"node tag {name!r} is declared twice, differently")
        return tag

    @classmethod
    def declared(cls) -> tuple[Source, ...]:
        """Every tag declared so far, in declaration order (``engine.sources.tags`` gives the registry's order)."""
        return tuple(cls._declared.values())

    @property
    def value(self) -> str:
        """The tag as a plain string (what trace files store)."""
        return str.__str__(self)

    def __reduce__(self):
        return Source, (self.value,)  # pickled by name: unpickling finds the same interned tag

    def __repr__(self) -> str:
        return f"Source({self.value!r})"

    def __deepcopy__(self, memo) -> Source:
        return self

    def __copy__(self) -> Source:
        return self


Source.ROOT = Source.declare("anchor", verified=False)
Source.PAD = Source.declare("padding", verified=False)  # rows that only pad a forward to a cheaper size


@dataclass(frozen=True)
class DraftTree:
    """A verified-in-one-forward draft tree.

    Attributes (all length n, node 0 = root):
        tokens: token id per node.
        parents: parent index per node; ``None`` for the root.
        sources: ``Source`` per node.
        scores: draft score per node (TR: adjacency probability; PLD: per-depth PLD acceptance rate;
            root: 1.0).
        est_accept: estimated acceptance probability of the node's whole root-to-node path: the
            product of the per-source estimates along it (root: 1.0).  Used by the GT threshold.
    """

    tokens: tuple[int, ...]
    parents: tuple[int | None, ...]
    sources: tuple[Source, ...]
    scores: tuple[float, ...]
    est_accept: tuple[float, ...]

    def __post_init__(self) -> None:
        n = len(self.tokens)
        if not (len(self.parents) == len(self.sources) == len(self.scores) == len(self.est_accept) == n) or n == 0:
            raise ValueError("DraftTree fields must be non-empty and of equal length")
        if self.parents[0] is not None or any(p is None or not 0 <= p < i for i, p in enumerate(self.parents[1:], 1)):
            raise ValueError("DraftTree parents must be topologically ordered with a single root at index 0")

    @classmethod
    def derived(cls, tokens: tuple[int, ...], parents: tuple[int | None, ...], sources: tuple[Source, ...],
                scores: tuple[float, ...], est_accept: tuple[float, ...]) -> DraftTree:
        """A tree whose fields are consistent by construction (a builder's, or derived from a valid tree: a subtree,
        a graft, other estimates), made without ``__post_init__``'s O(n) check: a cycle derives four or five."""
        tree = object.__new__(cls)
        tree.__dict__.update(tokens=tokens, parents=parents, sources=sources, scores=scores, est_accept=est_accept)
        return tree

    def with_estimates(self, est_accept: tuple[float, ...]) -> DraftTree:
        """This tree with other path estimates (n of them: what GT read, ``GtChoice.read``).

        Raises:
            ValueError: not one estimate per node.
        """
        if len(est_accept) != len(self):
            raise ValueError(f"{len(est_accept)} estimates for a tree of {len(self)} nodes")
        return DraftTree.derived(self.tokens, self.parents, self.sources, self.scores, tuple(est_accept))

    @classmethod
    def root_only(cls, token: int) -> DraftTree:
        """A tree of the anchor alone: verifying it is one plain AR step."""
        return cls((token,), (None,), (Source.ROOT,), (1.0,), (1.0,))

    @classmethod
    def chain(cls, tokens: list[int], source: Source) -> DraftTree:
        """A linear chain: node 0 (the anchor) is ``tokens[0]``, node i's parent is node i - 1, every node after the
        root tagged ``source``; verified, it is a causal forward of ``tokens`` (a prompt's rows, a timed chain)."""
        n = len(tokens)
        return cls(tuple(tokens), (None, *range(n - 1)), (Source.ROOT,) + (source,) * (n - 1), (1.0,) * n, (1.0,) * n)

    def __len__(self) -> int:
        return len(self.tokens)

    def graft(self, tokens: list[int], parents: list[int | None], source: Source) -> DraftTree:
        """This tree plus extra rows appended after it: row i's parent is ``parents[i]`` among the extra
        rows, or the root (node 0) where it is None.  Used for PTD drafting rows (engine/sources/ptd.py)."""
        n = len(self)
        if not tokens:
            return self
        if len(parents) != len(tokens) or any(p is not None and not 0 <= p < i for i, p in enumerate(parents)):
            raise ValueError("a grafted row's parent is the root or an earlier grafted row")
        grafted = tuple(0 if p is None else n + p for p in parents)  # indices in the whole tree
        return DraftTree.derived(self.tokens + tuple(tokens), self.parents + grafted,
                                 self.sources + (source,) * len(tokens), self.scores + (0.0,) * len(tokens),
                                 self.est_accept + (0.0,) * len(tokens))

    def padded(self, rows: int) -> DraftTree:
        """This tree with padding rows appended up to ``rows`` (``Source.PAD``, token 0, children of the root), so a
        forward runs at a cheaper size (``CostCurve.verify_rows``): no node of the tree sees them, and their logits
        are never read.  The tree itself when it has ``rows`` rows or more."""
        extra = rows - len(self)
        return self if extra <= 0 else self.graft([0] * extra, [None] * extra, Source.PAD)

    @cached_property
    def depths(self) -> tuple[int, ...]:
        depths = [0] * len(self)
        for i in range(1, len(self)):
            depths[i] = depths[self.parents[i]] + 1
        return tuple(depths)

    @cached_property
    def spine(self) -> tuple[int, ...]:
        """The spine's nodes, root excluded: from the root, the first child of a spine source (``Source.spine``),
        then each node's first child of that same source (builders lay the spine before anything else, so its
        nodes are their parents' first children of that source).  () when the tree has no spine."""
        first = next((c for c in self.children[0] if self.sources[c].spine), None)
        if first is None:
            return ()
        spine = [first]
        while (nxt := next((c for c in self.children[spine[-1]] if self.sources[c] is self.sources[first]),
                           None)) is not None:
            spine.append(nxt)
        return tuple(spine)

    @cached_property
    def children(self) -> tuple[tuple[int, ...], ...]:
        kids: list[list[int]] = [[] for _ in range(len(self))]
        for i in range(1, len(self)):
            kids[self.parents[i]].append(i)
        return tuple(tuple(k) for k in kids)

    @cached_property
    def ancestor_matrix(self) -> np.ndarray:
        """(n, n) bool; ``[i, j]`` iff node j is node i or one of its ancestors."""
        n = len(self)
        anc = np.zeros((n, n), dtype=bool)
        for i in range(n):
            if i:
                anc[i] = anc[self.parents[i]]
            anc[i, i] = True
        return anc

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root's first child down to ``node`` (root excluded)."""
        path = []
        while node:
            path.append(node)
            node = self.parents[node]
        return path[::-1]

    def subtree(self, keep: list[int]) -> DraftTree:
        """The tree of the nodes ``keep`` (indices into this tree, root included, every kept node's parent
        kept too), in this tree's order.

        Raises:
            ValueError: ``keep`` misses the root or a kept node's parent.
        """
        keep = sorted(set(keep))
        new_index = {old: new for new, old in enumerate(keep)}
        if not keep or keep[0] != 0 or any(self.parents[i] not in new_index for i in keep[1:]):
            raise ValueError("a subtree keeps the root and the parent of every kept node")
        return DraftTree.derived(tuple(self.tokens[i] for i in keep),
                                 (None, *(new_index[self.parents[i]] for i in keep[1:])),
                                 tuple(self.sources[i] for i in keep), tuple(self.scores[i] for i in keep),
                                 tuple(self.est_accept[i] for i in keep))

    def device_ancestry(self, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The tree on ``device``: (tokens (n,) int64, depths (n,) int64, ancestors (n, n) bool, ``[i, j]`` iff node j
        is node i or one of its ancestors).  On a CPU, where no device need be kept from waiting, read off the host's
        ``depths`` and ``ancestor_matrix`` (a copy): the same values in fewer tensor operations (a forward's inputs
        32 µs against 56 for one row, 40 against 71 for 10 nodes); elsewhere derived on the device (``_doubled``)."""
        if torch.device(device).type == "cpu":
            return torch.tensor(self.tokens), torch.tensor(self.depths), torch.from_numpy(self.ancestor_matrix.copy())
        return self._doubled(device)

    def _doubled(self, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``device_ancestry`` derived on ``device`` from the parent array.

        One host-to-device copy (tokens and parents, (2, n) int64; on CUDA from pinned memory, non-blocking:
        ``transfer.upload``); the ancestor relation and depths are derived there, so a GPU cycle builds them
        without waiting for the device (tests/test_cuda.py checks; ``scatter_`` takes ``True`` as a value, where a
        tensor-indexed assignment of a Python scalar may copy it to the device and wait).  Ancestors by pointer
        doubling: after j rounds ``anc[i]`` holds the ancestors of node i up to 2^(j+1) - 1 levels above it, so
        ceil(log2(depth + 1)) rounds cover the deepest node.
        """
        n = len(self)
        packed = upload([self.tokens, (0, *self.parents[1:])], torch.long, device)  # (2, n)
        tokens, parents = packed[0], packed[1]  # (n,), (n,); the root is its own parent here
        anc = torch.eye(n, dtype=torch.bool, device=device)  # (n, n): anc[i, j] iff j is i or an ancestor
        anc.scatter_(1, parents[:, None], True)  # anc[i, parents[i]] = True
        up = parents[parents]  # (n,) the 2nd ancestor (clamped at the root)
        for _ in range(max(0, math.ceil(math.log2(max(self.depths) + 1)) - 1)):
            anc |= anc[up]  # (n, n)
            up = up[up]
        return tokens, anc.sum(dim=1) - 1, anc  # depth: ancestors, itself excluded

    def device_inputs(self, past_len: int, dtype: torch.dtype, device: torch.device | str) -> TreeInputs:
        """The verification forward's inputs over ``past_len`` cached positions, built on ``device`` from the
        parent array (``device_ancestry``: on an accelerator one host-to-device copy, no host sync)."""
        n = len(self)
        tokens, depth, anc = self.device_ancestry(device)  # (n,), (n,), (n, n)
        mask = torch.zeros(n, past_len + n, dtype=dtype, device=device)  # (n, past + n): the past is attended
        mask[:, past_len:].masked_fill_(~anc, torch.finfo(dtype).min)
        return TreeInputs(tokens[None], (depth + past_len)[None], mask[None, None])

    def attention_mask(self, past_len: int, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
        """Tree attention mask, float, shape (1, 1, n, past_len + n): 0 where attended, finfo.min elsewhere.

        Every node attends to the whole KV cache (past) and to its own ancestors and itself.
        """
        return self.device_inputs(past_len, dtype, device).attention_mask

    def position_ids(self, past_len: int, device: torch.device | str) -> torch.Tensor:
        """(1, n) int64: ``past_len + depth`` per node."""
        return self.device_inputs(past_len, torch.float32, device).position_ids

    def input_ids(self, device: torch.device | str) -> torch.Tensor:
        """(1, n) int64 node tokens in forward order."""
        return upload([self.tokens], torch.long, device)


@dataclass(frozen=True)
class TreeInputs:
    """What one verification forward of a ``DraftTree`` feeds the model, all on the model's device."""

    input_ids: torch.Tensor  # (1, n) int64 node tokens
    position_ids: torch.Tensor  # (1, n) int64 past_len + depth
    attention_mask: torch.Tensor  # (1, 1, n, past_len + n) model dtype: 0 attended, finfo.min masked


class GhostNode(NamedTuple):
    """A candidate the GT threshold removed: shown faded in the viz, never verified (a NamedTuple: a cycle makes
    dozens, and a frozen dataclass costs 2.6× as much to make).

    ``parent`` indexes the kept tree (ghosts hang off kept nodes; their own subtrees are never grown).
    """

    parent: int
    token: int
    source: Source
    score: float
    est_accept: float

    def moved(self, parent: int) -> GhostNode:
        """This ghost hanging off ``parent`` (a kept tree's re-indexed node)."""
        return GhostNode(parent, self.token, self.source, self.score, self.est_accept)


@dataclass
class TreeBuilder:
    """Mutable accumulator that freezes into a ``DraftTree``; enforces budget, depth and GT threshold.

    ``gt_threshold`` is the number c the builders prune by (``Resolved.prune_at`` of a resolved config): a node
    whose path estimate is below c becomes a ghost; under GT "auto" the speedup-optimal size is then chosen from
    the whole built tree (engine/decoding/gt.py).  None (an unresolved config) raises ValueError.
    """

    root_token: int
    budget: int
    max_depth: int
    gt_threshold: float | None = 0.0
    tokens: list[int] = field(init=False)
    parents: list[int | None] = field(init=False)
    sources: list[Source] = field(init=False)
    scores: list[float] = field(init=False)
    est: list[float] = field(init=False)
    depth: list[int] = field(init=False)
    paths: list[tuple[int, ...]] = field(init=False)  # tokens from the root's child down to each node
    min_est: float = field(init=False)
    ghosts: list[GhostNode] = field(init=False, default_factory=list)
    kids: list[dict[int, int]] = field(init=False)  # per node: child token -> the first child carrying it

    def __post_init__(self) -> None:
        self.tokens, self.parents, self.sources = [self.root_token], [None], [Source.ROOT]
        self.scores, self.est, self.depth, self.paths = [1.0], [1.0], [0], [()]
        self.kids = [{}]
        if self.gt_threshold is None:
            raise ValueError("the builders prune at a resolved config's prune_at: use config.resolved(curve)")
        self.min_est = float(self.gt_threshold)  # c enforced per node

    @property
    def full(self) -> bool:
        return len(self.tokens) >= self.budget

    def can_grow(self, parent: int) -> bool:
        return not self.full and self.depth[parent] < self.max_depth

    def add(self, parent: int, token: int, source: Source, score: float, p_accept: float | None = None) -> int | None:
        """Add a child of ``parent``; returns its index, or None when budget, depth or GT refuse it.

        ``score`` is the draft score shown for the node; ``p_accept`` (default: ``score``) is its
        estimated conditional acceptance, multiplied into the path estimate compared with c.
        """
        if not self.can_grow(parent):
            return None
        est = self.est[parent] * (score if p_accept is None else p_accept)
        if est < self.min_est:
            if len(self.ghosts) < self.budget:  # enough ghosts to show what c removed
                self.ghosts.append(GhostNode(parent, token, source, score, est))
            return None
        self.tokens.append(token)
        self.parents.append(parent)
        self.sources.append(source)
        self.scores.append(score)
        self.est.append(est)
        self.depth.append(self.depth[parent] + 1)
        self.paths.append(self.paths[parent] + (token,))
        self.kids.append({})
        node = len(self.tokens) - 1
        self.kids[parent].setdefault(token, node)
        return node

    def child_tokens(self, parent: int) -> set[int]:
        """The tokens of ``parent``'s children now (a copy: later children do not join it)."""
        return set(self.kids[parent])

    def path_tokens(self, node: int) -> tuple[int, ...]:
        """Tokens from the root's child down to ``node`` (() for the root)."""
        return self.paths[node]

    def child_with(self, parent: int, token: int) -> int | None:
        """Index of ``parent``'s child carrying ``token``, or None."""
        return self.kids[parent].get(token)

    def freeze(self) -> Built:
        tree = DraftTree.derived(tuple(self.tokens), tuple(self.parents), tuple(self.sources), tuple(self.scores),
                                 tuple(self.est))  # ``add`` keeps the parents topological
        return Built(tree, tuple(self.ghosts))


@dataclass(frozen=True)
class Built:
    """A built draft tree and the candidates the GT threshold kept out of it."""

    tree: DraftTree
    ghosts: tuple[GhostNode, ...]
