"""The parameter sweep's figure (``cli/sweep.py``): τ, tokens/s and speedup over AR against the swept value.

Three stacked panels share a categorical x axis, the values in the order the sweep ran them.  Every point
carries ``customdata`` = its run's index (``SweepRun.index``), so a click can open that run.  A run whose text
parted from AR's is drawn as a red cross where that is a bug or not attributed yet, an amber diamond where it is a
precision tie (``sweep_runs.Attributions``); a run a stop cut short as an open circle.
"""
from __future__ import annotations

import html

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from engine.product.runs.lossless import Divergence
from engine.product.runs.run import SPEEDUP_PHASE
from engine.product.runs.sweep.records import Sweep, SweepRun
from engine.product.runs.sweep.report import markdown_table, same_text_cell, speedup_cell, summary

LINE = "#1d4ed8"  # the runs
PARTED = "#dc2626"  # a run whose text parted from AR's: a bug, or not attributed yet
TIE = "#d97706"  # a run whose text parted from AR's at a precision tie
REFERENCE = "#6b7280"  # AR's tokens/s and speedup 1.0
PANELS = ("τ (tokens per verification forward)", f"tokens/s ({SPEEDUP_PHASE})", f"speedup over AR ({SPEEDUP_PHASE})")


def _hover(run: SweepRun, sampling: bool, divergences: dict[int, Divergence]) -> str:
    return (f"<b>{html.escape(run.label)}</b><br>τ {run.tau:.2f} · {run.tok_per_s:.1f} tok/s (decode phase) · "
            f"{speedup_cell(run)} over AR ({SPEEDUP_PHASE})<br>"
            f"{run.mean_nodes:.1f} nodes per forward · {run.cycles} forwards<br>"
            f"same text as AR: {html.escape(same_text_cell(run, sampling, divergences))}")


def _marker(run: SweepRun, divergences: dict[int, Divergence]) -> tuple[str, str]:
    """(symbol, colour) of a run's points: see the module docstring."""
    if run.first_difference is None:
        return ("circle" if run.finished else "circle-open"), LINE
    found = divergences.get(run.index)
    return ("diamond", TIE) if found is not None and found.kind == "precision tie" else ("x", PARTED)


def sweep_figure(sweep: Sweep, divergences: dict[int, Divergence] | None = None) -> go.Figure:
    """τ, decode-phase tokens/s and speedup over AR per value of ``sweep`` (one panel each, x = the values as
    written, in the sweep's order); AR's tokens/s dotted, speedup 1.0 dashed; a run that parted from AR marked as
    ``divergences`` (``sweep_runs.Attributions``) attributes it.  The title names only the parameter, the number of
    values and the prompt count (no model, device or path)."""
    runs, spec, divergences = sweep.runs, sweep.spec, divergences or {}
    xs = [spec.text(v) for v in spec.values]  # every value, run or not: the axis keeps the sweep's order
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.08, subplot_titles=PANELS)
    symbols, colors = zip(*(_marker(r, divergences) for r in runs)) if runs else ((), ())
    symbols, colors = list(symbols), list(colors)
    hover = [_hover(r, sweep.sampling, divergences) for r in runs]
    for row, (name, ys) in enumerate((("τ", [r.tau for r in runs]), ("tok/s", [r.tok_per_s for r in runs]),
                                      ("speedup", [r.speedup for r in runs])), start=1):
        fig.add_trace(go.Scatter(x=[r.text for r in runs], y=ys, mode="lines+markers", name=name,
                                 customdata=[r.index for r in runs], hovertext=hover,
                                 hovertemplate="%{hovertext}<extra></extra>", line=dict(color=LINE, width=2),
                                 marker=dict(size=10, symbol=symbols, color=colors, line=dict(width=2, color=colors)),
                                 showlegend=False), row=row, col=1)
    if sweep.ar is not None and sweep.ar.tok_per_s:
        fig.add_hline(y=sweep.ar.tok_per_s, line_dash="dot", line_color=REFERENCE, row=2, col=1,
                      annotation_text=f"AR {sweep.ar.tok_per_s:.0f} tok/s", annotation_position="bottom right")
    fig.add_hline(y=1.0, line_dash="dash", line_color=REFERENCE, row=3, col=1, annotation_text="AR",
                  annotation_position="bottom right")
    values = f"{sweep.total} value{'s' * (sweep.total != 1)}"
    fig.update_layout(title=f"Sweep of {spec.info.what}: {values}, 1 prompt", height=620,
                      margin=dict(l=50, r=20, t=70, b=50), hovermode="closest", uirevision="sweep")
    fig.update_xaxes(type="category", categoryorder="array", categoryarray=xs)
    fig.update_xaxes(title_text=spec.info.what, row=3, col=1)
    fig.update_yaxes(rangemode="tozero", row=1, col=1)
    fig.update_yaxes(rangemode="tozero", row=2, col=1)
    fig.update_yaxes(rangemode="tozero", ticksuffix="×", row=3, col=1)
    return fig


def sweep_html(sweep: Sweep, meta: dict) -> str:
    """sweep.html for ``python -m cli.sweep``: a self-contained page (plotly.js inlined) with the run's facts
    (``meta``: model name, device, dtype, prompt, date, command; never a path), the sentence, the table and
    the figure."""
    fig = sweep_figure(sweep).to_html(full_html=False, include_plotlyjs=True)
    head = html.escape(f"{meta['model']} · {meta['device']} · {meta['dtype']} · {meta['prompt']} "
                       f"({meta['prompt_tokens']} prompt tokens, {meta['max_new_tokens']} new) · {meta['date']}")
    return ("<!doctype html><html><head><meta charset='utf-8'><title>goose-lens sweep</title></head>"
            "<body style='font-family:sans-serif;max-width:1100px;margin:auto'>"
            f"<h1>Sweep of {html.escape(sweep.spec.info.what)}</h1><p>{head}</p>"
            f"<p><code>{html.escape(meta['command'])}</code></p><p><b>{html.escape(summary(sweep))}</b></p>"
            f"{_table(sweep)}{fig}</body></html>")


def _table(sweep: Sweep) -> str:
    """``markdown_table`` as an HTML table (the same cells)."""
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in markdown_table(sweep).splitlines()]
    head, body = rows[0], rows[2:]  # rows[1] is markdown's |---| line
    cell = "padding:2px 10px;border-bottom:1px solid #e5e7eb;text-align:{}"
    out = "".join(f"<th style='{cell.format('left')}'>{html.escape(c)}</th>" for c in head)
    for row in body:
        out += "</tr><tr>" + "".join(f"<td style='{cell.format('left' if i in (0, 5) else 'right')}'>"
                                     f"{html.escape(c)}</td>" for i, c in enumerate(row))
    return f"<table style='border-collapse:collapse'><tr>{out}</tr></table>"
