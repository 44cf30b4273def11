"""Benchmark: every method on the same prompts, AR measured in the same run, medians reported.

    python -m engine.product.bench [--model M] [--datasets humaneval,mbpp,gsm8k,mt_bench] [--limit 20]
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
import math
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

import torch
from tqdm import tqdm
from transformers.generation.streamers import BaseStreamer

from .. import ASSETS
from ..core import compat
from ..decoding.config import FLAT_NAMES, METHODS, PRESETS, ConfigError, DecodeConfig, parse_gt_threshold
from ..decoding.cost import CostCurve, CostCurveError, load_cost_curve
from ..decoding.trace import TIMING_KEYS
from ..sources import SourceMemory
from .decoding import make_decoder
from .generate import add_config_options, config_from_args
from .llamacpp import METHODS as LLAMACPP_METHODS
from .llamacpp import LlamaCpp, LlamaCppMissing, check_installed
from .loading import ModelLoadError, add_model_options, load_model, resolve, with_forward
from .lossless import attribute, engine_ar_logits
from .metrics import summarize
from .models import ensure_gguf
from .report import report_html

#: the prompt sets shipped with the project (whole files, each with its LICENSE and SOURCE.md); ``--data DIR``
#: reads another folder of the same layout and formats
DEFAULT_DATA = ASSETS / "datasets"
DATASETS = {  # name -> (file, how to get the prompt text from a record, prompt format)
    "humaneval": ("humaneval/HumanEval.jsonl", lambda r: r["prompt"], "raw"),  # code to complete
    "mbpp": ("mbpp/mbpp.jsonl", lambda r: r["text"], "chat"),  # instructions ("Write a function ...")
    "gsm8k": ("gsm8k/test.jsonl", lambda r: r["question"], "chat"),
    "mt_bench": ("mt_bench/question.jsonl", lambda r: r["turns"][0], "chat"),
    # MT-Bench second turns, the model's own (greedy) first answer in context: where suffix drafting copies
    "mt_bench2": ("mt_bench/question.jsonl", lambda r: r["turns"][:2], "chat"),
}
HF_METHODS = {"hf-ar": {}, "hf-pld": {"prompt_lookup_num_tokens": 10}, "hf-assisted": {}}
#: Engine method variants: "goose+ptd" = goose with PTD added to its sources; a trailing "@pld>tr>ptd"
#: sets the walk priority (e.g. "goose+ptd@ptd>pld>tr", used by the PTD priority experiment); a trailing
#: "/c=X" sets that method's GT threshold (auto | chord | a number), e.g. "goose/c=0" (the GT A/B); "-paper"
#: starts from a named preset (``config.PRESETS``: "goose-paper", "pld-paper", "iso3-paper"); each trailing
#: ":field=value" sets one DecodeConfig field, the value read as JSON when it parses, else as a string
#: (e.g. "goose:match_occurrence=latest:bypass=false", "goose-paper/c=auto:branch_growth=best-first").
DEFAULT_METHODS = "ar,pld,tr,iso3,iso5,goose,hf-ar,hf-pld"
FP32_AR = "ar-fp32"  # AR on an fp32 copy of the model (``--fp32-ar``): the exact mode's speed, for reference


class BenchError(Exception):
    """Bad benchmark arguments or inputs; the message says what to change."""


def load_prompts(data_dir: Path, dataset: str, limit: int) -> list[str]:
    if dataset not in DATASETS:
        raise BenchError(f"unknown dataset {dataset!r}; choose from {', '.join(DATASETS)}")
    rel, get, _ = DATASETS[dataset]
    path = data_dir / rel
    if not path.exists():
        raise BenchError(f"{path} not found (--data takes a folder laid out as assets/datasets, e.g. {rel})")
    lines = [ln for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()][:limit]
    return [get(json.loads(ln)) for ln in lines]


def parse_methods(text: str, draft_model: str | None) -> list[str]:
    methods = list(dict.fromkeys(m.strip() for m in text.split(",") if m.strip()))
    for m in methods:
        if m not in HF_METHODS and m not in LLAMACPP_METHODS:
            method_config(m)  # raises BenchError on an unknown method or variant
    if "hf-assisted" in methods and not draft_model:
        raise BenchError("method 'hf-assisted' needs --draft-model (a small model sharing the target's tokenizer)")
    return ["ar"] + [m for m in methods if m != "ar"]  # AR is always measured in the same run


def method_config(name: str) -> dict:
    """``DecodeConfig`` settings (flat names) of an engine method name: 'goose', 'goose+ptd', 'goose+ptd@ptd>pld>tr',
    'goose-paper', 'goose/c=0', 'goose:budget=16', 'vllm-ngram:vllm_prompt_lookup_min=2', ...

    Raises:
        BenchError: unknown method, source or priority.
    """
    head, *assignments = name.split(":")
    variant, _, threshold = head.partition("/c=")
    spec, _, priority = variant.partition("@")
    base, _, preset = spec.rpartition("-")  # 'goose-paper'; a method's own hyphen ('vllm-ngram') is no preset
    spec, preset = (base, preset) if base and preset in PRESETS else (spec, "")
    method, *extra = spec.split("+")
    if method not in METHODS or (preset and preset not in PRESETS):
        raise BenchError(f"unknown method {name!r}; choose from {', '.join(METHODS + tuple(HF_METHODS))} "
                         "(engine methods take +ptd / +pld / +tr, @a>b>c, /c=X, -preset and :field=value variants)")
    fields: dict = {**PRESETS[preset or "default"], "method": method}
    if extra:
        fields["sources"] = tuple(dict.fromkeys((*DecodeConfig().sources, *extra)))
    if priority:
        fields["walk_priority"] = tuple(priority.split(">"))
    for assignment in assignments:
        key, eq, value = assignment.partition("=")
        if not eq or key not in FLAT_NAMES:
            raise BenchError(f"method {name!r}: {assignment!r} is not name=value with a DecodeConfig setting")
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            parsed = value
        fields[key] = tuple(parsed) if isinstance(parsed, list) else parsed
    try:
        if threshold:
            fields["gt_threshold"] = parse_gt_threshold(threshold)
        DecodeConfig.of(**fields)
    except (TypeError, ValueError) as exc:  # a ":field=value" of the wrong type fails in the checks
        raise BenchError(f"method {name!r}: {exc}") from None
    return fields


class Runner:
    """Runs one method on one prompt and returns a flat record."""

    def __init__(self, lm, args, base: DecodeConfig, draft=None, curve: CostCurve | None = None, fp32=None) -> None:
        self.lm, self.args, self.draft = lm, args, draft
        self.base = base  # the settings every engine method starts from (the CLI's options)
        self.fp32 = fp32  # the model in fp32, for the "ar-fp32" row (the exact mode's AR), or None
        self.curve = curve  # the cost curve every method reads; None: the cached curve, on first use
        self.sessions: dict[str, SourceMemory] = {}  # --same-session: each method's memory across a dataset
        self.peer: LlamaCpp | None = None  # llama.cpp on the same GGUF file, for the llamacpp-* methods

    def new_session(self) -> None:
        """Forget what sources kept across requests (a new dataset starts a new session)."""
        self.sessions = {}

    def __call__(self, method: str, prompt_ids: list[int]) -> dict:
        if method in LLAMACPP_METHODS:
            return self.peer.run(method, prompt_ids, self.args.max_new_tokens, self.lm.eos_token_ids)
        return self.hf(method, prompt_ids) if method in HF_METHODS else self.engine(method, prompt_ids)

    def engine(self, method: str, prompt_ids: list[int]) -> dict:
        if method == FP32_AR:  # the exact mode's AR on its own fp32 copy: the "old default" tok/s reference
            config = DecodeConfig.of(method="ar", max_new_tokens=self.args.max_new_tokens)
            traces = list(make_decoder(self.fp32, config, self.lm.eos_token_ids).generate(prompt_ids))
            s = summarize(traces)
            return {"tokens": [t for tr in traces for t in tr.new_tokens], "seconds": s.seconds,
                    "prefill_s": s.prefill_s}
        config = self.base.with_(**method_config(method))  # the method's own settings win (a "/c=" variant too)
        memory = self.sessions.setdefault(method, SourceMemory()) if self.args.same_session else None
        decoder = make_decoder(self.lm, config, self.lm.eos_token_ids, cost_curve=self.curve, memory=memory,
                              profile=self.args.profile)  # --profile on CUDA: each stage waits for its kernels
        self.curve = self.curve or decoder.cost_curve  # every method of the run reads the same curve
        traces = list(decoder.generate(prompt_ids))
        s = summarize(traces)
        record = {"tokens": [t for tr in traces for t in tr.new_tokens], "seconds": s.seconds,
                  "prefill_s": s.prefill_s, "forwards": s.forwards, "summary": s,
                  "gt_threshold": decoder.config.gt.threshold}
        if self.args.profile:
            record["cycles"] = [{"cycle": t.index, "mode": t.mode, "nodes": len(t.tree), "tokens": len(t.new_tokens),
                                 **dict(t.timings_ms)} for t in traces]
        return record

    @torch.no_grad()
    def hf(self, method: str, prompt_ids: list[int]) -> dict:
        eos = list(self.lm.eos_token_ids) or None
        kwargs = dict(HF_METHODS[method])
        if method == "hf-assisted":
            kwargs["assistant_model"] = self.draft.model
        ids = torch.tensor([prompt_ids], device=self.lm.model.device)
        clock = FirstTokenClock()
        out = self.lm.model.generate(ids, do_sample=False, max_new_tokens=self.args.max_new_tokens, eos_token_id=eos,
                                     pad_token_id=eos[0] if eos else None, streamer=clock, **kwargs)
        if self.lm.model.device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - clock.start
        return {"tokens": out[0, len(prompt_ids):].tolist(), "seconds": seconds,
                "prefill_s": clock.first_token_s or seconds}


class FirstTokenClock(BaseStreamer):
    """A transformers streamer that only notes when ``generate`` emits its first new token: the end of the
    prefill, so HF's rows get the same decode-phase timing as the engine's (``RunSummary.prefill_s``)."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.calls = 0
        self.first_token_s: float | None = None

    def put(self, value) -> None:  # first call: the prompt; second: the first generated token
        self.calls += 1
        if self.calls == 2:
            self.first_token_s = time.perf_counter() - self.start

    def end(self) -> None:
        pass


