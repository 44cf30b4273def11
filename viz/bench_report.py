"""report.html for ``python -m cli.bench``: plotly figures in the spirit of the Goose paper.

Figure 3 (speedup over AR per dataset), Figure 5 (p_s and p_t per dataset), Table 1 (spine tree vs
Iso(3) / Iso(5) τ under the same budget) and where the engine's time goes per stage.
"""
from __future__ import annotations

import html

import plotly.graph_objects as go

from engine.decoding.trace import TIMING_KEYS
from engine.product.runs.run import SPEEDUP_PHASE, SPEEDUP_WORDS


def _datasets(rows: list[dict]) -> list[str]:
    return list(dict.fromkeys(r["dataset"] for r in rows))


def speedup_figure(rows: list[dict]) -> go.Figure:
    fig = go.Figure()
    for m in dict.fromkeys(r["method"] for r in rows):
        mine = [r for r in rows if r["method"] == m]
        ys = [r.get("decode_speedup") for r in mine]
        fig.add_trace(go.Bar(name=m, x=[r["dataset"] for r in mine], y=ys,
                             text=[f"{y:.2f}×" if y is not None else "–" for y in ys], textposition="outside"))
    fig.add_hline(y=1.0, line_dash="dot", line_color="#6b7280")
    fig.update_layout(title=f"Median speedup over AR (same run; {SPEEDUP_WORDS}, as the page measures it)",
                      barmode="group", yaxis_title=f"× AR tok/s ({SPEEDUP_PHASE})")
    return fig


def acceptance_figure(rows: list[dict], method: str = "goose") -> go.Figure:
    mine = [r for r in rows if r["method"] == method and r.get("p_s") is not None]
    fig = go.Figure()
    fig.add_trace(go.Bar(name="p_s (spine)", x=[r["dataset"] for r in mine], y=[r["p_s"] for r in mine]))
    fig.add_trace(go.Bar(name="p_t (TR branch)", x=[r["dataset"] for r in mine], y=[r.get("p_t") or 0 for r in mine]))
    ratios = [f"{r['p_s'] / r['p_t']:.1f}×" if r.get("p_t") else "" for r in mine]
    fig.add_trace(go.Scatter(x=[r["dataset"] for r in mine], y=[max(r["p_s"], r.get("p_t") or 0) * 1.1 for r in mine],
                             text=ratios, mode="text", showlegend=False))
    fig.update_layout(title=f"Acceptance heterogeneity ({method}): p_s vs p_t", barmode="group",
                      yaxis_title="accepted / proposed")
    return fig


def topology_figure(rows: list[dict]) -> go.Figure:
    tau = {(r["method"], r["dataset"]): r.get("tau") for r in rows}
    fig = go.Figure()
    for m, label in (("goose", "Spine (Goose)"), ("iso3", "Iso(3)"), ("iso5", "Iso(5)")):
        xs = [d for d in _datasets(rows) if tau.get((m, d))]
        fig.add_trace(go.Bar(name=label, x=xs, y=[tau[(m, d)] for d in xs]))
    fig.update_layout(title="Spine vs isotropic trees, same budget: τ", barmode="group", yaxis_title="τ")
    return fig


def stage_figure(rows: list[dict]) -> go.Figure:
    methods = [m for m in dict.fromkeys(r["method"] for r in rows)
               if any("stage_ms" in r for r in rows if r["method"] == m)]
    fig = go.Figure()
    for k in TIMING_KEYS:
        ys = [sum(r["stage_ms"][k] for r in rows if r["method"] == m and "stage_ms" in r) for m in methods]
        fig.add_trace(go.Bar(name=k, x=methods, y=ys))
    fig.update_layout(title="Where the engine's time goes (total ms per stage)", barmode="stack", yaxis_title="ms")
    return fig


def report_html(rows: list[dict], meta: dict) -> str:
    """A self-contained HTML page (plotly.js inlined once)."""
    figs = [speedup_figure(rows), acceptance_figure(rows), topology_figure(rows), stage_figure(rows)]
    parts = [f.to_html(full_html=False, include_plotlyjs=(i == 0)) for i, f in enumerate(figs)]
    head = html.escape(f"{meta['model']} · {meta['device']} · {meta['dtype']} · {meta['date']}")
    return ("<!doctype html><html><head><meta charset='utf-8'><title>goose-lens benchmark</title></head>"
            f"<body style='font-family:sans-serif;max-width:1100px;margin:auto'><h1>goose-lens benchmark</h1>"
            f"<p>{head}</p><p><code>{html.escape(meta['command'])}</code></p>" + "".join(parts) + "</body></html>")
