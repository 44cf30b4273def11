"""goose-lens: a Gradio page that streams speculative decoding and draws every cycle's draft tree.

    python app.py [--model smollm2|demo|ID|PATH] [--device auto|cpu|cuda] [--dtype auto|fp32|fp16|bf16]
                  [--host 127.0.0.1] [--port 7860] [--share] [--public]

This file only wires the engine (``engine/``) to the figures (``viz/``); it holds no algorithm.
Per-user data (the recorded run, the chosen model) lives in ``gr.State``; loaded weights are shared
read-only through ``engine.loading.ModelRegistry``.  On a Hugging Face Space the ``spaces`` package
is present and the model-bound handlers run under ``@spaces.GPU``; elsewhere they run as they are.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, fields
from functools import partial, wraps
from pathlib import Path

import gradio as gr
import plotly.graph_objects as go

from engine.config import ConfigError, DecodeConfig
from engine.cost import cached_cost_curve, curve_key, measure_cost_curve
from engine.decode import SpecDecoder
from engine.loading import DEMO_MODEL, LoadedModel, ModelLoadError, ModelRegistry, load_model, tqdm_progress
from engine.metrics import summarize
from engine.models import DEMO_NAMES, NAMED, SMOLLM2
from engine.trace_io import MAX_BYTES, TraceFormatError, export_run, load_run
from viz.charts import cost_figure, speed_figure
from viz.explain import TOKEN_COLORS, big_numbers, cycle_segments, explain_cycle, theory_panel
from viz.lesson import WHAT_IS_IT, stage_sentence, stages_of
from viz.tree_figure import tree_figure

try:  # Hugging Face Spaces (ZeroGPU): run model-bound handlers on a GPU; a no-op everywhere else
    import spaces

    on_gpu = spaces.GPU
except ImportError:
    def on_gpu(fn):
        return fn

PRESETS = json.loads((Path(__file__).parent / "assets" / "presets.json").read_text(encoding="utf-8"))
LIGHT_EVERY_S = 0.2  # the output text, numbers and scrubber redraw at most this often while decoding ...
HEAVY_EVERY_S = 0.5  # ... the tree, speed chart, explanation and theory panel at most this often (and always at
# the first cycles and the end) ...
DRAW_SHARE = 0.03  # ... and each kind of frame takes at most this share of the wall time (its cost, from building
# it to the page taking it, sets its next gap): drawing never holds the engine for long, and is not engine time
STEP_PAUSE_S = 2.5  # step-through: seconds each stage of a cycle stays on screen
CSS = """
#page-header p {margin: .1em 0}
#stats {font-size: 1.0em}
#big-numbers {margin: 0}
#draft-tree {min-height: 450px}
#explain p {margin: .1em 0}
.dark #draft-tree svg text {fill: #e5e7eb !important}
#draft-tree:fullscreen {background: var(--body-background-fill); display: flex; align-items: center;
  justify-content: center; width: 100vw; height: 100vh}
#draft-tree:fullscreen .js-plotly-plot {width: var(--tree-w) !important; flex: none;
  transform: scale(var(--tree-zoom, 1)); transform-origin: center center}
"""
TOGGLE_DARK = "() => { document.body.classList.toggle('dark'); }"
#: full screen: the tree's block fills the screen and its figure, kept at its page size, is scaled up to fill it
#: (labels grow with it; a new cycle's figure keeps the scale)
FULLSCREEN = """() => { const e = document.getElementById('draft-tree'); if (!e) return;
  const plot = e.querySelector('.js-plotly-plot'); if (!plot) return;
  const w = plot.offsetWidth, h = plot.offsetHeight;
  e.style.setProperty('--tree-w', w + 'px');
  e.style.setProperty('--tree-zoom', Math.min(screen.width / w, screen.height / h).toFixed(3));
  e.requestFullscreen(); }"""

METHOD_LABELS = {"goose": "Goose (spine tree of the chosen sources)", "pld": "PLD only (chain)",
                 "tr": "TR only (tree)", "ptd": "PTD only (progressive tree drafting)",
                 "iso3": "Iso(3): balanced 3-ary tree", "iso5": "Iso(5): balanced 5-ary tree", "ar": "AR (no drafting)"}
SOURCE_CHOICES = [("PLD spine", "pld"), ("TR branch", "tr"), ("PTD perturbation", "ptd")]
PROMPT_FORMATS = [("Chat template (one user turn)", "chat"), ("Raw completion prompt", "raw")]
SHOWN = "▶ shown cycle"  # output label of the tokens the cycle on screen committed
COLOR_MAP = {**TOKEN_COLORS, SHOWN: "#c4b5fd"}

HOW_TO_READ = f"""
* **The tree** is one verification forward. The root is the *anchor* (the last committed token); each node
  is a draft token, coloured by its source: **PLD spine** (copied from an earlier n-gram match), **TR branch**
  (Token Recycling adjacency table), **PTD perturbation** (progressive tree drafting pool). Depth grows to
  the right. Hover a node for its token, score, estimated acceptance and, for a rejected node, the token the
  model wanted in its place.
* **The thick violet path** is what the model accepted; the **star** is the bonus token the model adds itself.
  Faded nodes were rejected; ghost nodes were never verified (the GT principle judged them not worth a row).
  **+N** folds N rejected nodes and **⋯N** N tokens of a straight chain, so the tree fits the screen: hover
  them for their tokens.
