"""Draft-tree figure of one decoding cycle (plotly + networkx).

Layout: a layered tidy tree, depth on the x axis; children in walk-priority then rank order; each
leaf gets its own row and a parent sits at the mean of its children's rows, so edges never cross.
Nodes are coloured by source; the accepted path is drawn thick, rejected nodes faded, GT-pruned
candidates as ghosts, and the bonus token as a star after the last accepted node.
"""
from __future__ import annotations

import html
from typing import Callable

import networkx as nx
import plotly.graph_objects as go

from engine.trace import CycleTrace
from engine.tree import WALK_PRIORITY, Source

#: Node colours by source; the legend always names all three draft sources.
SOURCE_STYLE = {
    Source.ROOT: ("#6b7280", "anchor"),
    Source.PLD: ("#2563eb", "PLD spine"),
    Source.TR: ("#f59e0b", "TR branch"),
    Source.PTD: ("#10b981", "PTD perturbation"),
}
BONUS_COLOR = "#dc2626"
ACCEPT_COLOR = "#111827"


def visible_token(text: str, limit: int = 24) -> str:
    """Escape a token for hover/labels with whitespace made visible (space ␣, newline ↵, tab →)."""
    text = text.replace(" ", "␣").replace("\n", "↵").replace("\t", "→").replace("\r", "␍")
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return html.escape(text, quote=False)  # plotly decodes &lt; &gt; &amp; but shows &quot; literally


def tree_graph(trace: CycleTrace) -> nx.DiGraph:
    """DiGraph of the cycle: verified nodes (int ids), ghosts ('g<i>') and the bonus node ('bonus')."""
    tree, on_path = trace.tree, {0, *trace.accepted}
    g = nx.DiGraph()
    for i in range(len(tree)):
        g.add_node(i, kind="node", token=tree.tokens[i], source=tree.sources[i], depth=tree.depths[i],
                   score=tree.scores[i], est=tree.est_accept[i], greedy=trace.greedy[i], accepted=i in on_path,
                   rank=(WALK_PRIORITY.index(tree.sources[i]) if i else 0, i))
        if i:
            g.add_edge(tree.parents[i], i)
    for k, ghost in enumerate(trace.ghosts):
        g.add_node(f"g{k}", kind="ghost", token=ghost.token, source=ghost.source, depth=tree.depths[ghost.parent] + 1,
                   score=ghost.score, est=ghost.est_accept, greedy=None, accepted=False, rank=(9, 10_000 + k))
        g.add_edge(ghost.parent, f"g{k}")
    last = trace.accepted[-1] if trace.accepted else 0
    g.add_node("bonus", kind="bonus", token=trace.bonus, source=None, depth=tree.depths[last] + 1, score=None,
               est=None, greedy=None, accepted=True, rank=(-1, -1))
    g.add_edge(last, "bonus")
    return g


def tidy_layout(g: nx.DiGraph, root=0) -> dict:
    """{node: (depth, row)}: leaves take consecutive rows in DFS order, parents the mean of their children."""
    pos, next_row = {}, [0]

    def place(v) -> float:
        kids = sorted(g.successors(v), key=lambda c: g.nodes[c]["rank"])
        if not kids:
            row = float(next_row[0])
            next_row[0] += 1
        else:
            row = sum(place(c) for c in kids) / len(kids)
        pos[v] = (g.nodes[v]["depth"], row)
        return row

    place(root)
    return pos