def _rate(run: dict) -> float:
    """End-to-end tokens/s of one run (prefill included)."""
    return len(run["tokens"]) / run["seconds"]


def decode_rate(run: dict) -> float:
    """Decode-phase tokens/s of one run: the tokens after the prefill's first one, over the time after the prefill."""
    return (len(run["tokens"]) - 1) / max(run["seconds"] - run["prefill_s"], 1e-9)


def aggregate(method: str, dataset: str, runs: list[dict], ar_runs: list[dict], fp32_runs: list[dict] | None = None,
              curve: CostCurve | None = None) -> dict:
    """One results row: totals, medians over prompts, and for engine methods the draft statistics.

    Speedups are medians over prompts of the ratio to AR on the same prompt in the same run: end to end
    (``speedup_vs_ar``) and in the decode phase, prefill excluded (``decode_speedup``); ``vs_fp32_ar``
    compares tokens/s with AR on an fp32 copy (``--fp32-ar``).  An engine method's ``limit`` is what its τ
    allows at its tree sizes on the cost curve, τ·T(1)/T(n̄) in the decode phase (n̄: mean forward rows), pooled
    over the prompts; ``of_limit`` is the median over prompts of each prompt's decode-phase speedup over that
    prompt's own limit (``run_limit``): a median speedup set against a pooled limit would mix two statistics,
    and prompts differ in τ several-fold (one HumanEval prompt copies at τ 7, the next at 1.3).
    ``of_limit_pooled`` is that mixed ratio, the median speedup over the pooled limit, kept for comparison with
    results taken before 2026-11-23.  ``eta`` (η) is the decode-phase speedup over τ: the share of τ that became
    speed (1 for AR; below 1 as forwards of many rows and the engine's own work cost more than a one-token step).
    ``decode_speedups`` lists every prompt's decode-phase speedup (None where it or AR wrote one token), in prompt
    order, for ``head_to_head``; ``prompts`` lists each prompt's decode speedup, τ, n̄ and limit.
    ``lossless`` is True when no divergence from AR is a bug (precision ties are counted apart).
    """
    row = _timing_row(method, dataset, runs, ar_runs, fp32_runs)
    if "summary" not in runs[0]:
        return row
    row.update(_draft_stats(runs))
    if row["decode_speedup"] is not None:
        row["eta"] = row["decode_speedup"] / row["tau"]  # η = decode-phase speedup / τ
    if curve is not None:
        _add_limits(row, runs, ar_runs, curve)
    return row


