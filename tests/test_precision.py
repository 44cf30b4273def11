"""Precision chosen by measurement, and losslessness that knows its precision.

fp32 stays exact (tests/test_lossless.py, tests/test_smollm2.py: token ids equal ``generate``, no tolerance).
Here: the dtype choice and its sentence, the ulp rule that tells a half-precision tie from a bug, and the
lossless runs in bf16 and in q4 (4-bit weights, bf16 activations) on the demo model and on SmolLM2: every
divergence from AR is a precision tie (zero bugs), and each configuration accepted draft tokens (no inconclusive
run).
"""
from __future__ import annotations

import weakref

import pytest
import torch

from engine.decoding.config import DecodeConfig
from engine.product.models import cost_cache as cost
from engine.product.models import kernels, precision
from engine.product.models.loading import ModelLoadError, load_model, resolve_dtype
from engine.product.runs.decoder import make_decoder
from engine.product.runs.lossless import (
    TIE_ULPS,
    Divergence,
    ar_logits,
    attribute,
    engine_ar_logits,
    first_difference,
    ulp,
)
from engine.product.runs.metrics import summarize
from engine.product.runs.reference import greedy_reference

BF16_CONFIGS = {"default": {}, "c0": {"gt_threshold": 0.0}, "method-pld": {"method": "pld"},
                "method-tr": {"method": "tr"}, "method-iso3": {"method": "iso3"}}


def test_ulp_is_the_dtypes_spacing_at_that_magnitude():
    assert ulp(20.0, torch.bfloat16) == 0.125 and ulp(-20.0, torch.bfloat16) == 0.125
    assert ulp(1.5, torch.bfloat16) == 2 ** -7 and ulp(16.0, torch.float32) == 2 ** -19
    for dtype in (torch.bfloat16, torch.float16, torch.float32):  # the next representable number is one ulp away
        x = torch.tensor(13.7, dtype=dtype)
        assert float(torch.nextafter(x, torch.tensor(100.0, dtype=dtype)) - x) == ulp(float(x), dtype)


def test_decide_keeps_the_fastest_variant_and_says_why():
    issue_table = {"fp32/sdpa": [61.0, 106.0], "bf16/sdpa": [52.0, 84.0], "bf16/eager": [45.0, 64.0]}  # issue 17
    fast = precision.decide(issue_table)
    assert (fast.dtype, fast.attn, fast.torch_dtype) == ("bf16", "eager", torch.bfloat16)
    assert fast.reason == "bf16 with eager attention: verifies 16 rows 1.7× faster than fp32 here (an AR step 1.4×)"
    sdpa = precision.decide({"fp32/sdpa": [60.0, 106.0], "bf16/sdpa": [45.0, 64.0]})
    assert sdpa.reason.startswith("bf16: verifies 16 rows 1.7× faster than fp32 here") and sdpa.attn == "sdpa"
    slow_bf16 = precision.decide({"fp32/sdpa": [60.0, 100.0], "bf16/sdpa": [80.0, 110.0]})
    assert slow_bf16.dtype == "fp32" and "no faster" in slow_bf16.reason


def test_cpu_choice_is_measured_once_and_cached(tmp_path, monkeypatch, demo_lm):
    calls = []
    monkeypatch.setattr(precision, "cpu_runs_bf16", lambda: True)
    measured = {"fp32/sdpa": [5.0, 9.0], "bf16/sdpa": [4.0, 6.0]}
    monkeypatch.setattr(precision, "measure", lambda model: calls.append(1) or measured)
    first = precision.cpu_choice(demo_lm.model, "demo", cache_dir=tmp_path)
    again = precision.cpu_choice(demo_lm.model, "demo", cache_dir=tmp_path)
    assert first == again and first.dtype == "bf16" and calls == [1]
    monkeypatch.setattr(precision, "cpu_runs_bf16", lambda: False)  # no bf16: fp32, nothing measured
    assert precision.cpu_choice(demo_lm.model, "other", cache_dir=tmp_path).dtype == "fp32" and calls == [1]


