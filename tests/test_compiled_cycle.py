"""The compiled planner (engine/decoding/compiled_cycle.py: one compiled entry a cycle) against the Python planner:
every field of every cycle's trace the same, timings aside, on the demo model and on SmolLM2 (llama.cpp's kernels),
over both of GT's regimes (path calibration off on the demo's flat curve, on on llama.cpp's steep one) and the
settings the compiled cycle reads; which runs it serves; and that a real run never compiles a kernel the warm-up
did not."""
from __future__ import annotations

import pytest
from conftest import DEMO_CURVE, greedy_reference

from engine.decoding import compiled_cycle, cycle_state
from engine.decoding.compiled_cycle import KERNELS, CompiledPlanner
from engine.decoding.config import DecodeConfig
from engine.decoding.cost import CostCurve
from engine.decoding.decode import SpecDecoder

#: Settings the compiled cycle reads, beyond the defaults: the budget, the depth and a fixed spine ratio, the
#: other bypass rule, branch sources resting early, PLD's earliest occurrence.
VARIANTS = ({}, {"budget": 20}, {"max_depth": 3, "spine_ratio": 0.3}, {"bypass_rule": "confident"},
            {"gt_rest_after": 2}, {"match_occurrence": "earliest", "budget_extension": 0})
SKIP = {"timings_ms", "elapsed_s", "planner"}  # the planner: each run's own label (checked in ``_both``)
STEEP = "past=128;1:10,2:17,4:25,8:41,16:72,32:142,64:280,128:560"  # llama.cpp's Q4_1 curve on 2 cores, roughly


def _fields(trace) -> dict:
    return {k: v for k, v in vars(trace).items() if k not in SKIP}


def _both(path, config: DecodeConfig, curve: CostCurve, ids: list[int], eos=()) -> tuple[list, list]:
    """The traces of one run by the Python planner and by the compiled one (asserted to be the one that planned,
    and each run labelled with its planner)."""
    resolved = config.resolved(curve)
    reference = SpecDecoder(path, resolved, eos, cost_curve=curve)
    reference.compiled = False
    traces = list(reference.generate(ids))
    assert {t.planner for t in traces} == {"python"}
    python = [_fields(t) for t in traces]
    decoder = SpecDecoder(path, resolved, eos, cost_curve=curve)
    made = []
    original = CompiledPlanner.__init__

    def counted(self, *args, **kw):
        made.append(self)
        original(self, *args, **kw)

    CompiledPlanner.__init__ = counted
    try:
        traces = list(decoder.generate(ids))
    finally:
        CompiledPlanner.__init__ = original
    assert len(made) == 1, "the compiled planner did not plan this run"
    assert {t.planner for t in traces} == {"compiled"}
    compiled = [_fields(t) for t in traces]
    return python, compiled


def _signatures() -> dict:
    return {f: len(f.signatures) for f in (cycle_state.state_of, cycle_state.advance, cycle_state.prepare)}


def test_the_compiled_cycle_plans_what_the_python_one_plans(demo_lm, lossless_prompts):
    before = _signatures()
    accepted = cycles = 0
    for spec in (DEMO_CURVE, STEEP):  # path calibration off (a flat curve), on (a steep one)
        curve = CostCurve.from_spec(spec)
        assert DecodeConfig().resolved(curve).path_calibration == (spec == STEEP)
        for i, variant in enumerate(VARIANTS):
            ids = demo_lm.encode_prompt(lossless_prompts[i % len(lossless_prompts)])
            python, compiled = _both(demo_lm.model, DecodeConfig.of(max_new_tokens=48, **variant), curve, ids)
            for j, (p, c) in enumerate(zip(python, compiled)):
                assert p == c, (spec[:20], variant, j, [k for k in p if p[k] != c[k]])
            assert len(python) == len(compiled)
            accepted += sum(len(t["accepted"]) for t in python)
            cycles += len(python)
    assert accepted >= cycles // 2  # drafts were accepted: the comparison is not of AR steps alone
    assert _signatures() == before  # the warm-up typed every kernel as these runs do


