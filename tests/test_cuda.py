"""On a CUDA GPU: the bf16 lossless suite with every decoding cycle free of host syncs but its one read-back.

Skipped without CUDA.  Run on a GPU machine with ``python -m pytest -q tests/test_cuda.py`` (SmolLM2 is fetched
and converted on first use, as on a CPU).

``torch.cuda.set_sync_debug_mode("error")`` makes every operation that makes the host wait for the device an
error (a blocking copy either way, ``.item()``, ``.tolist()``, ``nonzero``, ``torch.cuda.synchronize``).  It is
on while each decoding cycle runs, and off only inside the cycle's read-back (``verify.read_back``, as
``engine.decoding.decode`` calls it), which must run exactly once per cycle.  The prefill and the decoder's set-up (the
cost curve, AR's reference run) run outside it.

* Greedy, bf16, the configurations of tests/test_precision.py: the demo model (10 prompts × 128 tokens) and
  SmolLM2-135M-Instruct (4 prompts × 64 tokens).  Every divergence from AR (``generate``'s own step logits) is a
  precision tie (``engine.product.runs.lossless``): zero bugs; each configuration accepted draft tokens (else
  inconclusive).
* Sampling: the tree rows' distributions come back with the same one read-back (``SpecDecoder.warp_rows``).
* Uploads (``transfer.upload``) go from pinned memory without a sync; a pageable one would be caught.
* ``profile=True`` (bench ``--profile``) synchronises at every stage, and only then.
"""
from __future__ import annotations

import pytest
import torch
from test_precision import BF16_CONFIGS, _bf16_run

from engine.decoding import decode
from engine.decoding.config import DecodeConfig
from engine.decoding.decode import SpecDecoder
from engine.product.models.loading import load_model
from engine.product.runs.decoder import make_decoder
from engine.product.runs.lossless import Divergence

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

SMOLLM2_CONFIGS = ("default", "method-pld", "method-tr")  # as tests/test_precision.py runs SmolLM2 in bf16


@pytest.fixture(scope="module")
def demo_cuda():
    return load_model("demo", device="cuda", dtype="bf16")


@pytest.fixture(scope="module")
def smollm2_cuda():
    """SmolLM2 in bf16 on the GPU, when it can be had (cached, fetched, or from ``$GOOSE_LENS_WHEELS``)."""
    from engine.product.models.loading import ModelLoadError

    try:
        return load_model("smollm2", device="cuda", dtype="bf16")
    except ModelLoadError as exc:
        pytest.skip(f"SmolLM2 is not at hand: {exc}")


