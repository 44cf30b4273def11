"""Sweep: the prompt once per value of one parameter, and a swept run opened in the tree viewer."""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import gradio as gr

from engine.decoding.config import ConfigError
from engine.product.models.registry import ModelRegistry
from engine.product.runs.run import Run, Speedup
from engine.product.runs.sweep.attribution import Attributions
from engine.product.runs.sweep.records import Sweep
from engine.product.runs.sweep.report import markdown_table
from engine.product.runs.sweep.report import summary as sweep_summary
from engine.product.runs.sweep.runner import run_sweep
from engine.product.runs.sweep.spec import PARAMETERS, SweepSpec
from page.contract import Drawing, Session
from page.frames import cycle_views, numbers, problem, run_command, run_output, telling_cycle, token_text
from page.settings import RANGES, PageSettings
from page.setup import set_up
from viz.charts import speed_figure
from viz.explain import cycle_segments
from viz.sweep_figure import sweep_figure

SWEEP_OUT = ("sweep_plot", "sweep_status", "sweep_state", "sweep_open")
SWEEP_CHOICES = [(f"{info.what} ({name})", name) for name, info in PARAMETERS.items()]
#: The values box's suggestion for each parameter, inside the page's ranges (``RANGES``), set as the parameter is
#: picked: B's "4,8,16,32,64,128" stayed for max depth D, whose page range ends at 16 (a browser walk-through).
SWEEP_VALUES = {"budget": "4,8,16,32,64,128", "spine_ratio": "0.25,0.5,0.75,auto", "max_depth": "2,4,8,12,16",
                "gt_threshold": "0,0.05,0.1,auto,chord", "method": "goose,pld,tr,iso3",
                "sources": "pld+tr,pld+tr+ptd,pld+tr+suffix"}


@dataclass(frozen=True)
class SweepOnPage:
    """A visitor's last sweep (``gr.State``) and what opening one of its runs needs: the prompt and its format."""

    sweep: Sweep
    prompt: str
    prompt_format: str


def sweep(settings: PageSettings, sweep_param, sweep_values, session: Session = Session(), *,
          models: ModelRegistry) -> Iterator[dict]:
    """Sweep: the prompt once per value of one parameter (``cli.sweep.run_sweep``: AR timed before and after, every run
    on one cost curve and a fresh source memory), the other settings as on the page.  Streams the figure (τ,
    tokens/s and speedup over AR against the value), a progress bar with the sentence on the texts and the table,
    and the runs to open in the tree viewer (``SWEEP_OUT``).  Stop ends it after the current cycle and keeps the
    runs so far; bad input: one sentence, nothing run."""
    try:
        setup = set_up(settings, session, models)
        spec = SweepSpec.parse(sweep_param or "", sweep_values or "")
        _check_page_range(spec)
    except ConfigError as exc:
        yield problem(str(exc), "sweep_status")
        return
    control, lm, ids, config = setup.control, setup.lm, setup.ids, setup.config
    curve = setup.curve(needed=spec.needs_cost_curve(config)).shown  # every run of the sweep reads this one
    yield {"sweep_status": sweep_board(None, len(spec.values))}
    # a run that parts from AR: a precision tie or a bug, as it arrives (AR replayed on the path the sweep ran)
    attributions = Attributions(lm.model, ids, lm.forward)
    try:
        for snap in run_sweep(lm, ids, config, spec, curve, should_stop=lambda: bool(control.get("stop"))):
            state = SweepOnPage(snap, settings.prompt, settings.format_used(lm))
            found = {} if snap.sampling else attributions.of(snap)
            yield {"sweep_plot": sweep_figure(snap, found), "sweep_status": sweep_board(snap, snap.total, found),
                   "sweep_state": state,
                   "sweep_open": gr.Radio(choices=[(r.label, r.index) for r in snap.runs], value=None)}
    except Exception as exc:  # noqa: BLE001 - keep serving; the user sees why the sweep stopped
        yield problem(f"The sweep stopped: {exc}. The runs so far stay in the table.", "sweep_status")


def sweep_board(snap: Sweep | None, total: int, divergences: dict | None = None) -> str:
    """Markdown: a progress bar (AR and each value one step), the sentence on the texts and the table so far, a run
    that parted from AR attributed (``divergences``: a precision tie or a bug, as the Race says it)."""
    done = 0 if snap is None else round(snap.fraction * (total + 1))
    bar = "▰" * done + "▱" * (total + 1 - done)
    if snap is None:
        return f"{bar} timing AR on this prompt …"
    step = "done" if snap.complete or snap.stopped else f"run {len(snap.runs) + 1} of {total} …"
    return (f"{bar} {step} ({snap.seconds:.1f} s)\n\n{sweep_summary(snap, divergences)}\n\n"
            f"{markdown_table(snap, divergences)}")


def open_sweep_run(sweep_open, sweep_state: SweepOnPage | None, drawing: Drawing = Drawing(), model_key=None, *,
                   models: ModelRegistry) -> dict:
    """A run of the last sweep (``sweep_open``: its index) in the tree viewer: its
    trees, numbers, output and command, as if it had just been generated (``IMPORT_OUT`` less the import box)."""
    if sweep_state is None or sweep_open is None:
        return {}
    found = [r for r in sweep_state.sweep.runs if r.index == int(sweep_open)]
    if not found:
        return {}
    swept, lm = found[0], models.get(model_key)
    curve = sweep_state.sweep.cost_curve
    run = Run(model=lm.name, prompt=sweep_state.prompt, prompt_format=sweep_state.prompt_format,
              config=swept.config.to_dict(), runs=lm.runs.to_dict(),
              cost_curve=curve.spec() if curve is not None else None,
              ar_timing=sweep_state.sweep.ar, shown_curve=curve.spec() if curve is not None else None)
    text = token_text(run, lm)
    for trace in swept.traces:
        run.record(trace, cycle_segments(trace, text))
    last = telling_cycle(run.traces)  # its last tree cycle
    ar = sweep_state.sweep.ar
    frame = {**cycle_views(run, last, lm, drawing), **numbers(run, curve, Speedup.of(run.traces, ar))}
    frame["stats"] = f"Sweep run {swept.label}: " + frame["stats"]
    return {**frame, "output": run_output(run, last.index), "speed_plot": speed_figure(run.traces), "run": run,
            "scrubber": gr.Slider(maximum=max(1, len(run.traces) - 1), value=last.index),
            "command": run_command(run)}


def sweep_values_for(sweep_param: str) -> dict:
    """The values box for a newly picked sweep parameter: its suggestion (``SWEEP_VALUES``); nothing for another."""
    return {"sweep_values": SWEEP_VALUES[sweep_param]} if sweep_param in SWEEP_VALUES else {}


def _check_page_range(spec: SweepSpec) -> None:
    """A swept value outside the range the page's own slider allows (``RANGES``: B up to 128, not the config's
    1024), refused as a typed value would be brought inside.

    Raises:
        ConfigError: one sentence naming the first such value and the page's range.
    """
    if spec.parameter not in RANGES:
        return
    low, high, words = RANGES[spec.parameter]
    for value in spec.values:
        if isinstance(value, (int, float)) and not low <= value <= high:
            raise ConfigError(f"{words} = {value:g} is outside this page's range, {low:g} to {high:g} (its "
                              "slider's): sweep values inside it")
