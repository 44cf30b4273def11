"""Draft-tree figure of one decoding cycle (plotly + networkx), sized to be read from the back of a room.

Layout: ``viz.tree_layout`` (a layered tidy tree, depth on the x axis, edges never crossing, folded to fit the
rows and columns; ``show_all=True`` draws every node instead and the figure grows).  Nodes are coloured by source;
the accepted path is drawn thick, rejected nodes faded, GT-pruned candidates as ghosts, and the bonus token as a
star after the last accepted node.  The title's words (cycle, mode, size, outcome, the spine's shape) are
``viz.tree_title``'s.

Projector geometry (the page's tree area at 1280×800 is about ``PLOT_WIDTH_PX`` wide and the figure
``FIG_HEIGHT_PX`` high): labels are ``LABEL_PX`` monospace, rows ``ROW_PX`` apart, and a label never
runs past its column, so no two labels or markers overlap.  An edge leaves its parent right after the
parent's own label and runs level to the end of the column's longest label before it turns to the child,
so it is attached to its parent and never runs through a label.  ``label_boxes`` returns the pixel
boxes this geometry gives, for tests.
"""
from __future__ import annotations

import html
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import NamedTuple

import networkx as nx
import plotly.graph_objects as go

from engine.core.tree import Source
from engine.decoding.trace import CycleTrace
from engine.sources import REGISTRY, tags
from viz.tree_layout import (
    CHAR_PX,
    FIG_HEIGHT_PX,
    LABEL_PX,
    MARGIN,
    MARKER_PX,
    MAX_ROWS,
    MIN_COLUMNS,
    NODE,
    PLOT_WIDTH_PX,
    ROW_PX,
    FigureNode,
    folded_graph,
    node,
    tidy_layout,
    visible_token,
)
from viz.tree_title import SUBTITLE, default_title

#: Node colours by source (``engine.sources.REGISTRY``); a figure's legend names the sources drawn in it.  goose-lens's
#: sources, the bonus and the path mark are Okabe & Ito's colour-blind-safe set; the engines' drafters took four
#: colours searched to stay apart from them (tests/test_viz.py checks every pair stays ``MIN_DELTA_E`` apart in normal
#: vision and under protanopia, deuteranopia and tritanopia).
ANCHOR_COLOR = "#4b5563"
SOURCE_STYLE = {Source.ROOT: (ANCHOR_COLOR, "anchor"), **{i.source: (i.colour, i.label) for i in REGISTRY}}
BONUS_COLOR = "#D55E00"  # vermillion
ACCEPT_COLOR = "#56B4E9"  # the accepted path: sky blue reads on a light and on a dark page
EDGE_COLOR = "#9ca3af"
GROUP_COLOR = ANCHOR_COLOR  # folded nodes ("+N"), squares
FOLDED_LABEL = "folded nodes (+N: rejected, or GT ghosts)"  # a fold holds rejected nodes, ghosts, or both

MAX_LABEL_CHARS = 12

#: Step-through stages of one cycle (``viz.lesson`` has one sentence for each).
STAGES = (*(i.name for i in REGISTRY), "scored", "walk", "bonus")


def _label(d: FigureNode, token_text, chars: int, stage: str | None) -> str:
    if d.kind == "group":
        return f"+{len(d.members)}"
    if d.kind == "run":
        return f"⋯{len(d.members)}"
    text = visible_token(token_text(d.token), max(1, chars - (stage == "scored")))
    if stage == "scored" and d.kind == "node" and d.wanted is not None:
        text += "✓" if d.wanted == d.token else "✗"
    return text


def _text_width(label: str) -> float:
    return len(html.unescape(label)) * CHAR_PX


def _title(text: str) -> dict:
    """The figure's title layout: ``text`` up to ``SUBTITLE`` on top, the rest as plotly's subtitle below it."""
    head, _, rest = text.partition(SUBTITLE)
    return dict(text=head, y=0.985, x=0.01, font=dict(size=18),
                subtitle=dict(text=rest.removesuffix("</sup>"), font=dict(size=13)) if rest else None)


class GhostMarks(NamedTuple):
    """Where a cycle's GT-pruned candidates are on its drawing: each a ghost marker of its own (``drawn``), inside
    a "+N" / "⋯N" fold (``folded``), or not drawn since ghosts are switched off (``hidden``)."""

    drawn: int
    folded: int
    hidden: int


