"""A deployment's acceptance figures beside the same drafter run here: a table in words and a per-position chart."""
from __future__ import annotations

import plotly.graph_objects as go

from engine.product.io.production import Production

DEPLOYED_COLOR = "#6b7280"  # the deployment's bars: grey, apart from every source's colour
HERE_COLOR = "#0072B2"  # this run's bars


def _cell(value, kind: str) -> str:
    if value is None:
        return "not reported"
    return {"tau": f"{value:.2f}", "rate": f"{value:.1%}"}.get(kind, f"{value:,}")


def production_words(deployed: Production, here: Production | None, method: str | None) -> str:
    """The two sets of figures: who is who in one line, then a narrow table (τ, acceptance rate, steps, drafted,
    accepted: it sits in the settings column), what its words mean, and what to run when no run here drafted yet."""
    rows = [("τ", "tau", deployed.tau, here and here.tau),
            ("acceptance rate", "rate", deployed.acceptance_rate, here and here.acceptance_rate),
            ("steps with a draft", "n", deployed.steps, here and here.steps),
            ("draft tokens", "n", deployed.draft_tokens, here and here.draft_tokens),
            ("accepted", "n", deployed.accepted, here and here.accepted)]
    who = f"**Deployment:** {deployed.source} · **here:** " + (f"the last run, {method}" if here else "no run yet")
    table = "| | deployment | here |\n|---|---|---|\n" + "".join(
        f"| {words} | {_cell(a, kind)} | {_cell(b, kind) if here else '—'} |\n" for words, kind, a, b in rows)
    notes = ["τ: tokens per verification step with a draft, the bonus token included; acceptance rate: accepted / "
             "drafted tokens."]
    if deployed.tau_note:
        notes.append(f"The deployment's τ is {deployed.tau_note}.")
    if here is None:
        notes.append("No run here drafted yet: pick the deployment's method (its drafter settings under the method "
                     "menu), press **Generate** on a prompt like the deployment's, then **Compare with the last run**.")
    return f"{who}\n\n{table}\n" + " ".join(notes)


def production_figure(deployed: Production, here: Production | None) -> go.Figure:
    """Acceptance rate by draft position (the share of steps that accepted at least that many draft tokens), the
    deployment's and this run's side by side; a note where the deployment's format gives none."""
    fig = go.Figure()
    for found, name, color in ((deployed, f"deployment ({deployed.source})", DEPLOYED_COLOR),
                               (here, "this run", HERE_COLOR)):
        if found is not None and found.per_position:
            positions = list(range(1, len(found.per_position) + 1))
            fig.add_trace(go.Bar(x=positions, y=list(found.per_position), name=name, marker_color=color,
                                 hovertemplate="position %{x}: %{y:.1%}<extra>" + name + "</extra>"))
    if not deployed.per_position:
        fig.add_annotation(text=f"{deployed.source} gives no acceptance by position", showarrow=False, x=0.5, y=1.08,
                           xref="paper", yref="paper")
    fig.update_layout(barmode="group", height=280, margin=dict(l=50, r=10, t=40, b=40),
                      title="Acceptance by draft position", xaxis_title="draft position",
                      yaxis=dict(title="accepted at least this far", tickformat=".0%", range=[0, 1]),
                      legend=dict(orientation="h", y=-0.3), paper_bgcolor="rgba(0,0,0,0)")
    return fig
