"""A Hugging Face Space, checked on the CPU: the page with ``spaces`` installed, and ZeroGPU's process boundary.

``spaces.GPU`` is effect-free off ZeroGPU, so the page must build and a Generate must run through the functions
the page wires with the package importable.  On ZeroGPU a decorated call runs in a worker process forked from the
server: its arguments and every frame it yields are pickled across, and what the worker changes in them stays
there (spaces/zero/wrappers.py).  ``zero_gpu_call`` stands in for that boundary here (pickle round trips, the
worker's own copies), so the wiring ``page.zerogpu.gpu_handler`` adds for ZeroGPU is checked without a Space: nothing it
sends is unpicklable, the visitor's source memory comes back, and Stop reaches the run.
"""
from __future__ import annotations

import copy
import inspect
import pickle

import pytest
from test_graphs import timed  # noqa: F401 - a fixture: the decoding stopwatches running now

CODE = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n"


def zero_gpu_call(fn, duration=None):
    """What ``spaces.GPU(fn, duration=duration)`` does to a call on ZeroGPU, minus the GPU: the duration is computed
    from the call's arguments; the arguments are pickled into the worker; each result is pickled back."""
    def across(value):
        return pickle.loads(pickle.dumps(value))

    def seconds(args, kwargs) -> float:
        return duration(*args, **kwargs) if callable(duration) else duration

    if inspect.isgeneratorfunction(fn):
        def stream(*args, **kwargs):
            assert 0 < seconds(args, kwargs) <= 120
            args, kwargs = across((args, kwargs))
            for frame in fn(*args, **kwargs):
                yield across(frame)
        return stream

    def call(*args, **kwargs):
        assert 0 < seconds(args, kwargs) <= 120
        args, kwargs = across((args, kwargs))
        return across(fn(*args, **kwargs))
    return call


def test_the_page_builds_and_generates_with_spaces_installed(demo_lm):
    spaces = pytest.importorskip("spaces")

    import app
    from page import zerogpu

    assert zerogpu.spaces is spaces and not zerogpu.ZERO_GPU  # installed, and not on a ZeroGPU Space
    handler = lambda: None  # noqa: E731
    assert zerogpu.on_gpu(handler, 30) is handler  # spaces.GPU is effect-free off ZeroGPU
    demo = app.build_demo(demo_lm)
    generate = next(f for f in demo.fns.values() if f.api_name == "generate")
    assert inspect.unwrap(generate.fn) is not generate.fn  # RunBoard's wrapper around the page's adapter
    values = {name: copy.deepcopy(getattr(block, "value", None))  # what a new visitor's page sends
              for name, block in zip(generate.input_keyword_names, generate.inputs)}
    values.update(prompt=CODE, max_new_tokens=16, prompt_format="raw")
    frames = list(generate.fn(**values))  # keyed by component, as gradio takes them
    assert frames and all(isinstance(f, dict) for f in frames)
    texts = [v for f in frames for v in f.values() if isinstance(v, str)]
    assert any("cycles" in t and "τ" in t for t in texts)  # the stats line of a finished run


def test_zero_gpu_wiring_crosses_the_process_boundary(demo_lm):
    from engine.product.models.registry import ModelRegistry
    from engine.product.runs.metrics import summarize
    from engine.sources import SourceMemory
    from page.contract import Session
    from page.generate import generate as page_generate
    from page.models import remeasure_curve
    from page.race import race as page_race
    from page.settings import PageSettings
    from page.zerogpu import REMEASURE_S, generate_gpu_seconds, gpu_handler, race_gpu_seconds

    models = ModelRegistry(demo_lm)
    generate = gpu_handler(page_generate, models, generate_gpu_seconds, zero_gpu=True, decorate=zero_gpu_call)
    assert generate.__name__ == "generate" and "models" not in [
        p for p, v in inspect.signature(generate).parameters.items() if v.kind is not v.KEYWORD_ONLY]
    memory, control = SourceMemory(), {"stop": True}  # a Stop left over from an earlier run is cleared
    settings = PageSettings(prompt=CODE, method="suffix", max_new_tokens=24, prompt_format="raw")
    accepted = []
    for _ in range(2):  # the second run drafts from the first one's output: the memory came back
        frames = list(generate(settings=settings, session=Session(control=control, memory=memory)))
        assert frames[-1].keys() == {"memory"} and frames[-1]["memory"] is not memory  # the worker's copy
        memory = frames[-1]["memory"]  # gradio stores it in the visitor's state
        run = next(f["run"] for f in reversed(frames) if "run" in f)
        accepted.append(summarize(run.traces).accepted_by_source["suffix"])
    assert 0 < accepted[0] < accepted[1], accepted

    # Stop: set in this process after the third frame (slow motion: a frame per cycle); the stream ends there, the
    # run unfinished (the worker's copy of the Stop request is never set: the stream is closed instead)
    control = {"stop": False}
    seen = []
    for frame in generate(settings=PageSettings(prompt=CODE, max_new_tokens=64), pace=0.2,
                          session=Session(control=control)):
        seen.append(frame)
        if len(seen) == 3:
            control["stop"] = True
    assert len(seen) == 3 and not seen[-1]["run"].traces[-1].finished

    race = gpu_handler(page_race, models, race_gpu_seconds, zero_gpu=True, decorate=zero_gpu_call)
    last = list(race(settings=PageSettings(prompt=CODE, max_new_tokens=12), race_seconds=0.0,
                     session=Session(memory=SourceMemory())))
    assert "race_board" in last[-2] and last[-1].keys() == {"memory"}
    remeasure = gpu_handler(remeasure_curve, models, REMEASURE_S, zero_gpu=True, decorate=zero_gpu_call)
    assert remeasure(budget=16, model_key=None)["curve"].nodes[0] == 1


