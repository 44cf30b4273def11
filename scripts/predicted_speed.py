"""Predicted decode-phase speedup on a given cost curve: a deterministic A/B of tree policies.

    python scripts/predicted_speed.py --methods goose,iso3,tr [--model smollm2] [--dtype fp32]
        [--datasets humaneval,mbpp,gsm8k,mt_bench] [--start 10] [--limit 3] [--max-new-tokens 96]
        [--truth 'past=128;1:60,2:69,...'] [--curve SPEC]

On a 2-core VM timings drift by ±30 % within minutes, so small differences between tree policies drown in
noise.  This script runs each method (``cli.bench`` method names and variants) on the same prompts and
prices every cycle's forward on a fixed "truth" curve T(n) (default: the per-size medians of forward ms
that a bf16 SmolLM2 bench run measured in its own cycles on this machine): predicted speedup =
Σ tokens / Σ T(rows) × T(1), median over prompts.  In fp32 every method decodes the same text, so the
comparison is of trees alone; in half precision a precision tie may send two methods down different texts.
``--curve`` is what the size choice reads (default: the truth).  τ-like numbers only: confirm a winner with
``python -m cli.bench``.

``--trace FILE`` prices a recorded run instead (a trace file the page exported, or ``cli.generate``'s run): its
candidate trees with GT's size choice redone on ``--truth``, each tree's outcome read off the output, no model
call (``engine.product.runs.ledger.price_on``: what the page's Theory panel shows for other devices).

The pricing is ``engine.product.bench.predicted``'s.  ``--oracle`` prices each cycle as if the size choice had known
its outcome: the cycle verifies exactly the path it accepted (T(a + 1) for a + 1 tokens), or takes a + 1 AR steps
where those cost less.  Run on a wide tree with no pruning (``goose/c=0:budget=32``), it bounds what any size choice
over those sources' trees can reach on that curve: the ceiling a better acceptance estimate could approach, not a
speed.  ``--forward llamacpp`` runs the model's own GGUF file on llama.cpp's kernels (its greedy text is that path's,
not torch's).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.product.bench.predicted import Pricing, held_out_prompts, predict  # noqa: E402
from engine.product.io.traces import TraceFormatError, load_run  # noqa: E402
from engine.product.models.cost_cache import CostCurve  # noqa: E402
from engine.product.models.loading import dtype_beside, load_model, with_forward  # noqa: E402
from engine.product.runs.ledger import price_on  # noqa: E402

#: Forward ms per tree size measured inside a bf16 SmolLM2 bench run (3 prompts x 4 datasets, 2026-11-22).
IN_RUN_BF16 = ("past=128;1:60,2:69,3:67.5,4:70.6,5:76.2,6:79.7,7:85.3,8:85.3,9:88.4,10:88.9,12:99,16:100,21:109,"
               "32:125,64:175,128:300")


def add_prompt_options(ap: argparse.ArgumentParser, dtype: str | None, limit: int, max_new_tokens: int) -> None:
    """The options this script and ``refine_curve.py`` share: the model, its dtype, and prompts off the bench's."""
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--dtype", default=dtype)
    ap.add_argument("--datasets", default="humaneval,mbpp,gsm8k,mt_bench")
    ap.add_argument("--start", type=int, default=10, help="first prompt (10: off the bench's prompts 0-9)")
    ap.add_argument("--limit", type=int, default=limit, help="prompts per dataset")
    ap.add_argument("--max-new-tokens", type=int, default=max_new_tokens)


def prompts_of(lm, args: argparse.Namespace) -> dict[str, list[list[int]]]:
    """The prompts ``add_prompt_options`` names (``predicted.held_out_prompts``)."""
    return held_out_prompts(lm, args.datasets.split(","), args.start, args.limit, args.max_new_tokens)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", default="goose,iso3,tr,pld")
    add_prompt_options(ap, dtype=None, limit=3, max_new_tokens=96)  # fp32, or auto beside a llamacpp --forward
    ap.add_argument("--truth", default=IN_RUN_BF16, help="cost curve spec every forward is priced on")
    ap.add_argument("--curve", default=None, help="cost curve spec the size choice reads (default: --truth)")
    ap.add_argument("--forward", default="eager", help="forward path: eager (default), static, llamacpp, ...")
    ap.add_argument("--oracle", action="store_true",
                    help="price each cycle at its accepted path alone (the ceiling of any size choice)")
    ap.add_argument("--trace", type=Path, default=None,
                    help="price a recorded run's drafts on --truth (no model call) instead of running methods")
    args = ap.parse_args(argv)
    if args.trace is not None:
        return price_trace(args.trace, CostCurve.from_spec(args.truth))
    dtype = args.dtype or dtype_beside(args.forward, "fp32")  # llama.cpp's paths run the file: "auto" alone may
    lm = with_forward(load_model(args.model, device="cpu", dtype=dtype), args.forward)
    truth = CostCurve.from_spec(args.truth)
    pricing = Pricing(truth, CostCurve.from_spec(args.curve) if args.curve else None, args.oracle)
    methods = args.methods.split(",")
    table: dict[str, dict[str, float]] = {m: {} for m in methods}
    for p in predict(lm, methods, prompts_of(lm, args), pricing, args.max_new_tokens):
        table[p.method][p.dataset] = p.speedup
        print(f"{p.dataset} {p.method}: predicted {p.speedup:.2f}x, decode tau {p.tau:.2f}", flush=True)
    print("average: " + ", ".join(f"{m} {statistics.fmean(table[m].values()):.3f}" for m in methods))
    return 0


def price_trace(path: Path, truth: CostCurve) -> int:
    """Print a recorded run's drafts priced on ``truth`` (``ledger.price_on``); 2 when the file is no trace."""
    try:
        traces = load_run(path.read_bytes())["traces"]
    except (OSError, TraceFormatError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    priced = price_on(traces, truth)
    if priced is None:
        print("error: the run has no decoding cycle to price", file=sys.stderr)
        return 2
    print(f"{path.name}: predicted tau {priced.tau:.2f}, rows per forward {priced.rows:.1f}, "
          f"predicted speedup {priced.speedup:.2f}x over {priced.cycles} cycles")
    return 0


if __name__ == "__main__":
    sys.exit(main())
