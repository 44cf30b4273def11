"""What the handlers share: the views a frame is made of (the numbers, the cycle on screen), a warning frame, slow
motion's pause, and the command that reproduces a run."""
from __future__ import annotations

import shlex
import time

import gradio as gr

from engine.decoding.config import ConfigError, DecodeConfig
from engine.decoding.cost import CostCurve, CostCurveError
from engine.product.io.options import command_line
from engine.product.models.loaded import LoadedModel
from engine.product.models.registry import ModelRegistry
from engine.product.runs.ledger import cycle_ledger, outputs_after
from engine.product.runs.metrics import summarize
from engine.product.runs.run import Run, Speedup, ar_steps_per_forward
from page.contract import Drawing
from page.settings import PageSettings, bring_inside
from viz.explain import big_numbers, cost_sentence, explain_cycle, theory_panel
from viz.frame_text import cycle_line, marked_output, run_colors, stats_line
from viz.ledger import ledger_panel
from viz.tree_figure import GhostMarks, fit_to_screen, ghost_marks, tree_figure

INITIAL = PageSettings()  # the settings components' initial values


def ar_key(models: ModelRegistry, lm: LoadedModel, ids: list[int], config: DecodeConfig) -> tuple:
    """What an AR timing is kept under: the model (name, device, dtype), the prompt's ids, max new tokens, and
    greedy or sampling (a sampling step costs more)."""
    return (*models.key_of(lm), tuple(ids), int(config.max_new_tokens), bool(config.sampling))


def token_text(run: Run, lm: LoadedModel | None):
    """Token id -> text: an imported run's own table, else the loaded tokenizer."""
    return run.text_of(None if lm is None else lambda i: lm.tokenizer.decode([i]))


def numbers(run: Run, curve=None, speedup: Speedup | None = None, note: str = "") -> dict:
    """The big numbers (τ, the speedup over AR, tokens/s) and the stats line: ``run``'s totals so far, with τ tied
    to ``curve`` (the cost curve the run read; None: no sentence) and ``note`` (why this speedup and the last one
    measured on the prompt differ beyond their margins: ``engine.product.runs.run.disagreement``)."""
    summary = summarize(run.traces)
    steps = ar_steps_per_forward(run.traces, curve)
    cost = cost_sentence(summary.tau, steps, speedup.words() if speedup is not None else None)
    cost = "  \n".join(x for x in (cost, note) if x)
    return {"big": big_numbers(summary, speedup), "stats": stats_line(summary, run, cost)}


def telling_cycle(traces):
    """The cycle a finished run shows first: its last tree cycle (a chain or tree verified, the drafts at work), or
    its last cycle where it had none; the scrubber still reaches every cycle.  The last cycle is often an AR step
    whose drafts GT priced out (on a steep curve most cycles are), which shows the least of what the run did."""
    return next((t for t in reversed(traces) if t.mode in ("tree", "bypass")), traces[-1])


def run_output(run: Run, shown: int | None = None) -> gr.HighlightedText:
    """The output of ``run`` (``shown``: the cycle whose tokens are marked; None: none) with the colours of the
    sources that drafted in it, so its legend lists those and not every source (``viz.frame_text.run_colors``)."""
    value = list(run.segments) if shown is None else marked_output(run, shown)
    return gr.HighlightedText(value=value, color_map=run_colors(run))


def named(measured) -> tuple[Speedup | None, str]:
    """``Session.measured``'s (what measured it, the speedup) as ``disagreement``'s (then, then_name): "the last
    Generate", "the last race"; (None, "") where nothing was measured yet."""
    if measured is None:
        return None, ""
    name, speedup = measured
    return speedup, {"Generate": "the last Generate", "the Race": "the last race"}.get(name, name)


def cycle_views(run: Run, trace, lm: LoadedModel | None, drawing: Drawing = Drawing()) -> dict:
    """What describes the cycle on screen: its tree, its line and sentence (``explain``, GT's ledger of the cycle
    among them) and the theory panel (the run's measured rates beside the bound for this cycle's shape, then the
    run's ledger: ``viz.ledger``)."""
    text = token_text(run, lm)
    theory = theory_panel(summarize(run.traces), trace, int(run.config.get("budget", INITIAL.budget)),
                          int(run.config.get("max_depth", INITIAL.max_depth)), run.traces)
    ledger = ledger_panel(run.traces, run_curve(run), sampled(run), drawing.price_curve)
    figure = tree_figure(trace, text, show_ghosts=bool(drawing.show_ghosts), show_all=bool(drawing.show_all))
    return {"tree_plot": fit_to_screen(figure, float(drawing.screen_px or 0)),
            "explain": cycle_words(run, trace, text, ghost_marks(trace, bool(drawing.show_ghosts),
                                                                  bool(drawing.show_all))),
            "theory": "\n\n".join(x for x in (theory, ledger) if x)}


