"""GT principle: the verification cost curve, its file and spec forms, and how the decoder reads it."""
from __future__ import annotations

import json

import pytest

from engine.decoding.config import ConfigError, DecodeConfig, parse_gt_threshold
from engine.decoding.cost import FORMAT, CostCurve, CostCurveError, load_cost_curve
from engine.product.cost_cache import SIZES, cached_cost_curve, measure_cost_curve, write_cost_curve
from engine.product.decoding import make_decoder


def test_chord_threshold_is_mean_marginal_node_cost_in_ar_steps():
    curve = CostCurve(nodes=(1, 64, 128), ms=(2.0, 4.0, 10.0), past=0, key="k")
    assert curve.threshold(1) == 0.0
    assert curve.threshold(64) == pytest.approx(2.0 / (63 * 2.0))
    assert curve.latency(96) == pytest.approx(7.0)
    flat = CostCurve(nodes=(1, 128), ms=(5.0, 5.0), past=0, key="k")
    assert flat.threshold(60) == 0.0  # a GPU-like flat curve: every node is worth verifying
    steep = CostCurve(nodes=(1, 2), ms=(1.0, 100.0), past=0, key="k")
    assert steep.threshold(2) == 0.5  # clamped


def test_spec_and_file_round_trip_exactly(tmp_path):
    curve = CostCurve((1, 2, 8), (2.5, 2.75, 3.125), 128, "m|cpu")
    assert CostCurve.from_spec(curve.spec()).spec() == curve.spec()
    assert CostCurve.from_spec(curve.spec()).id == curve.id and len(curve.id) == 12
    path = tmp_path / "c.json"
    assert write_cost_curve(curve, path)
    assert json.loads(path.read_text())["format"] == FORMAT
    assert load_cost_curve(str(path)) == curve
    assert load_cost_curve(curve.spec()).id == curve.id
    result = tmp_path / "result.json"  # an engine.product.generate result carries its curve
    result.write_text(json.dumps({"tau": 2.0, "cost_curve": curve.to_dict()}))
    assert load_cost_curve(str(result)) == curve
    for bad in ("past=1;x", "nonsense", str(tmp_path / "missing.json")):
        with pytest.raises(CostCurveError):
            load_cost_curve(bad)
    with pytest.raises(CostCurveError):
        CostCurve((2, 4), (1.0, 2.0))  # must start at n = 1


@pytest.mark.full  # measures a whole cost curve (about a minute on a busy machine)
def test_measure_writes_nothing_and_the_cache_is_atomic_and_versioned(demo_lm, tmp_path):
    curve = measure_cost_curve(demo_lm.model, sizes=(1, 8, 32), repeats=2)
    assert curve.nodes == (1, 8, 32) and all(ms > 0 for ms in curve.ms)
    assert not list(tmp_path.iterdir())
    first = cached_cost_curve(demo_lm.model, cache_dir=tmp_path)
    files = list(tmp_path.glob("cost/*"))
    assert [f.suffix for f in files] == [".json"]  # no temporary file left behind
    assert cached_cost_curve(demo_lm.model, cache_dir=tmp_path) == first  # read back, not re-measured
    data = json.loads(files[0].read_text())
    data["format"] = FORMAT - 1  # an older format is measured again, not misread
    files[0].write_text(json.dumps(data))
    from engine.product import cost_cache as cost
    cost._loaded.clear()
    assert cached_cost_curve(demo_lm.model, cache_dir=tmp_path).key == first.key
    assert json.loads(files[0].read_text())["format"] == FORMAT
    files[0].write_text(json.dumps(curve.to_dict() | {"key": first.key}))  # this key, other sizes: measured again
    cost._loaded.clear()
    assert cached_cost_curve(demo_lm.model, cache_dir=tmp_path).nodes == SIZES
    files[0].write_text(json.dumps(first.to_dict()))  # this key and sizes, no stamp: measured in the old fixed order
    cost._loaded.clear()
    cached_cost_curve(demo_lm.model, cache_dir=tmp_path)
    assert json.loads(files[0].read_text())["measurement"] == cost.MEASUREMENT  # measured again, and stamped


def test_decoder_rules_and_a_given_curve(demo_lm):
    curve = CostCurve((1, 64), (2.0, 4.0), 128, "given")
    auto = make_decoder(demo_lm.model, DecodeConfig.of(gt_threshold="auto"), (), cost_curve=curve)
    assert auto.config.gt.threshold == "auto" and auto.cost_curve is curve
    chord = make_decoder(demo_lm.model, DecodeConfig.of(gt_threshold="chord"), (), cost_curve=curve)
    assert chord.config.gt.threshold == pytest.approx(curve.threshold(60))
    fixed = make_decoder(demo_lm.model, DecodeConfig.of(gt_threshold=0.2), ())
    assert fixed.config.gt.threshold == 0.2 and fixed.cost_curve is None
    assert [parse_gt_threshold(t) for t in ("auto", "CHORD", "0.05")] == ["auto", "chord", 0.05]
    with pytest.raises(ConfigError):
        DecodeConfig.of(gt_threshold="sometimes")


def test_max_rows_reads_the_curve():
    curve = CostCurve((1, 2, 4), (10.0, 20.0, 40.0))
    assert [curve.max_rows(ms) for ms in (5.0, 10.0, 30.0, 40.0)] == [1, 1, 3, 4]
    assert curve.max_rows(100.0) == 10  # beyond the last size, along the last segment
    assert CostCurve((1, 128), (5.0, 5.0)).max_rows(6.0) == 8 * 128  # a flat curve: the search's end


def test_each_round_times_the_sizes_in_a_new_order(demo_lm, monkeypatch):
    """A forward right after a large one runs slow: in a fixed order T(1) always followed T(128) and read 20 % high
    (SmolLM2, q4), so every round shuffles the sizes (seeded: the same orders on every machine)."""
    from engine.core.forward import EagerPath
    from engine.product import cost_cache as cost

    seen = []

    class Watched(EagerPath):  # the eager path, each verified tree's size noted
        def open(self, max_length, max_rows=1):
            forward = super().open(max_length, max_rows)
            verify = forward.verify
            forward.verify = lambda tree: seen.append(len(tree)) or verify(tree)
            return forward

    sizes = (1, 2, 4, 8, 16)
    cost.measure_cost_curve(demo_lm.model, sizes=sizes, repeats=4, path=Watched(demo_lm.model))
    rounds = [tuple(seen[i:i + len(sizes)]) for i in range(0, len(seen), len(sizes))]
    assert len(rounds) == 5 and all(sorted(r) == list(sizes) for r in rounds)
    assert len(set(rounds)) > 1 and len({r.index(1) for r in rounds}) > 1  # 1 does not hold one place