@pytest.fixture
def read_backs(monkeypatch):
    """The decoder's ``read_back`` run with the sync debug mode off (the one host sync a cycle may make), the mode
    restored after it; yields the list each call appends to.  The mode is left at "default" afterwards."""
    calls: list[int] = []
    real = decode.read_back

    def allowed(*args, **kwargs):
        calls.append(1)
        before = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode("default")
        try:
            return real(*args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode(before)

    monkeypatch.setattr(decode, "read_back", allowed)
    yield calls
    torch.cuda.set_sync_debug_mode("default")


def smollm2_prompts(lm) -> list[list[int]]:
    """Two HumanEval prompts, one GSM8K and one MT-Bench question: on the two code prompts alone PLD accepted no
    draft token in 64 tokens on an H200 (inconclusive), on the chat ones it does."""
    from test_smollm2 import _read

    return ([lm.encode_prompt(_read("humaneval/HumanEval.jsonl", i, "prompt"), chat=False) for i in (0, 23)]
            + [lm.encode_prompt(_read("gsm8k/test.jsonl", 0, "question"), chat=True),
               lm.encode_prompt(_read("mt_bench/question.jsonl", 40, "turns"), chat=True)])


def strict_cycles(decoder: SpecDecoder, ids: list[int], read_backs: list[int]) -> list:
    """Every trace of ``decoder.generate(ids)``; each cycle after the prefill runs under sync debug mode "error"
    and must call ``read_back`` exactly once."""
    cycles = decoder.generate(ids)
    traces = [next(cycles)]  # the prefill: its prompt upload and first token read are outside the strict mode
    try:
        while True:
            read_backs.clear()
            torch.cuda.set_sync_debug_mode("error")
            trace = next(cycles, None)
            torch.cuda.set_sync_debug_mode("default")
            if trace is None:
                return traces
            assert len(read_backs) == 1, f"cycle {trace.index}: {len(read_backs)} read-backs"
            traces.append(trace)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def strict_bf16_run(lm, prompts: list[list[int]], changes: dict, max_new: int,
                    read_backs: list[int]) -> tuple[int, list[Divergence]]:
    """test_precision's ``_bf16_run`` with each run's cycles strict (``strict_cycles``)."""
    return _bf16_run(lm, prompts, changes, max_new, lambda decoder, ids: strict_cycles(decoder, ids, read_backs))


@pytest.mark.parametrize("name", list(BF16_CONFIGS))
def test_demo_model_bf16_on_cuda_has_no_bugs_and_one_sync_per_cycle(demo_cuda, lossless_prompts, read_backs, name):
    prompts = [demo_cuda.encode_prompt(p) for p in lossless_prompts]
    accepted, found = strict_bf16_run(demo_cuda, prompts, BF16_CONFIGS[name], 128, read_backs)
    assert accepted > 0, f"inconclusive: {name} accepted no draft token"
    bugs = [d.sentence() for d in found if d.kind != "precision tie"]
    assert not bugs, f"{name}: divergences from AR that are not precision ties: {bugs}"


@pytest.mark.parametrize("name", SMOLLM2_CONFIGS)
def test_smollm2_bf16_on_cuda_has_no_bugs_and_one_sync_per_cycle(smollm2_cuda, read_backs, name):
    lm = smollm2_cuda
    accepted, found = strict_bf16_run(lm, smollm2_prompts(lm), BF16_CONFIGS[name], 64, read_backs)
    assert accepted > 0, f"inconclusive: {name} accepted no draft token on SmolLM2"
    bugs = [d.sentence() for d in found if d.kind != "precision tie"]
    assert not bugs, f"{name}: divergences from AR that are not precision ties: {bugs}"


@pytest.mark.parametrize("fields", [{"temperature": 0.8}, {"temperature": 1.0, "top_p": 0.9, "sample_top_k": 20},
                                    {"temperature": 0.7, "method": "pld", "verifier": "hsd"}],
                         ids=["tree", "top-p-top-k", "hsd-chain"])
def test_sampling_on_cuda_reads_back_once_per_cycle(demo_cuda, lossless_prompts, read_backs, fields):
    decoder = make_decoder(demo_cuda.model, DecodeConfig.of(max_new_tokens=96, seed=1, **fields), ())
    assert decoder.warp_rows is not None  # an accelerator: the rows come back with the read-back
    traces = strict_cycles(decoder, demo_cuda.encode_prompt(lossless_prompts[0]), read_backs)
    assert len(traces) > 3 and sum(len(t.accepted) for t in traces) > 0, "no draft accepted: inconclusive"


def test_uploads_are_pinned_and_do_not_sync():
    from engine.core.transfer import upload

    torch.cuda.set_sync_debug_mode("error")
    try:
        with pytest.raises(RuntimeError):  # the test has power: a pageable upload waits, and is caught
            torch.tensor([[1, 2], [3, 4]], dtype=torch.long, device="cuda")
        up = upload([[1, 2], [3, 4]], torch.long, "cuda")
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert up.device.type == "cuda" and up.tolist() == [[1, 2], [3, 4]]


def test_profiling_synchronises_each_stage_and_only_then(demo_cuda, monkeypatch):
    syncs: list[int] = []
    real = torch.cuda.synchronize
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: syncs.append(1) or real(*a, **k))
    ids = demo_cuda.encode_prompt("def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n")
    config = DecodeConfig.of(max_new_tokens=32)
    make_decoder(demo_cuda.model, config, ())  # the cost curve is measured (and synchronised) before counting
    syncs.clear()
    plain = list(make_decoder(demo_cuda.model, config, ()).generate(ids))
    assert not syncs
    profiled = list(make_decoder(demo_cuda.model, config, (), profile=True).generate(ids))
    stages = sum(len(t.timings_ms) - 1 for t in profiled)  # a lap per stage ("total" is not one)
    assert len(syncs) == stages and [t.new_tokens for t in profiled] == [t.new_tokens for t in plain]


@pytest.fixture(scope="module")
def demo_cuda_fp32():
    return load_model("demo", device="cuda", dtype="fp32")


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_graph_replay_gives_the_static_paths_tokens_with_one_read_back(demo_cuda, demo_cuda_fp32, lossless_prompts,
                                                                       read_backs, dtype):
    """Every bucket replayed (trees of 1 to 64 rows): the tokens of the static path, in fp32 and bf16, each replayed
    cycle with its one read-back; drafts accepted (else inconclusive)."""
    from engine.core.forward import StaticPath
    from engine.core.forward.graphs import GraphedPath

    lm = demo_cuda_fp32 if dtype == "fp32" else demo_cuda
    config = DecodeConfig.of(max_new_tokens=96)
    graphed = GraphedPath(lm.model)
    for text in lossless_prompts[:3]:
        ids = lm.encode_prompt(text)
        want = [t for c in make_decoder(lm.model, config, (), forward=StaticPath(lm.model)).generate(ids)
                for t in c.new_tokens]
        traces = strict_cycles(make_decoder(lm.model, config, (), forward=graphed), ids, read_backs)
        assert [t for c in traces for t in c.new_tokens] == want
    assert sum(len(t.accepted) for t in traces) > 0, "inconclusive: no draft accepted"


