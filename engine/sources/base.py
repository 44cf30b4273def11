"""The protocol a new draft source implements: set up on prefill, propose candidates under a budget, observe what
was verified.  A new source is one file in ``engine/sources/`` (plus its line in ``SOURCE_TYPES``, ``__init__.py``).

Read top-down: the protocol (``DraftSource``, and ``RunConfig``, what it reads of its run's settings), then the small
types its calls pass (``SourceInfo`` and its ``Role``; ``Request``; ``Rows`` and ``Candidates``; ``Verified``), then
helpers a source may use (``Locked``, ``SourceMemory``, ``extend_chain``).  The serving engine's command that runs
a source's drafter (``Serve``, what a source's settings return from ``serve()``) is in ``engines.py``.

A source is one object per generation (``make_sources`` in ``engine/sources/__init__.py`` builds them);
what it keeps across requests of one user lives in that user's ``SourceMemory``.  The decoding loop
calls the three methods on its own schedule and never asks what a source can do; where a source's
candidates go in the draft tree is the tree builder's business (Goose Alg. 1, ``spine_tree.py``),
decided by the source's ``Role``.  The Goose authors' code splits the same job into ``SpineSource`` /
``BranchSource`` protocols; HF's ``CandidateGenerator`` is the one-interface precedent.
"""
from __future__ import annotations

import enum
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, Protocol

from ..core.tree import DraftTree, Source

if TYPE_CHECKING:
    from ..core.verify import ReadBack


class DraftSource(Protocol):
    """A draft source: three calls with fixed signatures, the same for every source."""

    info: SourceInfo
    #: its own settings' dataclass, with a ``FLAT`` map from field to flat name (CLI flag / trace key) and an
    #: ``extra_rows`` count (rows it rides along in every forward); ``DecodeConfig`` holds one instance
    config_type: type
    #: successors per forward row the source needs read back for ``observe`` (0 = none)
    top_k: int

    def prefill(self, prompt: Sequence[int], back: ReadBack | None) -> None:
        """Set up for a request: the prompt and its rows' greedy tokens and top-k successors (None when no
        active source reads successors: ``top_k`` 0 for all)."""

    def propose(self, request: Request) -> Candidates:
        """Candidates below ``request``'s node, at most about ``request.budget`` of them."""

    def observe(self, verified: Verified) -> None:
        """Learn from a verified forward: its rows, their logits' read-back, the accepted path."""


class RunConfig(Protocol):
    """What a source reads of its run's settings.  ``engine.decoding.config.DecodeConfig`` is one: the decoding layer,
    above the sources, passes it in, so the sources never import it (the config reads the registry)."""

    tree: Any  # ``TreeShape``: B, D, K, the spine's limits
    variant: Any  # ``Variant``: how the paper's gaps are filled
    sampler: Any  # ``SamplerConfig``: the seed
    active_sources: tuple[str, ...]  # the sources this run drafts with
    drafts_alone: bool  # the method is one source drafting alone

    def source_config(self, name: str) -> Any:
        """Source ``name``'s own settings (its ``config_type``)."""


@dataclass(frozen=True)
class SourceInfo:
    """What the page, the figures, the tables and the tree builder know of a source.

    ``short`` names its tokens in the coloured output and in tables ("PLD"); ``label`` names its nodes in
    the legend and the page's toggles ("PLD spine"); ``blurb`` says where its tokens come from.  Each source
    also offers a method of its own, named after it, that drafts with it alone (``method_label``,
    ``candidate_tree``): the config's methods and the page's method menu read them from the registry.  The colours
    are from Okabe & Ito's colour-blind-safe set; a new source picks a pair that tests/test_viz.py's contrast
    check (every pair apart under protanopia, deuteranopia and tritanopia) still passes.
    """

    name: str  # the source's name in configs, traces, CLI flags and ``accepted_by_source`` ("pld"); its nodes' tag
    label: str
    short: str
    colour: str  # node colour (CSS hex)
    role: Role
    blurb: str
    tint: str  # background of its tokens in the coloured output (CSS hex; dark text stays legible on it)
    method_label: str  # the page's label of the method that drafts with this source alone ("PLD only (chain)")
    candidate_tree: bool = False  # that method verifies the source's own candidate tree as proposed (PTD §3.3,
    # SuffixDecoding) instead of a tree the builder grows from its candidates

    source: Source = field(init=False)  # its nodes' tag, ``Source(name)``, declared here: the core names no source

    def __post_init__(self) -> None:
        object.__setattr__(self, "source", Source.declare(self.name, spine=self.role is Role.SPINE))


class Role(enum.Enum):
    """The part a source plays in the spine tree (Goose Alg. 1); Goose names the first two."""

    SPINE = "spine"  # step 1: the main path of its anchor proposal may become the spine (the longest chain
    # wins); whatever it proposes off that path joins the candidate pool
    POOL = "pool"  # step 1b: its candidate tree for the anchor takes a share of what the spine left
    BRANCH = "branch"  # steps 2-4: successors of any node (the root, spine nodes, branch leaves)