def ghost_marks(trace: CycleTrace, show_ghosts: bool = True, show_all: bool = False) -> GhostMarks:
    """How ``tree_figure`` with these switches draws ``trace``'s ghosts (``GhostMarks``), so a sentence that counts
    them names the marks the legend names."""
    if not trace.ghosts or not show_ghosts:  # nothing to place: no fold computed (light frames ask every second)
        return GhostMarks(0, 0, len(trace.ghosts))
    g = folded_graph(trace, True, show_all)
    drawn = sum(d.kind == "ghost" for _, d in g.nodes(data=NODE))
    return GhostMarks(drawn, len(trace.ghosts) - drawn, 0)


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
    g = folded_graph(trace, show_ghosts, show_all)
    pos = tidy_layout(g)
    n_rows = max(1, int(max(y for _, y in pos.values())) + 1)
    n_cols = max(x for x, _ in pos.values()) + 1
    span = max(n_cols, MIN_COLUMNS) + 0.35
    px_per_col = PLOT_WIDTH_PX / span
    chars = max(1, min(MAX_LABEL_CHARS, int((px_per_col - MARKER_PX - 10) / CHAR_PX)))
    visible = _stage_nodes(g, stage)
    labels = {v: _label(node(g, v), token_text, chars, stage) for v in visible}
    drawn = _Drawn(g, pos, visible, labels, token_text, walked=stage in (None, "walk", "bonus"))
    fig, ends = go.Figure(), _label_ends(drawn, px_per_col)
    _add_edges(fig, drawn, ends, px_per_col)
    drawn = _widen_leaf_labels(drawn, ends[1], span, px_per_col, stage)
    drawn_sources = {Source.ROOT} | {d.source for _, d in g.nodes(data=NODE)}  # the legend names these: 8
    # sources and 6 marks would not fit beside a tree
    styles = {src: style for src, style in SOURCE_STYLE.items() if src in drawn_sources}
    for src, (color, label) in styles.items():  # a folded chain ("⋯N") keeps its source's colour
        _add_nodes(fig, drawn, lambda d, s=src: d.kind in ("node", "ghost", "run") and d.source is s, color, label)
    _add_nodes(fig, drawn, lambda d: d.kind == "group", GROUP_COLOR, FOLDED_LABEL)
    _add_nodes(fig, drawn, lambda d: d.kind == "bonus", BONUS_COLOR, "bonus token", symbol="star")
    _add_legend_marks(fig, styles, any(d.would for _, d in g.nodes(data=NODE)))
    _lay_out(fig, title or default_title(trace), n_rows, span)
    return fig


@dataclass(frozen=True)
class _Drawn:
    """What every trace of one tree figure reads: the (folded) graph, each node's (column, row), the nodes drawn at
    this stage and their labels, the token texts (id -> text), and whether the walk is shown (accepted paths,
    faded rejections)."""

    g: nx.DiGraph
    pos: dict
    visible: set
    labels: dict
    token_text: Callable[[int], str]
    walked: bool


MAX_ROOMY_CHARS = 24  # a leaf's label where its row is free to the right (visible_token's own limit)


def _widen_leaf_labels(drawn: _Drawn, ends: dict, span: float, px_per_col: float, stage: str | None) -> _Drawn:
    """``drawn`` with each leaf's label as long as the free room on its row allows (to the next marker within
    0.75 rows, the next edge that crosses the row, or the plot's right edge; at most ``MAX_ROOMY_CHARS``), so a
    label is whole where there is room instead of cut to the columns' common width.  The edges were routed by
    the common labels (``ends``: per column), so nothing an edge passes is covered."""
    g, pos, visible = drawn.g, drawn.pos, drawn.visible
    edges = [(pos[u][0] + ends[pos[u][0]], *sorted((pos[u][1], pos[w][1])))
             for u, w in g.edges if u in visible and w in visible]  # (x where it turns, its rows' span)
    labels = dict(drawn.labels)
    for v in visible:
        x, y = pos[v]
        if any(w in visible for w in g.successors(v)) or node(g, v).kind in ("group", "run"):
            continue
        room = span - 0.35 - x
        room = min([room] + [pos[u][0] - x - 0.5 for u in visible if pos[u][0] > x and abs(pos[u][1] - y) < 0.75]
                   + [turn - x for turn, low, high in edges if turn > x and low - 0.5 < y < high + 0.5])
        chars = min(MAX_ROOMY_CHARS, int((room * px_per_col - MARKER_PX / 2 - 8) / CHAR_PX))
        if chars > len(html.unescape(labels[v])):
            labels[v] = _label(node(g, v), drawn.token_text, chars, stage)
    return replace(drawn, labels=labels)


