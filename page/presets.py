"""The preset prompts (``assets/presets.json``, with their licences): the one the prompt box starts with, and a
picked one's prompt and format."""
from __future__ import annotations

import json
from pathlib import Path

from engine.decoding.config import CALIBRATE_AT
from engine.decoding.cost import CostCurve
from engine.product.models.loading import LoadedModel

PRESETS = json.loads((Path(__file__).resolve().parent.parent / "assets" / "presets.json").read_text(encoding="utf-8"))


#: The preset the page opens with, by what the device's cost curve lets GT keep (measured with
#: ``scripts/speaker_default.py``, the first run at every default; docs/results.md, "A default a speaker can
#: present"): where a tree's first draft row costs at least ``CALIBRATE_AT`` of an AR step (llama.cpp's kernels on a
#: CPU) GT keeps few trees, so the chat preset whose drafts the sources propose in most of the first cycles (GSM8K:
#: 9 of the first 10 on SmolLM2, each drawn with GT's ledger); on a flatter curve the raw code preset whose copies give
#: trees from the first cycle (HumanEval/0: 8 of the first 10 on the demo model, τ 5.25).  Without a measured curve,
#: or a chat template, the first preset of the model's format.
OPENING = {"steep": "GSM8K test #0 Janet's ducks (chat)", "flat": "HumanEval/0 has_close_elements (raw code)"}


def start_preset(lm: LoadedModel, curve: CostCurve | None = None) -> dict:
    """The preset the prompt box starts with, so the first click shows the mechanism: ``OPENING``'s for ``curve``
    (the model's measured one; None: not measured yet) where the model can take it (a model without a chat template
    takes the raw one), else the first chat preset for a model with a chat template, else the first raw preset."""
    want = "chat" if lm.has_chat_template else "raw"
    if curve is not None:
        steep = curve.row_price() >= CALIBRATE_AT
        for label in (OPENING["steep"], OPENING["flat"]) if steep else (OPENING["flat"],):  # raw, where chat is not
            chosen = next((p for p in PRESETS if p["label"] == label), None)
            if chosen is not None and (chosen["format"] == "raw" or lm.has_chat_template):
                return chosen
    return next((p for p in PRESETS if p["format"] == want), PRESETS[0])


def preset_fields(preset) -> dict:
    """A preset's prompt and its format (code: raw completion; chat datasets: chat template)."""
    chosen = next((p for p in PRESETS if p["label"] == preset), None)
    return {"prompt": chosen["prompt"], "prompt_format": chosen["format"]} if chosen else {}
