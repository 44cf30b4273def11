"""The page in a real browser: Playwright (Python) driving Debian's headless Chromium, at 1280×800.

.ci/run installs both (apt ``chromium``, pip ``playwright``).  On a machine without them these tests
are skipped with the reason, except under CI (``CI`` set), where a missing browser is a failure.
Also writes docs/screenshot.png (the first screen at 1280×800 after a run with no GT pruning, showing
cycle 3) when ``GOOSE_LENS_SCREENSHOT=1``.
"""
from __future__ import annotations

import os
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("GOOSE_LENS_CHROMIUM", "/usr/bin/chromium")
ROOT = Path(__file__).resolve().parents[1]
SCREEN = {"width": 1280, "height": 800}

try:
    from playwright.sync_api import expect, sync_playwright
except ImportError:  # pragma: no cover - depends on the machine
    sync_playwright = None

if sync_playwright is None or not shutil.which(CHROMIUM):
    if os.environ.get("CI"):
        raise RuntimeError("browser tests need Debian's chromium and the playwright package (.ci/run installs them)")
    pytest.skip("no playwright / chromium on this machine (apt install chromium; pip install playwright)",
                allow_module_level=True)

#: JS: the source names of the tree figure's node traces that have points, and the figure's title.
TREE_STATE = """() => {
  const plot = document.querySelector('#draft-tree .js-plotly-plot');
  if (!plot || !plot.data) return null;
  const named = plot.data.filter(t => (t.x || []).some(v => v !== null));
  return {names: named.map(t => t.name), title: (plot.layout.title || {}).text || ''};
}"""
#: JS: the title of the tree on screen ('' before the first cycle)
TITLE = f"(() => (({TREE_STATE})() || {{}}).title || '')()"
#: JS: the rendered boxes of every node label and marker of the tree, and the label font sizes (px)
RENDERED = """() => {
  const root = document.querySelector('#draft-tree .js-plotly-plot');
  const boxes = [], sizes = [];
  for (const t of root.querySelectorAll('.scatterlayer .textpoint text')) {
    if (!t.textContent) continue;
    const r = t.getBoundingClientRect(); boxes.push([r.left, r.top, r.right, r.bottom, t.textContent]);
    sizes.push(parseFloat(getComputedStyle(t).fontSize));
  }
  for (const p of root.querySelectorAll('.scatterlayer .point')) {
    const r = p.getBoundingClientRect(); boxes.push([r.left, r.top, r.right, r.bottom, 'marker']);
  }
  return {boxes, sizes};
}"""


#: page_url's model load runs until LOAD_RELEASE is set and sets LOAD_DONE as it ends: a test reads what happened
#: while a load was running from these events, not from the clock
LOAD_RELEASE, LOAD_DONE = threading.Event(), threading.Event()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(page_or_models, options=None):
    import app

    demo = app.build_demo(page_or_models, options or app.PageOptions())
    port = free_port()
    demo.queue(default_concurrency_limit=1).launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True,
                                                   css=app.CSS)
    return demo, f"http://127.0.0.1:{port}/"


@pytest.fixture(scope="module")
def page_url(demo_lm):
    """The page on the demo model, its model picker slow to fail, as a hub download can be: a load runs until the
    test lets it go (``LOAD_RELEASE``, at most 120 s), then fails."""
    from engine.product.models.loading import ModelLoadError
    from engine.product.models.registry import ModelRegistry

    class SlowRegistry(ModelRegistry):
        def load(self, name, **kwargs):
            LOAD_RELEASE.wait(timeout=120)
            LOAD_DONE.set()
            raise ModelLoadError(f"could not load {name!r}: no such model (test)")

    demo_lm.warm_up()
    demo, url = serve(SlowRegistry(demo_lm))
    yield url
    demo.close()


@pytest.fixture(scope="module")
def public_url(demo_lm):
    import app

    demo, url = serve(demo_lm, app.PageOptions(public=True, max_new_tokens=512))
    yield url
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


def open_page(browser, url, viewport=SCREEN):
    page = browser.new_page(viewport=viewport)
    page.goto(url)
    page.get_by_role("button", name="Generate", exact=True).wait_for(timeout=30_000)
    return page


def generate_tokens(page, tokens: int) -> None:
    """Set max new tokens to ``tokens``, press Generate and wait for the run's end."""
    open_accordion(page, "Run and display")
    set_number(page, "Max new tokens", tokens)
    page.get_by_role("button", name="Generate", exact=True).click()
    stats_has(page, f"{tokens} tokens")


