"""The benchmark's ``results.md``: the header, the speedup and τ table, the limits, head to head, the details and
the stages."""
from __future__ import annotations

import statistics

from engine.decoding.trace import TIMING_KEYS
from engine.product.bench.aggregate import head_to_head, what_ran
from engine.product.runs.run import SPEEDUP_WORDS


def to_markdown(rows: list[dict], meta: dict) -> str:
    """``results.md``: the header, the speedup and τ table, the limits, head to head, the details, the stages."""
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    methods = list(dict.fromkeys(r["method"] for r in rows))
    out = _md_header(meta) + _md_what_ran(rows, methods) + _md_speedups(rows, datasets, methods)
    out += _md_first_token(rows) + _md_limits(rows)
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


def _md_what_ran(rows: list[dict], methods: list[str]) -> list[str]:
    """Which weights and kernels ran each method's forwards (its rows' ``runs``: ``what_runs.WhatRuns``, merged over
    datasets by ``what_ran``: a path taken by some prompts only is named with its count)."""
    ran = {m: what_ran([each for r in rows if r["method"] == m for each in r.get("runs_each") or [r.get("runs")]])
           for m in methods}
    out = ["## What ran", "", "| method | weights | forward path |", "|---|---|---|"]
    for m in methods:
        what = ran.get(m) or {}
        weights = {"gguf": "the GGUF file's", "transformers": "the transformers model's"}.get(what.get("weights"), "")
        out.append(f"| {m} | {weights} {what.get('dtype', '–')} | {what.get('forward_path', '–')} |")
    return out + [""]


def _md_speedups(rows: list[dict], datasets: list[str], methods: list[str]) -> list[str]:
    cell = {(r["method"], r["dataset"]): r for r in rows}
    out = ["## Speedup (median per prompt, vs AR in the same run) and τ", "",
           f"Spd: the speedup as the page measures it, {SPEEDUP_WORDS} (prefill excluded, the same for every "
           "method); e2e: end to end (prefill included); η = Spd / τ, the share of τ that became speed (AR: 1); "
           "vs fp32 AR: tokens/s over AR on an fp32 copy (``--fp32-ar``).", "",
           "| method | " + " | ".join(f"{d} Spd | {d} e2e | {d} τ | {d} η" for d in datasets)
           + " | Avg Spd | Avg e2e | Avg η | Avg vs fp32 AR |",
           "|---|" + "---|---|---|---|" * len(datasets) + "---|---|---|---|"]
    for m in methods:
        cells = [cell[(m, d)] for d in datasets]
        out.append(f"| {m} | " + " | ".join(f"{_fmt(c.get('decode_speedup'))} | {_fmt(c['speedup_vs_ar'])} | "
                                            f"{_fmt(c.get('tau'))} | {_fmt(c.get('eta'))}" for c in cells)
                   + f" | {_fmt(_mean([c.get('decode_speedup') for c in cells]))}"
                   + f" | {_fmt(_mean([c['speedup_vs_ar'] for c in cells]))}"
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
           "| overhead ms/cycle | planner | forward ms | lossless |", "|---" * 12 + "|"]
    for r in rows:
        paths = r.get("accepted_by_path", {})
        kinds = ("pure PLD", "spine continuation", "pure TR")
        split = " / ".join(str(paths.get(k, 0)) for k in kinds) if paths else "–"
        out.append(f"| {r['method']} | {r['dataset']} | {r['n_prompts']} | {r['tok_per_s']:.1f} | "
                   f"{_fmt(r.get('p_s'))} | {_fmt(r.get('p_t'))} | {_fmt(r.get('synergy'))} | {split} | "
                   f"{_fmt(r.get('median_overhead_ms'))} | {r.get('planner', '–')} | "
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
    """'yes', 'yes (2 precision ties)' or '**NO**: 1 bug, 2 precision ties' (engine/product/runs/lossless.py)."""
    kinds = [d["kind"] for d in row["divergences"]]
    counts = ", ".join(f"{kinds.count(k)} {k}{'s' * (kinds.count(k) > 1)}" for k in dict.fromkeys(kinds))
    if row["lossless"]:
        return f"yes ({counts})" if counts else "yes"
    return "**NO**: " + counts