def test_a_later_generation_replays_the_graphs_of_an_earlier_one(demo_cuda_fp32, monkeypatch):
    """The same prompt twice on one graphed path: the second generation captures nothing (the first one's buffers
    and graphs serve it) and gives the same tokens, with drafts accepted."""
    from engine.core.forward.graphs import GraphedPath

    captured = []
    capture = GraphedPath._capture
    monkeypatch.setattr(GraphedPath, "_capture", lambda self, f, rows: captured.append(rows) or capture(self, f, rows))
    lm, graphed = demo_cuda_fp32, GraphedPath(demo_cuda_fp32.model)
    ids = lm.encode_prompt("def fibonacci(n):\n", chat=False)
    runs = []
    for _ in range(2):
        traces = list(make_decoder(lm.model, DecodeConfig.of(max_new_tokens=48), (), forward=graphed).generate(ids))
        runs.append(([t for c in traces for t in c.new_tokens], len(captured)))
    assert runs[0][0] == runs[1][0] and runs[1][1] == runs[0][1] > 0
    assert sum(len(t.accepted) for t in traces) > 0, "inconclusive: no draft accepted"


def test_a_failed_capture_runs_that_bucket_without_a_graph(demo_cuda_fp32, monkeypatch, caplog):
    from engine.core.forward.graphs import GraphedPath
    from engine.core.tree import DraftTree

    def refuse(*args, **kwargs):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(torch.cuda, "graph", refuse)
    path = GraphedPath(demo_cuda_fp32.model)
    path.prepare(64, 4)
    forward = path.open(64, 4)
    forward.prefill([1, 2, 3])
    logits = forward.verify(DraftTree.root_only(4))
    assert forward.graphs[1] is None and logits.shape[0] == 1
    assert "CUDA graph capture of 1 rows failed" in caplog.text


@pytest.mark.parametrize("name", SMOLLM2_CONFIGS)
def test_smollm2_bf16_on_the_graphed_path_has_no_bugs_and_one_read_back_per_cycle(smollm2_cuda, read_backs, name):
    """SmolLM2 in bf16, every cycle a graph replay (captured before the run) with its one read-back: every divergence
    from AR a precision tie, drafts accepted."""
    from engine.core.forward.graphs import GraphedPath

    lm = smollm2_cuda
    graphed = GraphedPath(lm.model)

    def cycles(decoder, ids):
        on_graphs = make_decoder(lm.model, decoder.config, lm.eos_token_ids, forward=graphed)
        return strict_cycles(on_graphs, ids, read_backs)

    accepted, found = _bf16_run(lm, smollm2_prompts(lm), BF16_CONFIGS[name], 64, cycles)
    assert accepted > 0, f"inconclusive: {name} accepted no draft token on SmolLM2"
    bugs = [d.sentence() for d in found if d.kind != "precision tie"]
    assert not bugs, f"{name}: divergences from AR that are not precision ties: {bugs}"


def test_the_demo_model_fp32_on_graphs_gives_generates_tokens_and_never_captures_in_a_run(
        demo_cuda_fp32, lossless_prompts, monkeypatch):
    """fp32, the graphed path against ``generate`` token for token; every capture outside the decoding stopwatches
    (``test_graphs.Timed``); each set of buffers has its own graph pool."""
    from conftest import greedy_reference
    from test_graphs import TIMED, Timed

    from engine.core.forward.graphs import GraphedPath

    monkeypatch.setattr(decode, "Stopwatch", Timed)
    TIMED["runs"] = 0
    captured = []
    capture = GraphedPath._capture
    monkeypatch.setattr(GraphedPath, "_capture",
                        lambda self, f, rows: captured.append(TIMED["runs"]) or capture(self, f, rows))
    lm = demo_cuda_fp32
    graphed = GraphedPath(lm.model)
    for text in lossless_prompts[:3]:
        ids = lm.encode_prompt(text)
        want = greedy_reference(lm.model, ids, 64, lm.eos_token_ids)
        traces = list(make_decoder(lm.model, DecodeConfig.of(max_new_tokens=64), lm.eos_token_ids,
                                   forward=graphed).generate(ids))
        assert [t for c in traces for t in c.new_tokens] == want
    assert captured and not any(captured), "a capture inside a timed run"
    pools = [b.runner.pool for b in graphed.spares]
    assert all(p is not None for p in pools) and len({id(p) for p in pools}) == len(pools)
