"""A cycle's host time by stage, the compiled planner against the Python one and AR, in one process: each cycle's
stage timings (``CycleTrace.timings_ms``) and the time outside the forward, medians over Goose's default runs on a few
prompts a dataset, with the mean of the time outside the forward (a cost paid in a few cycles, such as a table's
growth, moves the mean and not the median); the three ways alternate round by round.  The cost curve is fixed
(``CURVES``: the same trees on every machine), so the planners plan the same trees and only their host time differs.
Timings: run it alone.

Issue 71 (docs/results.md, "Goose's cost per cycle"): what the compiled cycle (engine/decoding/compiled_cycle.py)
saves outside the forward, and how far it stays from AR's.

    python scripts/planner_stages.py [--model demo|smollm2] [--dtype auto] [--forward PATH] [--curve SPEC]
        [--rounds 2] [--limit 3] [--max-new-tokens 128]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.decoding.compiled_cycle import KERNELS  # noqa: E402
from engine.decoding.config import DecodeConfig  # noqa: E402
from engine.decoding.cost import CostCurve  # noqa: E402
from engine.product.bench.prompts import DATASETS, encode, load_prompts  # noqa: E402
from engine.product.models.loading import load_model, with_forward  # noqa: E402
from engine.product.runs.decoder import make_decoder  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SETS = ("humaneval", "mbpp", "gsm8k", "mt_bench")  # the bench's four
#: Fixed curves (the same trees on every machine): the demo's of tests/conftest.py (flat: GT's raw estimates), and
#: llama.cpp's Q4_1 curve on 2 cores, roughly, for SmolLM2 (steep: the path calibration on).
CURVES = {"demo": "past=128;1:5.760,2:7.120,3:8.450,4:8.520,5:8.520,6:9.510,7:9.870,8:9.870,9:9.870,10:9.870,"
                  "11:10.490,12:10.490,13:10.490,14:10.610,15:11.560,16:11.560,20:11.640,24:11.730,32:14.460,"
                  "48:17.810,64:21.670,128:33.530",
          "smollm2": "past=128;1:10,2:17,4:25,8:41,16:72,32:142,64:280,128:560"}
WAYS = ("python", "compiled", "ar")


def _run(way: str, lm, curve: CostCurve, prompts: list[list[int]], max_new: int) -> dict[str, list[float]]:
    """Every decoding cycle's stage timings (ms) of one way over the prompts, and ``outside``: total − forward."""
    config = DecodeConfig().with_(max_new_tokens=max_new)
    if way == "ar":
        config = config.with_(sources=())
    ms: dict[str, list[float]] = defaultdict(list)
    for ids in prompts:
        decoder = make_decoder(lm, config, lm.eos_token_ids, cost_curve=curve)
        decoder.compiled = way != "python"
        for trace in decoder.generate(ids):
            if trace.mode == "prefill":
                continue
            for stage, value in trace.timings_ms.items():
                ms[stage].append(value)
            ms["outside"].append(trace.timings_ms["total"] - trace.timings_ms["forward"])
    return ms


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="demo", choices=tuple(CURVES))
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--forward", default=None, help="a forward path; default: the one the model's loading chose")
    ap.add_argument("--curve", default=None, help="a cost curve's spec instead of the model's in CURVES")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--limit", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    args = ap.parse_args(argv)
    KERNELS.warm()
    lm = with_forward(load_model(args.model, dtype=args.dtype), args.forward)
    curve = CostCurve.from_spec(args.curve or CURVES[args.model])
    prompts = [encode(lm, text, DATASETS[ds][2], args.max_new_tokens) for ds in SETS
               for text in load_prompts(ROOT / "assets" / "datasets", ds, args.limit)]
    _run("compiled", lm, curve, prompts[:1], 16)  # warm: the model, the kernels' first call
    print(f"{lm.describe()}; Goose's defaults, {args.limit} prompts a dataset, {args.max_new_tokens} tokens")
    print("| round | planner | cycles | outside the forward | its mean | draft | build | walk | cache | harvest "
          "| forward |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in range(1, args.rounds + 1):
        for way in WAYS:
            ms = _run(way, lm, curve, prompts, args.max_new_tokens)
            cells = " | ".join([f"{statistics.median(ms['outside']):.3f}", f"{statistics.fmean(ms['outside']):.3f}",
                                *(f"{statistics.median(ms[k]):.3f}" for k in
                                  ("draft", "build", "walk", "cache", "harvest", "forward"))])
            print(f"| {r} | {way} | {len(ms['outside'])} | {cells} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
