"""Generate: stream a run's frames while decoding, then the speedup over AR."""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import gradio as gr

from engine.decoding.config import ConfigError
from engine.decoding.cost import CostCurve
from engine.decoding.decode import SpecDecoder
from engine.product.models.loaded import LoadedModel
from engine.product.models.registry import ModelRegistry
from engine.product.models.speeds import RunSpeed
from engine.product.runs.decoder import make_decoder
from engine.product.runs.metrics import summarize
from engine.product.runs.run import MEASURING, ArTiming, Run, Speedup, disagreement
from page.contract import Drawing, Session
from page.frames import (
    ar_key,
    cycle_views,
    cycle_words,
    named,
    numbers,
    paused,
    problem,
    run_command,
    run_output,
    telling_cycle,
    token_text,
)
from page.policy import ArBeside, ar_timing_due, run_speedup
from page.settings import PageSettings
from page.setup import RunSetup, set_up
from viz.charts import speed_figure
from viz.explain import cycle_segments
from viz.lesson import lesson
from viz.tree_figure import ghost_marks

GENERATE_OUT = ("output", "tree_plot", "speed_plot", "stats", "run", "scrubber", "explain", "big", "theory", "command",
                "ar_clock", "lesson", "prompt_format", "notice")
LIGHT_EVERY_S = 1.0  # the output text, numbers and scrubber redraw at most this often while decoding ...
HEAVY_EVERY_S = 2.0  # ... the tree, speed chart, explanation and theory panel at most this often (always at the end,
# and at every cycle in slow motion) ...
FIRST_TREE = f"*The run's first draft tree is drawn {HEAVY_EVERY_S:.0f} s into the run, or at its end.*"
LONG_PROMPT = 256  # prompt tokens from which the page says that it is prefilling (seconds on a CPU)
DRAW_SHARE = 0.03  # ... and each kind of frame takes at most this share of the wall time (its cost, from building
# it to the page taking it, sets its next gap): drawing never holds the engine for long, and is not engine time.
# A browser on the server's own CPU draws at the engine's expense: the gaps above are the ones whose cost to the
# engine was measured smallest (docs/results.md, "The page's engine thread").


class Throttle:
    """When the next frame is drawn while decoding: the run's first frame at once, light (it clears the last run's
    tree, chart and words: a tree drawn there cost a browser on the server's CPU ~5 % of the run's speed, and
    the first tree comes ``HEAVY_EVERY_S`` later); then light frames (text, numbers, scrubber) at most every
    ``LIGHT_EVERY_S``, heavy ones (tree, speed chart, explanation, theory) every ``HEAVY_EVERY_S`` from the run's
    start and always at the last cycle (and every cycle in slow motion, the first included); each kind's gap grows
    so that it takes at most ``DRAW_SHARE`` of wall time."""

    def __init__(self) -> None:
        self.last_heavy = time.perf_counter()  # when each kind was last drawn: the first tree comes a gap after the
        self.last_light = -math.inf  # run's start, the first frame at once (light) ...
        self.light_gap, self.heavy_gap = LIGHT_EVERY_S, HEAVY_EVERY_S  # ... and the wait before the next one

    def due(self, trace, now: float, paced: bool) -> bool | None:
        """True: draw a heavy frame; False: a light one (always the run's first); None: none now."""
        if trace.finished or paced or now - self.last_heavy >= self.heavy_gap:
            return True
        return False if now - self.last_light >= self.light_gap else None

    def drawn(self, heavy: bool, started: float) -> None:
        """A frame begun at ``started`` is on the page now."""
        self.last_light = time.perf_counter()
        if heavy:
            self.last_heavy = self.last_light
            self.heavy_gap = max(HEAVY_EVERY_S, (self.last_light - started) / DRAW_SHARE)
        else:
            self.light_gap = max(LIGHT_EVERY_S, (self.last_light - started) / DRAW_SHARE)


@dataclass(frozen=True)
class LiveRun:
    """A run as ``generate`` draws it: the run recording, its model, how trees are drawn, the command that
    reproduces it, its token texts (id -> text) and the cost curve it read."""

    run: Run
    lm: LoadedModel
    drawing: Drawing
    command: str
    text: Callable[[int], str]
    curve: Any = None
    prompt_tokens: int = 0  # the prompt's length in tokens (the shared curve's refinement reads each cycle's context)
    note: str = ""  # what the notice says while the run streams ("": nothing; ``RAW_NOTE``: the format was changed)


#: The notice of a run whose prompt was asked to go through a chat template the model does not have: the format switch
#: flips back to raw as the run starts, and this says why (a browser walk-through found it flipping unexplained).
RAW_NOTE = "This model has no chat template, so the prompt went in as a raw completion prompt."


