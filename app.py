"""goose-lens: a Gradio page that streams speculative decoding and draws every cycle's draft tree.

    python app.py [--model smollm2|demo|ID|PATH] [--device auto|cpu|cuda] [--dtype auto|fp32|fp16|bf16|q4]
                  [--host 127.0.0.1] [--port 7860] [--share] [--public]

This file only wires the engine (``engine/``) to the figures (``viz/``); it holds no algorithm (the race's
scheduler is ``engine/product/race.py``, the inputs' checks ``engine/product/page_settings.py``, the run's record
``engine/product/run.py``).  The contract between the page and its handlers:

* a handler's parameters are named after the page's components (``Page``); a parameter named ``settings``,
  ``drawing`` or ``session`` takes one dataclass (``PACKS``) built from the components named like its
  fields, so no handler takes more than six named parameters (``wire`` is the one adapter gradio sees);
* a handler returns (or yields, to stream) a dict keyed by component name, holding only what it sets.

Per-user data (the recorded run, the chosen model, the Stop request, an own cost curve) lives in
``gr.State``; loaded weights are shared read-only through ``engine.product.loading.ModelRegistry``.  The handlers that
run forward passes (Generate, Race, Re-measure) are wired through ``gpu_handler``: under ``spaces.GPU`` where
the ``spaces`` package is installed, which on a ZeroGPU Space gives each call a GPU and elsewhere changes
nothing (``ZERO_GPU``, ``place_models``).
"""
from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, fields
from functools import wraps
from pathlib import Path
from types import SimpleNamespace
from typing import Any

try:  # Hugging Face Spaces: imported before anything touches CUDA, as ZeroGPU asks
    import spaces
except ImportError:  # not installed: the handlers run as they are
    spaces = None

import gradio as gr
import plotly.graph_objects as go
import torch

from engine.decoding.config import METHODS, ConfigError, DecodeConfig
from engine.decoding.cost import CostCurveError, load_cost_curve
from engine.product.cost_cache import cached_cost_curve, curve_key, measure_cost_curve
from engine.product.decoding import make_decoder
from engine.product.generate import command_line
from engine.product.loading import (
    DEMO_MODEL,
    LoadedModel,
    ModelLoadError,
    ModelRegistry,
    load_model,
    resolve,
    resolve_device,
    resolve_dtype,
    sentence,
    tqdm_progress,
)
from engine.product.lossless import attribute
from engine.product.metrics import summarize
from engine.product.models import DEMO_NAMES, NAMED, SMOLLM2
from engine.product.page_settings import RANGES, PageSettings
from engine.product.race import Pacer, Race
from engine.product.run import MEASURING, ArTiming, Run, Speedup, ar_steps_per_forward
from engine.product.sweep import PARAMETERS, Sweep, SweepSpec, markdown_table, run_sweep
from engine.product.sweep import summary as sweep_summary
from engine.product.sweep_figure import sweep_figure
from engine.product.trace_io import MAX_BYTES, TraceFormatError
from engine.sources import REGISTRY, SourceMemory
from viz.charts import cost_figure, speed_figure
from viz.explain import (
    TOKEN_COLORS,
    big_numbers,
    cost_sentence,
    cycle_segments,
    explain_cycle,
    race_board,
    theory_panel,
)
from viz.lesson import stage_sentence, stages_of, what_is_it
from viz.tree_figure import count_words, tree_figure

#: A ZeroGPU Space: ``spaces`` is installed and the Space's runtime sets ``SPACES_ZERO_GPU`` (read as spaces/config.py
#: reads it).  There this process never has a GPU: ``spaces.GPU`` runs each call in a worker process forked from it,
#: the weights moved to a GPU, the call's arguments and each of its results pickled across (spaces/zero/wrappers.py).
ZERO_GPU = spaces is not None and os.environ.get("SPACES_ZERO_GPU", "").lower() in ("1", "t", "true")
GPU_SETUP_S = 20  # seconds a GPU call asks for besides its work: the worker's start and the weights' move ...
GPU_S_PER_TOKEN = 0.05  # ... per token it may decode (a generous bound: the forward, the engine and the drawing) ...
GPU_MAX_S = 120  # ... and at most this: ZeroGPU refuses longer requests (its limit is undocumented, "a few minutes")
REMEASURE_S = 30  # a cost-curve measurement: 8 tree sizes x 8 rounds of one forward


def on_gpu(fn, duration=None):
    """``fn`` under ``spaces.GPU(duration=duration)`` where ``spaces`` is installed, else ``fn`` itself.

    On ZeroGPU each call of the result holds a GPU for at most ``duration`` seconds (an int, or a function of the
    call's arguments; the shorter, the sooner a visitor's call is scheduled); elsewhere ``spaces.GPU`` returns
    ``fn`` unchanged.  Generator functions stream their results.  Source: the ``spaces`` package (``spaces.GPU``)
    and Hugging Face's ZeroGPU documentation.
    """
    return spaces.GPU(fn, duration=duration) if spaces is not None else fn


def _gpu_seconds(tokens, paused_s: float = 0.0) -> int:
    """GPU seconds for a call decoding up to ``tokens`` tokens and pausing ``paused_s`` s in all, capped."""
    try:
        tokens, paused_s = max(1, int(tokens)), max(0.0, float(paused_s or 0.0))
    except (TypeError, ValueError):  # bad input: the handler says so at once
        tokens, paused_s = 1, 0.0
    return int(min(GPU_MAX_S, GPU_SETUP_S + GPU_S_PER_TOKEN * tokens + paused_s))


def generate_gpu_seconds(settings: PageSettings, drawing=None, pace: float = 0.0, session=None, **_) -> int:
    """``generate``'s GPU allowance on ZeroGPU (s): the run, then AR's timing run (at most ``AR_TIMING_TOKENS``),
    and slow motion's pauses (``pace`` per cycle: at most one per token); capped at ``GPU_MAX_S``."""
    try:
        tokens = int(settings.max_new_tokens)
        pace = float(pace or 0.0)
    except (TypeError, ValueError):
        tokens, pace = 1, 0.0
    return _gpu_seconds(tokens + min(tokens, AR_TIMING_TOKENS), pace * tokens)


def race_gpu_seconds(settings: PageSettings, race_seconds: float = 0.0, session=None, **_) -> int:
    """``race``'s GPU allowance on ZeroGPU (s): both lanes, the verdict's replay of AR's steps, and the race played
    over ``race_seconds`` of wall time; capped at ``GPU_MAX_S``."""
    try:
        tokens = int(settings.max_new_tokens)
    except (TypeError, ValueError):
        tokens = 1
    return _gpu_seconds(3 * tokens, race_seconds)


def gpu_handler(handler, models: ModelRegistry, duration, zero_gpu: bool = ZERO_GPU, decorate=on_gpu):
    """``handler`` (a page handler that runs forward passes, its registry a keyword-only ``models``) bound to
    ``models`` and run under ``decorate(fn, duration)`` (``on_gpu``), as the page wires it.

    Built for ZeroGPU's pattern: the weights are placed on the GPU at start-up (``place_models``) and the decorated
    function runs the forward passes, in a worker forked from this process.  The registry is bound here, in a
    closure the worker inherits, so only the visitor's inputs are pickled across, never the weights, and a
    streaming handler's frames come back one by one.  What the worker changes in the visitor's state stays there,
    so with ``zero_gpu``, for a streaming handler:

    * the visitor's source memory comes back as one more frame, ``{"memory": ...}`` (wire the ``memory`` state as
      an output too);
    * Stop: the worker never sees the visitor's ``control`` dict, so this process watches it between frames and,
      once Stop is set, closes the stream; ``spaces`` then ends the worker's run at its next frame (what is on the
      page stays; the run's closing frame, with the speedup, does not come).

    Without ``zero_gpu`` nothing is added, and ``on_gpu`` returns the bound handler itself (``spaces.GPU`` is
    effect-free off ZeroGPU): the handler runs as it is.  The result keeps ``handler``'s name and signature
    (``wire`` reads them) and takes its arguments by keyword.

    Args:
        handler: e.g. ``generate``, ``race``, ``remeasure_curve``.
        models: the page's registry.
        duration: GPU seconds to ask for: an int, or a function of the handler's arguments (``generate_gpu_seconds``).
        zero_gpu: whether calls cross into a ZeroGPU worker (default: ``ZERO_GPU``).
        decorate: ``on_gpu``, or a stand-in with its signature (tests).
    """
    if not inspect.isgeneratorfunction(handler):
        @wraps(handler)
        def call(*args, **kwargs):
            return handler(*args, **kwargs, models=models)
        return decorate(call, duration)

    @wraps(handler)
    def stream(*args, **kwargs):  # where the GPU is (on ZeroGPU: in the worker)
        yield from handler(*args, **kwargs, models=models)
        session = kwargs.get("session")
        if zero_gpu and session is not None and session.memory is not None:
            yield {"memory": session.memory}  # the worker's copy, which the run updated

    on_device = decorate(stream, duration)
    if not zero_gpu:
        return on_device

    @wraps(handler)
    def relayed(*args, **kwargs):  # in this process: Stop, relayed to the worker
        control = (kwargs.get("session") or Session()).start()  # the visitor's own dict, which Stop sets
        frames = on_device(*args, **kwargs)
        try:
            for frame in frames:
                yield frame
                if control.get("stop"):
                    break
        finally:
            frames.close()

    return relayed