class Request(NamedTuple):
    """Where candidates are wanted: below the anchor, or below a node of the tree being built (a NamedTuple:
    tree building asks at every node, so it must be cheap to make).

    Attributes:
        context: the committed tokens (prompt + output), ending with the anchor; read-only.
        path: draft tokens from the anchor's child down to the node asked about (() = the anchor).
        budget: most candidates wanted (a source may return fewer; a candidate tree may return more,
            the builder then keeps its best).
    """

    context: Sequence[int]
    path: tuple[int, ...] = ()
    budget: int = 1

    @property
    def depth(self) -> int:
        """Tree depth of the node asked about (anchor = 0)."""
        return len(self.path)

    @property
    def token(self) -> int:
        return self.path[-1] if self.path else self.context[-1]

    @property
    def prev(self) -> int | None:
        """The token before ``token`` on its path (None at the start of the sequence)."""
        if len(self.path) >= 2:
            return self.path[-2]
        if self.path:
            return self.context[-1]
        return self.context[-2] if len(self.context) > 1 else None

    def tail(self, n: int) -> list[int]:
        """The last ``n`` tokens of context + path (what a suffix matcher looks up)."""
        need = max(0, n - len(self.path))
        return [*self.context[max(0, len(self.context) - need):], *self.path][-n:] if n > 0 else []


class Rows(NamedTuple):
    """Rows a source asks to ride along in the verification forward under the anchor, never verified (PTD's
    drafting rows, PTD §3.2): their tokens, their parents among these rows (None = the anchor), and the tag
    their nodes carry (the source finds its rows' greedy tokens by it: ``Verified.greedy_of``)."""

    tokens: tuple[int, ...] = ()
    parents: tuple[int | None, ...] = ()
    tag: Source | None = None  # None only for no rows


@dataclass(frozen=True)
class Candidates:
    """A source's proposal: a small tree of candidates hanging below the node asked about.

    Attributes (length m each, in topological order):
        tokens: candidate token ids.
        parents: index of each candidate's parent among these candidates, None = the node asked about.
        scores: the score shown for the node (TR: adjacency probability; PLD: per-depth acceptance rate;
            suffix: continuation frequency; PTD: per-depth rate).
        p: estimated acceptance of the candidate given its parent was accepted (the GT estimates multiply
            these along a path).
        match: context tokens matched to find them (0 = not a context match), shown in traces and tables.
        confidence: Goose §4.3 confidence in [0, 1] of a context match (0 otherwise).
        consensus: several match lengths agree on the first token (Goose B.2), for the bypass rule.
        rows: rows to ride along in the verification forward (``Rows``; none by default).
    """

    tokens: tuple[int, ...] = ()
    parents: tuple[int | None, ...] = ()
    scores: tuple[float, ...] = ()
    p: tuple[float, ...] = ()
    match: int = 0
    confidence: float = 0.0
    consensus: bool = False
    rows: Rows = Rows()

    def __len__(self) -> int:
        return len(self.tokens)

    def children(self) -> tuple[tuple[int, ...], ...]:
        """Per candidate, its children's indices (in order); derived from ``parents``."""
        kids: list[list[int]] = [[] for _ in self.tokens]
        for i, parent in enumerate(self.parents):
            if parent is not None:
                kids[parent].append(i)
        return tuple(tuple(k) for k in kids)

    def roots(self) -> tuple[int, ...]:
        """Indices of the candidates hanging directly below the node asked about."""
        return tuple(i for i, parent in enumerate(self.parents) if parent is None)

    @property
    def main_path(self) -> tuple[int, ...]:
        """Indices of the first-proposed path: the first candidate, its first child, and so on."""
        first: dict[int | None, int] = {}  # node (None: the node asked about) -> its first child
        for i, parent in enumerate(self.parents):
            first.setdefault(parent, i)
        path, node = [], first.get(None)
        while node is not None:
            path.append(node)
            node = first.get(node)
        return tuple(path)

    def main_chain(self) -> Candidates:
        """The main path as a chain (its candidates' own estimates), keeping the match facts."""
        main = self.main_path
        if len(main) == len(self):
            return self
        return Candidates.chain([self.tokens[i] for i in main], [self.p[i] for i in main], match=self.match,
                                confidence=self.confidence, consensus=self.consensus)

    @classmethod
    def chain(cls, tokens: Sequence[int], p: Sequence[float], **kw) -> Candidates:
        """A chain: candidate i is the child of candidate i - 1; scores are the estimates."""
        return cls(tuple(tokens), (None, *range(len(tokens) - 1))[: len(tokens)], tuple(p), tuple(p), **kw)


