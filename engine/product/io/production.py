"""Numbers in: a deployment's acceptance figures, read from what vLLM, SGLang or llama.cpp report, beside a run here
(``python -m cli.production FILE`` prints them).

Formats, each as its engine writes it (samples in tests/data/production/):

- **vLLM** ``/metrics`` (Prometheus text; ``vllm/v1/spec_decode/metrics.py`` ``SpecDecodingProm``, read at commit
  adce4e9a): the counters ``vllm:spec_decode_num_drafts``, ``…_num_draft_tokens``, ``…_num_accepted_tokens`` and
  ``…_num_accepted_tokens_per_pos`` (label ``position``), ``_total`` in the exposition; summed over their other
  labels (models, engines).  vLLM's own summaries: mean acceptance length 1 + accepted / drafts, acceptance rate
  accepted / draft tokens, per position accepted_per_pos[i] / drafts.  llama.cpp server's ``/metrics`` (b10282 on,
  with ``--metrics``) has the same counters as ``llamacpp:spec_decode_*``, read alike.
- **SGLang** ``/generate`` JSON, one response, a list of them, or JSON lines: each ``meta_info``'s speculative fields
  (``srt/managers/tokenizer_manager.py`` ``_calculate_spec_decoding_metrics``): ``spec_verify_ct`` and
  ``completion_tokens`` always; accepted and proposed drafts as ``spec_num_correct_drafts`` /
  ``spec_num_proposed_drafts`` (0.5.12 on), ``spec_accept_token_num`` / ``spec_draft_token_num`` (0.5.9-0.5.10) or
  ``spec_accepted_drafts`` / ``spec_proposed_drafts``; the histogram of drafts accepted per step as
  ``spec_correct_drafts_histogram`` or ``spec_accept_histogram``.  Without an accepted count (0.5.5, whose NGRAM
  counts none), accepted = completion_tokens - 1 - spec_verify_ct (each step commits its accepted drafts and one token
  more; the first token is the prefill's).
- **llama.cpp** server ``/completion`` JSON (``tools/server/server-task.cpp`` ``result_timings``, b10309), one
  response or a list: ``timings.draft_n`` and ``timings.draft_n_accepted``, totals over the request, present once a
  draft was made.  The server reports no count of draft rounds, so τ is the tokens per verification forward over
  every step, (predicted_n - 1) / (predicted_n - 1 - draft_n_accepted), steps without a draft included.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from prometheus_client.parser import text_string_to_metric_families

#: Said of a file that is none of the three formats.
EXPECTED = ("a vLLM /metrics text with the vllm:spec_decode_* counters, an SGLang /generate JSON whose meta_info has "
            "spec_verify_ct, or a llama.cpp /completion JSON whose timings have draft_n")


class ProductionError(ValueError):
    """The file is not a deployment's acceptance figures in a format read here; the message is one sentence."""


