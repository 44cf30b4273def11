"""PTD walk-priority experiment: tau of goose+ptd under every order of the three sources.

    python scripts/ptd_priority.py [--limit 20] [--max-new-tokens 128] [--temperature 0.7] [--out F]

Greedy: children of a node carry distinct tokens, so the order cannot change which path is accepted
(tau must be identical; this is checked, not assumed).  Sampling: the order decides which child is
offered the target's mass first, so tau may differ; every order is lossless in distribution.
Prompts: the first ``--limit`` HumanEval prompts of assets/datasets.  Medians over prompts.
"""
from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.decoding.config import DecodeConfig  # noqa: E402
from engine.product.bench.prompts import DEFAULT_DATA, load_prompts  # noqa: E402
from engine.product.models.loading import load_model  # noqa: E402
from engine.product.runs.decoder import make_decoder
from engine.product.runs.metrics import summarize  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    lm = load_model("demo", device="cpu", dtype="fp32")
    prompts = [lm.encode_prompt(p) for p in load_prompts(DEFAULT_DATA, "humaneval", args.limit)]
    rows = []
    for temperature in (0.0, args.temperature):
        for order in itertools.permutations(("pld", "ptd", "tr")):
            cfg = DecodeConfig.of(sources=("pld", "tr", "ptd"), walk_priority=order, temperature=temperature,
                                  max_new_tokens=args.max_new_tokens)
            taus, ptd_share = [], []
            for ids in prompts:
                s = summarize(list(make_decoder(lm, cfg, lm.eos_token_ids).generate(ids)))
                taus.append(s.tau)
                ptd_share.append(s.accepted_by_source["ptd"] / max(1, s.new_tokens))
            rows.append({"temperature": temperature, "order": ">".join(order), "median_tau": statistics.median(taus),
                         "mean_tau": statistics.fmean(taus), "ptd_token_share": statistics.fmean(ptd_share)})
            print(json.dumps(rows[-1]), flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