PRESETS = json.loads((Path(__file__).parent / "assets" / "presets.json").read_text(encoding="utf-8"))
LIGHT_EVERY_S = 0.2  # the output text, numbers and scrubber redraw at most this often while decoding ...
HEAVY_EVERY_S = 0.5  # ... the tree, speed chart, explanation and theory panel at most this often (and always at
# the first cycles and the end) ...
DRAW_SHARE = 0.03  # ... and each kind of frame takes at most this share of the wall time (its cost, from building
# it to the page taking it, sets its next gap): drawing never holds the engine for long, and is not engine time
STEP_PAUSE_S = 2.5  # step-through: seconds each stage of a cycle stays on screen
AR_TIMING_TOKENS = 128  # the AR run that times the speedup decodes at most this many tokens (one-token forwards)
AR_CLOCK_ENTRIES = 32  # AR timings a visitor keeps (per model, prompt and max new tokens), oldest out
RACE_SECONDS = 20  # the race plays over about this many seconds by default (a 128-token SmolLM2 race on a CPU)
CSS = """
#page-header p {margin: .1em 0}
#stats {font-size: 1.0em}
#big-numbers {margin: 0; flex: 0 1 420px !important}  /* the three numbers' width; the stats line takes the rest */
#draft-tree {min-height: 450px}
#explain p {margin: .1em 0}
.dark #draft-tree svg text {fill: #e5e7eb !important}
#draft-tree:fullscreen {background: var(--body-background-fill); display: flex; align-items: center;
  justify-content: center; width: 100vw; height: 100vh}
#draft-tree:fullscreen .js-plotly-plot {width: var(--tree-w) !important; flex: none;
  transform: scale(var(--tree-zoom, 1)); transform-origin: center center}
#settings label {padding-right: 2.6em}
/* phones and narrow windows: the columns dissolve so the tree comes right after Generate (prompt, run views,
   then the settings and the rest), and the tree keeps the width its labels were fitted to, scrolling sideways */
@media (max-width: 820px) {
  #main-row {flex-direction: column !important; flex-wrap: nowrap !important}
  #main-row > #left-column, #main-row > #right-column {display: contents}
  #prompt-block {order: 1} #run-block {order: 2} #settings-block {order: 3} #more-block {order: 4}
  #prompt-block, #run-block, #settings-block, #more-block {width: 100%; min-width: 0}
  #draft-tree {overflow-x: auto}
  #draft-tree .js-plotly-plot, #draft-tree .plot-container {min-width: 880px}
}
"""
TOGGLE_DARK = "() => { document.body.classList.toggle('dark'); }"
#: a click on a point of the sweep figure opens its run: each point's customdata is its run's place in the sweep
#: (``engine.product.sweep.SweepRun.index``), which is also its place in the "Open a run" radio, so the click picks that
#: choice as a user would (the radio's own event opens the run).  Plotly's click event lives on the figure's div,
#: which gradio replaces when a new figure comes, so the binding is re-checked every 0.4 s (a flag on the div's
#: event hub, which a replot drops with its listeners).
SWEEP_POINT_CLICKS = """() => { setInterval(() => {
  const gd = document.querySelector('#sweep-plot .js-plotly-plot');
  if (!gd || !gd.on || !gd._ev || gd._ev.gooseClicks) return;
  gd._ev.gooseClicks = true;
  gd.on('plotly_click', (ev) => {
    const point = (ev.points || []).find(p => Number.isInteger(p.customdata)); if (!point) return;
    const choice = document.querySelectorAll('#sweep-open label')[point.customdata];
    if (choice) choice.click();
  });
}, 400); }"""
#: full screen: the tree's block fills the screen and its figure, kept at its page size, is scaled up to fill it
#: (labels grow with it; a new cycle's figure keeps the scale)
FULLSCREEN = """() => { const e = document.getElementById('draft-tree'); if (!e) return;
  const plot = e.querySelector('.js-plotly-plot'); if (!plot) return;
  const w = plot.offsetWidth, h = plot.offsetHeight;
  e.style.setProperty('--tree-w', w + 'px');
  e.style.setProperty('--tree-zoom', Math.min(screen.width / w, screen.height / h).toFixed(3));
  e.requestFullscreen(); }"""

METHOD_LABELS = {"goose": "Goose (spine tree of the chosen sources)", **{i.name: i.method_label for i in REGISTRY},
                 "iso3": "Iso(3): balanced 3-ary tree", "iso5": "Iso(5): balanced 5-ary tree", "ar": "AR (no drafting)"}
METHOD_CHOICES = [(METHOD_LABELS.get(m, m), m) for m in METHODS]
DTYPE_CHOICES = [("auto (measured: the fastest of fp32, bf16 and q4 on a CPU; half precision on a GPU)", "auto"),
                 ("fp32 (exact: token for token AR's output)", "fp32"), ("fp16", "fp16"), ("bf16", "bf16"),
                 ("q4 (a 4-bit model's own weights, bf16 activations; CPU)", "q4")]
SOURCE_CHOICES = [(info.label, info.name) for info in REGISTRY]
PROMPT_FORMATS = [("Chat template (one user turn)", "chat"), ("Raw completion prompt", "raw")]
FORMAT_NAMES = {"chat": "prompt through the chat template", "raw": "raw completion prompt"}
SHOWN = "▶ shown cycle"  # output label of the tokens the cycle on screen committed
COLOR_MAP = {**TOKEN_COLORS, SHOWN: "#f2e755"}  # a highlighter's yellow, apart from every source's tint
INITIAL = PageSettings()  # the settings components' initial values

HOW_TO_READ = f"""
* **The tree** is one verification forward. The root is the *anchor* (the last committed token) and depth
  grows to the right. Hover a node for its token, score, estimated acceptance and, for a rejected node, the
  token the model wanted in its place. Each other node is a draft token, coloured by its source:
{chr(10).join(f"  * **{i.label}**: {i.blurb}" for i in REGISTRY)}
* **The thick sky-blue path** is what the model accepted; the **star** is the bonus token the model adds itself.
  Faded nodes were rejected; ghost nodes were never verified (the GT principle judged them not worth a row).
  **+N** folds N rejected side nodes and **⋯N** N tokens of a long chain (a spine's middle with the branches
  off it; spine tokens never go into a +N), so the tree fits the screen: hover them for their tokens.
* **Run totals and the cycle on screen:** the big numbers, the stats line and the theory panel's measured rates
  are the whole run so far; the line under the tree, its sentence, the tree and the theory panel's bound are the
  cycle on the scrubber.
* **Max depth D** bounds the TR branches only. The PLD spine copies up to {DecodeConfig().tree.max_spine} tokens of a
  match, a confident match is extended further (up to {DecodeConfig().variant.max_extended_chain} × its confidence, and
  no further than a forward of {DecodeConfig().gt.chain_steps:g} AR steps on the cost curve allows), and
  **bypass chains** likewise: none of them is bounded by D.
* **τ** is tokens committed per verification forward (AR = 1). **tokens/s** counts engine time only: the
  time the page spends drawing is not counted.
* **The scrubber** (◀ ▶, drag, arrow keys or a typed number) steps through every recorded cycle; clicking a
  token in the output jumps to its cycle, and the tokens of the cycle on screen are marked {SHOWN!r}.
* **Greedy** (temperature 0) output is token-for-token the output of plain AR decoding; **sampling** output
  has exactly the distribution of plain AR sampling.
* **Sweep** runs the prompt once per value of one parameter (B, r, D, c, method or sources) and plots τ,
  tokens/s and the speedup over AR (AR timed once) against the value; it says whether every run produced AR's
  text; click a point to open its run in the tree viewer (`python -m engine.product.sweep` sweeps from a shell).
"""


@dataclass(frozen=True)
class Drawing:
    """How trees are drawn: GT-pruned candidates as ghosts; every node (no +N / ⋯N folding)."""

    show_ghosts: bool = True
    show_all: bool = False


@dataclass(frozen=True)
class Session:
    """One visitor's handles (each a ``gr.State``): the model (``model_key``, None = the page's default), the
    Stop request (``control``, ``{"stop": bool}``: Stop sets it while a run reads it), their own re-measured
    cost curve (``curve``, None = the shared one) and what draft sources keep across their requests
    (``memory``, e.g. the suffix source's tree of earlier outputs; None = nothing kept) and AR's timings on the
    prompts they ran (``ar_clock``, ``ar_key`` -> ``engine.product.run.ArTiming``: the speedup beside τ; None =
    none)."""

    model_key: Any = None
    control: dict | None = None
    curve: Any = None
    memory: SourceMemory | None = None
    ar_clock: dict | None = None

    def ar_timing(self, key) -> ArTiming | None:
        """AR's timing for ``key`` (``ar_key``) this visitor has, or None."""
        return (self.ar_clock or {}).get(key)

    def with_ar_timing(self, key, timing: ArTiming) -> dict:
        """This visitor's AR timings with ``timing`` for ``key`` (the newest; the oldest dropped beyond
        ``AR_CLOCK_ENTRIES``): the new value of their ``ar_clock`` state."""
        clock = dict(self.ar_clock or {})
        clock.pop(key, None)
        clock[key] = timing
        while len(clock) > AR_CLOCK_ENTRIES:
            clock.pop(next(iter(clock)))
        return clock

    def start(self) -> dict:
        """The Stop request of a run starting now, cleared (a fresh one when the caller has none)."""
        control = self.control if self.control is not None else {}
        control["stop"] = False
        return control


#: handler parameters filled with a dataclass of the components named like its fields
PACKS = {"settings": PageSettings, "drawing": Drawing, "session": Session}


class Page(SimpleNamespace):
    """The page's components by name; the names are the handlers' parameter names and frame keys."""

    def __getitem__(self, name: str):
        return getattr(self, name)

    def keyed(self, frame: dict | None):
        """A handler's frame (name -> value) keyed by component, as gradio takes it (nothing set: a skip)."""
        if frame is None:
            return None
        return {self[name]: value for name, value in frame.items()} or gr.skip()


