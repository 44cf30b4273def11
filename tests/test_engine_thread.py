"""The engine thread (engine/product/models/engine_thread.py): one long-lived thread runs every forward of the page.

Torch on a web server's pool threads ran at half speed (scripts/thread_speed.py), so the page hands its torch work
to one thread.  These tests check what it promises (ordering, inline calls from itself, streaming, merging, errors,
closing) and that every forward of a page run, race, sweep and re-measure happens on it, by recording the thread of
each forward with a forward pre-hook; nothing is timed.
"""
from __future__ import annotations

import copy
import threading

import pytest

from engine.product.models.engine_thread import EngineThread


def test_calls_run_on_one_long_lived_thread_in_order():
    engine = EngineThread()
    seen = [engine.call(threading.get_ident) for _ in range(3)]
    assert set(seen) == {engine.ident} and engine.ident != threading.get_ident()
    order = []
    futures = [engine.submit(order.append, i) for i in range(5)]
    [f.result() for f in futures]
    assert order == list(range(5))
    assert engine.call(lambda: engine.call(lambda: 7)) == 7  # a call from the engine thread runs inline


def test_stream_relays_items_and_errors():
    engine = EngineThread()

    def items(n):
        for i in range(n):
            yield (i, threading.get_ident())

    out = list(engine.stream(items, 4))
    assert [i for i, _ in out] == [0, 1, 2, 3] and {t for _, t in out} == {engine.ident}

    def broken():
        yield 1
        raise ValueError("bad input")

    got = []
    with pytest.raises(ValueError, match="bad input"):
        for item in engine.stream(broken):
            got.append(item)
    assert got == [1]


def test_waiting_frames_merge_into_the_newest():
    engine = EngineThread()
    release = threading.Event()

    def frames():
        yield {"a": 0}
        release.wait(5)  # the other side has taken the first frame
        for i in range(1, 4):
            yield {"a": i, f"k{i}": i}

    stream = engine.stream(frames, merge=lambda old, new: {**old, **new})
    assert next(stream) == {"a": 0}
    release.set()
    engine.call(lambda: None)  # the generator has run to its end: three frames wait
    assert list(stream) == [{"a": 3, "k1": 1, "k2": 2, "k3": 3}]


def test_closing_the_stream_stops_the_generator():
    engine = EngineThread()
    closed, more = threading.Event(), threading.Event()

    def frames():
        try:
            yield 1
            more.wait(5)
            yield 2
            yield 3
        finally:
            closed.set()

    stream = engine.stream(frames)
    assert next(stream) == 1
    stream.close()  # the visitor left
    more.set()
    assert closed.wait(5)
    assert engine.call(lambda: "free") == "free"  # and the engine serves the next job


def _page_fn(demo, api_name: str):
    fn = next(f for f in demo.fns.values() if f.api_name == api_name)
    values = {name: copy.deepcopy(getattr(block, "value", None))  # what a new visitor's page sends
              for name, block in zip(fn.input_keyword_names, fn.inputs)}
    return fn, values


def test_every_forward_of_the_page_runs_on_the_engine_thread(demo_lm):
    from page.layout import build_demo
    from page.models import PageOptions
    from page.zerogpu import place_models

    engine = EngineThread()
    models = place_models(demo_lm, PageOptions(), zero_gpu=False, engine=engine)
    threads: list[int] = []
    hook = demo_lm.model.register_forward_pre_hook(lambda *_: threads.append(threading.get_ident()))
    try:
        demo = build_demo(models)
        generate, values = _page_fn(demo, "generate")
        values.update(prompt="def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n", max_new_tokens=24,
                      prompt_format="raw")
        frames = list(generate.fn(**values))
        assert any("τ" in str(v) for f in frames for v in f.values())  # the run finished, AR timed after it
        race, values = _page_fn(demo, "race")
        values.update(prompt="1, 2, 3, 4, 1, 2, 3, 4, 1, 2,", max_new_tokens=12, prompt_format="raw",
                      race_seconds=0)
        list(race.fn(**values))
        sweep, values = _page_fn(demo, "sweep")
        values.update(prompt="a b c a b c a b", max_new_tokens=8, prompt_format="raw", sweep_values="4, 8")
        list(sweep.fn(**values))
        remeasure = next(f for f in demo.fns.values() if getattr(f.fn, "__name__", "") == "remeasure_curve")
        remeasure.fn(budget=8, model_key=None)
    finally:
        hook.remove()
    assert len(threads) > 20  # the run, AR's timing, the race's lanes, the sweep's runs and the re-measure
    assert set(threads) == {engine.ident}