def _label_ends(drawn: _Drawn, px_per_col: float) -> tuple[dict, dict]:
    """Where labels end, in data units right of the marker's centre: per node, and per column its longest label's
    (an edge runs level to there before it turns)."""
    own = {v: (MARKER_PX / 2 + 4 + _text_width(drawn.labels[v])) / px_per_col for v in drawn.visible}
    ends = {}
    for v in drawn.visible:
        ends[drawn.pos[v][0]] = max(ends.get(drawn.pos[v][0], 0.0), own[v])
    return own, ends


def _lay_out(fig: go.Figure, title: str, n_rows: int, span: float) -> None:
    """The figure's title, legend, axes (``span`` columns, ``n_rows`` rows) and height."""
    rows_shown = max(n_rows, MAX_ROWS)
    height = FIG_HEIGHT_PX if rows_shown <= MAX_ROWS else MARGIN["t"] + MARGIN["b"] + ROW_PX * rows_shown
    fig.update_layout(
        title=_title(title),
        modebar=dict(orientation="v"),  # down the right edge, below the title's lines, never over them
        uirevision="draft-tree",  # keep the user's zoom / pan across cycles
        showlegend=True, legend=dict(orientation="h", x=0, y=0, yanchor="top", font=dict(size=14),
                                     bgcolor="rgba(0,0,0,0)"),
        xaxis=dict(range=[-0.35, span - 0.35], showgrid=False, zeroline=False, showticklabels=False, fixedrange=False),
        yaxis=dict(range=[rows_shown - 0.5, -0.5], visible=False),
        height=height, margin=MARGIN, font=dict(size=LABEL_PX),
        paper_bgcolor="rgba(0,0,0,0)", plot_bgcolor="rgba(0,0,0,0)",  # the page's theme shows through
        hoverlabel=dict(font=dict(size=15)),
    )


#: below this window width (CSS px) the page lays its columns out one under another and the tree scrolls sideways
#: in a box about ``SCREEN_SIDES_PX`` narrower than the window (page.css's ``max-width: 820px``)
NARROW_SCREEN_PX, SCREEN_SIDES_PX = 820, 64
TITLE_CHAR_PX, SUBTITLE_CHAR_PX = 10.4, 7.6  # widest mean character of the title's 18 px / the subtitle's 13 px font
TITLE_LINE_PX, SUBTITLE_LINE_PX, LEGEND_ROW_PX = 24, 17, 22  # one more line of each, and one legend entry, in px


def fit_to_screen(fig: go.Figure, screen_px: float) -> go.Figure:
    """``fig`` (a ``tree_figure``) with its title and legend laid out to be read whole in the first view of a
    window ``screen_px`` wide (CSS px; 0 = unknown): on a phone the tree keeps its width and scrolls sideways in a
    box ~326 px wide (390 px window), where a one-line title and a horizontal legend of 880 px were cut.  There the
    title and subtitle wrap at the box's width and the legend runs down, one entry a row; the figure grows by the
    lines it gained, so the tree keeps its rows.  A wide or unknown window gets ``fig`` unchanged."""
    if not 0 < screen_px < NARROW_SCREEN_PX:
        return fig
    box = max(200.0, screen_px - SCREEN_SIDES_PX)
    title = fig.layout.title
    head = _wrapped(title.text or "", int(box / TITLE_CHAR_PX))
    sub = _wrapped(title.subtitle.text or "", int(box / SUBTITLE_CHAR_PX))
    entries = sum(t.showlegend is not False and t.name is not None for t in fig.data)
    more_top = TITLE_LINE_PX * (head.count("<br>")) + SUBTITLE_LINE_PX * sub.count("<br>")
    more_bottom = max(0, LEGEND_ROW_PX * entries + 8 - MARGIN["b"])
    fig.update_layout(title=dict(text=head, subtitle=dict(text=sub) if sub else None),
                      legend=dict(orientation="v"),
                      margin=dict(t=MARGIN["t"] + more_top, b=MARGIN["b"] + more_bottom),
                      height=fig.layout.height + more_top + more_bottom)
    return fig


