"""The page's events: which handler each button, slider and box runs, with what, and into which components."""
from __future__ import annotations

import threading
from functools import wraps

import gradio as gr

from engine.product.models.registry import ModelRegistry
from page.contract import Drawing, Endpoint, Page, wire
from page.cycles import CYCLE_OUT, jump_to_token, request_stop, show_cycle, step_through
from page.drafter import method_fields, serve_fields
from page.frames import VIEW_RANGES, keep_in_range, or_skip
from page.generate import GENERATE_OUT, generate
from page.models import PageOptions, cost_plot_for, exact_mode, load_other_model, remeasure_curve
from page.presets import preset_fields
from page.production import PRODUCTION_OUT, compare_production, import_production
from page.race import RACE_OUT, race
from page.settings import RANGES
from page.static import FULLSCREEN, TOGGLE_DARK
from page.sweep import SWEEP_OUT, open_sweep_run, sweep
from page.traces import IMPORT_OUT, export_trace, import_trace
from page.zerogpu import REMEASURE_S, ZERO_GPU, generate_gpu_seconds, gpu_handler, race_gpu_seconds, sweep_gpu_seconds


class RunBoard:
    """Server-wide count of runs holding the model (no user data): lets a waiting visitor read, in words,
    why their Generate has not started (``models.busy``: a cold start's measurement; ``models.compiling``: the
    forward compiled between runs)."""

    def __init__(self, models: ModelRegistry) -> None:
        self._lock, self.running, self.models = threading.Lock(), 0, models

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
        if self.models.busy:
            return self.models.busy
        if self.models.compiling and not self.running:
            return self.models.compiling
        if not self.running:
            return "Starting …"
        return ("Waiting in line: another run (another visitor's, or your own earlier one) is using the model. "
                "Yours starts as soon as it ends; runs are capped, so this is a short wait.")


def wire_runs(page: Page, models: ModelRegistry) -> None:
    """Generate, Race and Stop: the runs that hold the model (one at a time, counted by a ``RunBoard``).  While a
    run waits in line, the words saying so stay readable: the queue's progress shows on the tree (Generate) and
    the race's text boxes (Race), not over them."""
    board = RunBoard(models)
    waiting = lambda: board.waiting_words()  # noqa: E731
    model_bound = dict(concurrency_limit=1, concurrency_id="model")
    back = ("memory",) if ZERO_GPU else ()  # ZeroGPU: the worker's copy of the visitor's memory comes back
    page.go_btn.click(waiting, None, page.notice, queue=False, api_visibility="private")  # at once, beside the run:
    wire(page.go_btn.click, Endpoint(gpu_handler(generate, models, generate_gpu_seconds), ("settings", "drawing",
         "pace", "session"), GENERATE_OUT + back, around=board.wrap), page, api_name="generate",
         show_progress="minimal", show_progress_on=[page.tree_plot], **model_bound)  # its first frame replaces the
    # waiting words; "minimal": the queue position and a timer on the tree, no spinner over it (a browser on the
    # server's CPU draws at the engine's expense: docs/results.md, "The page's engine thread")
    page.race_btn.click(waiting, None, page.race_board, queue=False, api_visibility="private")
    wire(page.race_btn.click, Endpoint(gpu_handler(race, models, race_gpu_seconds), ("settings", "race_seconds",
         "session"), RACE_OUT + back, around=board.wrap), page, api_name="race",
         show_progress_on=[page.race_ar, page.race_spec], **model_bound)
    stop = Endpoint(request_stop, ("control",))
    wire(page.stop_btn.click, stop, page, queue=False, api_visibility="private")
    page.sweep_btn.click(waiting, None, page.sweep_status, queue=False, api_visibility="private")
    wire(page.sweep_btn.click, Endpoint(gpu_handler(sweep, models, sweep_gpu_seconds), ("settings", "sweep_param",
         "sweep_values", "session"), SWEEP_OUT, around=board.wrap), page, api_name="sweep",
         show_progress_on=[page.sweep_plot], **model_bound)
    wire(page.sweep_stop.click, stop, page, queue=False, api_visibility="private")


