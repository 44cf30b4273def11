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
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import gradio as gr

from engine.config import ConfigError, DecodeConfig
from engine.cost import cached_cost_curve
from engine.decode import SpecDecoder
from engine.loading import DEMO_MODEL, LoadedModel, ModelLoadError, ModelRegistry, load_model, tqdm_progress
from engine.models import DEMO_NAMES, NAMED, SMOLLM2
from engine.metrics import summarize
from engine.trace_io import MAX_BYTES, TraceFormatError, export_run, load_run
from viz.charts import cost_figure, speed_figure
from viz.explain import TOKEN_COLORS, big_numbers, cycle_segments, explain_cycle, theory_panel
from viz.tree_figure import tree_figure

try:  # Hugging Face Spaces (ZeroGPU): run model-bound handlers on a GPU; a no-op everywhere else
    import spaces

    on_gpu = spaces.GPU
except ImportError:
    def on_gpu(fn):
        return fn

PRESETS = json.loads((Path(__file__).parent / "assets" / "presets.json").read_text(encoding="utf-8"))
UPDATE_EVERY_S = 0.15  # the page redraws at most this often; every cycle is still recorded in the state
CSS = "#stats {font-size: 1.05em} #draft-tree {min-height: 380px} #big-numbers {margin: .2em 0 .6em}"
TOGGLE_DARK = "() => { document.body.classList.toggle('dark'); }"
FULLSCREEN = "() => { const e = document.getElementById('draft-tree'); if (e) e.requestFullscreen(); }"

METHOD_LABELS = {"goose": "Goose (spine tree of the chosen sources)", "pld": "PLD only (chain)",
                 "tr": "TR only (tree)", "ptd": "PTD only (progressive tree drafting)",
                 "iso3": "Iso(3): balanced 3-ary tree", "iso5": "Iso(5): balanced 5-ary tree", "ar": "AR (no drafting)"}
SOURCE_CHOICES = [("PLD spine", "pld"), ("TR branch", "tr"), ("PTD perturbation", "ptd")]
PROMPT_FORMATS = [("Chat template (one user turn)", "chat"), ("Raw completion prompt", "raw")]

HOW_TO_READ = """
* **The tree** is one verification forward. The root is the *anchor* (the last committed token); each node
  is a draft token, coloured by its source: **PLD spine** (copied from an earlier n-gram match), **TR branch**
  (Token Recycling adjacency table), **PTD perturbation** (progressive tree drafting pool). Depth grows to
  the right. Hover a node for its token, score, estimated acceptance and the token the model wanted there.
* **The thick path** is what the model accepted; the **star** is the bonus token the model adds itself.
  Faded nodes were rejected; ghost nodes were never verified (the GT threshold c judged them not worth a row).
* **τ** is tokens committed per verification forward (AR = 1). **tokens/s** counts engine time only.
* **The scrubber** (◀ ▶) steps through every recorded cycle; clicking a token in the output jumps to its cycle.
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


def used_format(lm: LoadedModel, prompt_format: str) -> str:
    """'chat' or 'raw': what the prompt really went through (a model without a chat template gets it raw)."""
    return "chat" if prompt_format != "raw" and lm.has_chat_template else "raw"


def settings_string(model: str, cfg: DecodeConfig, prompt_format: str = "chat") -> str:
    """One copyable command line that reproduces the run (``python -m engine.generate``)."""
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
    return shlex.join(args) + " --prompt-file PROMPT.txt"


FORMAT_NAMES = {"chat": "prompt through the chat template", "raw": "raw completion prompt"}


def stats_line(summary, trace, c: float, prompt_format: str | None = None) -> str:
    src = summary.accepted_by_source
    rows = f" (+{trace.ptd_rows} PTD rows)" if trace.ptd_rows else ""
    sent = f" · {FORMAT_NAMES[prompt_format]}" if prompt_format in FORMAT_NAMES else ""
    return (f"**τ {summary.tau:.2f}** · **{summary.tok_per_s:.1f} tok/s** · {summary.cycles} cycles · "
            f"{summary.new_tokens} tokens — by source: PLD {src['pld']} · TR {src['tr']} · PTD {src['ptd']} · "
            f"bonus {src['bonus']} · last cycle: {trace.mode}, {len(trace.tree)} nodes{rows}, "
            f"{len(trace.new_tokens)} tokens, r = {trace.spine_ratio if trace.spine_ratio is not None else '–'}, "
            f"c = {c:.3f}{sent}")


def token_text_of(run: dict, lm: LoadedModel):
    """Token id -> text: the run's own table for an imported run, else the loaded tokenizer."""
    if run.get("token_text") is not None:
        table = run["token_text"]
        return lambda i: table.get(i, f"<{i}>")
    return lambda i: lm.tokenizer.decode([i])