def wire(event, handler, page: Page, inputs: tuple[str, ...], outputs: tuple[str, ...] = (),
         fixed: dict | None = None, around=None, **listener):
    """Connect ``handler`` to ``event`` (e.g. ``button.click``): the one adapter between gradio and a handler.

    ``inputs`` are the handler's parameters in order, each filled from the page: a name in ``PACKS`` with that
    dataclass, built from the components named like its fields; any other name with the component of that name.
    They must be exactly the handler's parameters not in ``fixed`` (keyword-only ones must be there): a renamed
    parameter fails here, when the page is built, instead of silently reading another component.  Gradio passes
    the components as keyword arguments (``inputs_kwargs``), so the API's parameter names are the components'
    names.  The handler's frames (dicts keyed by name, see ``Page.keyed``) go back keyed by component;
    ``outputs`` names every component a frame may set.  ``around`` wraps the adapter (e.g. ``RunBoard.wrap``);
    ``listener`` goes to ``event`` as it is.

    Raises:
        TypeError: ``inputs`` is not the handler's parameter list.
    """
    fixed = fixed or {}
    params = tuple(p.name for p in inspect.signature(handler).parameters.values()
                   if p.name not in fixed and p.kind is not p.KEYWORD_ONLY)
    if tuple(inputs) != params:
        raise TypeError(f"{handler.__name__} takes {params} from the page, but is wired with {tuple(inputs)}")
    packed = {name: [f.name for f in fields(PACKS[name])] for name in inputs if name in PACKS}
    components = {field: page[field] for name in inputs for field in packed.get(name, [name])}

    def call(values: dict):
        args = {name: PACKS[name](**{f: values[f] for f in packed[name]}) if name in packed else values[name]
                for name in inputs}
        return handler(**args, **fixed)

    if inspect.isgeneratorfunction(inspect.unwrap(handler)):
        def adapter(**values):
            for frame in call(values):
                yield page.keyed(frame)
    else:
        def adapter(**values):
            return page.keyed(call(values))
    adapter.__name__ = handler.__name__  # gradio names the API endpoint's function after it
    return event(around(adapter) if around else adapter, inputs=None, outputs=[page[n] for n in outputs],
                 inputs_kwargs=components, **listener)


# ---------------------------------------------------------------- what a frame shows

def gt_words(gt_threshold, trace) -> str:
    """What the GT principle did, e.g. "GT: auto, n* = 12 of 60 nodes" or "c = 0.100" (c = 0: pruning off)."""
    if gt_threshold == "auto":
        if trace is not None and trace.gt_nodes is not None:
            return f"GT: auto, n* = {trace.gt_nodes} of {trace.gt_candidates} nodes"
        return "GT: auto"
    try:
        return f"c = {float(gt_threshold):.3f}"
    except (TypeError, ValueError):
        return f"GT: {gt_threshold}"


def ar_key(models: ModelRegistry, lm: LoadedModel, ids: list[int], config: DecodeConfig) -> tuple:
    """What an AR timing is kept under: the model (name, device, dtype), the prompt's ids, max new tokens, and
    greedy or sampling (a sampling step costs more)."""
    return (*models.key_of(lm), tuple(ids), int(config.max_new_tokens), bool(config.sampling))


def stats_line(summary, run: Run, cost: str = "") -> str:
    """The line above the tree: the run's totals so far (tokens by source, from ``REGISTRY``), labelled as such,
    then ``cost`` (``viz.explain.cost_sentence``: τ tied to the cost curve) on a line of its own.  The cycle on
    screen is described under the tree (``cycle_line``)."""
    src = summary.accepted_by_source
    by_source = " · ".join(f"{info.short} {src.get(info.name, 0)}" for info in REGISTRY)
    sent = f" · {FORMAT_NAMES[run.prompt_format]}" if run.prompt_format in FORMAT_NAMES else ""
    return (f"Run totals: **τ {summary.tau:.2f}** · **{summary.tok_per_s:.1f} tok/s** · "
            f"{count_words(summary.new_tokens, 'token')} in {summary.forwards} forwards (prefill + "
            f"{count_words(summary.cycles, 'cycle')}) — by source: {by_source} · bonus {src.get('bonus', 0)} · "
            f"{gt_words(run.config.get('gt_threshold'), None)}{sent}" + (f"  \n{cost}" if cost else ""))


def cycle_line(trace, run: Run) -> str:
    """The cycle on screen in a few words, e.g. "**Cycle 20 of 60** · r = 0.91 · GT: auto, n* = 12 of 60 nodes"
    (cycle 0 is the prefill; its mode, nodes and tokens are in the tree's title; numbers rounded for people)."""
    rows = f" · +{trace.ptd_rows} PTD rows" if trace.ptd_rows else ""
    ratio = f" · r = {trace.spine_ratio:.2f}" if trace.spine_ratio is not None else ""
    gt = f" · {gt_words(run.config.get('gt_threshold'), trace)}" if trace.mode != "prefill" else ""
    return f"**Cycle {trace.index} of {len(run.traces) - 1}**{rows}{ratio}{gt}"


def token_text(run: Run, lm: LoadedModel | None):
    """Token id -> text: an imported run's own table, else the loaded tokenizer."""
    return run.text_of(None if lm is None else lambda i: lm.tokenizer.decode([i]))


def numbers(run: Run, curve=None, speedup: Speedup | None = None) -> dict:
    """The big numbers (τ, the speedup over AR, tokens/s) and the stats line: ``run``'s totals so far, with τ tied
    to ``curve`` (the cost curve the run read; None: no sentence)."""
    summary = summarize(run.traces)
    steps = ar_steps_per_forward(run.traces, curve)
    cost = cost_sentence(summary.tau, steps, speedup.value if speedup is not None else None)
    return {"big": big_numbers(summary, speedup), "stats": stats_line(summary, run, cost)}


def cycle_views(run: Run, trace, lm: LoadedModel | None, drawing: Drawing = Drawing()) -> dict:
    """What describes the cycle on screen: its tree, its line and sentence (``explain``) and the theory panel
    (the run's measured rates beside the bound for this cycle's shape)."""
    text = token_text(run, lm)
    return {"tree_plot": tree_figure(trace, text, show_ghosts=bool(drawing.show_ghosts),
                                     show_all=bool(drawing.show_all)),
            "explain": f"{cycle_line(trace, run)} — {explain_cycle(trace, text)}",
            "theory": theory_panel(summarize(run.traces), trace, int(run.config.get("budget", INITIAL.budget)),
                                   int(run.config.get("max_depth", INITIAL.depth)))}


def marked_output(run: Run, shown: int | None) -> list[tuple[str, str]]:
    """The run's output segments, the tokens committed by cycle ``shown`` labelled ``SHOWN``."""
    return [(text, SHOWN if cycle == shown else label) for (text, label), cycle in zip(run.segments, run.token_cycles)]


def session_curve(curve, lm: LoadedModel):
    """The visitor's own re-measured cost curve when it belongs to ``lm`` (else None: the shared curve)."""
    return curve if curve is not None and curve.key == curve_key(lm.model) else None


def _paused(seconds: float, control: dict) -> None:
    """Sleep ``seconds`` (slow motion), waking early when Stop is pressed."""
    end = time.perf_counter() + seconds
    while not control.get("stop") and time.perf_counter() < end:
        time.sleep(min(0.05, max(0.0, end - time.perf_counter())))


def _problem(message: str, where: str = "stats") -> dict:
    """A frame that tells the visitor what is wrong (and a toast); nothing else changes."""
    message = message[:1].upper() + message[1:]  # DecodeConfig's messages start in lower case
    gr.Warning(message)
    return {where: f"⚠️ {message}"}


def keep_in_range(value, *, name: str, cap: int | None = None) -> float | None:
    """A number typed into a settings box (``name``, a ``RANGES`` field) outside the page's range (``cap``: the
    page's max new tokens): the nearest bound, which goes back into the box at once, with a sentence saying so in a
    toast (not gradio's red "Error" toast, after which the box kept the typed number while its slider showed the
    bound); None when it is inside."""
    if value is None:
        return None
    inside, notes = PageSettings(auto_r=False, auto_c=False, **{name: value}).clamped(cap)
    for note in notes:
        gr.Warning(note)
    return getattr(inside, name) if notes else None


# ---------------------------------------------------------------- Generate

GENERATE_OUT = ("output", "tree_plot", "speed_plot", "stats", "run", "scrubber", "explain", "big", "theory", "command",
                "ar_clock", "lesson", "prompt_format")


class Throttle:
    """When the next frame is drawn while decoding: light frames (text, numbers, scrubber) at most every
    ``LIGHT_EVERY_S``, heavy ones (tree, speed chart, explanation, theory) every ``HEAVY_EVERY_S`` and always at
    the first cycles and the last; each kind's gap grows so that it takes at most ``DRAW_SHARE`` of wall time."""

    def __init__(self) -> None:
        self.last_light = self.last_heavy = 0.0  # when each kind of frame was last drawn ...
        self.light_gap, self.heavy_gap = LIGHT_EVERY_S, HEAVY_EVERY_S  # ... and the wait before the next one

    def due(self, trace, now: float, paced: bool) -> bool | None:
        """True: draw a heavy frame; False: a light one; None: none now."""
        if trace.index <= 1 or trace.finished or paced or now - self.last_heavy >= self.heavy_gap:
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