def test_gpu_allowances_grow_with_the_work_and_stay_capped():
    from page.settings import PageSettings
    from page.zerogpu import GPU_MAX_S, generate_gpu_seconds, race_gpu_seconds

    short, long = (generate_gpu_seconds(PageSettings(prompt="x", max_new_tokens=n)) for n in (16, 512))
    assert 0 < short < long <= GPU_MAX_S
    assert generate_gpu_seconds(PageSettings(prompt="x", max_new_tokens=512), pace=2.0) == GPU_MAX_S
    assert generate_gpu_seconds(PageSettings(prompt="x", max_new_tokens=None)) > 0  # bad input: still a number
    assert race_gpu_seconds(PageSettings(prompt="x", max_new_tokens=64), race_seconds=20) > 20


def test_zero_gpu_places_its_models_at_start_up_and_offers_only_those(demo_lm):
    import app
    from page.models import load_other_model
    from page.zerogpu import place_models, zero_gpu_refusal

    options = app.PageOptions(public=True, allowed_models=("demo",), zero_gpu=True)
    models = place_models(demo_lm, options, zero_gpu=True)  # warmed up, cost curve measured ("on the GPU")
    assert models.get(None) is demo_lm
    assert zero_gpu_refusal(models, "demo", "cpu", "fp32") is None  # loaded: the picker switches to it
    refused = zero_gpu_refusal(models, "demo", "cpu", "bf16")  # another copy: not in the GPU worker
    assert refused and "places its models on the GPU when it starts" in refused
    frames = list(load_other_model("demo", "cpu", "bf16", None, models=models, options=options))
    assert "⚠" in frames[-1]["model_status"] and "model_key" not in frames[-1]


def forked_call(fn, duration=None):
    """What ``spaces.GPU(fn, duration=duration)`` does to a call on ZeroGPU, with a real process boundary: each call
    runs in a fresh fork of this process (as a ZeroGPU worker is forked from the server, spaces/zero/wrappers.py),
    its arguments pickled in and its result pickled back.  What the child changes (buffers, graphs) dies with it."""
    import multiprocessing

    import torch

    ctx = multiprocessing.get_context("fork")

    def call(*args, **kwargs):
        assert 0 < (duration(*args, **kwargs) if callable(duration) else duration) <= 120
        args, kwargs = pickle.loads(pickle.dumps((args, kwargs)))
        recv, send = ctx.Pipe(duplex=False)

        def child():
            torch.set_num_threads(1)
            try:
                send.send(("ok", fn(*args, **kwargs)))
            except BaseException as exc:  # noqa: BLE001 - the parent raises it
                send.send(("error", f"{type(exc).__name__}: {exc}"))

        process = ctx.Process(target=child)
        process.start()
        kind, value = recv.recv()
        process.join()
        if kind == "error":
            raise RuntimeError(value)
        return value
    return call


