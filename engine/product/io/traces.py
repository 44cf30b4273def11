"""Run export / import: a versioned JSON document of a whole run (schema: docs/trace-schema.md).

A run is replayable with no model loaded: the document carries the text of every token id it
mentions.  Import only ever parses JSON (never pickle), checks the size, the schema name and
version, and every field's type, and says exactly what is wrong otherwise.
"""
from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.core.tree import DraftTree, GhostNode, Source
from engine.decoding.trace import MODES, PLANNERS, CycleTrace
from engine.sources import REGISTRY, tags

SCHEMA = "goose-lens-trace"
VERSION = 2  # 2 added the §4.3 confidence fields of a cycle (confidence, match_tokens, chain_tokens, budget),
# the GT size choice (gt_nodes, gt_candidates, gt_expected, gt_cost_ms) and the run's prompt_format
RUNS_KEYS = ("dtype", "forward_path", "weights")  # a header's optional "runs": what ran the forwards
READABLE_VERSIONS = (1, 2)  # version 1 files read with those fields absent (None / 0)
MAX_BYTES = 32 * 1024 * 1024  # refuse larger files: a 1024-token run at B = 128 is ~5 MB


class TraceFormatError(ValueError):
    """The file is not a goose-lens trace this version can replay; the message says why."""


def _tree_dict(tree: DraftTree) -> dict:
    return {"tokens": list(tree.tokens), "parents": list(tree.parents), "sources": [s.value for s in tree.sources],
            "scores": [round(x, 6) for x in tree.scores], "est_accept": [round(x, 6) for x in tree.est_accept]}


def trace_to_dict(t: CycleTrace) -> dict:
    return {"index": t.index, "mode": t.mode, "tree": _tree_dict(t.tree),
            "ghosts": [{"parent": g.parent, "token": g.token, "source": g.source.value, "score": round(g.score, 6),
                        "est_accept": round(g.est_accept, 6)} for g in t.ghosts],
            "greedy": list(t.greedy), "accepted": list(t.accepted), "bonus": t.bonus, "new_tokens": list(t.new_tokens),
            "spine_ratio": t.spine_ratio, "p_s_ema": t.p_s_ema, "timings_ms": dict(t.timings_ms),
            "elapsed_s": t.elapsed_s, "total_tokens": t.total_tokens, "finished": t.finished, "ptd_rows": t.ptd_rows,
            "pad_rows": t.pad_rows,
            "confidence": None if t.confidence is None else round(t.confidence, 6), "match_tokens": t.match_tokens,
            "chain_tokens": t.chain_tokens, "budget": t.budget,
            "gt_nodes": t.gt_nodes, "gt_candidates": t.gt_candidates,
            "gt_expected": None if t.gt_expected is None else round(t.gt_expected, 6),
            "gt_cost_ms": None if t.gt_cost_ms is None else round(t.gt_cost_ms, 6), "resting": list(t.resting),
            "candidates": None if t.candidates is None else _tree_dict(t.candidates), "ghost_hits": list(t.ghost_hits),
            "planner": t.planner}


@dataclass(frozen=True)
class RunHeader:
    """What a trace file says of its run besides the cycles.

    Attributes:
        model: model id (never a machine path).  prompt: the prompt text.  config: ``DecodeConfig.to_dict()``
        as used.  prompt_format: "chat" or "raw", what the prompt went through (None: unknown).
        cost_curve: the spec of the cost curve the run read (``CostCurve.spec``; optional, None: none).
        ar_timing: AR's decode-phase timing on the same prompt that the run's speedup was measured against
            ({"tokens", "seconds", "source", "rel_err"}: ``engine.product.runs.run.ArTiming.to_dict``; optional, None:
            not measured).
        shown_curve: the spec of the cost curve the page's cost sentence read (``cost_curve``, or the device's
            cached curve where the run read none; optional, None: no sentence).
        runs: what ran the run's forwards ({"dtype", "forward_path", "weights"}, strings:
            ``engine.product.models.what_runs.WhatRuns.to_dict``; optional, None: not said, as in older files).
    """

    model: str
    prompt: str
    config: dict
    prompt_format: str | None = None
    cost_curve: str | None = None
    ar_timing: dict | None = None
    shown_curve: str | None = None
    runs: dict | None = None


