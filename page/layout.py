"""The page's layout: its components, named as the handlers' parameters (``page.contract.Page``), in the columns and
accordions a visitor sees; ``build_demo`` builds it and wires its events (``page.events``)."""
from __future__ import annotations

import gradio as gr
import plotly.graph_objects as go

from engine.decoding.config import METHODS
from engine.product.io.deploy import serving_text
from engine.product.models.loaded import LoadedModel
from engine.product.models.registry import ModelRegistry
from engine.sources import REGISTRY, SourceMemory
from page.contract import Drawing, Endpoint, Page, wire
from page.drafter import NO_DRAFTER
from page.events import wire_events
from page.frames import INITIAL, VIEW_RANGES
from page.help import HOW_TO_READ
from page.models import (
    PROVISIONAL_WORDS,
    SETTLING_EVERY_S,
    PageOptions,
    after_settling,
    header_text,
    on_visit,
    using_words,
)
from page.policy import RACE_SECONDS
from page.presets import PRESETS, start_preset
from page.settings import RANGES
from page.static import SCRUBBER_KEYS, SWEEP_POINT_CLICKS, TREE_SCROLL
from page.sweep import SWEEP_CHOICES, SWEEP_VALUES
from viz.charts import cost_figure, cost_figure_pending
from viz.explain import big_numbers, theory_panel
from viz.frame_text import COLOR_MAP, METHOD_LABELS, OUTPUT_LABEL
from viz.lesson import lesson

METHOD_CHOICES = [(METHOD_LABELS.get(m, m), m) for m in METHODS]
DTYPE_CHOICES = [("auto (measured: the fastest of fp32, bf16 and q4 on a CPU; half precision on a GPU)", "auto"),
                 ("fp32 (exact: token for token AR's output)", "fp32"), ("fp16", "fp16"), ("bf16", "bf16"),
                 ("q4 (a 4-bit model's own weights, bf16 activations; CPU)", "q4")]
SOURCE_CHOICES = [(info.label, info.name) for info in REGISTRY]
PROMPT_FORMATS = [("Chat template (one user turn)", "chat"), ("Raw completion prompt", "raw")]


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
        page.run = gr.State(None)  # the visitor's last run (engine.product.runs.run.Run)
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
                    known = first.curves.known()
                    _lesson_and_presets(page, preset, known, first.precision)
                    _settings_inputs(page, options)
                    _model_and_trace_files(page, models, options)
            with gr.Column(scale=3, elem_id="right-column"):
                with gr.Column(elem_id="run-block"):
                    _run_views(page)
                with gr.Column(elem_id="more-block"):
                    _race_and_cost_views(page, first)
        wire_events(page, models, options)
        demo.load(None, js=SWEEP_POINT_CLICKS)  # a click on a sweep point opens its run
        demo.load(None, js=SCRUBBER_KEYS)  # Enter in the Cycle box ends the typing
        demo.load(None, js=TREE_SCROLL)  # a phone's tree keeps its title and legend in view as it scrolls
        demo.load(None, None, page.screen_px, js="() => window.innerWidth")  # and is laid out for its width
        known = first.curves.known()
        built = (models.key_of(first), known.id if known is not None else None)  # the page as built, below
        wire(demo.load, Endpoint(on_visit, ("model_key", "budget"), ("header", "lesson", "cost_plot"),
                                 {"models": models, "options": options, "built": built}), page,
             api_visibility="private", show_progress="hidden")
        # built during a cold start's measurement: each page looks until it is done (``after_settling``)
        page.settle_timer = gr.Timer(SETTLING_EVERY_S, active=bool(models.busy))
        wire(page.settle_timer.tick, Endpoint(after_settling, ("model_key", "budget"),
                                              ("header", "lesson", "cost_plot", "settle_timer"),
                                              {"models": models, "options": options, "built": built}), page,
             api_visibility="private", show_progress="hidden", queue=False)
    return demo


def _header(page: Page, first: LoadedModel, notice: str | None) -> None:
    with gr.Row(equal_height=True):
        page.header = gr.Markdown(header_text(first, notice), elem_id="page-header")
        page.dark_btn = gr.Button("☾ light / dark", scale=0, min_width=110, size="sm", elem_id="dark-toggle")


def _prompt_inputs(page: Page, preset: dict) -> None:
    """The prompt box (holding ``preset``'s prompt, so the first click works), Generate and Stop."""
    page.prompt = gr.Textbox(preset["prompt"], label="Prompt", lines=5, max_lines=8,
                             placeholder="Type a prompt or pick a preset")
    with gr.Row():
        page.go_btn = gr.Button("Generate", variant="primary", scale=2, min_width=100)
        page.stop_btn = gr.Button("Stop", variant="stop", scale=1, min_width=60)
    page.notice = gr.Markdown("", elem_id="notice")  # what a run waits for, and why one could not start or a trace
    # not be read: its own place, so no message replaces a result still on screen


