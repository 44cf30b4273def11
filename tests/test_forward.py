"""The forward seam (engine/core/forward/): the static and compiled paths give the eager path's tokens in fp32,
padding rows never change an output, a committed path equals a fresh prefill of it, and a run larger than its
cache's capacity regrows it.  The compiled path is compiled once per test session, on the demo model."""
from __future__ import annotations

import importlib.util

import pytest
import torch
from conftest import greedy_reference

from engine.core.forward import BUCKETS, CompiledPath, EagerPath, StaticPath, bucket, make_path, static_problem
from engine.core.tree import DraftTree, Source
from engine.decoding.config import DecodeConfig
from engine.product.runs.decoder import make_decoder

TR = Source("tr")
#  0(root)  1  2  3  4  5  6: two branches under the root, a chain of 3 under node 3
TREE_PARENTS = (None, 0, 0, 0, 3, 2, 4)

#: the page's tests need gradio, which a GPU check machine may lack (docs/deploy.md, "A GPU check")
needs_gradio = pytest.mark.skipif(importlib.util.find_spec("gradio") is None, reason="gradio is not installed")


def _tree(tokens) -> DraftTree:
    return DraftTree(tuple(tokens), TREE_PARENTS, (Source.ROOT,) + (TR,) * 6, (1.0,) * 7, (1.0,) * 7)


@pytest.fixture(scope="session")
def compiled_demo(demo_lm):
    """The demo model's compiled path, two buckets (4 and 8 rows): one compile per test session."""
    return CompiledPath(demo_lm.model, buckets=(4, 8))


def test_bucket_is_the_next_size_up_and_a_larger_tree_its_own():
    assert [bucket(n) for n in (1, 2, 3, 5, 16, 17, 128)] == [1, 2, 4, 8, 16, 32, 128]
    assert bucket(129) == 129 and bucket(3, (4, 8)) == 4
    assert BUCKETS == tuple(sorted(BUCKETS))


def test_make_path_names_and_refusals(demo_lm):
    assert [make_path(demo_lm.model, name).name for name in ("eager", "static")] == ["eager", "static"]
    assert static_problem(demo_lm.model) is None
    with pytest.raises(ValueError, match="unknown forward path"):
        make_path(demo_lm.model, "graphs")


@torch.no_grad()
def _logits(path, prompt, tree, keep=None, then=None):
    """Logits of ``tree`` verified after ``prompt``; with ``keep``, that path committed and ``then`` verified."""
    forward = path.open(len(prompt) + 16, 8)
    forward.prefill(prompt)
    out = forward.verify(tree)
    if keep is None:
        return out
    forward.commit(keep)
    assert forward.length == len(prompt) + len(keep)
    return forward.verify(then)


@pytest.mark.parametrize("keep", [[0, 3, 4, 6], [0, 1], [0]])
def test_static_path_scores_like_the_eager_one_after_a_commit(demo_lm, keep):
    """A tree, then a path of it committed out of place (rows 3, 4, 6 moved to the prefix), then the next tree: the
    static cache gives the eager cache's logits (fp32, to rounding) and the same argmax."""
    model = demo_lm.model
    prompt = demo_lm.encode_prompt("def add(a, b):\n    return a + b\n", chat=False)
    tree, then = _tree([prompt[-1], 11, 12, 13, 14, 15, 16]), _tree([17, 18, 19, 20, 21, 22, 23])
    eager = _logits(EagerPath(model), prompt, tree, keep, then)
    static = _logits(StaticPath(model), prompt, tree, keep, then)
    torch.testing.assert_close(static, eager, atol=1e-4, rtol=1e-4)
    assert torch.equal(static.argmax(-1), eager.argmax(-1))


def test_a_static_cache_holds_every_layer_in_one_tensor_unless_compiled(demo_lm):
    """So a commit moves the kept rows of every layer in two operations, not four per layer (the commit above checks
    the values); a compiled path keeps transformers' own tensors, which its graphs were traced on."""
    model = demo_lm.model
    forward = StaticPath(model).open(32, 4)
    kv, layers = forward.buffers.kv, forward.cache.layers
    assert kv.shape[:2] == (2 * len(layers), 1) and kv.shape[3] == forward.capacity
    assert all(layer.keys.data_ptr() == kv[2 * i].data_ptr() and layer.values.data_ptr() == kv[2 * i + 1].data_ptr()
               for i, layer in enumerate(layers))
    assert CompiledPath(model, buckets=(4,)).open(32, 4).buffers.kv is None  # torch.compile traces on first use only


