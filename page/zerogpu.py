"""ZeroGPU glue: the handlers that run forward passes (Generate, Race, Sweep, Re-measure) are wired through
``gpu_handler``: under ``spaces.GPU`` where the ``spaces`` package is installed, which on a ZeroGPU Space gives each
call a GPU and elsewhere changes nothing (``ZERO_GPU``, ``place_models``).
"""
from __future__ import annotations

import inspect
import os
import sys
from dataclasses import replace
from functools import wraps

try:  # Hugging Face Spaces: imported before anything touches CUDA, as ZeroGPU asks
    import spaces
except ImportError:  # not installed: the handlers run as they are
    spaces = None

from engine.core.forward import SPECS
from engine.product.models.engine_thread import EngineThread
from engine.product.models.loaded import LoadedModel
from engine.product.models.loading import load_model, resolve_device, resolve_dtype, tqdm_progress
from engine.product.models.model_source import ModelLoadError, resolve, sentence
from engine.product.models.registry import ModelRegistry
from page.contract import Session
from page.policy import AR_TIMING_TOKENS
from page.settings import PageSettings

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




def sweep_gpu_seconds(settings: PageSettings, sweep_param=None, sweep_values: str = "", session=None, **_) -> int:
    """``sweep``'s GPU allowance on ZeroGPU (s): AR and one run per value, capped at ``GPU_MAX_S``."""
    try:
        tokens = int(settings.max_new_tokens) * (1 + len([v for v in str(sweep_values).split(",") if v.strip()]))
    except (TypeError, ValueError):
        tokens = 1
    return _gpu_seconds(tokens)


