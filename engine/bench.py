"""Benchmark: every method on the same prompts, AR measured in the same run, medians reported.

    python -m engine.bench [--model M] [--datasets humaneval,mt_bench] [--limit 20] [--max-new-tokens 128]
        [--methods ar,pld,tr,goose,hf-ar,hf-pld] [--budget 60] [--device cpu] [--out results/DIR]

Methods: the engine's own (``ar``, ``pld``, ``tr``, ``goose``: one decoding loop) and transformers'
``model.generate`` as peers: ``hf-ar`` (plain greedy) and ``hf-pld`` (``prompt_lookup_num_tokens=10``).
Methods run interleaved per prompt (machine drift hits all alike) after a warm-up.  Every method's
token ids are checked against ``ar``'s; a mismatch is reported loudly and marks the row.
Writes ``results.json`` (meta + one row per method x dataset) and ``results.md``.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from .config import METHODS, DecodeConfig
from .decode import SpecDecoder
from .loading import load_model
from .metrics import summarize

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
DATASETS = {  # name -> (file, how to get the prompt text from a record)
    "humaneval": ("humaneval/HumanEval.jsonl", lambda r: r["prompt"]),
    "mbpp": ("mbpp/mbpp.jsonl", lambda r: r["text"]),
    "gsm8k": ("gsm8k/test.jsonl", lambda r: r["question"]),
    "mt_bench": ("mt_bench/question.jsonl", lambda r: r["turns"][0]),
}
HF_METHODS = {"hf-ar": {}, "hf-pld": {"prompt_lookup_num_tokens": 10}}


def load_prompts(data_dir: Path, dataset: str, limit: int) -> list[str]:
    if dataset not in DATASETS:
        raise SystemExit(f"error: unknown dataset {dataset!r}; choose from {', '.join(DATASETS)}")
    rel, get = DATASETS[dataset]
    path = data_dir / rel
    if not path.exists():
        raise SystemExit(f"error: {path} not found (set --data to the folder holding the benchmark files)")
    lines = [ln for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()][:limit]
    return [get(json.loads(ln)) for ln in lines]


def run_engine(lm, method: str, prompt_ids: list[int], args) -> dict:
    config = DecodeConfig(method=method, max_new_tokens=args.max_new_tokens, budget=args.budget)
    traces = list(SpecDecoder(lm.model, config, lm.eos_token_ids).generate(prompt_ids))
    s = summarize(traces)
    return {"tokens": [t for tr in traces for t in tr.new_tokens], "seconds": s.seconds, "forwards": s.forwards,
            "by_source": s.accepted_by_source, "paths": s.paths, "overhead_ms": s.median_overhead_ms,
            "forward_ms": s.median_forward_ms, "drafted": s.drafted}


@torch.no_grad()
def run_hf(lm, method: str, prompt_ids: list[int], args) -> dict:
    eos = list(lm.eos_token_ids) or None
    ids = torch.tensor([prompt_ids], device=lm.model.device)
    t0 = time.perf_counter()
    out = lm.model.generate(ids, do_sample=False, max_new_tokens=args.max_new_tokens, eos_token_id=eos,
                            pad_token_id=eos[0] if eos else None, **HF_METHODS[method])
    if lm.model.device.type == "cuda":
        torch.cuda.synchronize()
    return {"tokens": out[0, len(prompt_ids):].tolist(), "seconds": time.perf_counter() - t0}


def aggregate(method: str, dataset: str, runs: list[dict], ar_runs: list[dict]) -> dict:
    new_tokens = sum(len(r["tokens"]) for r in runs)
    seconds = sum(r["seconds"] for r in runs)
    per_prompt_tps = [len(r["tokens"]) / r["seconds"] for r in runs]
    per_prompt_speedup = [len(r["tokens"]) / r["seconds"] / (len(a["tokens"]) / a["seconds"])
                          for r, a in zip(runs, ar_runs)]
    row = {"method": method, "dataset": dataset, "n_prompts": len(runs), "new_tokens": new_tokens,
           "tok_per_s": new_tokens / seconds, "median_tok_per_s": statistics.median(per_prompt_tps),
           "speedup_vs_ar": statistics.median(per_prompt_speedup),
           "lossless": all(r["tokens"] == a["tokens"] for r, a in zip(runs, ar_runs))}
    if "forwards" in runs[0]:
        by_source = {k: sum(r["by_source"][k] for r in runs) for k in runs[0]["by_source"]}
        pld, tr = ([sum(r["drafted"][src][i] for r in runs) for i in (0, 1)] for src in ("pld", "tr"))
        paths = {}
        for r in runs:
            for k, v in r["paths"].items():
                paths[k] = paths.get(k, 0) + v
        row.update(tau=new_tokens / sum(r["forwards"] for r in runs), accepted_by_source=by_source,
                   p_s=pld[0] / pld[1] if pld[1] else None, p_t=tr[0] / tr[1] if tr[1] else None,
                   path_cycles=paths, median_overhead_ms=statistics.median(r["overhead_ms"] for r in runs),
                   median_forward_ms=statistics.median(r["forward_ms"] for r in runs))
    return row


def to_markdown(rows: list[dict], meta: dict) -> str:
    lines = [f"# goose-lens benchmark — {meta['model']} on {meta['device']}", "",
             f"`{meta['command']}`  ({meta['date']}, {meta['max_new_tokens']} new tokens, B = {meta['budget']})", "",
             "| method | dataset | prompts | τ | tok/s | median speedup vs AR | p_s | p_t | overhead ms/cycle | lossless |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    fmt = lambda v, f="{:.2f}": "–" if v is None else f.format(v)  # noqa: E731
    for r in rows:
        lines.append(f"| {r['method']} | {r['dataset']} | {r['n_prompts']} | {fmt(r.get('tau'))} | "
                     f"{r['tok_per_s']:.1f} | {r['speedup_vs_ar']:.2f} | {fmt(r.get('p_s'))} | {fmt(r.get('p_t'))} | "
                     f"{fmt(r.get('median_overhead_ms'))} | {'yes' if r['lossless'] else '**NO**'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m engine.bench", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--datasets", default="humaneval,mt_bench")
    ap.add_argument("--limit", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--methods", default="ar,pld,tr,goose,hf-ar,hf-pld")
    ap.add_argument("--budget", type=int, default=60)
    ap.add_argument("--out", type=Path, default=Path("results") / dt.datetime.now().strftime("%Y%m%d-%H%M%S"))
    args = ap.parse_args(argv)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if m not in METHODS and m not in HF_METHODS]
    if unknown:
        print(f"error: method(s) not implemented: {', '.join(unknown)}", file=sys.stderr)
        return 2
    if "ar" not in methods:
        methods.insert(0, "ar")  # the baseline is always measured in the same run
    lm = load_model(args.model, device=args.device, dtype=args.dtype)
    run = lambda m, ids: (run_hf if m in HF_METHODS else run_engine)(lm, m, ids, args)  # noqa: E731
    for m in methods:  # warm-up
        run(m, lm.encode_prompt("def warm_up(x):\n    return x\n"))
    rows = []
    for dataset in args.datasets.split(","):
        prompts = load_prompts(args.data, dataset, args.limit)
        runs = {m: [] for m in methods}
        for k, prompt in enumerate(tqdm(prompts, desc=dataset)):
            ids = lm.encode_prompt(prompt)
            order = methods[k % len(methods):] + methods[: k % len(methods)]  # rotate: no method always first
            for m in order:
                runs[m].append(run(m, ids))
            for m in methods:
                if runs[m][-1]["tokens"] != runs["ar"][-1]["tokens"]:
                    print(f"LOSSLESS VIOLATION: {m} on {dataset} prompt {k}", file=sys.stderr)
        rows += [aggregate(m, dataset, runs[m], runs["ar"]) for m in methods]
    meta = {"model": lm.name, "device": args.device, "dtype": str(lm.dtype), "torch": torch.__version__,
            "transformers": __import__("transformers").__version__, "python": platform.python_version(),
            "cpu_threads": torch.get_num_threads(), "date": dt.datetime.now().isoformat(timespec="seconds"),
            "command": "python -m engine.bench " + " ".join(argv if argv is not None else sys.argv[1:]),
            "git_commit": _git_commit(), "max_new_tokens": args.max_new_tokens, "budget": args.budget}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    (args.out / "results.md").write_text(to_markdown(rows, meta))
    print(to_markdown(rows, meta))
    return 0 if all(r["lossless"] for r in rows) else 1


def _git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent).stdout.strip() or None
    except OSError:
        return None


if __name__ == "__main__":
    sys.exit(main())
