"""The page's speed against the engine's, in one process: the page served as ``python app.py`` serves it and driven in
headless Chromium (Generate on the default preset, every default), then the same prompt and config decoded by the
engine alone on the same engine thread, round after round (interleaved), medians printed.

    python scripts/page_speed.py [--model smollm2] [--rounds 5]

Both figures are the run's end-to-end tokens/s (prefill included): the page's "Run totals" line, and
``engine.product.runs.metrics.summarize`` of the engine's own traces.  Needs playwright and Chromium
(``$GOOSE_LENS_CHROMIUM``, else /usr/bin/chromium).  Output on the 2-core machine of the docs: docs/results.md,
"The page's engine thread".
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import re
import socket
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import app  # noqa: E402
from engine.product.models.engine_thread import EngineThread  # noqa: E402
from engine.product.runs.decoder import make_decoder  # noqa: E402
from engine.product.runs.metrics import summarize  # noqa: E402
from page.frames import INITIAL  # noqa: E402
from page.presets import start_preset  # noqa: E402
from page.startup import settle  # noqa: E402

RUN_TOTALS = re.compile(r"Run totals: τ ([\d.]+) · ([\d.]+) tok/s")
ENDED_JS = """([before, tokens]) => {  // the stats line once the run and AR's timing ended, not the last run's
  const text = (document.querySelector('#stats') || {}).innerText || '';
  return /\\(measured: [^)]+\\)/.test(text) && text.includes(tokens) && text !== before;
}"""
POLL_MS = 500


def serve_page(model: str | None, dtype: str = "auto"):
    """The page served as ``python app.py`` serves it, on one engine thread (also ``scripts/speedup_visits.py``'s):
    the start model ``model`` (None: the page's default) at ``dtype`` (its measurement cached, not repeated), then
    the start-up's forward choice and cost curve (``page.startup.settle``) before the page opens.  Returns (the
    engine thread, every visitor's default model, the gradio app, its URL); the caller closes the app."""
    engine = EngineThread()
    lm, _ = engine.call(app.load_start_model, model, dtype=dtype)
    models = app.place_models(lm, app.PageOptions(), engine=engine)
    engine.call(settle, models, model, "cpu", False)
    lm = models.get(None)
    demo = app.build_demo(models)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    demo.queue(default_concurrency_limit=1).launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True,
                                                   css=app.CSS)
    return engine, lm, demo, f"http://127.0.0.1:{port}/"


def engine_alone(lm, engine: EngineThread) -> tuple[float, float, int]:
    """(τ, end-to-end tok/s, new tokens) of the default preset at the page's defaults, decoded on ``engine`` by the
    engine."""
    preset = start_preset(lm)
    ids, config = dataclasses.replace(INITIAL, prompt=preset["prompt"], prompt_format=preset["format"]).prepare(lm)

    def run():
        traces = list(make_decoder(lm, config, lm.eos_token_ids).generate(ids))
        return summarize(traces)

    summary = engine.call(run)
    return summary.tau, summary.tok_per_s, summary.new_tokens


def page_run(page, tokens: int) -> tuple[float, float]:
    """(τ, end-to-end tok/s) of one Generate on the page, read from its "Run totals" line once the run has ended:
    ``tokens`` written (the engine's count on the same prompt) and the line ties τ to the measured speedup.  The
    line is watched inside the page, every ``POLL_MS`` (no round trip to this process per look: the browser and
    playwright's driver share the server's cores, and a watcher that asks four times a second read the page 2-3 %
    slower); the same line as the last run's is taken after 30 s."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    before = page.locator("#stats").inner_text()  # the last run's line
    page.get_by_role("button", name="Generate", exact=True).click()
    try:
        page.wait_for_function(ENDED_JS, arg=[before, f" {tokens} tokens in "], polling=POLL_MS, timeout=30_000)
    except PlaywrightTimeout:
        pass
    page.wait_for_function(ENDED_JS, arg=["", f" {tokens} tokens in "], polling=POLL_MS, timeout=90_000)
    tau, speed = RUN_TOTALS.search(page.locator("#stats").inner_text()).groups()
    return float(tau), float(speed)


def main(argv=None) -> int:
    from playwright.sync_api import sync_playwright

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="default: the page's default model (SmolLM2)")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    engine, lm, demo, url = serve_page(args.model)
    rows = {"page": [], "engine": []}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=os.environ.get("GOOSE_LENS_CHROMIUM", "/usr/bin/chromium"))
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.goto(url)
        page.get_by_role("button", name="Generate", exact=True).wait_for(timeout=60_000)
        tokens = engine_alone(lm, engine)[2]
        page_run(page, tokens)  # the first run also times AR for the speedup: not counted
        for _ in range(args.rounds):
            rows["page"].append(page_run(page, tokens))
            rows["engine"].append(engine_alone(lm, engine)[:2])
        browser.close()
    demo.close()
    print(f"{lm.describe()}, default preset, every default; end-to-end tok/s, {args.rounds} rounds interleaved\n")
    print("| | τ | tok/s (median) | each round |\n| --- | --- | --- | --- |")
    for name, runs in rows.items():
        print(f"| {name} | {statistics.median(t for t, _ in runs):.2f} | {statistics.median(s for _, s in runs):.1f} | "
              f"{', '.join(f'{s:.1f}' for _, s in runs)} |")
    ratio = statistics.median(s for _, s in rows["page"]) / statistics.median(s for _, s in rows["engine"])
    print(f"\npage ÷ engine = {ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