@torch.no_grad()
def test_padding_rows_never_change_an_output(demo_lm):
    """A 7-node tree padded to 8 rows: whatever the padding row holds, the tree's rows' logits are bit for bit
    the same (the padding row sees only the committed prefix, and no row sees it)."""
    model = demo_lm.model
    prompt = demo_lm.encode_prompt("for i in range(10):\n", chat=False)
    tree = _tree([prompt[-1], 11, 12, 13, 14, 15, 16])
    outs = []
    for pad in (0, 1234):
        path = StaticPath(model)
        path.buckets = (8,)  # trees padded to 8 rows, the model's own forward
        forward = path.open(len(prompt) + 16, 8)
        forward.prefill(prompt)
        rows = forward.verify(tree)  # fills the 8-row frame, its padding row with token 0
        ids, pos, mask = forward._frame(8)
        ids[0, 7], pos[0, 7] = pad, forward.length + pad % 5  # another token and position in the padding row
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, cache=forward.cache, use_cache=True)
        assert torch.equal(out.logits[0, :7], rows)
        outs.append(rows)
    assert torch.equal(outs[0], outs[1])


def test_static_cache_regrows_past_its_capacity(demo_lm):
    """A run whose trees pass the capacity it was opened with copies its committed rows into a larger cache."""
    model = demo_lm.model
    prompt = demo_lm.encode_prompt("x = 1\n", chat=False)
    forward = StaticPath(model).open(len(prompt) + 1, 1)
    forward.prefill(prompt)
    capacity = forward.capacity
    for i in range(capacity - len(prompt) + 3):  # one token at a time, past the first capacity
        forward.verify(DraftTree.root_only(100 + i % 50))
        forward.commit([0])
    assert forward.capacity > capacity and forward.length == capacity + 3
    eager = EagerPath(model).open(forward.length + 1)
    eager.prefill(prompt + [100 + i % 50 for i in range(capacity - len(prompt) + 3)])
    torch.testing.assert_close(forward.verify(DraftTree.root_only(7)), eager.verify(DraftTree.root_only(7)),
                               atol=1e-4, rtol=1e-4)


def test_a_finished_generations_static_buffers_serve_the_next_and_none_running(demo_lm):
    """The buffers of a forward that is gone go to the next ``open`` that fits (nothing allocated), never while
    it is in use, and never to a run that needs more room; at most ``SPARES`` wait."""
    import gc

    path = StaticPath(demo_lm.model)
    first = path.open(100, 8)
    kept = first.buffers
    second = path.open(100, 8)  # the first is still in use: buffers of its own
    assert second.buffers is not kept
    del first
    gc.collect()
    assert path.open(100, 8).buffers is kept
    gc.collect()  # that one is gone too: its buffers wait again, beside the second's once it goes
    del second
    gc.collect()
    assert len(path.spares) == 2
    assert path.open(10 * kept.capacity, 8).buffers not in (kept, *path.spares)
    for _ in range(3):
        path.open(100, 8)
    gc.collect()
    assert len(path.spares) <= StaticPath.SPARES


def test_generations_on_kept_static_buffers_are_lossless(demo_lm):
    """Three generations on one static path, the later ones on the buffers (stale rows) of the earlier: each gives
    AR's tokens with drafts accepted."""
    path = StaticPath(demo_lm.model)
    for text in ("def fibonacci(n):\n", "for i in range(10):\n    print(i)\n", "def fibonacci(n):\n"):
        prompt = demo_lm.encode_prompt(text, chat=False)
        out, accepted = _run(demo_lm, "goose", path, prompt, tokens=40)
        assert out == greedy_reference(demo_lm.model, prompt, 40)
        assert accepted > 0, "inconclusive: no draft token was accepted"
    assert path.spares, "the generations' buffers were not kept"


