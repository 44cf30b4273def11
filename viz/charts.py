"""Live charts: tokens/s and tau per cycle, with running means."""
from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from engine.decoding.trace import CycleTrace


def cycle_series(traces: Sequence[CycleTrace]) -> dict[str, list[float]]:
    """Per-cycle series (prefill included as cycle 0).

    Keys: ``cycle``; ``tok_per_s`` (tokens / cycle wall time, tokens/s); ``tau`` (tokens committed
    by that forward); ``mean_tok_per_s`` (tokens so far / elapsed s); ``mean_tau`` (tokens so far /
    forwards so far).
    """
    out = {k: [] for k in ("cycle", "tok_per_s", "tau", "mean_tok_per_s", "mean_tau")}
    total = 0
    for k, t in enumerate(traces, 1):
        n = len(t.new_tokens)
        total += n
        out["cycle"].append(t.index)
        out["tok_per_s"].append(n / (t.timings_ms["total"] / 1000) if t.timings_ms["total"] > 0 else 0.0)
        out["tau"].append(float(n))
        out["mean_tok_per_s"].append(total / t.elapsed_s if t.elapsed_s > 0 else 0.0)
        out["mean_tau"].append(total / k)
    return out


def speed_figure(traces: Sequence[CycleTrace]) -> go.Figure:
    """Two stacked panels: tokens/s and tau per cycle (markers) with their running means (lines)."""
    s = cycle_series(traces)
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.12,
                        subplot_titles=("tokens/s", "τ (tokens per forward)"))
    fig.add_trace(go.Scatter(x=s["cycle"], y=s["tok_per_s"], mode="markers", name="tok/s this cycle",
                             marker=dict(size=5, color="#93c5fd")), row=1, col=1)
    fig.add_trace(go.Scatter(x=s["cycle"], y=s["mean_tok_per_s"], mode="lines", name="tok/s running mean",
                             line=dict(color="#1d4ed8", width=2)), row=1, col=1)
    fig.add_trace(go.Bar(x=s["cycle"], y=s["tau"], name="τ this cycle", marker_color="#fcd34d"), row=2, col=1)
    fig.add_trace(go.Scatter(x=s["cycle"], y=s["mean_tau"], mode="lines", name="τ running mean",
                             line=dict(color="#b45309", width=2)), row=2, col=1)
    fig.update_layout(height=420, margin=dict(l=40, r=20, t=40, b=30), uirevision="speed",
                      legend=dict(orientation="h", y=-0.15))
    fig.update_xaxes(title_text="cycle", row=2, col=1)
    return fig


def cost_figure(curve, budget: int | None = None) -> go.Figure:
    """Verification latency vs tree nodes (the GT principle's cost curve) with c(B) on a second axis: the raw
    medians as points (error bars: as wide as their rounds' interquartile range, centred on the median and cut at
    0 ms, when measured; a slow size, verified padded, in its own marker) and the fit GT reads
    (``CostCurve.latency``) as a line, so an outlier and what the fit made of it both show.

    Args:
        curve: ``engine.decoding.cost.CostCurve``.
        budget: node budget B to mark, with its threshold c(B).
    """
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    nodes = list(curve.nodes)
    error = None
    if curve.spread is not None:  # the interquartile range's width, centred on the median, its foot never below 0 ms
        half = [s * m / 2 for s, m in zip(curve.spread, curve.ms)]  # (a busy machine's spread once drew it at -5 ms)
        error = dict(type="data", symmetric=False, array=half, arrayminus=[min(h, m) for h, m in zip(half, curve.ms)],
                     visible=True, thickness=1)
    slow = set(curve.slow)
    fig.add_trace(go.Scatter(x=nodes, y=list(curve.ms), mode="markers", name="measured median", error_y=error,
                             marker=dict(symbol=["x" if n in slow else "circle" for n in nodes], size=7),
                             hovertext=[f"verified as {curve.verify_rows(n)} rows (cheaper)" if n in slow else ""
                                        for n in nodes]), secondary_y=False)
    fig.add_trace(go.Scatter(x=nodes, y=[curve.latency(n) for n in nodes], mode="lines", name="fit GT reads"),
                  secondary_y=False)
    fig.add_trace(go.Scatter(x=list(curve.nodes), y=[curve.threshold(n) for n in curve.nodes], mode="lines",
                             name="c(B)", line=dict(dash="dot")), secondary_y=True)
    if budget:
        fig.add_vline(x=budget, line_dash="dash", line_color="#6b7280",
                      annotation_text=f"B={budget}: c={curve.threshold(budget):.3f}")
    fig.update_layout(height=300, margin=dict(l=40, r=40, t=40, b=30), title="Verification cost curve",
                      legend=dict(orientation="h", y=-0.25))
    fig.update_xaxes(title_text="tree nodes n")
    fig.update_yaxes(title_text="ms per forward", secondary_y=False)
    fig.update_yaxes(title_text="c = marginal node cost / AR step", secondary_y=True)
    return fig


def cost_figure_pending() -> go.Figure:
    """The cost-curve panel before this machine's curve is measured (a cold start measures it once the page is
    up): says so, in the panel's size."""
    fig = go.Figure()
    fig.add_annotation(text="The cost curve is being measured on this machine (once; up to a minute on 2 cores).<br>"
                            "Open the page again, or press Re-measure, to see it.",
                       showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")
    fig.update_layout(height=300, margin=dict(l=40, r=40, t=40, b=30), title="Verification cost curve",
                      xaxis=dict(visible=False), yaxis=dict(visible=False))
    return fig