def generate(settings: PageSettings, drawing: Drawing = Drawing(), pace: float = 0.0, session: Session = Session(),
             *, models: ModelRegistry) -> Iterator[dict]:
    """Generate: stream frames (``GENERATE_OUT``) while decoding; the last holds the whole ``run``.

    ``pace`` pauses that many seconds after each cycle (slow motion); Stop (``session.control``) ends the
    run after the current cycle and keeps its output; ``session.curve`` is the visitor's own cost curve.
    Drawing is throttled (``Throttle``) and never counted as engine time.  Bad input: one sentence in ``notice``
    (the run on screen keeps its totals).  The prompt format shown is the one the prompt really went through.

    After the run, the speedup beside τ: the run's decode-phase tokens/s over AR's on the same prompt, model,
    dtype and max new tokens (``session.ar_clock``: from an earlier AR timing or race of this visitor), else over
    AR timed step for step beside the run, under the same load (``page.policy.ArBeside``; not part of the
    run's engine time), kept in ``ar_clock``.  The stats line ties τ to the cost curve the run read, and so does the
    lesson, whose table the run's speed joins (``_lesson_after``)."""
    try:
        setup = set_up(settings, session, models)
    except ConfigError as exc:
        yield problem(str(exc))
        return
    control, lm, ids, config = setup.control, setup.lm, setup.ids, setup.config
    try:
        decoder, live = _open(settings, setup, drawing, session)
        run, curve = live.run, live.curve
        if live.note:  # no chat template: the switch says what the prompt got, and the notice why
            yield {"prompt_format": run.prompt_format, "notice": live.note}
        key = ar_key(models, lm, ids, config)
        known = session.ar_timing(key)  # AR's speed on this prompt, when this visitor has it already
        stop = lambda: bool(control.get("stop"))  # noqa: E731
        yield from _prefill_note(len(ids), curve)
        beside = ArBeside(lm, ids, config, curve, stop) if ar_timing_due(config.method, known, False) else None
        traces = decoder.generate(ids, should_stop=stop)
        trace = yield from _stream(live, beside.paced(traces) if beside else traces, pace, control, known)
        if trace is None:  # stopped before the first token (``_stream`` cleared the notice)
            return
        if beside is not None and not stop():
            yield numbers(run, curve, MEASURING)
            known = beside.finish()
        known, speedup = run_speedup(run.traces, config.method, known, stop())
        run.ar_timing = known if speedup.value is not None or speedup.none else None  # exported with the run
        clock = session.with_ar_timing(key, known) if known is not None else session.ar_clock
        note, clock = _beside_last(session, key, speedup, clock) if config.method != "ar" else ("", clock)
        yield {**numbers(run, curve, speedup, note), "run": run, "command": live.command, "ar_clock": clock,
               "lesson": _lesson_after(live, speedup, models, stop())}
    except Exception as exc:  # noqa: BLE001 - keep serving; the user sees why this run stopped
        yield problem(f"Generation stopped: {exc}. What it wrote so far stays on screen.")


def _open(settings: PageSettings, setup: RunSetup, drawing: Drawing, session: Session) -> tuple[SpecDecoder, LiveRun]:
    """A run's decoder, on the run's one choice of cost curve (what the page shows and what GT reads), and the run
    as ``generate`` draws it: its record, its command, its token texts; its notice ``RAW_NOTE`` where ``settings``
    asked for a chat template the model does not have (the prompt then went in raw)."""
    lm = setup.lm
    curve, read = setup.curve()
    decoder = make_decoder(lm, setup.config, lm.eos_token_ids, cost_curve=read, memory=session.memory)
    run = Run(model=lm.name, prompt=settings.prompt, prompt_format=settings.format_used(lm),
              config=decoder.config.to_dict(), runs=lm.runs.to_dict(),
              shown_curve=curve.spec() if curve is not None else None,
              cost_curve=decoder.cost_curve.spec() if decoder.cost_curve is not None else None)
    note = RAW_NOTE if run.prompt_format != settings.prompt_format else ""
    return decoder, LiveRun(run, lm, drawing, run_command(run), token_text(run, lm), curve, len(setup.ids), note)


def _lesson_after(live: LiveRun, speedup: Speedup, models: ModelRegistry, stopped: bool) -> str:
    """The lesson after ``live``'s run: a finished run's tokens/s (end to end, as the big number), τ and ``speedup``
    kept as its model's newest (``models.speeds``), every model's set side by side (``viz.lesson.lesson``)."""
    if not stopped:
        summary = summarize(live.run.traces)
        models.speeds.add(models.key_of(live.lm), live.lm.describe(),
                          RunSpeed(summary.tok_per_s, summary.tau, speedup.value))
    return lesson(live.curve, live.lm.precision, models.speeds.typical())