@dataclass(frozen=True)
class Production:
    """A deployment's (or a run's) acceptance figures.

    Attributes:
        source: where they come from, in words ("vLLM /metrics", "SGLang meta_info of 3 requests", "this run").
        steps: verification steps that verified a draft (None where the format does not say).
        draft_tokens: tokens drafted (None where not given).
        accepted: draft tokens accepted, bonus tokens excluded.
        per_position: acceptance rate at draft position 1, 2, … (the share of steps that accepted at least that
            many draft tokens); () where not given.
        tau: mean tokens per verification step with a draft, the bonus included (vLLM's mean acceptance length).
        tau_note: how ``tau`` was computed where it is not that ("" otherwise).
    """

    source: str
    steps: int | None
    draft_tokens: int | None
    accepted: int
    per_position: tuple[float, ...] = ()
    tau: float | None = None
    tau_note: str = ""

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted / drafted tokens (None without a drafted count)."""
        return self.accepted / self.draft_tokens if self.draft_tokens else None

    def to_dict(self) -> dict:
        return {**asdict(self), "acceptance_rate": self.acceptance_rate}


def read_production(text: str) -> Production:
    """The figures in ``text`` (any of the module's three formats).  Raises ``ProductionError`` (one sentence)."""
    try:
        return _read(text)
    except ProductionError:
        raise
    except (TypeError, ValueError, AttributeError, KeyError, IndexError, RecursionError):
        raise ProductionError(f"This file has the expected fields, but not values of their kinds: expected "
                              f"{EXPECTED}.") from None


def _read(text: str) -> Production:
    stripped = text.lstrip("\ufeff").strip()
    if stripped.startswith(("{", "[")):
        records = _json_records(stripped)
        if any("meta_info" in r or "spec_verify_ct" in r for r in records):
            return _sglang(records)
        if any("timings" in r for r in records):
            return _llamacpp(records)
        raise ProductionError(f"This JSON has neither SGLang's meta_info nor llama.cpp's timings: expected {EXPECTED}.")
    if "spec_decode_num_drafts" in text:
        return _metrics(stripped)
    raise ProductionError(f"This file is not a deployment's acceptance figures: expected {EXPECTED}.")


def _json_records(text: str) -> list[dict]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        try:
            data = [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError:
            raise ProductionError(f"This file is not valid JSON or JSON lines: expected {EXPECTED}.") from None
    records = data if isinstance(data, list) else [data]
    return [r for r in records if isinstance(r, dict)]


def _metrics(text: str) -> Production:
    """vLLM's counters, or llama.cpp server's of the same names (``llamacpp:spec_decode_*``, b10282 on, with
    ``--metrics``: the whole server's, summed over its requests)."""
    engine = "llama.cpp" if "llamacpp:spec_decode_num_drafts" in text else "vLLM"
    totals: dict[str, float] = {}
    per_pos: dict[int, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if not sample.name.endswith("_total"):
                    continue  # the _created gauges
                name = sample.name.split("spec_decode_", 1)[-1].removesuffix("_total")
                if name == "num_accepted_tokens_per_pos":
                    pos = int(sample.labels.get("position", 0))
                    per_pos[pos] = per_pos.get(pos, 0.0) + sample.value
                else:
                    totals[name] = totals.get(name, 0.0) + sample.value
    except ValueError as exc:
        raise ProductionError(f"This Prometheus text does not parse ({exc}): expected {EXPECTED}.") from None
    drafts = int(totals.get("num_drafts", 0))
    if not drafts:
        raise ProductionError(f"{engine}'s counters show no draft yet (spec_decode_num_drafts is 0): send requests "
                              "to the server, then read /metrics again.")
    accepted = int(totals.get("num_accepted_tokens", 0))
    return Production(f"{engine} /metrics", drafts, int(totals.get("num_draft_tokens", 0)) or None, accepted,
                      tuple(per_pos[i] / drafts for i in sorted(per_pos)), 1 + accepted / drafts)


def _first(record: dict, *names: str):
    return next((record[n] for n in names if record.get(n) is not None), None)


def _sglang(records: list[dict]) -> Production:
    metas = [r.get("meta_info", r) for r in records]
    metas = [m for m in metas if isinstance(m, dict) and m.get("spec_verify_ct")]
    if not metas:
        raise ProductionError("These SGLang responses verified no draft (spec_verify_ct is 0 or missing): was the "
                              "server launched with --speculative-algorithm?")
    steps = sum(int(m["spec_verify_ct"]) for m in metas)
    counted = [_first(m, "spec_num_correct_drafts", "spec_accept_token_num", "spec_accepted_drafts") for m in metas]
    accepted = sum(int(c) if c is not None else int(m.get("completion_tokens", 0)) - 1 - int(m["spec_verify_ct"])
                   for c, m in zip(counted, metas))
    proposed = [_first(m, "spec_num_proposed_drafts", "spec_draft_token_num", "spec_proposed_drafts") for m in metas]
    hist: list[int] = []
    for m in metas:
        for k, n in enumerate(_first(m, "spec_correct_drafts_histogram", "spec_accept_histogram") or ()):
            hist += [0] * (k + 1 - len(hist))
            hist[k] += int(n)
    per_pos = tuple(sum(hist[i:]) / sum(hist) for i in range(1, len(hist))) if sum(hist) else ()
    drafted = sum(int(p) for p in proposed) if all(p is not None for p in proposed) else None
    words = f"SGLang meta_info of {len(metas)} request{'s' if len(metas) > 1 else ''}"
    return Production(words, steps, drafted, max(0, accepted), per_pos, 1 + max(0, accepted) / steps)


def _llamacpp(records: list[dict]) -> Production:
    timings = [r["timings"] for r in records if isinstance(r.get("timings"), dict)]
    if not any(t.get("draft_n") for t in timings):
        raise ProductionError("These llama.cpp timings have no draft_n: the server writes it once a draft was made "
                              "(start it with --spec-type, for example ngram-simple).")
    drafted = sum(int(t.get("draft_n", 0)) for t in timings)  # every request counts: τ is over every step
    accepted = sum(int(t.get("draft_n_accepted", 0)) for t in timings)
    decoded = sum(int(t.get("predicted_n", 0)) - 1 for t in timings)
    forwards = decoded - accepted
    tau = decoded / forwards if forwards > 0 else None
    words = f"llama.cpp timings of {len(timings)} request{'s' if len(timings) > 1 else ''}"
    return Production(words, None, drafted, accepted, (), tau,
                      "tokens per forward over every step (llama.cpp reports no count of draft rounds)")


def from_traces(traces, source: str = "this run") -> Production | None:
    """The same figures for a run here (``CycleTrace`` list): steps that verified a draft, their draft tokens (the
    verified tree's nodes), accepted tokens and acceptance by position; None when no cycle drafted."""
    drafted = [t for t in traces if t.mode not in ("prefill", "ar")]
    if not drafted:
        return None
    accepted = [len(t.accepted) for t in drafted]
    longest = max(max(accepted), max(max(t.tree.depths) for t in drafted))
    per_pos = tuple(sum(a >= i for a in accepted) / len(drafted) for i in range(1, longest + 1))
    return Production(source, len(drafted), sum(len(t.tree) - 1 for t in drafted), sum(accepted), per_pos,
                      1 + sum(accepted) / len(drafted))