def export_run(*, header: RunHeader, traces: list[CycleTrace], token_text: Callable[[int], str]) -> str:
    """The run as a JSON string (schema ``goose-lens-trace``, version ``VERSION``).

    Args:
        header: the run's model, prompt, config, prompt format and cost curve.
        traces: every cycle, prefill first.  token_text: token id -> its text (the tokenizer's decode).
    """
    ids: set[int] = set()
    for t in traces:
        ids.update(t.tree.tokens, t.greedy, t.new_tokens, (g.token for g in t.ghosts), (t.bonus,))
    h = header
    doc = {"schema": SCHEMA, "version": VERSION, "model": h.model, "prompt": h.prompt, "prompt_format": h.prompt_format,
           "config": h.config, "cost_curve": h.cost_curve, "ar_timing": h.ar_timing,
           "shown_curve": h.shown_curve, "runs": h.runs,
           "token_text": {str(i): token_text(i) for i in sorted(ids)},
           "cycles": [trace_to_dict(t) for t in traces]}
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":"))


def _need(cond: bool, where: str, what: str) -> None:
    """Raise ``TraceFormatError`` "where: what" unless ``cond`` (``where`` "file": the file as a whole, "what"
    alone)."""
    if not cond:
        raise TraceFormatError(what if where == "file" else f"{where}: {what}")


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _ints(x: Any, where: str, allow_none_first: bool = False) -> list:
    _need(isinstance(x, list), where, "expected a list")
    for k, v in enumerate(x):
        ok = (v is None and allow_none_first and k == 0) or (isinstance(v, int) and not isinstance(v, bool))
        _need(ok, where, f"item {k} is not an integer")
    return x


def _floats(x: Any, where: str) -> list[float]:
    _need(isinstance(x, list) and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                                      for v in x), where, "expected a list of finite numbers")
    return [float(v) for v in x]


def _source(x: Any, where: str) -> Source:
    try:
        return Source(x)
    except ValueError:
        known = ", ".join(s.value for s in tags())
        raise TraceFormatError(f"{where}: unknown source {x!r} (known: {known})") from None


def _trace_from_dict(c: Any, k: int) -> CycleTrace:
    try:
        return _trace_fields(c, k)
    except (TypeError, ValueError) as exc:  # any field of the wrong type: one message naming the cycle
        if isinstance(exc, TraceFormatError):
            raise
        raise TraceFormatError(f"cycle {k}: {exc}") from None


