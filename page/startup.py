"""A cold start: the page answers first, and measures this machine once it is up.

On a CPU, dtype "auto" measures which precision verifies trees fastest (``engine.product.models.precision``, 15-35 s
on 2 cores), the forward path (``forward_choice``, seconds) and the cost curve the GT principle sizes trees by
(``engine.product.models.cost_cache``, its time estimated and said on the console); all are cached per machine and
model.  On a machine that has none yet (a fresh clone, a restarted Space), the start model loads in fp32, the exact
mode (``provisional_dtype``), the page goes up, and ``settle`` then measures on the engine thread: for a model from a
GGUF file with llama-cpp-python installed, llama.cpp's kernels first (``llama_first``: where they win, torch's
precisions, which would run no forward, are never measured); else the measured precision's model becomes every
visitor's default (unless fp32 won) and its forward path is chosen; then the default's cost curve is measured.
Meanwhile a visitor's Generate waits for it and says why (``ModelRegistry.busy``); the header and the
model line of a page opened afterwards name the new model (``page.models.on_visit``).
"""
from __future__ import annotations

import logging
import threading
from dataclasses import replace

from engine.product.models import forward_choice, precision
from engine.product.models.loaded import LoadedModel
from engine.product.models.loading import forward_wanted, load_model, resolve_device
from engine.product.models.model_source import ModelLoadError, resolve
from engine.product.models.registry import ModelRegistry

log = logging.getLogger(__name__)  # shown on the console with the engine's start-up steps (app.py)
PROVISIONAL = "fp32"  # the start model's precision until the measured one is loaded: the exact mode
MEASURING = ("This machine is being measured once, right after a cold start (which precision and forward path "
             "verify fastest, llama.cpp's kernels first where they can run the model's file, then the cost curve; "
             "about 25-45 s on 2 cores). Your run starts when that is done.")
#: ``MEASURING`` once the cost curve is being timed, its step and its estimate for this machine filled in (the
#: console's words: ``CurveStore.cached``'s ``say``): the first words' "25-45 s" stood for minutes on a busy machine.
CURVE_NOW = ("This machine is being measured once, right after a cold start; now its cost curve: {}. Your run starts "
             "when that is done.")
COMPILING = ("This machine's forward is being compiled, one tree size at a time between runs (10-90 s each on 2 "
             "cores); runs take the eager path until every size is compiled, and yours starts when the size being "
             "compiled now is done.")


def provisional_dtype(name: str | None, device: str, dtype: str) -> str:
    """The dtype to load the start model in now: ``dtype`` itself, except a CPU's "auto" whose choice this machine
    has not measured yet: then ``PROVISIONAL`` until ``settle`` has measured it."""
    try:
        if dtype != "auto" or resolve_device(device) != "cpu":
            return dtype
        return dtype if precision.cached_choice(resolve(name).name) is not None else PROVISIONAL
    except ModelLoadError:  # the load says what is wrong
        return dtype


def settle(models: ModelRegistry, name: str | None, device: str, measure_precision: bool,
           forward: str | None = None) -> None:
    """What a cold start left for after the page is up, run on the engine thread (``models.engine``): with
    ``measure_precision``, the auto precision of ``name`` measured and, where it is not fp32, the model loaded in it
    as every visitor's default; then its forward path (``forward``, the command line's, else auto:
    ``forward_choice.choose``) made the default's, except a compiled path, which ``compile_between_runs`` compiles
    and switches to while the page serves the eager one; then the default model's cost curve.  ``models.busy``
    says so meanwhile (during the curve, its step and estimate: ``CURVE_NOW``); a load that fails keeps the fp32
    model, and anything else that fails stops the measurement, each with a line on the console."""
    models.busy = MEASURING
    try:
        kernels_won = measure_precision and llama_first(models, forward)  # then torch's precisions run nothing
        if measure_precision and not kernels_won:
            log.info("measuring this machine now; the page serves meanwhile and runs wait for it")
            try:
                lm = load_model(name, device=device, dtype="auto")  # measures, and caches the choice
            except ModelLoadError as exc:
                log.warning("keeping the fp32 model: %s", exc)
            else:
                if models.key_of(lm) != models.default_key:
                    lm.warm_up()
                    models.make_default(lm)
                log.info("every visitor's default is now %s", lm.describe())
        if not kernels_won:
            settle_forward(models, forward)
        models.get(None).curves.shared(say=lambda words: setattr(models, "busy", CURVE_NOW.format(words)))
    except Exception as exc:  # noqa: BLE001 - the page keeps serving; a run measures the curve when it needs it
        log.warning("the start-up measurement stopped: %s: %s", type(exc).__name__, exc)
    finally:
        models.busy = None


