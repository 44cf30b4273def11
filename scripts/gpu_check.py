"""Everything a short visit to a GPU machine should check, in one command (a few minutes), written to one JSON file.

    python scripts/gpu_check.py [--device cuda] [--out gpu_check.json] [--skip-tests]

1. ``tests/test_cuda.py`` and ``tests/test_forward.py`` (pytest; the CUDA tests skip without a GPU).
2. T(n) at the tree-size buckets for each forward path (eager, static and, on CUDA, graphed), interleaved, on a
   random-weight model of SmolLM2-135M's configuration (T(n) does not depend on the weights; SmolLM2's own 93 MB
   file need not travel) in bf16 on CUDA, fp32 on a CPU.
3. AR tokens per second per path on that random-weight model (128 tokens), then greedy losslessness in fp32,
   AR / Goose tokens per second and Goose's decode speedup against its limit τ·T(1)/T(n̄) on the embedded demo
   model for each path (its real weights: drafts are accepted), and on SmolLM2 when it is already in the cache
   (``--smollm2``).

``--device cpu`` runs the same on a CPU (eager vs static), so the script is checked where no GPU is.  The machine
needs torch; transformers 5.24, plotly and gguf can come as wheels (docs/deploy.md, "A GPU check").
"""
from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, LlamaConfig  # noqa: E402

from engine.core.forward import BUCKETS, REGISTRY  # noqa: E402
from engine.core.paths import make_path, path_names  # noqa: E402
from engine.decoding.config import DecodeConfig  # noqa: E402
from engine.product.bench.aggregate import decode_rate, decode_tau, run_limit  # noqa: E402
from engine.product.models.forward_choice import measure  # noqa: E402
from engine.product.models.loading import load_model  # noqa: E402
from engine.product.runs.decoder import make_decoder  # noqa: E402
from engine.product.runs.metrics import summarize  # noqa: E402

#: SmolLM2-135M-Instruct's architecture (its config.json): what a random-weight model needs to time its T(n).
SMOLLM2 = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
               num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192, rope_theta=100000.0,
               rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
PROMPT = 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'


def paths_here(model) -> dict:
    """The forward paths to compare on ``model``'s device: every registered path that can run it here (``REGISTRY``:
    eager, static, and graphed on CUDA; the compiled one is left out: minutes of compiling)."""
    return {name: make_path(model, name) for name in path_names()
            if name != "compiled" and REGISTRY[name].problem(model) is None}


def cost_curves(device: str, rounds: int) -> dict:
    """T(n) in ms at ``BUCKETS`` per path on a random-weight SmolLM2-shaped model, and each path's first forward."""
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    model = AutoModelForCausalLM.from_config(LlamaConfig(**SMOLLM2), dtype=dtype).to(device).eval()
    first: dict = {}
    ms = measure(model, paths_here(model), BUCKETS, repeats=rounds, first=first)
    return {"model": "random weights, SmolLM2-135M's configuration", "dtype": str(dtype).removeprefix("torch."),
            "sizes": list(BUCKETS), "ms": ms,
            "first_s": {f"{name}/{n}": round(s, 3) for (name, n), s in first.items()}}


def shape_ar(device: str, tokens: int) -> dict:
    """AR tokens per second per path on the random-weight SmolLM2-shaped model (a step's time does not depend on
    the weights; no EOS is taken, so every run makes ``tokens``), over a 64-token prompt."""
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    model = AutoModelForCausalLM.from_config(LlamaConfig(**SMOLLM2), dtype=dtype).to(device).eval()
    ids = torch.randint(3, SMOLLM2["vocab_size"], (64,)).tolist()
    out = {}
    for name, path in paths_here(model).items():
        decoder = make_decoder(model, DecodeConfig(method="ar", max_new_tokens=tokens), (), forward=path)
        list(decoder.generate(ids))  # warm-up: captures, cost curve
        rates = [decode_rate(bench_run(list(decoder.generate(ids)))) for _ in range(3)]
        out[name] = round(sorted(rates)[1], 1)
    return out