def _lesson_and_presets(page: Page, preset: dict, lesson_curve=None, precision: str | None = None) -> None:
    """The preset picker (the prompt box starts with ``preset``), the prompt format and the first lesson (its promise
    true of the model's ``precision``, with one click each to the demo model and the exact mode)."""
    page.preset = gr.Dropdown([p["label"] for p in PRESETS], label="Preset prompt", value=preset["label"])
    page.prompt_format = gr.Radio(PROMPT_FORMATS, value=preset["format"], elem_id="prompt-format",
                                  label="Prompt format (code presets are raw completions; chat presets go through "
                                        "the chat template)")
    with gr.Accordion("What is speculative decoding?", open=True, elem_id="lesson"):
        page.lesson = gr.Markdown(lesson(lesson_curve, precision))
        with gr.Row():  # the lesson's two ways to see trees, one click each
            page.demo_btn = gr.Button("Demo model (tiny: many trees)", size="sm", elem_id="lesson-demo")
            page.lesson_exact_btn = gr.Button("Exact mode (fp32)", size="sm", elem_id="lesson-exact")


def _settings_inputs(page: Page, options: PageOptions) -> None:
    """The accordions of ``PageSettings`` and ``Drawing`` (components named as their fields), and the command."""
    s = INITIAL
    with gr.Accordion("Method and tree shape", open=False):
        page.method = gr.Dropdown(METHOD_CHOICES, value=s.method, label="Method")
        page.drafter = gr.Textbox(s.drafter, label="Drafter settings (name=value, …: an engine's drafter takes its "
                                  "engine's own names)", placeholder=NO_DRAFTER, interactive=bool(s.drafter),
                                  elem_id="drafter")
        page.serve = gr.Textbox(serving_text(s.to_config()), label="Serve this drafter: the engine's command (the "
                                "nearest engine setting for goose-lens's own methods, and what differs)", lines=2,
                                buttons=["copy"], interactive=False, elem_id="serve")
        page.sources = gr.CheckboxGroup(SOURCE_CHOICES, value=list(s.sources), label="Draft sources (Goose, Iso)")
        page.budget = _slider("budget", s.budget, 1, "Node budget B (anchor included)",
                              info="A cycle whose spine match is confident gets up to "
                                   f"{INITIAL.to_config().max_budget - s.budget} nodes more, and its r is raised "
                                   "towards 1 (Goose §4.3); the line under the tree says when.")
        page.auto_r = gr.Checkbox(value=s.auto_r, label="Adaptive spine ratio r (EMA tiers)")
        page.spine_ratio = _slider("spine_ratio", s.spine_ratio, 0.05, "Spine ratio r (untick adaptive to set it)",
                                   interactive=not s.auto_r)
        page.max_depth = _slider("max_depth", s.max_depth, 1,
                                 "Max depth D of the TR branches (the PLD spine and bypass chains are not "
                                 "bounded by D)")
        page.bypass = gr.Checkbox(value=s.bypass, label="Bypass: verify the bare PLD chain when the anchor has no "
                                  "TR entry (chains are not bounded by D)")
        page.auto_c = gr.Checkbox(value=s.auto_c, label="GT principle auto: the speedup-optimal tree size from the "
                                  "measured cost curve")
        page.gt_threshold = _slider("gt_threshold", s.gt_threshold, 0.01,
                                    "GT threshold c (untick auto to set it; 0 = no pruning)", interactive=not s.auto_c)
    with gr.Accordion("Run and display", open=False):
        page.max_new_tokens = _slider("max_new_tokens", s.max_new_tokens, 1, "Max new tokens",
                                      high=options.max_new_tokens)
        page.pace = gr.Slider(*VIEW_RANGES["pace"][:2], value=0.0, step=0.1, label="Slow motion (s pause per cycle)")
        page.show_ghosts = gr.Checkbox(value=Drawing.show_ghosts, label="Show GT-pruned candidates as ghosts")
        page.show_all = gr.Checkbox(value=Drawing.show_all, label="Draw every node (no +N / ⋯N folding; the tree "
                                    "grows taller than the screen)")
    with gr.Accordion("Sampling (temperature 0 = greedy)", open=False):
        page.temperature = _slider("temperature", s.temperature, 0.05, "Temperature")
        page.top_p = _slider("top_p", s.top_p, 0.05, "Top-p")
        page.sample_top_k = _slider("sample_top_k", s.sample_top_k, 1, "Top-k (0 = off)")
        page.seed = gr.Number(s.seed, precision=0, label="Seed")
        page.verifier = gr.Radio([("Tree walk (SpecInfer)", "tree"), ("HSD on chains", "hsd")], value=s.verifier,
                                 label="Verifier")
    page.command = gr.Textbox(label="The last run as a command", lines=2, buttons=["copy"], interactive=False,
                              elem_id="settings", info="It carries the prompt and the cost curve the run read: "
                              "the same trees anywhere.")


