"""The draft tree as a graph (networkx): built from one cycle's trace, folded to fit the figure's rows and columns,
and laid out as a layered tidy tree (``viz.tree_figure`` draws it).

Layout: depth on the x axis; children in walk-priority then rank order; each leaf gets its own row and a parent sits
at the mean of its children's rows, so edges never cross.  A tree with more leaves than rows first has its rejected
side subtrees folded into one node each ("+N", largest first, just enough), then rejected siblings merged, then the
middle of the spine with the side subtrees hanging off it ("⋯N"); a tree deeper than ``MAX_COLUMNS`` has the middle
of its longest chains folded ("⋯N").  Spine tokens are never folded into a "+N".
"""
from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Literal

import networkx as nx

from engine.core.tree import Source
from engine.decoding.config import WALK_PRIORITY
from engine.decoding.trace import CycleTrace

#: Projector geometry (``viz.tree_figure`` draws at it): the page's tree area at 1280×800.
LABEL_PX = 16  # label font size: legible from the back row of a room at 1280×800
CHAR_PX = 9.8  # width of one monospace character at LABEL_PX (DejaVu Sans Mono: 0.602 em, rounded up)
MARKER_PX = 14  # marker diameter
ROW_PX = 24  # vertical distance between rows (a label is ~19 px high)
PLOT_WIDTH_PX = 860  # plot area assumed for label lengths: the page's tree area at 1280×800 (wider only helps)
FIG_HEIGHT_PX = 450  # the figure's height on the page (fits one 1280×800 screen with the controls)
MARGIN = dict(l=10, r=10, t=62, b=64)  # the title's two lines on top, legend below the plot
MAX_ROWS = (FIG_HEIGHT_PX - MARGIN["t"] - MARGIN["b"]) // ROW_PX  # 13
MIN_COLUMNS = 6  # the x range spans at least this many depths (a short tree is not stretched)
MAX_COLUMNS = 10  # deeper trees fold the middle of straight chains, so a label keeps >= 6 characters


def visible_token(text: str, limit: int = 24) -> str:
    """Escape a token for hover/labels with whitespace made visible (space ␣, newline ↵, tab →)."""
    text = text.replace(" ", "␣").replace("\n", "↵").replace("\t", "→").replace("\r", "␍")
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return html.escape(text, quote=False)  # plotly decodes &lt; &gt; &amp; but shows &quot; literally


#: What a figure node is: a verified draft node (the anchor is node 0), a GT ghost, the bonus token, or a fold:
#: "+N" (``group``: rejected side subtrees or siblings, ``fit_rows``) or "⋯N" (``run``: the middle of a chain).
NodeKind = Literal["node", "ghost", "bonus", "group", "run"]
NODE = "node"  # the graph's one node attribute: its ``FigureNode`` (``node(g, v)``)


@dataclass(frozen=True)
class FigureNode:
    """One node of the figure's graph (``tree_graph``; a fold's data is its members')."""

    kind: NodeKind
    token: int | None
    source: Source | None
    depth: int
    score: float | None
    est: float | None  # the acceptance estimate
    greedy: int | None  # what the target wants after this node
    wanted: int | None  # what the target wanted at this node's place: ``greedy`` of its parent
    accepted: bool
    rank: tuple[int, int]  # children are laid out in this order (walk priority, then index)
    spine: bool  # on ``DraftTree.spine``
    reached: bool  # its parent is the anchor or was accepted: the walk compared it
    members: tuple[FigureNode, ...] = ()  # a fold: the verified nodes and ghosts in it
    sides: tuple[FigureNode, ...] = ()  # a run: the nodes of the side subtrees folded with it
    ghosts_only: bool = False  # a group: every node in it a ghost
    would: bool = False  # a ghost greedy verification would have accepted (``CycleTrace.ghost_hits``)
    cut: bool = False  # accepted by the walk, but past the tokens the cycle committed (EOS or max new tokens cut it)

    @property
    def ghost(self) -> bool:
        """Drawn as a GT ghost: a ghost, or a "+N" fold of ghosts only."""
        return self.kind == "ghost" or self.ghosts_only


