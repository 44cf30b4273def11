"""Issue 56's check: fresh visits, each pressing Generate and then Race on the same default prompt, both figures and
their margins printed, with the sentence the page gives where they differ beyond their margins.

    python scripts/speedup_visits.py [--model smollm2] [--visits 3] [--race-seconds 0]

Every speedup on the page is the decode phase on the engine's clock (``engine.product.runs.run.speedup_over_ar``),
so Generate's and the Race's should agree within their 95 % margins, or the page names why.  Each visit is a new
browser context (a fresh session: no AR timing or speedup kept from the last visit).  The page is served as
``scripts/page_speed.py`` serves it (one engine thread; the start model at the precision ``--dtype`` names, no
start-up measurement).  Needs playwright and Chromium (``$GOOSE_LENS_CHROMIUM``, else /usr/bin/chromium).  Timing
figures mean something only on an otherwise idle machine; record them in docs/results.md.
"""
from __future__ import annotations

import argparse
import os
import re

from page_speed import serve_page  # this folder is on the path; page_speed puts the repository's root there too

RACE = "Race: AR and the chosen method on one device, one clock"
RACE_LENGTH = "Race length on screen: about N s (engine time scaled, proportions kept; 0 = real time)"
FIGURE = re.compile(r"too close to call \([^)]*\)|\d+\.\d+×(?: ± \d+\.\d+| \[[\d.]+–[\d.]+×\])?|no speedup")


def figure(text: str) -> str:
    """The speedup and its interval as the page shows it ("1.52× ± 0.06", "1.88× [0.41–8.6×]", "too close to call
    (…)", "no speedup")."""
    found = FIGURE.search(text)
    return found.group(0) if found else f"? ({text.strip()[:60]})"


def visit(browser, url: str, race_seconds: float) -> dict:
    """One fresh visit: Generate, then Race on the same prompt; both figures and the sentences on screen."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    page.goto(url)
    page.get_by_role("button", name="Generate", exact=True).wait_for(timeout=120_000)
    page.get_by_role("button", name="Generate", exact=True).click()
    page.wait_for_function("() => /×|no speedup/.test(document.querySelector('#speedup')?.innerText || '')",
                           timeout=600_000)
    generate, stats = page.locator("#speedup").inner_text(), page.locator("#stats").inner_text()
    page.get_by_text(RACE, exact=True).click()
    box = page.get_by_role("spinbutton", name=RACE_LENGTH)
    box.fill(str(race_seconds))
    box.press("Enter")
    page.get_by_role("button", name="Race", exact=True).click()
    page.wait_for_function("() => /Both done|stopped/.test(document.querySelector('#race-board')?.innerText || '')",
                           timeout=600_000)
    board = page.locator("#race-board").inner_text()
    context.close()
    return {"generate": figure(generate), "race": figure(board), "why": " ".join(
        line for line in (stats + "\n" + board).splitlines() if "differ by more than their margins" in line)}


def main(argv=None) -> int:
    from playwright.sync_api import sync_playwright

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="default: the page's default model (SmolLM2)")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--visits", type=int, default=3)
    ap.add_argument("--race-seconds", type=float, default=0, help="the race's length on screen (0: real time)")
    args = ap.parse_args(argv)
    _, lm, demo, url = serve_page(args.model, args.dtype)
    rows = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=os.environ.get("GOOSE_LENS_CHROMIUM", "/usr/bin/chromium"))
        for _ in range(args.visits):
            rows.append(visit(browser, url, args.race_seconds))
        browser.close()
    demo.close()
    print(f"{lm.describe()}, default preset, every default; speedup over AR, decode phase, engine time\n")
    print("| visit | Generate | Race | the page's sentence where they differ |\n| --- | --- | --- | --- |")
    for k, row in enumerate(rows, 1):
        print(f"| {k} | {row['generate']} | {row['race']} | {row['why'] or '–'} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
