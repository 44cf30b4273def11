"""Decoding loop behaviour beyond losslessness: stop requests, EOS, traces."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import greedy_reference

from engine.core.verify import read_back
from engine.decoding.config import ConfigError, DecodeConfig
from engine.product.runs.decoder import make_decoder

PROMPT = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, b):\n"


def test_stop_request_ends_generation(demo_lm):
    ids = demo_lm.encode_prompt(PROMPT)
    seen = []
    for trace in make_decoder(demo_lm.model, DecodeConfig.of(max_new_tokens=200), ()).generate(
            ids, should_stop=lambda: len(seen) >= 3):
        seen.append(trace)
    assert len(seen) == 3 and not seen[-1].finished


def test_eos_ends_generation_and_is_kept(demo_lm):
    ids = demo_lm.encode_prompt(PROMPT)
    first = list(make_decoder(demo_lm.model, DecodeConfig.of(max_new_tokens=12), ()).generate(ids))
    tokens = [t for tr in first for t in tr.new_tokens]
    eos = tokens[5]  # pretend the 6th generated token is EOS
    traces = list(make_decoder(demo_lm.model, DecodeConfig.of(max_new_tokens=12), (eos,)).generate(ids))
    out = [t for tr in traces for t in tr.new_tokens]
    assert out == tokens[: tokens.index(eos) + 1] and traces[-1].finished


def test_traces_are_frozen_and_complete(demo_lm):
    traces = list(make_decoder(demo_lm.model, DecodeConfig.of(max_new_tokens=30), ()).generate(
        demo_lm.encode_prompt(PROMPT)))
    assert traces[0].mode == "prefill" and traces[-1].finished and traces[-1].total_tokens == 30
    t = traces[-1]
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.bonus = 0
    with pytest.raises(TypeError):
        t.timings_ms["forward"] = 0.0
    for tr in traces[1:]:
        assert {"draft", "build", "forward", "walk", "cache", "harvest", "total"} <= set(tr.timings_ms)
        assert len(tr.greedy) == len(tr.tree)
        assert tr.mode in ("bypass", "tree", "ar")


def test_empty_prompt_and_bad_config_are_refused(demo_lm):
    with pytest.raises(ValueError, match="empty"):
        next(make_decoder(demo_lm.model, DecodeConfig(), ()).generate([]))
    for bad in ({"budget": 0}, {"max_new_tokens": 0}, {"spine_ratio": 1.5}, {"method": "eagle"}, {"max_depth": 0}):
        with pytest.raises(ConfigError):
            DecodeConfig.of(**bad)


def test_config_is_nested_by_concern_and_speaks_the_old_flat_names():
    """Issue 20: at most 12 top-level fields; every old flat name (CLI dest, trace key) still reads and writes."""
    from dataclasses import fields

    from engine.decoding.config import FLAT_NAMES, PRESETS, VARIANTS

    assert len(fields(DecodeConfig)) <= 12
    cfg = DecodeConfig.of(budget=16, gt_threshold=0.1, ptd_rows=8, sample_top_k=5, ptd_share=0.25,
                          pld_chain_tokens=12, suffix_min_prob=0.2, bypass_rule="confident")
    assert (cfg.tree.budget, cfg.gt.threshold, cfg.source_config("ptd").rows, cfg.sampler.top_k) == (16, 0.1, 8, 5)
    assert (cfg.tree.pool_share, cfg.source_config("pld").chain_tokens, cfg.source_config("suffix").min_prob,
            cfg.variant.bypass_rule) == (0.25, 12, 0.2, "confident")
    assert DecodeConfig.from_dict(cfg.to_dict()) == cfg and set(cfg.to_dict()) == set(FLAT_NAMES)
    # a trace written before the nesting: the 51 flat keys, lists for tuples, and a key this version lacks
    old = {**DecodeConfig().to_dict(), "budget": 24, "sources": ["pld", "tr", "ptd"], "retired_option": 1}
    assert DecodeConfig.from_dict(old) == DecodeConfig.of(budget=24, sources=("pld", "tr", "ptd"))
    assert DecodeConfig.preset("paper").variant == VARIANTS["authors"] and PRESETS["paper"]["variant"] == "authors"
    assert DecodeConfig().variant.name == "goose-lens" and cfg.variant.name == "custom"
    with pytest.raises(ConfigError, match="unknown setting 'budgte'"):
        DecodeConfig.of(budgte=16)


def test_the_decoder_takes_a_resolved_config_and_never_a_curve_of_its_own(demo_lm):
    """SpecDecoder neither measures nor loads a cost curve: an unresolved config, or GT auto without the curve it
    was resolved with, is refused; make_decoder resolves chord to one number c and the builders' floor."""
    from engine.decoding.cost import CostCurve
    from engine.decoding.decode import SpecDecoder

    curve = CostCurve((1, 8, 64), (5.0, 9.0, 40.0), key="k")
    with pytest.raises(ValueError, match="resolved config"):
        SpecDecoder(demo_lm.model, DecodeConfig.of(gt_threshold=0.0), ())
    with pytest.raises(ValueError, match="cost curve"):
        SpecDecoder(demo_lm.model, DecodeConfig().resolved(curve), ())
    with pytest.raises(ConfigError, match="reads a cost curve"):
        DecodeConfig().resolved(None)
    auto = DecodeConfig().resolved(curve)
    assert auto.config == DecodeConfig() and auto.prune_at == curve.threshold(60)  # the config stays as set
    assert DecodeConfig.of(gt_floor=False).resolved(curve).prune_at == 0.0
    chord = make_decoder(demo_lm.model, DecodeConfig.of(gt_threshold="chord"), (), cost_curve=curve)
    assert chord.config.gt.threshold == chord.resolved.prune_at == curve.threshold(60)  # "chord" becomes its c
    # the chain cap: the longest extended chain whose forward costs at most gt_chain_steps AR steps
    assert auto.chain_cap == curve.max_rows(3.0 * 5.0) - 1 == 17
    assert DecodeConfig.of(gt_threshold=0.1).resolved(None).chain_cap is None  # no curve, no cap


