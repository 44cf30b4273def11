"""The page's CSS and JavaScript, kept as files in ``page/assets`` and read from there (beside this module)."""
from __future__ import annotations

from pathlib import Path

ASSETS = Path(__file__).resolve().parent / "assets"


def asset(name: str) -> str:
    """The text of ``page/assets/<name>``, surrounding blank lines dropped."""
    return (ASSETS / name).read_text(encoding="utf-8").strip()


CSS = asset("page.css") + "\n"
TOGGLE_DARK = asset("toggle_dark.js")
#: a click on a point of the sweep figure opens its run: each point's customdata is its run's place in the sweep
#: (``cli.sweep.SweepRun.index``), which is also its place in the "Open a run" radio, so the click picks that
#: choice as a user would (the radio's own event opens the run).  Plotly's click event lives on the figure's div,
#: which gradio replaces when a new figure comes, so the binding is re-checked every 0.4 s (a flag on the div's
#: event hub, which a replot drops with its listeners).
SWEEP_POINT_CLICKS = asset("sweep_point_clicks.js")
#: Enter in the scrubber's number box ends the typing as leaving the box does: gradio's slider then brings a number
#: out of range inside (the handler leaves a typed number alone, so it never rewrites a number still being typed)
SCRUBBER_KEYS = asset("scrubber_keys.js")
#: a phone's tree scrolls sideways (880 px in a 326 px box): its title and legend (plotly's info layer) move with the
#: scroll so they stay in the box, and the box knows when it is scrolled to its end (its cue that it scrolls goes)
TREE_SCROLL = asset("tree_scroll.js")
#: full screen: the tree's block fills the screen and its figure, kept at its page size, is scaled up to fill it
#: (labels grow with it; a new cycle's figure keeps the scale)
FULLSCREEN = asset("fullscreen.js")