def _model_and_trace_files(page: Page, models: ModelRegistry, options: PageOptions) -> None:
    first = models.get(None)
    with gr.Accordion("Model", open=False):
        page.model_name = gr.Textbox(first.name, label=f"Model: one of {', '.join(options.allowed_models)}"
                                     if options.public else "Model: smollm2, demo, a hub id, a local folder or "
                                                            ".gguf file")
        with gr.Row():
            page.device = gr.Dropdown(["auto", "cpu", "cuda"], value="auto", label="Device")
            page.dtype = gr.Dropdown(DTYPE_CHOICES, value="auto", label="Dtype (fp32 is exact; auto measures)")
        page.load_btn = gr.Button("Load model")
        page.model_status = gr.Markdown(using_words(first) + (f" {PROVISIONAL_WORDS}" if models.busy else ""),
                                        elem_id="model-status")  # never updated on page load: see on_visit
    with gr.Accordion("Trace file: export the last run, or replay one", open=False):
        page.export_btn = gr.Button("Export trace (JSON)")
        page.export_file = gr.File(label="Exported trace", interactive=False, elem_id="export-trace")
        page.import_file = gr.UploadButton("Import a trace (.json) to replay it", file_types=[".json"], type="filepath",
                                           elem_id="import-trace")  # a button, not gr.File: gr.File's upload
        # progress logged "Method not implemented." twice per file on the browser console (gradio's, #12002)
    with gr.Accordion("How to read this", open=False):
        gr.Markdown(HOW_TO_READ)
    gr.Markdown("Presets: " + "; ".join(f"{p['label']} ({p['license']})" for p in PRESETS), elem_classes=["small"])


def _run_views(page: Page) -> None:
    """The numbers, the tree, its sentence, the scrubber, the output and the speed chart."""
    with gr.Row(equal_height=True):
        page.big = gr.HTML(big_numbers(None), elem_id="big-numbers")
        # "starts with": still true once the box is emptied (it read "holds a preset" beside an empty box)
        page.stats = gr.Markdown("Press **Generate**: the prompt box starts with a preset.", elem_id="stats")
    page.tree_plot = gr.Plot(placeholder_figure(), label="Draft tree of the latest cycle", show_label=False,
                             elem_id="draft-tree")  # a figure at load: the browser loads plotly before the click
    page.explain = gr.Markdown(elem_id="explain")
    with gr.Row(equal_height=True, elem_id="scrubber-row"):
        page.back_btn = gr.Button("◀", scale=0, min_width=48, elem_id="cycle-back")
        page.scrubber = gr.Slider(0, 1, value=0, step=1, label="Cycle (drag, arrow keys, or type a number)",
                                  elem_id="cycle-scrubber")
        page.fwd_btn = gr.Button("▶", scale=0, min_width=48, elem_id="cycle-forward")
        page.step_btn = gr.Button("Step through", scale=0, min_width=110, elem_id="step-through")
        page.full_btn = gr.Button("Full screen", scale=0, min_width=90, elem_id="tree-fullscreen")
    page.output = gr.HighlightedText(label=OUTPUT_LABEL, color_map=COLOR_MAP, show_legend=True,
                                     combine_adjacent=False, elem_id="output")
    page.speed_plot = gr.Plot(show_label=False, elem_id="speed-chart")  # its panels' titles name it: a label
    # floated over the first one on a phone
    with gr.Accordion("Theory: Proposition 1's expected yield vs the measured τ", open=False):
        page.theory = gr.Markdown(theory_panel(None, None, INITIAL.budget, INITIAL.max_depth), elem_id="theory")
        page.price_curve = gr.Textbox(
            value=Drawing.price_curve, label="Price the run's drafts on your own device too: its cost curve (Enter)",
            placeholder="past=128;1:3.8,2:4.1,4:4.3,8:4.4  (T(n) in ms; a run's copied command carries its curve)",
            max_lines=1, elem_id="price-curve")
    page.screen_px = gr.Number(value=Drawing.screen_px, visible=False)  # the window's width, set once it loads