def stats_has(page, text: str, timeout: float = 120_000) -> None:
    page.wait_for_function("(t) => (document.querySelector('#stats')?.innerText || '').includes(t)", arg=text,
                           timeout=timeout)


def pick_preset(page, label: str) -> None:
    """Choose the preset whose label starts with ``label`` (the page under test runs the demo model, a code model)."""
    dropdown = page.get_by_label("Preset prompt")
    dropdown.click()
    page.get_by_role("option", name=label).first.click()
    expect(page.get_by_label("Prompt", exact=True)).not_to_have_value("", timeout=10_000)


def open_accordion(page, title: str) -> None:
    page.get_by_text(title, exact=True).click()


def set_number(page, name: str, value) -> None:
    """Type ``value`` into a number box (a slider's too) as a user would, until the page holds it: a box in an
    accordion just opened can be re-mounted with its old value right after the first fill (seen under load)."""
    box, track = page.get_by_role("spinbutton", name=name), page.get_by_role("slider", name=name)
    for _ in range(5):
        box.fill(str(value))
        box.press("Enter")
        page.wait_for_timeout(300)
        held = [box.input_value()] + ([track.input_value()] if track.count() else [])
        if all(h and float(h) == float(value) for h in held):
            return
    raise AssertionError(f"the number box {name!r} did not take {value!r} (it holds {held})")


def upload(page, path: Path) -> None:
    """Choose ``path`` in the import box's file chooser, as a user would."""
    page.locator("#import-trace").locator("xpath=preceding-sibling::input[@type='file']").set_input_files(
        str(path), timeout=10_000)


def export_trace_file(page, path: Path) -> Path:
    """Export the page's last run as a user does (the accordion, the button, the download link) into ``path``."""
    open_accordion(page, "Trace file: export the last run, or replay one")
    page.get_by_role("button", name="Export trace (JSON)").click()
    link = page.locator("#export-trace a[download]").first
    link.wait_for(timeout=30_000)
    with page.expect_download() as dl:
        link.click()
    dl.value.save_as(path)
    return path


def no_error_badges(page) -> bool:
    return page.locator(".error, [data-testid=error]").filter(has_text="Error").count() == 0