@dataclass(frozen=True)
class Verified:
    """What one verification forward showed, as every source observes it.

    Attributes:
        forward: every row of the forward: the draft tree, then the rows sources asked to ride along.
        tree_rows: rows of ``forward`` that are the verified draft tree.
        prev: the token before the anchor (None at the start of the sequence).
        back: each row's greedy token and top-k successors (``verify.read_back``).
        accepted: accepted tree nodes, root excluded, in path order.
        committed: tokens appended to the output this cycle (accepted + bonus, cut at EOS / max tokens).
        output: every token generated so far, this cycle's included.
        finished: the generation ends with this cycle.
    """

    forward: DraftTree
    tree_rows: int
    prev: int | None
    back: ReadBack
    accepted: tuple[int, ...]
    committed: tuple[int, ...]
    output: Sequence[int]
    finished: bool

    def row_prev_tokens(self) -> list[int | None]:
        """Per forward row, the token before the row's input token on its path."""
        f = self.forward
        return [self.prev, *(f.tokens[p] for p in f.parents[1:])]

    def greedy_of(self, source: Source) -> list[int]:
        """The greedy token after each forward row tagged ``source``, in row order."""
        return [g for g, s in zip(self.back.greedy, self.forward.sources) if s is source]


class Locked:
    """A structure one visitor's generations share (one visitor's race runs two at once), guarded by ``self.lock``:
    pickled without the lock and its ``TRANSIENT`` fields, which the copy makes anew (a lock does not pickle; on a
    ZeroGPU Space a visitor's memory crosses into the GPU worker and back: app.gpu_handler)."""

    TRANSIENT: ClassVar[dict[str, Callable[[], Any]]] = {}  # field -> how the copy makes it

    lock: threading.Lock

    def __getstate__(self) -> dict:
        with self.lock:
            return {k: v for k, v in self.__dict__.items() if k != "lock" and k not in self.TRANSIENT}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.lock = threading.Lock()
        for name, make in self.TRANSIENT.items():
            setattr(self, name, make())


class SourceMemory(Locked):
    """What draft sources keep across the requests of one user (or one bench session); never shared.

    Sources store under their own name (``slot``), per model (``scope``).  The page keeps one per visitor in
    ``gr.State``; one visitor's race runs two generations at once, hence the lock.  (A plain class, not a
    dataclass: gradio serialises dataclass state values field by field, and a lock does not copy.)
    """

    def __init__(self) -> None:
        self.slots: dict[str, object] = {}
        self.scopes: dict[str, SourceMemory] = {}
        self.lock = threading.Lock()

    def slot(self, name: str, make):
        """The object stored under ``name``, made by ``make()`` the first time."""
        with self.lock:
            if name not in self.slots:
                self.slots[name] = make()
            return self.slots[name]

    def kept(self, name: str, key, make):
        """The object stored under ``name`` when it was made for ``key`` (a source's settings), else a new one from
        ``make()`` that replaces it: a visitor who changes a setting keeps one structure per source, not one per
        value tried."""
        with self.lock:
            held = self.slots.get(name)
            if not (isinstance(held, tuple) and held[0] == key):
                held = self.slots[name] = (key, make())
            return held[1]

    def scope(self, key: str) -> SourceMemory:
        """The memory kept for ``key`` (a model: token ids of one tokenizer mean nothing to another)."""
        with self.lock:
            return self.scopes.setdefault(key, SourceMemory())

    def __deepcopy__(self, memo) -> SourceMemory:
        """A fresh, empty memory: gradio deep-copies a ``gr.State`` default for every visitor."""
        return SourceMemory()


def extend_chain(source: DraftSource, context: Sequence[int], chain: Candidates, limit: int, budget: int,
                 saturated: bool) -> Candidates:
    """Grow a confident spine chain by asking its source again below it (Goose §4.3, as the authors' code).

    A confident cycle is usually inside a passage the target is reproducing, where one lookup only reaches
    so far: the source is asked for candidates below the chain so far (``Request.path``), and their main
    path is appended, while the chain is shorter than ``limit`` (the last lookup may overshoot it; the tree
    budget bounds what is verified).  A ``saturated`` cycle (confidence 1.0) keeps growing only while each
    further lookup is saturated too; the first that is not is still appended, then growth stops.
    ``budget`` is each lookup's request budget.  Returns the grown chain (its match facts kept).
    """
    tokens, p = list(chain.tokens), list(chain.p)
    while len(tokens) < limit:
        more = source.propose(Request(context, tuple(tokens), budget))
        path = more.main_path
        if not path:
            break
        tokens += [more.tokens[i] for i in path]
        p += [more.p[i] for i in path]
        if saturated and more.confidence < 1.0:
            break
    return Candidates.chain(tokens, p, match=chain.match, confidence=chain.confidence, consensus=chain.consensus)
