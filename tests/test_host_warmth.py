"""scripts/host_warmth.py: its planner times each draft and build three times and the run goes on with the first
result, so the run's cycles are those of a plain run (nothing is timed here)."""
from __future__ import annotations

import pytest
from conftest import DEMO_CURVE, script_module

from engine.decoding.config import DecodeConfig
from engine.decoding.cost import CostCurve
from engine.product.runs.decoder import make_decoder


@pytest.fixture(scope="module")
def host_warmth():
    return script_module("host_warmth")


def test_the_timed_planner_keeps_the_runs_own_cycles(host_warmth, demo_lm, lossless_prompts):
    config, curve = DecodeConfig().with_(max_new_tokens=48), CostCurve.from_spec(DEMO_CURVE)
    ids = demo_lm.encode_prompt(lossless_prompts[0])
    plain = list(make_decoder(demo_lm, config, demo_lm.eos_token_ids, cost_curve=curve).generate(ids))
    decoder = make_decoder(demo_lm, config, demo_lm.eos_token_ids, cost_curve=curve)
    timed = host_warmth.WarmthPlanner(decoder.planner, evict_mb=1)
    decoder.planner, decoder.compiled = timed, False  # as the script: the Python planner's stages are timed
    traces = list(decoder.generate(ids))
    assert [(t.mode, t.tree, t.ghosts, t.accepted, t.new_tokens) for t in traces] == \
        [(t.mode, t.tree, t.ghosts, t.accepted, t.new_tokens) for t in plain]
    trees = sum(t.mode != "ar" or t.candidates is not None for t in traces[1:])
    assert trees > 0  # trees were built, so the build's timings are of trees
    for when in host_warmth.WHEN:
        assert len(timed.ms[("draft", when)]) == len(traces) - 1  # every cycle after the prefill
        assert len(timed.ms[("build", when)]) == trees
