"""GT principle: the verification cost curve and the auto threshold c derived from it."""
from __future__ import annotations

import pytest

from engine.config import ConfigError, DecodeConfig
from engine.cost import CostCurve, cached_cost_curve, measure_cost_curve
from engine.decode import SpecDecoder


def test_threshold_is_mean_marginal_node_cost_in_ar_steps():
    curve = CostCurve(nodes=(1, 64, 128), ms=(2.0, 4.0, 10.0), past=0, key="k")
    assert curve.threshold(1) == 0.0
    assert curve.threshold(64) == pytest.approx(2.0 / (63 * 2.0))
    assert curve.latency(96) == pytest.approx(7.0)
    flat = CostCurve(nodes=(1, 128), ms=(5.0, 5.0), past=0, key="k")
    assert flat.threshold(60) == 0.0  # a GPU-like flat curve: every node is worth verifying
    steep = CostCurve(nodes=(1, 2), ms=(1.0, 100.0), past=0, key="k")
    assert steep.threshold(2) == 0.5  # clamped


def test_measure_and_cache(demo_lm, tmp_path):
    curve = measure_cost_curve(demo_lm.model, sizes=(1, 8, 32), repeats=2)
    assert curve.nodes == (1, 8, 32) and all(ms > 0 for ms in curve.ms)
    first = cached_cost_curve(demo_lm.model, cache_dir=tmp_path)
    assert list(tmp_path.glob("cost/*.json"))
    again = cached_cost_curve(demo_lm.model, cache_dir=tmp_path)
    assert again == first  # read back, not re-measured


def test_auto_threshold_is_resolved_by_the_decoder(demo_lm):
    decoder = SpecDecoder(demo_lm.model, DecodeConfig(gt_threshold="auto"), ())
    assert isinstance(decoder.config.gt_threshold, float) and 0.0 <= decoder.config.gt_threshold <= 0.5
    assert SpecDecoder(demo_lm.model, DecodeConfig(gt_threshold=0.2), ()).config.gt_threshold == 0.2
    with pytest.raises(ConfigError):
        DecodeConfig(gt_threshold="sometimes")