def _timing_row(method: str, dataset: str, runs: list[dict], ar_runs: list[dict],
                fp32_runs: list[dict] | None) -> dict:
    """``aggregate``'s row for every method: totals, speedups over AR (medians over prompts), the lossless check."""
    new_tokens = sum(len(r["tokens"]) for r in runs)
    seconds = sum(r["seconds"] for r in runs)
    ratio = lambda rate, refs: statistics.median(rate(r) / rate(a) for r, a in zip(runs, refs))  # noqa: E731
    kinds = [r["divergence"]["kind"] for r in runs if "divergence" in r]
    decode = [decode_rate(r) / decode_rate(a) if min(len(r["tokens"]), len(a["tokens"])) > 1 else None
              for r, a in zip(runs, ar_runs)]  # per prompt; None where it or AR wrote one token (no decode phase)
    row = {"method": method, "dataset": dataset, "n_prompts": len(runs), "new_tokens": new_tokens,
           "tok_per_s": new_tokens / seconds, "median_tok_per_s": statistics.median(_rate(r) for r in runs),
           "speedup_vs_ar": ratio(_rate, ar_runs),
           "decode_speedup": None if None in decode else statistics.median(decode), "decode_speedups": decode,
           "vs_fp32_ar": ratio(_rate, fp32_runs) if fp32_runs else None,
           "median_prefill_ms": 1000 * statistics.median(r["prefill_s"] for r in runs),
           "median_decode_tok_per_s": statistics.median(decode_rate(r) for r in runs),
           "same_text_as_ar": sum(r["tokens"] == a["tokens"] for r, a in zip(runs, ar_runs)),
           "ties": kinds.count("precision tie"), "bugs": kinds.count("bug") + kinds.count("length"),
           "lossless": not (kinds.count("bug") + kinds.count("length")),
           "divergences": [r["divergence"] for r in runs if "divergence" in r]}
    return row