def gpu_handler(handler, models: ModelRegistry, duration, zero_gpu: bool = ZERO_GPU, decorate=on_gpu):
    """``handler`` (a page handler that runs forward passes, its registry a keyword-only ``models``) bound to
    ``models`` and run under ``decorate(fn, duration)`` (``on_gpu``), as the page wires it.

    Built for ZeroGPU's pattern: the weights are placed on the GPU at start-up (``place_models``) and the decorated
    function runs the forward passes, in a worker forked from this process.  The registry is bound here, in a
    closure the worker inherits, so only the visitor's inputs are pickled across, never the weights, and a
    streaming handler's frames come back one by one.  What the worker changes in the visitor's state stays there;
    with ``zero_gpu`` a streaming handler gets ``_relayed`` for it (the visitor's memory and their Stop request).

    Without ``zero_gpu`` the handler runs on the registry's engine thread (``models.engine``, see
    ``engine/product/models/engine_thread.py``: torch on a web server's pool threads runs at up to half speed), its
    frames
    relayed to the server's thread as they come, the ones the page has not taken yet merged into the newest;
    ``on_gpu`` returns the bound handler itself there (``spaces.GPU`` is effect-free off ZeroGPU).  The result keeps
    ``handler``'s name and signature (``wire`` reads them) and takes its arguments by keyword.

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
        return decorate(call, duration) if zero_gpu else models.engine.wrap(decorate(call, duration))

    @wraps(handler)
    def stream(*args, **kwargs):  # where the GPU is (on ZeroGPU: in the worker)
        yield from handler(*args, **kwargs, models=models)
        session = kwargs.get("session")
        if zero_gpu and session is not None and session.memory is not None:
            yield {"memory": session.memory}  # the worker's copy, which the run updated

    on_device = decorate(stream, duration)
    return _relayed(handler, on_device) if zero_gpu else models.engine.wrap(on_device, merge=_newer_frame)


def _newer_frame(older: dict, newer: dict) -> dict:
    """Two frames the page has not taken yet, as one: the newer value of each component."""
    return {**older, **newer}


def _relayed(handler, on_device):
    """``on_device`` (a streaming handler run in a ZeroGPU worker) seen from this process, for ``gpu_handler``:

    * the visitor's source memory comes back as one more frame, ``{"memory": ...}`` (wire the ``memory`` state as
      an output too);
    * Stop: the worker never sees the visitor's ``control`` dict, so this process watches it between frames and,
      once Stop is set, closes the stream; ``spaces`` then ends the worker's run at its next frame (what is on the
      page stays; the run's closing frame, with the speedup, does not come).
    """
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


def on_start_thread(engine: EngineThread, fn, *args, zero_gpu: bool = ZERO_GPU, **kwargs):
    """``fn(*args, **kwargs)`` where the page's start model is loaded: elsewhere on the engine thread
    (``engine.call``: torch at full speed there), on ZeroGPU on this thread, the one that imported ``spaces``.

    There ``spaces`` emulates CUDA in this process, which has no GPU: tensors moved to "cuda" stay on the host,
    recorded for the move to the GPU worker.  The emulation is a ``TorchFunctionMode``, which is thread-local, entered
    on the thread that imported ``spaces`` (spaces/zero/torch/patching.py, ``patch``; spaces' own wrappers enter it
    again on their threads: "TorchModes are thread-local"); a model moved to "cuda" on the engine thread would meet
    torch's real CUDA initialisation, which ``spaces`` makes raise ("Low-level CUDA init reached").
    tests/test_space.py checks both under ``spaces``' own emulation.
    """
    return fn(*args, **kwargs) if zero_gpu else engine.call(fn, *args, **kwargs)


def graphed(lm: LoadedModel) -> LoadedModel:
    """``lm`` on the graphed forward path (``engine.core.forward.graphs``) where that path can run it (a model on CUDA),
    else ``lm`` itself.  ZeroGPU's choice: each GPU call is a fresh fork of the server, so the graphs are captured
    at the start of each call (``make_decoder`` prepares the path before a run's clock; docs/deploy.md says why this
    and not ahead-of-time compilation), and the start-up GPU call measures the cost curve on that path."""
    spec = next(s for s in SPECS.values() if s.prepare == "capture")  # CUDA graphs, no compile (ZeroGPU has none)
    if spec.problem(lm.model) is not None:
        return lm
    try:
        path = spec.make(lm.model)
    except ValueError:  # a model the static path cannot serve: eager
        return lm
    return replace(lm, forward_path=path,
                   forward_reason=f"{spec.name}: CUDA graphs captured at the start of each GPU call")


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


def place_models(first: LoadedModel, options, zero_gpu: bool = ZERO_GPU, engine: EngineThread | None = None
                 ) -> ModelRegistry:
    """The page's models, ready to serve (``options``: the page's ``page.models.PageOptions``).

    Elsewhere: ``first`` alone, warmed up on ``engine`` (the page's engine thread, which then runs every forward of
    the page: ``gpu_handler``) with one small forward, so the first Generate does not pay for torch's lazy
    initialisation (its cost curve is measured there once the page is up: ``page.startup.settle``); the model
    picker loads others when asked.

    On ZeroGPU, its documented pattern: models are moved to the GPU at start-up, in this process, outside the
    decorated functions.  Every allowlisted model is loaded now (device and dtype auto: the GPU, bf16), since a GPU
    worker is a fork of this process and has only the models loaded before it started (``zero_gpu_refusal``), each
    on the graphed forward path (``graphed``); then one GPU call warms each up, captures its graphs and measures its
    cost curve on that path into the disk cache
    (``engine.product.models.cost_cache``),
    which this process, which has no GPU, reads.  A model that cannot be loaded is left out, with a line on stderr.
    """
    if not zero_gpu:
        engine = engine or EngineThread()
        engine.call(first.warm_up)
        return ModelRegistry(first, engine=engine)
    placed = [graphed(first)]
    for name in options.allowed_models:
        if name != first.name:
            try:
                placed.append(graphed(load_model(name, progress=tqdm_progress(name))))
            except ModelLoadError as exc:
                print(f"warning: {sentence(str(exc))} It is left out.", file=sys.stderr)
    models = ModelRegistry(placed[0], capacity=max(2, len(placed)), engine=engine)
    for lm in placed[1:]:
        models.put(lm)

    def prepare() -> None:  # in a GPU worker
        for lm in placed:
            lm.warm_up()
            lm.curves.shared()

    on_gpu(prepare, min(GPU_MAX_S, GPU_SETUP_S + REMEASURE_S * len(placed)))()
    return models

