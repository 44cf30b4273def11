"""Issue 74: the predicted speedup (``engine.product.bench.predicted``, what ``scripts/predicted_speed.py`` prints and
the defaults in docs/results.md cite) prices every decoding cycle on one curve: Σ tokens / Σ T(rows) × T(1)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from engine.decoding.config import DecodeConfig
from engine.decoding.cost import CostCurve
from engine.product.bench.predicted import Pricing, oracle_ms, predict, predicted_speedup
from engine.product.runs.decoder import make_decoder

CURVE = CostCurve.from_spec("past=128;1:10,2:15,4:20,8:40")


def cycle(tokens: int, rows: int, accepted: int):
    return SimpleNamespace(new_tokens=(0,) * tokens, forward_rows=rows, accepted=tuple(range(accepted)))


def test_a_run_is_priced_cycle_by_cycle_on_the_truth():
    cycles = [cycle(3, 4, 2), cycle(1, 1, 0), cycle(2, 2, 1)]  # 6 tokens over 20 + 10 + 15 ms
    assert predicted_speedup(cycles, Pricing(CURVE)) == pytest.approx(6 / 45 * 10)
    assert predicted_speedup([cycle(1, 1, 0)] * 5, Pricing(CURVE)) == pytest.approx(1.0)  # AR's own pace
    with pytest.raises(ValueError, match="no decoding cycle"):
        predicted_speedup([], Pricing(CURVE))


def test_the_oracle_prices_the_accepted_path_alone_or_its_ar_steps():
    three = CURVE.latency(3)
    assert oracle_ms(CURVE, cycle(3, 8, 2)) == pytest.approx(min(three, 3 * 10))
    assert oracle_ms(CostCurve.from_spec("past=128;1:10,2:25"), cycle(2, 2, 1)) == pytest.approx(20)  # AR cheaper
    assert predicted_speedup([cycle(3, 8, 2)], Pricing(CURVE, oracle=True)) == pytest.approx(3 / three * 10)


def test_predict_prices_the_runs_it_decodes(demo_lm):
    """Each method decodes the prompts with the size choice reading ``Pricing.read``; the figure is the median of
    ``predicted_speedup`` over them, AR's exactly 1."""
    ids = demo_lm.encode_prompt("def fibonacci(n):")
    rows = list(predict(demo_lm, ["ar", "goose"], {"set": [ids]}, Pricing(CURVE), max_new_tokens=24))
    assert [(p.dataset, p.method) for p in rows] == [("set", "ar"), ("set", "goose")]
    assert rows[0].speedup == pytest.approx(1.0) and rows[0].tau == pytest.approx(1.0)
    config = DecodeConfig.of(max_new_tokens=24)
    cycles = list(make_decoder(demo_lm, config, demo_lm.eos_token_ids, cost_curve=CURVE).generate(ids))[1:]
    assert rows[1].speedup == pytest.approx(predicted_speedup(cycles, Pricing(CURVE)))