#: Said before a race: why its lanes may part, and the mode in which they cannot.
RACE_TIES = ("**Same text?** In fp32 (the exact mode) both lanes write the same tokens.  In q4, bf16 or fp16 the "
             "method's forward over many rows rounds differently from AR's one-token step, so where two next tokens "
             "are almost equally likely the lanes may pick different ones: a *precision tie*, not a bug; the board "
             "names it where it happens.")


def _race_and_cost_views(page: Page, first: LoadedModel) -> None:
    with gr.Accordion("Race: AR and the chosen method on one device, one clock", open=False):
        with gr.Row():
            page.race_btn = gr.Button("Race", variant="primary")
            page.race_seconds = gr.Slider(*VIEW_RANGES["race_seconds"][:2], value=RACE_SECONDS, step=1,
                                          label="Race length on screen: about N s "
                                          "(engine time scaled, proportions kept; 0 = real time)",
                                          elem_id="race-seconds")
        with gr.Row():
            page.race_note = gr.Markdown(RACE_TIES, elem_id="race-note")
            page.exact_btn = gr.Button("Exact mode (fp32)", scale=0, min_width=150, elem_id="exact-mode")
        page.race_board = gr.HTML(elem_id="race-board")
        with gr.Row():
            page.race_ar = gr.Textbox(label="AR", lines=8, interactive=False, elem_id="race-ar")
            page.race_spec = gr.Textbox(label="Chosen method", lines=8, interactive=False, elem_id="race-spec")
    with gr.Accordion("Sweep: one parameter, many values, one prompt", open=False, elem_id="sweep"):
        with gr.Row():
            page.sweep_param = gr.Dropdown(SWEEP_CHOICES, value="budget", label="Parameter", scale=1)
            page.sweep_values = gr.Textbox(SWEEP_VALUES["budget"], label="Values (comma-separated; sources: pld+tr, …)",
                                           scale=2)
            page.sweep_btn = gr.Button("Sweep", variant="primary", scale=0, min_width=90)
            page.sweep_stop = gr.Button("Stop", variant="stop", scale=0, min_width=70)
        page.sweep_status = gr.Markdown("Runs the prompt once per value, the other settings as set above. AR is "
                                        "timed before the runs and again after them, the faster timing the "
                                        "reference, so the speedups may shift as the sweep ends. Pick a run below "
                                        "to open it in the tree viewer.", elem_id="sweep-status")
        page.sweep_plot = gr.Plot(show_label=False, elem_id="sweep-plot")
        page.sweep_open = gr.Radio([], label="Open a run in the tree viewer (or click its point)",
                                  elem_id="sweep-open")
    with gr.Accordion("Verification cost curve and the GT principle", open=False):
        curve = first.curves.known()  # a cold start measures it once the page is up
        # (page.startup)
        page.cost_plot = gr.Plot(cost_figure(curve, INITIAL.budget) if curve else cost_figure_pending(),
                                 show_label=False, elem_id="cost-curve")
        page.remeasure = gr.Button("Re-measure on this device (for your session only)")
    with gr.Accordion("Production numbers: your deployment's acceptance beside this drafter here", open=False,
                      elem_id="production-section"):  # the wide column: its table needs the room
        page.production = gr.State(None)  # this visitor's imported figures (``Production``)
        gr.Markdown("Upload what your server reports: vLLM's `/metrics` text, SGLang's `/generate` JSON (its "
                    "`meta_info`), or llama.cpp's `/completion` JSON (its `timings`). Then run the same drafter here "
                    "(the method menu and its drafter settings) on a prompt of yours and compare.")
        with gr.Row():
            page.import_production = gr.UploadButton("Import deployment numbers", type="filepath",
                                                     elem_id="import-production")  # any file: a curl-saved
            # /metrics has no extension; another kind gets one sentence
            page.compare_btn = gr.Button("Compare with the last run", elem_id="compare-production")
        page.production_notice = gr.Markdown(elem_id="production-notice")  # a file that could not be read
        page.production_summary = gr.Markdown(elem_id="production-summary")
        page.production_chart = gr.Plot(show_label=False, elem_id="production-chart")


def placeholder_figure():
    """The tree area before the first run: says what will appear there."""
    fig = go.Figure()
    fig.add_annotation(text="Press <b>Generate</b>: each cycle's draft tree appears here.<br>"
                            "<b>Step through</b> then plays one cycle stage by stage.",
                       showarrow=False, font=dict(size=18), x=0.5, y=0.5, xref="paper", yref="paper")
    fig.update_layout(height=450, xaxis=dict(visible=False), yaxis=dict(visible=False),
                      paper_bgcolor="rgba(0,0,0,0)", plot_bgcolor="rgba(0,0,0,0)", margin=dict(l=10, r=10, t=40, b=64))
    return fig