def node(g: nx.DiGraph, v) -> FigureNode:
    """The ``FigureNode`` of ``v`` in ``g``."""
    return g.nodes[v][NODE]


def _add(g: nx.DiGraph, v, data: FigureNode) -> None:
    g.add_node(v, **{NODE: data})


def tree_graph(trace: CycleTrace) -> nx.DiGraph:
    """DiGraph of the cycle: verified nodes (int ids), ghosts ('g<i>') and the bonus node ('bonus'), each node's
    data a ``FigureNode`` (``node(g, v)``).  Where EOS or max new tokens cut the cycle, the accepted path is drawn up
    to the cut: the nodes past it are ``cut`` (not accepted), and the bonus token, not committed, is left out."""
    tree = trace.tree
    committed = trace.accepted[: len(trace.new_tokens)]  # EOS or max new tokens may cut the accepted path short
    on_path, cut = {0, *committed}, set(trace.accepted[len(committed):])
    spine = set(tree.spine)
    g = nx.DiGraph()
    for i in range(len(tree)):
        parent = tree.parents[i]
        _add(g, i, FigureNode("node", token=tree.tokens[i], source=tree.sources[i], depth=tree.depths[i],
                              score=tree.scores[i], est=tree.est_accept[i], greedy=trace.greedy[i],
                              wanted=trace.greedy[parent] if i else None, accepted=i in on_path,
                              rank=(WALK_PRIORITY.index(tree.sources[i].value) if i else 0, i), spine=i in spine,
                              reached=i == 0 or parent in on_path or i in cut, cut=i in cut))
        if i:
            g.add_edge(parent, i)
    for k, ghost in enumerate(trace.ghosts):
        _add(g, f"g{k}", FigureNode("ghost", token=ghost.token, source=ghost.source,
                                    depth=tree.depths[ghost.parent] + 1, score=ghost.score, est=ghost.est_accept,
                                    greedy=None, wanted=trace.greedy[ghost.parent], accepted=False,
                                    rank=(9, 10_000 + k), spine=False, reached=False,
                                    would=k in trace.ghost_hits))
        g.add_edge(ghost.parent, f"g{k}")
    if len(trace.new_tokens) <= len(trace.accepted):  # the cut took the bonus token too: it is not drawn
        return g
    last = trace.accepted[-1] if trace.accepted else 0
    _add(g, "bonus", FigureNode("bonus", token=trace.bonus, source=None, depth=tree.depths[last] + 1, score=None,
                                est=None, greedy=None, wanted=None, accepted=True, rank=(-1, -1), spine=False,
                                reached=True))
    g.add_edge(last, "bonus")
    return g


# -- folding: fit the rows and the columns -------------------------------------------------------


def _leaves(g: nx.DiGraph, v) -> int:
    kids = list(g.successors(v))
    return 1 if not kids else sum(_leaves(g, c) for c in kids)


def _in_order(g: nx.DiGraph, names: set) -> list:
    """``names`` in the graph's order: a set of node names (ints and strings such as "g3") iterates in string-hash
    order, which differs from process to process, and a fold's hover lists its nodes in the order they come."""
    return [v for v in g if v in names]


def _fold(g: nx.DiGraph, parent, members: list, name: str, kind: NodeKind) -> None:
    """Replace ``members`` (each with its whole subtree) by one node ``name`` under ``parent``."""
    everything = []
    for m in members:
        everything += [m, *_in_order(g, nx.descendants(g, m))]
    data = [node(g, m) for m in everything if node(g, m).kind in ("node", "ghost")]
    data += [d for m in everything if node(g, m).kind == "group" for d in node(g, m).members]
    first = node(g, members[0])
    g.remove_nodes_from(everything)
    _add(g, name, FigureNode(kind, token=None, source=first.source, depth=first.depth, score=None, est=None,
                             greedy=None, wanted=first.wanted, accepted=False, rank=first.rank, members=tuple(data),
                             ghosts_only=all(d.kind == "ghost" for d in data), spine=False, reached=first.reached))
    g.add_edge(parent, name)


