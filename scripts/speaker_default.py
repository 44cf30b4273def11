"""Which preset prompt shows speculative decoding soonest on this machine: for each preset, where the page's first
run (every default, sources never resting) first verifies a draft tree, how many of its first 10 cycles do, how
many show the sources' drafts (of the first 10 and of the whole run), and τ.  Deterministic given the cost curve
(the model's cached one), so it may run beside anything.

    python scripts/speaker_default.py [--model smollm2|demo] [--max-new-tokens 64]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.product.models.loading import load_model, with_forward  # noqa: E402
from engine.product.runs.decoder import make_decoder  # noqa: E402
from engine.product.runs.ledger import proposals  # noqa: E402
from page.presets import PRESETS  # noqa: E402
from page.settings import PageSettings  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    args = ap.parse_args(argv)
    lm = with_forward(load_model(args.model))
    curve = lm.curves.shared()
    print(f"{lm.describe()}, curve {curve.spec()[:60]}…")
    print("| preset | format | first tree cycle | trees in cycles 1-10 | drafts shown in 1-10 | drafts shown, run "
          "| τ |")
    print("|---|---|---|---|---|---|---|")
    for preset in PRESETS:
        settings = PageSettings(prompt=preset["prompt"], prompt_format=preset["format"],
                                max_new_tokens=args.max_new_tokens)
        ids, config = settings.prepare(lm)
        traces = list(make_decoder(lm, config, lm.eos_token_ids, cost_curve=curve).generate(ids))[1:]
        first = next((t.index for t in traces if t.mode in ("tree", "bypass")), None)
        head = traces[:10]
        trees = sum(t.mode in ("tree", "bypass") for t in head)
        shown = sum(len(proposals(t)) > 1 for t in head)
        whole = sum(len(proposals(t)) > 1 for t in traces)
        tau = sum(len(t.new_tokens) for t in traces) / len(traces)
        print(f"| {preset['label']} | {preset['format']} | {first or '–'} | {trees} | {shown} | "
              f"{whole} of {len(traces)} | {tau:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
