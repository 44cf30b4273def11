"""The page's policies on AR's timing and the race's length: when AR is timed for a speedup, how much of it, how many
timings a visitor keeps, and how long a race is expected to take (what ``engine.product.race.Pacer`` scales).

No drawing and no page here: the page (``page/``) asks these and shows the answers.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

from engine.decoding.config import DecodeConfig
from engine.decoding.trace import CycleTrace
from engine.product.decoding import make_decoder
from engine.product.loading import LoadedModel
from engine.product.run import ArTiming, Speedup

AR_TIMING_TOKENS = 128  # the AR run that times the speedup decodes at most this many tokens (one-token forwards)
AR_CLOCK_ENTRIES = 32  # AR timings a visitor keeps (per model, prompt and max new tokens), oldest out
RACE_SECONDS = 20  # the race plays over about this many seconds by default (a 128-token SmolLM2 race on a CPU)


def ar_timing_due(method: str, known: ArTiming | None, stopped: bool) -> bool:
    """Whether AR is timed after a run of ``method``: not for an AR run (its own speed is AR's), not when the
    visitor has AR's timing on this prompt already (``known``), not after Stop."""
    return method != "ar" and known is None and not stopped


def run_speedup(traces: Sequence[CycleTrace], method: str, known: ArTiming | None,
                stopped: bool) -> tuple[ArTiming | None, Speedup]:
    """After a run of ``method`` (``stopped``: ended by Stop), and after AR's timing when ``ar_timing_due``: the AR
    timing to keep for its prompt (None: none) and the speedup to show beside τ.  An AR run that finished is its
    own AR timing."""
    if method == "ar":  # this run is AR: its own speed is AR's on this prompt
        known = ArTiming.of(traces, "ar") if not stopped else known
        return known, Speedup(1.0, "this run is AR") if known is not None else Speedup(None, "stopped: not measured")
    if known is None and stopped:
        return None, Speedup(None, "not measured: the run was stopped")
    return known, Speedup.of(traces, known) if known is not None else Speedup(None, "not measured: stopped")


def time_ar(lm: LoadedModel, ids: list[int], config: DecodeConfig, curve,
            should_stop: Callable[[], bool]) -> ArTiming | None:
    """AR's decode-phase speed on this prompt, timed now on the same device, model and dtype: an AR run of the
    engine (one-token forwards, at most ``AR_TIMING_TOKENS``; ~60 ms each for SmolLM2 on a 2-core CPU, ~5 ms for
    the demo model), in engine time (tokens/s).  None when Stop (``should_stop``) ended it first."""
    ar = make_decoder(lm, config.with_(method="ar", max_new_tokens=min(config.max_new_tokens, AR_TIMING_TOKENS)),
                      lm.eos_token_ids, cost_curve=curve)
    traces = list(ar.generate(ids, should_stop=should_stop))
    if not traces or not traces[-1].finished:
        return None
    return ArTiming.of(traces, "ar")


def race_predicted_s(known: ArTiming | None, curve, max_new_tokens: int, prompt_tokens: int) -> float:
    """How long AR's lane of a race is expected to take (s of engine time): the visitor's AR timing on this prompt
    when it covers the race's tokens, else one-token forwards read off the cost curve ``curve``; plus the prefill."""
    decode_s = (known.seconds if known is not None and known.tokens >= max_new_tokens - 1 else
                curve.latency(1) * max_new_tokens / 1000)
    return decode_s + curve.latency(prompt_tokens) / 1000