def _next_in_chain(g: nx.DiGraph, v):
    """The child that continues ``v``'s chain, or None: a spine node's spine child when none of its side children
    (branches hanging off the spine) is accepted, else a node's only child."""
    kids = list(g.successors(v))
    if node(g, v).spine:
        on = [c for c in kids if node(g, c).spine]
        if len(on) == 1 and not any(node(g, c).accepted for c in kids if c != on[0]):
            return on[0]
        return None
    return kids[0] if len(kids) == 1 else None


def _chains(g: nx.DiGraph) -> list[list]:
    """Maximal chains of drawn draft nodes (root excluded), each all accepted or all rejected, linked by
    ``_next_in_chain``: straight runs, and spine runs with their side subtrees hanging off."""
    def links(u, v) -> bool:
        return (u != 0 and _next_in_chain(g, u) == v and node(g, v).kind == node(g, u).kind == "node"
                and node(g, v).accepted == node(g, u).accepted)
    chains = []
    for v in g:
        if node(g, v).kind != "node" or v == 0 or links(next(g.predecessors(v)), v):
            continue
        chain = [v]
        while (nxt := _next_in_chain(g, chain[-1])) is not None and links(chain[-1], nxt):
            chain.append(nxt)
        chains.append(chain)
    return chains


def _fold_chain(g: nx.DiGraph, chain: list, start: int, count: int, name: str) -> None:
    """Replace ``chain[start:start + count]`` (with the side subtrees hanging off it) by one "⋯N" node ``name``
    between ``chain[start - 1]`` and ``chain[start + count]``; its colour and status are the chain's."""
    middle, after = chain[start: start + count], chain[start + count]
    side = _in_order(g, (nx.descendants(g, middle[0]) - {after} - nx.descendants(g, after)) - set(middle))
    data = [node(g, m) for m in middle]
    sides = [node(g, m) for m in side if node(g, m).kind in ("node", "ghost")]
    sides += [d for m in side if node(g, m).kind == "group" for d in node(g, m).members]
    first = data[0]
    g.remove_nodes_from([*middle, *side])
    _add(g, name, FigureNode("run", token=None, source=first.source, depth=first.depth, score=None, est=None,
                             greedy=None, wanted=None, accepted=first.accepted, rank=first.rank, members=tuple(data),
                             sides=tuple(sides), spine=first.spine, reached=first.reached))
    g.add_edge(chain[start - 1], name)
    g.add_edge(name, after)


def _fold_spine_rows(g: nx.DiGraph, need: int, n: int) -> bool:
    """Fold the middle of the spine run with the most rows in its side subtrees into "⋯N", just enough to save
    ``need`` rows (its first and last tokens stay).  False when no spine run has side rows to save."""
    best = None
    for chain in _chains(g):
        if len(chain) < 3 or not node(g, chain[0]).spine:
            continue
        mid = (len(chain) - 1) / 2
        for count in range(1, len(chain) - 1):  # the shortest window round the middle that saves enough
            start = min(max(1, round(mid - count / 2)), len(chain) - 1 - count)
            saved = _leaves(g, chain[start]) - _leaves(g, chain[start + count])
            if saved >= need or count == len(chain) - 2:
                if saved > 0 and (best is None or (saved >= need, -count) > (best[0] >= need, -best[3])):
                    best = (saved, chain, start, count)
                break
    if best is None:
        return False
    _fold_chain(g, best[1], best[2], best[3], f"s{n}")
    return True