* **Max depth D** bounds the TR branches only. The PLD spine copies up to {DecodeConfig().max_spine} tokens of a
  match, a confident match is extended further (up to {DecodeConfig().max_extended_chain} × its confidence), and
  **bypass chains** likewise: none of them is bounded by D.
* **τ** is tokens committed per verification forward (AR = 1). **tokens/s** counts engine time only: the
  time the page spends drawing is not counted.
* **The scrubber** (◀ ▶, drag, arrow keys or a typed number) steps through every recorded cycle; clicking a
  token in the output jumps to its cycle, and the tokens of the cycle on screen are marked {SHOWN!r}.
* **Greedy** (temperature 0) output is token-for-token the output of plain AR decoding; **sampling** output
  has exactly the distribution of plain AR sampling.
"""


def check_inputs(lm: LoadedModel, prompt: str, budget, max_new_tokens,
                 prompt_format: str = "chat") -> tuple[list[int] | None, str | None]:
    """Prompt ids (``prompt_format`` 'chat': through the chat template when the model has one; 'raw': as is),
    or a message saying what is wrong with the input (shown in the page, never raised)."""
    if not prompt or not prompt.strip():
        return None, "The prompt is empty: type one or pick a preset."
    if max_new_tokens is None or int(max_new_tokens) <= 0:
        return None, "Max new tokens must be at least 1."
    if budget is None or int(budget) < 1:
        return None, "The node budget B must be at least 1 (B counts the anchor, so B = 1 means plain AR)."
    ids = lm.encode_prompt(prompt, chat=prompt_format != "raw")
    problem = lm.context_problem(len(ids), int(max_new_tokens))
    return (None, problem) if problem else (ids, None)


def make_config(method, budget, auto_r, spine_ratio, depth, auto_c, gt_threshold, max_new_tokens, bypass,
                sources=("pld", "tr"), temperature=0.0, top_p=1.0, top_k=0, seed=0, verifier="tree") -> DecodeConfig:
    """The page's settings as a ``DecodeConfig``. Raises ``ConfigError`` with a message for the user."""
    return DecodeConfig(method=method, budget=int(budget), max_depth=int(depth),
                        spine_ratio=None if auto_r else float(spine_ratio),
                        gt_threshold="auto" if auto_c else float(gt_threshold), max_new_tokens=int(max_new_tokens),
                        bypass=bool(bypass), sources=tuple(sources or ()), temperature=float(temperature or 0.0),
                        top_p=float(top_p or 1.0), sample_top_k=int(top_k or 0), seed=int(seed or 0),
                        verifier=verifier or "tree")


def config_of(data: dict) -> DecodeConfig:
    """A recorded run's ``DecodeConfig.to_dict()`` (lists from JSON made tuples) back as a ``DecodeConfig``.
    Raises ``ConfigError`` / ``TypeError`` when the record does not make a valid config."""
    names = {f.name for f in fields(DecodeConfig)}
    return DecodeConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in names})


def used_format(lm: LoadedModel, prompt_format: str) -> str:
    """'chat' or 'raw': what the prompt really went through (a model without a chat template gets it raw)."""
    return "chat" if prompt_format != "raw" and lm.has_chat_template else "raw"


def settings_string(model: str, cfg: DecodeConfig, prompt_format: str = "chat", curve=None) -> str:
    """One copyable command line that reproduces the run (``python -m engine.generate``); with GT "auto" it
    carries the cost curve the run read (``curve``, its exact spec), so the trees are the same anywhere."""
    args = ["python", "-m", "engine.generate", "--model", model, "--prompt-format", prompt_format]
    args += ["--method", cfg.method, "--budget", str(cfg.budget), "--depth", str(cfg.max_depth),
             "--gt-threshold", repr(cfg.gt_threshold) if isinstance(cfg.gt_threshold, float) else str(cfg.gt_threshold),
             "--max-new-tokens", str(cfg.max_new_tokens), "--sources", ",".join(cfg.sources)]  # exact c: repr
    if cfg.spine_ratio is not None:
        args += ["--spine-ratio", f"{cfg.spine_ratio:g}"]
    if not cfg.bypass:
        args.append("--no-bypass")
    if cfg.sampling:
        args += ["--temperature", f"{cfg.temperature:g}", "--top-p", f"{cfg.top_p:g}", "--top-k", str(cfg.sample_top_k),
                 "--seed", str(cfg.seed), "--verifier", cfg.verifier]
    if curve is not None and cfg.gt_threshold == "auto":
        args += ["--cost-curve", curve.spec()]
    return shlex.join(args) + " --prompt-file PROMPT.txt"


FORMAT_NAMES = {"chat": "prompt through the chat template", "raw": "raw completion prompt"}


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


def stats_line(summary, trace, gt_threshold, prompt_format: str | None = None) -> str:
    src = summary.accepted_by_source
    rows = f" (+{trace.ptd_rows} PTD rows)" if trace.ptd_rows else ""
    sent = f" · {FORMAT_NAMES[prompt_format]}" if prompt_format in FORMAT_NAMES else ""
    return (f"**τ {summary.tau:.2f}** · **{summary.tok_per_s:.1f} tok/s** · {summary.cycles} cycles · "
            f"{summary.new_tokens} tokens — by source: PLD {src['pld']} · TR {src['tr']} · PTD {src['ptd']} · "
            f"bonus {src['bonus']} · cycle {trace.index}: {trace.mode}, {len(trace.tree)} nodes{rows}, "
            f"{len(trace.new_tokens)} tokens, r = {trace.spine_ratio if trace.spine_ratio is not None else '–'}, "
            f"{gt_words(gt_threshold, trace)}{sent}")