def tree_figure(trace: CycleTrace, token_text: Callable[[int], str], show_ghosts: bool = True,
                title: str | None = None) -> go.Figure:
    """Plotly figure of ``trace``'s draft tree.

    Args:
        trace: one cycle from ``SpecDecoder.generate``.
        token_text: id -> display text (e.g. ``lambda i: tokenizer.decode([i])``).
        show_ghosts: draw GT-pruned candidates as faint ghosts.
        title: figure title (default: cycle number, mode, tokens committed).
    """
    g = tree_graph(trace)
    if not show_ghosts:
        g.remove_nodes_from([v for v, d in g.nodes(data=True) if d["kind"] == "ghost"])
    pos = tidy_layout(g)
    fig = go.Figure()
    _add_edges(fig, g, pos)
    for src, (color, label) in SOURCE_STYLE.items():
        _add_nodes(fig, g, pos, token_text, lambda d, s=src: d["kind"] != "bonus" and d["source"] is s, color, label)
    _add_nodes(fig, g, pos, token_text, lambda d: d["kind"] == "bonus", BONUS_COLOR, "bonus token", symbol="star")
    n_rows = max((y for _, y in pos.values()), default=0) + 1
    fig.update_layout(
        title=title or f"cycle {trace.index} · {trace.mode} · {len(trace.tree)} nodes · "
                       f"{len(trace.new_tokens)} tokens ({trace.path_category})",
        uirevision="draft-tree",  # keep the user's zoom / pan across cycles
        showlegend=True, legend=dict(orientation="h", x=0, y=1.0, yanchor="bottom"),
        xaxis=dict(title="depth", dtick=1, zeroline=False),
        yaxis=dict(visible=False, autorange="reversed"),
        title_y=0.98, height=max(380, min(900, 28 * n_rows + 180)), margin=dict(l=20, r=20, t=90, b=40),
        plot_bgcolor="rgba(0,0,0,0)",
    )
    return fig


def _add_edges(fig: go.Figure, g: nx.DiGraph, pos: dict) -> None:
    groups = {"accepted": ([], []), "other": ([], []), "ghost": ([], [])}
    for u, v in g.edges:
        kind = "ghost" if g.nodes[v]["kind"] == "ghost" else (
            "accepted" if g.nodes[u]["accepted"] and g.nodes[v]["accepted"] else "other")
        xs, ys = groups[kind]
        xs += [pos[u][0], pos[v][0], None]
        ys += [pos[u][1], pos[v][1], None]
    style = {"accepted": dict(color=ACCEPT_COLOR, width=4), "other": dict(color="#9ca3af", width=1),
             "ghost": dict(color="#d1d5db", width=1, dash="dot")}
    for kind, (xs, ys) in groups.items():
        fig.add_trace(go.Scatter(x=xs or [None], y=ys or [None], mode="lines", line=style[kind], hoverinfo="skip",
                                 showlegend=kind == "accepted", name="accepted path" if kind == "accepted" else kind))


def _add_nodes(fig: go.Figure, g: nx.DiGraph, pos: dict, token_text, keep, color: str, label: str,
               symbol: str = "circle") -> None:
    nodes = [v for v, d in g.nodes(data=True) if keep(d)]
    xs, ys, texts, hovers, opacity, lines = [], [], [], [], [], []
    for v in nodes:
        d = g.nodes[v]
        tok = visible_token(token_text(d["token"]))
        xs.append(pos[v][0])
        ys.append(pos[v][1])
        texts.append(visible_token(token_text(d["token"]), 10))
        hovers.append(_hover(d, tok, token_text))
        opacity.append(1.0 if d["accepted"] else (0.2 if d["kind"] == "ghost" else 0.45))
        lines.append(3 if d["accepted"] and d["kind"] == "node" else 0)
    fig.add_trace(go.Scatter(
        x=xs or [None], y=ys or [None], mode="markers+text", name=label, text=texts, textposition="middle right",
        hovertext=hovers, hoverinfo="text",
        marker=dict(color=color, size=16, symbol=symbol, opacity=opacity or 1.0,
                    line=dict(color=ACCEPT_COLOR, width=lines or 0)),
    ))


def _hover(d: dict, tok: str, token_text) -> str:
    if d["kind"] == "bonus":
        return f"<b>{tok}</b><br>bonus token: the target's greedy token after the accepted path"
    src = SOURCE_STYLE[d["source"]][1]
    status = "ghost (removed by GT threshold c)" if d["kind"] == "ghost" else (
        "accepted" if d["accepted"] else "rejected")
    lines = [f"<b>{tok}</b>", f"source: {src}", f"depth: {d['depth']}", f"draft score: {d['score']:.3f}",
             f"est. acceptance: {d['est']:.3f}", f"status: {status}"]
    if d["greedy"] is not None:
        lines.append(f"target's greedy next token here: {visible_token(token_text(d['greedy']))}")
    return "<br>".join(lines)