def test_measure_times_both_precisions(demo_lm):
    ms = precision.measure(demo_lm.model, repeats=2)
    assert set(ms) == {"fp32/sdpa", "fp32/eager", "bf16/sdpa", "bf16/eager"}
    assert all(len(v) == 2 and min(v) > 0 for v in ms.values())
    assert demo_lm.model.dtype == torch.float32  # the measured copies never touch the loaded model
    assert demo_lm.model.config._attn_implementation == "sdpa"


@pytest.mark.full  # loads a second demo model or runs AR step by step (seconds)
@pytest.mark.skipif(not kernels.cpu_has_bf16_instructions(), reason="this CPU emulates bf16: a packed layer "
                                                                       "equals F.linear's on the probes only")
def test_packed_bf16_linears_give_the_same_logits(demo_lm, monkeypatch):
    """pack_linears swaps every bf16 nn.Linear (lm_head included) and the model's logits stay bit-identical."""
    monkeypatch.setenv(kernels.PACK_ENV, "0")  # the escape hatch: nothing packed
    plain = load_model("demo", device="cpu", dtype="bf16").model
    assert type(plain.lm_head) is torch.nn.Linear
    monkeypatch.delenv(kernels.PACK_ENV)
    packed = load_model("demo", device="cpu", dtype="bf16")
    assert isinstance(packed.model.lm_head, kernels.PackedLinear)
    assert not any(type(m) is torch.nn.Linear for m in packed.model.modules())
    assert packed.params == demo_lm.params  # counted before the packed weights left the parameters
    ids = torch.tensor([packed.encode_prompt("def add(a, b):\n    return a + b\n" * 3)])
    with torch.no_grad():
        assert torch.equal(packed.model(input_ids=ids).logits, plain(input_ids=ids).logits)
    key = cost.curve_key(packed.model)
    assert key.endswith(f"|packed|torch {torch.__version__}") and "/" not in key.split("|")[0]
    assert "packed" not in cost.curve_key(plain)
    embedding = packed.model.get_input_embeddings().weight
    if packed.model.config.tie_word_embeddings:  # a tied lm_head keeps its (shared) weight; no other layer does
        assert packed.model.lm_head.weight is embedding
    assert sum(hasattr(m, "weight") for m in packed.model.modules() if isinstance(m, kernels.PackedLinear)) <= 1


@pytest.mark.skipif(not kernels.cpu_runs_bf16(), reason="oneDNN runs no bf16 here: nothing is packed")
def test_a_model_whose_code_reads_a_packed_weight_gets_its_layers_back():
    model = load_model("demo", device="cpu", dtype="fp32").model.to(torch.bfloat16)
    mlp = model.model.layers[0].mlp
    mlp.register_forward_pre_hook(lambda module, args: module.down_proj.weight)  # as some model code does
    assert kernels.pack_linears(model) == 0
    assert not any(isinstance(m, kernels.PackedLinear) for m in model.modules())


def test_unsupported_dtypes_fall_back_with_one_sentence():
    assert resolve_dtype("fp16", "cpu") == (None, "fp16 is not supported on a CPU (no fast kernels); using the "
                                                  "measured precision instead.")
    assert resolve_dtype("fp32", "cpu") == ("fp32", "") and resolve_dtype("auto", "cpu") == (None, "")
    assert resolve_dtype("q4", "cpu") == ("q4", "")
    with pytest.raises(ModelLoadError, match="unknown dtype 'int3'"):
        resolve_dtype("int3", "cpu")
    lm = load_model("demo", device="cpu", dtype="fp16")
    assert lm.dtype in (torch.float32, torch.bfloat16) and lm.dtype_reason.startswith("fp16 is not supported")
    assert lm.auto_dtype and "\n" not in lm.dtype_reason