def token_text_of(run: dict, lm: LoadedModel):
    """Token id -> text: the run's own table for an imported run, else the loaded tokenizer."""
    if run.get("token_text") is not None:
        table = run["token_text"]
        return lambda i: table.get(i, f"<{i}>")
    return lambda i: lm.tokenizer.decode([i])


def views(run: dict, trace, lm: LoadedModel, show_ghosts: bool, summary_upto: int | None = None,
          show_all: bool = False) -> tuple:
    """(tree figure, big numbers, stats line, explanation, theory panel) of ``trace`` within ``run``; the
    numbers summarise the run up to cycle ``summary_upto`` (default: ``trace``'s cycle); ``show_all`` draws
    every node of the tree (no folding)."""
    text = token_text_of(run, lm)
    upto = trace.index if summary_upto is None else summary_upto
    summary = summarize(run["traces"][: upto + 1])  # traces[k].index == k
    cfg = run["config"]
    return (tree_figure(trace, text, show_ghosts=bool(show_ghosts), show_all=bool(show_all)), big_numbers(summary),
            stats_line(summary, trace, cfg.get("gt_threshold"), run.get("prompt_format")),
            explain_cycle(trace, text),
            theory_panel(summary, trace, int(cfg.get("budget", 60)), int(cfg.get("max_depth", 6))))


def marked_output(run: dict, shown: int | None) -> list[tuple[str, str]]:
    """The run's output segments, the tokens committed by cycle ``shown`` labelled ``SHOWN``."""
    return [(text, SHOWN if cycle == shown else label)
            for (text, label), cycle in zip(run["segments"], run["token_cycles"])]


def session_curve(curve, lm: LoadedModel):
    """The visitor's own re-measured cost curve when it belongs to ``lm`` (else None: the shared curve)."""
    return curve if curve is not None and curve.key == curve_key(lm.model) else None


def _paused(seconds: float, control: dict) -> None:
    """Sleep ``seconds`` (slow motion), waking early when Stop is pressed."""
    end = time.perf_counter() + seconds
    while not control.get("stop") and time.perf_counter() < end:
        time.sleep(min(0.05, max(0.0, end - time.perf_counter())))


@on_gpu
def generate(prompt, method, budget, auto_r, spine_ratio, depth, auto_c, gt_threshold, max_new_tokens, bypass, pace,
             show_ghosts, run, sources=("pld", "tr"), temperature=0.0, top_p=1.0, top_k=0, seed=0, verifier="tree",
             model_key=None, prompt_format="chat", control=None, curve=None, show_all=False, *, models: ModelRegistry):
    """Stream (output, tree, speed, stats, run, scrubber, explanation, big numbers, theory, settings) while decoding.

    ``control`` is the visitor's ``{"stop": bool}`` (the Stop button sets it; the run ends after the current
    cycle and keeps its output); ``curve`` the visitor's own re-measured cost curve, if any; ``show_all`` draws
    every node of each tree.  Drawing is
    throttled (``LIGHT_EVERY_S``, ``HEAVY_EVERY_S``) and never counted as engine time.
    """
    control = control if control is not None else {}
    control["stop"] = False
    lm = models.get(model_key)
    ids, problem = check_inputs(lm, prompt, budget, max_new_tokens, prompt_format)
    if problem is None:
        try:
            config = make_config(method, budget, auto_r, spine_ratio, depth, auto_c, gt_threshold, max_new_tokens,
                                 bypass, sources, temperature, top_p, top_k, seed, verifier)
        except ConfigError as exc:
            problem = str(exc)
    if problem is not None:
        gr.Warning(problem)
        yield (gr.skip(),) * 3 + (f"⚠️ {problem}", run) + (gr.skip(),) * 5
        return
    last_light = last_heavy = 0.0  # when each kind of frame was last drawn ...
    light_gap, heavy_gap = LIGHT_EVERY_S, HEAVY_EVERY_S  # ... and the wait before the next one
    try:
        decoder = SpecDecoder(lm.model, config, lm.eos_token_ids, cost_curve=session_curve(curve, lm))
        sent = used_format(lm, prompt_format)
        new_run = {"model": lm.name, "prompt": prompt, "prompt_format": sent, "config": decoder.config.to_dict(),
                   "traces": [], "token_cycles": [], "segments": [], "token_text": None}
        # token_cycles: the cycle of every output token; segments: (text, source label) of every output token
        text = token_text_of(new_run, lm)
        command = settings_string(lm.name, decoder.config, sent, decoder.cost_curve)
        trace = drawn = None  # drawn: the last cycle whose tree is on screen
        for trace in decoder.generate(ids, should_stop=lambda: bool(control.get("stop"))):
            new_run["traces"].append(trace)
            new_run["segments"].extend(cycle_segments(trace, text))
            new_run["token_cycles"].extend([trace.index] * len(trace.new_tokens))
            now = time.perf_counter()
            heavy = trace.index <= 1 or trace.finished or bool(pace) or now - last_heavy >= heavy_gap
            if not heavy and now - last_light < light_gap:
                continue
            yield _frame(new_run, trace, lm, (show_ghosts, show_all), command, heavy)
            last_light = time.perf_counter()
            if heavy:
                last_heavy, drawn = last_light, trace
                heavy_gap = max(HEAVY_EVERY_S, (last_light - now) / DRAW_SHARE)
            else:
                light_gap = max(LIGHT_EVERY_S, (last_light - now) / DRAW_SHARE)
            if pace:
                _paused(float(pace), control)
        if trace is not None and drawn is not trace:
            # stopped, or throttled: the last cycle drawn in full
            yield _frame(new_run, trace, lm, (show_ghosts, show_all), command, True)
    except Exception as exc:  # noqa: BLE001 - keep serving; the user sees why this run stopped
        yield (gr.skip(),) * 3 + (f"⚠️ generation stopped: {type(exc).__name__}: {exc}", run) + (gr.skip(),) * 5