def _draft_stats(runs: list[dict]) -> dict:
    """``aggregate``'s fields for an engine method: τ, the draft statistics and where the engine's time went."""
    new_tokens = sum(len(r["tokens"]) for r in runs)
    sums = [r["summary"] for r in runs]
    add = lambda dicts: {k: sum(d.get(k, 0) for d in dicts) for k in sorted({k for d in dicts for k in d})}  # noqa: E731
    spine, branch = ([sum(getattr(s, f)[i] for s in sums) for i in (0, 1)] for f in ("spine_drafted", "branch_drafted"))
    stage_ms = add([s.stage_ms for s in sums])
    return dict(
        gt_threshold=runs[0]["gt_threshold"],
        tau=new_tokens / sum(r["forwards"] for r in runs),
        accepted_by_source=add([s.accepted_by_source for s in sums]),
        accepted_by_path=add([s.tokens_by_path for s in sums]),
        cycles_by_path=add([s.paths for s in sums]), cycles_by_mode=add([s.modes for s in sums]),
        p_s=spine[0] / spine[1] if spine[1] else None,
        p_t=branch[0] / branch[1] if branch[1] else None,
        median_overhead_ms=statistics.median(s.median_overhead_ms for s in sums),
        median_forward_ms=statistics.median(s.median_forward_ms for s in sums),
        mean_tree_nodes=statistics.fmean(s.mean_tree_nodes for s in sums),
        mean_forward_rows=sum(s.mean_forward_rows * s.cycles for s in sums) / max(1, sum(s.cycles for s in sums)),
        stage_ms=stage_ms, stage_share={k: v / sum(stage_ms.values()) for k, v in stage_ms.items()},
    )


def _add_limits(row: dict, runs: list[dict], ar_runs: list[dict], curve: CostCurve) -> None:
    """``aggregate``'s limit fields (``limit``, ``prompts``, ``of_limit``, ``of_limit_pooled``) on ``curve``;
    none for runs without decoding cycles."""
    cycles = sum(r["summary"].cycles for r in runs)
    if cycles:
        tau_decode = (row["new_tokens"] - len(runs)) / cycles  # tokens after each prefill per decoding forward
        row["limit"] = _limit(tau_decode, row["mean_forward_rows"], curve)
        prompts = [{"decode_speedup": decode_rate(r) / decode_rate(a) if len(r["tokens"]) > 1 else None,
                    "tau": decode_tau(r), "rows": r["summary"].mean_forward_rows, "limit": run_limit(r, curve)}
                   for r, a in zip(runs, ar_runs)]
        row["prompts"] = prompts
        if row["decode_speedup"] is not None and all(p["limit"] for p in prompts):
            row["of_limit"] = statistics.median(p["decode_speedup"] / p["limit"] for p in prompts)
            row["of_limit_pooled"] = row["decode_speedup"] / row["limit"]