def cycle_words(run: Run, trace, text, marks: GhostMarks | None = None) -> str:
    """The line and sentence under the tree for cycle ``trace`` of ``run`` ("Cycle k of N": N the run's cycles so
    far); ``text``: token id -> text; ``marks``: where the tree drawn has the cycle's ghosts.  The sentence reads
    GT's ledger of the cycle on the curve the run read (``engine.product.runs.ledger``), with the output's verdict
    on its pruned drafts once a greedy run is done."""
    traces = run.traces
    after = None
    if traces and traces[-1].finished and not sampled(run) and 0 <= trace.index < len(traces):
        after = outputs_after(traces)[trace.index]
    books = cycle_ledger(trace, run_curve(run), after)
    return f"{cycle_line(trace, run, marks)} — {explain_cycle(trace, text, marks, books)}"


def run_curve(run: Run):
    """The cost curve ``run``'s GT read (or the page's cost sentence did), parsed from its spec (never read as a file:
    an imported trace's string names no path of this machine); None where it records none or it does not parse."""
    spec = run.cost_curve or run.shown_curve
    try:
        return CostCurve.from_spec(spec) if spec else None
    except (CostCurveError, ValueError):
        return None


def sampled(run: Run) -> bool:
    """Whether ``run`` sampled (temperature > 0): its output then judges no draft it did not verify."""
    return float(run.config.get("temperature") or 0.0) > 0.0


def paused(seconds: float, control: dict) -> None:
    """Sleep ``seconds`` (slow motion), waking early when Stop is pressed."""
    end = time.perf_counter() + seconds
    while not control.get("stop") and time.perf_counter() < end:
        time.sleep(min(0.05, max(0.0, end - time.perf_counter())))


def problem(message: str, where: str = "notice") -> dict:
    """A frame that tells the visitor what is wrong (and a toast) in ``where``, a place of its own (by default the
    notice under Generate): nothing else changes, so the run on screen keeps its totals."""
    message = message[:1].upper() + message[1:]  # DecodeConfig's messages start in lower case
    gr.Warning(message)
    return {where: f"⚠ {message}"}


#: The page's own numbers, not a run's settings: each slider's range and its name for people, kept in range as
#: ``RANGES``' are (``keep_in_range``)
VIEW_RANGES = {"pace": (0.0, 2.0, "slow motion (s pause per cycle)"),
               "race_seconds": (0, 60, "race length on screen (s)")}


def keep_in_range(value, *, name: str, cap: int | None = None) -> float | None:
    """A number typed into a settings box (``name``, a ``RANGES`` or ``VIEW_RANGES`` field) outside the page's range
    (``cap``: the page's max new tokens), or a fraction where a whole number belongs: the nearest allowed value,
    which goes back into the box at once, with a sentence saying so in a toast (not gradio's red "Error" toast,
    after which the box kept the typed number while its slider showed the bound); None when it is allowed."""
    if value is None:
        return None
    if name in VIEW_RANGES:
        inside, note = bring_inside(value, *VIEW_RANGES[name])
        notes = [note] if note else []
    else:
        settings, notes = PageSettings(auto_r=False, auto_c=False, **{name: value}).clamped(cap)
        inside = getattr(settings, name)
    for note in notes:
        gr.Warning(note)
    return inside if notes else None


def or_skip(value):
    """``value``, or gradio's "leave the component as it is" for None."""
    return gr.skip() if value is None else value


def run_command(run: Run) -> str:
    """The command that reproduces ``run`` (``engine.product.io.options.command_line``): its config, prompt format, the
    prompt itself (so it needs no other file) and the cost curve it read; or why its settings do not make a
    config here (a trace from another version)."""
    try:
        curve = CostCurve.from_spec(run.cost_curve) if run.cost_curve else None  # a spec, never read as a file
        command = command_line(run.decode_config(), model=run.model, prompt_format=run.prompt_format or "auto",
                               cost_curve=curve, prompt=run.prompt)
    except (ConfigError, CostCurveError, TypeError, ValueError) as exc:
        return f"(the trace's settings do not make a valid config here: {exc})"
    return with_what_ran(command, run)


def with_what_ran(command: str, run: Run) -> str:
    """``command`` with the precision and forward path that ran ``run`` after its ``--model`` (``Run.runs``): the
    dtype asked ("auto" where the GGUF file's own weights ran on llama.cpp's kernels: only "auto" picks them) and the
    path; ``command`` as it is for a run that does not say (an older trace)."""
    if not run.runs:
        return command
    model = f"--model {shlex.quote(run.model)}"
    dtype = "auto" if run.runs["weights"] == "gguf" else run.runs["dtype"]
    return command.replace(model, f"{model} --dtype {shlex.quote(dtype)} --forward "
                                  f"{shlex.quote(run.runs['forward_path'])}", 1)

