"""How much of a cycle's host work is its own, and how much the forward's eviction of the caches: each cycle's stage
1 (draft) and stage 2 (build) timed as the loop runs them, right after the forward, then run again at once (warm),
then again after touching a buffer of ``--evict-mb`` MiB (that buffer's eviction alone).  The repeats are discarded:
the loop goes on with the first result, so the run's tokens are the run's own.  Timings: run it alone.

On a 2-core CPU the forward evicts the last-level cache, and the host work that follows runs from memory: the
answer to "why does a cycle cost more outside its forward than its Python's instruction count says" (issue 71;
docs/results.md, "Goose's cost per cycle").

    python scripts/host_warmth.py [--model demo] [--dtype auto] [--forward PATH] [--limit 3] [--max-new-tokens 128]
        [--evict-mb 48]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from engine.decoding.config import DecodeConfig  # noqa: E402
from engine.decoding.planner import Planner  # noqa: E402
from engine.decoding.records import Drafts, Generation, Plan  # noqa: E402
from engine.product.bench.prompts import DATASETS, encode, load_prompts  # noqa: E402
from engine.product.models.loading import load_model, with_forward  # noqa: E402
from engine.product.runs.decoder import make_decoder  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
WHEN = ("after the forward", "again at once", "after the eviction")
SETS = ("humaneval", "mbpp", "gsm8k", "mt_bench")  # the bench's four


class WarmthPlanner:
    """A decoder's ``Planner`` with each ``draft`` and ``build`` timed three times (``WHEN``); the first result is
    the one returned.  ``ms[(stage, when)]`` collects the milliseconds; ``build`` counts cycles that built a tree
    (GT may then price it down to the anchor), not plain AR steps."""

    def __init__(self, planner: Planner, evict_mb: int) -> None:
        self.planner = planner
        self.buffer = np.zeros(evict_mb * 2**20 // 8)  # touched between the second and the third run
        self.ms: dict[tuple[str, str], list[float]] = defaultdict(list)

    def __getattr__(self, name: str):
        return getattr(self.planner, name)

    def _thrice(self, stage: str, run, keep) -> object:
        out = None
        for when in WHEN:
            if when == WHEN[2]:
                self.buffer += 1.0
            t0 = time.perf_counter()
            result = run()
            ms = (time.perf_counter() - t0) * 1000
            out = result if out is None else out
            if keep(out):
                self.ms[(stage, when)].append(ms)
        return out

    def draft(self, s: Generation) -> Drafts:
        return self._thrice("draft", lambda: self.planner.draft(s), lambda _: True)

    def build(self, s: Generation, drafts: Drafts) -> Plan:
        return self._thrice("build", lambda: self.planner.build(s, drafts),
                            lambda plan: plan.mode != "ar" or plan.candidates is not None)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="demo")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--forward", default=None, help="a forward path (default: $GOOSE_LENS_FORWARD, else auto)")
    ap.add_argument("--limit", type=int, default=3, help="prompts per dataset")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--evict-mb", type=int, default=48, help="MiB touched before the third run (the L3 or more)")
    args = ap.parse_args(argv)
    lm = with_forward(load_model(args.model, dtype=args.dtype), args.forward)
    curve = lm.curves.shared()
    config = DecodeConfig().with_(max_new_tokens=args.max_new_tokens)
    ms: dict[tuple[str, str], list[float]] = defaultdict(list)
    for dataset in SETS:
        for text in load_prompts(ROOT / "assets" / "datasets", dataset, args.limit):
            decoder = make_decoder(lm, config, lm.eos_token_ids, cost_curve=curve)
            timed = WarmthPlanner(decoder.planner, args.evict_mb)
            decoder.planner, decoder.compiled = timed, False  # the Python planner's stages are what is timed
            for _ in decoder.generate(encode(lm, text, DATASETS[dataset][2], args.max_new_tokens)):
                pass
            for key, values in timed.ms.items():
                ms[key] += values
    print(f"{lm.describe()}; Goose's defaults, {args.limit} prompts a dataset, {args.max_new_tokens} tokens")
    print(f"| stage | cycles | {' | '.join(WHEN[:2])} | after touching {args.evict_mb} MiB |")
    print("|---|---|---|---|---|")
    for stage in ("draft", "build"):
        medians = [statistics.median(ms[(stage, when)]) for when in WHEN]
        print(f"| {stage} | {len(ms[(stage, WHEN[0])])} | " + " | ".join(f"{m:.3f} ms" for m in medians) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