def _run(lm, method, path, prompt, tokens=48):
    config = DecodeConfig(method=method, max_new_tokens=tokens)
    traces = list(make_decoder(lm.model, config, (), forward=path).generate(prompt))
    return [t for c in traces for t in c.new_tokens], sum(len(c.accepted) for c in traces)


@pytest.mark.parametrize("method", ["goose", "ar", "pld"])
def test_static_path_is_lossless_in_fp32(demo_lm, method):
    prompt = demo_lm.encode_prompt("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
                                   chat=False)
    out, accepted = _run(demo_lm, method, StaticPath(demo_lm.model), prompt)
    assert out == greedy_reference(demo_lm.model, prompt, 48)
    assert method == "ar" or accepted > 0, "inconclusive: no draft token was accepted"


@pytest.mark.full  # compiles the demo model's forward for two buckets (tens of seconds on 2 cores)
@pytest.mark.parametrize("method", ["goose", "ar"])
def test_compiled_path_is_lossless_in_fp32(demo_lm, compiled_demo, method):
    """Trees padded to the buckets 4 and 8, larger ones on the model's own forward: AR's tokens, drafts accepted."""
    prompt = demo_lm.encode_prompt("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
                                   chat=False)
    out, accepted = _run(demo_lm, method, compiled_demo, prompt)
    assert out == greedy_reference(demo_lm.model, prompt, 48)
    assert method == "ar" or accepted > 0, "inconclusive: no draft token was accepted"


def _rounds(ms: dict[str, list[float]], spread: float = 0.0):
    """A forward choice's ``timings`` whose 7 rounds per path and size have medians ``ms`` ({path: [T(1), T(4)]}),
    spread evenly by ``spread`` of each median around it."""
    from engine.product.models.forward_choice import TREE_ROWS
    from engine.product.models.timing import Timings

    steps = (-3, -2, -1, 0, 1, 2, 3)
    return Timings({(name, n): [t * (1 + spread * k / 2) for k in steps]
                    for name, row in ms.items() for n, t in zip((1, TREE_ROWS), row)}, {})


def test_auto_measures_the_paths_once_and_keeps_the_faster(demo_lm, tmp_path, monkeypatch):
    from engine.product.models import forward_choice

    timed = []
    monkeypatch.setattr(forward_choice, "timings", lambda model, paths: timed.append(sorted(paths)) or _rounds(
        {"eager": [5.0, 9.0], "fused": [4.5, 8.5], "static": [4.0, 8.0]}))
    first = forward_choice.choose(demo_lm.model, "auto", cache_dir=tmp_path)
    again = forward_choice.choose(demo_lm.model, "auto", cache_dir=tmp_path)  # read from the cache
    assert first.name == again.name == "static" and timed == [["eager", "fused", "static"]]
    assert first.reason == ("static: an AR step and a 4-node tree in 14% less time than on the eager path here "
                            "(T(1) 4.0 vs 5.0 ms, T(4) 8.0 vs 9.0 ms)") and first.ms == again.ms
    assert forward_choice.choose(demo_lm.model, "eager").name == "eager"
    with pytest.raises(ValueError, match="unknown forward path"):
        forward_choice.choose(demo_lm.model, "fast")


def test_a_measurement_on_a_busy_machine_serves_its_process_but_is_not_cached(demo_lm, tmp_path, monkeypatch,
                                                                             caplog):
    """Rounds spread as a busy machine spreads them (the cost curve's own criterion, ``cost.MAX_SPREAD``): the choice
    serves, one warning says why it is not kept, and the next start measures again.  A size dearer than a larger one
    is no load (a kernel slower at that size, reproducibly): it is cached."""
    import logging

    from engine.product.models import forward_choice

    calls = []
    monkeypatch.setattr(forward_choice, "timings", lambda model, paths: calls.append(1) or _rounds(
        {"eager": [5.0, 9.0], "fused": [4.5, 8.5], "static": [4.0, 8.0]}, spread=0.5))
    with caplog.at_level(logging.WARNING, logger="engine.product.models.forward_choice"):
        first = forward_choice.choose(demo_lm.model, "auto", cache_dir=tmp_path)
    assert first.name == "static" and "looked busy" in caplog.text and "not cached" in caplog.text
    assert forward_choice.choose(demo_lm.model, "auto", cache_dir=tmp_path).name == "static" and len(calls) == 2
    assert forward_choice.busy_problem(_rounds({"eager": [5.0, 9.0]}, spread=0.1)) is None  # an idle spread
    assert "spread by 75 %" in forward_choice.busy_problem(_rounds({"eager": [5.0, 9.0]}, spread=0.5))
    assert forward_choice.busy_problem(_rounds({"eager": [12.0, 9.0]})) is None  # an AR step dearer than 4: no load


