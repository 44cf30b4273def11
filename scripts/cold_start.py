"""A cold start, timed as a visitor meets it: ``python app.py`` with an empty goose-lens cache (a new
``GOOSE_LENS_CACHE`` folder, pip's cache off), the seconds until the page answers, then a headless Chromium pressing
Generate the moment it does, every default, and the seconds until that run's first frame and its end.

    python scripts/cold_start.py [--port 7862]

Run it alone (it times the machine).  Prints the three times, the run's stats line and the app's console lines of
what it measured (docs/results.md, "Installing llama.cpp's kernels and a cold start").
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("GOOSE_LENS_CHROMIUM", "/usr/bin/chromium")
DONE = r"() => /{n} tokens in \d+ forwards/.test(document.querySelector('#stats')?.innerText || '')"


def wait_for_page(url: str) -> None:
    """Poll ``url`` until it answers."""
    while True:
        try:
            urllib.request.urlopen(url, timeout=2).read(100)
            return
        except OSError:
            time.sleep(0.5)


def first_run(url: str, started: float) -> tuple[float, float, str]:
    """Press Generate at once; (s to the run's first frame, s to its end, its stats line), from ``started``."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.goto(url)
        page.get_by_role("button", name="Generate", exact=True).click(timeout=120_000)
        page.wait_for_function(DONE.replace("{n}", r"\d+"), timeout=600_000)
        first = time.time() - started
        page.wait_for_function(DONE.replace("{n}", "128"), timeout=600_000)
        done = time.time() - started
        stats = page.locator("#stats").inner_text()
        browser.close()
    return first, done, stats


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=7862)
    args = ap.parse_args(argv)
    env = {**os.environ, "GOOSE_LENS_CACHE": tempfile.mkdtemp(prefix="goose-lens-cold-"), "PIP_NO_CACHE_DIR": "1",
           "PYTHONUNBUFFERED": "1"}
    log = Path(tempfile.mkdtemp()) / "app.log"
    started = time.time()
    with open(log, "w") as out:
        app = subprocess.Popen([sys.executable, "app.py", "--port", str(args.port)], cwd=ROOT, env=env, stdout=out,
                               stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{args.port}/"
            wait_for_page(url)
            print(f"the page answers after {time.time() - started:.1f} s", flush=True)
            first, done, stats = first_run(url, started)
            print(f"the first run's first frame after {first:.1f} s, its end after {done:.1f} s\n{stats}")
        finally:
            app.terminate()
            app.wait()
    steps = ("forward path:", "every visitor's default", "auto precision:", "cost curve:")
    print("\n".join(line for line in log.read_text().splitlines() if line.startswith(steps)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