@pytest.mark.full  # several seconds of decoding (the quick tier keeps what issue 32 names and the sub-second tests)
def test_an_extended_chain_stays_within_the_chain_cap(demo_lm, lossless_prompts):
    """Goose §4.3 extends a confident chain to int(max_extended_chain × m) tokens; the GT cap (gt_chain_steps AR
    steps on the curve) cuts it, the last lookup's overshoot included, and never below the match itself."""
    from engine.decoding.cost import CostCurve

    curve = CostCurve((1, 64), (2.0, 4.0), key="k")  # T(n) ≤ 1.3 T(1) up to 19 rows: a chain of 18
    extended = {}
    for steps in (1.3, 1000.0):
        decoder = make_decoder(demo_lm.model, DecodeConfig.of(gt_chain_steps=steps), (), cost_curve=curve)
        cap = decoder.resolved.chain_cap
        traces = [t for p in lossless_prompts[:2] for t in list(decoder.generate(demo_lm.encode_prompt(p)))[1:]]
        assert all(t.chain_tokens <= max(cap, t.match_tokens) for t in traces)
        extended[steps] = max(t.chain_tokens for t in traces if t.chain_tokens > t.match_tokens)
    assert extended == {1.3: 18, 1000.0: extended[1000.0]} and extended[1000.0] > 18


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_read_back_argmax_is_torch_argmax_among_ties_and_nan(dtype):
    """The read-back takes each row's argmax off its top-k; it must equal ``torch.argmax`` exactly: the lowest
    index among tied maxima, also when more than k entries tie (the argmax lies beyond the top-k) or a row is NaN.
    Its successors are the k largest logits, ties lowest id first, with their softmax probabilities."""
    gen = torch.Generator().manual_seed(0)
    for trial in range(40):
        logits = (torch.randn(1 + trial % 9, 512, generator=gen) * 4).round(decimals=trial % 2)  # coarse: many ties
        if trial % 4 == 0:
            logits[:, 100:130] = logits.max() + 1  # 30 tied maxima, more than k = 10
        if trial % 7 == 0:
            logits[0, 17] = float("nan")
        logits = logits.to(dtype)
        want = logits.argmax(-1).tolist()
        back = read_back(logits, 10)
        assert back.greedy == want and read_back(logits, 0).greedy == want
        scores = torch.softmax(logits.float(), -1).topk(10, -1).values
        ranked = logits.float().sort(dim=-1, descending=True, stable=True).indices  # by value, ties lowest id first
        if trial % 7:
            assert back.successor_scores.tolist() == scores.double().tolist()
            assert back.successor_ids.tolist() == ranked[:, :10].tolist()


STEEP = "past=128;1:10,2:17,4:25,8:41,16:72,32:142,64:280,128:560"  # llama.cpp's Q4_1 curve on 2 cores, roughly
GRAPHED = "past=128;1:3.73,2:4.13,4:4.23,8:4.31,16:4.48,32:4.73,64:5.12,128:5.72"  # an H200's CUDA graphs, SmolLM2


