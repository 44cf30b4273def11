"""Draft-tree figure of one decoding cycle (plotly + networkx), sized to be read from the back of a room.

Layout: a layered tidy tree, depth on the x axis; children in walk-priority then rank order; each
leaf gets its own row and a parent sits at the mean of its children's rows, so edges never cross.
Nodes are coloured by source; the accepted path is drawn thick, rejected nodes faded, GT-pruned
candidates as ghosts, and the bonus token as a star after the last accepted node.

Projector geometry (the page's tree area at 1280×800 is about ``PLOT_WIDTH_PX`` wide and the figure
``FIG_HEIGHT_PX`` high): labels are ``LABEL_PX`` monospace, rows ``ROW_PX`` apart, and a label never
runs past its column, so no two labels or markers overlap.  Edges start after the longest label of
their column, so no line runs through a label.  A tree with more leaves than rows first has its
rejected subtrees folded into one node each ("+N", largest first, just enough), then rejected siblings
merged; a tree deeper than ``MAX_COLUMNS`` has the middle of its longest straight chains folded ("⋯N").
``show_all=True`` draws every node instead (the figure grows).  ``label_boxes`` returns the pixel
boxes this geometry gives, for tests.
"""
from __future__ import annotations

import html
from collections.abc import Callable

import networkx as nx
import plotly.graph_objects as go

from engine.sources import REGISTRY
from engine.trace import CycleTrace
from engine.tree import WALK_PRIORITY, Source

#: Node colours by source (``engine.sources.REGISTRY``); the legend always names every draft source.
SOURCE_STYLE = {Source.ROOT: ("#6b7280", "anchor"), **{i.source: (i.colour, i.label) for i in REGISTRY}}
BONUS_COLOR = "#dc2626"
ACCEPT_COLOR = "#7c3aed"  # the accepted path: violet reads on a light and on a dark page
EDGE_COLOR = "#9ca3af"
GROUP_COLOR = "#9ca3af"

LABEL_PX = 16  # label font size: legible from the back row of a room at 1280×800
CHAR_PX = 9.8  # width of one monospace character at LABEL_PX (DejaVu Sans Mono: 0.602 em, rounded up)
MARKER_PX = 14  # marker diameter
ROW_PX = 24  # vertical distance between rows (a label is ~19 px high)
PLOT_WIDTH_PX = 860  # plot area assumed for label lengths: the page's tree area at 1280×800 (wider only helps)
FIG_HEIGHT_PX = 450  # the figure's height on the page (fits one 1280×800 screen with the controls)
MARGIN = dict(l=10, r=10, t=40, b=64)  # title on top, legend below the plot
MAX_ROWS = (FIG_HEIGHT_PX - MARGIN["t"] - MARGIN["b"]) // ROW_PX  # 14
MIN_COLUMNS = 6  # the x range spans at least this many depths (a short tree is not stretched)
MAX_COLUMNS = 10  # deeper trees fold the middle of straight chains, so a label keeps >= 6 characters
MAX_LABEL_CHARS = 12

#: Step-through stages of one cycle (``viz.lesson`` has one sentence for each).
STAGES = (*(i.name for i in REGISTRY), "scored", "walk", "bonus")


def visible_token(text: str, limit: int = 24) -> str:
    """Escape a token for hover/labels with whitespace made visible (space ␣, newline ↵, tab →)."""
    text = text.replace(" ", "␣").replace("\n", "↵").replace("\t", "→").replace("\r", "␍")
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return html.escape(text, quote=False)  # plotly decodes &lt; &gt; &amp; but shows &quot; literally