def _frame(run: dict, trace, lm: LoadedModel, shown: tuple[bool, bool], command: str, heavy: bool) -> tuple:
    """One streamed update of ``generate``; the tree, speed chart, explanation and theory only when ``heavy``;
    ``shown``: (show ghosts, show every node)."""
    skip = gr.skip()
    tree, big, stats, explanation, theory = views(run, trace, lm, shown[0], show_all=shown[1]) if heavy else \
        (skip, None, None, skip, skip)
    if not heavy:
        summary = summarize(run["traces"])
        big, stats = big_numbers(summary), stats_line(summary, trace, run["config"].get("gt_threshold"),
                                                      run.get("prompt_format"))
    scrubber = gr.Slider(maximum=max(1, trace.index), value=trace.index)
    return (list(run["segments"]), tree, speed_figure(run["traces"]) if heavy else skip, stats, run, scrubber,
            explanation, big, theory, command)


def show_cycle(run, index, show_ghosts, step: int = 0, model_key=None, show_all=False, *, models: ModelRegistry):
    """Scrubber: (cycle, tree, explanation, theory, output with that cycle's tokens marked) for recorded cycle
    ``index + step``."""
    if not run or not run["traces"]:
        return (gr.skip(), gr.skip(), "Generate first: the scrubber steps through the cycles of the last run.",
                gr.skip(), gr.skip())
    k = max(0, min(int(index or 0) + int(step), len(run["traces"]) - 1))
    tree, _, _, explanation, theory = views(run, run["traces"][k], models.get(model_key), show_ghosts,
                                            show_all=show_all)
    return k, tree, explanation, theory, marked_output(run, k)


def step_through(run, index, show_ghosts, model_key=None, control=None, show_all=False, *, models: ModelRegistry,
                 pause: float = STEP_PAUSE_S):
    """Play one cycle in stages (``viz.lesson``): the drafts by source, the one forward that scores them, the
    walk, the bonus.  Streams (cycle, tree, sentence, output with the cycle's tokens marked).  The cycle is
    the scrubber's, or the first drafted cycle after it when it had no drafts (prefill, AR step)."""
    if not run or not run["traces"]:
        yield gr.skip(), gr.skip(), "Generate first: then **Step through** plays one of its cycles in stages.", \
            gr.skip()
        return
    control = control if control is not None else {}
    control["stop"] = False
    traces = run["traces"]
    k = max(0, min(int(index or 0), len(traces) - 1))
    drafted = [t.index for t in traces if t.mode in ("tree", "bypass")]
    if traces[k].mode not in ("tree", "bypass") and drafted:
        k = next((i for i in drafted if i >= k), drafted[-1])
    trace, text = traces[k], token_text_of(run, models.get(model_key))
    for stage in stages_of(trace):
        if control.get("stop"):
            return
        last = stage == "bonus"
        yield (k, tree_figure(trace, text, show_ghosts=bool(show_ghosts), stage=stage, show_all=bool(show_all)),
               stage_sentence(trace, stage, text),
               marked_output(run, k) if last else gr.skip())
        if not last:
            _paused(pause, control)


def jump_to_token(run, show_ghosts, evt: gr.SelectData, model_key=None, show_all=False, *, models: ModelRegistry):
    """Clicking an output token shows the cycle that produced it."""
    if not run or not isinstance(evt.index, int) or not 0 <= evt.index < len(run.get("token_cycles", [])):
        return (gr.skip(),) * 5
    return show_cycle(run, run["token_cycles"][evt.index], show_ghosts, model_key=model_key, show_all=show_all,
                      models=models)


def export_trace(run, model_key=None, *, models: ModelRegistry):
    """Write the last run as a versioned JSON trace (docs/trace-schema.md); returns its path for download."""
    if not run or not run["traces"]:
        gr.Warning("Nothing to export yet: generate (or import) a run first.")
        return None
    doc = export_run(model=run["model"], prompt=run["prompt"], config=run["config"], traces=run["traces"],
                     token_text=token_text_of(run, models.get(model_key)), prompt_format=run.get("prompt_format"))
    path = Path(tempfile.mkdtemp(prefix="goose-lens-")) / f"goose-lens-trace-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(doc, encoding="utf-8")
    return str(path)


