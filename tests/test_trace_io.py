"""Trace export / import (engine/product/io/traces.py, docs/trace-schema.md) and the theory formulas."""
from __future__ import annotations

import json

import pytest

from engine.core.theory import isotropic_yield, spine_yield_bound, tree_shape
from engine.decoding.config import DecodeConfig
from engine.product.io.traces import MAX_BYTES, RunHeader, TraceFormatError, export_run, load_run
from engine.product.runs.decoder import make_decoder


@pytest.fixture(scope="module")
def exported(demo_lm):
    cfg = DecodeConfig.of(max_new_tokens=24, gt_threshold=0.0)
    ids = demo_lm.encode_prompt("def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n")
    decoder = make_decoder(demo_lm.model, cfg, demo_lm.eos_token_ids)
    traces = list(decoder.generate(ids))
    doc = export_run(header=RunHeader(model=demo_lm.name, prompt="p", config=decoder.config.to_dict()), traces=traces,
                     token_text=lambda i: demo_lm.tokenizer.decode([i]))
    return traces, doc


def test_round_trip_keeps_every_cycle(exported):
    traces, doc = exported
    run = load_run(doc.encode())
    shape = lambda tree: (tree.tokens, tree.parents, tree.sources)  # noqa: E731 (scores are rounded to 1e-6)
    assert [shape(t.tree) for t in run["traces"]] == [shape(t.tree) for t in traces]
    assert all(a == pytest.approx(b, abs=1e-6) for r, t in zip(run["traces"], traces)
               for a, b in zip(r.tree.scores, t.tree.scores))
    assert [t.accepted for t in run["traces"]] == [t.accepted for t in traces]
    assert [t.new_tokens for t in run["traces"]] == [t.new_tokens for t in traces]
    assert all(tok in run["token_text"] for t in traces for tok in t.tree.tokens)
    assert run["config"]["gt_threshold"] == 0.0
    doc = json.loads(doc)
    doc["cycles"][1]["resting"] = ["tr"]  # a cycle TR sat out (GtConfig.rest_after) reads back as such
    assert load_run(json.dumps(doc))["traces"][1].resting == ("tr",)


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.update(schema="other"), "not a goose-lens trace"),
    (lambda d: d.update(version=3), "version 3"),
    (lambda d: d["cycles"][1].update(confidence=1.5), "confidence"),
    (lambda d: d["cycles"][1].update(budget=-1), "budget"),
    (lambda d: d["cycles"][1].update(chain_tokens="long"), "chain_tokens"),
    (lambda d: d.update(cycles=[]), "records no cycle"),
    (lambda d: d["cycles"][1]["tree"].update(parents=[None, 5]), "cycle 1"),
    (lambda d: d["cycles"][1].update(index="x"), "not its position"),
    (lambda d: d["cycles"][1].update(p_s_ema="high"), "cycle 1"),
    (lambda d: d["cycles"][1].update(spine_ratio="half"), "spine_ratio"),
    (lambda d: d["cycles"][1].update(mode="warp"), "unknown mode"),
    (lambda d: d["cycles"][1]["tree"]["sources"].__setitem__(0, "magic"), "unknown source"),
    (lambda d: d["cycles"][1].update(accepted=[99]), "out of range"),
    (lambda d: d["cycles"][1].pop("bonus"), "missing field 'bonus'"),
    (lambda d: d["cycles"][1].update(resting="tr"), "resting"),
    (lambda d: d["cycles"][1].update(resting=["root"]), "resting"),
])
def test_bad_files_get_a_clear_message(exported, mutate, message):
    doc = json.loads(exported[1])
    mutate(doc)
    with pytest.raises(TraceFormatError, match=message):
        load_run(json.dumps(doc))


def test_confidence_fields_round_trip(demo_lm):
    """A paper-preset run records each cycle's match confidence, its (extended) chain and its budget."""
    cfg = DecodeConfig.preset("paper", max_new_tokens=48)
    ids = demo_lm.encode_prompt("x = [1, 2, 3, 4, 5, 6, 7, 8]\ny = [1, 2, 3, 4, 5, 6, 7, 8]\nz = [1, 2, 3, 4")
    traces = list(make_decoder(demo_lm.model, cfg, demo_lm.eos_token_ids).generate(ids))
    doc = export_run(header=RunHeader(model="m", prompt="p", config=cfg.to_dict()), traces=traces, token_text=str)
    back = load_run(doc)["traces"]
    fields = lambda t: (t.confidence, t.match_tokens, t.chain_tokens, t.budget)  # noqa: E731
    assert [fields(t) for t in back] == [fields(t) for t in traces]
    assert any(t.budget is not None and t.budget > cfg.tree.budget for t in traces)  # a confident cycle raised it


