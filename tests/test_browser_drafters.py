"""Issue 35 in a real browser: each engine's drafter picked from the method menu draws its trees (legend and hover
name it), its drafter settings take the engine's own names and the serve box gives the engine's command; a
deployment's figures, imported, show per-position acceptance beside a run here, and a file of another kind gets one
sentence while the figures on screen stay.  The harness is ``test_browser``'s."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_browser import (  # noqa: F401 - browser: the module's fixture, shared
    browser,
    expect,
    open_accordion,
    open_page,
    serve,
    set_number,
)
from test_browser_truth import run_to_end

from engine.sources import info

pytestmark = pytest.mark.full

SAMPLES = Path(__file__).parent / "data" / "production"
#: JS: the names of the tree figure's traces, and its hover texts
TREE_NAMES = """() => { const p = document.querySelector('#draft-tree .js-plotly-plot');
  return p && p.data ? p.data.map(t => t.name) : []; }"""
TREE_HOVERS = """() => { const p = document.querySelector('#draft-tree .js-plotly-plot');
  return p && p.data ? p.data.flatMap(t => t.hovertext || []) : []; }"""
CHART_BARS = """() => { const p = document.querySelector('#production-chart .js-plotly-plot');
  return p && p.data ? p.data.filter(t => t.type === 'bar').map(t => t.y.length) : []; }"""


@pytest.fixture(scope="module")
def drafter_page(demo_lm):
    demo_lm.warm_up()
    demo, url = serve(demo_lm)
    yield url
    demo.close()


def pick_method(page, name: str) -> None:
    page.get_by_label("Method", exact=True).click()
    page.get_by_role("option", name=info(name).method_label).click()


def shown_cycle_with(page, label: str) -> bool:
    """Step back through the cycles until the tree on screen has a node of ``label`` (at most 40 cycles)."""
    for _ in range(40):
        if label in page.evaluate(TREE_NAMES):
            return True
        page.locator("#cycle-back").click()
        page.wait_for_timeout(250)
    return False


@pytest.mark.parametrize("method, settings, flag", [
    ("vllm-ngram", "prompt_lookup_min=2, prompt_lookup_max=4, num_speculative_tokens=6",
     '"prompt_lookup_min": 2'),
    ("vllm-suffix", "", '"method": "suffix"'),
    ("sglang-ngram", "speculative_ngram_match_type=PROB", "--speculative-ngram-match-type PROB"),
    ("llamacpp-ngram", "spec_ngram_simple_size_n=3, spec_ngram_simple_size_m=16", "--spec-ngram-simple-size-n 3"),
])
def test_each_engine_drafter_draws_its_trees_and_says_its_flags(drafter_page, browser, method, settings, flag):
    page = open_page(browser, drafter_page)
    open_accordion(page, "Method and tree shape")
    pick_method(page, method)
    drafter = page.locator("#drafter textarea, #drafter input").first
    expect(drafter).not_to_have_value("", timeout=10_000)
    drafter_default = drafter.input_value()
    first_name = drafter_default.split("=")[0]
    assert first_name in {"prompt_lookup_min", "num_speculative_tokens", "speculative_num_draft_tokens",
                          "spec_ngram_simple_size_n"}, drafter_default  # the engine's own names
    if settings:
        drafter.fill(settings)
    serve_box = page.locator("#serve textarea")
    expect(serve_box).to_have_value(re.compile(re.escape(flag)), timeout=10_000)
    assert "MODEL" in serve_box.input_value() and "/" not in serve_box.input_value().split("MODEL")[0][-2:]
    open_accordion(page, "Run and display")
    set_number(page, "Max new tokens", 96)
    run_to_end(page)
    label = info(method).label
    assert shown_cycle_with(page, label), f"no cycle of {method} drew a {label} node"
    legend = page.evaluate("() => [...document.querySelectorAll('#draft-tree .legendtext')].map(t => t.textContent)")
    assert label in legend
    assert any(f"source: {label}" in h or label in h for h in page.evaluate(TREE_HOVERS))
    page.close()


def test_production_figures_beside_a_run_and_a_wrong_file_refused(drafter_page, browser, tmp_path):
    page = open_page(browser, drafter_page)
    open_accordion(page, "Production numbers: your deployment's acceptance beside this drafter here")
    chooser = page.locator("#import-production").locator("xpath=preceding-sibling::input[@type='file']")
    chooser.set_input_files(str(SAMPLES / "vllm_metrics.txt"), timeout=10_000)
    summary = page.locator("#production-summary")
    expect(summary).to_contain_text("vLLM /metrics", timeout=20_000)
    expect(summary).to_contain_text("2.90")  # 1 + 2280 / 1200, as vLLM's log line says
    expect(summary).to_contain_text("42.2%")  # 2280 / 5400
    page.wait_for_function(f"() => JSON.stringify(({CHART_BARS})()) === '[5]'", timeout=20_000)  # the
    # deployment's five positions, once plotly has drawn them (the summary comes first)
    open_accordion(page, "Method and tree shape")
    pick_method(page, "vllm-ngram")
    page.locator("#drafter textarea, #drafter input").first.fill("prompt_lookup_min=2, prompt_lookup_max=5, "
                                                                   "num_speculative_tokens=5")
    run_to_end(page)
    page.get_by_role("button", name="Compare with the last run").click()
    expect(summary).to_contain_text("here: the last run, vLLM ngram", timeout=20_000)
    page.wait_for_function(f"() => ({CHART_BARS})().length === 2", timeout=20_000)
    junk = tmp_path / "notes.txt"
    junk.write_text("tokens per second went up", encoding="utf-8")
    chooser.set_input_files(str(junk), timeout=10_000)
    notice = page.locator("#production-notice")
    expect(notice).to_contain_text("Could not import notes.txt", timeout=20_000)
    expect(notice).to_contain_text("expected a vLLM /metrics text")
    assert str(tmp_path) not in notice.inner_text()
    expect(summary).to_contain_text("vLLM /metrics")  # the figures on screen stay
    assert len(page.evaluate(CHART_BARS)) == 2
    page.close()