def test_a_compile_that_cannot_run_or_fails_leaves_the_eager_path_with_a_sentence(demo_lm, tmp_path, monkeypatch):
    from engine.product.models import forward_choice

    monkeypatch.setattr(forward_choice, "compiler_problem", lambda: "no C++ compiler is installed")
    choice = forward_choice.choose(demo_lm.model, "compiled", cache_dir=tmp_path)
    assert choice.name == "eager" and "no C++ compiler" in choice.reason
    monkeypatch.setattr(forward_choice, "compiler_problem", lambda: None)

    def refuse(*args, **kwargs):
        raise RuntimeError("inductor refused an op\nwith a long trace")

    monkeypatch.setattr(forward_choice, "warm", refuse)
    choice = forward_choice.choose(demo_lm.model, "compiled", cache_dir=tmp_path)
    assert choice.name == "eager" and choice.reason == "eager: compiling the forward failed (inductor refused an op)"


def test_auto_keeps_a_measured_faster_compiled_path_compiled_for_every_bucket(demo_lm, tmp_path, monkeypatch):
    """Where the cached measurement found the compiled path fastest, auto returns it with every bucket warmed."""
    from engine.product.models import forward_choice

    monkeypatch.setattr(forward_choice, "compiler_problem", lambda: None)
    monkeypatch.setattr(forward_choice, "timings", lambda model, paths: _rounds({
        "eager": [5.0, 9.0], "static": [5.0, 9.0], "compiled": [3.0, 7.0]} if "compiled" in paths else
        {"eager": [5.0, 9.0], "static": [5.0, 9.0]}))
    warmed = []
    monkeypatch.setattr(forward_choice, "warm", lambda path: warmed.append(path.name) or 1.0)
    assert forward_choice.choose(demo_lm.model, "auto", cache_dir=tmp_path).name == "eager"  # not measured yet
    choice = forward_choice.choose(demo_lm.model, "auto", compiled=True, cache_dir=tmp_path)
    again = forward_choice.choose(demo_lm.model, "auto", cache_dir=tmp_path)
    assert choice.name == again.name == "compiled" and warmed == ["compiled", "compiled"]
    assert "29%" in choice.reason


@needs_gradio
def test_the_page_goes_up_eager_and_settle_makes_the_chosen_path_every_visitors(demo_lm, monkeypatch):
    from engine.core.forward import StaticPath
    from engine.product.models import forward_choice
    from engine.product.models.registry import ModelRegistry
    from page import startup

    models = ModelRegistry(demo_lm)
    monkeypatch.delenv(forward_choice.ENV, raising=False)
    monkeypatch.setattr(forward_choice, "choose", lambda model, want=None, **_: forward_choice.PathChoice(
        StaticPath(model), "static: measured faster") if want == "auto" else forward_choice.PathChoice(
        EagerPath(model), f"{want}: as asked"))
    curves = []
    from engine.product.models.cost_cache import CurveOwner
    monkeypatch.setattr(CurveOwner, "shared", lambda owner, say=None: curves.append(owner.path.name))
    models.engine.call(startup.settle, models, "demo", "cpu", False)  # auto
    assert models.get(None).forward.name == "static" and models.get(None).forward_reason == "static: measured faster"
    assert curves == ["static"] and demo_lm.forward.name == "eager"  # the loaded model itself is not changed
    models.engine.call(startup.settle, models, "demo", "cpu", False, "eager")  # named on the command line
    assert models.get(None).forward.name == "eager" and curves == ["static", "eager"]