def _beside_last(session: Session, key, speedup: Speedup, clock) -> tuple[str, dict]:
    """A run's measured speedup set beside the last one measured on its prompt (``disagreement``: one sentence
    where the two differ beyond their margins) and kept in the visitor's ``ar_clock`` (``clock``)."""
    if speedup.value is None:
        return "", clock
    note = disagreement(speedup, "this run", *named(session.measured(key)))
    return note, session.with_measured(key, "Generate", speedup, clock)


def _prefill_note(prompt_tokens: int, curve: CostCurve | None) -> Iterator[dict]:
    """A long prompt's prefill is one forward of seconds on a CPU, before the first frame: the notice says so and how
    long it should take (the first frame clears it).  The estimate reads the cost curve: the prompt in chunks of its
    largest measured size, each at T(that size); attention over a long context costs more, so it is a lower
    bound ("at least")."""
    if prompt_tokens < LONG_PROMPT:
        return
    wait = ""
    if curve is not None:
        rows = curve.nodes[-1]
        seconds = -(-prompt_tokens // rows) * curve.latency(rows) / 1000
        wait = f" (at least {seconds:.0f} s on this device: its cost curve prices {rows} rows at " \
               f"{curve.latency(rows):.0f} ms)" if seconds >= 1 else ""
    yield {"notice": f"Prefilling the prompt: {prompt_tokens:,} tokens in one forward{wait}; the first new token "
                     "and the tree follow it …"}


def _stream(live: LiveRun, traces: Iterator, pace: float, control: dict, known: ArTiming | None):
    """``generate``'s frames while decoding (``traces``, each recorded in ``live.run``), throttled (``Throttle``),
    the last cycle always drawn in full; returns the last trace (None: no cycle).  The speedup shown meanwhile is
    live when this visitor has AR's timing on the prompt (``known``), else says AR is timed beside it.  The
    run's forward times then correct the model's shared cost curve (``CurveOwner.refine``; runs after this one
    read it)."""
    live_speedup = Speedup(None, "AR is timed beside the run") if known is None else None  # else live, below
    throttle, trace, drawn = Throttle(), None, None  # drawn: the last cycle whose tree is on screen
    for trace in traces:
        live.run.record(trace, cycle_segments(trace, live.text))
        started = time.perf_counter()
        heavy = throttle.due(trace, started, bool(pace))
        if heavy is None:
            continue
        drawn = (telling_cycle(live.run.traces) if trace.finished else trace) if heavy else drawn
        yield _frame(live, trace, drawn, heavy, live_speedup or Speedup.of(live.run.traces, known))
        throttle.drawn(heavy, started)
        if pace:
            paused(float(pace), control)
    if trace is not None and drawn is not telling_cycle(live.run.traces):  # the run's last tree cycle drawn in full
        # (not an AR step GT priced every draft out of); the scrubber reaches every cycle
        yield _frame(live, trace, telling_cycle(live.run.traces), True,
                     live_speedup or Speedup.of(live.run.traces, known))
    if trace is None:  # stopped before the first token: nothing to wait for any more
        yield {"notice": live.note}
    live.lm.curves.refine(live.run.traces, live.prompt_tokens)  # the shared curve learns the run's times
    return trace


def _frame(live: LiveRun, trace, drawn, heavy: bool, speedup: Speedup | None = None) -> dict:
    """One streamed frame of ``generate`` at cycle ``trace``: the run's totals so far, and the cycle on screen,
    ``drawn`` (the tree, speed chart and theory only when ``heavy``, where ``drawn`` is ``trace``; None: no tree of
    this run drawn yet, and the last run's tree, chart, theory and sentence cleared).  The scrubber
    and the line under the tree always name the cycle whose tree is on screen, out of the cycles so far, so no
    view runs ahead of the tree between heavy frames."""
    run = live.run
    frame = {"output": run_output(run), "run": run, "command": live.command, "notice": live.note,
             "scrubber": gr.Slider(maximum=max(1, trace.index), value=drawn.index if drawn else 0),
             **numbers(run, live.curve, speedup)}
    if drawn is None:  # no tree of this run on screen yet: the last run's views cleared, none of another run stays
        return {**frame, "tree_plot": None, "speed_plot": None, "theory": "", "explain": FIRST_TREE}
    if heavy:  # the speed chart from the second cycle on: at the first it holds one point, and drawing it costs a
        # browser on the server's CPU more than the tree does (docs/results.md, "The page's engine thread"); cleared
        # meanwhile, so no chart of another run stands beside this run's tree
        chart = speed_figure(run.traces) if trace.index > 1 or trace.finished else None
        return {**frame, **cycle_views(run, drawn, live.lm, live.drawing), "speed_plot": chart}
    marks = ghost_marks(drawn, bool(live.drawing.show_ghosts), bool(live.drawing.show_all))
    return {**frame, "explain": cycle_words(run, drawn, live.text, marks)}
