"""Smoke bench: 2 prompts x 16 tokens, every implemented method, so the harness never rots."""
from __future__ import annotations

import json

import pytest

from cli import bench


@pytest.mark.full  # a benchmark run: every method on real prompts (seconds to a minute)
def test_smoke_bench_all_methods(tmp_path, demo_lm):
    out = tmp_path / "bench"
    rc = bench.main(["--model", "demo", "--datasets", "humaneval,mt_bench", "--limit", "2", "--max-new-tokens", "16",
                     "--profile", "--methods", "ar,pld,tr,iso3,iso5,goose,hf-ar,hf-pld", "--out", str(out)])
    assert rc == 0
    result = json.loads((out / "results.json").read_text())
    rows = result["rows"]
    assert {r["method"] for r in rows} == {"ar", "pld", "tr", "iso3", "iso5", "goose", "hf-ar", "hf-pld"}
    assert all(r["lossless"] for r in rows) and all(r["n_prompts"] == 2 for r in rows)
    goose = next(r for r in rows if r["method"] == "goose" and r["dataset"] == "humaneval")
    for key in ("tau", "tok_per_s", "speedup_vs_ar", "p_s", "p_t", "accepted_by_source", "accepted_by_path",
                "median_overhead_ms", "synergy"):
        assert key in goose
    # of limit: each prompt's decode speedup over its own limit, median over prompts (not over a pooled limit)
    ratios = sorted(p["decode_speedup"] / p["limit"] for p in goose["prompts"])
    assert len(ratios) == 2 and goose["of_limit"] == pytest.approx((ratios[0] + ratios[1]) / 2)
    assert goose["of_limit_pooled"] == pytest.approx(goose["decode_speedup"] / goose["limit"])
    assert result["meta"]["command"].startswith("python -m cli.bench")
    assert "Avg Spd" in (out / "results.md").read_text() and "Head to head" in (out / "results.md").read_text()
    pairs = {(h["method"], h["dataset"]) for h in result["head_to_head"]}  # goose against all but AR
    others = ("pld", "tr", "iso3", "iso5", "hf-ar", "hf-pld")
    assert pairs == {(m, d) for m in others for d in ("humaneval", "mt_bench")}
    assert "plotly" in (out / "report.html").read_text()
    assert (out / "profile.jsonl").read_text().count("\n") > 10


def test_head_to_head_counts_prompt_wins_and_gives_the_sign_test():
    def row(method, speedups, dataset="mbpp"):
        return {"method": method, "dataset": dataset, "decode_speedups": speedups}

    rows = [row("ar", [1.0] * 5), row("goose", [1.2, 1.1, 1.3, 1.0, None]), row("iso3", [1.0, 1.0, 1.0, 1.0, 1.0]),
            row("pld", [1.5, 1.5, 1.5, 1.5, 1.5]), row("tr", [1.1, 1.1])]
    got = {h["method"]: h for h in bench.head_to_head(rows)}
    assert set(got) == {"iso3", "pld", "tr"}  # AR is the speedups' own baseline
    # iso3: goose faster on 3 prompts, one equal (dropped), one one-token run (dropped): 3 of 3, p = 2 / 8
    assert (got["iso3"]["wins"], got["iso3"]["n"]) == (3, 3)
    assert got["iso3"]["p"] == pytest.approx(0.25) and got["iso3"]["median_ratio"] == pytest.approx(1.15)
    assert (got["pld"]["wins"], got["pld"]["n"], got["pld"]["p"]) == (0, 4, pytest.approx(0.125))
    assert (got["tr"]["wins"], got["tr"]["n"], got["tr"]["p"]) == (1, 1, pytest.approx(1.0))  # zip: the shorter
    assert bench.head_to_head([row("ar", [1.0]), row("pld", [1.2])]) == []  # no goose: no pairs
    # a prompt where AR wrote one token (EOS after a precision tie) has no decode phase to compare
    runs = [{"tokens": [1, 2, 3], "seconds": 1.0, "prefill_s": 0.5},
            {"tokens": [1, 2], "seconds": 1.0, "prefill_s": 0.5}]
    ar = [{"tokens": [1, 2, 3], "seconds": 2.0, "prefill_s": 0.5}, {"tokens": [1], "seconds": 1.0, "prefill_s": 0.5}]
    got = bench.aggregate("goose", "mbpp", runs, ar)
    assert got["decode_speedups"] == [pytest.approx(3.0), None] and got["decode_speedup"] is None