def settle_forward(models: ModelRegistry, forward: str | None) -> None:
    """The default model's forward path (``forward``, the command line's, else auto: ``forward_choice.choose``, cached
    or measured) made the default's, except a compiled path, which ``compile_between_runs`` compiles and switches to
    while the page serves the eager one."""
    default = models.get(None)
    want, gguf = forward_wanted(default, forward)  # a model from a GGUF file may take llama.cpp's kernels
    choice = forward_choice.choose(default.model, want, warm_now=False, gguf=gguf)  # cached, else measured
    chosen = replace(default, forward_path=choice.path, forward_reason=choice.reason)
    if forward_choice.cold_buckets(choice.path):
        compile_between_runs(models, chosen)
    elif chosen.forward.name != default.forward.name:
        models.make_default(chosen)
        log.info("every visitor's runs now take the %s", chosen.forward_reason)


def llama_first(models: ModelRegistry, forward: str | None) -> bool:
    """A cold start's "auto" on a model from a GGUF file with llama-cpp-python installed: llama.cpp's paths are
    measured first (issue 70), beside torch's on the provisional fp32 model, which stands for "auto" here.  Where a
    llamacpp path wins, it becomes every visitor's default and torch's precisions, which would then run no forward,
    are never measured (about 15-35 s saved on 2 cores); returns whether it won.  Nothing is chosen (False) where
    the model has no GGUF file, llama-cpp-python is missing, or ``forward`` names a torch path."""
    default = replace(models.get(None), auto_dtype=True)
    want, gguf = forward_wanted(default, forward)
    if gguf is None:
        return False
    log.info("measuring this machine now, llama.cpp's kernels first; the page serves meanwhile and runs wait for it")
    choice = forward_choice.choose(default.model, want, warm_now=False, gguf=gguf)  # cached, else measured
    if choice.path.weights() is None:
        return False
    chosen = replace(default, forward_path=choice.path, forward_reason=choice.reason, dtype_reason="")
    models.make_default(chosen)
    log.info("every visitor's default is now %s: the %s; torch's precisions are not measured, since they would run "
             "no forward", chosen.describe(), chosen.forward_reason)
    return True


def compile_between_runs(models: ModelRegistry, chosen: LoadedModel) -> threading.Thread:
    """Compile ``chosen``'s forward path one bucket at a time, each bucket a separate item on the engine thread, so
    a visitor's run queued meanwhile waits for one bucket (10-90 s on 2 cores), not all (minutes); the page serves
    the eager path until then (``models.compiling`` says so to a waiting visitor).  When every bucket is compiled,
    ``chosen`` becomes every visitor's default and its cost curve is measured.  A compile that fails leaves the eager
    path, with one line on the console.  Returns the (daemon) thread that hands the buckets over."""
    path, engine = chosen.forward, models.engine

    def switch() -> None:
        models.make_default(chosen)
        log.info("every visitor's runs now take the %s", chosen.forward_reason)
        chosen.curves.shared()

    def hand_over() -> None:
        models.compiling = COMPILING
        try:
            for rows in forward_choice.cold_buckets(path):
                took = engine.call(forward_choice.warm_bucket, path, rows)
                log.info("forward path: compiled the %d-row trees in %.0f s", rows, took)
            engine.call(switch)
        except Exception as exc:  # noqa: BLE001 - inductor's refusals take many forms; the eager path serves
            log.warning("forward path: eager, since compiling the forward failed: %s", forward_choice.first_line(exc))
        finally:
            models.compiling = None

    log.info("forward path: compiling the forward for %d tree sizes between runs; runs take the eager path until "
             "then", len(forward_choice.cold_buckets(path)))
    thread = threading.Thread(target=hand_over, name="goose-lens-compile", daemon=True)
    thread.start()
    return thread
