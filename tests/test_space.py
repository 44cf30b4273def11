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
    from engine.product.models.loading import ModelRegistry
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
