"""The models: the page's server-wide options (public mode's allowlist), the model picker, the header and status
line that name the model, and the cost curve the visitor's runs read (the model the page starts with: ``app.py``)."""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import gradio as gr
import torch

from engine.core.forward import llamacpp
from engine.product.models.loaded import LoadedModel
from engine.product.models.model_source import DEMO_MODEL, ModelLoadError, sentence
from engine.product.models.named import DEMO_NAMES, NAMED, SMOLLM2
from engine.product.models.registry import ModelRegistry
from page.settings import RANGES
from page.zerogpu import ZERO_GPU, zero_gpu_refusal
from viz.charts import cost_figure, cost_figure_pending
from viz.lesson import lesson

#: The model line of a page built while a cold start measures (``page.startup``): the header names the model in use
PROVISIONAL_WORDS = ("For now: this machine's fastest precision is being measured (once, right after a cold start); "
                     "the header above names the model in use.")
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
        yield {"model_status": f"⚠ {refusal} Still using {current.describe()}."}
        return
    waiting = f"the current model {current.describe()} stays in use meanwhile"
    yield {"model_status": f"Loading `{name}` on {device} ({dtype}) … {waiting}."}
    t0 = time.perf_counter()

    def step_line(step, seconds):  # step: the load's last (fraction, words)
        return {"model_status": f"Loading `{name}`: {step[1]} ({step[0]:.0%}) … {waiting}."} \
            if step and step[0] > 0 else None

    try:  # a slow fetch holds no run; the load's timed steps go to the engine thread (``ModelRegistry.load``)
        lm = yield from relay(background(lambda report: models.load(
            name, device=device, dtype=dtype, progress=lambda fraction, words: report((fraction, words)))), step_line)
    except ModelLoadError as exc:
        gr.Warning(str(exc))
        yield {"model_status": f"⚠ {sentence(str(exc))} Still using {current.describe()}."}
        return
    yield {"model_status": f"✓ {using_words(lm)[:-1]}, loaded in {time.perf_counter() - t0:.1f} s.",
           "model_key": list(models.key_of(lm)), "header": header_text(lm, options.notice),
           "lesson": lesson(lm.curves.known(), lm.precision, models.speeds.typical()),
           **({} if lm.has_chat_template else {"prompt_format": "raw"})}


def exact_mode(model_key, *, models: ModelRegistry, options: PageOptions = PageOptions()) -> Iterator[dict]:
    """The race's and the lesson's "exact mode" button: the visitor's model again in fp32 (``load_other_model``),
    whose greedy output is AR's token for token, so both lanes write the same text; its lines show on the race board
    too, and the lesson's promise becomes fp32's.  Then fp32's cost curve, where this machine has none yet, is
    measured at once, saying what is timed and for about how long (``measure_curve``): the first run in the
    exact mode waited 90 s for it, with a promise of ~10 s and nothing said."""
    lm = models.get(model_key)
    device = "auto" if lm.device.startswith("auto") else lm.device
    loaded = None
    for frame in load_other_model(lm.name, device, "fp32", model_key, models=models, options=options):
        loaded = frame.get("model_key", loaded)
        yield on_race_board(frame)
    if loaded is not None and not options.zero_gpu:  # (on ZeroGPU the GPU's worker measures it, in the run)
        yield from map(on_race_board, measure_curve(models.get(loaded), models))


def demo_mode(model_key, *, models: ModelRegistry, options: PageOptions = PageOptions()) -> Iterator[dict]:
    """The lesson's "demo model" button: the embedded tiny model (``load_other_model``), where a forward costs so
    little that trees pay almost every cycle: trees at work on any device, one click from the default."""
    device = models.get(model_key).device
    yield from load_other_model(DEMO_MODEL, "auto" if device.startswith("auto") else device, "auto", model_key,
                                models=models, options=options)


def on_race_board(frame: dict) -> dict:
    """``frame`` with its status line shown on the race board too."""
    return {**frame, "race_board": frame["model_status"]} if "model_status" in frame else frame


def measure_curve(lm: LoadedModel, models: ModelRegistry) -> Iterator[dict]:
    """``lm``'s shared cost curve measured now, on the engine thread (between runs), when this machine has none:
    the status line says what is timed, its estimate and the seconds so far (``CurveStore.cached``'s steps), then
    what it measured and in how long; the lesson then reads the curve."""
    if lm.curves.known() is not None:
        return
    what = f"Measuring the cost curve of {lm.describe()} on this machine (once; Generate waits for it)"

    def line(words, seconds):
        return {"model_status": f"{what}: {words or 'waiting for the engine'} … {seconds:.0f} s so far."}

    t0 = time.perf_counter()
    curve = yield from relay(background(lambda report: models.engine.call(lm.curves.shared, report)), line)
    yield {"model_status": f"✓ {using_words(lm)[:-1]}; its cost curve measured in {time.perf_counter() - t0:.0f} s "
                           f"(T(1) {curve.latency(1):.1f} ms, T(16) {curve.latency(16):.1f} ms).",
           "lesson": lesson(curve, lm.precision, models.speeds.typical())}