def head_to_head(rows: list[dict], reference: str = "goose") -> list[dict]:
    """``reference`` against every other method but AR, per dataset, prompt by prompt, in the decode phase.

    For each prompt the ratio of the two methods' decode-phase speedups over AR on that prompt (= the ratio of their
    decode-phase tokens/s); ``wins``: prompts where ``reference`` was faster, of ``n`` (equal ones dropped);
    ``median_ratio``: the median of the ratios; ``p``: the two-sided sign test's p-value, the chance of a split at
    least this uneven between two equally fast methods.  The median speedups of two methods that trade leads
    from run to run differ by the run's drift; this says whether ``reference`` leads prompt by prompt.  [] when
    ``reference`` did not run.
    """
    cell = {(r["method"], r["dataset"]): r for r in rows}
    out = []
    for (method, dataset), row in cell.items():
        ref = cell.get((reference, dataset))
        if ref is None or method in (reference, "ar", FP32_AR):
            continue
        ratios = [a / b for a, b in zip(ref["decode_speedups"], row["decode_speedups"]) if a and b]
        wins, losses = sum(x > 1 for x in ratios), sum(x < 1 for x in ratios)
        n = wins + losses
        tail = sum(math.comb(n, i) for i in range(min(wins, losses) + 1)) / 2 ** n if n else 1.0
        out.append({"reference": reference, "method": method, "dataset": dataset, "wins": wins, "n": n,
                    "median_ratio": statistics.median(ratios) if ratios else None, "p": min(1.0, 2 * tail)})
    return out


def run_limit(run: dict, curve: CostCurve) -> float | None:
    """One run's decode-phase limit τ·T(1)/T(n̄) on ``curve`` (τ: tokens after the prefill's first per decoding
    forward; n̄: its mean rows per forward); None for a run without decoding cycles."""
    tau = decode_tau(run)
    return _limit(tau, run["summary"].mean_forward_rows, curve) if tau is not None else None


def _limit(tau: float, rows: float, curve: CostCurve) -> float:
    """τ·T(1)/T(n̄): the decode-phase speedup τ allows when every forward carries ``rows`` rows on ``curve``."""
    return tau * curve.latency(1) / curve.latency(rows)


def decode_tau(run: dict) -> float | None:
    """Tokens after the prefill's first per decoding forward (None without decoding cycles)."""
    cycles = run["summary"].cycles
    return (len(run["tokens"]) - 1) / cycles if cycles else None


def add_synergy(rows: list[dict]) -> None:
    """Goose rows: synergy = tau(goose) / max(tau(pld), tau(tr)) on the same dataset (Goose §5.4); a preset
    variant ("goose-paper") is compared with the same preset's baselines ("pld-paper", "tr-paper")."""
    tau = {(r["method"], r["dataset"]): r.get("tau") for r in rows}
    for r in rows:
        head, dash, preset = r["method"].partition("-")
        if head != "goose" or not preset.isalnum() and preset:
            continue
        pld, tr = tau.get(("pld" + dash + preset, r["dataset"])), tau.get(("tr" + dash + preset, r["dataset"]))
        if pld and tr:
            r["synergy"] = r["tau"] / max(pld, tr)


def to_markdown(rows: list[dict], meta: dict) -> str:
    """``results.md``: the header, the speedup and τ table, the limits, head to head, the details, the stages."""
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    methods = list(dict.fromkeys(r["method"] for r in rows))
    out = _md_header(meta) + _md_speedups(rows, datasets, methods) + _md_first_token(rows) + _md_limits(rows)
    out += _md_head_to_head(rows, datasets) + _md_details(rows) + _md_stages(rows, methods)
    return "\n".join(out) + "\n"


def _fmt(v: float | None, f: str = "{:.2f}") -> str:
    return "–" if v is None else f.format(v)


def _mean(vals: list[float | None]) -> float | None:
    return None if any(v is None for v in vals) else statistics.fmean(vals)


def _md_header(meta: dict) -> list[str]:
    return [f"# goose-lens benchmark — {meta['model']} on {meta['device']} ({meta['dtype']})", "",
            f"`{meta['command']}`", "",
            f"{meta['date']} · {meta['max_new_tokens']} new tokens · B = {meta['budget']} · c = {meta['gt_threshold']} "
            f"(cost curve {(meta.get('cost_curve') or {}).get('id', '–')}) · greedy · "
            f"torch {meta['torch']} · transformers {meta['transformers']} · commit {meta['git_commit']}", ""]