def test_a_cold_start_serves_fp32_then_switches_to_the_measured_precision(demo_lm, monkeypatch):
    """page.startup: a CPU's "auto" that this machine has not measured loads fp32 first; once the page is up the
    measured model becomes every visitor's default, and a waiting Generate says why meanwhile."""
    import dataclasses

    from engine.product.models import precision
    from engine.product.models.registry import ModelRegistry
    from page import startup
    from page.events import RunBoard

    monkeypatch.setattr(precision, "cached_choice", lambda name, cache_dir=None: None)
    assert startup.provisional_dtype("demo", "cpu", "auto") == "fp32"
    assert startup.provisional_dtype("demo", "cpu", "bf16") == "bf16"
    monkeypatch.setattr(precision, "cached_choice", lambda name, cache_dir=None: precision.PrecisionChoice(
        "bf16", "measured", {}))
    assert startup.provisional_dtype("demo", "cpu", "auto") == "auto"

    models = ModelRegistry(demo_lm)
    measured = dataclasses.replace(demo_lm, name="demo-measured")  # stands in for the auto load (another key)
    seen = {}

    def load(name, device, dtype):
        seen["busy"] = RunBoard(models).waiting_words()
        return measured

    monkeypatch.setattr(startup, "load_model", load)
    from engine.product.models.cost_cache import CurveOwner
    def shared(owner, say=None):  # the measurement says its step, with its estimate, as it starts
        say("timing verification forwards of 1-128 rows (once per machine and model, about 496 s here)")
        seen["curve_busy"] = RunBoard(models).waiting_words()
        return seen.setdefault("curve_of", owner.model)

    monkeypatch.setattr(CurveOwner, "shared", shared)
    monkeypatch.setattr(type(measured), "warm_up", lambda self: None)
    models.engine.call(startup.settle, models, "demo", "cpu", True)
    assert seen["busy"] == startup.MEASURING and models.busy is None
    assert seen["curve_busy"] == ("This machine is being measured once, right after a cold start; now its cost curve: "
                                  "timing verification forwards of 1-128 rows (once per machine and model, about 496 s "
                                  "here). Your run starts when that is done.")
    assert models.get(None) is measured and models.get(models.key_of(demo_lm)) is demo_lm
    assert seen["curve_of"] is measured.model
    assert RunBoard(models).waiting_words() == "Starting …"
    from page.models import on_visit  # a page opened now names the new model; one built with it gets no update

    curve_id = measured.curves.known().id
    update = on_visit(None, 8, models=models, built=(models.key_of(demo_lm), curve_id))
    assert set(update) == {"header", "lesson", "cost_plot"}
    assert on_visit(None, 8, models=models, built=(models.key_of(measured), curve_id)) == {}
    # issue 56: the curve changed since the page was built (a refinement): a fresh visit shows the one in use
    assert set(on_visit(None, 8, models=models, built=(models.key_of(measured), "another-id"))) == {
        "header", "lesson", "cost_plot"}
    # a page opened during the measurement looks again every few seconds: nothing while it lasts, then the model
    # every visitor runs now, and it stops looking (it kept "fp32: the exact mode" in its header)
    from page.models import after_settling

    models.busy = startup.MEASURING
    assert after_settling(None, 8, models=models, built=(models.key_of(demo_lm), None)) == {}
    models.busy = None
    update = after_settling(None, 8, models=models, built=(models.key_of(demo_lm), None))
    assert set(update) == {"header", "lesson", "cost_plot", "settle_timer"} and update["settle_timer"].active is False
    assert update["header"] == on_visit(None, 8, models=models, built=(models.key_of(demo_lm), None))["header"]


def test_a_queued_visitor_reads_how_long_runs_take_here(demo_lm):
    """Gradio's queue timer promised "1.2/68.0s" for a ~10 s wait (its mean counted a cold start's measurement);
    the waiting words give the run in progress and the median of the last runs instead (the timer is hidden)."""
    from engine.product.models.registry import ModelRegistry
    from page.events import RunBoard

    now = [100.0]
    board = RunBoard(ModelRegistry(demo_lm), clock=lambda: now[0])

    def run(seconds):
        yield "frame"
        now[0] += seconds

    for seconds in (70.0, 9.0, 11.0):  # a cold start's long first run, then two ordinary ones
        list(board.wrap(run)(seconds))
    assert board.waiting_words() == "Starting …"
    held = board.wrap(run)(10.0)
    next(held)  # a run holds the model
    now[0] += 4.0
    words = board.waiting_words()
    assert "Waiting in line" in words and ", running 4 s; the last 3 runs took 11 s each (median)" in words
    list(held)
    assert board.running == 0