def background(work: Callable[[Callable[[Any], None]], Any], every_s: float = 0.5) -> Iterator[tuple[Any, float]]:
    """``work(report)`` on a thread of its own (a slow step holds no handler of another visitor's): yields (the
    last value ``work`` passed to ``report``, None before any; seconds so far) every ``every_s`` s while it runs and
    returns its result (``yield from``'s value).

    Raises:
        whatever ``work`` raised, here.
    """
    said, result = [None], {}

    def run() -> None:
        try:
            result["value"] = work(lambda value: said.__setitem__(0, value))
        except BaseException as exc:  # re-raised on the caller's thread
            result["error"] = exc

    t0, worker = time.perf_counter(), threading.Thread(target=run, daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(every_s)
        if worker.is_alive():
            yield said[0], time.perf_counter() - t0
    if "error" in result:
        raise result["error"]
    return result["value"]


def relay(progress: Iterator[tuple[Any, float]], frame_of: Callable[[Any, float], dict | None]) -> Iterator[dict]:
    """``frame_of(value, seconds)`` for each of ``background``'s reports, a frame equal to the last one (or None)
    skipped; returns ``progress``'s result."""
    last = None
    while True:
        try:
            value, seconds = next(progress)
        except StopIteration as done:
            return done.value
        frame = frame_of(value, seconds)
        if frame is not None and frame != last:
            last = frame
            yield frame


def using_words(lm: LoadedModel) -> str:
    """The model status line: "Using SmolLM2-135M-Instruct (135M, bf16, CPU) — auto: bf16: verifies …"."""
    why = dtype_words(lm)
    return f"Using {lm.describe()}" + (f" — {why}" if why else "") + "." + llamacpp_hint(lm)


def llamacpp_hint(lm: LoadedModel) -> str:
    """One line, where a CPU model from a GGUF file runs torch's kernels because llama-cpp-python is missing: how to
    get llama.cpp's (the ``llamacpp`` forward path: the file's own 4-bit blocks, several times faster on a CPU)."""
    src = lm.source
    from_gguf = src is not None and (src.fetch is not None or src.path.endswith(".gguf"))
    if not from_gguf or lm.device != "cpu" or llamacpp.installed():
        return ""
    return (f" llama.cpp's kernels would run this model's GGUF file several times faster here: `{llamacpp.INSTALL}` "
            "(built from source, 3-4 minutes on 2 cores), then restart.")


def dtype_words(lm: LoadedModel) -> str:
    """The model's precision and why, for people: its ``dtype_reason`` (e.g. "bf16: verifies 16 rows 1.1× faster
    than fp32 here (an AR step 0.9×)", when "auto" measured it); "fp32: the exact mode" for a chosen fp32; where
    llama.cpp's kernels run the GGUF file's own weights, why that path (the torch precision then runs nothing, so
    its reason is not said: ``LoadedModel.runs``); else ""."""
    if lm.runs.weights == "gguf":
        return f"auto: the file's own {lm.runs.dtype} weights on llama.cpp's kernels ({lm.forward_reason})" \
            if lm.forward_reason else f"auto: the file's own {lm.runs.dtype} weights on llama.cpp's kernels"
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


def remeasure_curve(budget, model_key, *, models: ModelRegistry) -> dict:
    """Re-measure the cost curve for this visitor only (``curve``): nobody else's runs change."""
    lm = models.get(model_key)
    fresh = lm.curves.fresh()
    return {"curve": fresh, "cost_plot": cost_figure(fresh, int(budget)),
            "lesson": lesson(fresh, models.get(model_key).precision, models.speeds.typical())}


def cost_plot_for(budget, model_key, curve, *, models: ModelRegistry) -> dict:
    """The cost curve the visitor's runs read (their own, else the shared one) with c(B) at ``budget``."""
    lm = models.get(model_key)
    low, high, _ = RANGES["budget"]
    shown = lm.curves.own(curve) or lm.curves.known()  # never measured here: not the
    # engine thread
    if shown is None:
        return {"cost_plot": cost_figure_pending()}
    return {"cost_plot": cost_figure(shown, int(min(max(float(budget or low), low), high)))}


#: Seconds between a page's looks at a cold start's measurement, while it lasts (``after_settling``).
SETTLING_EVERY_S = 5.0


def after_settling(model_key, budget, *, models: ModelRegistry, options: PageOptions = PageOptions(),
                   built: tuple = ()) -> dict:
    """A page opened during a cold start's measurement (``page.startup.settle``), looking every
    ``SETTLING_EVERY_S`` s (its ``settle_timer``): nothing while it lasts; then the header, the lesson and the cost
    curve of the model every visitor now runs (``on_visit``), and the timer stopped.  A page opened early kept
    "fp32: the exact mode" in its header minutes after runs had moved to llama.cpp's 4-bit kernels (a browser
    walk-through).  The page is built once, so where it was built during a measurement every later visit starts the
    timer too: its first look finds the measurement done and stops it (one ``on_visit`` more, nothing redrawn that
    already matches)."""
    if models.busy:
        return {}
    return {**on_visit(model_key, budget, models=models, options=options, built=built),
            "settle_timer": gr.Timer(active=False)}


def on_visit(model_key, budget, *, models: ModelRegistry, options: PageOptions = PageOptions(),
             built: tuple = ()) -> dict:
    """A page opened: the header, the lesson and the cost curve of the visitor's model as they are now, when they
    differ from the page as built (``built``: its model's key and its curve's id, None when not yet measured); after
    a cold start the default model and its curve change once measured (``page.startup``), and runs refine the curve
    (a fresh visit would otherwise show the curve of the page's build, not the one runs read).  Nothing otherwise,
    and never the model line: an update on page load re-drew the Model accordion, and a name a visitor was typing
    there was lost; that line says instead that the header names the model (``PROVISIONAL_WORDS``)."""
    lm = models.get(model_key)
    curve = lm.curves.known()
    if (models.key_of(lm), curve.id if curve is not None else None) == tuple(built) and not models.speeds.typical():
        return {}
    return {"header": header_text(lm, options.notice), "lesson": lesson(curve, lm.precision, models.speeds.typical()),
            **cost_plot_for(budget, model_key, None, models=models)}
