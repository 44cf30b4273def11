"""Issue 73 in a real browser: after a run at every default, the sentence under an AR step states GT's decision in
plain words, the Theory panel gives the finished run's ledger (the sources' drafts in nearly every cycle, the
output's verdict on the pruned ones) and the same drafts priced on other devices; the copied command names the
precision and forward path that ran.  The harness is ``test_browser``'s (Playwright driving Debian's headless
Chromium), on the demo model served with a steep cost curve (a second row costs 0.8 of a first, as llama.cpp's on a
2-core CPU), where GT keeps few trees: the case the page used to show nothing of.
"""
from __future__ import annotations

import re
from dataclasses import replace

import pytest
from test_browser import (  # noqa: F401 - browser: the module's fixture, shared
    browser,
    expect,
    generate_tokens,
    open_accordion,
    open_page,
    serve,
)

from engine.decoding.cost import CostCurve
from engine.product.models.cost_cache import curve_key

pytestmark = pytest.mark.full

STEEP = "past=128;1:15,2:27,4:40,8:67,16:130,32:240,64:428,128:850"


@pytest.fixture(scope="module")
def steep_url(demo_lm, monkeypatch_module):
    """The page on the demo model whose shared cost curve is ``STEEP`` (GT reads it; nothing measured)."""
    from engine.product.models import cost_cache

    curve = CostCurve.from_spec(STEEP, key=curve_key(demo_lm.model, demo_lm.forward))
    monkeypatch_module.setattr(cost_cache.CurveOwner, "shared", lambda owner, say=None: curve)
    demo, url = serve(replace(demo_lm))
    yield url
    demo.close()


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def test_the_ledger_shows_every_cycles_drafts_and_their_worth_elsewhere(steep_url, browser):
    page = open_page(browser, steep_url)
    generate_tokens(page, 64)
    open_accordion(page, "Theory: Proposition 1's expected yield vs the measured τ")
    theory = page.locator("#theory")
    expect(theory).to_contain_text("GT's ledger", timeout=30_000)
    text = theory.inner_text()
    proposed, cycles = map(int, re.search(r"proposed drafts in (\d+) of (\d+) cycles", text).groups())
    # on the page sources never rest; the cycles without drafts are those where no source had one (a fresh anchor
    # token TR's table has no row for, no PLD match): 16 of 24 here, 75 of 104 on SmolLM2's GSM8K preset
    assert proposed >= 0.6 * cycles, text
    assert "The output's verdict" in text and "an H200 (CUDA graphs, bf16)" in text, text
    assert "No tree cycle yet" not in text
    # the visitor's own device: a curve pasted under the panel prices the same drafts (Enter)
    page.locator("#price-curve textarea, #price-curve input").first.fill("past=128;1:3,2:3.4,4:4,8:5,16:7,32:11")
    page.locator("#price-curve textarea, #price-curve input").first.press("Enter")
    expect(theory).to_contain_text("your curve", timeout=30_000)
    command = page.locator("#settings textarea").first.input_value()
    assert "--dtype fp32 --forward eager" in command and "--gt-rest-after 0" in command, command