def _wrapped(text: str, chars: int) -> str:
    """``text`` broken into lines of at most ``chars`` characters (at spaces; plotly's ``<br>``), each line kept
    whole where it is longer."""
    return "<br>".join(textwrap.wrap(text, max(12, chars), break_long_words=False, break_on_hyphens=False))


def _stage_nodes(g: nx.DiGraph, stage: str | None) -> set:
    """The nodes drawn at ``stage``: the drafts of the sources shown so far (with what hangs off them),
    then everything; the bonus only at the last stage."""
    if stage is None or stage == "bonus":
        return set(g)
    names = [i.name for i in REGISTRY]
    shown = {i.source for i in REGISTRY[: names.index(stage) + 1]} if stage in names else set(tags())
    keep = {0}
    for u, v in nx.bfs_edges(g, 0):
        d = node(g, v)
        if u in keep and d.kind != "bonus" and (d.source in shown or d.source is None):
            keep.add(v)
    return keep


def _add_edges(fig: go.Figure, drawn: _Drawn, label_ends: tuple[dict, dict], px_per_col: float) -> None:
    """Edges, each from its parent's own label end, level to its column's longest label end, then to the child's
    marker (``label_ends``: per node and per column, in data units right of the marker's centre)."""
    g, pos, visible, walked = drawn.g, drawn.pos, drawn.visible, drawn.walked
    own, ends = label_ends
    groups = {"accepted": ([], []), "other": ([], []), "ghost": ([], [])}
    for u, v in g.edges:
        if u not in visible or v not in visible:
            continue
        dv = node(g, v)
        kind = "ghost" if dv.ghost else ("accepted" if walked and node(g, u).accepted and dv.accepted else "other")
        xs, ys = groups[kind]
        (x0, y0), (x1, y1) = pos[u], pos[v]
        xs += [x0 + own[u], x0 + ends[x0], x1 - (MARKER_PX / 2 + 2) / px_per_col, None]
        ys += [y0, y0, y1, None]
    style = {"accepted": dict(color=ACCEPT_COLOR, width=5), "other": dict(color=EDGE_COLOR, width=1.5),
             "ghost": dict(color=EDGE_COLOR, width=1.5, dash="dot")}
    for kind, (xs, ys) in groups.items():
        fig.add_trace(go.Scatter(x=xs or [None], y=ys or [None], mode="lines", line=style[kind], hoverinfo="skip",
                                 showlegend=False, name=f"{kind} edges"))


#: faded markers: a rejected node's opacity, a ghost's (the page's dark mode raises both in CSS, page/assets/page.css,
#: so that they keep 3:1 contrast on a near-black page)
REJECTED_OPACITY, GHOST_OPACITY = 0.45, 0.25
#: a ghost greedy verification would have accepted: ringed like the accepted path, less faded than other ghosts
WOULD_OPACITY = 0.6
WOULD_LABEL = "ghost that would have been accepted"


def _add_legend_marks(fig: go.Figure, styles: dict, would: bool = False) -> None:
    """Legend-only entries: each drawn source's colour at full strength (``styles``: source -> (colour, label); a node
    trace's own legend mark would take the mean of its nodes' opacities, so a source with many rejected nodes read as
    a faded dot), the folded nodes and the
    bonus token, each in its node trace's legend group (a click hides the group); then what a node's look means."""
    marks = [(color, label, "circle") for color, label in styles.values()]
    for color, label, symbol in (*marks, (GROUP_COLOR, FOLDED_LABEL, "square"),
                                 (BONUS_COLOR, "bonus token", "star")):
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=label, legendgroup=label, hoverinfo="skip",
                                 marker=dict(color=color, size=MARKER_PX, symbol=symbol)))
    for name, marker, line in (
            ("accepted path", dict(color="#6b7280", size=MARKER_PX, line=dict(color=ACCEPT_COLOR, width=3)),
             dict(color=ACCEPT_COLOR, width=5)),
            ("rejected (faded)", dict(color="#6b7280", size=MARKER_PX, opacity=REJECTED_OPACITY),
             dict(color=EDGE_COLOR, width=1.5)),
            ("ghost: pruned by GT, never verified", dict(color="#6b7280", size=MARKER_PX, opacity=GHOST_OPACITY),
             dict(color=EDGE_COLOR, width=1.5, dash="dot")),
            *([(WOULD_LABEL, dict(color="#6b7280", size=MARKER_PX, opacity=WOULD_OPACITY,
                                  line=dict(color=ACCEPT_COLOR, width=3)),
                dict(color=EDGE_COLOR, width=1.5, dash="dot"))] if would else [])):
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines+markers", name=name, marker=marker, line=line,
                                 hoverinfo="skip", legendgroup=name))