def generate(settings: PageSettings, drawing: Drawing = Drawing(), pace: float = 0.0, session: Session = Session(),
             *, models: ModelRegistry) -> Iterator[dict]:
    """Generate: stream frames (``GENERATE_OUT``) while decoding; the last holds the whole ``run``.

    ``pace`` pauses that many seconds after each cycle (slow motion); Stop (``session.control``) ends the
    run after the current cycle and keeps its output; ``session.curve`` is the visitor's own cost curve.
    Drawing is throttled (``Throttle``) and never counted as engine time.  Bad input: one frame with the
    message in ``stats``.  When the model has no chat template, the prompt format shown is set to what the
    prompt really went through.

    After the run, the speedup beside τ: the run's decode-phase tokens/s over AR's on the same prompt, model,
    dtype and max new tokens (``session.ar_clock``: from an earlier AR timing or race of this visitor), else over
    an AR run timed now (``time_ar``; not part of the run's engine time), kept in ``ar_clock``.  The stats line
    ties τ to the cost curve the run read; the lesson's cost sentence reads the same curve.
    """
    control = session.start()
    lm = models.get(session.model_key)
    try:
        ids, config = settings.prepare(lm)
    except ConfigError as exc:
        yield _problem(str(exc))
        return
    try:
        decoder = make_decoder(lm.model, config, lm.eos_token_ids, cost_curve=session_curve(session.curve, lm),
                              memory=session.memory)
        run = Run(model=lm.name, prompt=settings.prompt, prompt_format=settings.format_used(lm),
                  config=decoder.config.to_dict(),
                  cost_curve=decoder.cost_curve.spec() if decoder.cost_curve is not None else None)
        text = token_text(run, lm)
        command = run_command(run)
        if run.prompt_format != settings.prompt_format:  # no chat template: the box says what the prompt got
            yield {"prompt_format": run.prompt_format}
        curve = decoder.cost_curve or session_curve(session.curve, lm) or cached_cost_curve(lm.model)
        key = ar_key(models, lm, ids, config)
        known = session.ar_timing(key)  # AR's speed on this prompt, when this visitor has it already
        live = Speedup(None, "AR is timed after the run") if known is None else None  # else live, below
        throttle, trace, drawn = Throttle(), None, None  # drawn: the last cycle whose tree is on screen
        for trace in decoder.generate(ids, should_stop=lambda: bool(control.get("stop"))):
            run.record(trace, cycle_segments(trace, text))
            started = time.perf_counter()
            heavy = throttle.due(trace, started, bool(pace))
            if heavy is None:
                continue
            shown = live or Speedup.of(run.traces, known)
            yield _frame(run, trace, lm, drawing, command, heavy, curve, shown)
            throttle.drawn(heavy, started)
            drawn = trace if heavy else drawn
            if pace:
                _paused(float(pace), control)
        if trace is None:
            return
        if drawn is not trace:  # stopped, or throttled: the last cycle drawn in full
            yield _frame(run, trace, lm, drawing, command, True, curve, live or Speedup.of(run.traces, known))
        stopped = bool(control.get("stop"))
        if config.method == "ar":  # this run is AR: its own speed is AR's on this prompt
            known = ArTiming.of(run.traces, "ar") if not stopped else known
            speedup = Speedup(1.0, "this run is AR") if known is not None else Speedup(None, "stopped: not measured")
        elif known is None and stopped:
            speedup = Speedup(None, "not measured: the run was stopped")
        else:
            if known is None:
                yield numbers(run, curve, MEASURING)
                known = time_ar(lm, ids, config, curve, control)
            speedup = Speedup.of(run.traces, known) if known is not None else Speedup(None, "not measured: stopped")
        clock = session.with_ar_timing(key, known) if known is not None else session.ar_clock
        yield {**numbers(run, curve, speedup), "run": run, "command": command, "ar_clock": clock,
               "lesson": what_is_it(curve)}
    except Exception as exc:  # noqa: BLE001 - keep serving; the user sees why this run stopped
        yield {"stats": f"⚠️ generation stopped: {type(exc).__name__}: {exc}"}


def _frame(run: Run, trace, lm: LoadedModel, drawing: Drawing, command: str, heavy: bool, curve=None,
           speedup: Speedup | None = None) -> dict:
    """One streamed frame of ``generate``; the tree, speed chart, explanation and theory only when ``heavy``."""
    frame = {"output": list(run.segments), "run": run, "command": command,
             "scrubber": gr.Slider(maximum=max(1, trace.index), value=trace.index)}
    if heavy:
        return {**frame, **cycle_views(run, trace, lm, drawing), **numbers(run, curve, speedup),
                "speed_plot": speed_figure(run.traces)}
    return {**frame, **numbers(run, curve, speedup)}


def time_ar(lm: LoadedModel, ids: list[int], config: DecodeConfig, curve, control: dict) -> ArTiming | None:
    """AR's decode-phase speed on this prompt, timed now on the same device, model and dtype: an AR run of the
    engine (one-token forwards, at most ``AR_TIMING_TOKENS``; ~60 ms each for SmolLM2 on a 2-core CPU, ~5 ms for
    the demo model), in engine time (tokens/s).  None when Stop ended it first."""
    ar = make_decoder(lm.model, config.with_(method="ar", max_new_tokens=min(config.max_new_tokens, AR_TIMING_TOKENS)),
                     lm.eos_token_ids, cost_curve=curve)
    traces = list(ar.generate(ids, should_stop=lambda: bool(control.get("stop"))))
    if not traces or not traces[-1].finished:
        return None
    return ArTiming.of(traces, "ar")


# ---------------------------------------------------------------- the recorded cycles

CYCLE_OUT = ("scrubber", "tree_plot", "explain", "theory", "output")


def show_cycle(run: Run | None, scrubber, drawing: Drawing = Drawing(), model_key=None, step: int = 0, *,
               models: ModelRegistry) -> dict:
    """Scrubber: recorded cycle ``scrubber + step`` (clamped): its tree, line and sentence, the theory panel's
    bound for its shape, and the output with its tokens marked (``CYCLE_OUT``).  The big numbers and the stats
    line stay: they are the run's totals and say so."""
    if not run or not run.traces:
        return {"explain": "Generate first: the scrubber steps through the cycles of the last run."}
    k = max(0, min(int(scrubber or 0) + int(step), len(run.traces) - 1))
    return {"scrubber": k, **cycle_views(run, run.traces[k], models.get(model_key), drawing),
            "output": marked_output(run, k)}


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
    k = max(0, min(int(scrubber or 0), len(traces) - 1))
    drafted = [t.index for t in traces if t.mode in ("tree", "bypass")]
    if traces[k].mode not in ("tree", "bypass") and drafted:
        k = next((i for i in drafted if i >= k), drafted[-1])
    trace, text = traces[k], token_text(run, models.get(session.model_key))
    for stage in stages_of(trace):
        if control.get("stop"):
            return
        frame = {"scrubber": k, "explain": stage_sentence(trace, stage, text),
                 "tree_plot": tree_figure(trace, text, show_ghosts=bool(drawing.show_ghosts), stage=stage,
                                          show_all=bool(drawing.show_all))}
        if stage == "bonus":
            yield {**frame, "output": marked_output(run, k)}
            return
        yield frame
        _paused(pause, control)


def jump_to_token(run: Run | None, index, drawing: Drawing = Drawing(), model_key=None, *,
                  models: ModelRegistry) -> dict:
    """Clicking output token ``index`` shows the cycle that produced it (``CYCLE_OUT``)."""
    if not run or not isinstance(index, int) or not 0 <= index < len(run.token_cycles):
        return {}
    return show_cycle(run, run.token_cycles[index], drawing, model_key, models=models)


def request_stop(control: dict) -> None:
    """Stop: the visitor's running Generate, Race or step-through ends after its current cycle and keeps
    what it has (no error, both race outputs kept)."""
    control["stop"] = True


# ---------------------------------------------------------------- trace files

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
        return {**_problem(f"Could not import the trace: {exc}"), "import_file": None}
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


def run_command(run: Run) -> str:
    """The command that reproduces ``run`` (``engine.product.generate.command_line``): its config, prompt format, the
    prompt itself (so it needs no other file) and the cost curve it read; or why its settings do not make a
    config here (a trace from another version)."""
    try:
        curve = load_cost_curve(run.cost_curve) if run.cost_curve else None
        return command_line(run.decode_config(), model=run.model, prompt_format=run.prompt_format or "auto",
                            cost_curve=curve, prompt=run.prompt)
    except (ConfigError, CostCurveError, TypeError, ValueError) as exc:
        return f"(the trace's settings do not make a valid config here: {exc})"


# ---------------------------------------------------------------- models and the server

ALLOWED_ENV = "GOOSE_LENS_ALLOWED_MODELS"  # public mode: comma-separated model names / hub ids a visitor may load


def canonical_model_name(name: str) -> str:
    """The id a model name stands for ('smollm2' -> 'smollm2-135m-instruct'), without touching the filesystem."""
    key = name.strip().lower()
    return NAMED[key].name if key in NAMED else DEMO_MODEL if key in DEMO_NAMES else name.strip()


@dataclass(frozen=True)
class PageOptions:
    """Server-wide settings of the page, the same for every visitor (per-visitor data lives in ``gr.State``).

    Public mode (a shared Space: ``$SPACE_ID`` set, or ``--public``) protects visitors from each other:
    the model picker loads only ``allowed_models`` (never a local path, never remote code), runs are
    capped at ``max_new_tokens``, and a cost-curve re-measure changes only the visitor's own session.
    Outside public mode the picker loads anything, as a local debugging tool should.
    """

    public: bool = False
    allowed_models: tuple[str, ...] = (DEMO_MODEL, SMOLLM2.name)  # public mode only (ids, see canonical_model_name)
    max_new_tokens: int = 1024  # the slider's maximum; public mode: 512, so one run cannot hold the device for long
    notice: str | None = None  # shown under the title, e.g. why the default model was replaced by the demo model
    zero_gpu: bool = False  # a ZeroGPU Space: the picker only switches between the models placed at start-up

    @classmethod
    def from_env(cls, public: bool = False, notice: str | None = None) -> PageOptions:
        """Public when ``public`` or ``$SPACE_ID`` is set; the allowlist from ``$GOOSE_LENS_ALLOWED_MODELS``."""
        if not (public or os.environ.get("SPACE_ID")):
            return cls(notice=notice, zero_gpu=ZERO_GPU)
        listed = [canonical_model_name(n) for n in os.environ.get(ALLOWED_ENV, "").split(",") if n.strip()]
        return cls(public=True, allowed_models=tuple(listed) or cls.allowed_models, max_new_tokens=512,
                   notice=notice, zero_gpu=ZERO_GPU)

    def refusal(self, name: str) -> str | None:
        """Why this page will not load ``name``, or None when it may."""
        if self.public and canonical_model_name(name) not in self.allowed_models:
            return (f"This public page loads only these models: {', '.join(self.allowed_models)} "
                    f"(run goose-lens yourself to load any other).")
        return None