def _q4_weight(out_features: int, in_features: int, gen: torch.Generator) -> torch.Tensor:
    """(out, in) fp32 weights that are exactly 4-bit group codes, as a Q4_1 GGUF file dequantizes: scale · q + low
    per group of 32 along the input, q in 0..15 with 0 and 15 in every group (llama.cpp's quantizer)."""
    groups = in_features // kernels.Q4_GROUP
    codes = torch.randint(0, 16, (out_features, groups, kernels.Q4_GROUP), generator=gen).float()
    codes[..., 0], codes[..., 1] = 0, 15
    scale = (torch.rand(out_features, groups, 1, generator=gen) * 0.01 + 1e-3).half().float()  # GGUF: fp16 d, m
    low = (-8 * scale + torch.randn(out_features, groups, 1, generator=gen) * 1e-3).half().float()
    return (codes * scale + low).reshape(out_features, in_features)


def test_q4_linear_serves_exact_4bit_codes_and_refuses_every_other_layer():
    gen = torch.Generator().manual_seed(0)
    exact = torch.nn.Linear(64, 32, bias=False)
    exact.weight.data = _q4_weight(32, 64, gen)
    q4 = kernels.Q4Linear.from_linear(exact)
    assert q4 is not None and q4.kernel == "q4"
    x = torch.randn(2, 5, 64, generator=gen).to(torch.bfloat16)
    want = torch.nn.functional.linear(x.float(), exact.weight)  # (2, 5, 32) the fp32 product
    assert q4(x).shape == (2, 5, 32) and q4(x).dtype == torch.bfloat16
    assert torch.allclose(q4(x).float(), want, atol=0.02 * want.abs().max().item())  # bf16 activations and scales
    plain = torch.nn.Linear(64, 32, bias=False)  # trained weights: not 4-bit codes, never re-quantized
    biased = torch.nn.Linear(64, 32)
    biased.weight.data = exact.weight.data.clone()
    narrow = torch.nn.Linear(64, 24, bias=False)  # the kernel takes out_features in multiples of 16
    narrow.weight.data = _q4_weight(24, 64, gen)
    assert [kernels.Q4Linear.from_linear(m) for m in (plain, biased, narrow)] == [None, None, None]


@pytest.mark.full  # loads a second demo model or runs AR step by step (seconds)
def test_q4_is_refused_for_a_model_without_4bit_weights_in_one_sentence():
    lm = load_model("demo", device="cpu", dtype="q4")
    assert lm.precision != "q4" and lm.auto_dtype and "\n" not in lm.dtype_reason
    assert lm.dtype_reason.startswith("q4 is not possible for this model: its weights are not 4-bit group codes")


@pytest.fixture(scope="module")
def demo_q4():
    """The demo model with its decoder layers' weights made 4-bit group codes, served in q4."""
    lm = load_model("demo", device="cpu", dtype="fp32")
    with torch.no_grad():
        for layer in lm.model.model.layers:
            for m in layer.modules():
                if type(m) is torch.nn.Linear:  # each weight rounded to its own group's 16 levels, Q4_1's way
                    w = m.weight.reshape(m.out_features, -1, kernels.Q4_GROUP)
                    low = w.amin(-1, keepdim=True).half().float()  # fp16 d and m, as GGUF stores them
                    scale = ((w.amax(-1, keepdim=True) - low) / 15).half().float()
                    m.weight.copy_(((w - low) / scale).round().clamp(0, 15).mul(scale).add(low).reshape_as(m.weight))
    count = precision.apply(lm.model, "q4")
    packed = isinstance(lm.model.lm_head, kernels.PackedLinear)  # the tied lm_head, where its probes match
    assert count == 4 * 7 + packed  # 7 linears per layer, 4-bit
    assert packed or not kernels.cpu_has_bf16_instructions()  # with bf16 instructions they always do
    assert precision.precision_name(lm.model) == "q4"
    return lm


@pytest.mark.full  # the lossless runs in q4 and bf16: the quick tier checks fp32 (tests/test_lossless.py)
@pytest.mark.parametrize("name", ["default", "method-pld", "method-tr"])
def test_demo_model_q4_has_no_bugs(demo_q4, lossless_prompts, name):
    prompts = [demo_q4.encode_prompt(p) for p in lossless_prompts]
    _has_no_bugs(demo_q4, prompts, name, 128)


