"""Benchmark: every method on the same prompts, AR measured in the same run, medians reported.

    python -m cli.bench [--model M] [--datasets humaneval,mbpp,gsm8k,mt_bench] [--limit 20]
        [--max-new-tokens 128] [--methods ar,pld,tr,iso3,iso5,goose,hf-ar,hf-pld] [--budget 60]
        [--gt-threshold auto|C] [--device cpu] [--dtype auto] [--draft-model D] [--data DIR]
        [--profile] [--repeats N] [--out DIR]

Methods: the engine's own (``ar``, ``pld``, ``tr``, ``iso3``, ``iso5``, ``goose``: one decoding
loop) and transformers' ``model.generate`` as peers: ``hf-ar`` (plain greedy), ``hf-pld``
(``prompt_lookup_num_tokens=10``) and ``hf-assisted`` (``assistant_model``, needs ``--draft-model``).

Prompts come from the data directory; HumanEval goes in as raw completion prompts, the other datasets
through the chat template when the tokenizer has one (``DATASETS``); all
methods get the same prompts and lengths; a warm-up runs first; the method order rotates per prompt
so machine drift hits all alike; with ``--repeats N`` every method runs N times per prompt, the order rotating
each time, and its fastest run counts.  Every method's token ids are checked against ``ar``'s; a mismatch
is printed loudly and marks the row ``lossless: false`` (exit status 1), with a diagnosis: where the
sequences part and whether the target's two logits there are an exact floating-point tie.

Writes to ``--out``: ``results.json`` (meta + one row per method x dataset), ``results.md`` (the
paper's Table 3 shape plus details), ``report.html`` (plotly figures) and, with ``--profile``,
``profile.jsonl`` (every cycle's stage timings).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple

import torch

from engine.core import compat
from engine.decoding.compiled_cycle import KERNELS
from engine.decoding.config import ConfigError, DecodeConfig
from engine.decoding.cost import CostCurve, CostCurveError, load_cost_curve
from engine.product.bench.aggregate import add_synergy, aggregate, head_to_head
from engine.product.bench.llamacpp import METHODS as LLAMACPP_METHODS
from engine.product.bench.llamacpp import LlamaCpp, LlamaCppMissing, check_installed
from engine.product.bench.markdown import to_markdown
from engine.product.bench.methods import DEFAULT_METHODS, FP32_AR, parse_methods
from engine.product.bench.prompts import DEFAULT_DATA, BenchError, load_prompts
from engine.product.bench.runner import Runner, run_dataset
from engine.product.io.options import add_config_options, add_model_options, config_from_args
from engine.product.models.loading import load_model, with_forward
from engine.product.models.model_source import ModelLoadError, resolve
from engine.product.models.named import ensure_gguf
from viz.bench_report import report_html


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        setup = _setup(args)
    except (BenchError, ConfigError, CostCurveError, ModelLoadError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    methods, lm = setup.methods, setup.lm
    if setup.fp32 is not None:
        methods.append(FP32_AR)
    run = Runner(lm, args, setup.base, setup.draft, setup.curve, setup.fp32)
    run.peer = setup.peer
    KERNELS.warm()  # the compiled cycle's kernels: compiled once per checkout (about 45 s), loaded after
    print(f"model: {lm.summary()}", file=sys.stderr)
    for m in methods:  # warm-up
        run(m, lm.encode_prompt("def warm_up(x):\n    return x\n"))
    rows, profile = [], []
    for dataset, texts in setup.prompts.items():
        runs = run_dataset(run, methods, dataset, texts, profile)
        rows += [aggregate(m, dataset, runs[m], runs["ar"], runs.get(FP32_AR), run.curve) for m in methods]
    add_synergy(rows)
    meta = _meta(args, argv, setup, run.curve)
    write_outputs(args.out, meta, rows, profile)
    print(to_markdown(rows, meta))
    return 0 if all(r["lossless"] for r in rows) else 1  # precision ties are reported, only bugs fail


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m cli.bench", description=__doc__.splitlines()[0])
    add_model_options(ap, device="cpu")
    ap.add_argument("--draft-model", default=None, help="draft model for hf-assisted")
    ap.add_argument("--attn", default=None, choices=("sdpa", "eager", "tree_sdpa"),
                    help="attention kernel (default: the loader's; sdpa names transformers' own, tree_sdpa ours)")
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA,
                    help="folder of prompt sets laid out as assets/datasets (default: the sets the project ships)")
    ap.add_argument("--datasets", default="humaneval,mbpp,gsm8k,mt_bench")
    ap.add_argument("--limit", type=int, default=20, help="prompts per dataset")
    ap.add_argument("--methods", default=DEFAULT_METHODS, help="the methods to run, comma-separated; each runs "
                    "the settings of the options below changed by its own (method_config; goose+X: the default "
                    "sources and X)")
    add_config_options(ap, method=False)  # the generate CLI's settings: --budget, --gt-threshold, --cost-curve, ...
    ap.add_argument("--profile", action="store_true", help="also write every cycle's stage timings (profile.jsonl)")
    ap.add_argument("--same-session", action="store_true",
                    help="run each dataset's prompts as one user's session: what sources keep across requests "
                         "(the suffix tree of earlier outputs) carries over from prompt to prompt")
    ap.add_argument("--fp32-ar", action="store_true",
                    help="also time AR on an fp32 copy of the model (row 'ar-fp32', column 'vs fp32 AR'): the exact "
                         "mode's speed, when the run's dtype is another")
    ap.add_argument("--repeats", type=int, default=1,
                    help="runs of every method per prompt, the method order rotating each time; the fastest (wall "
                         "time) is the one reported, so the machine's drift weighs less between close methods")
    ap.add_argument("--out", type=Path, default=Path("results") / dt.datetime.now().strftime("%Y%m%d-%H%M%S"))
    return ap


class _Setup(NamedTuple):
    """What the bench's arguments load: the methods, the settings, the prompts, the cost curve and the models."""

    methods: list[str]
    base: DecodeConfig
    prompts: dict[str, list[str]]
    curve: CostCurve | None
    lm: Any
    draft: Any
    fp32: Any
    peer: LlamaCpp | None  # llama.cpp on the model's GGUF file (llamacpp-* methods), else None