def fit_rows(g: nx.DiGraph, max_rows: int) -> nx.DiGraph:
    """Fold until the tree has at most ``max_rows`` leaves (rows); the accepted path, the anchor, the bonus and
    the spine's first and last tokens are never folded, and spine tokens never go into a "+N".  In turn: the
    rejected side subtree that saves just enough rows (else the largest), the rejected side children of the
    parent that has most of them, then the middle of the spine with what hangs off it (``_fold_spine_rows``)."""
    g = g.copy()
    n = 0
    while _leaves(g, 0) > max_rows:
        need = _leaves(g, 0) - max_rows
        side = lambda v: not node(g, v).accepted and not node(g, v).spine  # noqa: E731
        off = [v for v in g if side(v) and node(g, v).kind not in ("group", "run") and _leaves(g, v) > 1]
        if off:
            enough = [v for v in off if _leaves(g, v) - 1 >= need]
            v = min(enough, key=lambda v: (_leaves(g, v), str(v))) if enough else \
                max(off, key=lambda v: (_leaves(g, v), str(v)))
            _fold(g, next(g.predecessors(v)), [v], f"c{n}", "group")
        else:
            parents = [p for p in g if sum(side(c) for c in g.successors(p)) >= 2]
            if parents:
                p = max(parents, key=lambda p: (sum(side(c) for c in g.successors(p)), str(p)))
                kids = sorted((c for c in g.successors(p) if side(c)), key=lambda c: node(g, c).rank)
                _fold(g, p, kids, f"c{n}", "group")
            elif not _fold_spine_rows(g, need, n):
                break
        n += 1
    return g


def _columns(g: nx.DiGraph) -> dict:
    col = {0: 0}
    for u, v in nx.bfs_edges(g, 0):
        col[v] = col[u] + 1
    return col


def fit_columns(g: nx.DiGraph, max_cols: int) -> nx.DiGraph:
    """Fold the middle of the longest chain (``_chains``: all accepted or all rejected; a spine run takes the
    side subtrees hanging off its middle with it) into one "⋯N" node until the tree spans at most ``max_cols``
    columns."""
    g = g.copy()
    n = 0
    while max(_columns(g).values()) + 1 > max_cols:
        need = max(_columns(g).values()) + 1 - max_cols
        best = max(_chains(g), key=len, default=[])
        if len(best) < 4:  # keep a chain's first and last token; folding fewer than 2 saves nothing
            break
        fold = min(need + 1, len(best) - 2)  # nodes replaced by one: saves fold - 1 columns
        start = max(1, (len(best) - fold) // 2)  # the middle of the chain: its first and last tokens stay
        _fold_chain(g, best, start, fold, f"r{n}")
        n += 1
    return g


def tidy_layout(g: nx.DiGraph, root=0) -> dict:
    """{node: (column, row)}: leaves take consecutive rows in DFS order, parents the mean of their
    children; the column is the node's distance from the root in ``g`` (its depth unless a chain was folded)."""
    pos, next_row, col = {}, [0], _columns(g)

    def place(v) -> float:
        kids = sorted(g.successors(v), key=lambda c: node(g, c).rank)
        if not kids:
            row = float(next_row[0])
            next_row[0] += 1
        else:
            row = sum(place(c) for c in kids) / len(kids)
        pos[v] = (col[v], row)
        return row

    place(root)
    return pos


# -- the figure --------------------------------------------------------------------------------


def folded_graph(trace: CycleTrace, show_ghosts: bool = True, show_all: bool = False) -> nx.DiGraph:
    """The graph ``tree_figure`` draws: ``tree_graph``, ghosts left out without ``show_ghosts``, folded to fit the
    screen (``fit_rows``, ``fit_columns``) unless ``show_all``."""
    g = tree_graph(trace)
    if not show_ghosts:
        g.remove_nodes_from([v for v, d in g.nodes(data=NODE) if d.kind == "ghost"])
    return g if show_all else fit_columns(fit_rows(g, MAX_ROWS), MAX_COLUMNS)
