"""Refine a model's shared cost curve the way the page does, from the default Goose's own runs.

    python scripts/refine_curve.py [--model smollm2] [--dtype auto] [--forward auto]
        [--datasets humaneval,mbpp,gsm8k,mt_bench] [--start 10] [--limit 2] [--max-new-tokens 128]

The page corrects the shared curve after every Generate (``CurveOwner.refine``, ``page/generate.py``); the
benchmark never does, so that its methods all read one curve.  This script runs the default Goose on prompts off
the benchmark's (from ``--start``, default 10) and refines the shared curve after each run, as a visitor's runs
would; ``python -m cli.bench`` started afterwards reads the refined curve from the cache.  Prints the curve
before and after (raw medians, ms).  Run it alone: it times forwards.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from predicted_speed import add_prompt_options, prompts_of  # noqa: E402  (this folder is on the path)

from engine.decoding.config import DecodeConfig  # noqa: E402
from engine.product.bench.methods import method_config  # noqa: E402
from engine.product.models.loading import load_model, with_forward  # noqa: E402
from engine.product.runs.decoder import make_decoder  # noqa: E402


def _raw(curve) -> str:
    return ", ".join(f"{n}:{curve.raw(n):.1f}" for n in curve.nodes)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_prompt_options(ap, dtype="auto", limit=2, max_new_tokens=128)
    ap.add_argument("--forward", default="auto")
    args = ap.parse_args(argv)
    lm = with_forward(load_model(args.model, device="cpu", dtype=args.dtype), args.forward)
    before = lm.curves.shared()
    print(f"model: {lm.summary()}\nbefore: {_raw(before)}", flush=True)
    config = DecodeConfig.of(**method_config("goose"), max_new_tokens=args.max_new_tokens)
    changed = 0
    for prompts in prompts_of(lm, args).values():
        for ids in prompts:
            curve = lm.curves.shared()
            traces = list(make_decoder(lm, config, lm.eos_token_ids, cost_curve=curve).generate(ids))
            changed += lm.curves.refine(traces, len(ids)) is not None
    print(f"after {changed} corrections: {_raw(lm.curves.shared())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