def _add_nodes(fig: go.Figure, drawn: _Drawn, keep, color: str, label: str, symbol: str = "circle") -> None:
    """One trace of the nodes ``keep`` selects; folded nodes ("+N", "⋯N") are squares."""
    g, pos, labels, token_text, walked = drawn.g, drawn.pos, drawn.labels, drawn.token_text, drawn.walked
    nodes = [v for v, d in g.nodes(data=NODE) if v in drawn.visible and keep(d)]
    xs, ys, texts, hovers, opacity, lines, symbols = [], [], [], [], [], [], []
    for v in nodes:
        d = node(g, v)
        xs.append(pos[v][0])
        ys.append(pos[v][1])
        texts.append(labels[v])
        hovers.append(_hover(d, token_text, walked))
        opacity.append(1.0 if d.accepted or not walked else
                       (WOULD_OPACITY if d.would else GHOST_OPACITY) if d.ghost else REJECTED_OPACITY)
        lines.append(3 if walked and (d.accepted and d.kind in ("node", "run") or d.would) else 0)
        symbols.append("square" if d.kind in ("group", "run") else symbol)
    fig.add_trace(go.Scatter(
        x=xs or [None], y=ys or [None], mode="markers+text", name=label, legendgroup=label, showlegend=False,
        text=texts, textposition="middle right",
        textfont=dict(size=LABEL_PX, family="DejaVu Sans Mono, Menlo, Consolas, monospace"),
        hovertext=hovers, hoverinfo="text",
        marker=dict(color=color, size=MARKER_PX, symbol=symbols or symbol, opacity=opacity or 1.0,
                    line=dict(color=ACCEPT_COLOR, width=lines or 0)),
    ))


def _hover(d: FigureNode, token_text, walked: bool = True) -> str:
    """A node's hover text: its token, source, depth, scores and what the walk made of it.  Only a node the walk
    reached (the anchor's child, or an accepted node's) says what the model wanted at its place; a node under a
    rejected parent was never compared, and a GT ghost was never verified at all."""
    q = lambda t: visible_token(token_text(t))  # noqa: E731
    if d.kind == "bonus":
        return f"<b>{q(d.token)}</b><br>bonus token: the target's greedy token after the accepted path"
    if d.kind in ("group", "run"):
        members = d.members
        shown = " ".join(q(m.token) for m in members[:12]) + (" …" if len(members) > 12 else "")
        if d.kind == "run":
            src = SOURCE_STYLE[d.source][1] if d.source in SOURCE_STYLE else "draft"
            what = f"{src} tokens in a row, " + ("accepted" if d.accepted else "rejected")
            if d.sides:
                what += f" (and {len(d.sides)} side node{'s' * (len(d.sides) != 1)} hanging off them)"
        else:
            what = "GT-pruned candidates" if d.ghost else "rejected nodes (with their subtrees)"
        return f"<b>{len(members)} {what}</b>, folded to fit the screen<br>{shown}"
    src = SOURCE_STYLE[d.source][1]
    lines = [f"<b>{q(d.token)}</b>", f"source: {src}", f"depth: {d.depth}", f"draft score: {d.score:.3f}",
             f"est. acceptance: {d.est:.3f}"]
    if d.ghost:
        lines.append("status: pruned by GT, never verified")
    elif not walked:
        lines.append("status: not yet verified")
    elif d.accepted:
        lines.append("status: accepted")
    elif d.cut:
        lines.append("status: accepted, but past the cut: EOS or max new tokens ended the output before it")
    elif not d.reached:
        lines.append("status: not reached: its parent was rejected")
    else:
        lines.append("status: rejected" + (f": the model wanted {q(d.wanted)} here" if d.wanted is not None else ""))
    if d.greedy is not None and walked and d.accepted:
        lines.append(f"the model's next token after it: {q(d.greedy)}")
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