@pytest.mark.full  # loads a second demo model or runs AR step by step (seconds)
def test_attribution_reads_ars_own_logits(demo_lm):
    lm = demo_lm
    ids = lm.encode_prompt("def add(a, b):\n    return")
    want = greedy_reference(lm.model, ids, 12, ())
    assert attribute(lm.model, ids, want, list(want)) is None and first_difference(want, want) is None
    # a run that wrote AR's least likely token at position 5: far from a tie, a bug
    with torch.no_grad():
        row = lm.model(input_ids=torch.tensor([ids + want[:5]])).logits[0, -1]
    worst = int(row.argmin())
    found = attribute(lm.model, ids, want, want[:5] + [worst] + want[6:])
    assert isinstance(found, Divergence) and found.position == 5 and found.is_bug
    assert found.ar_token == want[5] and found.run_token == worst and found.gap_ulps > TIE_ULPS[torch.float32]
    assert "NOT a tie" in found.sentence(lm.tokenizer.decode)
    assert attribute(lm.model, ids, want, want[:7]).kind == "length"
    tokens, logits = ar_logits(lm.model, ids, 12)
    assert tokens == want and logits.shape == (12, lm.model.config.vocab_size)
    assert attribute(lm.model, ids, want, want[:5] + [worst] + want[6:], logits) == found


#: model -> (prompt ids, new tokens) -> ``ar_logits``: AR's run is the same for every configuration checked against it
_AR_RUNS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _ar_reference(model, ids: list[int], max_new: int) -> tuple[list[int], torch.Tensor]:
    """``ar_logits(model, ids, max_new)``, computed once per model and prompt in a test session."""
    runs = _AR_RUNS.setdefault(model, {})
    key = (tuple(ids), max_new)
    if key not in runs:
        runs[key] = ar_logits(model, ids, max_new)
    return runs[key]


def _bf16_run(lm, prompts, changes: dict, max_new: int,
              cycles=lambda decoder, ids: list(decoder.generate(ids))) -> tuple[int, list[Divergence]]:
    """Accepted draft tokens over ``prompts`` and every divergence from AR, attributed (bf16); ``cycles`` runs
    one decoder on one prompt (tests/test_cuda.py: under the CUDA sync check)."""
    config = DecodeConfig.of(max_new_tokens=max_new, **changes)
    accepted, found = 0, []
    for ids in prompts:
        want, logits = _ar_reference(lm.model, ids, max_new)  # AR's tokens and its own step logits
        eos = next((k for k, t in enumerate(want) if t in lm.eos_token_ids), None)
        want = want if eos is None else want[: eos + 1]
        traces = cycles(make_decoder(lm.model, config, lm.eos_token_ids), ids)
        got = [t for tr in traces for t in tr.new_tokens]
        counts = dict(summarize(traces).accepted_by_source)
        accepted += sum(counts.values()) - counts["bonus"]
        d = attribute(lm.model, ids, want, got, logits)
        found += [d] if d is not None else []
    return accepted, found


def _has_no_bugs(lm, prompts: list[list[int]], name: str, max_new: int) -> None:
    """``BF16_CONFIGS[name]`` on ``prompts``: some draft token accepted (else inconclusive), every divergence from AR
    a precision tie."""
    accepted, found = _bf16_run(lm, prompts, BF16_CONFIGS[name], max_new)
    assert accepted > 0, f"inconclusive: {name} accepted no draft token on {lm.name} in {lm.precision}"
    bugs = [d.sentence() for d in found if d.kind != "precision tie"]
    assert not bugs, f"{name}: divergences from AR that are not precision ties: {bugs}"


@pytest.fixture(scope="module")
def demo_bf16():
    return load_model("demo", device="cpu", dtype="bf16")