def load_other_model(model_name, device, dtype, model_key, *, models: ModelRegistry,
                     options: PageOptions = PageOptions()) -> Iterator[dict]:
    """Model picker: yields progress lines (``model_status``: a named model's fetch and conversion step by
    step), then the new model's key (``model_key``), the header naming it and, for a model without a chat
    template, the prompt format its prompts really get (raw); on failure keeps the current model.  An empty name means
    the page's default model.  In public mode a model outside the allowlist is refused before anything is
    looked up."""
    current = models.get(model_key)
    name = (model_name or "").strip() or models.get(None).name
    refusal = options.refusal(name) or (zero_gpu_refusal(models, name, device, dtype) if options.zero_gpu else None)
    if refusal:
        gr.Warning(refusal)
        yield {"model_status": f"⚠️ {refusal} Still using {current.describe()}."}
        return
    waiting = f"the current model {current.describe()} stays in use meanwhile"
    yield {"model_status": f"⏳ Loading `{name}` on {device} ({dtype}) … {waiting}."}
    t0, step, result = time.perf_counter(), [0.0, "starting"], {}

    def report(fraction: float, message: str) -> None:  # called from the loading thread
        step[:] = [fraction, message]

    def work() -> None:
        try:
            result["lm"] = models.load(name, device=device, dtype=dtype, progress=report)
        except ModelLoadError as exc:
            result["error"] = exc

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    shown = None
    while worker.is_alive():
        worker.join(0.5)
        if worker.is_alive() and step[0] > 0 and tuple(step) != shown:
            shown = tuple(step)
            yield {"model_status": f"⏳ `{name}`: {step[1]} ({step[0]:.0%}) … {waiting}."}
    if "error" in result:
        gr.Warning(str(result["error"]))
        yield {"model_status": f"⚠️ {sentence(str(result['error']))} Still using {current.describe()}."}
        return
    lm = result["lm"]
    yield {"model_status": f"✅ {using_words(lm)[:-1]}, loaded in {time.perf_counter() - t0:.1f} s.",
           "model_key": list(models.key_of(lm)), "header": header_text(lm, options.notice),
           **({} if lm.has_chat_template else {"prompt_format": "raw"})}


def zero_gpu_refusal(models: ModelRegistry, name: str, device: str, dtype: str) -> str | None:
    """ZeroGPU: why the picker will not switch to ``name`` on ``device`` in ``dtype``, or None when that model is
    loaded already (the picker then only switches to it).  A GPU worker is a fork of this process, so a model loaded
    after it started would be missing there: only the models placed at start-up (``place_models``) are offered."""
    try:
        dev = resolve_device(device or "auto")
        want = (resolve(name).name, dev, resolve_dtype(dtype or "auto", dev)[0])
    except ModelLoadError:
        want = None
    if want is not None and models.key_of(models.get(want)) == want:
        return None
    return ("This ZeroGPU Space places its models on the GPU when it starts and offers only those, with device and "
            "dtype auto (run goose-lens yourself to load any other).")


def place_models(first: LoadedModel, options: PageOptions, zero_gpu: bool = ZERO_GPU) -> ModelRegistry:
    """The page's models, ready to serve.

    Elsewhere: ``first`` alone, warmed up (one small forward, so the first Generate does not pay for torch's lazy
    initialisation); the model picker loads others when asked.

    On ZeroGPU, its documented pattern: models are moved to the GPU at start-up, in this process, outside the
    decorated functions.  Every allowlisted model is loaded now (device and dtype auto: the GPU, bf16), since a GPU
    worker is a fork of this process and has only the models loaded before it started (``zero_gpu_refusal``);
    then one GPU call warms each up and measures its cost curve into the disk cache
    (``engine.product.cost_cache``), which this process, which has no GPU, reads.  A model that cannot be loaded is
    left out, with a line on stderr.
    """
    if not zero_gpu:
        first.warm_up()
        return ModelRegistry(first)
    placed = [first]
    for name in options.allowed_models:
        if name != first.name:
            try:
                placed.append(load_model(name, progress=tqdm_progress(name)))
            except ModelLoadError as exc:
                print(f"warning: {sentence(str(exc))} It is left out.", file=sys.stderr)
    models = ModelRegistry(first, capacity=max(2, len(placed)))
    for lm in placed[1:]:
        models.put(lm)

    def prepare() -> None:  # in a GPU worker
        for lm in placed:
            lm.warm_up()
            cached_cost_curve(lm.model)

    on_gpu(prepare, min(GPU_MAX_S, GPU_SETUP_S + REMEASURE_S * len(placed)))()
    return models


def using_words(lm: LoadedModel) -> str:
    """The model status line: "Using SmolLM2-135M-Instruct (135M, bf16, CPU) — auto: bf16: verifies …"."""
    why = dtype_words(lm)
    return f"Using {lm.describe()}" + (f" — {why}" if why else "") + "."


def remeasure_curve(budget, model_key, *, models: ModelRegistry) -> dict:
    """Re-measure the cost curve for this visitor only (``curve``): nobody else's runs change."""
    fresh = measure_cost_curve(models.get(model_key).model)
    return {"curve": fresh, "cost_plot": cost_figure(fresh, int(budget)), "lesson": what_is_it(fresh)}


def cost_plot_for(budget, model_key, curve, *, models: ModelRegistry) -> dict:
    """The cost curve the visitor's runs read (their own, else the shared one) with c(B) at ``budget``."""
    lm = models.get(model_key)
    low, high, _ = RANGES["budget"]
    return {"cost_plot": cost_figure(session_curve(curve, lm) or cached_cost_curve(lm.model),
                                     int(min(max(float(budget or low), low), high)))}


# ---------------------------------------------------------------- Race

RACE_OUT = ("race_ar", "race_spec", "race_board", "ar_clock")


def race(settings: PageSettings, race_seconds: float = 0.0, session: Session = Session(), *,
         models: ModelRegistry) -> Iterator[dict]:
    """AR vs the chosen method on one device and a shared clock (``engine.product.race``): stream both texts and the
    board (``RACE_OUT``): the speedup in large type (tokens/s over AR's, end to end, engine time) and each lane's
    progress (tokens / max new tokens).

    ``race_seconds`` plays the race over about that many seconds of wall time (``engine.product.race.Pacer``: the race's
    engine clock shown at a fixed scale, so the lanes keep their proportions; 0 = real time); the board counts
    engine time only.  Stop (``session.control``) ends both runs and keeps their outputs so far.  When a greedy
    race ends with two different outputs, the board says where they part and both logits there
    (``race_verdict``).  AR's lane, when it finished, is this visitor's AR timing for the prompt (``ar_clock``),
    so a later Generate of the same prompt shows its speedup without timing AR again.
    """
    control = session.start()
    lm = models.get(session.model_key)
    try:
        ids, config = settings.prepare(lm)
    except ConfigError as exc:
        yield _problem(str(exc), "race_board")
        return
    stop = lambda: bool(control.get("stop"))  # noqa: E731
    curve = session_curve(session.curve, lm)
    spec = make_decoder(lm.model, config, lm.eos_token_ids, cost_curve=curve, memory=session.memory)
    curve = spec.cost_curve or curve or cached_cost_curve(lm.model)
    ar = make_decoder(lm.model, config.with_(method="ar"), lm.eos_token_ids, cost_curve=curve)
    contest = Race({"AR": ar.generate(ids, stop),
                    METHOD_LABELS.get(config.method, config.method): spec.generate(ids, stop)})
    key = ar_key(models, lm, ids, config)
    known = session.ar_timing(key)
    predicted_s = (known.seconds if known is not None and known.tokens >= config.max_new_tokens - 1 else
                   curve.latency(1) * config.max_new_tokens / 1000) + curve.latency(len(ids)) / 1000
    pacer, started, last_draw = Pacer(float(race_seconds or 0), predicted_s), time.perf_counter(), 0.0
    try:
        for lane in contest.steps():
            if lane is contest.lanes[0]:
                pacer.refine(lane, config.max_new_tokens)
            _paused(pacer.wait_s(contest.clock_s, time.perf_counter() - started), control)
            if not contest.over and time.perf_counter() - last_draw >= (0.05 if race_seconds else LIGHT_EVERY_S):
                last_draw = time.perf_counter()
                yield _race_frame(contest, lm, config.max_new_tokens, stopped=False)
    except Exception as exc:  # noqa: BLE001 - keep serving; the user sees why the race stopped
        yield {"race_board": f"⚠️ the race stopped: {type(exc).__name__}: {exc}"}
        return
    base, other = contest.lanes
    final = _race_frame(contest, lm, config.max_new_tokens, stopped=stop())
    if base.finished and not stop():
        final["ar_clock"] = session.with_ar_timing(key, ArTiming(base.decode_tokens, base.decode_s, "race"))
    if base.finished and other.finished and not stop() and base.tokens != other.tokens:
        yield _race_frame(contest, lm, config.max_new_tokens, False, "⏳ the outputs differ: finding where …")
        verdict = race_verdict(lm, ids, base.tokens, other.tokens, config.sampling)
        final.update(_race_frame(contest, lm, config.max_new_tokens, False, verdict))
    yield final


def race_verdict(lm: LoadedModel, ids: list[int], ar_tokens: list[int], spec_tokens: list[int],
                 sampling: bool = False) -> str:
    """Where the race's two outputs part, for the board: ``engine.product.lossless.attribute`` reads both tokens' logits
    off AR's own one-token step there (a precision tie in half precision, else a bug); "" when they agree.  Sampled
    outputs are two draws from the same distribution, so they may differ anywhere: said so, nothing attributed."""
    if list(ar_tokens) == list(spec_tokens):
        return ""
    if sampling:
        return "Sampling: the two outputs are different draws from the same distribution (lossless in distribution)."
    found = attribute(lm.model, ids, list(ar_tokens), list(spec_tokens))  # the AR lane's steps replayed
    if found is None:
        return ""
    words = found.sentence(lm.tokenizer.decode)
    return f"{words[:1].upper()}{words[1:]}."


