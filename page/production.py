"""The production section: a deployment's acceptance figures (vLLM, SGLang, llama.cpp), beside the last run here."""
from __future__ import annotations

import os
from pathlib import Path

from engine.product.io.production import ProductionError, from_traces, read_production
from page.frames import problem
from viz.frame_text import METHOD_LABELS
from viz.production import production_figure, production_words

PRODUCTION_OUT = ("production", "production_summary", "production_chart", "production_notice", "import_production")
MAX_BYTES = 8 * 2**20  # a /metrics scrape or a few hundred responses


def import_production(import_production, run=None) -> dict:
    """Read an uploaded file of a deployment's figures and show them beside the last run; a file of another kind gets
    one sentence in the section, and what was on screen stays."""
    if not import_production:
        return {}
    name = Path(import_production).name  # the visitor's own file name, never the server's folder
    try:
        if os.path.getsize(import_production) > MAX_BYTES:
            raise ProductionError(f"the file is larger than {MAX_BYTES // 2**20} MB.")
        found = read_production(Path(import_production).read_text(encoding="utf-8-sig"))
    except (OSError, UnicodeDecodeError):
        return {**problem(f"Could not import {name}: it is not a text file. What was on screen stays.",
                          "production_notice"), "import_production": None}
    except ProductionError as exc:
        return {**problem(f"Could not import {name}: {exc} What was on screen stays.", "production_notice"),
                "import_production": None}
    return {"production": found, **compare_production(found, run), "production_notice": "", "import_production": None}


def compare_production(production, run=None) -> dict:
    """The imported figures beside the last run's (``Run``; None: no run yet); errors go to the section's notice, so
    the figures on screen stay."""
    if production is None:
        return problem("Import a deployment's figures first.", "production_notice")
    method = (run.config.get("method") if run is not None else None) or ""
    here = from_traces(run.traces, "this run") if run is not None else None
    label = METHOD_LABELS.get(method, method)
    return {"production_summary": production_words(production, here, label),
            "production_chart": production_figure(production, here), "production_notice": ""}
