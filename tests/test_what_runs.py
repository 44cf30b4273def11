"""Issue 70, items 1-2: the dtype asked is the model that runs, every record says what ran, and the lossless check
compares like with like (engine/product/models/what_runs.py, engine/product/runs/reference.py, lossless.py).

Quick tier: no llama-cpp-python needed (a stand-in path that runs "other weights"); tests/test_ggml.py checks the
same on llama.cpp's real path and SmolLM2's GGUF file.
"""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from engine.core.forward import EagerPath, llamacpp
from engine.product.bench import aggregate, markdown
from engine.product.io.traces import RunHeader, TraceFormatError, export_run, load_run
from engine.product.models import loading
from engine.product.models.loading import ModelLoadError, forward_wanted
from engine.product.models.what_runs import WhatRuns
from engine.product.runs.lossless import attribute


class FileWeightsPath(EagerPath):
    """A stand-in for llama.cpp's path: says it runs a file's Q4_1 blocks, rows exact in any batch (it runs the
    eager forward underneath, so its AR is the model's own)."""

    name = "stand-in-file-path"
    ROWS_EXACT = True

    def weights(self) -> str:
        return "Q4_1"


@pytest.fixture
def llama_cpp_present(monkeypatch):
    """``llamacpp.installed()`` says yes, and the model's GGUF file is a path that need not exist (nothing opens it)."""
    monkeypatch.setattr(llamacpp, "installed", lambda: True)
    asked = []
    monkeypatch.setattr(loading.LoadedModel, "gguf", lambda self: asked.append(self.name) or Path("model.gguf"))
    return asked


def test_a_named_dtype_never_lets_auto_pick_a_path_that_runs_the_files_weights(demo_lm, llama_cpp_present):
    fp32 = replace(demo_lm, auto_dtype=False)
    assert forward_wanted(fp32, "auto") == ("auto", None)
    assert llama_cpp_present == [], "the file was fetched for a choice that may not use it"
    assert forward_wanted(replace(demo_lm, auto_dtype=True), "auto") == ("auto", Path("model.gguf"))


@pytest.mark.parametrize("path", ["llamacpp", "llamacpp-q8cache"])
def test_a_llamacpp_path_asked_with_a_named_dtype_says_they_conflict(demo_lm, llama_cpp_present, path):
    with pytest.raises(ModelLoadError, match=f"the {path} forward path runs the model file's own weights.*fp32"):
        forward_wanted(replace(demo_lm, auto_dtype=False), path)
    assert forward_wanted(replace(demo_lm, auto_dtype=True), path) == (path, Path("model.gguf"))


def test_what_runs_names_the_files_type_where_its_weights_run(demo_lm):
    torch_runs = WhatRuns.of("fp32", EagerPath(demo_lm.model))
    assert torch_runs.to_dict() == {"dtype": "fp32", "forward_path": "eager", "weights": "transformers"}
    assert torch_runs.label == "fp32 · eager"
    file_runs = replace(demo_lm, forward_path=FileWeightsPath(demo_lm.model)).runs
    assert file_runs.to_dict() == {"dtype": "Q4_1", "forward_path": "stand-in-file-path", "weights": "gguf"}
    assert file_runs.label == "Q4_1 · llama.cpp kernels (stand-in-file-path)"


def test_on_a_path_whose_rows_are_exact_any_divergence_is_a_bug(demo_lm):
    """A gap of zero ulps is a precision tie on a torch path (in fp32 one the exact mode allows none of), and a bug
    where a path's rows are exact; a half-precision model's ties are judged in its own ulps even when its logits come
    as fp32 copies (``generate``'s)."""
    ids = demo_lm.encode_prompt("def add(a, b):\n", chat=False)
    logits = torch.zeros(4, demo_lm.model.config.vocab_size)  # every token tied
    eager = attribute(demo_lm.model, ids, [1, 2, 3], [1, 2, 4], logits)
    exact = attribute(demo_lm.model, ids, [1, 2, 3], [1, 2, 4], logits, FileWeightsPath(demo_lm.model))
    assert (eager.kind, eager.exact, eager.dtype) == ("precision tie", True, "fp32")
    assert (exact.kind, exact.exact, exact.position) == ("bug", True, 2)
    half = SimpleNamespace(dtype=torch.bfloat16)  # a bf16 model, its logits handed back in fp32
    near = torch.zeros(4, 8)
    near[2, 3], near[2, 4] = 20.0, 20.0 - 0.125 * 3  # 3 bf16 ulps apart at 20: a tie there, not 3e5 fp32 ulps
    tie = attribute(half, ids, [1, 2, 3], [1, 2, 4], near)
    assert (tie.kind, tie.exact, tie.dtype) == ("precision tie", False, "bf16") and tie.gap_ulps == pytest.approx(3.0)


