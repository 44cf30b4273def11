"""How often the next draft tree reads what the last cycle's learning wrote: could TR's learning run while the next
forward runs, and the next tree stay the same?  Deterministic (token ids only): it may run beside anything.

Issue 71, item 3 (docs/results.md, "Goose's cost per cycle"): a cycle's learning writes TR's rows of every token the
verified tree held (tier 1 by token, tier 2 by the pair; Goose paper, App. C.1) before the next tree is built.  Were
those writes deferred past the next build, that tree would read the rows as they stood a cycle earlier wherever it
expands one of those tokens.  For each cycle whose tree was built with TR drafting, after a cycle TR observed, this
counts the cycles whose built tree (``CycleTrace.candidates``, before GT's size choice; the verified tree where there
was none) expands a token of the previous verified tree (a node with a child, or the anchor): a lower bound, since an
expansion that found no child is not in the tree.  Goose's defaults, greedy, each model's fixed curve of
``planner_stages.CURVES`` unless ``--curve`` gives one.

    python scripts/learn_reads.py [--model demo|smollm2] [--curve SPEC] [--limit 5] [--max-new-tokens 128]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # planner_stages, also when imported (tests)

from planner_stages import CURVES, ROOT, SETS  # noqa: E402

from engine.decoding.compiled_cycle import KERNELS  # noqa: E402
from engine.decoding.config import DecodeConfig  # noqa: E402
from engine.decoding.cost import CostCurve  # noqa: E402
from engine.decoding.trace import CycleTrace  # noqa: E402
from engine.product.bench.prompts import DATASETS, encode, load_prompts  # noqa: E402
from engine.product.models.loading import load_model  # noqa: E402
from engine.product.runs.decoder import make_decoder  # noqa: E402


def reads_last_learning(before: CycleTrace, now: CycleTrace) -> tuple[bool, bool]:
    """Whether ``now``'s tree expands a token whose TR row ``before``'s learning wrote, and whether its anchor is
    one (``before``: the cycle just before, which TR observed)."""
    written = set(before.tree.tokens)  # every verified row is stored (TR observed ``before``)
    tree = now.candidates if now.candidates is not None else now.tree
    expanded = {tree.tokens[0]} | {tree.tokens[p] for p in tree.parents[1:]}
    return bool(expanded & written), tree.tokens[0] in written


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="demo", choices=tuple(CURVES))
    ap.add_argument("--curve", default=None, help="a cost curve's spec instead of the model's in CURVES")
    ap.add_argument("--limit", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    args = ap.parse_args(argv)
    KERNELS.warm()
    lm = load_model(args.model)
    curve = CostCurve.from_spec(args.curve or CURVES[args.model])
    config = DecodeConfig().with_(max_new_tokens=args.max_new_tokens)
    print(f"{lm.describe()}; Goose's defaults, {args.limit} prompts a dataset, {args.max_new_tokens} tokens, curve "
          f"{curve.id}")
    print("| dataset | cycles counted | the tree expands a token the last learning wrote | its anchor is one |")
    print("|---|---|---|---|")
    for dataset in SETS:
        counted = expands = anchors = 0
        for text in load_prompts(ROOT / "assets" / "datasets", dataset, args.limit):
            decoder = make_decoder(lm, config, lm.eos_token_ids, cost_curve=curve)
            before = None
            for trace in decoder.generate(encode(lm, text, DATASETS[dataset][2], args.max_new_tokens)):
                if before is not None and before.mode != "prefill" and "tr" not in before.resting + trace.resting:
                    expand, anchor = reads_last_learning(before, trace)
                    counted, expands, anchors = counted + 1, expands + expand, anchors + anchor
                before = trace
        shares = [f"{x / counted:.2f}" if counted else "-" for x in (expands, anchors)]
        print(f"| {dataset} | {counted} | {' | '.join(shares)} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