def _race_frame(contest: Race, lm: LoadedModel, max_new_tokens: int, stopped: bool, verdict: str = "") -> dict:
    """Both texts and the board of ``race`` (``viz.explain.race_board``); speeds in engine time."""
    status = ""
    if stopped:
        status = "⏹ stopped: both outputs as of the same engine time."
    elif contest.over:
        status = "Both done ✓ — the speedup is AR's engine time over the method's (same tokens), prefill included."
    started = all(lane.forwards for lane in contest.lanes)
    ar, spec = contest.lanes
    return {"race_ar": lm.tokenizer.decode(ar.tokens), "race_spec": lm.tokenizer.decode(spec.tokens),
            "race_board": race_board(contest.lanes, max_new_tokens, contest.speedup() if started else None, status,
                                     verdict)}


# ---------------------------------------------------------------- Sweep

SWEEP_OUT = ("sweep_plot", "sweep_status", "sweep_state", "sweep_open")
SWEEP_CHOICES = [(f"{info.what} ({name})", name) for name, info in PARAMETERS.items()]
@dataclass(frozen=True)
class SweepOnPage:
    """A visitor's last sweep (``gr.State``) and what opening one of its runs needs: the prompt and its format."""

    sweep: Sweep
    prompt: str
    prompt_format: str


def sweep_gpu_seconds(settings: PageSettings, sweep_param=None, sweep_values: str = "", session=None, **_) -> int:
    """``sweep``'s GPU allowance on ZeroGPU (s): AR and one run per value, capped at ``GPU_MAX_S``."""
    try:
        tokens = int(settings.max_new_tokens) * (1 + len([v for v in str(sweep_values).split(",") if v.strip()]))
    except (TypeError, ValueError):
        tokens = 1
    return _gpu_seconds(tokens)


def sweep(settings: PageSettings, sweep_param, sweep_values, session: Session = Session(), *,
          models: ModelRegistry) -> Iterator[dict]:
    """Sweep: the prompt once per value of one parameter (``engine.product.sweep.run_sweep``: AR timed once, every run
    on one cost curve and a fresh source memory), the other settings as on the page.  Streams the figure (τ,
    tokens/s and speedup over AR against the value), a progress bar with the sentence on the texts and the table,
    and the runs to open in the tree viewer (``SWEEP_OUT``).  Stop ends it after the current cycle and keeps the
    runs so far; bad input: one sentence, nothing run."""
    control = session.start()
    lm = models.get(session.model_key)
    try:
        ids, config = settings.prepare(lm)
        spec = SweepSpec.parse(sweep_param or "", sweep_values or "")
    except ConfigError as exc:
        yield _problem(str(exc), "sweep_status")
        return
    curve = session_curve(session.curve, lm) or (cached_cost_curve(lm.model) if spec.needs_cost_curve(config)
                                                 else None)
    yield {"sweep_status": sweep_board(None, len(spec.values))}
    try:
        for snap in run_sweep(lm.model, lm.eos_token_ids, ids, config, spec, curve,
                              should_stop=lambda: bool(control.get("stop"))):
            state = SweepOnPage(snap, settings.prompt, settings.format_used(lm))
            yield {"sweep_plot": sweep_figure(snap), "sweep_status": sweep_board(snap, snap.total),
                   "sweep_state": state,
                   "sweep_open": gr.Radio(choices=[(r.label, r.index) for r in snap.runs], value=None)}
    except Exception as exc:  # noqa: BLE001 - keep serving; the user sees why the sweep stopped
        yield {"sweep_status": f"⚠️ the sweep stopped: {type(exc).__name__}: {exc}"}


def sweep_board(snap: Sweep | None, total: int) -> str:
    """Markdown: a progress bar (AR and each value one step), the sentence on the texts and the table so far."""
    done = 0 if snap is None else round(snap.fraction * (total + 1))
    bar = "▰" * done + "▱" * (total + 1 - done)
    if snap is None:
        return f"{bar} timing AR on this prompt …"
    step = "done" if snap.complete or snap.stopped else f"run {len(snap.runs) + 1} of {total} …"
    return f"{bar} {step} ({snap.seconds:.1f} s)\n\n{sweep_summary(snap)}\n\n{markdown_table(snap)}"


def open_sweep_run(sweep_open, sweep_state: SweepOnPage | None, drawing: Drawing = Drawing(), model_key=None, *,
                   models: ModelRegistry) -> dict:
    """A run of the last sweep (``sweep_open``: its index) in the tree viewer: its
    trees, numbers, output and command, as if it had just been generated (``IMPORT_OUT`` less the import box)."""
    if sweep_state is None or sweep_open is None:
        return {}
    found = [r for r in sweep_state.sweep.runs if r.index == int(sweep_open)]
    if not found:
        return {}
    swept, lm = found[0], models.get(model_key)
    curve = sweep_state.sweep.cost_curve
    run = Run(model=lm.name, prompt=sweep_state.prompt, prompt_format=sweep_state.prompt_format,
              config=swept.config.to_dict(), cost_curve=curve.spec() if curve is not None else None)
    text = token_text(run, lm)
    for trace in swept.traces:
        run.record(trace, cycle_segments(trace, text))
    last = run.traces[-1]
    ar = sweep_state.sweep.ar
    frame = {**cycle_views(run, last, lm, drawing), **numbers(run, curve, Speedup.of(run.traces, ar))}
    frame["stats"] = f"Sweep run {swept.label}: " + frame["stats"]
    return {**frame, "output": marked_output(run, last.index), "speed_plot": speed_figure(run.traces), "run": run,
            "scrubber": gr.Slider(maximum=max(1, len(run.traces) - 1), value=last.index),
            "command": run_command(run)}


def load_start_model(name: str | None, device: str = "auto", dtype: str = "auto") -> tuple[LoadedModel, str | None]:
    """The model the page starts with, and a notice for the page when the default could not be had.

    ``name`` None means the default (``$GOOSE_LENS_MODEL``, else SmolLM2): when it cannot be had (offline,
    no pip, checksum) the page falls back to the embedded demo model and says why.  A model named on the
    command line is not replaced: its ``ModelLoadError`` propagates.
    """
    try:
        return load_model(name, device=device, dtype=dtype, progress=tqdm_progress("model")), None
    except ModelLoadError as exc:
        if name is not None:
            raise
        lm = load_model(DEMO_MODEL, device=device, dtype=dtype)
        return lm, (f"⚠️ The default model could not be had, so this page runs the small embedded demo model "
                    f"({lm.describe()}) instead: {exc}")


def start_preset(lm: LoadedModel) -> dict:
    """The preset the prompt box starts with, so the first click works: the first chat preset for a model
    with a chat template, else the first raw (code) preset."""
    want = "chat" if lm.has_chat_template else "raw"
    return next((p for p in PRESETS if p["format"] == want), PRESETS[0])


def preset_fields(preset) -> dict:
    """A preset's prompt and its format (code: raw completion; chat datasets: chat template)."""
    chosen = next((p for p in PRESETS if p["label"] == preset), None)
    return {"prompt": chosen["prompt"], "prompt_format": chosen["format"]} if chosen else {}


class RunBoard:
    """Server-wide count of runs holding the model (no user data): lets a waiting visitor read, in words,
    why their Generate has not started."""

    def __init__(self) -> None:
        self._lock, self.running = threading.Lock(), 0

    def wrap(self, fn):
        """``fn`` (a generator function) counted as running while it runs (its signature kept for the API)."""
        @wraps(fn)
        def counted(*args, **kwargs):
            with self._lock:
                self.running += 1
            try:
                yield from fn(*args, **kwargs)
            finally:
                with self._lock:
                    self.running -= 1
        return counted

    def waiting_words(self) -> str:
        """What a visitor who just pressed Generate or Race is waiting for."""
        if not self.running:
            return "⏳ Starting …"
        return ("⏳ Waiting in line: another run (another visitor's, or your own earlier one) is using the model. "
                "Yours starts as soon as it ends; runs are capped, so this is a short wait.")


# ---------------------------------------------------------------- the page's layout

def _slider(name: str, value, step, label: str, high=None, **kwargs) -> gr.Slider:
    """The slider of ``RANGES[name]`` (``high`` lowers its maximum, e.g. public mode's max new tokens)."""
    low, top, _ = RANGES[name]
    return gr.Slider(low, top if high is None else min(top, high), value=value, step=step, label=label, **kwargs)


def build_demo(lm: LoadedModel | ModelRegistry, options: PageOptions = PageOptions()) -> gr.Blocks:
    """The page. Per-user data lives in ``gr.State``; models are shared read-only through the registry.

    First screen at 1280×800: prompt and Generate on the left, the tree, its sentence and the scrubber
    on the right; settings wait in closed accordions below the prompt."""
    models = lm if isinstance(lm, ModelRegistry) else ModelRegistry(lm)
    first, page = models.get(None), Page()
    with gr.Blocks(title="goose-lens") as demo:
        _header(page, first, options.notice)
        page.run = gr.State(None)  # the visitor's last run (engine.product.run.Run)
        page.model_key = gr.State(None)  # None = the default model
        page.control = gr.State({"stop": False})  # this visitor's Stop request (deep-copied per session)
        page.curve = gr.State(None)  # this visitor's own re-measured cost curve (None: the shared one)
        page.ar_clock = gr.State(None)  # this visitor's AR timings per (model, prompt, max new tokens): the speedup
        page.sweep_state = gr.State(None)  # this visitor's last sweep (SweepOnPage)
        page.memory = gr.State(SourceMemory())  # what draft sources keep across this visitor's runs (deep-copied
        # per session: never shared between visitors)
        with gr.Row(elem_id="main-row"):  # on a phone: prompt, run views, settings, the rest (CSS)
            with gr.Column(scale=1, min_width=300, elem_id="left-column"):
                preset = start_preset(first)
                with gr.Column(elem_id="prompt-block"):
                    _prompt_inputs(page, preset)
                with gr.Column(elem_id="settings-block"):
                    _lesson_and_presets(page, preset, cached_cost_curve(first.model))
                    _settings_inputs(page, options)
                    _model_and_trace_files(page, first, options)
            with gr.Column(scale=3, elem_id="right-column"):
                with gr.Column(elem_id="run-block"):
                    _run_views(page)
                with gr.Column(elem_id="more-block"):
                    _race_and_cost_views(page, first)
        _wire_runs(page, models)
        _wire_cycles(page, models)
        _wire_settings_and_models(page, models, options)
        demo.load(None, js=SWEEP_POINT_CLICKS)  # a click on a sweep point opens its run
    return demo