def import_trace(file, run, show_ghosts, model_key=None, show_all=False, *, models: ModelRegistry):
    """Replay an exported trace with no model run; a bad file leaves the current run untouched.

    Shows the run's own numbers (every cycle summarised), its last cycle, its prompt, prompt format and the
    settings string that reproduces it.  Streams (output, tree, speed, stats, run, scrubber, explanation, big
    numbers, theory, import box, prompt, prompt format, settings)."""
    if not file:
        return (gr.skip(),) * 13
    try:
        if os.path.getsize(file) > MAX_BYTES:
            raise TraceFormatError(f"the file is larger than {MAX_BYTES // 2**20} MB")
        loaded = load_run(Path(file).read_bytes())
    except (OSError, TraceFormatError) as exc:
        message = f"Could not import the trace: {exc}"
        gr.Warning(message)
        return (gr.skip(),) * 3 + (f"⚠️ {message}", run) + (gr.skip(),) * 4 + (None,) + (gr.skip(),) * 3
    new_run = {**loaded, "token_cycles": [t.index for t in loaded["traces"] for _ in t.new_tokens]}
    text = token_text_of(new_run, None)
    new_run["segments"] = [seg for t in new_run["traces"] for seg in cycle_segments(t, text)]
    last = new_run["traces"][-1]
    tree, big, stats, explanation, theory = views(new_run, last, None, show_ghosts, show_all=show_all)
    stats = (f"Imported trace of `{new_run['model']}` ({len(new_run['traces'])} cycles), replayed with no model: "
             + stats)
    try:
        command = settings_string(new_run["model"], config_of(new_run["config"]),
                                  new_run.get("prompt_format") or "auto")
    except (ConfigError, TypeError, ValueError) as exc:
        command = f"(the trace's settings do not make a valid config here: {exc})"
    fmt = new_run.get("prompt_format") if new_run.get("prompt_format") in FORMAT_NAMES else gr.skip()
    return (marked_output(new_run, last.index), tree, speed_figure(new_run["traces"]), stats, new_run,
            gr.Slider(maximum=max(1, len(new_run["traces"]) - 1), value=last.index), explanation, big, theory, None,
            new_run.get("prompt", ""), fmt, command)


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

    @classmethod
    def from_env(cls, public: bool = False, notice: str | None = None) -> PageOptions:
        """Public when ``public`` or ``$SPACE_ID`` is set; the allowlist from ``$GOOSE_LENS_ALLOWED_MODELS``."""
        if not (public or os.environ.get("SPACE_ID")):
            return cls(notice=notice)
        listed = [canonical_model_name(n) for n in os.environ.get(ALLOWED_ENV, "").split(",") if n.strip()]
        return cls(public=True, allowed_models=tuple(listed) or cls.allowed_models, max_new_tokens=512,
                   notice=notice)

    def refusal(self, name: str) -> str | None:
        """Why this page will not load ``name``, or None when it may."""
        if self.public and canonical_model_name(name) not in self.allowed_models:
            return (f"This public page loads only these models: {', '.join(self.allowed_models)} "
                    f"(run goose-lens yourself to load any other).")
        return None


def load_other_model(name, device, dtype, model_key, *, models: ModelRegistry, options: PageOptions = PageOptions()):
    """Model picker: yields progress lines (a named model's fetch and conversion step by step), then the new
    model's key; on failure keeps the current model.  An empty name means the page's default model.
    In public mode a model outside the allowlist is refused before anything is looked up."""
    current = models.get(model_key)
    name = (name or "").strip() or models.get(None).name
    refusal = options.refusal(name)
    if refusal:
        gr.Warning(refusal)
        yield f"⚠️ {refusal} Still using {current.describe()}.", model_key
        return
    waiting = f"the current model {current.describe()} stays in use meanwhile"
    yield f"⏳ Loading `{name}` on {device} ({dtype}) … {waiting}.", model_key
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
            yield f"⏳ `{name}`: {step[1]} ({step[0]:.0%}) … {waiting}.", model_key
    if "error" in result:
        gr.Warning(str(result["error"]))
        yield f"⚠️ {result['error']}. Still using {current.describe()}.", model_key
        return
    lm = result["lm"]
    yield f"✅ Using {lm.describe()}, loaded in {time.perf_counter() - t0:.1f} s.", list(models.key_of(lm))


@on_gpu
def race(prompt, method, budget, auto_r, spine_ratio, depth, auto_c, gt_threshold, max_new_tokens, bypass,
         sources=("pld", "tr"), temperature=0.0, top_p=1.0, top_k=0, seed=0, verifier="tree", model_key=None,
         prompt_format="chat", slow_motion=0.0, control=None, curve=None, *, models: ModelRegistry):
    """AR vs the chosen method on one device and a shared clock: stream (AR text, method text, scoreboard).

    The two decoders run alternately, never at once: the one with less engine time so far runs its next
    forward, so both outputs are always shown as of (nearly) the same engine time, and each run is
    charged only for its own forwards.  ``slow_motion`` = k pauses k times each forward's engine time after
    it, so the race plays k + 1 times slower than it ran, in the same proportions; the scoreboard counts
    engine time only.  Stop (``control["stop"]``) ends both runs and keeps their outputs so far.
    """
    control = control if control is not None else {}
    control["stop"] = False
    lm = models.get(model_key)
    ids, problem = check_inputs(lm, prompt, budget, max_new_tokens, prompt_format)
    try:
        spec_cfg = make_config(method, budget, auto_r, spine_ratio, depth, auto_c, gt_threshold, max_new_tokens, bypass,
                               sources, temperature, top_p, top_k, seed, verifier) if problem is None else None
    except ConfigError as exc:
        problem = str(exc)
    if problem is not None:
        gr.Warning(problem)
        yield gr.skip(), gr.skip(), f"⚠️ {problem}"
        return
    stop = lambda: bool(control.get("stop"))  # noqa: E731
    cost = session_curve(curve, lm)
    runners = {"AR": SpecDecoder(lm.model, spec_cfg.with_(method="ar"), lm.eos_token_ids).generate(ids, stop),
               METHOD_LABELS[method]: SpecDecoder(lm.model, spec_cfg, lm.eos_token_ids, cost_curve=cost)
               .generate(ids, stop)}
    state = {name: {"tokens": [], "elapsed": 0.0, "forwards": 0, "done": False} for name in runners}
    last_draw = 0.0
    while not all(s["done"] for s in state.values()):
        name = min((n for n in runners if not state[n]["done"]), key=lambda n: state[n]["elapsed"])
        s = state[name]
        trace = next(runners[name], None)
        if trace is None:  # stopped: the decoder ended before its last cycle
            s["done"] = True
            if all(x["done"] for x in state.values()):
                yield _race_frame(lm, state, stopped=True)
            continue
        s["tokens"] += trace.new_tokens
        forward_s = trace.elapsed_s - s["elapsed"]
        s["elapsed"], s["forwards"], s["done"] = trace.elapsed_s, s["forwards"] + 1, trace.finished
        if slow_motion:
            _paused(float(slow_motion) * forward_s, control)
        finished = all(x["done"] for x in state.values())
        if time.perf_counter() - last_draw >= (0.05 if slow_motion else LIGHT_EVERY_S) or finished:
            last_draw = time.perf_counter()
            yield _race_frame(lm, state, stopped=finished and stop())


