"""Where torch work runs at full speed on a CPU: one-token forwards timed on the main thread, on a new thread, and on
one long-lived thread that does all of the process's torch work (the page's engine thread,
``engine/product/models/engine_thread.py``).

    python scripts/thread_speed.py [--model smollm2] [--dtype q4] [--rounds 3] [--forwards 40]

Each case runs in a fresh process (what a thread pool remembers is per process); the cases are interleaved round by
round and the medians printed, in ms per forward (the
model in ``--dtype``, one token over a 128-token KV cache).  Output on the 2-core
machine of the docs: docs/results.md, "The page's engine thread".
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.product.models.engine_thread import EngineThread  # noqa: E402

CASES = {
    "main": "the main thread (load, warm-up, timing)",
    "new-thread": "a new thread per timing, after the main thread ran torch (as a Gradio handler does)",
    "engine-thread": "one long-lived thread that does all torch work (the main thread runs none)",
    "engine+loader": "the engine thread, timed after another thread ran torch work and ended (a model load)",
}


def _timed(lm, forwards: int) -> float:
    """Median ms of ``forwards`` one-token forwards over a 128-token KV cache."""
    import torch

    from engine.core.forward import EagerPath
    from engine.core.tree import DraftTree

    with torch.inference_mode():
        forward = EagerPath(lm.model).open(129)  # the seam the decoding loop runs
        forward.prefill(list(range(10, 138)))  # 128 prompt tokens
        times = []
        for _ in range(forwards + 3):
            start = time.perf_counter()
            forward.verify(DraftTree.root_only(42))  # one token
            times.append((time.perf_counter() - start) * 1000)
            forward.commit([])  # back to the 128 prompt tokens
    return statistics.median(times[3:])


def _on_thread(fn):
    """``fn()`` run on a new thread, its result returned."""
    out = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join()
    return out[0]


def one_case(case: str, model: str, dtype: str, forwards: int) -> float:
    """ms per forward for ``case`` (this process's only case)."""
    def load():
        from engine.product.models.loading import load_model
        return load_model(model, dtype=dtype)

    if case == "main":
        lm = load()
        return _timed(lm, forwards)
    if case == "new-thread":
        lm = load()
        _timed(lm, 5)
        return _on_thread(lambda: _timed(lm, forwards))
    engine = EngineThread()
    lm = engine.call(load)
    engine.call(_timed, lm, 5)
    if case == "engine+loader":
        _on_thread(lambda: _timed(lm, 5))
    return engine.call(_timed, lm, forwards)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--forwards", type=int, default=40)
    ap.add_argument("--case", choices=sorted(CASES), help=argparse.SUPPRESS)  # one case, in this process
    args = ap.parse_args(argv)
    if args.case:
        print(json.dumps(one_case(args.case, args.model, args.dtype, args.forwards)))
        return 0
    ms: dict[str, list[float]] = {case: [] for case in CASES}
    for _ in range(args.rounds):
        for case in CASES:
            argv = ["--case", case, "--model", args.model, "--dtype", args.dtype, "--forwards", str(args.forwards)]
            out = subprocess.run([sys.executable, __file__, *argv], capture_output=True, text=True, check=True)
            ms[case].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print("| where the forward runs | ms / forward (median of rounds) | each round |\n| --- | --- | --- |")
    for case, words in CASES.items():
        print(f"| {words} | {statistics.median(ms[case]):.1f} | {', '.join(f'{m:.1f}' for m in ms[case])} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
