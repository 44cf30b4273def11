"""goose-lens: a Gradio page that streams speculative decoding and draws every cycle's draft tree.

    python app.py [--model smollm2|demo|ID|PATH] [--device auto|cpu|cuda] [--dtype auto|fp32|fp16|bf16|q4]
                  [--host 127.0.0.1] [--port 7860] [--share] [--public]

The Space's entry point (``app_file: app.py``): this file parses the command line, loads the start model and
launches the page.  The page is the package ``page/`` (its layout ``page.layout``, its handlers, the contract between
the two ``page.contract``, the ZeroGPU glue ``page.zerogpu``, its CSS and JavaScript ``page/assets``); the figures
and the words about a run are ``viz/``; the engine and its policies ``engine/``.  The handlers that run forward
passes (Generate, Race, Sweep, Re-measure) are wired through ``gpu_handler``: on a ZeroGPU Space under
``spaces.GPU``, which gives each call a GPU (``ZERO_GPU``, ``place_models``; GPU allowances such as
``generate_gpu_seconds``); elsewhere on the page's one engine thread, which also loads the start model
(``engine/product/models/engine_thread.py``: torch runs at full speed there, not on the web server's pool threads).
"""
from __future__ import annotations

import argparse
import logging
import sys

try:  # Hugging Face Spaces: imported before anything touches CUDA, as ZeroGPU asks
    import spaces
except ImportError:  # not installed: the handlers run as they are
    spaces = None

import gradio as gr

from engine.decoding.compiled_cycle import KERNELS
from engine.product.io.options import add_model_options
from engine.product.io.traces import MAX_BYTES
from engine.product.models.engine_thread import EngineThread
from engine.product.models.loaded import LoadedModel
from engine.product.models.loading import load_model, tqdm_progress
from engine.product.models.model_source import DEMO_MODEL, ModelLoadError
from page.layout import build_demo
from page.models import ALLOWED_ENV, PageOptions
from page.startup import MEASURING, provisional_dtype, settle
from page.static import CSS
from page.zerogpu import ZERO_GPU, generate_gpu_seconds, gpu_handler, on_start_thread, place_models

__all__ = ["CSS", "ZERO_GPU", "PageOptions", "build_demo", "generate_gpu_seconds", "gpu_handler", "load_start_model",
           "main", "parse_args", "place_models", "spaces"]


def load_start_model(name: str | None, device: str = "auto", dtype: str = "auto") -> tuple[LoadedModel, str | None]:
    """The model the page starts with, and a notice for the page when the default could not be had.

    ``name`` None means the default (``$GOOSE_LENS_MODEL``, else SmolLM2): when it cannot be had (offline,
    no pip, checksum) the page falls back to the embedded demo model and says why.  A model named on the
    command line is not replaced: its ``ModelLoadError`` propagates.  It runs the eager forward path; ``settle``
    chooses the path once the page is up.
    """
    try:
        return load_model(name, device=device, dtype=dtype, progress=tqdm_progress("model")), None
    except ModelLoadError as exc:
        if name is not None:
            raise
        lm = load_model(DEMO_MODEL, device=device, dtype=dtype)
        return lm, (f"⚠ The default model could not be had, so this page runs the small embedded demo model "
                    f"({lm.describe()}) instead: {exc}")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="goose-lens: visual debugger for training-free speculative decoding")
    add_model_options(ap)
    ap.add_argument("--host", default=None, help="default: $GRADIO_SERVER_NAME, else 127.0.0.1 (a Space sets it)")
    ap.add_argument("--port", type=int, default=None, help="default: $GRADIO_SERVER_PORT, else 7860")
    ap.add_argument("--share", action="store_true", help="create a public gradio.live link")
    ap.add_argument("--public", action="store_true", help="public mode (also when $SPACE_ID is set): allowlisted "
                    f"models only (${ALLOWED_ENV}), capped runs, per-visitor cost-curve re-measure")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(format="%(message)s")  # the start-up steps (precision, cost curve) on the console
    for layer in ("engine", "page"):
        logging.getLogger(layer).setLevel(logging.INFO)
    engine = EngineThread()  # all torch work runs there, this thread's too (engine/product/models/engine_thread.py)
    dtype = provisional_dtype(args.model, args.device, args.dtype)  # a cold start measures once the page is up
    try:
        lm, notice = on_start_thread(engine, load_start_model, args.model, device=args.device, dtype=dtype)  # eager
    except ModelLoadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if notice:
        print(notice, file=sys.stderr)
    options = PageOptions.from_env(args.public or args.share, notice)
    models = place_models(lm, options, engine=engine)  # warmed up (on ZeroGPU: every allowed model, graphed)
    models.busy = MEASURING if dtype != args.dtype else None  # until settle has measured
    demo = build_demo(models, options)
    if not ZERO_GPU:  # queued first on the engine thread: a cold start's precision, the forward path, the cost curve
        # (on ZeroGPU place_models chose the graphed path and measured its curve in its start-up GPU call)
        engine.submit(settle, models, DEMO_MODEL if notice else args.model, args.device, dtype != args.dtype,
                      args.forward)
        # then the compiled cycle's kernels, on a thread of their own (about 45 s the first time, the measurement
        # left alone); until they are ready the page plans in Python: the same tokens, more host time a cycle
        engine.submit(KERNELS.warm_soon)
    print("starting the page …", file=sys.stderr)
    demo.queue(default_concurrency_limit=1).launch(server_name=args.host, server_port=args.port, share=args.share,
                                                   css=CSS, theme=gr.themes.Soft(), max_file_size=MAX_BYTES)
    return 0


if __name__ == "__main__":
    sys.exit(main())
