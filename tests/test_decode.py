"""Decoding loop behaviour beyond losslessness: stop requests, EOS, traces."""
from __future__ import annotations

import dataclasses

import pytest

from engine.core.config import ConfigError, DecodeConfig
from engine.core.decode import SpecDecoder

PROMPT = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, b):\n"


def test_stop_request_ends_generation(demo_lm):
    ids = demo_lm.encode_prompt(PROMPT)
    seen = []
    for trace in SpecDecoder(demo_lm.model, DecodeConfig(max_new_tokens=200), ()).generate(
            ids, should_stop=lambda: len(seen) >= 3):
        seen.append(trace)
    assert len(seen) == 3 and not seen[-1].finished


def test_eos_ends_generation_and_is_kept(demo_lm):
    ids = demo_lm.encode_prompt(PROMPT)
    first = list(SpecDecoder(demo_lm.model, DecodeConfig(max_new_tokens=12), ()).generate(ids))
    tokens = [t for tr in first for t in tr.new_tokens]
    eos = tokens[5]  # pretend the 6th generated token is EOS
    traces = list(SpecDecoder(demo_lm.model, DecodeConfig(max_new_tokens=12), (eos,)).generate(ids))
    out = [t for tr in traces for t in tr.new_tokens]
    assert out == tokens[: tokens.index(eos) + 1] and traces[-1].finished


def test_traces_are_frozen_and_complete(demo_lm):
    traces = list(SpecDecoder(demo_lm.model, DecodeConfig(max_new_tokens=30), ()).generate(
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
        next(SpecDecoder(demo_lm.model, DecodeConfig(), ()).generate([]))
    for bad in ({"budget": 0}, {"max_new_tokens": 0}, {"spine_ratio": 1.5}, {"method": "eagle"}, {"max_depth": 0}):
        with pytest.raises(ConfigError):
            DecodeConfig(**bad)