def wire_cycles(page: Page, models: ModelRegistry) -> None:
    """The scrubber, its buttons, the drawing toggles, token clicks, step-through and trace files."""
    bound = {"models": models}
    for trigger, step in ((page.scrubber.input, 0), (page.back_btn.click, -1), (page.fwd_btn.click, 1),
                          (page.show_ghosts.input, 0), (page.show_all.input, 0), (page.price_curve.submit, 0)):
        wire(trigger, Endpoint(show_cycle, ("run", "scrubber", "drawing", "model_key"), CYCLE_OUT,
                               fixed={"step": step, "models": models}), page,
             api_visibility="private", trigger_mode="always_last", preprocess=False)
        # typed values and arrow keys fire input too; the output sets the slider without firing it again.
        # preprocess=False: gradio's bounds check would fail a typed 999 and blank the tree; show_cycle clamps it

    def token_clicked(run, show_ghosts, show_all, model_key, evt: gr.SelectData):  # gradio injects evt by type
        return page.keyed(jump_to_token(run, evt.index, Drawing(show_ghosts, show_all), model_key, models=models))

    page.output.select(token_clicked, [page.run, page.show_ghosts, page.show_all, page.model_key],
                       [page[n] for n in CYCLE_OUT], api_visibility="private")
    wire(page.step_btn.click, Endpoint(step_through, ("run", "scrubber", "drawing", "session"),
                                       ("scrubber", "tree_plot", "explain", "output"), bound), page,
         api_name="step_through", preprocess=False)  # the scrubber's raw value, clamped by the handler
    wire(page.export_btn.click, Endpoint(export_trace, ("run", "model_key"), ("export_file",), bound), page,
         api_visibility="private")
    wire(page.import_file.upload, Endpoint(import_trace, ("import_file", "drawing", "model_key"), IMPORT_OUT, bound),
         page, api_name="import_trace")
    wire(page.import_production.upload, Endpoint(import_production, ("import_production", "run"), PRODUCTION_OUT),
         page, api_name="import_production")
    wire(page.compare_btn.click, Endpoint(compare_production, ("production", "run"), PRODUCTION_OUT[1:4]), page,
         api_visibility="private")
    wire(page.sweep_open.input, Endpoint(open_sweep_run, ("sweep_open", "sweep_state", "drawing", "model_key"),
                                         (*GENERATE_OUT, "header"), bound), page, api_visibility="private")


def wire_settings_and_models(page: Page, models: ModelRegistry, options: PageOptions) -> None:
    """Presets, the adaptive r / auto c switches, the model picker, the cost curve, dark mode, full screen."""
    wire(page.preset.input, Endpoint(preset_fields, ("preset",), ("prompt", "prompt_format")), page,
         api_visibility="private")
    page.auto_r.input(lambda a: gr.Slider(interactive=not a), page.auto_r, page.spine_ratio, api_visibility="private")
    wire(page.method.input, Endpoint(method_fields, ("settings",), ("drafter", "serve")), page,
         api_visibility="private", show_progress="hidden")
    for trigger in (page.drafter.change, page.auto_c.input, page.gt_threshold.release, page.budget.release,
                    page.sources.input):  # the command follows the settings it reads
        wire(trigger, Endpoint(serve_fields, ("settings",), ("serve",)), page, api_visibility="private",
             show_progress="hidden")
    page.auto_c.input(lambda a: gr.Slider(interactive=not a), page.auto_c, page.gt_threshold, api_visibility="private")
    wire(page.load_btn.click, Endpoint(load_other_model, ("model_name", "device", "dtype", "model_key"),
                                       ("model_status", "model_key", "header", "prompt_format", "lesson"),
                                       {"models": models, "options": options}), page,
         api_name="load_model", concurrency_id="load", concurrency_limit=1)
    # (its own queue and thread: a slow fetch never delays another visitor's Generate; only the load's timed steps
    # run on the engine thread, between runs)
    for button in (page.exact_btn, page.lesson_exact_btn):  # the race's, and the lesson's one click to exact
        wire(button.click, Endpoint(exact_mode, ("model_key",), ("model_status", "model_key", "header", "prompt_format",
                                                               "race_board", "lesson"),
                                    {"models": models, "options": options}),
             page, api_visibility="private", concurrency_id="load", concurrency_limit=1)
    wire(page.remeasure.click, Endpoint(gpu_handler(remeasure_curve, models, REMEASURE_S), ("budget", "model_key"),
                                        ("curve", "cost_plot", "lesson")), page, api_visibility="private",
         concurrency_id="model", concurrency_limit=1)
    # a number typed outside a slider's range: gr.Slider's own check (its preprocess) would raise a red "Error"
    # toast while the box kept the number, so these two read the raw values (preprocess=False) and bring it back
    wire(page.budget.change, Endpoint(cost_plot_for, ("budget", "model_key", "curve"), ("cost_plot",),
                                      {"models": models}), page, api_visibility="private", preprocess=False)
    for name in (*RANGES, *VIEW_RANGES):  # at once, with a sentence (queued: toasts show only from the queue; it
        # holds no model)
        box = page[name]
        box.input(lambda value, n=name: or_skip(keep_in_range(value, name=n, cap=options.max_new_tokens)), box, box,
                  api_visibility="private", show_progress="hidden", concurrency_limit=None, preprocess=False)
    page.dark_btn.click(None, js=TOGGLE_DARK)
    page.full_btn.click(None, js=FULLSCREEN)


def wire_events(page: Page, models: ModelRegistry, options: PageOptions) -> None:
    """Every event of the page (``page``: its components, built): runs, cycles, settings and models."""
    wire_runs(page, models)
    wire_cycles(page, models)
    wire_settings_and_models(page, models, options)