@pytest.mark.usefixtures("timed")
def test_each_zero_gpu_call_captures_its_graphs_in_its_own_process_outside_the_run(demo_lm, monkeypatch):
    """The graphed path on ZeroGPU, simulated on the CPU (``test_graphs.CpuGraphed`` stands in for the graphed path):
    place_models puts the model on it and the start-up GPU call measures its curve; each later call runs in a fresh
    fork, whose first ``make_decoder`` captures every bucket again (the server's buffers hold no graphs), before
    the run's stopwatch; the tokens are ``generate``'s."""
    import os
    from dataclasses import replace

    from conftest import greedy_reference
    from test_graphs import CpuGraphed

    import app
    from engine.core.forward import SPECS
    from engine.decoding.config import DecodeConfig
    from engine.product.runs.decoder import make_decoder
    from page import zerogpu
    from page.zerogpu import gpu_handler, place_models

    monkeypatch.setitem(SPECS, "graphed", replace(SPECS["graphed"], cls=CpuGraphed))
    monkeypatch.setattr(zerogpu, "on_gpu", forked_call)  # the start-up GPU call: in a fork too
    options = app.PageOptions(public=True, allowed_models=("demo",), zero_gpu=True)
    models = place_models(demo_lm, options, zero_gpu=True)
    path = models.get(None).forward
    assert isinstance(path, CpuGraphed) and not path.captures  # the server has no GPU: it never captures
    at_start = 0

    def run(prompt: str, max_new_tokens: int, *, models):
        lm = models.get(None)
        decoder = make_decoder(lm, DecodeConfig.of(max_new_tokens=max_new_tokens), lm.eos_token_ids)
        ids = lm.encode_prompt(prompt, chat=False)
        traces = list(decoder.generate(ids))
        return {"pid": os.getpid(), "tokens": [t for c in traces for t in c.new_tokens], "ids": ids,
                "captures": lm.forward.captures[at_start:], "replays": len(lm.forward.replays)}

    call = gpu_handler(run, models, 30, zero_gpu=True, decorate=forked_call)
    results = [call(prompt=CODE, max_new_tokens=32) for _ in range(2)]
    assert len({r["pid"] for r in results} | {os.getpid()}) == 3, "each call in its own fork"
    want = greedy_reference(demo_lm.model, results[0]["ids"], 32, demo_lm.eos_token_ids)
    for r in results:
        assert r["tokens"] == want and r["replays"] > 0
        assert r["captures"], "a fresh fork captures at its start"
        assert all(running == 0 for _, _, running in r["captures"]), "never inside the run's stopwatch"
    assert len(path.captures) == at_start, "the server itself captures nothing per call"


SPACES_EMULATION = r'''
import json, os, sys
os.environ.update(SPACES_ZERO_GPU="1", SPACES_ZERO_DEVICE_API_URL="http://127.0.0.1:9")
import torch
if torch.version.cuda is None:  # a CPU build of torch: the attributes spaces reads at import (its CUDA emulation
    torch.version.cuda = "12.8"  # replaces them on the thread that imports it)
    def _cuda_init():
        raise RuntimeError("torch._C._cuda_init")
    def _not_in_bad_fork():
        return False
    torch._C._cuda_init = getattr(torch._C, "_cuda_init", _cuda_init)
    torch.cuda._is_in_bad_fork = _not_in_bad_fork
import spaces  # noqa: F401 - its CUDA emulation, entered on this thread
sys.path.insert(0, os.getcwd())
from engine.product.models.engine_thread import EngineThread
from engine.product.models.loading import load_model
from page import zerogpu
out = {"zero_gpu": zerogpu.ZERO_GPU}
engine = EngineThread()
try:
    engine.call(load_model, "demo", device="cuda", dtype="fp32")
    out["engine_thread"] = "loaded"
except Exception as exc:
    out["engine_thread"] = type(exc).__name__
lm = zerogpu.on_start_thread(engine, load_model, "demo", device="cuda", dtype="fp32")
out["start_thread"] = str(lm.model.device)
print(json.dumps(out))
'''


@pytest.mark.full  # a subprocess importing gradio and spaces: ~20 s
def test_the_start_model_loads_under_spaces_cuda_emulation_on_the_importing_thread_only(tmp_path):
    """``spaces``' own ZeroGPU emulation (its ``torch.patch``), run on the CPU: a model moved to "cuda" on the thread
    that imported ``spaces`` is recorded for the GPU worker; on another thread (the engine thread) the emulation,
    thread-local, is off and the move fails; ``on_start_thread``, which app.py loads the start model with, loads it
    on the importing thread."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("spaces")
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", SPACES_EMULATION], cwd=root, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["zero_gpu"] and out["start_thread"] == "cuda:0"
    assert out["engine_thread"] != "loaded", "the emulation is thread-local: the engine thread cannot load"
