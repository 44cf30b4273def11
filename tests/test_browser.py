"""The page in a real browser: Playwright (Python) driving Debian's headless Chromium.

.ci/run installs both (apt ``chromium``, pip ``playwright``).  On a machine without them these tests
are skipped with the reason, except under CI (``CI`` set), where a missing browser is a failure.
Also writes docs/screenshot.png (the page after a run) when ``GOOSE_LENS_SCREENSHOT=1``.
"""
from __future__ import annotations

import os
import shutil
import socket
import time
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("GOOSE_LENS_CHROMIUM", "/usr/bin/chromium")
ROOT = Path(__file__).resolve().parents[1]

try:
    from playwright.sync_api import expect, sync_playwright
except ImportError:  # pragma: no cover - depends on the machine
    sync_playwright = None

if sync_playwright is None or not shutil.which(CHROMIUM):
    if os.environ.get("CI"):
        raise RuntimeError("browser tests need Debian's chromium and the playwright package (.ci/run installs them)")
    pytest.skip("no playwright / chromium on this machine (apt install chromium; pip install playwright)",
                allow_module_level=True)

#: JS: the source names of the tree figure's node traces that have points, and whether an accepted path is drawn.
TREE_STATE = """() => {
  const plot = document.querySelector('#draft-tree .js-plotly-plot');
  if (!plot || !plot.data) return null;
  const named = plot.data.filter(t => (t.x || []).some(v => v !== null));
  return {names: named.map(t => t.name), title: (plot.layout.title || {}).text || ''};
}"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def page_url(demo_lm):
    import app

    demo_lm.warm_up()
    demo = app.build_demo(demo_lm)
    port = free_port()
    demo.queue(default_concurrency_limit=1).launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True,
                                                   css=app.CSS)
    yield f"http://127.0.0.1:{port}/"
    demo.close()


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                              args=["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                                    "--disable-component-update", "--disable-sync", "--no-first-run"])
        yield b
        b.close()


def tree_state(page):
    return page.evaluate(TREE_STATE)


def pick_preset(page, label: str) -> None:
    """Choose the preset whose label starts with ``label`` (the page under test runs the demo model, a code model)."""
    page.get_by_role("button", name="Generate", exact=True).wait_for(timeout=30_000)
    dropdown = page.get_by_label("Preset prompt")
    dropdown.click()
    page.get_by_role("option", name=label).first.click()
    expect(page.get_by_label("Prompt", exact=True)).not_to_have_value("", timeout=10_000)


def upload(page, path: Path) -> None:
    """Choose ``path`` in the import box's file chooser, as a user would."""
    page.locator("#import-trace input[data-testid=file-upload]").set_input_files(str(path), timeout=10_000)


def test_generate_scrub_and_replay_in_a_browser(page_url, browser, tmp_path):
    page = browser.new_page(viewport={"width": 1500, "height": 1300})
    page.goto(page_url)
    pick_preset(page, "HumanEval/0")
    page.get_by_label("Bypass: verify confident PLD matches as a chain").uncheck()  # every cycle a full tree
    t0 = time.perf_counter()
    page.get_by_role("button", name="Generate", exact=True).click()
    page.wait_for_function(f"({TREE_STATE})() !== null", timeout=60_000)
    first_tree_s = time.perf_counter() - t0
    # a tree with nodes of at least two sources and an accepted path
    page.wait_for_function(f"""() => {{ const s = ({TREE_STATE})(); if (!s) return false;
        const src = s.names.filter(n => ['PLD spine', 'TR branch', 'PTD perturbation'].includes(n));
        return src.length >= 2 && s.names.includes('accepted path'); }}""", timeout=120_000)
    page.wait_for_function("() => (document.querySelector('#stats')?.innerText || '').includes('128 tokens')",
                           timeout=120_000)
    if os.environ.get("GOOSE_LENS_SCREENSHOT"):
        page.evaluate("window.scrollTo(0, 0)")
        page.screenshot(path=str(ROOT / "docs" / "screenshot.png"), full_page=False)
    before = tree_state(page)["title"]
    page.locator("#cycle-back").click()  # scrub back one cycle: the tree changes
    page.wait_for_function(f"(before) => ({TREE_STATE})().title !== before", arg=before, timeout=20_000)
    assert tree_state(page)["title"] != before
    print(f"time from clicking Generate to the first tree: {first_tree_s:.2f} s")

    # export the run, then import it back: its first tree is shown with no model run
    page.get_by_text("Trace file: export the last run, or replay one").click()
    page.get_by_role("button", name="Export trace (JSON)").click()
    link = page.locator("#export-trace a[download]").first
    link.wait_for(timeout=30_000)
    with page.expect_download() as dl:
        link.click()
    saved = tmp_path / "trace.json"
    dl.value.save_as(saved)
    page.get_by_role("button", name="Generate", exact=True).wait_for()
    upload(page, saved)  # replaces the run in this page's state by the imported one
    page.wait_for_function("() => (document.querySelector('#stats')?.innerText || '').includes('Imported trace')",
                           timeout=30_000)
    page.wait_for_function(f"() => (({TREE_STATE})()?.title || '').startsWith('cycle 1')", timeout=20_000)
    # a bad file gets a message and the page keeps the replayed run
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "goose-lens-trace", "version": 99}')
    upload(page, bad)
    page.wait_for_function("() => (document.querySelector('#stats')?.innerText || '').includes('version 99')",
                           timeout=30_000)
    assert tree_state(page)["title"].startswith("cycle 1")
    page.close()


def test_stop_halts_a_long_run_within_a_cycle(page_url, browser):
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    page.goto(page_url)
    pick_preset(page, "HumanEval/7")
    pace = page.get_by_role("spinbutton", name="Slow motion (s pause per cycle)")
    pace.fill("0.5")
    pace.press("Enter")
    page.get_by_role("button", name="Generate", exact=True).click()
    page.wait_for_function("() => (document.querySelector('#stats')?.innerText || '').includes('cycles')",
                           timeout=60_000)
    page.get_by_role("button", name="Stop", exact=True).click()
    time.sleep(0.8)
    stopped_at = page.locator("#stats").inner_text()
    time.sleep(1.5)  # three more cycles' worth of slow motion: nothing may change
    assert page.locator("#stats").inner_text() == stopped_at
    assert "128 tokens" not in stopped_at
    page.close()