# The quick tier's one browser test (issue 32) is this first one: the first click, the screen, the scrubber, export
# and import; every other browser test here is marked ``full``.
def test_first_screen_first_click_scrub_and_replay(page_url, browser, tmp_path):
    page = open_page(browser, page_url)
    assert page.get_by_label("Prompt", exact=True).input_value().strip()  # pre-filled: no preset to pick
    expect(page.locator("#lesson")).to_contain_text("guesses")  # the first lesson is open on first load
    t0 = time.perf_counter()
    page.get_by_role("button", name="Generate", exact=True).click()
    page.wait_for_function(f"() => {TITLE}.startsWith('cycle')", timeout=60_000)
    first_tree_s = time.perf_counter() - t0
    stats_has(page, "128 tokens")
    stats_has(page, "(measured")  # AR timed after the run: the stats line at its longest
    # Generate, the tree, its sentence and the scrubber on one 1280×800 screen
    for selector in ("button:text-is('Generate')", "#draft-tree", "#explain", "#cycle-scrubber"):
        box = page.locator(selector).first.bounding_box()
        assert box and box["y"] >= 0 and box["y"] + box["height"] <= SCREEN["height"], (selector, box)
    print(f"time from clicking Generate to the first tree: {first_tree_s:.2f} s")
    tau = page.locator("#stats").inner_text().split("·")[0].strip()  # "τ 1.83"

    # the scrubber: a button, a typed number and the arrow keys each redraw the tree
    before = tree_state(page)["title"]
    page.locator("#cycle-back").click()
    page.wait_for_function(f"(before) => {TITLE} !== before", arg=before, timeout=20_000)
    number = page.locator("#cycle-scrubber input[type=number]")
    number.fill("2")
    number.press("Enter")
    page.wait_for_function(f"() => {TITLE}.startsWith('cycle 2 ')", timeout=20_000)
    page.locator("#cycle-scrubber input[type=range]").focus()
    page.keyboard.press("ArrowRight")
    page.wait_for_function(f"() => {TITLE}.startsWith('cycle 3 ')", timeout=20_000)
    # the ghost toggle redraws at once (the same cycle)
    open_accordion(page, "Run and display")
    page.get_by_label("Show GT-pruned candidates as ghosts").uncheck()
    page.wait_for_timeout(500)
    assert tree_state(page)["title"].startswith("cycle 3 ")
    # the output marks the tokens of the cycle on screen
    expect(page.locator("#output")).to_contain_text("shown cycle")
    # its tokens touch, so a word of several tokens reads as one word (issue 73: "Jan et", "b akes")
    gaps = page.evaluate("""() => {
      const boxes = [...document.querySelectorAll('#output .textfield .token')].map(t => t.getBoundingClientRect());
      const gaps = [];
      for (let i = 1; i < boxes.length; i++)
        if (Math.abs(boxes[i].top - boxes[i - 1].top) < 2) gaps.push(boxes[i].left - boxes[i - 1].right);
      return gaps;
    }""")
    assert gaps and max(gaps) <= 1, gaps

    # export the run, then import it in a fresh page: its own numbers, last cycle, prompt and settings
    saved = export_trace_file(page, tmp_path / "trace.json")
    prompt = page.get_by_label("Prompt", exact=True).input_value()
    page.close()
    page = open_page(browser, page_url)
    page.get_by_label("Prompt", exact=True).fill("something else")
    open_accordion(page, "Trace file: export the last run, or replay one")
    upload(page, saved)
    stats_has(page, "Imported trace", timeout=30_000)
    stats = page.locator("#stats").inner_text()
    assert tau in stats and "128 tokens" in stats, (tau, stats)  # the whole run summarised
    page.wait_for_function(f"() => {TITLE}.startsWith('cycle')", timeout=20_000)
    assert not tree_state(page)["title"].startswith("cycle 1 ")  # its last cycle, not its first
    assert page.get_by_label("Prompt", exact=True).input_value() == prompt
    assert page.locator("#settings textarea").input_value().startswith("python -m cli.generate")
    # a bad file gets a message in the notice and the page keeps the replayed run
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "goose-lens-trace", "version": 99}')
    upload(page, bad)
    expect(page.locator("#notice")).to_contain_text("version 99", timeout=30_000)
    assert page.locator("#stats").inner_text() == stats
    page.close()


@pytest.mark.full
def test_speedup_appears_beside_tau_after_a_run(page_url, browser):
    page = open_page(browser, page_url)
    generate_tokens(page, 48)
    speedup = page.locator("#big-numbers #speedup")
    page.wait_for_function("() => /\\d×/.test(document.querySelector('#big-numbers #speedup')?.innerText || '')",
                           timeout=60_000)  # greyed ("–", "measuring…") until AR is timed
    assert "AR timed beside the run" in speedup.inner_text()
    assert "AR timed step for step beside this run" in speedup.get_attribute("title")
    tau = page.locator("#big-numbers", has_text="τ — tokens").bounding_box()
    box = speedup.bounding_box()
    assert box and tau and box["y"] < tau["y"] + tau["height"] and box["height"] < 200  # in the same row as τ
    stats_has(page, "AR steps per forward")  # τ tied to the cost curve
    assert no_error_badges(page)
    page.close()


@pytest.mark.full
def test_tree_labels_large_and_apart_at_b128(page_url, browser):
    from engine.sources import REGISTRY

    page = open_page(browser, page_url)
    open_accordion(page, "Method and tree shape")
    for info in REGISTRY:  # one toggle per registered draft source
        expect(page.get_by_role("checkbox", name=info.label, exact=True)).to_be_visible()
    set_number(page, "Node budget B (anchor included)", 128)
    page.get_by_label("Bypass:", exact=False).uncheck()
    page.get_by_label("GT principle auto: the speedup-optimal tree size from the measured cost curve").uncheck()
    c_box = page.get_by_role("spinbutton", name="GT threshold c (untick auto to set it; 0 = no pruning)")
    expect(c_box).to_be_enabled()
    set_number(page, "GT threshold c (untick auto to set it; 0 = no pruning)", 0)
    # the r slider is disabled while r is adaptive
    ratio = page.get_by_role("spinbutton", name="Spine ratio r (untick adaptive to set it)")
    expect(ratio).to_be_disabled()
    page.get_by_label("Adaptive spine ratio r (EMA tiers)").uncheck()
    expect(ratio).to_be_enabled()
    page.get_by_label("Adaptive spine ratio r (EMA tiers)").check()
    page.get_by_role("button", name="Generate", exact=True).click()
    stats_has(page, "128 tokens")
    stats_has(page, "c = 0.000")
    checked = 0
    for _ in range(6):  # the last cycles of the run: the biggest trees, each checked as rendered
        page.locator("#cycle-back").click()
        page.wait_for_timeout(700)
        drawn = page.evaluate(RENDERED)
        boxes, sizes = drawn["boxes"], drawn["sizes"]
        assert sizes and min(sizes) >= 16
        clashes = [(a[4], b[4]) for i, a in enumerate(boxes) for b in boxes[i + 1:]
                   if a[0] < b[2] - 1 and b[0] < a[2] - 1 and a[1] < b[3] - 1 and b[1] < a[3] - 1
                   and "marker" not in (a[4], b[4])]
        assert not clashes, clashes[:5]
        checked += len(boxes)
    assert checked > 30
    page.close()