def _trace_fields(c: Any, k: int) -> CycleTrace:
    where = f"cycle {k}"
    _need(isinstance(c, dict), where, "expected an object")
    for key in ("index", "mode", "tree", "greedy", "accepted", "bonus", "new_tokens", "elapsed_s", "total_tokens",
                "finished"):
        _need(key in c, where, f"missing field {key!r}")
    _need(c["index"] == k, where, f"index {c['index']!r} is not its position {k}")
    _need(c["mode"] in MODES, where, f"unknown mode {c['mode']!r}")
    _need(c.get("spine_ratio") is None or isinstance(c["spine_ratio"], (int, float)), where,
          "spine_ratio is not a number")
    tree = _tree_from_dict(c["tree"], f"{where}.tree")
    candidates = None if c.get("candidates") is None else _tree_from_dict(c["candidates"], f"{where}.candidates")
    hits = _ints(c.get("ghost_hits", []), f"{where}.ghost_hits")
    _need(all(0 <= h < len(c.get("ghosts", [])) for h in hits), f"{where}.ghost_hits", "ghost index out of range")
    n = len(tree)
    greedy, accepted = _ints(c["greedy"], f"{where}.greedy"), _ints(c["accepted"], f"{where}.accepted")
    _need(len(greedy) == n, f"{where}.greedy", f"expected {n} entries (one per node)")
    _need(all(0 < a < n for a in accepted), f"{where}.accepted", "node index out of range")
    ghosts = []
    for g in c.get("ghosts", []):
        _need(isinstance(g, dict) and isinstance(g.get("parent"), int) and 0 <= g["parent"] < n
              and isinstance(g.get("token"), int), f"{where}.ghosts", "bad ghost entry")
        ghosts.append(GhostNode(g["parent"], g["token"], _source(g.get("source"), f"{where}.ghosts"),
                                float(g.get("score", 0.0)), float(g.get("est_accept", 0.0))))
    timings = c.get("timings_ms", {})
    _need(isinstance(timings, dict) and all(isinstance(v, (int, float)) for v in timings.values()),
          f"{where}.timings_ms", "expected an object of numbers")
    _need(isinstance(c["elapsed_s"], (int, float)), where, "elapsed_s is not a number")
    for key in ("gt_expected", "gt_cost_ms"):
        _need(c.get(key) is None or isinstance(c[key], (int, float)), where, f"{key} is not a number")
    confidence = c.get("confidence")
    _need(confidence is None or (isinstance(confidence, (int, float)) and 0.0 <= confidence <= 1.0), where,
          "confidence is not a number in [0, 1]")
    _need(c.get("planner", "python") in PLANNERS, where, f"unknown planner {c.get('planner')!r}")
    for key in ("match_tokens", "chain_tokens", "budget", "gt_nodes", "gt_candidates"):
        _need(c.get(key) is None or (isinstance(c[key], int) and c[key] >= 0), where,
              f"{key} is not a non-negative integer")
    return CycleTrace(index=int(c["index"]), mode=c["mode"], tree=tree, ghosts=tuple(ghosts), greedy=tuple(greedy),
                      accepted=tuple(accepted), bonus=int(c["bonus"]),
                      new_tokens=tuple(_ints(c["new_tokens"], f"{where}.new_tokens")),
                      spine_ratio=c.get("spine_ratio"), p_s_ema=float(c.get("p_s_ema", 0.0)), timings_ms=timings,
                      elapsed_s=float(c["elapsed_s"]), total_tokens=int(c["total_tokens"]),
                      finished=bool(c["finished"]), ptd_rows=int(c.get("ptd_rows", 0)),
                      pad_rows=int(c.get("pad_rows", 0)), confidence=None if confidence is None else float(confidence),
                      match_tokens=c.get("match_tokens") or 0, chain_tokens=c.get("chain_tokens") or 0,
                      budget=c.get("budget"), gt_nodes=c.get("gt_nodes"), gt_candidates=c.get("gt_candidates"),
                      gt_expected=c.get("gt_expected"), gt_cost_ms=c.get("gt_cost_ms"),
                      resting=_names(c.get("resting", []), f"{where}.resting"), candidates=candidates,
                      ghost_hits=tuple(hits), planner=c.get("planner", "python"))


def _tree_from_dict(t: Any, where: str) -> DraftTree:
    """A draft tree written by ``_tree_dict``; raises ``TraceFormatError`` naming ``where`` on a malformed field."""
    _need(isinstance(t, dict), where, "expected an object")
    return DraftTree(tuple(_ints(t.get("tokens"), f"{where}.tokens")),
                     tuple(_ints(t.get("parents"), f"{where}.parents", allow_none_first=True)),
                     tuple(_source(s, f"{where}.sources") for s in t.get("sources") or []),
                     tuple(_floats(t.get("scores"), f"{where}.scores")),
                     tuple(_floats(t.get("est_accept"), f"{where}.est_accept")))