@pytest.mark.full  # SmolLM2 on llama.cpp's kernels: a minute
def test_the_compiled_cycle_plans_what_the_python_one_plans_on_smollm2(smollm2_lm, lossless_prompts):
    from engine.core.forward import make_path
    from engine.product.models.named import SMOLLM2, ensure_gguf
    path = make_path(smollm2_lm.model, "llamacpp", gguf=ensure_gguf(SMOLLM2))
    for i, text in enumerate(lossless_prompts[:4]):
        curve = CostCurve.from_spec(STEEP if i % 2 else DEMO_CURVE)  # path calibration on, off
        ids = smollm2_lm.encode_prompt(text)
        python, compiled = _both(path, DecodeConfig.of(max_new_tokens=64), curve, ids, smollm2_lm.eos_token_ids)
        assert python == compiled


def test_the_tables_grow_between_cycles_and_the_trees_stay_the_same(demo_lm, lossless_prompts, monkeypatch):
    """Room for one tree at a time: TR's table and the calibration's pool grow mid-generation (``CompiledPlanner._room``
    from ``learn``, a new compiled state), and every cycle still plans what the Python planner plans, its tokens
    greedy decoding's."""
    monkeypatch.setattr(compiled_cycle, "ROOM_TREES", 1)
    grown = []
    original = CompiledPlanner._room

    def counted(self):
        grown.append(self)
        original(self)

    monkeypatch.setattr(CompiledPlanner, "_room", counted)
    curve = CostCurve.from_spec(STEEP)  # path calibration on: its pool grows too
    accepted = 0
    for text in lossless_prompts[:2]:
        ids = demo_lm.encode_prompt(text)
        python, compiled = _both(demo_lm.model, DecodeConfig.of(max_new_tokens=96), curve, ids)
        assert python == compiled
        assert [t for trace in compiled for t in trace["new_tokens"]] == greedy_reference(demo_lm.model, ids, 96)
        accepted += sum(len(t["accepted"]) for t in compiled)
    assert len(grown) > 2  # beyond the start of each generation
    assert accepted > 0  # drafts were accepted: not a run of AR steps alone


def test_the_compiled_cycle_is_lossless(demo_lm, lossless_prompts):
    curve = CostCurve.from_spec(DEMO_CURVE)
    config = DecodeConfig.of(max_new_tokens=40)
    accepted = 0
    for text in lossless_prompts[:3]:
        ids = demo_lm.encode_prompt(text)
        _, compiled = _both(demo_lm.model, config, curve, ids)
        out = [t for trace in compiled for t in trace["new_tokens"]]
        assert out == greedy_reference(demo_lm.model, ids, 40)
        accepted += sum(len(t["accepted"]) for t in compiled)
    assert accepted > 0


def test_the_compiled_cycle_serves_the_default_goose_runs_only(demo_lm):
    curve = CostCurve.from_spec(DEMO_CURVE)
    positions = SpecDecoder(demo_lm.model, DecodeConfig().resolved(curve), cost_curve=curve).positions

    def covers(**settings) -> bool:
        return CompiledPlanner.covers(DecodeConfig.of(**settings).resolved(curve), curve, positions, 16)

    assert KERNELS.ready.is_set() and covers()
    assert not covers(method="pld") and not covers(method="iso3") and not covers(sources=("pld", "tr", "ptd"))
    assert not covers(temperature=0.7) and not covers(gt_threshold=0.1) and not covers(tr_calibration=True)
    assert not covers(branch_growth="score-width")
    assert not CompiledPlanner.covers(DecodeConfig().resolved(curve), None, positions, 16)  # no curve: no GT auto
    KERNELS.warm_soon()  # at hand already: nothing starts
    assert KERNELS._thread is None
