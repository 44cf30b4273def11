"""T(n) of each forward path (eager, static, compiled) on one model and precision, interleaved in each round, with
the time of each path's first forward of each size (a compiled path compiles then): the figures behind
docs/results.md, "The forward paths".

    python scripts/forward_paths.py [--model smollm2] [--dtype fp32] [--paths eager,static,compiled]
        [--sizes 1,2,4,8,16,32] [--rounds 7]
    python scripts/forward_paths.py --choose [--model smollm2] [--dtype auto]

Prints one markdown row per path: T(n) medians in ms at each size, and the seconds of its first forward of each.
``--choose`` instead measures the three paths as ``--forward auto`` weighs them (compiling the compiled one) and
caches the choice every later start reads.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from engine.core.forward import make_path, runs_file  # noqa: E402
from engine.product.models.forward_choice import TREE_ROWS, choose, measure, use_cache_root  # noqa: E402
from engine.product.models.loading import load_model  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--paths", default="eager,static,compiled", help="registered paths, e.g. eager,static,llamacpp")
    ap.add_argument("--sizes", default="1,2,4,8,16,32")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--choose", action="store_true", help="measure the paths for auto and cache its choice")
    args = ap.parse_args(argv)
    sizes = tuple(int(s) for s in args.sizes.split(","))
    use_cache_root()  # a compiled path keeps its artifacts where the project's cache is
    lm = load_model(args.model, device=args.device, dtype=args.dtype)  # the eager path
    if args.choose:
        choice = choose(lm.model, "auto", compiled=True)
        print(f"{lm.describe()}: {choice.reason}; T(1), T({TREE_ROWS}) in ms: {choice.ms}")
        return 0
    first: dict = {}
    ms = measure(lm.model, {name: make_path(lm.model, name, lm.gguf() if runs_file(name) else None)
                            for name in args.paths.split(",")}, sizes,
                 repeats=args.rounds, first=first)
    print(f"{lm.describe()}, {torch.get_num_threads()} threads, 128 cached tokens, medians of {args.rounds} rounds")
    print("| path | " + " | ".join(f"T({n}) ms" for n in sizes) + " | first forward of each size (s) |")
    print("| --- |" + " --- |" * (len(sizes) + 1))
    for name, row in ms.items():
        print(f"| {name} | {' | '.join(f'{t:.1f}' for t in row)} | "
              f"{', '.join(f'{first[(name, n)]:.1f}' for n in sizes)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