def tree_graph(trace: CycleTrace) -> nx.DiGraph:
    """DiGraph of the cycle: verified nodes (int ids), ghosts ('g<i>') and the bonus node ('bonus').

    Node data: kind, token, source, depth, score, est, greedy (what the target wants after this node),
    wanted (what the target wanted at this node's place: ``greedy`` of its parent), accepted, rank.
    """
    tree, on_path = trace.tree, {0, *trace.accepted}
    g = nx.DiGraph()
    for i in range(len(tree)):
        parent = tree.parents[i]
        g.add_node(i, kind="node", token=tree.tokens[i], source=tree.sources[i], depth=tree.depths[i],
                   score=tree.scores[i], est=tree.est_accept[i], greedy=trace.greedy[i],
                   wanted=trace.greedy[parent] if i else None, accepted=i in on_path,
                   rank=(WALK_PRIORITY.index(tree.sources[i]) if i else 0, i))
        if i:
            g.add_edge(parent, i)
    for k, ghost in enumerate(trace.ghosts):
        g.add_node(f"g{k}", kind="ghost", token=ghost.token, source=ghost.source, depth=tree.depths[ghost.parent] + 1,
                   score=ghost.score, est=ghost.est_accept, greedy=None, wanted=trace.greedy[ghost.parent],
                   accepted=False, rank=(9, 10_000 + k))
        g.add_edge(ghost.parent, f"g{k}")
    last = trace.accepted[-1] if trace.accepted else 0
    g.add_node("bonus", kind="bonus", token=trace.bonus, source=None, depth=tree.depths[last] + 1, score=None,
               est=None, greedy=None, wanted=None, accepted=True, rank=(-1, -1))
    g.add_edge(last, "bonus")
    return g


# -- folding: fit the rows and the columns -------------------------------------------------------


def _leaves(g: nx.DiGraph, v) -> int:
    kids = list(g.successors(v))
    return 1 if not kids else sum(_leaves(g, c) for c in kids)


def _fold(g: nx.DiGraph, parent, members: list, name: str, kind: str) -> None:
    """Replace ``members`` (each with its whole subtree) by one node ``name`` under ``parent``."""
    everything = []
    for m in members:
        everything += [m, *nx.descendants(g, m)]
    data = [g.nodes[m] for m in everything if g.nodes[m]["kind"] in ("node", "ghost")]
    data += [d for m in everything if g.nodes[m]["kind"] == "group" for d in g.nodes[m]["members"]]
    first = g.nodes[members[0]]
    g.remove_nodes_from(everything)
    g.add_node(name, kind=kind, token=None, source=first["source"], depth=first["depth"], score=None, est=None,
               greedy=None, wanted=first.get("wanted"), accepted=False, rank=first["rank"], members=data,
               ghost=all(d["kind"] == "ghost" for d in data))
    g.add_edge(parent, name)


def fit_rows(g: nx.DiGraph, max_rows: int) -> nx.DiGraph:
    """Fold rejected subtrees until the tree has at most ``max_rows`` leaves (rows); the accepted path,
    the anchor and the bonus are never folded.  First the rejected subtree that saves just enough rows
    (else the largest), then the rejected children of the parent that has most of them."""
    g = g.copy()
    n = 0
    while _leaves(g, 0) > max_rows:
        need = _leaves(g, 0) - max_rows
        off = [v for v in g if not g.nodes[v]["accepted"] and g.nodes[v]["kind"] != "group" and _leaves(g, v) > 1]
        if off:
            enough = [v for v in off if _leaves(g, v) - 1 >= need]
            v = min(enough, key=lambda v: (_leaves(g, v), str(v))) if enough else \
                max(off, key=lambda v: (_leaves(g, v), str(v)))
            _fold(g, next(g.predecessors(v)), [v], f"c{n}", "group")
        else:
            parents = [p for p in g if sum(not g.nodes[c]["accepted"] for c in g.successors(p)) >= 2]
            if not parents:
                break
            p = max(parents, key=lambda p: (sum(not g.nodes[c]["accepted"] for c in g.successors(p)), str(p)))
            kids = sorted((c for c in g.successors(p) if not g.nodes[c]["accepted"]), key=lambda c: g.nodes[c]["rank"])
            _fold(g, p, kids, f"c{n}", "group")
        n += 1
    return g