def _names(x: Any, where: str) -> tuple[str, ...]:
    known = [i.name for i in REGISTRY]
    _need(isinstance(x, list) and all(v in known for v in x), where,
          f"expected a list of draft source names (known: {', '.join(known)})")
    return tuple(x)


def _not_json(exc: Exception) -> str:
    """Why a file is not JSON, in words: "it is not a text file", "it is not JSON (line 1, column 5)"."""
    if isinstance(exc, UnicodeDecodeError):
        return "it is not a text file"
    return f"it is not JSON (line {exc.lineno}, column {exc.colno})" if isinstance(exc, json.JSONDecodeError) \
        else f"it is not JSON ({exc})"


def load_run(data: bytes | str) -> dict:
    """Parse and validate an exported run.

    Returns:
        {"model", "prompt", "prompt_format" ("chat", "raw" or None), "config", "cost_curve" (a spec or None),
        "ar_timing" (a dict or None), "shown_curve" (a spec or None), "runs" (what ran: a dict or None),
        "token_text": {id: text}, "traces": [CycleTrace, ...]}.

    Raises:
        TraceFormatError: too large, not JSON, another schema or version, or a malformed field.
    """
    size = len(data.encode("utf-8") if isinstance(data, str) else data)
    if size > MAX_BYTES:
        raise TraceFormatError(f"the file is {size / 2**20:.1f} MB; traces up to {MAX_BYTES // 2**20} MB are accepted")
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TraceFormatError(f"{_not_json(exc)}, and a trace is the .json file that goose-lens's Export trace "
                               f"writes") from None
    _need(isinstance(doc, dict) and doc.get("schema") == SCHEMA, "file",
          f"it is JSON but not a goose-lens trace (a trace says \"schema\": \"{SCHEMA}\"; it is the .json file "
          f"that goose-lens's Export trace writes)")
    _need(doc.get("version") in READABLE_VERSIONS, "file",
          f"it is a trace of schema version {doc.get('version')!r}, and this goose-lens reads versions "
          f"{', '.join(map(str, READABLE_VERSIONS))}")
    cycles = doc.get("cycles")
    _need(isinstance(cycles, list) and cycles, "file", "it records no cycle")
    texts = doc.get("token_text", {})
    _need(isinstance(texts, dict) and all(isinstance(v, str) for v in texts.values()), "token_text",
          "expected an object of strings")
    _need(isinstance(doc.get("config", {}), dict), "config", "expected an object")
    prompt_format = doc.get("prompt_format")
    curve = doc.get("cost_curve")
    _need(curve is None or isinstance(curve, str), "cost_curve", "expected a cost-curve spec (a string) or null")
    shown = doc.get("shown_curve")
    _need(shown is None or isinstance(shown, str), "shown_curve", "expected a cost-curve spec (a string) or null")
    ar = doc.get("ar_timing")
    _need(ar is None or (isinstance(ar, dict) and _finite(ar.get("tokens")) and _finite(ar.get("seconds"))
                         and (ar.get("rel_err") is None or _finite(ar.get("rel_err")))), "ar_timing",
          "expected AR's timing ({\"tokens\", \"seconds\", \"source\", \"rel_err\"}) or null")
    runs = doc.get("runs")
    _need(runs is None or (isinstance(runs, dict) and all(isinstance(runs.get(k), str) for k in RUNS_KEYS)), "runs",
          f"expected what ran ({{{', '.join(repr(k) for k in RUNS_KEYS)}}}: strings) or null")
    return {"model": str(doc.get("model", "?")), "prompt": str(doc.get("prompt", "")),
            "prompt_format": prompt_format if prompt_format in ("chat", "raw") else None, "cost_curve": curve,
            "ar_timing": ar, "shown_curve": shown, "runs": {k: runs[k] for k in RUNS_KEYS} if runs else None,
            "config": doc.get("config", {}),
            "token_text": {int(k): v for k, v in texts.items() if k.lstrip("-").isdigit()},
            "traces": [_trace_from_dict(c, k) for k, c in enumerate(cycles)]}