def _race_frame(lm: LoadedModel, state: dict, stopped: bool) -> tuple[str, str, str]:
    """(AR text, method text, scoreboard) of ``race``; speeds in engine time."""
    board = " · ".join(f"**{n}**: {len(x['tokens'])} tokens in {x['elapsed'] * 1000:.0f} ms engine time "
                       f"({len(x['tokens']) / max(x['elapsed'], 1e-9):.0f} tok/s, τ "
                       f"{len(x['tokens']) / max(1, x['forwards']):.2f}){' ✓' * (x['done'] and not stopped)}"
                       for n, x in state.items())
    ar, spec = state.values()
    if stopped:
        board += " — stopped: both outputs as of the same engine time"
    elif ar["done"] and spec["done"]:
        board += f" — speedup **{ar['elapsed'] / max(spec['elapsed'], 1e-9):.2f}×**"
    return lm.tokenizer.decode(ar["tokens"]), lm.tokenizer.decode(spec["tokens"]), board


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


def build_demo(lm: LoadedModel | ModelRegistry, options: PageOptions = PageOptions()) -> gr.Blocks:
    """The page. Per-user data lives in ``gr.State``; models are shared read-only through the registry.

    First screen at 1280×800: prompt and Generate on the left, the tree, its sentence and the scrubber
    on the right; settings wait in closed accordions below the prompt."""
    models = lm if isinstance(lm, ModelRegistry) else ModelRegistry(lm)
    first, notice = models.get(None), options.notice
    board = RunBoard()
    preset0 = start_preset(first)
    with gr.Blocks(title="goose-lens") as demo:
        with gr.Row(equal_height=True):
            gr.Markdown(f"**goose-lens** — speculative decoding, one draft tree per cycle · model "
                        f"**{first.describe()}**" + (f"\n\n{notice}" if notice else ""), elem_id="page-header")
            dark_btn = gr.Button("☾ light / dark", scale=0, min_width=110, size="sm")
        run = gr.State(None)
        model_key = gr.State(None)  # None = the default model
        control = gr.State({"stop": False})  # this visitor's Stop request (deep-copied per session)
        curve = gr.State(None)  # this visitor's own re-measured cost curve (None: the shared one)
        with gr.Row():
            with gr.Column(scale=1, min_width=300):
                prompt = gr.Textbox(preset0["prompt"], label="Prompt", lines=5, max_lines=8,
                                    placeholder="Type a prompt or pick a preset")
                with gr.Row():
                    go_btn = gr.Button("Generate", variant="primary", scale=2, min_width=100)
                    stop_btn = gr.Button("Stop", variant="stop", scale=1, min_width=60)
                preset = gr.Dropdown([p["label"] for p in PRESETS], label="Preset prompt", value=preset0["label"])
                prompt_format = gr.Radio(PROMPT_FORMATS, value=preset0["format"], label="Prompt format (code presets "
                                         "are raw completions; chat presets go through the chat template)",
                                         elem_id="prompt-format")
                with gr.Accordion("What is speculative decoding?", open=True, elem_id="lesson"):
                    gr.Markdown(WHAT_IS_IT)
                with gr.Accordion("Method and tree shape", open=False):
                    method = gr.Dropdown([(v, k) for k, v in METHOD_LABELS.items()], value="goose", label="Method")
                    sources = gr.CheckboxGroup(SOURCE_CHOICES, value=["pld", "tr"], label="Draft sources (Goose, Iso)")
                    budget = gr.Slider(1, 128, value=60, step=1, label="Node budget B (anchor included)")
                    auto_r = gr.Checkbox(value=True, label="Adaptive spine ratio r (EMA tiers)")
                    spine_ratio = gr.Slider(0.05, 0.95, value=0.5, step=0.05, interactive=False,
                                            label="Spine ratio r (untick adaptive to set it)")
                    depth = gr.Slider(1, 16, value=6, step=1, label="Max depth D of the TR branches (the PLD "
                                      "spine and bypass chains are not bounded by D)")
                    bypass = gr.Checkbox(value=True, label="Bypass: verify the bare PLD chain when the anchor has "
                                         "no TR entry (chains are not bounded by D)")
                    auto_c = gr.Checkbox(value=True, label="GT principle auto: the speedup-optimal tree size from "
                                         "the measured cost curve")
                    gt = gr.Slider(0.0, 0.5, value=0.0, step=0.01, interactive=False,
                                   label="GT threshold c (untick auto to set it; 0 = no pruning)")
                with gr.Accordion("Run and display", open=False):
                    max_new = gr.Slider(1, options.max_new_tokens, value=128, step=1, label="Max new tokens")
                    pace = gr.Slider(0.0, 2.0, value=0.0, step=0.1, label="Slow motion (s pause per cycle)")
                    show_ghosts = gr.Checkbox(value=True, label="Show GT-pruned candidates as ghosts")
                    show_all = gr.Checkbox(value=False, label="Draw every node (no +N / ⋯N folding; the tree "
                                           "grows taller than the screen)")
                with gr.Accordion("Sampling (temperature 0 = greedy)", open=False):
                    temperature = gr.Slider(0.0, 2.0, value=0.0, step=0.05, label="Temperature")
                    top_p = gr.Slider(0.05, 1.0, value=1.0, step=0.05, label="Top-p")
                    top_k = gr.Slider(0, 100, value=0, step=1, label="Top-k (0 = off)")
                    seed = gr.Number(0, precision=0, label="Seed")
                    verifier = gr.Radio([("Tree walk (SpecInfer)", "tree"), ("HSD on chains", "hsd")], value="tree",
                                        label="Verifier")
                settings = gr.Textbox(label="Settings of the last run (a command that reproduces it)", lines=2,
                                      buttons=["copy"], interactive=False, elem_id="settings")
                with gr.Accordion("Model", open=False):
                    model_name = gr.Textbox(first.name, label=f"Model: one of {', '.join(options.allowed_models)}"
                                            if options.public else "Model: smollm2, demo, a hub id, a local folder or "
                                                                   ".gguf file")
                    with gr.Row():
                        device = gr.Dropdown(["auto", "cpu", "cuda"], value="auto", label="Device")
                        dtype = gr.Dropdown(["auto", "fp32", "fp16", "bf16"], value="auto", label="Dtype")
                    load_btn = gr.Button("Load model")
                    model_status = gr.Markdown(f"Using {first.describe()}.", elem_id="model-status")
                with gr.Accordion("Trace file: export the last run, or replay one", open=False):
                    export_btn = gr.Button("Export trace (JSON)")
                    export_file = gr.File(label="Exported trace", interactive=False, elem_id="export-trace")
                    import_file = gr.File(label="Import a trace (.json) to replay it", file_types=[".json"],
                                          type="filepath", elem_id="import-trace")
                with gr.Accordion("How to read this", open=False):
                    gr.Markdown(HOW_TO_READ)
                gr.Markdown("Presets: " + "; ".join(f"{p['label']} ({p['license']})" for p in PRESETS),
                            elem_classes=["small"])
            with gr.Column(scale=3):
                with gr.Row(equal_height=True):
                    big = gr.HTML(big_numbers(None), elem_id="big-numbers", scale=0, min_width=250)
                    stats = gr.Markdown("Press **Generate**: the prompt box holds a preset.", elem_id="stats")
                tree_plot = gr.Plot(placeholder_figure(), label="Draft tree of the latest cycle", show_label=False,
                                    elem_id="draft-tree")  # a figure at load: the browser loads plotly before the click
                explain = gr.Markdown(elem_id="explain")
                with gr.Row(equal_height=True):
                    back_btn = gr.Button("◀", scale=0, min_width=48, elem_id="cycle-back")
                    scrubber = gr.Slider(0, 1, value=0, step=1, label="Cycle (drag, arrow keys, or type a number)",
                                         elem_id="cycle-scrubber")
                    fwd_btn = gr.Button("▶", scale=0, min_width=48, elem_id="cycle-forward")
                    step_btn = gr.Button("Step through", scale=0, min_width=110, elem_id="step-through")
                    full_btn = gr.Button("Full screen", scale=0, min_width=90, elem_id="tree-fullscreen")
                output = gr.HighlightedText(label="Output so far, coloured by the source of each token "
                                                  "(click a token to see its cycle)", color_map=COLOR_MAP,
                                            show_legend=True, combine_adjacent=False, elem_id="output")
                speed_plot = gr.Plot(label="Speed and τ per cycle", elem_id="speed-chart")
                with gr.Accordion("Theory: Proposition 1's expected yield vs the measured τ", open=False):
                    theory = gr.Markdown(theory_panel(None, None, 60, 6), elem_id="theory")
                with gr.Accordion("Race: AR and the chosen method on one device, one clock", open=False):
                    with gr.Row():
                        race_btn = gr.Button("Race", variant="primary")
                        race_pace = gr.Slider(0, 20, value=4, step=1, label="Race slow motion: pause k × each "
                                              "forward's engine time (0 = real time)", elem_id="race-pace")
                    race_board = gr.Markdown(elem_id="race-board")
                    with gr.Row():
                        race_ar = gr.Textbox(label="AR", lines=8, interactive=False, elem_id="race-ar")
                        race_spec = gr.Textbox(label="Chosen method", lines=8, interactive=False, elem_id="race-spec")
                with gr.Accordion("Verification cost curve and the GT principle", open=False):
                    cost_plot = gr.Plot(cost_figure(cached_cost_curve(first.model), 60), show_label=False,
                                        elem_id="cost-curve")
                    remeasure = gr.Button("Re-measure on this device (for your session only)")
        settings_in = [budget, auto_r, spine_ratio, depth, auto_c, gt, max_new, bypass]
        sampling_in = [sources, temperature, top_p, top_k, seed, verifier, model_key]
        preset.input(preset_fields, preset, [prompt, prompt_format], api_visibility="private")
        waiting = lambda: board.waiting_words()  # noqa: E731
        go_btn.click(waiting, None, stats, queue=False, api_visibility="private")  # at once, beside the run:
        go_btn.click(board.wrap(partial(generate, models=models)),  # its first frame replaces the message
            [prompt, method, *settings_in, pace, show_ghosts, run, *sampling_in, prompt_format, control, curve,
             show_all],
            [output, tree_plot, speed_plot, stats, run, scrubber, explain, big, theory, settings],
            api_name="generate", concurrency_limit=1, concurrency_id="model")
        race_btn.click(waiting, None, race_board, queue=False, api_visibility="private")
        race_btn.click(board.wrap(partial(race, models=models)),
            [prompt, method, *settings_in, *sampling_in, prompt_format, race_pace, control, curve],
            [race_ar, race_spec, race_board], api_name="race", concurrency_limit=1, concurrency_id="model")
        cycle_out = [scrubber, tree_plot, explain, theory, output]

        def on_token_select(run_state, ghosts, key, every, evt: gr.SelectData):  # gradio injects evt by annotation
            return jump_to_token(run_state, ghosts, evt, key, every, models=models)

        output.select(on_token_select, [run, show_ghosts, model_key, show_all], cycle_out, api_visibility="private")
        for trigger, step in ((scrubber.input, 0), (back_btn.click, -1), (fwd_btn.click, 1), (show_ghosts.input, 0),
                              (show_all.input, 0)):
            trigger(lambda r, i, g, key, every, step=step: show_cycle(r, i, g, step, key, every, models=models),
                    [run, scrubber, show_ghosts, model_key, show_all], cycle_out, api_visibility="private",
                    trigger_mode="always_last")  # typed values and arrow keys fire input too; the output sets
            # the slider without firing it again
        step_btn.click(partial(step_through, models=models), [run, scrubber, show_ghosts, model_key, control, show_all],
                       [scrubber, tree_plot, explain, output], api_name="step_through")
        stop_btn.click(request_stop, control, None, queue=False, api_visibility="private")
        auto_r.input(lambda a: gr.Slider(interactive=not a), auto_r, spine_ratio, api_visibility="private")
        auto_c.input(lambda a: gr.Slider(interactive=not a), auto_c, gt, api_visibility="private")
        export_btn.click(partial(export_trace, models=models), [run, model_key], export_file, api_visibility="private")
        import_file.upload(partial(import_trace, models=models), [import_file, run, show_ghosts, model_key, show_all],
                           [output, tree_plot, speed_plot, stats, run, scrubber, explain, big, theory, import_file,
                            prompt, prompt_format, settings], api_name="import_trace")
        load_btn.click(partial(load_other_model, models=models, options=options),
                       [model_name, device, dtype, model_key],
                       [model_status, model_key], api_name="load_model", concurrency_id="load",
                       concurrency_limit=1)  # its own queue: a slow load never delays another visitor's Generate

        def remeasure_curve(b, key):  # this visitor's own curve: nobody else's runs change
            fresh = measure_cost_curve(models.get(key).model)
            return fresh, cost_figure(fresh, int(b))

        remeasure.click(remeasure_curve, [budget, model_key], [curve, cost_plot], api_visibility="private",
                        concurrency_id="model", concurrency_limit=1)
        budget.change(lambda b, key, own: cost_figure(session_curve(own, models.get(key)) or
                                                      cached_cost_curve(models.get(key).model), int(b)),
                      [budget, model_key, curve], cost_plot, api_visibility="private")
        dark_btn.click(None, js=TOGGLE_DARK)
        full_btn.click(None, js=FULLSCREEN)
    return demo


