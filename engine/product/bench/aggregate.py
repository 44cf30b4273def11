"""The benchmark's rows: one method on one dataset aggregated (medians over prompts, speedups over AR in the same
run, τ, limits on the cost curve), head to head and synergy."""
from __future__ import annotations

import math
import statistics

from engine.decoding.cost import CostCurve
from engine.product.bench.methods import FP32_AR
from engine.product.runs.run import speedup_over_ar


def _rate(run: dict) -> float:
    """End-to-end tokens/s of one run (prefill included)."""
    return len(run["tokens"]) / run["seconds"]


def decode_rate(run: dict) -> float:
    """Decode-phase tokens/s of one run: the tokens after the prefill's first one, over the time after the prefill."""
    return (len(run["tokens"]) - 1) / max(run["seconds"] - run["prefill_s"], 1e-9)


def decode_speedup(run: dict, ar: dict) -> float | None:
    """One prompt's speedup over AR as the page measures every speedup (``run.speedup_over_ar``: the decode phase,
    engine time); None where it or AR wrote one token (no decode phase)."""
    if min(len(run["tokens"]), len(ar["tokens"])) < 2:
        return None
    return speedup_over_ar(len(run["tokens"]) - 1, run["seconds"] - run["prefill_s"],
                           len(ar["tokens"]) - 1, ar["seconds"] - ar["prefill_s"])


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
    decode = [decode_speedup(r, a) for r, a in zip(runs, ar_runs)]  # per prompt (None: no decode phase)
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
           "divergences": [r["divergence"] for r in runs if "divergence" in r],
           "runs": what_ran([r.get("runs") for r in runs]),  # what ran its forwards (``what_ran``)
           "runs_each": [r.get("runs") for r in runs]}  # the same per prompt (a long prompt's path may differ)
    return row


def what_ran(records: list[dict | None]) -> dict | None:
    """One "what ran" record ({"dtype", "forward_path", "weights"}) for several runs: each field's value where they
    agree, else its values in order of first use with how many runs took each, e.g. {"forward_path":
    "llamacpp-q8cache (4) / llamacpp-noflash (6)"} where ``auto`` ran long prompts on the long path
    (``LoadedModel.for_context``); None where no run said."""
    records = [r for r in records if r]
    if not records:
        return None
    merged = {}
    for key in dict.fromkeys(k for r in records for k in r):
        values = [r.get(key) for r in records]
        distinct = list(dict.fromkeys(values))
        merged[key] = distinct[0] if len(distinct) == 1 else " / ".join(f"{v} ({values.count(v)})" for v in distinct)
    return merged


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
        planner=" + ".join(sorted({s.planner for s in sums})),  # whose stages planned the runs (``RunSummary``)
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
        prompts = [{"decode_speedup": decode_speedup(r, a),
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