def dtype_words(lm: LoadedModel) -> str:
    """The model's precision and why, for people: its ``dtype_reason`` (e.g. "bf16: verifies 16 rows 1.1× faster
    than fp32 here (an AR step 0.9×)", when "auto" measured it); "fp32: the exact mode" for a chosen fp32; else ""."""
    if lm.dtype_reason:
        return ("auto: " if lm.auto_dtype else "") + lm.dtype_reason
    return "fp32: the exact mode (token for token AR's output)" if lm.dtype == torch.float32 and not lm.auto_dtype \
        else ""


def header_text(lm: LoadedModel, notice: str | None = None, shown: str | None = None) -> str:
    """The page's header (Markdown): the visitor's model, its precision and why (``dtype_words``), a notice, and
    (``shown``) the model of an imported run on screen when it is another one."""
    why = dtype_words(lm)
    other = f" · on screen: an imported run of `{shown}`" if shown and shown != lm.name else ""
    return (f"**goose-lens** — speculative decoding, one draft tree per cycle · model **{lm.describe()}**"
            + (f" · {why}" if why else "") + other + (f"\n\n{notice}" if notice else ""))


def _header(page: Page, first: LoadedModel, notice: str | None) -> None:
    with gr.Row(equal_height=True):
        page.header = gr.Markdown(header_text(first, notice), elem_id="page-header")
        page.dark_btn = gr.Button("☾ light / dark", scale=0, min_width=110, size="sm")


def _prompt_inputs(page: Page, preset: dict) -> None:
    """The prompt box (holding ``preset``'s prompt, so the first click works), Generate and Stop."""
    page.prompt = gr.Textbox(preset["prompt"], label="Prompt", lines=5, max_lines=8,
                             placeholder="Type a prompt or pick a preset")
    with gr.Row():
        page.go_btn = gr.Button("Generate", variant="primary", scale=2, min_width=100)
        page.stop_btn = gr.Button("Stop", variant="stop", scale=1, min_width=60)


def _lesson_and_presets(page: Page, preset: dict, lesson_curve=None) -> None:
    """The preset picker (the prompt box starts with ``preset``), the prompt format and the first lesson."""
    page.preset = gr.Dropdown([p["label"] for p in PRESETS], label="Preset prompt", value=preset["label"])
    page.prompt_format = gr.Radio(PROMPT_FORMATS, value=preset["format"], elem_id="prompt-format",
                                  label="Prompt format (code presets are raw completions; chat presets go through "
                                        "the chat template)")
    with gr.Accordion("What is speculative decoding?", open=True, elem_id="lesson"):
        page.lesson = gr.Markdown(what_is_it(lesson_curve))


def _settings_inputs(page: Page, options: PageOptions) -> None:
    """The accordions of ``PageSettings`` and ``Drawing`` (components named as their fields), and the command."""
    s = INITIAL
    with gr.Accordion("Method and tree shape", open=False):
        page.method = gr.Dropdown(METHOD_CHOICES, value=s.method, label="Method")
        page.sources = gr.CheckboxGroup(SOURCE_CHOICES, value=list(s.sources), label="Draft sources (Goose, Iso)")
        page.budget = _slider("budget", s.budget, 1, "Node budget B (anchor included)")
        page.auto_r = gr.Checkbox(value=s.auto_r, label="Adaptive spine ratio r (EMA tiers)")
        page.spine_ratio = _slider("spine_ratio", s.spine_ratio, 0.05, "Spine ratio r (untick adaptive to set it)",
                                   interactive=not s.auto_r)
        page.depth = _slider("depth", s.depth, 1, "Max depth D of the TR branches (the PLD spine and bypass chains "
                             "are not bounded by D)")
        page.bypass = gr.Checkbox(value=s.bypass, label="Bypass: verify the bare PLD chain when the anchor has no "
                                  "TR entry (chains are not bounded by D)")
        page.auto_c = gr.Checkbox(value=s.auto_c, label="GT principle auto: the speedup-optimal tree size from the "
                                  "measured cost curve")
        page.gt_threshold = _slider("gt_threshold", s.gt_threshold, 0.01,
                                    "GT threshold c (untick auto to set it; 0 = no pruning)", interactive=not s.auto_c)
    with gr.Accordion("Run and display", open=False):
        page.max_new_tokens = _slider("max_new_tokens", s.max_new_tokens, 1, "Max new tokens",
                                      high=options.max_new_tokens)
        page.pace = gr.Slider(0.0, 2.0, value=0.0, step=0.1, label="Slow motion (s pause per cycle)")
        page.show_ghosts = gr.Checkbox(value=Drawing.show_ghosts, label="Show GT-pruned candidates as ghosts")
        page.show_all = gr.Checkbox(value=Drawing.show_all, label="Draw every node (no +N / ⋯N folding; the tree "
                                    "grows taller than the screen)")
    with gr.Accordion("Sampling (temperature 0 = greedy)", open=False):
        page.temperature = _slider("temperature", s.temperature, 0.05, "Temperature")
        page.top_p = _slider("top_p", s.top_p, 0.05, "Top-p")
        page.top_k = _slider("top_k", s.top_k, 1, "Top-k (0 = off)")
        page.seed = gr.Number(s.seed, precision=0, label="Seed")
        page.verifier = gr.Radio([("Tree walk (SpecInfer)", "tree"), ("HSD on chains", "hsd")], value=s.verifier,
                                 label="Verifier")
    page.command = gr.Textbox(label="The last run as a command", lines=2, buttons=["copy"], interactive=False,
                              elem_id="settings", info="It carries the prompt and the cost curve the run read: "
                              "the same trees anywhere.")


def _model_and_trace_files(page: Page, first: LoadedModel, options: PageOptions) -> None:
    with gr.Accordion("Model", open=False):
        page.model_name = gr.Textbox(first.name, label=f"Model: one of {', '.join(options.allowed_models)}"
                                     if options.public else "Model: smollm2, demo, a hub id, a local folder or "
                                                            ".gguf file")
        with gr.Row():
            page.device = gr.Dropdown(["auto", "cpu", "cuda"], value="auto", label="Device")
            page.dtype = gr.Dropdown(DTYPE_CHOICES, value="auto", label="Dtype (fp32 is exact; auto measures)")
        page.load_btn = gr.Button("Load model")
        page.model_status = gr.Markdown(using_words(first), elem_id="model-status")
    with gr.Accordion("Trace file: export the last run, or replay one", open=False):
        page.export_btn = gr.Button("Export trace (JSON)")
        page.export_file = gr.File(label="Exported trace", interactive=False, elem_id="export-trace")
        page.import_file = gr.File(label="Import a trace (.json) to replay it", file_types=[".json"],
                                   type="filepath", elem_id="import-trace")
    with gr.Accordion("How to read this", open=False):
        gr.Markdown(HOW_TO_READ)
    gr.Markdown("Presets: " + "; ".join(f"{p['label']} ({p['license']})" for p in PRESETS), elem_classes=["small"])


def _run_views(page: Page) -> None:
    """The numbers, the tree, its sentence, the scrubber, the output and the speed chart."""
    with gr.Row(equal_height=True):
        page.big = gr.HTML(big_numbers(None), elem_id="big-numbers")
        page.stats = gr.Markdown("Press **Generate**: the prompt box holds a preset.", elem_id="stats")
    page.tree_plot = gr.Plot(placeholder_figure(), label="Draft tree of the latest cycle", show_label=False,
                             elem_id="draft-tree")  # a figure at load: the browser loads plotly before the click
    page.explain = gr.Markdown(elem_id="explain")
    with gr.Row(equal_height=True):
        page.back_btn = gr.Button("◀", scale=0, min_width=48, elem_id="cycle-back")
        page.scrubber = gr.Slider(0, 1, value=0, step=1, label="Cycle (drag, arrow keys, or type a number)",
                                  elem_id="cycle-scrubber")
        page.fwd_btn = gr.Button("▶", scale=0, min_width=48, elem_id="cycle-forward")
        page.step_btn = gr.Button("Step through", scale=0, min_width=110, elem_id="step-through")
        page.full_btn = gr.Button("Full screen", scale=0, min_width=90, elem_id="tree-fullscreen")
    page.output = gr.HighlightedText(label="Output so far, coloured by the source of each token (click a token to "
                                           "see its cycle)", color_map=COLOR_MAP, show_legend=True,
                                     combine_adjacent=False, elem_id="output")
    page.speed_plot = gr.Plot(label="Speed and τ per cycle", elem_id="speed-chart")
    with gr.Accordion("Theory: Proposition 1's expected yield vs the measured τ", open=False):
        page.theory = gr.Markdown(theory_panel(None, None, INITIAL.budget, INITIAL.depth), elem_id="theory")


