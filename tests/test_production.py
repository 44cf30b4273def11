"""Numbers in (issue 35): a deployment's acceptance figures read from vLLM's, SGLang's and llama.cpp's own reports
(samples in tests/data/production/, written from each engine's code), anything else refused in one sentence."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli.production import main
from engine.decoding.trace import CycleTrace
from engine.product.io.production import EXPECTED, ProductionError, from_traces, read_production

SAMPLES = Path(__file__).parent / "data" / "production"


def sample(name: str) -> str:
    return (SAMPLES / name).read_text(encoding="utf-8")


def test_vllm_metrics_as_vllm_summarises_them():
    """vLLM's own log line: mean acceptance length 1 + accepted / drafts, rate accepted / draft tokens, per position
    accepted_per_pos[i] / drafts; the _created gauges and other metrics are not counted."""
    found = read_production(sample("vllm_metrics.txt"))
    assert (found.steps, found.draft_tokens, found.accepted) == (1200, 5400, 2280)
    assert found.tau == pytest.approx(1 + 2280 / 1200) and found.acceptance_rate == pytest.approx(2280 / 5400)
    assert found.per_position == pytest.approx((820 / 1200, 560 / 1200, 400 / 1200, 300 / 1200, 200 / 1200))


def test_vllm_metrics_of_two_engines_add_up():
    two = sample("vllm_metrics.txt") + sample("vllm_metrics.txt").replace('engine="0"', 'engine="1"').replace(
        "# HELP", "# x").replace("# TYPE", "# x")
    assert read_production(two).steps == 2400


def test_sglang_meta_info_new_and_old_fields():
    found = read_production(sample("sglang_generate.json"))
    assert (found.steps, found.draft_tokens, found.accepted) == (80, 880, 175)
    assert found.tau == pytest.approx(255 / 80)  # (completion_tokens - 1) / spec_verify_ct: the prefill's token out
    assert found.per_position[0] == pytest.approx(58 / 80) and len(found.per_position) == 8
    old = read_production(sample("sglang_0.5.5_generate.json"))  # 0.5.5 counts no accepted token for NGRAM
    assert (old.steps, old.accepted, old.draft_tokens, old.per_position) == (80, 175, None, ())
    many = read_production(json.dumps([json.loads(sample("sglang_generate.json"))] * 3))
    assert many.steps == 240 and "3 requests" in many.source


def test_llamacpp_timings():
    found = read_production(sample("llamacpp_completion.json"))
    assert (found.draft_tokens, found.accepted, found.steps) == (336, 281, None)
    assert found.acceptance_rate == pytest.approx(281 / 336)
    assert found.tau == pytest.approx(411 / (411 - 281)) and "no count of draft rounds" in found.tau_note


@pytest.mark.parametrize("text, words", [
    ("hello", "not a deployment's acceptance figures"),
    ('{"a": 1}', "neither SGLang's meta_info nor llama.cpp's timings"),
    ('{"timings": {"predicted_n": 5}}', "no draft_n"),
    ('{"meta_info": {"completion_tokens": 5}}', "verified no draft"),
    ("{not json", "not valid JSON"),
    ("vllm:spec_decode_num_drafts_total 0\n", "show no draft yet"),
    ('{"meta_info": null}', "verified no draft"),
    ('{"meta_info": {"spec_verify_ct": "x"}}', "not values of their kinds"),
    ('{"timings": {"draft_n": "abc"}}', "not values of their kinds"),
    ('{"meta_info": {"spec_verify_ct": 3, "completion_tokens": 9, "spec_accept_histogram": 4}}',
     "not values of their kinds"),
    ("[" * 100_000, "not"),
])
def test_other_files_are_refused_in_one_sentence(text, words):
    with pytest.raises(ProductionError) as err:
        read_production(text)
    message = str(err.value)
    assert words in message and message.count(". ") == 0 and message.endswith((".", "?", ")"))


def test_a_bom_and_llamacpp_metrics_read():
    assert read_production("\ufeff" + sample("sglang_generate.json")).steps == 80
    metrics = sample("vllm_metrics.txt").replace("vllm:", "llamacpp:")
    found = read_production(metrics)
    assert found.source == "llama.cpp /metrics" and found.steps == 1200


def test_cli_reads_each_sample_and_refuses_others(tmp_path, capsys):
    for name in ("vllm_metrics.txt", "sglang_generate.json", "llamacpp_completion.json"):
        assert main([str(SAMPLES / name), "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["accepted"] > 0
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"\xff\xfe\x00")
    assert main([str(junk)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err and str(tmp_path) not in err
    (tmp_path / "x.txt").write_text("hello")
    assert main([str(tmp_path / "x.txt")]) == 2 and EXPECTED in capsys.readouterr().err


def test_a_run_here_gives_the_same_figures():
    from engine.core.tree import DraftTree, Source

    pld = Source("pld")
    tree = DraftTree(tokens=(1, 2, 3, 4), parents=(None, 0, 1, 2), sources=(Source.ROOT, pld, pld, pld),
                     scores=(1.0, .5, .5, .5), est_accept=(1.0, .5, .25, .125))
    traces = [CycleTrace(index=i, mode=mode, tree=tree if mode != "ar" else DraftTree.root_only(1), ghosts=(),
                         greedy=(), accepted=acc, bonus=9, new_tokens=(), spine_ratio=None, p_s_ema=0.0,
                         timings_ms={}, elapsed_s=0.0, total_tokens=0, finished=False)
              for i, (mode, acc) in enumerate((("bypass", (1, 2)), ("bypass", ()), ("ar", ()), ("bypass", (1, 2, 3))))]
    found = from_traces(traces)
    assert (found.steps, found.draft_tokens, found.accepted) == (3, 9, 5)
    assert found.per_position == pytest.approx((2 / 3, 2 / 3, 1 / 3)) and found.tau == pytest.approx(1 + 5 / 3)
    assert from_traces(traces[2:3]) is None