@pytest.mark.full
def test_step_through_plays_one_cycle_in_stages(page_url, browser):
    page = open_page(browser, page_url)
    open_accordion(page, "Method and tree shape")  # every cycle a full tree
    page.get_by_label("Bypass:", exact=False).uncheck()
    page.get_by_label("GT principle auto: the speedup-optimal tree size from the measured cost curve").uncheck()
    page.get_by_role("button", name="Generate", exact=True).click()
    stats_has(page, "128 tokens")
    page.locator("#cycle-scrubber input[type=number]").fill("3")
    page.locator("#cycle-scrubber input[type=number]").press("Enter")
    page.wait_for_function(f"() => {TITLE}.startsWith('cycle 3 ')", timeout=20_000)
    if os.environ.get("GOOSE_LENS_SCREENSHOT"):  # the first screen with a whole tree (no GT pruning) ...
        number = page.locator("#cycle-scrubber input[type=number]")
        for k in range(1, 16):  # ... of a cycle whose spine and a TR branch were both accepted, if there is one
            number.fill(str(k))
            number.press("Enter")
            page.wait_for_function(f"(k) => {TITLE}.startsWith('cycle ' + k + ' ')", arg=k, timeout=20_000)
            said = page.locator("#explain").inner_text()
            if "spine matched" in said and "TR branch" in said:
                break
        page.wait_for_timeout(500)
        page.evaluate("window.scrollTo(0, 0)")
        page.screenshot(path=str(ROOT / "docs" / "screenshot.png"), full_page=False)
        number.fill("3")
        number.press("Enter")
        page.wait_for_function(f"() => {TITLE}.startsWith('cycle 3 ')", timeout=20_000)
    page.get_by_role("button", name="Step through").click()
    seen = []
    for stage in ("· drafts:", "2 ·", "3 ·", "4 ·"):  # 1a PLD, 1b TR, 1c PTD: the sources this cycle has
        page.wait_for_function("(s) => (document.querySelector('#explain')?.innerText || '').includes(s)", arg=stage,
                               timeout=30_000)
        seen.append(page.locator("#explain").inner_text())
    assert "one forward" in seen[1] and "accepted" in seen[2] and "committed" in seen[3]
    expect(page.locator("#output")).to_contain_text("shown cycle")
    page.close()


@pytest.mark.full
def test_a_race_says_before_it_starts_why_its_lanes_may_part(page_url, browser):
    """The board said "(same tokens)" one line above "The outputs part at token 58" (a q4 precision tie), and the
    page said nothing before the race; "⏳" was a box without an emoji font."""
    page = open_page(browser, page_url)
    open_accordion(page, "Race: AR and the chosen method on one device, one clock")
    note = page.locator("#race-note")
    expect(note).to_contain_text("precision tie")
    expect(note).to_contain_text("In fp32 (the exact mode) both lanes write the same tokens")
    expect(page.locator("#exact-mode")).to_be_visible()
    set_number(page, "Race length on screen: about N s (engine time scaled, proportions kept; 0 = real time)", 0)
    page.get_by_role("button", name="Race", exact=True).click()
    page.wait_for_function("() => (document.querySelector('#race-board')?.innerText || '').includes('Both done')",
                           timeout=120_000)
    board = page.locator("#race-board").inner_text()
    same = page.locator("#race-ar textarea").input_value() == page.locator("#race-spec textarea").input_value()
    assert ("for the same tokens" in board) == same and ("the outputs part" in board) == (not same), board
    assert "⏳" not in board + page.locator("#stats").inner_text() and no_error_badges(page)
    page.close()