def _md_speedups(rows: list[dict], datasets: list[str], methods: list[str]) -> list[str]:
    cell = {(r["method"], r["dataset"]): r for r in rows}
    out = ["## Speedup (median per prompt, vs AR in the same run) and τ", "",
           "Spd: end to end (prefill included); dec: decode phase (prefill excluded, the same for every method); "
           "η = dec / τ, the share of τ that became speed (AR: 1); "
           "vs fp32 AR: tokens/s over AR on an fp32 copy (``--fp32-ar``).", "",
           "| method | " + " | ".join(f"{d} Spd | {d} dec | {d} τ | {d} η" for d in datasets)
           + " | Avg Spd | Avg dec | Avg η | Avg vs fp32 AR |",
           "|---|" + "---|---|---|---|" * len(datasets) + "---|---|---|---|"]
    for m in methods:
        cells = [cell[(m, d)] for d in datasets]
        out.append(f"| {m} | " + " | ".join(f"{_fmt(c['speedup_vs_ar'])} | {_fmt(c.get('decode_speedup'))} | "
                                            f"{_fmt(c.get('tau'))} | {_fmt(c.get('eta'))}" for c in cells)
                   + f" | {_fmt(_mean([c['speedup_vs_ar'] for c in cells]))}"
                   + f" | {_fmt(_mean([c.get('decode_speedup') for c in cells]))}"
                   + f" | {_fmt(_mean([c.get('eta') for c in cells]))}"
                   + f" | {_fmt(_mean([c.get('vs_fp32_ar') for c in cells]))} |")
    return out


def _md_first_token(rows: list[dict]) -> list[str]:
    out = ["", "## Time to first token and speed (medians over prompts)", "",
           "TTFT: from the call to the first new token (the prefill, and what a method adds to it); decode: tokens "
           "after the first over the time after it; end to end: all tokens over all the time; same text: prompts "
           "whose output equals our AR's token for token.", "",
           "| method | dataset | TTFT ms | decode tok/s | end-to-end tok/s | same text as AR |",
           "|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['method']} | {r['dataset']} | {r['median_prefill_ms']:.0f} | "
                   f"{r['median_decode_tok_per_s']:.1f} | {r['median_tok_per_s']:.1f} | "
                   f"{r['same_text_as_ar']}/{r['n_prompts']} |")
    return out


def _md_limits(rows: list[dict]) -> list[str]:
    limited = [r for r in rows if r.get("limit")]
    if not limited:
        return []
    out = ["", "## Against its own limit (decode phase)", "",
           "limit = τ·T(1)/T(n̄) on the run's cost curve (τ over decoding forwards, n̄ = mean rows per forward), "
           "pooled over the prompts; of limit: the median over prompts of each prompt's dec Spd over its own "
           "limit; dec Spd / limit: the median speedup over the pooled limit (mixes two statistics; the figure "
           "reported before 2026-11-23); prefill: median ms per prompt.", "",
           "| method | dataset | n̄ | limit | dec Spd | of limit | dec Spd / limit | prefill ms |",
           "|---|---|---|---|---|---|---|---|"]
    for r in limited:
        out.append(f"| {r['method']} | {r['dataset']} | {r['mean_forward_rows']:.1f} | {r['limit']:.2f} | "
                   f"{_fmt(r.get('decode_speedup'))} | {_fmt(r.get('of_limit'))} | "
                   f"{_fmt(r.get('of_limit_pooled'))} | {r['median_prefill_ms']:.0f} |")
    return out


def _md_head_to_head(rows: list[dict], datasets: list[str]) -> list[str]:
    pairs = head_to_head(rows)
    if not pairs:
        return []
    out = ["", "## Head to head: goose against each method, prompt by prompt (decode phase)", "",
           "ratio: goose's decode-phase tokens/s over the method's on the same prompt, median over prompts; "
           "wins: prompts where goose was faster; p: two-sided sign test (how likely a split at least this "
           "uneven is between two equally fast methods).", "",
           "| method | " + " | ".join(f"{d} ratio | {d} wins | {d} p" for d in datasets) + " |",
           "|---|" + "---|---|---|" * len(datasets)]
    by = {(h["method"], h["dataset"]): h for h in pairs}
    for m in dict.fromkeys(h["method"] for h in pairs):
        hs = [by.get((m, d)) for d in datasets]
        out.append(f"| {m} | " + " | ".join("– | – | –" if h is None else
                                             f"{_fmt(h['median_ratio'])} | {h['wins']}/{h['n']} | {h['p']:.2g}"
                                             for h in hs) + " |")
    return out


