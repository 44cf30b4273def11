"""The recorded cycles: the scrubber and its buttons, a click on an output token, step-through, Stop."""
from __future__ import annotations

from collections.abc import Iterator

from engine.product.models.registry import ModelRegistry
from engine.product.runs.run import Run
from page.contract import Drawing, Session
from page.frames import cycle_views, paused, token_text
from viz.frame_text import marked_output
from viz.lesson import stage_sentence, stages_of
from viz.tree_figure import fit_to_screen, tree_figure

STEP_PAUSE_S = 2.5  # step-through: seconds each stage of a cycle stays on screen
CYCLE_OUT = ("scrubber", "tree_plot", "explain", "theory", "output")


def show_cycle(run: Run | None, scrubber, drawing: Drawing = Drawing(), model_key=None, step: int = 0, *,
               models: ModelRegistry) -> dict:
    """Scrubber: recorded cycle ``scrubber + step`` (clamped): its tree, line and sentence, the theory panel's
    bound for its shape, and the output with its tokens marked (``CYCLE_OUT``).  The big numbers and the stats
    line stay: they are the run's totals and say so."""
    if not run or not run.traces:
        return {"explain": "Generate first: the scrubber steps through the cycles of the last run."}
    last = len(run.traces) - 1
    asked = _cycle_number(scrubber) + int(step)
    k = max(0, min(asked, last))
    views = cycle_views(run, run.traces[k], models.get(model_key), drawing)
    if asked != k and not step:  # a typed number out of range: the nearest cycle, and a sentence that says so
        views["explain"] = (f"There is no cycle {asked}: the cycles run from 0 to {last}, so cycle {k} is shown.  \n"
                            f"{views['explain']}")
    # the box is set only for a button's step: setting it on every keystroke wrote "4" back over a "45" still being
    # typed, and a clamp wrote the last cycle over a "99" on its way to "99999" (issue 56); a number out of range
    # stays in the box while it is typed, and the slider's own blur (or Enter, page/assets/scrubber_keys.js) brings
    # it inside
    box = {"scrubber": k} if step else {}
    return {**box, **views, "output": marked_output(run, k)}


def _cycle_number(value) -> int:
    """The scrubber's raw value (its events skip gradio's bounds check, so a typed 999 is clamped here instead of
    failing the event and blanking the tree) as a whole number; anything unreadable is cycle 0."""
    try:
        return round(float(value or 0))
    except (TypeError, ValueError, OverflowError):
        return 0


def step_through(run: Run | None, scrubber, drawing: Drawing = Drawing(), session: Session = Session(), *,
                 models: ModelRegistry, pause: float = STEP_PAUSE_S) -> Iterator[dict]:
    """Play one cycle in stages (``viz.lesson``): the drafts by source, the one forward that scores them, the
    walk, the bonus.  Streams the cycle, its tree and sentence, and at the end the output with the cycle's
    tokens marked.  The cycle is the scrubber's, or the first drafted cycle after it when it had no drafts
    (prefill, AR step)."""
    if not run or not run.traces:
        yield {"explain": "Generate first: then **Step through** plays one of its cycles in stages."}
        return
    control = session.start()
    traces = run.traces
    k = max(0, min(_cycle_number(scrubber), len(traces) - 1))
    drafted = [t.index for t in traces if t.mode in ("tree", "bypass")]
    if traces[k].mode not in ("tree", "bypass") and drafted:
        k = next((i for i in drafted if i >= k), drafted[-1])
    trace, text = traces[k], token_text(run, models.get(session.model_key))
    for stage in stages_of(trace):
        if control.get("stop"):
            return
        frame = {"scrubber": k, "explain": stage_sentence(trace, stage, text),
                 "tree_plot": fit_to_screen(tree_figure(trace, text, show_ghosts=bool(drawing.show_ghosts),
                                                        stage=stage, show_all=bool(drawing.show_all)),
                                            float(drawing.screen_px or 0))}
        if stage == "bonus":
            yield {**frame, "output": marked_output(run, k)}
            return
        yield frame
        paused(pause, control)


def jump_to_token(run: Run | None, index, drawing: Drawing = Drawing(), model_key=None, *,
                  models: ModelRegistry) -> dict:
    """Clicking output token ``index`` shows the cycle that produced it (``CYCLE_OUT``)."""
    if not run or not isinstance(index, int) or not 0 <= index < len(run.token_cycles):
        return {}
    k = run.token_cycles[index]
    return {"scrubber": k, **show_cycle(run, k, drawing, model_key, models=models)}  # the scrubber moves there


def request_stop(control: dict) -> None:
    """Stop: the visitor's running Generate, Race or step-through ends after its current cycle and keeps
    what it has (no error, both race outputs kept)."""
    control["stop"] = True