def test_path_calibration_auto_calibrates_where_a_first_draft_row_is_dear(demo_lm, monkeypatch):
    """``path_calibration`` "auto": the size choice reads calibrated path estimates where a tree's first draft row
    costs at least ``CALIBRATE_AT`` of an AR step (llama.cpp's steep curve), raw ones on a flat curve (CUDA graphs);
    True and False hold on any curve; anything else is refused."""
    import engine.decoding.planner as planner
    from engine.decoding.config import CALIBRATE_AT
    from engine.decoding.cost import CostCurve

    steep, flat = CostCurve.from_spec(STEEP), CostCurve.from_spec(GRAPHED)
    assert steep.row_price() == pytest.approx(0.7) and flat.row_price() == pytest.approx(0.4 / 3.73, abs=1e-3)
    assert steep.row_price() >= CALIBRATE_AT > flat.row_price()
    assert DecodeConfig().resolved(steep).path_calibration and not DecodeConfig().resolved(flat).path_calibration
    assert DecodeConfig.of(path_calibration=True).resolved(flat).path_calibration
    assert not DecodeConfig.of(path_calibration=False).resolved(steep).path_calibration
    with pytest.raises(ConfigError, match="path calibration"):
        DecodeConfig.of(path_calibration="sometimes")
    seen = []  # what the size choice was given: the session's calibration, or None
    real = planner.calibrated_choice
    monkeypatch.setattr(planner, "calibrated_choice", lambda tree, curve, extra, paths, **kw: seen.append(paths)
                        or real(tree, curve, extra, paths, **kw))
    ids = demo_lm.encode_prompt(PROMPT)
    for spec, calibrated in ((STEEP, True), (GRAPHED, False)):
        seen.clear()
        decoder = make_decoder(demo_lm.model, DecodeConfig.of(max_new_tokens=24), (),
                               cost_curve=CostCurve.from_spec(spec))
        decoder.compiled = False  # the Python planner's size choice is what is watched
        list(decoder.generate(ids))
        assert seen and all((paths is not None) == calibrated for paths in seen), spec


def test_branch_sources_rest_after_a_run_of_cycles_gt_priced_down_to_the_anchor(demo_lm, monkeypatch):
    """``GtConfig.rest_after`` = k: a cycle whose k or more predecessors in a row were AR steps (GT priced every draft
    down to the anchor) drafts without TR, reads back no top-k and lets TR observe nothing, except every k-th such
    cycle; a verified draft ends the run.  The output is AR's all along."""
    import engine.decoding.decode as decode
    from engine.decoding.cost import CostCurve
    from engine.sources.tr import TrSource
    from viz.explain import explain_cycle

    ks, observed = [], []
    monkeypatch.setattr(decode, "read_back", lambda logits, k, probs=None: ks.append(k) or read_back(logits, k, probs))
    real_observe = TrSource.observe
    monkeypatch.setattr(TrSource, "observe", lambda self, v: observed.append(len(v.output)) or real_observe(self, v))
    ids, k = demo_lm.encode_prompt(PROMPT), 4
    config = DecodeConfig.of(max_new_tokens=96, gt_rest_after=k)
    decoder = make_decoder(demo_lm.model, config, (), cost_curve=CostCurve.from_spec(STEEP))
    decoder.compiled = False  # TR's own observations are counted (the compiled planner's table: test_compiled_cycle)
    traces = list(decoder.generate(ids))
    streak, rested, reset = 0, 0, False
    for trace, read_k in zip(traces[1:], ks[1:]):  # ks[0]: the prefill's
        rests = streak >= k and streak % k != 0
        assert trace.resting == (("tr",) if rests else ()) and read_k == (0 if rests else 10), (trace.index, streak)
        rested += rests
        reset |= streak >= k and trace.mode != "ar"
        streak = streak + 1 if trace.mode == "ar" else 0
    assert rested >= 5 and reset  # the rule both rested and ended a run of AR steps here
    assert any(t.accepted for t in traces[1:])  # drafts were accepted: the comparison below is not AR against AR
    assert len(observed) == len(traces) - 1 - rested  # TR observed every cycle it drafted in
    assert "TR branch rested" in explain_cycle(next(t for t in traces if t.resting), str)
    free = list(make_decoder(demo_lm.model, DecodeConfig.of(max_new_tokens=96, gt_rest_after=0), (),
                             cost_curve=CostCurve.from_spec(STEEP)).generate(ids))
    out = [t for tr in traces for t in tr.new_tokens]
    assert out == [t for tr in free for t in tr.new_tokens] == greedy_reference(demo_lm.model, ids, 96)
    assert not any(t.resting for t in free)
