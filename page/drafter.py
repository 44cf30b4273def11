"""The method's own drafter settings and the engine flags that serve its drafter: two boxes under the method menu."""
from __future__ import annotations

from dataclasses import replace

import gradio as gr

from engine.decoding.config import ConfigError, DecodeConfig
from engine.product.io.deploy import drafter_text, serving_text
from page.settings import PageSettings

#: Said in the drafter box when the method has no drafter settings of its own.
NO_DRAFTER = "Goose and Iso(k) mix the sources ticked below, AR drafts nothing: pick a single-source method (PLD, an " \
             "engine's drafter, …) to set its own settings here."


def method_fields(settings: PageSettings) -> dict:
    """A method picked: its drafter's settings at their defaults (an engine's drafter under the engine's own names) and
    the engine command that serves it."""
    try:
        text = drafter_text(DecodeConfig.of(method=settings.method))
    except ConfigError:
        text = ""
    return {"drafter": gr.Textbox(value=text, interactive=bool(text), placeholder=NO_DRAFTER),
            **serve_fields(replace(settings, drafter=text))}


def serve_fields(settings: PageSettings) -> dict:
    """The engine command for the settings as they stand, or why it cannot be said (a sentence, the box kept)."""
    try:
        return {"serve": serving_text(settings.to_config())}
    except ConfigError as exc:
        return {"serve": f"# {exc}"}
