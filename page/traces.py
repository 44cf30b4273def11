"""Trace files: export the last run as JSON, or replay one with no model run."""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import gradio as gr

from engine.product.loading import ModelRegistry
from engine.product.run import Run, Speedup
from engine.product.trace_io import MAX_BYTES, TraceFormatError
from page.contract import Drawing
from page.frames import cycle_views, numbers, problem, run_command, token_text
from page.generate import GENERATE_OUT
from page.models import header_text
from viz.charts import speed_figure
from viz.explain import cycle_segments
from viz.frame_text import FORMAT_NAMES, marked_output

IMPORT_OUT = (*GENERATE_OUT, "import_file", "prompt", "prompt_format", "header")


def export_trace(run: Run | None, model_key=None, *, models: ModelRegistry) -> dict:
    """Write the last run as a versioned JSON trace (docs/trace-schema.md) for download (``export_file``)."""
    if not run or not run.traces:
        gr.Warning("Nothing to export yet: generate (or import) a run first.")
        return {"export_file": None}
    doc = run.to_trace_file(token_text(run, models.get(model_key)))
    path = Path(tempfile.mkdtemp(prefix="goose-lens-")) / f"goose-lens-trace-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(doc, encoding="utf-8")
    return {"export_file": str(path)}


def import_trace(import_file, drawing: Drawing = Drawing(), model_key=None, *, models: ModelRegistry) -> dict:
    """Replay an exported trace with no model run (``IMPORT_OUT``); a bad file leaves the current run as it is.

    Shows the run's own numbers (every cycle summarised), its last cycle, its prompt, prompt format and the
    command that reproduces it (with the cost curve it read, when the file says); the header says an imported
    run of which model is on screen; clears the import box."""
    if not import_file:
        return {}
    try:
        if os.path.getsize(import_file) > MAX_BYTES:
            raise TraceFormatError(f"the file is larger than {MAX_BYTES // 2**20} MB")
        run = Run.from_trace_file(Path(import_file).read_bytes())
    except (OSError, TraceFormatError) as exc:
        return {**problem(f"Could not import the trace: {exc}"), "import_file": None}
    text = token_text(run, None)
    run.segments = [seg for t in run.traces for seg in cycle_segments(t, text)]
    last = run.traces[-1]
    frame = {**cycle_views(run, last, None, drawing),
             **numbers(run, speedup=Speedup(None, "an imported run: AR not timed here"))}
    frame["stats"] = f"Imported trace of `{run.model}`, replayed with no model. " + frame["stats"]
    frame["command"] = run_command(run)
    if run.prompt_format in FORMAT_NAMES:
        frame["prompt_format"] = run.prompt_format
    return {**frame, "output": marked_output(run, last.index), "speed_plot": speed_figure(run.traces), "run": run,
            "scrubber": gr.Slider(maximum=max(1, len(run.traces) - 1), value=last.index), "import_file": None,
            "prompt": run.prompt, "header": header_text(models.get(model_key), shown=run.model)}