def views(run: dict, trace, lm: LoadedModel, show_ghosts: bool) -> tuple:
    """(tree figure, big numbers, stats line, explanation, theory panel) of ``trace`` within ``run``."""
    text = token_text_of(run, lm)
    summary = summarize(run["traces"][: trace.index + 1])  # traces[k].index == k
    cfg = run["config"]
    return (tree_figure(trace, text, show_ghosts=bool(show_ghosts)), big_numbers(summary),
            stats_line(summary, trace, float(cfg.get("gt_threshold") or 0.0), run.get("prompt_format")),
            explain_cycle(trace, text),
            theory_panel(summary, trace, int(cfg.get("budget", 60)), int(cfg.get("max_depth", 6))))


@on_gpu
def generate(prompt, method, budget, auto_r, spine_ratio, depth, auto_c, gt_threshold, max_new_tokens, bypass, pace,
             show_ghosts, run, sources=("pld", "tr"), temperature=0.0, top_p=1.0, top_k=0, seed=0, verifier="tree",
             model_key=None, prompt_format="chat", *, models: ModelRegistry):
    """Stream (output, tree, speed, stats, run, scrubber, explanation, big numbers, theory, settings) while decoding."""
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
    segments: list[tuple[str, str]] = []  # the output, token by token, labelled by source
    last_draw = 0.0
    try:
        decoder = SpecDecoder(lm.model, config, lm.eos_token_ids)  # resolves c = "auto"
        sent = used_format(lm, prompt_format)
        new_run = {"model": lm.name, "prompt": prompt, "prompt_format": sent, "config": decoder.config.to_dict(),
                   "traces": [], "token_cycles": [], "token_text": None}  # token_cycles: cycle of every output token
        text = token_text_of(new_run, lm)
        command = settings_string(lm.name, decoder.config, sent)
        for trace in decoder.generate(ids):
            new_run["traces"].append(trace)
            segments.extend(cycle_segments(trace, text))
            new_run["token_cycles"].extend([trace.index] * len(trace.new_tokens))
            if trace.finished or time.perf_counter() - last_draw >= UPDATE_EVERY_S or pace:
                last_draw = time.perf_counter()
                tree, big, stats, explanation, theory = views(new_run, trace, lm, show_ghosts)
                scrubber = gr.Slider(maximum=max(1, trace.index), value=trace.index)
                yield (list(segments), tree, speed_figure(new_run["traces"]), stats, new_run, scrubber, explanation,
                       big, theory, command)
                if pace:
                    time.sleep(float(pace))
    except Exception as exc:  # noqa: BLE001 - keep serving; the user sees why this run stopped
        yield (gr.skip(),) * 3 + (f"⚠️ generation stopped: {type(exc).__name__}: {exc}", run) + (gr.skip(),) * 5


def show_cycle(run, index, show_ghosts, step: int = 0, model_key=None, *, models: ModelRegistry):
    """Scrubber: redraw the tree, its explanation and the theory panel for recorded cycle ``index + step``."""
    if not run or not run["traces"]:
        return gr.skip(), gr.skip(), "Generate first: the scrubber steps through the cycles of the last run.", gr.skip()
    k = max(0, min(int(index) + int(step), len(run["traces"]) - 1))
    tree, _, _, explanation, theory = views(run, run["traces"][k], models.get(model_key), show_ghosts)
    return k, tree, explanation, theory


def jump_to_token(run, show_ghosts, evt: gr.SelectData, model_key=None, *, models: ModelRegistry):
    """Clicking an output token shows the cycle that produced it."""
    if not run or not isinstance(evt.index, int) or not 0 <= evt.index < len(run.get("token_cycles", [])):
        return gr.skip(), gr.skip(), gr.skip(), gr.skip()
    return show_cycle(run, run["token_cycles"][evt.index], show_ghosts, model_key=model_key, models=models)