def _race_and_cost_views(page: Page, first: LoadedModel) -> None:
    with gr.Accordion("Race: AR and the chosen method on one device, one clock", open=False):
        with gr.Row():
            page.race_btn = gr.Button("Race", variant="primary")
            page.race_seconds = gr.Slider(0, 60, value=RACE_SECONDS, step=1, label="Race length on screen: about N s "
                                          "(engine time scaled, proportions kept; 0 = real time)",
                                          elem_id="race-seconds")
        page.race_board = gr.HTML(elem_id="race-board")
        with gr.Row():
            page.race_ar = gr.Textbox(label="AR", lines=8, interactive=False, elem_id="race-ar")
            page.race_spec = gr.Textbox(label="Chosen method", lines=8, interactive=False, elem_id="race-spec")
    with gr.Accordion("Sweep: one parameter, many values, one prompt", open=False, elem_id="sweep"):
        with gr.Row():
            page.sweep_param = gr.Dropdown(SWEEP_CHOICES, value="budget", label="Parameter", scale=1)
            page.sweep_values = gr.Textbox("4,8,16,32,64,128", label="Values (comma-separated; sources: pld+tr, …)",
                                           scale=2)
            page.sweep_btn = gr.Button("Sweep", variant="primary", scale=0, min_width=90)
            page.sweep_stop = gr.Button("Stop", variant="stop", scale=0, min_width=70)
        page.sweep_status = gr.Markdown("Runs the prompt once per value, the other settings as set above; AR is "
                                        "timed once. Pick a run below to open it in the tree viewer.",
                                        elem_id="sweep-status")
        page.sweep_plot = gr.Plot(show_label=False, elem_id="sweep-plot")
        page.sweep_open = gr.Radio([], label="Open a run in the tree viewer (or click its point)",
                                  elem_id="sweep-open")
    with gr.Accordion("Verification cost curve and the GT principle", open=False):
        page.cost_plot = gr.Plot(cost_figure(cached_cost_curve(first.model), INITIAL.budget), show_label=False,
                                 elem_id="cost-curve")
        page.remeasure = gr.Button("Re-measure on this device (for your session only)")


# ---------------------------------------------------------------- the page's events

def _wire_runs(page: Page, models: ModelRegistry) -> None:
    """Generate, Race and Stop: the runs that hold the model (one at a time, counted by a ``RunBoard``).  While a
    run waits in line, the words saying so stay readable: the queue's progress shows on the tree (Generate) and
    the race's text boxes (Race), not over them."""
    board = RunBoard()
    waiting = lambda: board.waiting_words()  # noqa: E731
    model_bound = dict(around=board.wrap, concurrency_limit=1, concurrency_id="model")
    back = ("memory",) if ZERO_GPU else ()  # ZeroGPU: the worker's copy of the visitor's memory comes back
    page.go_btn.click(waiting, None, page.stats, queue=False, api_visibility="private")  # at once, beside the run:
    wire(page.go_btn.click, gpu_handler(generate, models, generate_gpu_seconds), page,
         inputs=("settings", "drawing", "pace", "session"), outputs=GENERATE_OUT + back, api_name="generate",
         show_progress_on=[page.tree_plot], **model_bound)  # its first frame replaces the waiting words
    page.race_btn.click(waiting, None, page.race_board, queue=False, api_visibility="private")
    wire(page.race_btn.click, gpu_handler(race, models, race_gpu_seconds), page,
         inputs=("settings", "race_seconds", "session"), outputs=RACE_OUT + back, api_name="race",
         show_progress_on=[page.race_ar, page.race_spec], **model_bound)
    wire(page.stop_btn.click, request_stop, page, inputs=("control",), queue=False, api_visibility="private")
    page.sweep_btn.click(waiting, None, page.sweep_status, queue=False, api_visibility="private")
    wire(page.sweep_btn.click, gpu_handler(sweep, models, sweep_gpu_seconds), page,
         inputs=("settings", "sweep_param", "sweep_values", "session"), outputs=SWEEP_OUT, api_name="sweep",
         show_progress_on=[page.sweep_plot], **model_bound)
    wire(page.sweep_stop.click, request_stop, page, inputs=("control",), queue=False, api_visibility="private")


def _wire_cycles(page: Page, models: ModelRegistry) -> None:
    """The scrubber, its buttons, the drawing toggles, token clicks, step-through and trace files."""
    for trigger, step in ((page.scrubber.input, 0), (page.back_btn.click, -1), (page.fwd_btn.click, 1),
                          (page.show_ghosts.input, 0), (page.show_all.input, 0)):
        wire(trigger, show_cycle, page, inputs=("run", "scrubber", "drawing", "model_key"), outputs=CYCLE_OUT,
             fixed={"step": step, "models": models}, api_visibility="private", trigger_mode="always_last")
        # typed values and arrow keys fire input too; the output sets the slider without firing it again

    def token_clicked(run, show_ghosts, show_all, model_key, evt: gr.SelectData):  # gradio injects evt by type
        return page.keyed(jump_to_token(run, evt.index, Drawing(show_ghosts, show_all), model_key, models=models))

    page.output.select(token_clicked, [page.run, page.show_ghosts, page.show_all, page.model_key],
                       [page[n] for n in CYCLE_OUT], api_visibility="private")
    wire(page.step_btn.click, step_through, page, inputs=("run", "scrubber", "drawing", "session"),
         outputs=("scrubber", "tree_plot", "explain", "output"), fixed={"models": models}, api_name="step_through")
    wire(page.export_btn.click, export_trace, page, inputs=("run", "model_key"), outputs=("export_file",),
         fixed={"models": models}, api_visibility="private")
    wire(page.import_file.upload, import_trace, page, inputs=("import_file", "drawing", "model_key"),
         outputs=IMPORT_OUT, fixed={"models": models}, api_name="import_trace")
    wire(page.sweep_open.input, open_sweep_run, page, inputs=("sweep_open", "sweep_state", "drawing", "model_key"),
         outputs=(*GENERATE_OUT, "header"), fixed={"models": models}, api_visibility="private")


def _wire_settings_and_models(page: Page, models: ModelRegistry, options: PageOptions) -> None:
    """Presets, the adaptive r / auto c switches, the model picker, the cost curve, dark mode, full screen."""
    wire(page.preset.input, preset_fields, page, inputs=("preset",), outputs=("prompt", "prompt_format"),
         api_visibility="private")
    page.auto_r.input(lambda a: gr.Slider(interactive=not a), page.auto_r, page.spine_ratio, api_visibility="private")
    page.auto_c.input(lambda a: gr.Slider(interactive=not a), page.auto_c, page.gt_threshold, api_visibility="private")
    wire(page.load_btn.click, load_other_model, page, inputs=("model_name", "device", "dtype", "model_key"),
         outputs=("model_status", "model_key", "header", "prompt_format"), fixed={"models": models, "options": options},
         api_name="load_model", concurrency_id="load", concurrency_limit=1)
    # (its own queue: a slow load never delays another visitor's Generate)
    wire(page.remeasure.click, gpu_handler(remeasure_curve, models, REMEASURE_S), page,
         inputs=("budget", "model_key"), outputs=("curve", "cost_plot", "lesson"), api_visibility="private",
         concurrency_id="model", concurrency_limit=1)
    # a number typed outside a slider's range: gr.Slider's own check (its preprocess) would raise a red "Error"
    # toast while the box kept the number, so these two read the raw values (preprocess=False) and bring it back
    wire(page.budget.change, cost_plot_for, page, inputs=("budget", "model_key", "curve"), outputs=("cost_plot",),
         fixed={"models": models}, api_visibility="private", preprocess=False)
    for name in RANGES:  # at once, with a sentence (queued: toasts show only from the queue; it holds no model)
        box = page[name]
        box.input(lambda value, n=name: _or_skip(keep_in_range(value, name=n, cap=options.max_new_tokens)), box, box,
                  api_visibility="private", show_progress="hidden", concurrency_limit=None, preprocess=False)
    page.dark_btn.click(None, js=TOGGLE_DARK)
    page.full_btn.click(None, js=FULLSCREEN)


def _or_skip(value):
    """``value``, or gradio's "leave the component as it is" for None."""
    return gr.skip() if value is None else value


def placeholder_figure():
    """The tree area before the first run: says what will appear there."""
    fig = go.Figure()
    fig.add_annotation(text="Press <b>Generate</b>: each cycle's draft tree appears here.<br>"
                            "<b>Step through</b> then plays one cycle stage by stage.",
                       showarrow=False, font=dict(size=18), x=0.5, y=0.5, xref="paper", yref="paper")
    fig.update_layout(height=450, xaxis=dict(visible=False), yaxis=dict(visible=False),
                      paper_bgcolor="rgba(0,0,0,0)", plot_bgcolor="rgba(0,0,0,0)", margin=dict(l=10, r=10, t=40, b=64))
    return fig


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="goose-lens: visual debugger for training-free speculative decoding")
    ap.add_argument("--model", default=None,
                    help="smollm2 (default, fetched once), demo (embedded, offline), a hub id, a local folder or "
                         ".gguf file; $GOOSE_LENS_MODEL sets the default")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--host", default=None, help="default: $GRADIO_SERVER_NAME, else 127.0.0.1 (a Space sets it)")
    ap.add_argument("--port", type=int, default=None, help="default: $GRADIO_SERVER_PORT, else 7860")
    ap.add_argument("--share", action="store_true", help="create a public gradio.live link")
    ap.add_argument("--public", action="store_true", help="public mode (also when $SPACE_ID is set): allowlisted "
                    f"models only (${ALLOWED_ENV}), capped runs, per-visitor cost-curve re-measure")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        lm, notice = load_start_model(args.model, device=args.device, dtype=args.dtype)
    except ModelLoadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if notice:
        print(notice, file=sys.stderr)
    options = PageOptions.from_env(args.public or args.share, notice)
    demo = build_demo(place_models(lm, options), options)  # warmed up (on ZeroGPU: on the GPU, every allowed model)
    demo.queue(default_concurrency_limit=1).launch(server_name=args.host, server_port=args.port, share=args.share,
                                                   css=CSS, theme=gr.themes.Soft(), max_file_size=MAX_BYTES)
    return 0


if __name__ == "__main__":
    sys.exit(main())
