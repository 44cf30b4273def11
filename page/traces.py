"""Trace files: export the last run as JSON, or replay one with no model run."""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import gradio as gr

from engine.decoding.cost import CostCurve, CostCurveError
from engine.product.io.traces import MAX_BYTES, TraceFormatError
from engine.product.models.registry import ModelRegistry
from engine.product.runs.run import Run, Speedup
from page.contract import Drawing
from page.frames import cycle_views, numbers, problem, run_command, run_output, telling_cycle, token_text
from page.generate import GENERATE_OUT
from page.models import header_text
from viz.charts import speed_figure
from viz.explain import cycle_segments
from viz.frame_text import FORMAT_NAMES

IMPORT_OUT = (*GENERATE_OUT, "import_file", "prompt", "prompt_format", "header")


def export_trace(run: Run | None, model_key=None, *, models: ModelRegistry) -> dict:
    """Write the last run as a versioned JSON trace (docs/trace-schema.md) for download (``export_file``); a run
    still streaming is written as far as it got, said in a toast and in the file's name ("-partial")."""
    if not run or not run.traces:
        gr.Warning("Nothing to export yet: generate (or import) a run first.")
        return {"export_file": None}
    doc = run.to_trace_file(token_text(run, models.get(model_key)))
    partial = not run.traces[-1].finished  # exported while the run streams: say so, in the file's name too
    if partial:
        gr.Info(f"The run is still going: this trace holds its first {len(run.traces) - 1} cycles. Export again when "
                f"it ends for the whole run.")
    stamp = time.strftime('%Y%m%d-%H%M%S') + ("-partial" if partial else "")
    path = Path(tempfile.mkdtemp(prefix="goose-lens-")) / f"goose-lens-trace-{stamp}.json"
    path.write_text(doc, encoding="utf-8")
    return {"export_file": str(path)}


def import_trace(import_file, drawing: Drawing = Drawing(), model_key=None, *, models: ModelRegistry) -> dict:
    """Replay an exported trace with no model run (``IMPORT_OUT``); a bad file gets one sentence in the notice and
    leaves the run on screen as it is.

    Shows everything the page showed of the run when it was exported: its own numbers (every cycle summarised),
    the speedup over AR it was measured with (the file's ``ar_timing``) and τ tied to the cost curve it read (the
    file's ``cost_curve``), its last cycle, its prompt, prompt format and the command that reproduces it; the
    header says an imported run of which model is on screen; clears the import box."""
    if not import_file:
        return {}
    name = Path(import_file).name  # the visitor's own file name (never the server's folder)
    try:
        if os.path.getsize(import_file) > MAX_BYTES:
            raise TraceFormatError(f"the file is larger than {MAX_BYTES // 2**20} MB")
        run = Run.from_trace_file(Path(import_file).read_bytes())
    except OSError:
        return {**problem(f"Could not read {name}: try the upload again. The run on screen stays."),
                "import_file": None}
    except TraceFormatError as exc:
        return {**problem(f"Could not import {name}: {exc}. The run on screen stays."), "import_file": None}
    text = token_text(run, None)
    run.segments = [seg for t in run.traces for seg in cycle_segments(t, text)]
    last = telling_cycle(run.traces)  # its last tree cycle
    speedup = (Speedup.of(run.traces, run.ar_timing) if run.ar_timing is not None else
               Speedup(None, "not measured when the run was exported"))
    frame = {**cycle_views(run, last, None, drawing), **numbers(run, stored_curve(run), speedup)}
    frame["stats"] = f"Imported trace of `{run.model}`, replayed with no model. " + frame["stats"]
    frame["command"] = run_command(run)
    if run.prompt_format in FORMAT_NAMES:
        frame["prompt_format"] = run.prompt_format
    return {**frame, "output": run_output(run, last.index), "speed_plot": speed_figure(run.traces), "run": run,
            "scrubber": gr.Slider(maximum=max(1, len(run.traces) - 1), value=last.index), "import_file": None,
            "prompt": run.prompt, "header": header_text(models.get(model_key), shown=run.model), "notice": ""}


def stored_curve(run: Run):
    """The cost curve the page's cost sentence read for ``run`` (``Run.shown_curve``, else ``Run.cost_curve``), from
    its spec; None without one or when it does not load here."""
    spec = run.shown_curve or run.cost_curve
    try:
        return CostCurve.from_spec(spec) if spec else None  # a spec, never read as a file
    except (CostCurveError, ValueError):
        return None