@pytest.mark.full  # a benchmark run: every method on real prompts (seconds to a minute)
def test_repeats_run_every_method_again_and_keep_its_fastest_run(tmp_path, demo_lm, monkeypatch):
    seconds = iter([3.0, 1.0, 2.0, 5.0, 4.0, 6.0])  # warm-up ar, goose; then prompt 0 twice, in turn
    calls = []
    real = bench.Runner.__call__

    def timed(self, method, prompt_ids):
        record = real(self, method, prompt_ids)
        calls.append(method)
        return {**record, "seconds": next(seconds), "prefill_s": 0.0}

    monkeypatch.setattr(bench.Runner, "__call__", timed)
    out = tmp_path / "bench"
    assert bench.main(["--model", "demo", "--datasets", "humaneval", "--limit", "1", "--max-new-tokens", "8",
                       "--methods", "ar,goose", "--repeats", "2", "--out", str(out)]) == 0
    assert calls == ["ar", "goose", "ar", "goose", "goose", "ar"]  # the order rotates each time
    result = json.loads((out / "results.json").read_text())
    assert result["meta"]["repeats"] == 2
    rows = {r["method"]: r for r in result["rows"]}
    assert rows["ar"]["n_prompts"] == rows["goose"]["n_prompts"] == 1
    # ar ran in 2.0 then 6.0 s (keeps 2.0), goose in 5.0 then 4.0 s (keeps 4.0); the same tokens
    assert rows["goose"]["speedup_vs_ar"] == pytest.approx(2.0 / 4.0)


@pytest.mark.parametrize("args, message", [(["--methods", "ar,eagle"], "unknown method"),
                                           (["--methods", "ar,hf-assisted"], "needs --draft-model"),
                                           (["--repeats", "0"], "at least 1"),
                                           (["--repeats", "2", "--same-session"], "choose one")])
def test_bench_refuses_what_it_cannot_measure(tmp_path, capsys, args, message):
    assert bench.main([*args, "--out", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err


def test_llamacpp_methods_say_how_to_install_or_what_model_they_need(tmp_path, capsys, monkeypatch, without_llama_cpp):
    """Without llama-cpp-python, one sentence on how to install it, never a traceback; on a model with no GGUF
    file, one sentence naming what they need."""
    monkeypatch.setattr(bench, "ensure_gguf", lambda spec: tmp_path / "model.gguf")  # no download
    args = ["--datasets", "humaneval", "--limit", "1", "--methods", "ar,llamacpp-ar", "--out", str(tmp_path)]
    assert bench.main(["--model", "smollm2", *args]) == 2
    err = capsys.readouterr().err
    assert "pip install llama-cpp-python" in err and "Traceback" not in err
    assert bench.main(["--model", "demo", *args]) == 2
    assert "need a GGUF model" in capsys.readouterr().err


@pytest.mark.full  # builds llama.cpp's context and decodes: seconds
def test_llamacpp_runs_greedy_on_the_same_gguf_file(smollm2_lm):
    """llama.cpp's greedy text on SmolLM2's own GGUF file agrees with ours on a prompt without near-ties (the same
    Q4_1 weights, other kernels), and its prompt lookup writes the same text as its AR."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is an optional extra (docs/command-line.md)")
    from engine.product.bench.llamacpp import LlamaCpp
    from engine.product.models.named import SMOLLM2, ensure_gguf

    peer = LlamaCpp(ensure_gguf(SMOLLM2), 2, 512)
    ids = smollm2_lm.encode_prompt("def fibonacci(n):\n", chat=False)
    ar = peer.run("llamacpp-ar", ids, 24, smollm2_lm.eos_token_ids)
    lookup = peer.run("llamacpp-lookup", ids, 24, smollm2_lm.eos_token_ids)
    assert len(ar["tokens"]) == 24 and 0 < ar["prefill_s"] <= ar["seconds"]
    assert lookup["tokens"] == ar["tokens"]
    text = smollm2_lm.tokenizer.decode(ar["tokens"])
    assert "return" in text or "fibonacci" in text or "if" in text, text
