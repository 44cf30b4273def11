"""Issue 73: GT's ledger of a run (engine/product/runs/ledger.py, viz/ledger.py): each cycle's drafts, GT's decision
in one sentence, the output's verdict on the pruned drafts, and the same drafts priced on another device's curve,
checked against ``scripts/predicted_speed.py --trace`` on a recorded run."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from engine.core.tree import DraftTree, Source
from engine.decoding.config import DecodeConfig
from engine.decoding.cost import CostCurve
from engine.product.io.traces import RunHeader, export_run
from engine.product.runs.decoder import make_decoder
from engine.product.runs.ledger import (
    DEVICE_CURVES,
    CycleLedger,
    cycle_ledger,
    device_curve,
    matched,
    outputs_after,
    price_on,
)
from engine.sources.pld import PldSource
from viz.ledger import ledger_panel

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
#: a steep CPU curve: a second row costs 0.8 of a first (llama.cpp's on a 2-core CPU), so GT keeps few trees
PLD = PldSource.info.source
STEEP = CostCurve.from_spec("past=128;1:15,2:27,4:40,8:67,16:130,32:240,64:428,128:850")
FLAT = CostCurve.from_spec("past=128;1:3,2:3.4,4:4,8:5,16:7,32:11,64:20,128:38")
PROMPT = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, b):\n"


def _run(lm, curve: CostCurve, **settings):
    config = DecodeConfig.of(max_new_tokens=48, gt_rest_after=0, **settings)
    return list(make_decoder(lm.model, config, lm.eos_token_ids, cost_curve=curve).generate(
        lm.encode_prompt(PROMPT, chat=False)))


def test_a_node_is_accepted_exactly_when_its_path_is_the_output():
    tree = DraftTree((7, 1, 2, 3, 9), (None, 0, 1, 0, 2), (Source.ROOT,) + (PLD,) * 4, (1.0,) * 5, (1.0,) * 5)
    assert matched(tree, (1, 2, 5)) == 2  # 1 -> 2, then 9 is not 5
    assert matched(tree, (1, 2, 9)) == 3
    assert matched(tree, (3,)) == 1 and matched(tree, (4,)) == 0
    assert matched(tree, (1, 2, 9), keep=(0, 1)) == 1  # the kept top alone
    assert matched(tree, (1,)) == 1  # an output cut short judges no deeper node


@pytest.mark.parametrize("curve", [FLAT, STEEP], ids=["flat", "steep"])
@pytest.mark.parametrize("calibrate", [False, True], ids=["raw", "calibrated"])
def test_on_the_curve_the_run_read_the_pricing_is_the_run(demo_lm, curve, calibrate):
    """GT's choice redone on the run's own curve gives the run's own trees, τ and speedup: the candidates carry the
    estimates GT read (calibrated by the session's outcomes and trust where path calibration is on), so the page's
    "this device" row is the run it drew."""
    traces = _run(demo_lm, curve, path_calibration=calibrate)
    decode = traces[1:]
    tokens = sum(len(t.new_tokens) for t in decode)
    ms = sum(curve.latency(len(t.tree) + t.ptd_rows) for t in decode)
    priced = price_on(traces, curve)
    assert priced.rows == pytest.approx(sum(len(t.tree) for t in decode) / len(decode), rel=1e-12)
    assert priced.tau == pytest.approx(tokens / len(decode), rel=1e-12)
    assert priced.speedup == pytest.approx(tokens / ms * curve.latency(1), rel=1e-12)
    assert any(len(t.accepted) for t in decode), "inconclusive: no draft accepted"


def test_every_cycle_has_a_ledger_and_a_steep_curve_says_why_it_is_an_ar_step(demo_lm):
    traces = _run(demo_lm, STEEP)
    afters = outputs_after(traces)
    books = [cycle_ledger(t, STEEP, a) for t, a in zip(traces, afters)]
    assert books[0] is None  # the prefill
    ar = [(t, b) for t, b in zip(traces[1:], books[1:]) if t.mode == "ar" and b.drafts]
    assert ar, "inconclusive: GT kept a tree in every cycle on the steep curve"
    trace, book = ar[0]
    words = book.sentence()
    assert f"{book.drafts} draft" in words and "AR steps here" in words and "GT kept the anchor alone" in words
    assert book.kept == 0 and book.would_accept is not None and book.pruned_won == book.would_accept
    for t, b in zip(traces[1:-1], books[1:-1]):  # the verdict agrees with the cycle's own (the last: cut short)
        assert matched(t.tree, afters[t.index]) == len(t.accepted)
        assert b.would_accept >= len(t.accepted)
    hits = [t for t in traces if t.ghost_hits]
    for t in hits:  # a ringed ghost carries the token the model wrote next
        for k in t.ghost_hits:
            ghost = t.ghosts[k]
            assert ghost.parent in (0, *t.accepted) and ghost.token == t.greedy[ghost.parent]


def test_sampled_runs_mark_no_ghost_and_judge_nothing(demo_lm):
    traces = _run(demo_lm, STEEP, temperature=0.8, seed=1)
    assert not any(t.ghost_hits for t in traces)
    assert "unknown" in ledger_panel(traces, STEEP, sampling=True)


def test_the_panel_prices_the_drafts_as_predicted_speed_does_on_a_recorded_run(demo_lm, tmp_path, capsys):
    import predicted_speed

    traces = _run(demo_lm, STEEP)
    path = tmp_path / "run.json"
    path.write_text(export_run(header=RunHeader(model="demo", prompt=PROMPT, config={}), traces=traces,
                               token_text=lambda i: demo_lm.tokenizer.decode([i])), encoding="utf-8")
    panel = ledger_panel(traces, STEEP, sampling=False)
    for name, (spec, _) in DEVICE_CURVES.items():
        assert predicted_speed.main(["--trace", str(path), "--truth", spec]) == 0
        said = capsys.readouterr().out
        priced = price_on(traces, device_curve(name))
        assert f"predicted tau {priced.tau:.2f}" in said and f"predicted speedup {priced.speedup:.2f}x" in said
        assert f"| {name} | {priced.tau:.2f} | {priced.rows:.1f} | {priced.speedup:.2f}× |" in panel
    flat = price_on(traces, device_curve("an H200 (CUDA graphs, bf16)"))
    steep = price_on(traces, STEEP)
    assert flat.rows > steep.rows  # the same drafts: a flat curve keeps wider trees


def test_a_visitors_own_curve_prices_the_drafts_too(demo_lm):
    """The Theory panel prices the run's drafts on a curve the visitor pasted (a spec) as on the shipped ones; a spec
    that does not parse is one sentence, never a traceback."""
    traces = _run(demo_lm, STEEP)
    priced = price_on(traces, FLAT)
    panel = ledger_panel(traces, STEEP, sampling=False, own=FLAT.spec())
    assert f"| your curve | {priced.tau:.2f} | {priced.rows:.1f} | {priced.speedup:.2f}× |" in panel
    bad = ledger_panel(traces, STEEP, sampling=False, own="my gpu is fast")
    assert "Your curve was not read: not a cost-curve spec" in bad and "| your curve |" not in bad
    assert "| an H200 (CUDA graphs, bf16) |" in bad


def test_the_ledger_sentence_reads_as_plain_words():
    book = CycleLedger(drafts=11, kept=0, expected=0.9, cost_steps=4.2, accepted=0, would_accept=2)
    assert book.sentence() == ("11 drafts, 0.9 tokens expected; verifying them costs 4.2 AR steps here, more than they "
                               "promise, so GT kept the anchor alone; the output: the pruned ones would have added 2 "
                               "tokens")
    assert CycleLedger(0, 0, 0.0, None, 0).sentence() == "no draft source had a candidate for this place"