@needs_gradio
def test_settle_offers_the_forward_choice_the_default_models_gguf_file(demo_lm, monkeypatch, tmp_path):
    """The page's start-up choice is the CLI's (``forward_wanted``): a default model from a GGUF file, with
    llama-cpp-python installed, is offered llama.cpp's kernels on its own file (the page had run torch's eager path
    while the bench ran the llamacpp one), where its precision was chosen by "auto"; a precision named (fp32) is not.
    """
    from dataclasses import replace

    from engine.core.forward import llamacpp
    from engine.product.models import forward_choice
    from engine.product.models.loaded import LoadedModel
    from engine.product.models.registry import ModelRegistry
    from page import startup

    models = ModelRegistry(replace(demo_lm, auto_dtype=True))  # a precision chosen by "auto" may run the file
    gguf = tmp_path / "model.gguf"
    asked = []
    monkeypatch.delenv(forward_choice.ENV, raising=False)
    monkeypatch.setattr(forward_choice, "choose", lambda model, want=None, **kw: asked.append((want, kw.get("gguf")))
                        or forward_choice.PathChoice(EagerPath(model), "eager: measured faster"))
    monkeypatch.setattr(LoadedModel, "gguf", lambda self: gguf)
    monkeypatch.setattr(llamacpp, "installed", lambda: True)
    from engine.product.models.cost_cache import CurveOwner
    monkeypatch.setattr(CurveOwner, "shared", lambda owner, say=None: None)
    models.engine.call(startup.settle, models, "demo", "cpu", False)  # auto
    models.engine.call(startup.settle, models, "demo", "cpu", False, "eager")  # named: no file needed
    assert asked == [("auto", gguf), ("eager", None)]
    monkeypatch.setattr(llamacpp, "installed", lambda: False)
    models.engine.call(startup.settle, models, "demo", "cpu", False)
    assert asked[-1] == ("auto", None)  # not installed: the file is not even fetched
    monkeypatch.setattr(llamacpp, "installed", lambda: True)
    models.make_default(demo_lm)  # fp32 asked by name: the exact mode never runs the file's weights (issue 70)
    models.engine.call(startup.settle, models, "demo", "cpu", False)
    assert asked[-1] == ("auto", None)


def _compile_between_runs(demo_lm, monkeypatch, fail_at: int | None = None):
    """settle on a compiled choice of two buckets, bucket 1's compile held until a run is queued behind it: returns
    (the registry, the order in which the engine thread did things)."""
    import threading

    from engine.core.forward import CompiledPath
    from engine.product.models import forward_choice
    from engine.product.models.registry import ModelRegistry
    from page import startup
    from page.events import RunBoard

    models, order, started, gate = ModelRegistry(demo_lm), [], threading.Event(), threading.Event()
    compiled = CompiledPath(demo_lm.model, buckets=(1, 2))  # torch.compile compiles on first use: never here
    monkeypatch.setattr(forward_choice, "choose", lambda model, want=None, **_: forward_choice.PathChoice(
        compiled, "compiled: measured faster"))

    def fake_warm(path, rows):
        order.append(("bucket", rows, models.get(None).forward.name))
        if rows == 1:
            started.set()
            gate.wait(10)
        if rows == fail_at:
            raise RuntimeError("inductor refused an op")
        path.warmed(rows)
        return 0.0

    monkeypatch.setattr(forward_choice, "warm_bucket", fake_warm)
    from engine.product.models.cost_cache import CurveOwner
    monkeypatch.setattr(CurveOwner, "shared", lambda owner, say=None: order.append(("curve", owner.path.name)))
    models.engine.call(startup.settle, models, "demo", "cpu", False)
    assert started.wait(10) and "compiled, one tree size at a time" in RunBoard(models).waiting_words()
    run = models.engine.submit(lambda: order.append(("run", models.get(None).forward.name)))
    gate.set()
    run.result(10)
    for _ in range(100):
        if models.compiling is None:
            break
        threading.Event().wait(0.1)
    assert models.compiling is None
    return models, order