@pytest.mark.full  # in bf16 (see test_demo_model_q4_has_no_bugs)
@pytest.mark.parametrize("name", list(BF16_CONFIGS))
def test_demo_model_bf16_has_no_bugs(demo_bf16, lossless_prompts, name):
    prompts = [demo_bf16.encode_prompt(p) for p in lossless_prompts]
    _has_no_bugs(demo_bf16, prompts, name, 128)


@pytest.fixture(scope="module")
def smollm2_bf16(smollm2_lm):
    return load_model("smollm2", device="cpu", dtype="bf16")


def _smollm2_has_no_bugs(lm, name: str) -> None:
    """Four real prompts (two HumanEval raw, GSM8K and MT-Bench chat), 64 tokens: drafts accepted, zero bugs."""
    from test_smollm2 import _read

    prompts = ([lm.encode_prompt(_read("humaneval/HumanEval.jsonl", i, "prompt"), chat=False) for i in (0, 23)]
               + [lm.encode_prompt(_read("gsm8k/test.jsonl", 0, "question"), chat=True),
                  lm.encode_prompt(_read("mt_bench/question.jsonl", 40, "turns"), chat=True)])
    _has_no_bugs(lm, prompts, name, 64)


@pytest.mark.full  # SmolLM2 in bf16 (a second copy of the model)
@pytest.mark.parametrize("name", ["default", "method-pld", "method-tr"])
def test_smollm2_bf16_has_no_bugs(smollm2_bf16, name):
    _smollm2_has_no_bugs(smollm2_bf16, name)


@pytest.fixture(scope="module")
def smollm2_q4(smollm2_lm):
    return load_model("smollm2", device="cpu", dtype="q4")


@pytest.mark.full  # SmolLM2 in q4 (a second copy of the model)
@pytest.mark.parametrize("name", ["default", "method-pld"])
def test_smollm2_q4_has_no_bugs(smollm2_q4, name):
    """SmolLM2's GGUF weights are Q4_1: q4 serves its own 4-bit codes; bf16 activations, so ties are attributed."""
    lm = smollm2_q4
    assert lm.precision == "q4" and lm.dtype == torch.bfloat16 and lm.describe().endswith("(135M, q4, CPU)")
    _smollm2_has_no_bugs(lm, name)


def test_a_second_copy_that_would_not_fit_is_refused_in_one_sentence(demo_lm, monkeypatch):
    from engine.product.models import registry as registry_module

    registry = registry_module.ModelRegistry(demo_lm)
    monkeypatch.setattr(registry_module, "free_memory", lambda device: 1000)  # bytes: nothing fits
    with pytest.raises(ModelLoadError, match=r"a second copy of 'demo' needs about .* GiB are free; keep the loaded"):
        registry.load("demo", device="cpu", dtype="bf16")
    assert registry.get(None) is demo_lm  # the loaded copy stays


@pytest.mark.full  # loads a second demo model or runs AR step by step (seconds)
def test_the_engines_ar_replayed_gives_its_own_logits(demo_bf16):
    """The bench reads AR's logits by replaying the engine's AR steps: they give back the AR run's tokens."""
    lm = demo_bf16
    ids = lm.encode_prompt("import os\n\ndef list_files(path):\n")
    traces = list(make_decoder(lm.model, DecodeConfig.of(method="ar", max_new_tokens=48), ()).generate(ids))
    want = [t for tr in traces for t in tr.new_tokens]
    tokens, logits = engine_ar_logits(lm.model, ids, want)
    assert tokens == want and logits.shape == (48, lm.model.config.vocab_size) and logits.dtype == torch.bfloat16
    # a divergence either way round within the tie width is a tie: the run's token 1 ulp above AR's in the
    # AR run whose logits are read (two AR paths rounding a tie differently)
    row = logits[10].float()
    runner_up = int(row.topk(2).indices[1])
    found = attribute(lm.model, ids, want, want[:10] + [runner_up] + want[11:], logits)
    assert found.position == 10 and found.gap_ulps >= 0
    assert found.kind == ("precision tie" if found.gap_ulps <= TIE_ULPS[torch.bfloat16] else "bug")