def _columns(g: nx.DiGraph) -> dict:
    col = {0: 0}
    for u, v in nx.bfs_edges(g, 0):
        col[v] = col[u] + 1
    return col


def fit_columns(g: nx.DiGraph, max_cols: int) -> nx.DiGraph:
    """Fold the middle of the longest straight chain (nodes with one child each, all accepted or all
    rejected) into one "⋯N" node until the tree spans at most ``max_cols`` columns."""
    g = g.copy()
    n = 0
    while max(_columns(g).values()) + 1 > max_cols:
        need = max(_columns(g).values()) + 1 - max_cols
        best = []
        for v in g:
            d = g.nodes[v]
            if d["kind"] != "node" or v == 0:
                continue
            parent = next(g.predecessors(v))
            if g.out_degree(parent) == 1 and g.nodes[parent]["kind"] == "node" and parent != 0 \
                    and g.nodes[parent]["accepted"] == d["accepted"]:
                continue  # not the start of a chain
            chain = [v]
            while g.out_degree(chain[-1]) == 1:
                nxt = next(g.successors(chain[-1]))
                if g.nodes[nxt]["kind"] != "node" or g.nodes[nxt]["accepted"] != d["accepted"]:
                    break
                chain.append(nxt)
            if len(chain) > len(best):
                best = chain
        if len(best) < 4:  # keep a chain's first and last token; folding fewer than 2 saves nothing
            break
        fold = min(need + 1, len(best) - 2)  # nodes replaced by one: saves fold - 1 columns
        start = max(1, (len(best) - fold) // 2)  # the middle of the chain: its first and last tokens stay
        middle = best[start: start + fold]
        last = middle[-1]
        after = next(g.successors(last))
        data = [g.nodes[m] for m in middle]
        first = data[0]
        g.remove_nodes_from(middle)
        g.add_node(f"r{n}", kind="run", token=None, source=first["source"], depth=first["depth"], score=None,
                   est=None, greedy=None, wanted=None, accepted=first["accepted"], rank=first["rank"], members=data,
                   ghost=False)
        g.add_edge(best[start - 1], f"r{n}")
        g.add_edge(f"r{n}", after)
        n += 1
    return g


def tidy_layout(g: nx.DiGraph, root=0) -> dict:
    """{node: (column, row)}: leaves take consecutive rows in DFS order, parents the mean of their
    children; the column is the node's distance from the root in ``g`` (its depth unless a chain was folded)."""
    pos, next_row, col = {}, [0], _columns(g)

    def place(v) -> float:
        kids = sorted(g.successors(v), key=lambda c: g.nodes[c]["rank"])
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


def _label(d: dict, token_text, chars: int, stage: str | None) -> str:
    if d["kind"] == "group":
        return f"+{len(d['members'])}"
    if d["kind"] == "run":
        return f"⋯{len(d['members'])}"
    text = visible_token(token_text(d["token"]), max(1, chars - (stage == "scored")))
    if stage == "scored" and d["kind"] == "node" and d["wanted"] is not None:
        text += "✓" if d["wanted"] == d["token"] else "✗"
    return text


def _text_width(label: str) -> float:
    return len(html.unescape(label)) * CHAR_PX


def default_title(trace: CycleTrace) -> str:
    """Cycle number, mode, size and outcome, e.g. "cycle 3 · tree · 40 nodes · 5 tokens (spine continuation)";
    a tree cycle adds how the spine's match shaped it (Goose §4.3): its confidence, the chain (extended or not)
    and the node budget, e.g. "· confidence 0.90, chain 20 → 34 tokens, budget 96"."""
    return (f"cycle {trace.index} · {trace.mode} · {len(trace.tree)} nodes · "
            f"{len(trace.new_tokens)} tokens ({trace.path_category}){_shape_note(trace)}")


def _shape_note(trace: CycleTrace) -> str:
    """Title suffix: the match confidence, the spine chain (extended or not) and the budget of a tree cycle."""
    if trace.mode != "tree" or trace.budget is None:
        return ""
    if not trace.match_tokens or trace.confidence is None:
        return f" · budget {trace.budget}"
    chain = (f"chain {trace.match_tokens} → {trace.chain_tokens} tokens" if trace.extended
             else f"match {trace.match_tokens} tokens")
    return f" · confidence {trace.confidence:.2f}, {chain}, budget {trace.budget}"


def tree_figure(trace: CycleTrace, token_text: Callable[[int], str], show_ghosts: bool = True,
                title: str | None = None, stage: str | None = None, show_all: bool = False) -> go.Figure:
    """Plotly figure of ``trace``'s draft tree.

    Args:
        trace: one cycle from ``SpecDecoder.generate``.
        token_text: id -> display text (e.g. ``lambda i: tokenizer.decode([i])``).
        show_ghosts: draw GT-pruned candidates as faint ghosts.
        title: figure title (default: ``default_title``).
        stage: one of ``STAGES`` to draw the cycle part way (step-through); None draws it whole.
            a source's name ('pld', 'tr', ...): the drafts of the sources so far (``REGISTRY`` order),
            unverified; 'scored': every node marked ✓ where it equals the target's token at its place,
            ✗ where not; 'walk': the accepted path; 'bonus': the whole cycle (as None).
        show_all: draw every node (no folding); the figure grows to fit.
    Raises:
        ValueError: unknown ``stage``.
    """
    if stage is not None and stage not in STAGES:
        raise ValueError(f"stage must be one of {', '.join(STAGES)} (got {stage!r})")
    g = tree_graph(trace)
    if not show_ghosts:
        g.remove_nodes_from([v for v, d in g.nodes(data=True) if d["kind"] == "ghost"])
    if not show_all:
        g = fit_columns(fit_rows(g, MAX_ROWS), MAX_COLUMNS)
    pos = tidy_layout(g)
    n_rows = max(1, int(max(y for _, y in pos.values())) + 1)
    n_cols = max(x for x, _ in pos.values()) + 1
    span = max(n_cols, MIN_COLUMNS) + 0.35
    px_per_col = PLOT_WIDTH_PX / span
    chars = max(1, min(MAX_LABEL_CHARS, int((px_per_col - MARKER_PX - 10) / CHAR_PX)))
    visible = _stage_nodes(g, stage)
    labels = {v: _label(g.nodes[v], token_text, chars, stage) for v in visible}
    ends = {}  # per column: where the longest label ends (data units); edges start there
    for v in visible:
        x = pos[v][0]
        ends[x] = max(ends.get(x, 0.0), (MARKER_PX / 2 + 4 + _text_width(labels[v])) / px_per_col)
    fig = go.Figure()
    _add_edges(fig, g, pos, visible, ends, stage, px_per_col)
    walked = stage in (None, "walk", "bonus")
    for src, (color, label) in SOURCE_STYLE.items():
        _add_nodes(fig, g, pos, visible, labels, token_text, walked,
                   lambda d, s=src: d["kind"] in ("node", "ghost") and d["source"] is s, color, label)
    _add_nodes(fig, g, pos, visible, labels, token_text, walked, lambda d: d["kind"] in ("group", "run"),
               GROUP_COLOR, "folded nodes (+N / ⋯N)", symbol="square")
    _add_nodes(fig, g, pos, visible, labels, token_text, walked, lambda d: d["kind"] == "bonus", BONUS_COLOR,
               "bonus token", symbol="star")
    _add_legend_marks(fig)
    rows_shown = max(n_rows, MAX_ROWS)
    height = FIG_HEIGHT_PX if rows_shown <= MAX_ROWS else MARGIN["t"] + MARGIN["b"] + ROW_PX * rows_shown
    fig.update_layout(
        title=dict(text=title or default_title(trace), y=0.985, x=0.01, font=dict(size=18)),
        uirevision="draft-tree",  # keep the user's zoom / pan across cycles
        showlegend=True, legend=dict(orientation="h", x=0, y=0, yanchor="top", font=dict(size=14),
                                     bgcolor="rgba(0,0,0,0)"),
        xaxis=dict(range=[-0.35, span - 0.35], showgrid=False, zeroline=False, showticklabels=False, fixedrange=False),
        yaxis=dict(range=[rows_shown - 0.5, -0.5], visible=False),
        height=height, margin=MARGIN, font=dict(size=LABEL_PX),
        paper_bgcolor="rgba(0,0,0,0)", plot_bgcolor="rgba(0,0,0,0)",  # the page's theme shows through
        hoverlabel=dict(font=dict(size=15)),
    )
    return fig


def _stage_nodes(g: nx.DiGraph, stage: str | None) -> set:
    """The nodes drawn at ``stage``: the drafts of the sources shown so far (with what hangs off them),
    then everything; the bonus only at the last stage."""
    if stage is None or stage == "bonus":
        return set(g)
    names = [i.name for i in REGISTRY]
    shown = {i.source for i in REGISTRY[: names.index(stage) + 1]} if stage in names else set(Source)
    keep = {0}
    for u, v in nx.bfs_edges(g, 0):
        d = g.nodes[v]
        if u in keep and d["kind"] != "bonus" and (d["source"] in shown or d["source"] is None):
            keep.add(v)
    return keep


def _add_edges(fig: go.Figure, g: nx.DiGraph, pos: dict, visible: set, ends: dict, stage: str | None,
               px_per_col: float) -> None:
    walked = stage in (None, "walk", "bonus")
    groups = {"accepted": ([], []), "other": ([], []), "ghost": ([], [])}
    for u, v in g.edges:
        if u not in visible or v not in visible:
            continue
        dv = g.nodes[v]
        kind = "ghost" if dv["kind"] == "ghost" or dv.get("ghost") else (
            "accepted" if walked and g.nodes[u]["accepted"] and dv["accepted"] else "other")
        xs, ys = groups[kind]
        (x0, y0), (x1, y1) = pos[u], pos[v]
        start = x0 + ends[x0]
        xs += [start, x1 - (MARKER_PX / 2 + 2) / px_per_col, None]  # from after the labels to the marker
        ys += [y0, y1, None]
    style = {"accepted": dict(color=ACCEPT_COLOR, width=5), "other": dict(color=EDGE_COLOR, width=1.5),
             "ghost": dict(color=EDGE_COLOR, width=1.5, dash="dot")}
    for kind, (xs, ys) in groups.items():
        fig.add_trace(go.Scatter(x=xs or [None], y=ys or [None], mode="lines", line=style[kind], hoverinfo="skip",
                                 showlegend=False, name=f"{kind} edges"))


def _add_legend_marks(fig: go.Figure) -> None:
    """Legend-only entries for what a node's look means (colour says the source)."""
    for name, marker, line in (
            ("accepted path", dict(color="#6b7280", size=MARKER_PX, line=dict(color=ACCEPT_COLOR, width=3)),
             dict(color=ACCEPT_COLOR, width=5)),
            ("rejected (faded)", dict(color="#6b7280", size=MARKER_PX, opacity=0.4), dict(color=EDGE_COLOR, width=1.5)),
            ("ghost: pruned by GT, never verified", dict(color="#6b7280", size=MARKER_PX, opacity=0.2),
             dict(color=EDGE_COLOR, width=1.5, dash="dot"))):
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines+markers", name=name, marker=marker, line=line,
                                 hoverinfo="skip", legendgroup=name))