def _md_details(rows: list[dict]) -> list[str]:
    out = ["", "## Details", "",
           "| method | dataset | prompts | tok/s | p_s | p_t | synergy | pure PLD / spine cont. / pure TR tokens "
           "| overhead ms/cycle | forward ms | lossless |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        paths = r.get("accepted_by_path", {})
        kinds = ("pure PLD", "spine continuation", "pure TR")
        split = " / ".join(str(paths.get(k, 0)) for k in kinds) if paths else "–"
        out.append(f"| {r['method']} | {r['dataset']} | {r['n_prompts']} | {r['tok_per_s']:.1f} | "
                   f"{_fmt(r.get('p_s'))} | {_fmt(r.get('p_t'))} | {_fmt(r.get('synergy'))} | {split} | "
                   f"{_fmt(r.get('median_overhead_ms'))} | "
                   f"{_fmt(r.get('median_forward_ms'))} | {_lossless_cell(r)} |")
    return out


def _md_stages(rows: list[dict], methods: list[str]) -> list[str]:
    out = ["", "## Where the engine's time goes (share of engine time per stage, all datasets)", "",
           "| method | " + " | ".join(TIMING_KEYS) + " |", "|---|" + "---|" * len(TIMING_KEYS)]
    for m in methods:
        stages = [r["stage_ms"] for r in rows if r["method"] == m and "stage_ms" in r]
        if stages:
            total = {k: sum(s[k] for s in stages) for k in TIMING_KEYS}
            whole = sum(total.values()) or 1.0
            out.append(f"| {m} | " + " | ".join(f"{100 * total[k] / whole:.1f} %" for k in TIMING_KEYS) + " |")
    return out


def _lossless_cell(row: dict) -> str:
    """'yes', 'yes (2 precision ties)' or '**NO**: 1 bug, 2 precision ties' (engine/product/lossless.py)."""
    kinds = [d["kind"] for d in row["divergences"]]
    counts = ", ".join(f"{kinds.count(k)} {k}{'s' * (kinds.count(k) > 1)}" for k in dict.fromkeys(kinds))
    if row["lossless"]:
        return f"yes ({counts})" if counts else "yes"
    return "**NO**: " + counts


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
    print(f"model: {lm.summary()}", file=sys.stderr)
    for m in methods:  # warm-up
        run(m, lm.encode_prompt("def warm_up(x):\n    return x\n"))
    rows, profile = [], []
    for dataset, texts in setup.prompts.items():
        runs = _run_dataset(run, methods, dataset, texts, profile)
        rows += [aggregate(m, dataset, runs[m], runs["ar"], runs.get(FP32_AR), run.curve) for m in methods]
    add_synergy(rows)
    meta = _meta(args, argv, setup, run.curve)
    write_outputs(args.out, meta, rows, profile)
    print(to_markdown(rows, meta))
    return 0 if all(r["lossless"] for r in rows) else 1  # precision ties are reported, only bugs fail


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m engine.product.bench", description=__doc__.splitlines()[0])
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


def _run_dataset(run: Runner, methods: list[str], dataset: str, texts: list[str], profile: list[dict]) -> dict:
    """Every method on every prompt of ``dataset`` (the order rotating), each run checked against AR's tokens;
    returns method -> its runs in prompt order, and appends their cycles to ``profile`` (``--profile``)."""
    runs = {m: [] for m in methods}
    run.new_session()
    for k, text in enumerate(tqdm(texts, desc=dataset)):
        ids = encode(run.lm, text, DATASETS[dataset][2], run.args.max_new_tokens)
        fastest = _fastest_runs(run, methods, ids, k)
        for m in methods:
            runs[m].append(fastest[m])
            profile += [{"method": m, "dataset": dataset, "prompt": k, **c} for c in runs[m][-1].pop("cycles", [])]
        _check_lossless(run.lm, ids, runs, dataset, k)
    return runs


def _fastest_runs(run: Runner, methods: list[str], ids: list[int], k: int) -> dict[str, dict]:
    """Each method's fastest run on prompt ``k`` (wall time) over ``--repeats``, the order rotating: no method
    always first."""
    fastest: dict[str, dict] = {}
    for r in range(run.args.repeats):
        turn = (k + r) % len(methods)
        for m in methods[turn:] + methods[:turn]:
            record = run(m, ids)
            if m not in fastest or record["seconds"] < fastest[m]["seconds"]:
                fastest[m] = record
    return fastest


def _check_lossless(lm, ids: list[int], runs: dict[str, list[dict]], dataset: str, k: int) -> None:
    """Mark prompt ``k``'s last run of every method whose tokens part from AR's with its divergence (loudly when
    it is a bug); the engine's AR steps are replayed for their logits once, when a method parts from AR."""
    reference = None
    for m in runs:
        if m in (FP32_AR, *LLAMACPP_METHODS) or runs[m][-1]["tokens"] == runs["ar"][-1]["tokens"]:
            continue  # llama.cpp's own kernels: its text is compared (same_text_as_ar), not held to ours
        reference = engine_ar_logits(lm.model, ids, runs["ar"][-1]["tokens"])[1] if reference is None \
            else reference
        d = attribute(lm.model, ids, runs["ar"][-1]["tokens"], runs[m][-1]["tokens"], reference)
        if d is not None:
            runs[m][-1]["divergence"] = {"prompt": k, **d.to_dict()}
            print(f"\n{'!!! LOSSLESS VIOLATION' if d.kind in ('bug', 'length') else d.kind}: {m} on "
                  f"{dataset} prompt {k}: {d.sentence()}", file=sys.stderr)


def _meta(args: argparse.Namespace, argv: list[str] | None, setup: _Setup, curve: CostCurve | None) -> dict:
    """``results.json``'s meta: the model, the machine, the versions, the command and the run's settings."""
    lm, base, prompts = setup.lm, setup.base, setup.prompts
    return {"model": lm.name, "draft_model": args.draft_model, "device": args.device, "dtype": lm.precision,
            "dtype_reason": lm.dtype_reason, "forward": lm.forward.name, "forward_reason": lm.forward_reason,
            "attention": compat.attention_kernel(lm.model.config),
            "torch": torch.__version__, "transformers": __import__("transformers").__version__,
            "python": platform.python_version(), "cpu_threads": torch.get_num_threads(),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "date": dt.datetime.now().isoformat(timespec="seconds"),
            "command": "python -m engine.product.bench " + " ".join(argv if argv is not None else sys.argv[1:]),
            "git_commit": _git_commit(), "max_new_tokens": base.max_new_tokens, "budget": base.tree.budget,
            "gt_threshold": base.gt.threshold, "same_session": args.same_session, "repeats": args.repeats,
            "cost_curve": curve.to_dict() if curve is not None else None,
            "datasets": {d: len(t) for d, t in prompts.items()}, "methods": setup.methods}


@torch.no_grad()
def encode(lm, text: str | list[str], prompt_format: str, max_new_tokens: int) -> list[int]:
    """A dataset record's prompt ids.  A list of turns (``mt_bench2``) becomes a chat whose earlier turns are
    answered by the model itself (greedy, ``max_new_tokens``), ending with the last turn."""
    if isinstance(text, str):
        return lm.encode_prompt(text, chat=prompt_format == "chat")
    if not lm.has_chat_template:  # e.g. the demo model: the turns and answers as one raw text
        raw = ""
        for turn in text[:-1]:
            raw += turn + "\n\n"
            raw += lm.tokenizer.decode(_greedy(lm, lm.encode_prompt(raw, chat=False), max_new_tokens)) + "\n\n"
        return lm.encode_prompt(raw + text[-1], chat=False)
    messages: list[dict] = []
    for turn in text[:-1]:
        messages.append({"role": "user", "content": turn})
        answer = _greedy(lm, lm.encode_messages(messages), max_new_tokens)
        messages.append({"role": "assistant", "content": lm.tokenizer.decode(answer, skip_special_tokens=True)})
    return lm.encode_messages([*messages, {"role": "user", "content": text[-1]}])


@torch.no_grad()
def _greedy(lm, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """The model's greedy continuation of ``prompt_ids`` (transformers' ``generate``)."""
    ids = torch.tensor([prompt_ids], device=lm.model.device)
    eos = list(lm.eos_token_ids) or None
    out = lm.model.generate(ids, do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=eos,
                            pad_token_id=eos[0] if eos else None)
    return out[0, ids.shape[1]:].tolist()


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