@needs_gradio
def test_the_page_compiles_its_forward_between_runs_and_then_switches(demo_lm, monkeypatch):
    """A compiled choice is compiled one bucket per engine-thread item: a run queued during bucket 1's compile runs
    (on the eager path) before bucket 2's; after the last bucket every visitor's default takes the compiled path
    and its cost curve is measured."""
    models, order = _compile_between_runs(demo_lm, monkeypatch)
    models.engine.call(lambda: None)  # the switch, queued after the last bucket, is done
    assert order == [("curve", "eager"), ("bucket", 1, "eager"), ("run", "eager"), ("bucket", 2, "eager"),
                     ("curve", "compiled")]
    assert models.get(None).forward.name == "compiled" and demo_lm.forward.name == "eager"


@needs_gradio
def test_a_compile_that_fails_between_runs_leaves_the_eager_path(demo_lm, monkeypatch):
    models, order = _compile_between_runs(demo_lm, monkeypatch, fail_at=2)
    assert models.get(None).forward.name == "eager" and ("curve", "compiled") not in order


def test_the_decoder_runs_the_path_it_is_given(demo_lm):
    """``SpecDecoder`` takes a model (the eager path) or a ``ForwardPath``; ``make_decoder`` a ``LoadedModel``'s own."""
    from engine.product.models.loading import with_forward

    lm = with_forward(demo_lm, "static")
    assert make_decoder(lm, DecodeConfig(method="ar")).path.name == "static"
    assert make_decoder(lm.model, DecodeConfig(method="ar")).path.name == "eager"
    assert make_decoder(lm, DecodeConfig(method="ar"), forward=EagerPath(lm.model)).path.name == "eager"


@needs_gradio
def test_a_cold_start_measures_llama_cpp_first_and_skips_torch_precisions(demo_lm, monkeypatch, tmp_path):
    """Issue 70: a cold start's "auto" on a model from a GGUF file with llama-cpp-python installed asks the forward
    choice first; where a path that runs the file's weights wins, torch's precisions (which would run no forward)
    are never measured and the default runs the file; where a torch path wins, they are measured as before."""
    from engine.core.forward import llamacpp
    from engine.product.models import forward_choice
    from engine.product.models.cost_cache import CurveOwner
    from engine.product.models.loaded import LoadedModel
    from engine.product.models.registry import ModelRegistry
    from page import startup

    class FilePath(EagerPath):  # stands for llama.cpp's path: the file's Q4_1 blocks
        name = "llamacpp"

        def weights(self) -> str:
            return "Q4_1"

    loads = []
    monkeypatch.delenv(forward_choice.ENV, raising=False)
    monkeypatch.setattr(LoadedModel, "gguf", lambda self: tmp_path / "model.gguf")
    monkeypatch.setattr(llamacpp, "installed", lambda: True)
    monkeypatch.setattr(CurveOwner, "shared", lambda owner, say=None: None)
    monkeypatch.setattr(startup, "load_model", lambda *a, **k: loads.append(k) or demo_lm)
    for path, measured in ((FilePath(demo_lm.model), []), (EagerPath(demo_lm.model), [{"device": "cpu",
                                                                                       "dtype": "auto"}])):
        monkeypatch.setattr(forward_choice, "choose",
                            lambda model, want=None, _p=path, **kw: forward_choice.PathChoice(_p, "measured faster"))
        models, loads[:] = ModelRegistry(demo_lm), []
        models.engine.call(startup.settle, models, "demo", "cpu", True)  # a cold start: precision not measured yet
        assert loads == measured
        default = models.get(None)
        assert default.runs.dtype == ("Q4_1" if path.weights() else "fp32")
    models = ModelRegistry(demo_lm)
    monkeypatch.setattr(forward_choice, "choose", lambda model, want=None, **kw: forward_choice.PathChoice(
        FilePath(model), "measured faster"))
    models.engine.call(startup.settle, models, "demo", "cpu", True)
    assert models.get(None).runs.weights == "gguf"
    exact = models.load("demo", device="cpu", dtype="fp32")  # the exact mode is never the file's model
    assert exact.runs.to_dict()["weights"] == "transformers" and exact is not models.get(None)