def test_the_cli_holds_a_run_on_other_weights_to_ar_on_the_same_path(demo_lm, monkeypatch, capsys):
    """``--check-lossless`` on a path that runs other weights compares with AR on that path (never ``generate`` on
    the torch model), and the JSON says what ran."""
    from cli import generate
    from engine.product.runs import reference

    monkeypatch.setattr(generate, "load_model", lambda *a, **k: demo_lm)
    monkeypatch.setattr(generate, "with_forward", lambda lm, want: replace(lm, forward_path=FileWeightsPath(lm.model)))
    asked = []
    real = reference.path_reference
    monkeypatch.setattr(reference, "path_reference", lambda *a: asked.append(a[1:]) or real(*a))
    monkeypatch.setattr(reference, "greedy_reference", lambda *a: pytest.fail("held to generate on other weights"))
    code = generate.main(["--model", "demo", "--prompt", "def add(a, b):\n    return a + b\n", "--max-new-tokens",
                          "12", "--check-lossless", "--json", "--cost-curve", "past=128;1:3,2:3.1,4:3.3,8:3.6,16:4"])
    out = capsys.readouterr()
    result = json.loads(out.out)
    assert code == 0, out.err
    assert (result["dtype"], result["forward_path"], result["weights"]) == ("Q4_1", "stand-in-file-path", "gguf")
    assert result["lossless"] is True and result["divergence"] is None and len(asked) == 1
    assert result["new_tokens"] > result["accepted_by_source"]["bonus"], "inconclusive: no draft token accepted"


def test_the_bench_report_says_what_ran_each_method():
    rows = [{"method": m, "dataset": "humaneval", "runs": runs} for m, runs in (
        ("ar", {"dtype": "Q4_1", "forward_path": "llamacpp-q8cache", "weights": "gguf"}),
        ("hf-pld", {"dtype": "q4", "forward_path": "transformers generate", "weights": "transformers"}))]
    lines = markdown._md_what_ran(rows, ["ar", "hf-pld"])
    assert "| ar | the GGUF file's Q4_1 | llamacpp-q8cache |" in lines
    assert "| hf-pld | the transformers model's q4 | transformers generate |" in lines


def test_a_dataset_whose_long_prompts_took_the_long_path_names_both_paths_with_their_counts():
    """``auto`` runs a long prompt on the long path (``LoadedModel.for_context``): the report read the first prompt's
    record only, so a set of short and long prompts was labelled with the short prompts' path."""
    short, long = ({"dtype": "Q4_1", "forward_path": p, "weights": "gguf"} for p in ("llamacpp-q8cache",
                                                                                     "llamacpp-noflash"))
    assert aggregate.what_ran([short, long, long]) == {"dtype": "Q4_1", "weights": "gguf",
                                                       "forward_path": "llamacpp-q8cache (1) / llamacpp-noflash (2)"}
    assert aggregate.what_ran([short, short]) == short and aggregate.what_ran([None]) is None
    rows = [{"method": "ar", "dataset": d, "runs": aggregate.what_ran(each), "runs_each": each}
            for d, each in (("humaneval", [short, long]), ("mt_bench", [long, long]))]
    assert "| ar | the GGUF file's Q4_1 | llamacpp-q8cache (1) / llamacpp-noflash (3) |" in markdown._md_what_ran(
        rows, ["ar"])


def test_a_trace_says_what_ran_and_reads_it_back(demo_lm):
    from engine.decoding.config import DecodeConfig
    from engine.product.runs.decoder import make_decoder

    ids = demo_lm.encode_prompt("def add(a, b):\n")
    decoder = make_decoder(demo_lm.model, DecodeConfig.of(max_new_tokens=6, method="ar"), demo_lm.eos_token_ids)
    traces = list(decoder.generate(ids))
    header = RunHeader(model="demo", prompt="p", config={}, runs=demo_lm.runs.to_dict())
    doc = export_run(header=header, traces=traces, token_text=lambda i: demo_lm.tokenizer.decode([i]))
    assert load_run(doc)["runs"] == {"dtype": "fp32", "forward_path": "eager", "weights": "transformers"}
    bad = json.loads(doc)
    bad["runs"] = {"dtype": 4}
    with pytest.raises(TraceFormatError, match="runs"):
        load_run(json.dumps(bad))
    older = json.loads(doc)
    del older["runs"]
    assert load_run(json.dumps(older))["runs"] is None