def export_trace(run, model_key=None, *, models: ModelRegistry):
    """Write the last run as a versioned JSON trace (docs/trace-schema.md); returns its path for download."""
    if not run or not run["traces"]:
        gr.Warning("Nothing to export yet: generate (or import) a run first.")
        return None
    doc = export_run(model=run["model"], prompt=run["prompt"], config=run["config"], traces=run["traces"],
                     token_text=token_text_of(run, models.get(model_key)))
    path = Path(tempfile.mkdtemp(prefix="goose-lens-")) / f"goose-lens-trace-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(doc, encoding="utf-8")
    return str(path)


def import_trace(file, run, show_ghosts, model_key=None, *, models: ModelRegistry):
    """Replay an exported trace with no model run; a bad file leaves the current run untouched."""
    if not file:
        return (gr.skip(),) * 10
    try:
        if os.path.getsize(file) > MAX_BYTES:
            raise TraceFormatError(f"the file is larger than {MAX_BYTES // 2**20} MB")
        loaded = load_run(Path(file).read_bytes())
    except (OSError, TraceFormatError) as exc:
        message = f"Could not import the trace: {exc}"
        gr.Warning(message)
        return (gr.skip(),) * 3 + (f"⚠️ {message}", run) + (gr.skip(),) * 4 + (None,)  # None: the box is free again
    new_run = {**loaded, "token_cycles": [t.index for t in loaded["traces"] for _ in t.new_tokens]}
    text = token_text_of(new_run, None)
    segments = [seg for t in new_run["traces"] for seg in cycle_segments(t, text)]
    first = new_run["traces"][1] if len(new_run["traces"]) > 1 else new_run["traces"][0]
    tree, big, stats, explanation, theory = views(new_run, first, None, show_ghosts)
    stats = f"Imported trace of `{new_run['model']}` ({len(new_run['traces'])} cycles), replayed with no model: " + stats
    return (segments, tree, speed_figure(new_run["traces"]), stats, new_run,
            gr.Slider(maximum=max(1, len(new_run["traces"]) - 1), value=first.index), explanation, big, theory, None)


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
    def from_env(cls, public: bool = False, notice: str | None = None) -> "PageOptions":
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
         prompt_format="chat", *, models: ModelRegistry):
    """AR vs the chosen method on one device and a shared clock: stream (AR text, method text, scoreboard).

    The two decoders run alternately, never at once: the one with less engine time so far runs its next
    forward, so both outputs are always shown as of (nearly) the same engine time, and each run is
    charged only for its own forwards.
    """
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
    runners = {"AR": SpecDecoder(lm.model, spec_cfg.with_(method="ar"), lm.eos_token_ids).generate(ids),
               METHOD_LABELS[method]: SpecDecoder(lm.model, spec_cfg, lm.eos_token_ids).generate(ids)}
    state = {name: {"tokens": [], "elapsed": 0.0, "forwards": 0, "done": False} for name in runners}
    last_draw = 0.0
    while not all(s["done"] for s in state.values()):
        name = min((n for n in runners if not state[n]["done"]), key=lambda n: state[n]["elapsed"])
        trace = next(runners[name])
        s = state[name]
        s["tokens"] += trace.new_tokens
        s["elapsed"], s["forwards"], s["done"] = trace.elapsed_s, s["forwards"] + 1, trace.finished
        if time.perf_counter() - last_draw >= UPDATE_EVERY_S or all(x["done"] for x in state.values()):
            last_draw = time.perf_counter()
            board = " · ".join(f"**{n}**: {len(x['tokens'])} tokens in {x['elapsed'] * 1000:.0f} ms engine time "
                               f"({len(x['tokens']) / max(x['elapsed'], 1e-9):.0f} tok/s, τ "
                               f"{len(x['tokens']) / max(1, x['forwards']):.2f}){' ✓' * x['done']}"
                               for n, x in state.items())
            ar, spec = state.values()
            if ar["done"] and spec["done"]:
                board += f" — speedup **{ar['elapsed'] / max(spec['elapsed'], 1e-9):.2f}×**"
            yield (lm.tokenizer.decode(ar["tokens"]), lm.tokenizer.decode(spec["tokens"]), board)


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