def test_a_long_generation_runs_on_the_long_path_where_it_was_measured_cheaper(demo_lm):
    """Issue 70 item 3: over a long context llama.cpp's attention without flash attention costs less than the
    exact path's; the forward choice times both over 128 and 1,024 cells and runs generations from the cells where
    they cross on it (``long_rule``), and a run's model (``LoadedModel.for_context``) names the path that ran."""
    from dataclasses import replace

    from engine.core.forward import EagerPath, Longer
    from engine.product.models.forward_choice import LONG_PATH, long_rule

    # the probe's figures (docs/results.md, "Long contexts"): 10.0 / 14.8 ms against 11.0 / 14.0 ms
    rule = long_rule("llamacpp-q8cache", {"llamacpp-q8cache": [10.0, 14.8], LONG_PATH: [11.0, 14.0]})
    assert rule["from"] == 768 and "5% cheaper (14.0 vs 14.8 ms)" in rule["reason"]  # they cross at 626 cells
    assert long_rule("llamacpp-q8cache", {"llamacpp-q8cache": [10.0, 14.8], LONG_PATH: [11.0, 14.5]})["from"] is None
    assert long_rule("x", {"x": [12.0, 20.0], LONG_PATH: [11.0, 14.0]})["from"] == 256  # cheaper from the start

    exact, long = EagerPath(demo_lm.model), EagerPath(demo_lm.model)
    exact.longer = Longer(768, long, rule["reason"])
    lm = replace(demo_lm, forward_path=exact)
    assert lm.for_context(767) is lm and exact.at(767) is exact
    here = lm.for_context(768)
    assert here.forward is long and here.forward.at(10_000) is long  # the long path has no rule of its own
    assert here.forward_reason.startswith("eager for this run's 768 cells (from 768 cells on")
    assert demo_lm.for_context(10_000) is demo_lm  # no rule: the same model


def test_no_caller_outside_the_forward_seam_branches_on_a_paths_name_or_class():
    """Issue 74: outside the forward seam (the package ``engine/core/forward/``) every caller decides by a path's
    facts (``engine.core.forward.PathSpec``), never by its name or class: no comparison with, subscript by or
    ``make_path`` of a path's name written out, and no ``isinstance`` / ``issubclass`` test against one path's class,
    in the core's other modules nor in any layer above."""
    import ast
    from pathlib import Path

    from engine.core.forward import SPECS

    names = set(SPECS)
    classes = {cls.__name__ for spec in SPECS.values() for cls in spec.cls.__mro__ if cls.__name__.endswith("Path")}
    classes.discard("ForwardPath")  # the seam's own type: any path
    root = Path(__file__).resolve().parents[1]
    layers = ("engine/decoding", "engine/sources", "engine/product", "page", "cli", "scripts", "viz")
    core = [p for p in sorted((root / "engine/core").rglob("*.py")) if "forward" not in p.relative_to(root).parts]
    files = [root / "app.py", *core, *(p for d in layers for p in sorted((root / d).rglob("*.py")))]

    def written(node) -> set:
        """The path names or path classes ``node`` writes out (a string, a class name, or a tuple / set of them)."""
        items = node.elts if isinstance(node, (ast.Tuple, ast.Set, ast.List)) else [node]
        return ({i.value for i in items if isinstance(i, ast.Constant) and i.value in names}
                | {i.id for i in items if isinstance(i, ast.Name) and i.id in classes}
                | {i.attr for i in items if isinstance(i, ast.Attribute) and i.attr in classes})

    found = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            hits: set = set()
            if isinstance(node, ast.Compare):
                hits = set().union(*(written(n) for n in (node.left, *node.comparators)))
            elif isinstance(node, ast.Subscript):
                hits = written(node.slice)
            elif isinstance(node, ast.Call):
                fn = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if fn in ("isinstance", "issubclass") and len(node.args) == 2:
                    hits = written(node.args[1])
                elif fn in ("make_path", "spec"):
                    hits = set().union(*(written(a) for a in node.args))
            if hits:
                found.append(f"{path.relative_to(root)}:{node.lineno} {sorted(hits)}")
    assert not found, "branches on a forward path's name or class:\n" + "\n".join(found)