@pytest.mark.full
def test_stop_in_a_race_keeps_both_outputs(page_url, browser):
    page = open_page(browser, page_url)
    open_accordion(page, "Race: AR and the chosen method on one device, one clock")
    set_number(page, "Race length on screen: about N s (engine time scaled, proportions kept; 0 = real time)", 60)
    page.get_by_role("button", name="Race", exact=True).click()
    page.wait_for_function("() => (document.querySelector('#race-spec textarea')?.value || '').length > 5",
                           timeout=60_000)
    page.get_by_role("button", name="Stop", exact=True).dispatch_event("click")  # see the next test
    page.wait_for_function("() => (document.querySelector('#race-board')?.innerText || '').includes('stopped')",
                           timeout=30_000)
    assert page.locator("#race-ar textarea").input_value() and page.locator("#race-spec textarea").input_value()
    assert "128 / 128 tokens" not in page.locator("#race-board").inner_text()
    assert no_error_badges(page)
    page.close()


@pytest.mark.full
def test_stop_halts_a_long_run_within_a_cycle(page_url, browser):
    page = open_page(browser, page_url)
    pick_preset(page, "HumanEval/7")
    open_accordion(page, "Run and display")
    set_number(page, "Slow motion (s pause per cycle)", 1.0)  # ~25 cycles: a run of ~25 s, even on a busy CPU
    expect(page.get_by_role("slider", name="Slow motion (s pause per cycle)")).to_have_value("1")
    page.get_by_role("button", name="Generate", exact=True).click()
    stats_has(page, "cycles", timeout=60_000)
    # the click event itself: what is tested is the server halting the run, not Playwright's wait for a button
    # that the streamed frames keep moving (a CI run once waited out the whole run there)
    page.get_by_role("button", name="Stop", exact=True).dispatch_event("click")
    time.sleep(0.8)
    stopped_at = page.locator("#stats").inner_text()
    time.sleep(2.5)  # more than two cycles' worth of slow motion: nothing may change
    assert page.locator("#stats").inner_text() == stopped_at
    assert "128 tokens" not in stopped_at and no_error_badges(page)
    page.close()


@pytest.mark.full
def test_a_model_load_in_one_tab_does_not_delay_generate_in_another(page_url, browser):
    """The other tab's first cycle is on screen while the load is still running: the load is held until then (it
    would end only after 120 s), so a Generate queued behind it could not show a cycle within the 60 s waited."""
    loader, user = open_page(browser, page_url), open_page(browser, page_url)
    LOAD_RELEASE.clear()
    LOAD_DONE.clear()
    try:
        open_accordion(loader, "Model")
        loader.get_by_label("Model: smollm2, demo, a hub id, a local folder or .gguf file").fill("someone/slow-model")
        loader.get_by_role("button", name="Load model").click()
        expect(loader.locator("#model-status")).to_contain_text("Loading", timeout=10_000)
        user.get_by_role("button", name="Generate", exact=True).click()
        user.wait_for_function(f"() => {TITLE}.startsWith('cycle')", timeout=60_000)
        assert not LOAD_DONE.is_set(), "Generate showed its first cycle only after the other tab's load ended"
        assert "Loading" in loader.locator("#model-status").inner_text()  # and the loading tab still says so
    finally:
        LOAD_RELEASE.set()  # the load ends now (failing: no such model)
    expect(loader.locator("#model-status")).to_contain_text("no such model", timeout=30_000)
    assert LOAD_DONE.is_set()
    loader.close()
    user.close()


@pytest.mark.full
def test_public_mode_refuses_a_path(public_url, browser):
    page = open_page(browser, public_url)
    open_accordion(page, "Model")
    # the page's own load-time status lands first (on a busy machine it came after the click and replaced the refusal)
    expect(page.locator("#model-status")).to_contain_text("Using", timeout=20_000)
    page.get_by_label("Model: one of", exact=False).fill("/etc")
    page.get_by_role("button", name="Load model").click()
    expect(page.locator("#model-status")).to_contain_text("loads only these models", timeout=20_000)
    assert "/etc" not in page.locator("#page-header").inner_text()
    page.close()