def build_demo(lm: LoadedModel | ModelRegistry, options: PageOptions = PageOptions()) -> gr.Blocks:
    """The page. Per-user data lives in ``gr.State``; models are shared read-only through the registry."""
    models = lm if isinstance(lm, ModelRegistry) else ModelRegistry(lm)
    first, notice = models.get(None), options.notice
    with gr.Blocks(title="goose-lens") as demo:
        with gr.Row():
            gr.Markdown(f"# goose-lens — speculative decoding, one draft tree per cycle\n"
                        f"Model: **{first.describe()}**. Pick a preset and press **Generate**."
                        + (f"\n\n{notice}" if notice else ""), elem_id="page-header")
            dark_btn = gr.Button("☾ light / dark", scale=0, min_width=120)
        with gr.Accordion("How to read this", open=False):
            gr.Markdown(HOW_TO_READ)
        run = gr.State(None)
        model_key = gr.State(None)  # None = the default model
        with gr.Row():
            with gr.Column(scale=1, min_width=320):
                preset = gr.Dropdown([p["label"] for p in PRESETS], label="Preset prompt", value=None)
                prompt = gr.Textbox(label="Prompt", lines=8, placeholder="Type a prompt or pick a preset")
                prompt_format = gr.Radio(PROMPT_FORMATS, value="chat", label="Prompt format (code presets are raw "
                                         "completions; chat presets go through the chat template)",
                                         elem_id="prompt-format")
                method = gr.Dropdown([(v, k) for k, v in METHOD_LABELS.items()], value="goose", label="Method")
                sources = gr.CheckboxGroup(SOURCE_CHOICES, value=["pld", "tr"], label="Draft sources (Goose, Iso)")
                budget = gr.Slider(1, 128, value=60, step=1, label="Node budget B (anchor included)")
                auto_r = gr.Checkbox(value=True, label="Adaptive spine ratio r (EMA tiers)")
                spine_ratio = gr.Slider(0.05, 0.95, value=0.5, step=0.05, label="Spine ratio r (when not adaptive)")
                depth = gr.Slider(1, 16, value=6, step=1, label="Max depth D")
                auto_c = gr.Checkbox(value=True, label="Auto GT threshold c (from the measured cost curve)")
                gt = gr.Slider(0.0, 0.5, value=0.0, step=0.01, label="GT threshold c when not auto (0 = off)")
                max_new = gr.Slider(1, options.max_new_tokens, value=128, step=1, label="Max new tokens")
                bypass = gr.Checkbox(value=True, label="Bypass: verify confident PLD matches as a chain")
                with gr.Accordion("Sampling (temperature 0 = greedy)", open=False):
                    temperature = gr.Slider(0.0, 2.0, value=0.0, step=0.05, label="Temperature")
                    top_p = gr.Slider(0.05, 1.0, value=1.0, step=0.05, label="Top-p")
                    top_k = gr.Slider(0, 100, value=0, step=1, label="Top-k (0 = off)")
                    seed = gr.Number(0, precision=0, label="Seed")
                    verifier = gr.Radio([("Tree walk (SpecInfer)", "tree"), ("HSD on chains", "hsd")], value="tree",
                                        label="Verifier")
                pace = gr.Slider(0.0, 2.0, value=0.0, step=0.1, label="Slow motion (s pause per cycle)")
                show_ghosts = gr.Checkbox(value=True, label="Show GT-pruned candidates as ghosts")
                with gr.Row():
                    go_btn = gr.Button("Generate", variant="primary")
                    stop_btn = gr.Button("Stop", variant="stop")
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
                gr.Markdown("Presets: " + "; ".join(f"{p['label']} ({p['license']})" for p in PRESETS),
                            elem_classes=["small"])
            with gr.Column(scale=2):
                big = gr.HTML(big_numbers(None), elem_id="big-numbers")
                stats = gr.Markdown("Pick a preset and press **Generate**.", elem_id="stats")
                tree_plot = gr.Plot(label="Draft tree of the latest cycle", show_label=False, elem_id="draft-tree")
                explain = gr.Markdown(elem_id="explain")
                with gr.Row(equal_height=True):
                    back_btn = gr.Button("◀", scale=0, min_width=48, elem_id="cycle-back")
                    scrubber = gr.Slider(0, 1, value=0, step=1, label="Cycle (scrub or step through every recorded cycle)",
                                         elem_id="cycle-scrubber")
                    fwd_btn = gr.Button("▶", scale=0, min_width=48, elem_id="cycle-forward")
                    full_btn = gr.Button("Full screen", scale=0, min_width=90, elem_id="tree-fullscreen")
                output = gr.HighlightedText(label="Output so far, coloured by the source of each token "
                                                  "(click a token to see its cycle)", color_map=TOKEN_COLORS,
                                            show_legend=True, combine_adjacent=False, elem_id="output")
                speed_plot = gr.Plot(label="Speed and τ per cycle", elem_id="speed-chart")
                with gr.Accordion("Theory: Proposition 1's expected yield vs the measured τ", open=False):
                    theory = gr.Markdown(theory_panel(None, None, 60, 6), elem_id="theory")
                with gr.Accordion("Race: AR and the chosen method on one device, one clock", open=False):
                    race_btn = gr.Button("Race")
                    race_board = gr.Markdown(elem_id="race-board")
                    with gr.Row():
                        race_ar = gr.Textbox(label="AR", lines=8, interactive=False)
                        race_spec = gr.Textbox(label="Chosen method", lines=8, interactive=False)
                with gr.Accordion("Verification cost curve and the auto GT threshold c", open=False):
                    cost_plot = gr.Plot(cost_figure(cached_cost_curve(first.model), 60), show_label=False,
                                        elem_id="cost-curve")
                    remeasure = gr.Button("Re-measure on this device")
        settings_in = [budget, auto_r, spine_ratio, depth, auto_c, gt, max_new, bypass]
        sampling_in = [sources, temperature, top_p, top_k, seed, verifier, model_key]
        preset.change(preset_fields, preset, [prompt, prompt_format], api_visibility="private")
        event = go_btn.click(partial(generate, models=models),
                             [prompt, method, *settings_in, pace, show_ghosts, run, *sampling_in, prompt_format],
                             [output, tree_plot, speed_plot, stats, run, scrubber, explain, big, theory, settings],
                             api_name="generate", concurrency_limit=1, concurrency_id="model")
        race_event = race_btn.click(partial(race, models=models),
                                    [prompt, method, *settings_in, *sampling_in, prompt_format],
                                    [race_ar, race_spec, race_board], api_name="race", concurrency_limit=1,
                                    concurrency_id="model")

        def on_token_select(run_state, ghosts, key, evt: gr.SelectData):  # gradio injects evt by annotation
            return jump_to_token(run_state, ghosts, evt, key, models=models)

        output.select(on_token_select, [run, show_ghosts, model_key], [scrubber, tree_plot, explain, theory],
                      api_visibility="private")
        for trigger, step in ((scrubber.release, 0), (back_btn.click, -1), (fwd_btn.click, 1)):
            trigger(lambda r, i, g, key, step=step: show_cycle(r, i, g, step, key, models=models),
                    [run, scrubber, show_ghosts, model_key], [scrubber, tree_plot, explain, theory],
                    api_visibility="private")
        stop_btn.click(None, None, None, cancels=[event, race_event], api_visibility="private")
        export_btn.click(partial(export_trace, models=models), [run, model_key], export_file, api_visibility="private")
        import_file.upload(partial(import_trace, models=models), [import_file, run, show_ghosts, model_key],
                           [output, tree_plot, speed_plot, stats, run, scrubber, explain, big, theory, import_file],
                           api_name="import_trace")
        load_btn.click(partial(load_other_model, models=models, options=options), [model_name, device, dtype, model_key],
                       [model_status, model_key], api_name="load_model", concurrency_id="load",
                       concurrency_limit=1)  # its own queue: a slow load never delays another visitor's Generate
        remeasure.click(lambda b, key: cost_figure(cached_cost_curve(models.get(key).model, refresh=True), int(b)),
                        [budget, model_key], cost_plot, api_visibility="private", concurrency_id="model",
                        concurrency_limit=1)
        budget.change(lambda b, key: cost_figure(cached_cost_curve(models.get(key).model), int(b)), [budget, model_key],
                      cost_plot, api_visibility="private")
        dark_btn.click(None, js=TOGGLE_DARK)
        full_btn.click(None, js=FULLSCREEN)
    return demo


def preset_fields(label):
    """A preset's prompt and its format (code: raw completion; chat datasets: chat template)."""
    preset = next((p for p in PRESETS if p["label"] == label), None)
    return (preset["prompt"], preset["format"]) if preset else (gr.skip(), gr.skip())


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="goose-lens: visual debugger for training-free speculative decoding")
    ap.add_argument("--model", default=None, help="smollm2 (default, fetched once), demo (embedded, offline), a hub "
                                                  "id, a local folder or .gguf file; $GOOSE_LENS_MODEL sets the default")
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