def _add_nodes(fig: go.Figure, g: nx.DiGraph, pos: dict, visible: set, labels: dict, token_text, walked: bool,
               keep, color: str, label: str, symbol: str = "circle") -> None:
    nodes = [v for v, d in g.nodes(data=True) if v in visible and keep(d)]
    xs, ys, texts, hovers, opacity, lines = [], [], [], [], [], []
    for v in nodes:
        d = g.nodes[v]
        xs.append(pos[v][0])
        ys.append(pos[v][1])
        texts.append(labels[v])
        hovers.append(_hover(d, token_text, walked))
        ghost = d["kind"] == "ghost" or d.get("ghost")
        opacity.append(1.0 if d["accepted"] or not walked else (0.25 if ghost else 0.45))
        lines.append(3 if walked and d["accepted"] and d["kind"] == "node" else 0)
    fig.add_trace(go.Scatter(
        x=xs or [None], y=ys or [None], mode="markers+text", name=label, text=texts, textposition="middle right",
        textfont=dict(size=LABEL_PX, family="DejaVu Sans Mono, Menlo, Consolas, monospace"),
        hovertext=hovers, hoverinfo="text",
        marker=dict(color=color, size=MARKER_PX, symbol=symbol, opacity=opacity or 1.0,
                    line=dict(color=ACCEPT_COLOR, width=lines or 0)),
    ))