def _setup(args: argparse.Namespace) -> _Setup:
    """Check the arguments, read the prompts and the cost curve, load the models.

    Raises:
        BenchError, ConfigError, CostCurveError, ModelLoadError: the message says what to change.
    """
    methods = parse_methods(args.methods, args.draft_model)
    base = config_from_args(args)
    if args.repeats < 1:
        raise BenchError(f"--repeats must be at least 1 (got {args.repeats})")
    if args.repeats > 1 and args.same_session:
        raise BenchError("--repeats with --same-session would let a method's later runs draft from its own "
                         "earlier output of the same prompt: choose one")
    prompts = {d: load_prompts(args.data, d, args.limit) for d in args.datasets.split(",") if d}
    curve = load_cost_curve(args.cost_curve) if args.cost_curve else None
    peer = _llamacpp(args.model) if any(m in LLAMACPP_METHODS for m in methods) else None  # before the loads
    attn = {"attn_implementation": args.attn}
    lm = with_forward(load_model(args.model, device=args.device, dtype=args.dtype, **attn), args.forward)
    draft = load_model(args.draft_model, device=args.device, dtype=args.dtype, **attn) if args.draft_model else None
    fp32 = load_model(args.model, device=args.device, dtype="fp32", **attn) if args.fp32_ar else None
    return _Setup(methods, base, prompts, curve, lm, draft, fp32, peer)


def _llamacpp(model: str | None) -> LlamaCpp:
    """llama.cpp on the GGUF file of the bench's model, with torch's thread count and an 8,192-token context.

    Raises:
        BenchError: llama-cpp-python is missing (how to install it), or the model has no GGUF file.
    """
    src = resolve(model)
    if not src.fetch and not str(src.path).endswith(".gguf"):
        raise BenchError(f"llama.cpp methods need a GGUF model (smollm2, or a .gguf file); {src.name!r} is not one")
    try:
        check_installed()
    except LlamaCppMissing as exc:
        raise BenchError(str(exc)) from None
    gguf = ensure_gguf(src.fetch) if src.fetch else Path(src.path)
    try:
        return LlamaCpp(gguf, torch.get_num_threads(), 8192)
    except ValueError as exc:  # llama-cpp-python could not load the file
        raise BenchError(f"llama.cpp could not load {src.name!r}: {exc}") from None



def _meta(args: argparse.Namespace, argv: list[str] | None, setup: _Setup, curve: CostCurve | None) -> dict:
    """``results.json``'s meta: the model, the machine, the versions, the command and the run's settings."""
    lm, base, prompts = setup.lm, setup.base, setup.prompts
    return {"model": lm.name, "draft_model": args.draft_model, "device": args.device, **lm.runs.to_dict(),
            "dtype_reason": lm.dtype_reason, "forward": lm.forward.name, "forward_reason": lm.forward_reason,
            "attention": compat.attention_kernel(lm.model.config),
            "torch": torch.__version__, "transformers": __import__("transformers").__version__,
            "python": platform.python_version(), "cpu_threads": torch.get_num_threads(),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "date": dt.datetime.now().isoformat(timespec="seconds"),
            "command": "python -m cli.bench " + " ".join(argv if argv is not None else sys.argv[1:]),
            "git_commit": _git_commit(), "max_new_tokens": base.max_new_tokens, "budget": base.tree.budget,
            "gt_threshold": base.gt.threshold, "same_session": args.same_session, "repeats": args.repeats,
            "cost_curve": curve.to_dict() if curve is not None else None,
            "datasets": {d: len(t) for d, t in prompts.items()}, "methods": setup.methods}



def write_outputs(out: Path, meta: dict, rows: list[dict], profile: list[dict]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows, "head_to_head": head_to_head(rows)},
                                                 indent=2) + "\n")
    (out / "results.md").write_text(to_markdown(rows, meta))
    (out / "report.html").write_text(report_html(rows, meta), encoding="utf-8")
    if profile:
        (out / "profile.jsonl").write_text("".join(json.dumps(c) + "\n" for c in profile))


def _git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent).stdout.strip() or None
    except OSError:
        return None


if __name__ == "__main__":
    sys.exit(main())
