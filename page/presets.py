"""The preset prompts (``assets/presets.json``, with their licences): the one the prompt box starts with, and a
picked one's prompt and format."""
from __future__ import annotations

import json
from pathlib import Path

from engine.product.models.loaded import LoadedModel

PRESETS = json.loads((Path(__file__).resolve().parent.parent / "assets" / "presets.json").read_text(encoding="utf-8"))


def start_preset(lm: LoadedModel) -> dict:
    """The preset the prompt box starts with, so the first click shows the mechanism: the first chat preset for a
    model with a chat template (GSM8K: on SmolLM2 on llama.cpp's steep curve its sources propose drafts in 9 of the
    first 10 cycles, each drawn with GT's ledger; on a flat curve it verifies trees from the first cycle), else the
    first raw code preset (HumanEval/7: trees from the first cycle on the demo model).  Measured with
    ``scripts/speaker_default.py``: docs/results.md, "A default a speaker can present"."""
    want = "chat" if lm.has_chat_template else "raw"
    return next((p for p in PRESETS if p["format"] == want), PRESETS[0])


def preset_fields(preset) -> dict:
    """A preset's prompt and its format (code: raw completion; chat datasets: chat template)."""
    chosen = next((p for p in PRESETS if p["label"] == preset), None)
    return {"prompt": chosen["prompt"], "prompt_format": chosen["format"]} if chosen else {}