def _hover(d: dict, token_text, walked: bool = True) -> str:
    q = lambda t: visible_token(token_text(t))  # noqa: E731
    if d["kind"] == "bonus":
        return f"<b>{q(d['token'])}</b><br>bonus token: the target's greedy token after the accepted path"
    if d["kind"] in ("group", "run"):
        members = d["members"]
        shown = " ".join(q(m["token"]) for m in members[:12]) + (" …" if len(members) > 12 else "")
        if d["kind"] == "run":
            what = "accepted tokens in a row" if d["accepted"] else "rejected draft tokens in a row"
        else:
            what = "GT-pruned candidates" if d["ghost"] else "rejected nodes (with their subtrees)"
        return f"<b>{len(members)} {what}</b>, folded to fit the screen<br>{shown}"
    src = SOURCE_STYLE[d["source"]][1]
    status = "ghost (removed by the GT principle, never verified)" if d["kind"] == "ghost" else (
        "accepted" if d["accepted"] else "rejected") if walked else "not yet verified"
    lines = [f"<b>{q(d['token'])}</b>", f"source: {src}", f"depth: {d['depth']}", f"draft score: {d['score']:.3f}",
             f"est. acceptance: {d['est']:.3f}", f"status: {status}"]
    if d["wanted"] is not None and walked:
        lines.append("the model wanted this token here" if d["wanted"] == d["token"] else
                     f"the model wanted here: {q(d['wanted'])}")
    if d["greedy"] is not None and walked and d["accepted"]:
        lines.append(f"the model's next token after it: {q(d['greedy'])}")
    return "<br>".join(lines)


def label_boxes(fig: go.Figure, width_px: float = PLOT_WIDTH_PX) -> list[tuple[float, float, float, float]]:
    """Pixel boxes (x0, y0, x1, y1) of every drawn marker-with-label in ``fig``, as laid out in a plot area
    ``width_px`` wide (labels are drawn at ``LABEL_PX`` right of their marker).  For tests of overlap."""
    x0, x1 = fig.layout.xaxis.range
    y_hi, y_lo = fig.layout.yaxis.range  # reversed axis: the first row on top
    height = fig.layout.height - fig.layout.margin.t - fig.layout.margin.b
    boxes = []
    for tr in fig.data:
        if tr.mode != "markers+text":
            continue
        for x, y, text in zip(tr.x, tr.y, tr.text or ()):
            if x is None:
                continue
            px = (x - x0) / (x1 - x0) * width_px
            py = (y - y_lo) / (y_hi - y_lo) * height
            boxes.append((px - MARKER_PX / 2, py - LABEL_PX * 0.6, px + MARKER_PX / 2 + 4 + _text_width(text),
                          py + LABEL_PX * 0.6))
    return boxes
