"""Parameter sweep (cli/sweep.py, engine/product/runs/sweep/, sweep_figure.py): parsing, a budget sweep on the demo
model, stop, the figure, the sentence and the CLI."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
from conftest import DATA, ROOT, read_jsonl

from cli import sweep as sw
from engine.decoding.config import ConfigError, DecodeConfig
from engine.decoding.cost import CostCurve
from engine.product.models.cost_cache import curve_key
from engine.product.runs.run import ArTiming
from engine.product.runs.sweep import attribution as sweep_attribution
from engine.product.runs.sweep import report as sweep_report
from engine.product.runs.sweep import runner as sweep_runner
from engine.product.runs.sweep.records import Sweep, SweepRun
from engine.product.runs.sweep.report import summary
from engine.product.runs.sweep.runner import run_sweep
from engine.product.runs.sweep.spec import SweepSpec
from viz.sweep_figure import sweep_figure

BUDGETS = "4,8,16,32,64,128"
CURVE = CostCurve((1, 8, 64), (5.0, 9.0, 40.0))  # by hand: the same trees on any machine


@pytest.fixture(scope="module")
def prompt_ids(demo_lm) -> list[int]:
    return demo_lm.encode_prompt(read_jsonl(DATA / "humaneval" / "HumanEval.jsonl")[0]["prompt"], chat=False)


@pytest.fixture(scope="module")
def budget_sweep(demo_lm, prompt_ids) -> list[Sweep]:
    """Every snapshot of a 6-value budget sweep, 128 tokens, on the demo model."""
    spec = SweepSpec.parse("budget", BUDGETS)
    curve = CostCurve(CURVE.nodes, CURVE.ms, key=curve_key(demo_lm.model))
    return list(run_sweep(demo_lm, prompt_ids, DecodeConfig.of(max_new_tokens=128), spec, curve))


@pytest.mark.parametrize("param, text, parameter, values, label", [
    ("budget", "4, 8,16", "budget", (4, 8, 16), "B = 4"),
    ("Spine-Ratio", "0.3,auto", "spine_ratio", (0.3, None), "r = 0.3"),
    ("depth", "2,4", "max_depth", (2, 4), "D = 2"),
    ("gt_threshold", "0,0.1,AUTO,chord", "gt_threshold", (0.0, 0.1, "auto", "chord"), "c = 0"),
    ("method", "goose,PLD,tr", "method", ("goose", "pld", "tr"), "goose"),
    ("sources", "tr+pld,pld+tr+ptd", "sources", (("pld", "tr"), ("pld", "tr", "ptd")), "pld+tr"),
])
def test_parse_reads_each_kind_of_value(param, text, parameter, values, label):
    spec = SweepSpec.parse(param, text)
    assert spec.parameter == parameter and spec.values == values
    assert spec.label(values[0]) == label
    assert [c.get(parameter) for c in spec.configs(DecodeConfig())] == list(values)


def test_parse_writes_values_back_for_people():
    assert SweepSpec.parse("spine_ratio", "auto,0.5").label(None) == "r = auto"
    assert SweepSpec.parse("gt_threshold", "chord").label("chord") == "c = chord"
    assert SweepSpec.parse("sources", "pld+tr+ptd").text(("pld", "tr", "ptd")) == "pld+tr+ptd"
    spec = SweepSpec.parse("gt_threshold", "0,0.1,0.1234567,0.1234568")  # short where exact, else whole
    assert [spec.text(v) for v in spec.values] == ["0", "0.1", "0.1234567", "0.1234568"]


@pytest.mark.parametrize("param, text, message", [
    ("budgte", "4", "cannot sweep 'budgte': choose one of budget, spine_ratio, max_depth"),
    ("budget", " , ,", "no values to sweep budget over: give a comma-separated list, e.g. 4,8,16,32"),
    ("budget", "4,x", "budget values must be whole numbers (got 'x')"),
    ("budget", "4.5", "budget values must be whole numbers (got '4.5')"),
    ("spine_ratio", "0.5,half", "spine_ratio values must be numbers or auto (got 'half')"),
    ("gt_threshold", "high", "gt_threshold values must be numbers, auto or chord (got 'high')"),
    ("budget", "4,8,4", "budget lists 4 twice: give each value once"),
    ("spine_ratio", "0.5,0.50", "spine_ratio lists 0.5 twice ('0.5' and '0.50' are the same value)"),
    ("sources", "pld+tr,tr+pld", "sources lists pld+tr twice"),
    ("budget", ",".join(str(b) for b in range(1, 14)), "13 values are more than a sweep runs (12)"),
    ("budget", "8,0", "node budget B must be in 1..1024 (got 0)"),
    ("spine_ratio", "1.5", "spine ratio r must be in (0, 1) or auto (got 1.5)"),
    ("max_depth", "0", "max depth D must be at least 1 (got 0)"),
    ("gt_threshold", "1.5", "GT threshold c must be 'auto', 'chord' or in [0, 1) (got 1.5)"),
    ("method", "goose,eagle", "method must be one of goose, pld"),
    ("sources", "pld+eagle", "'pld+eagle' is not a set of draft sources: join names among pld, tr, ptd, suffix"),
])
def test_parse_refuses_in_one_sentence(param, text, message):
    with pytest.raises(ConfigError) as err:
        SweepSpec.parse(param, text)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_source_sweep_needs_a_method_that_mixes_sources():
    spec = SweepSpec.parse("sources", "pld,pld+tr")
    with pytest.raises(ConfigError, match="method pld drafts with its own source only"):
        spec.configs(DecodeConfig.of(method="pld"))
    assert len(spec.configs(DecodeConfig.of(method="iso3"))) == 2


def test_budget_sweep_matches_ar_token_for_token(budget_sweep, demo_lm, prompt_ids):
    from conftest import greedy_reference  # computed once per prompt in a session (tests/test_lossless.py shares it)

    first, last = budget_sweep[0], budget_sweep[-1]
    assert len(budget_sweep) == 7 and first.ar is not None and not first.runs  # AR first, then one per value
    assert [s.fraction for s in budget_sweep] == sorted(s.fraction for s in budget_sweep) and last.fraction == 1.0
    assert last.complete and not last.stopped and last.seconds > 0
    assert list(last.ar_tokens) == greedy_reference(demo_lm.model, prompt_ids, 128, demo_lm.eos_token_ids)
    assert [r.value for r in last.runs] == [4, 8, 16, 32, 64, 128] and [r.index for r in last.runs] == list(range(6))
    for r in last.runs:
        assert r.config.tree.budget == r.value and r.label == f"B = {r.value}"
        assert r.tokens == last.ar_tokens and r.first_difference is None, r.label
        assert r.tau >= 1.0 and r.tok_per_s > 0 and r.speedup is not None and r.mean_nodes >= 1.0
        assert r.tau == pytest.approx(len(r.tokens) / len(r.traces))
    assert any(r.accepted_drafts > 0 for r in last.runs), "no run accepted a draft token: the sweep proves nothing"
    assert summary(last) == "All 6 runs produced AR's text token for token."
    table = sweep_report.markdown_table(last)
    assert "| B = 16 |" in table and "| AR (reference) | 1.00 |" in table
    assert sweep_attribution.diagnose(demo_lm.model, prompt_ids, last) == {}


def test_every_run_reads_one_curve_and_a_fresh_memory(demo_lm, prompt_ids, monkeypatch):
    seen = []

    real = sweep_runner.make_decoder

    def recording(model, config, eos_token_ids=(), cost_curve=None, memory=None, **kw):
        seen.append((config.method, config.tree.budget, cost_curve, memory))
        return real(model, config, eos_token_ids, cost_curve=cost_curve, memory=memory, **kw)

    monkeypatch.setattr(sweep_runner, "make_decoder", recording)
    curve = CostCurve(CURVE.nodes, CURVE.ms, key=curve_key(demo_lm.model))
    spec = SweepSpec.parse("budget", "4,16")
    last = list(run_sweep(demo_lm, prompt_ids, DecodeConfig.of(max_new_tokens=16), spec, curve))[-1]
    assert [(m, b) for m, b, _, _ in seen] == [("ar", 60), ("goose", 4), ("goose", 16)]
    assert all(c is curve and memory is None for _, _, c, memory in seen) and last.cost_curve is curve


def test_ar_is_timed_again_after_the_runs_and_the_faster_timing_is_the_reference(demo_lm, prompt_ids, monkeypatch):
    """Issue 73: the Sweep's AR reference read 51.6 tok/s beside AR-step runs at 67.7-70.9: its one timing was the
    sweep's first decode.  AR is timed again after the runs; the faster timing is the reference, every speedup
    over it."""
    timings = iter([ArTiming(tokens=10, seconds=1.0, source="ar"), ArTiming(tokens=10, seconds=0.5, source="ar")])
    monkeypatch.setattr(sweep_runner.ArTiming, "of", classmethod(lambda cls, traces, source: next(timings)))
    spec = SweepSpec.parse("budget", "4,16")
    snapshots = list(run_sweep(demo_lm, prompt_ids, DecodeConfig.of(max_new_tokens=16), spec, CURVE))
    first, last = snapshots[0], snapshots[-1]
    assert first.ar.seconds == 1.0 and last.ar.seconds == 0.5 and last.complete and len(snapshots) == 3
    for run in last.runs:
        assert run.speedup == pytest.approx(sweep_runner.Speedup.of(list(run.traces), last.ar).value)


def test_stop_ends_the_sweep_between_and_within_runs(demo_lm, prompt_ids):
    spec = SweepSpec.parse("budget", BUDGETS)
    control = {"stop": False}
    snapshots = []
    base = DecodeConfig.of(max_new_tokens=64)
    for snapshot in run_sweep(demo_lm, prompt_ids, base, spec, CURVE, should_stop=lambda: control["stop"]):
        snapshots.append(snapshot)
        control["stop"] = len(snapshot.runs) == 1  # after the first run: the second stops after its prefill
    last = snapshots[-1]
    assert len(snapshots) == 3 and last.stopped and not last.complete
    assert [r.finished for r in last.runs] == [True, False] and last.done == 1
    partial = last.runs[1]
    assert partial.tokens == last.ar_tokens[:1] and partial.first_difference is None and partial.speedup is None
    assert summary(last) == ("Stopped during run 2 of 6 (B = 8): the 2 runs so far produced AR's text token for "
                             "token.")
    assert "yes (stopped)" in sweep_report.markdown_table(last)
    only = list(run_sweep(demo_lm, prompt_ids, DecodeConfig.of(max_new_tokens=64), spec, CURVE,
                          should_stop=lambda: True))
    assert len(only) == 1 and only[0].ar is None and only[0].stopped and not only[0].runs
    assert summary(only[0]) == "Stopped while AR was timed: no run to compare."


def _hand_sweep(parted: dict[int, int], temperature: float = 0.0, param: str = "budget") -> Sweep:
    spec = SweepSpec.parse(param, BUDGETS)
    runs = tuple(SweepRun(i, v, spec.label(v), spec.text(v), tau=2.0, tok_per_s=100.0, speedup=1.5,
                          first_difference=parted.get(i)) for i, v in enumerate(spec.values))
    return Sweep(spec, DecodeConfig.of(temperature=temperature), ArTiming(10, 0.1), tuple(range(128)), runs)


def test_sentence_says_which_run_parted_from_ar_and_where():
    assert summary(_hand_sweep({})) == "All 6 runs produced AR's text token for token."
    assert summary(_hand_sweep({5: 37})) == "B = 128 parted from AR at token 37."
    assert summary(_hand_sweep({4: 12, 5: 37})) == "B = 64 parted from AR at token 12 and B = 128 at token 37."
    assert summary(_hand_sweep({0: 3, 4: 12, 5: 37})) == ("B = 4 parted from AR at token 3, B = 64 at token 12 and "
                                                         "B = 128 at token 37.")
    assert summary(_hand_sweep({}, temperature=0.7)) == ("Sampling (temperature 0.7): each run draws its own text by "
                                                         "design, so no text is compared with AR's.")
    table = sweep_report.markdown_table(_hand_sweep({5: 37}))
    assert "| B = 128 | 2.00 | 100.0 | 1.50× | 1.0 | no: token 37 |" in table
    assert "not compared (sampling)" in sweep_report.markdown_table(_hand_sweep({}, temperature=0.7))


def test_figure_has_three_panels_in_value_order_with_run_indices(budget_sweep):
    last = budget_sweep[-1]
    fig = sweep_figure(last)
    assert len(fig.data) == 3
    for trace in fig.data:
        assert list(trace.x) == ["4", "8", "16", "32", "64", "128"] and list(trace.customdata) == list(range(6))
    assert [list(t.y) for t in fig.data] == [[r.tau for r in last.runs], [r.tok_per_s for r in last.runs],
                                             [r.speedup for r in last.runs]]
    assert fig.layout.xaxis.type == "category" and list(fig.layout.xaxis.categoryarray) == list(fig.data[0].x)
    dashed = [s for s in fig.layout.shapes if s.line.dash == "dash"]
    assert len(dashed) == 1 and dashed[0].y0 == dashed[0].y1 == 1.0  # speedup 1.0
    title = fig.layout.title.text
    assert title == "Sweep of node budget B: 6 values, 1 prompt"  # model-free: no model, device or path
    assert "demo" not in fig.to_json() and str(ROOT) not in fig.to_json()


def test_figure_marks_a_run_that_parted_from_ar():
    fig = sweep_figure(_hand_sweep({5: 37}))
    assert list(fig.data[0].marker.symbol) == ["circle"] * 5 + ["x"]
    assert "parted" not in fig.data[0].hovertext[0] and "no: token 37" in fig.data[0].hovertext[5]


def test_cli_writes_table_json_and_figure(tmp_path, capsys):
    out = tmp_path / "sweep"
    rc = sw.main(["--model", "demo", "--param", "budget", "--values", "4,16", "--dataset", "humaneval", "--index", "0",
                  "--max-new-tokens", "32", "--cost-curve", CURVE.spec(), "--out", str(out)])
    printed = capsys.readouterr().out
    assert rc == 0
    assert ("| node budget B | τ | tok/s (decode phase) | speedup over AR (decode phase) | mean nodes | "
            "same text as AR |") in printed
    assert "All 2 runs produced AR's text token for token." in printed and "sweep: AR and 2 runs in " in printed
    result = json.loads((out / "sweep.json").read_text())
    assert result["parameter"] == "budget" and result["values"] == ["4", "16"]
    assert [r["same_as_ar"] for r in result["runs"]] == [True, True] and result["ar"]["tokens"] == 32
    assert result["meta"]["prompt"] == "humaneval #0" and result["cost_curve"]["ms"] == list(CURVE.ms)
    md, page = (out / "sweep.md").read_text(), (out / "sweep.html").read_text()
    assert "| B = 16 |" in md and "plotly" in page and "Sweep of node budget B" in page
    for text in (md, page, json.dumps(result)):
        assert str(tmp_path) not in text and str(ROOT) not in text  # no machine path


@pytest.mark.parametrize("args, message", [
    (["--param", "budget", "--values", "4,x"], "error: budget values must be whole numbers (got 'x')"),
    (["--param", "width", "--values", "4"], "error: cannot sweep 'width'"),
    (["--param", "sources", "--values", "pld,pld+tr", "--method", "tr"], "error: method tr drafts with its own"),
    (["--param", "budget", "--values", "4", "--dataset", "humaneval", "--index", "100000"],
     "error: humaneval has 164 prompts: --index 100000 is past its end"),
    (["--param", "budget", "--values", "4", "--model", "EMPTY"],
     "error: could not load model 'empty-folder': the folder is not a model"),
])
def test_cli_bad_input_exits_2_with_one_line(tmp_path, capsys, args, message):
    (tmp_path / "empty-folder").mkdir()
    args = [a.replace("EMPTY", str(tmp_path / "empty-folder")) for a in args]
    if "--dataset" not in args:
        args += ["--prompt", "def f(x):"]
    assert sw.main([*args, "--model", "demo", "--out", str(tmp_path)] if "--model" not in args
                   else [*args, "--out", str(tmp_path)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith(message), err
    assert [p.name for p in tmp_path.iterdir()] == ["empty-folder"]  # nothing written


def test_a_run_that_parted_is_attributed_where_it_is_shown(monkeypatch):
    """Issue 47, finding 5: every Sweep point on the default model was a red ✖ ("B = 4 parted from AR at token 75")
    with no word on tie or bug.  Now each parted run is attributed as it arrives (AR's logits replayed once), and
    the sentence, the table, the hover and the marker say which, as the Race does."""
    from engine.product.runs.lossless import Divergence
    from page.sweep import sweep_board

    replays, kinds = [], {3: "precision tie", 37: "bug"}
    monkeypatch.setattr(sweep_attribution, "engine_ar_logits",
                        lambda model, ids, tokens, path: replays.append(1) or (None, "L"))
    monkeypatch.setattr(sweep_attribution, "attribute", lambda model, ids, want, got, logits, path: Divergence(
        position=got[0], kind=kinds[got[0]], ar_token=1, run_token=2, ar_logit=1.0, run_logit=1.0, gap_ulps=0.0,
        dtype="bfloat16"))
    hand = _hand_sweep({0: 3, 5: 37})
    hand = replace(hand, runs=tuple(replace(r, tokens=(r.first_difference,)) if r.first_difference is not None
                                    else r for r in hand.runs))
    attributions = sweep_attribution.Attributions(model=None, prompt_ids=[1, 2])
    found = attributions.of(hand)
    assert attributions.of(hand) == found and len(replays) == 1  # AR replayed once, each run attributed once
    board = sweep_board(hand, 6, found)
    assert "B = 4 parted from AR at token 3 (a precision tie) and B = 128 at token 37 (NOT a tie: a bug)." in board
    assert "| no: token 3 (a precision tie) |" in board and "| no: token 37 (NOT a tie: a bug) |" in board
    fig = sweep_figure(hand, found)
    assert list(fig.data[0].marker.symbol) == ["diamond"] + ["circle"] * 4 + ["x"]
    assert "(a precision tie)" in fig.data[0].hovertext[0]


def test_each_parameter_suggests_values_inside_the_pages_range():
    """A browser walk-through: B's "4,8,16,32,64,128" stayed in the values box when max depth D was picked, whose page
    range ends at 16, so the first Sweep was refused.  Picking a parameter now sets values that sweep there."""
    from engine.product.runs.sweep.spec import PARAMETERS, SweepSpec
    from page.settings import RANGES
    from page.sweep import SWEEP_VALUES, sweep_values_for

    assert set(SWEEP_VALUES) == set(PARAMETERS)
    for name, text in SWEEP_VALUES.items():
        spec = SweepSpec.parse(name, text)
        assert len(spec.values) >= 3, name
        low, high, _ = RANGES.get(name, (float("-inf"), float("inf"), ""))
        assert all(low <= v <= high for v in spec.values if isinstance(v, (int, float))), (name, spec.values)
        assert sweep_values_for(name) == {"sweep_values": text}
    assert sweep_values_for("nothing") == {}
