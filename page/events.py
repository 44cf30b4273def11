"""The page's events: which handler each button, slider and box runs, with what, and into which components."""
from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import fields
from functools import wraps

import gradio as gr

from engine.product.models.registry import ModelRegistry
from page.contract import Drawing, Endpoint, Page, wire
from page.cycles import CYCLE_OUT, jump_to_token, request_stop, show_cycle, step_through
from page.drafter import method_fields, serve_fields
from page.frames import VIEW_RANGES, keep_in_range, or_skip
from page.generate import GENERATE_OUT, generate
from page.models import PageOptions, cost_plot_for, demo_mode, exact_mode, load_other_model, remeasure_curve
from page.presets import preset_fields
from page.production import PRODUCTION_OUT, compare_production, import_production
from page.race import RACE_OUT, race
from page.settings import RANGES
from page.static import FULLSCREEN, TOGGLE_DARK
from page.sweep import SWEEP_OUT, open_sweep_run, sweep, sweep_values_for
from page.traces import IMPORT_OUT, export_trace, import_trace
from page.zerogpu import REMEASURE_S, ZERO_GPU, generate_gpu_seconds, gpu_handler, race_gpu_seconds, sweep_gpu_seconds


class RunBoard:
    """Server-wide count of runs holding the model (no user data): lets a waiting visitor read, in words,
    why their Generate has not started (``models.busy``: a cold start's measurement; ``models.compiling``: the
    forward compiled between runs) and, behind another run, how long that has run and how long runs here take
    (the median of the last ``KEPT`` runs, s): gradio's own estimate is the mean of every run, a cold start's
    minute-long measurement included, so it promised 68 s for a 10 s wait (its timer is hidden on the page)."""

    KEPT = 9  # enough runs for a median a cold start or one long Sweep cannot move

    def __init__(self, models: ModelRegistry, clock=time.monotonic) -> None:
        self._lock, self.running, self.models, self._clock = threading.Lock(), 0, models, clock
        self._started: float | None = None  # when the run now holding the model started (clock s)
        self._took: deque[float] = deque(maxlen=self.KEPT)  # how long the last runs took (s)

    def wrap(self, fn):
        """``fn`` (a generator function) counted as running while it runs (its signature kept for the API)."""
        @wraps(fn)
        def counted(*args, **kwargs):
            with self._lock:
                self.running += 1
                self._started = self._clock()
            started = self._started
            try:
                yield from fn(*args, **kwargs)
            finally:
                with self._lock:
                    self.running -= 1
                    self._took.append(self._clock() - started)
        return counted

    def waiting_words(self) -> str:
        """What a visitor who just pressed Generate or Race is waiting for."""
        if self.models.busy:
            return self.models.busy
        if self.models.compiling and not self.running:
            return self.models.compiling
        if not self.running:
            return "Starting …"
        return ("Waiting in line: another run (another visitor's, or your own earlier one) is using the model"
                f"{self._how_long()}. Yours starts as soon as it ends; runs are capped, so this is a short wait.")

    def _how_long(self) -> str:
        """", running 4 s; the last 5 runs took 9 s each (median)": the wait in numbers, what is known of it."""
        with self._lock:
            took, started = sorted(self._took), self._started
        now = "" if started is None else f", running {self._clock() - started:.0f} s"
        if not took:
            return now
        runs = "the last run took" if len(took) == 1 else f"the last {len(took)} runs took"
        return f"{now}; {runs} {took[len(took) // 2]:.0f} s" + (" each (median)" if len(took) > 1 else "")


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
    wire(page.sweep_param.input, Endpoint(sweep_values_for, ("sweep_param",), ("sweep_values",)), page,
         queue=False, api_visibility="private")


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

    drawn_by = [page[f.name] for f in fields(Drawing)]

    def token_clicked(values: dict, evt: gr.SelectData):  # values: a set of inputs comes as {component: value};
        drawing = Drawing(*(values[c] for c in drawn_by))  # gradio injects evt by its type
        return page.keyed(jump_to_token(values[page.run], evt.index, drawing, values[page.model_key], models=models))

    page.output.select(token_clicked, {page.run, page.model_key, *drawn_by},
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
    for button, mode in ((page.exact_btn, exact_mode), (page.lesson_exact_btn, exact_mode),
                         (page.demo_btn, demo_mode)):  # the race's and the lesson's one click each
        wire(button.click, Endpoint(mode, ("model_key",), ("model_status", "model_key", "header", "prompt_format",
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