def placeholder_figure():
    """The tree area before the first run: says what will appear there."""
    fig = go.Figure()
    fig.add_annotation(text="Press <b>Generate</b>: each cycle's draft tree appears here.<br>"
                            "<b>Step through</b> then plays one cycle stage by stage.",
                       showarrow=False, font=dict(size=18), x=0.5, y=0.5, xref="paper", yref="paper")
    fig.update_layout(height=450, xaxis=dict(visible=False), yaxis=dict(visible=False),
                      paper_bgcolor="rgba(0,0,0,0)", plot_bgcolor="rgba(0,0,0,0)", margin=dict(l=10, r=10, t=40, b=64))
    return fig


def request_stop(control: dict) -> None:
    """Stop: the visitor's running Generate, Race or step-through ends after its current cycle and keeps
    what it has (no error, both race outputs kept)."""
    control["stop"] = True


def preset_fields(label):
    """A preset's prompt and its format (code: raw completion; chat datasets: chat template)."""
    preset = next((p for p in PRESETS if p["label"] == label), None)
    return (preset["prompt"], preset["format"]) if preset else (gr.skip(), gr.skip())


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
    lm.warm_up()  # the first Generate should not pay for torch's lazy initialisation
    demo = build_demo(lm, PageOptions.from_env(args.public or args.share, notice))
    demo.queue(default_concurrency_limit=1).launch(server_name=args.host, server_port=args.port, share=args.share,
                                                   css=CSS, theme=gr.themes.Soft(), max_file_size=MAX_BYTES)
    return 0


if __name__ == "__main__":
    sys.exit(main())