def test_version_1_files_still_load(exported):
    doc = json.loads(exported[1])
    doc["version"] = 1
    for c in doc["cycles"]:
        for key in ("confidence", "match_tokens", "chain_tokens", "budget"):
            c.pop(key)
    run = load_run(json.dumps(doc))
    assert all(t.confidence is None and t.budget is None and t.chain_tokens == 0 for t in run["traces"])


def test_not_json_and_too_large_are_refused():
    with pytest.raises(TraceFormatError, match="^it is not a text file, and a trace is the .json file"):
        load_run(b"\x80\x04\x95 pickle bytes")
    with pytest.raises(TraceFormatError, match=r"^it is not JSON \(line 1, column 2\)"):
        load_run(b"{oops")
    with pytest.raises(TraceFormatError, match="MB"):
        load_run(b" " * (MAX_BYTES + 1))


def test_yield_formulas():
    # Eq. 1 with no branches is the pure spine: 1 + sum p_s^i
    assert spine_yield_bound(0.5, 0.3, 3, [0, 0, 0], 6) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    # branches only add (synergy >= 0), and more branch width adds more
    assert spine_yield_bound(0.5, 0.3, 3, [4, 2, 1], 6) > spine_yield_bound(0.5, 0.3, 3, [1, 0, 0], 6)
    assert isotropic_yield(0.0, 60) == 1.0 and isotropic_yield(1.0, 1 + 3 + 9, 3, 6) == pytest.approx(3.0)
    assert 1 < isotropic_yield(0.3, 60) < 4


def test_tree_shape_reads_spine_and_branch_widths(exported):
    traces, _ = exported
    for t in traces:
        m, widths = tree_shape(t.tree)
        assert m <= len(t.tree) - 1 and len(widths) == max(m, 1)


def test_round_trip_keeps_the_gt_choice_and_prompt_format(demo_lm):
    """A GT-"auto" run's per-cycle size choice and the run's prompt format survive export and import."""
    from engine.decoding.cost import CostCurve

    steep = CostCurve((1, 2, 4, 8, 128), (1.0, 1.05, 1.2, 1.6, 30.0))  # a CPU-like curve: pruning happens
    ids = demo_lm.encode_prompt("def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n")
    decoder = make_decoder(demo_lm.model, DecodeConfig.of(max_new_tokens=24), demo_lm.eos_token_ids, cost_curve=steep)
    traces = list(decoder.generate(ids))
    chosen = [t for t in traces if t.gt_nodes is not None]
    assert chosen, "no cycle recorded a GT size choice"
    header = RunHeader(model=demo_lm.name, prompt="p", config=decoder.config.to_dict(), prompt_format="raw")
    doc = export_run(header=header, traces=traces, token_text=lambda i: demo_lm.tokenizer.decode([i]))
    run = load_run(doc)
    assert run["prompt_format"] == "raw"
    for got, want in zip(run["traces"], traces):
        assert (got.gt_nodes, got.gt_candidates) == (want.gt_nodes, want.gt_candidates)
        assert got.gt_expected == (None if want.gt_expected is None else pytest.approx(want.gt_expected, abs=1e-6))


def test_round_trip_keeps_the_planner(demo_lm):
    """Each cycle's planner (``CycleTrace.planner``: the default Goose run plans with the compiled cycle) reads back as
    written; a trace written before the field reads as "python"; an unknown planner is refused with its cycle."""
    from conftest import DEMO_CURVE

    from engine.decoding.cost import CostCurve

    ids = demo_lm.encode_prompt("def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n")
    decoder = make_decoder(demo_lm.model, DecodeConfig.of(max_new_tokens=16), demo_lm.eos_token_ids,
                           cost_curve=CostCurve.from_spec(DEMO_CURVE))
    traces = list(decoder.generate(ids))
    assert {t.planner for t in traces} == {"compiled"}
    doc = export_run(header=RunHeader(model=demo_lm.name, prompt="p", config=decoder.config.to_dict()), traces=traces,
                     token_text=lambda i: demo_lm.tokenizer.decode([i]))
    assert [t.planner for t in load_run(doc.encode())["traces"]] == [t.planner for t in traces]
    older = json.loads(doc)
    del older["cycles"][1]["planner"]
    assert load_run(json.dumps(older))["traces"][1].planner == "python"
    older["cycles"][1]["planner"] = "fortran"
    with pytest.raises(TraceFormatError, match="cycle 1: unknown planner 'fortran'"):
        load_run(json.dumps(older))