def bench_run(traces: list) -> dict:
    """One run as the bench records it (its tokens, seconds, prefill seconds and summary), for the bench's own
    decode-phase rate and limit (``decode_rate``, ``run_limit``)."""
    s = summarize(traces)
    return {"tokens": [t for c in traces for t in c.new_tokens], "seconds": s.seconds, "prefill_s": s.prefill_s,
            "summary": s}


def runs(lm, tokens: int) -> dict:
    """Per path: AR and Goose greedy over ``PROMPT``: tokens per second end to end and in the decode phase, the
    same tokens as ``generate(do_sample=False)`` or not, draft tokens accepted; for Goose also its decode speedup
    over AR, its limit τ·T(1)/T(n̄) on the curve it read, and the speedup's share of that limit."""
    ids = lm.encode_prompt(PROMPT, chat=False)
    model = lm.model
    reference = model.generate(torch.tensor([ids], device=model.device), do_sample=False, max_new_tokens=tokens,
                               pad_token_id=0, eos_token_id=None)[0, len(ids):].tolist()
    out = {}
    for name, path in paths_here(model).items():
        for method in ("ar", "goose"):
            config = DecodeConfig(method=method, max_new_tokens=tokens)
            decoder = make_decoder(model, config, (), forward=path)
            list(decoder.generate(ids))  # warm-up: captures, cost curve
            start = time.perf_counter()
            traces = list(decoder.generate(ids))
            took = time.perf_counter() - start
            run = bench_run(traces)
            rate, curve = decode_rate(run), decoder.cost_curve
            row = out[f"{name}/{method}"] = {
                "tok_s": round(len(run["tokens"]) / took, 1), "decode_tok_s": round(rate, 1),
                "same_as_generate": run["tokens"] == reference, "accepted": sum(len(c.accepted) for c in traces)}
            limit = run_limit(run, curve)  # τ·T(1)/T(n̄) of the decode phase; None without decoding cycles
            if method == "goose" and limit is not None:
                speedup = rate / out[f"{name}/ar"]["decode_tok_s"]
                row.update(tau=round(decode_tau(run), 2),
                           rows=round(run["summary"].mean_forward_rows, 1), decode_speedup=round(speedup, 2),
                           limit=round(limit, 2), of_limit=round(speedup / limit, 2),
                           curve_ms=dict(zip(curve.nodes, curve.ms)),  # as measured, before monotone smoothing
                           curve_spread=dict(zip(curve.nodes, curve.spread or ())))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", default="gpu_check.json")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--skip-tests", action="store_true")
    ap.add_argument("--smollm2", action="store_true", help="also SmolLM2's real weights (fetched when not cached)")
    args = ap.parse_args(argv)
    report: dict = {"device": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else platform.processor()
                    or platform.machine(), "torch": torch.__version__,
                    "transformers": __import__("transformers").__version__}
    if not args.skip_tests:
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rfE", "--full", "tests/test_cuda.py",
                               "tests/test_forward.py"], cwd=ROOT, capture_output=True, text=True)
        lines = done.stdout.strip().splitlines() or [""]
        report["tests"] = {"exit": done.returncode, "summary": lines[-1],
                           "failed": [line for line in lines if line.startswith(("FAILED", "ERROR"))]}
        print("tests:", report["tests"]["summary"], flush=True)
    report["cost_curves"] = cost_curves(args.device, args.rounds)
    for name, row in report["cost_curves"]["ms"].items():
        print(f"T(n) {name}: " + ", ".join(f"{n}: {t:.2f}" for n, t in zip(BUCKETS, row)), flush=True)
    report["smollm2_shape_ar_tok_s"] = shape_ar(args.device, 128)
    print("SmolLM2-shaped AR tok/s:", report["smollm2_shape_ar_tok_s"], flush=True)
    models = ["demo"] + (["smollm2"] if args.smollm2 else [])
    report["runs"] = {}
    for name in models:
        lm = load_model(name, device=args.device, dtype="fp32")  # the eager path
        report["runs"][name] = runs(lm, args.tokens)
        print(name, json.dumps(report["runs"][name]), flush=True)
    Path(args.out).write_text(json.dumps(report, indent=1), encoding="utf-8")
    print(f"written {args.out}")
    return 0 if report.get("tests", {}).get("exit", 0) in (0, 5) else 1


if __name__ == "__main__":
    sys.exit(main())
