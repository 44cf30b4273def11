"""The page's policies on AR's timing and the race's length: when AR is timed for a speedup, how much of it, how many
timings a visitor keeps, and how long a race is expected to take (what ``engine.product.runs.race.Pacer`` scales).

No drawing and no page here: the page (``page/``) asks these and shows the answers.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from itertools import islice

from engine.decoding.config import DecodeConfig
from engine.decoding.trace import CycleTrace
from engine.product.models.loaded import LoadedModel
from engine.product.runs.decoder import make_decoder
from engine.product.runs.run import ArTiming, Speedup

AR_TIMING_TOKENS = 128  # the AR run that times the speedup decodes at most this many tokens (one-token forwards)
AR_CLOCK_ENTRIES = 32  # AR timings a visitor keeps (per model, prompt and max new tokens), oldest out
RACE_SECONDS = 20  # the race plays over about this many seconds by default (a 128-token SmolLM2 race on a CPU)


def ar_timing_due(method: str, known: ArTiming | None, stopped: bool) -> bool:
    """Whether AR is timed beside a run of ``method`` (``ArBeside``): not for an AR run (its own speed is AR's), not
    when the visitor has AR's timing on this prompt already (``known``), not after Stop."""
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


class ArBeside:
    """AR timed step for step beside a run, as the Race times its lanes: after each of the run's cycles, AR's own
    decoder (its own KV cache; the same model, device, dtype and engine thread) takes as many one-token steps as
    that cycle committed, so both are timed under the same load on the machine (the page's browser drawing on the
    same cores, another visitor's page, another process); the steps AR has left when the run ends run then.  AR
    decodes at most ``AR_TIMING_TOKENS``.  Each step is engine time of AR's own; the run's engine time is not
    touched (a cycle's clock stops while its consumer waits)."""

    def __init__(self, lm: LoadedModel, ids: list[int], config: DecodeConfig, curve,
                 should_stop: Callable[[], bool]) -> None:
        ar = make_decoder(lm, config.with_(method="ar", max_new_tokens=min(config.max_new_tokens, AR_TIMING_TOKENS)),
                          lm.eos_token_ids, cost_curve=curve)
        self._steps = ar.generate(ids, should_stop=should_stop)
        self.traces: list[CycleTrace] = []

    def paced(self, traces: Iterator[CycleTrace]) -> Iterator[CycleTrace]:
        """``traces`` (the run's cycles) as they come, AR's steps for each cycle's tokens run after it."""
        for trace in traces:
            yield trace
            self.traces.extend(islice(self._steps, len(trace.new_tokens)))

    def finish(self) -> ArTiming | None:
        """AR's remaining steps run; its decode-phase timing (source "beside"), or None when Stop ended it."""
        self.traces.extend(self._steps)
        if not self.traces or not self.traces[-1].finished:
            return None
        return ArTiming.of(self.traces, "beside")


def race_predicted_s(known: ArTiming | None, curve, max_new_tokens: int, prompt_tokens: int) -> float:
    """How long AR's lane of a race is expected to take (s of engine time): the visitor's AR timing on this prompt
    when it covers the race's tokens, else one-token forwards read off the cost curve ``curve``; plus the prefill."""
    if known is not None and known.tokens >= max_new_tokens - 1:
        decode_s = known.seconds
    elif curve is not None:
        decode_s = curve.latency(1) * max_new_tokens / 1000
    else:
        decode_s = 0.0
    return decode_s + (curve.latency(prompt_tokens) / 1000 if curve is not None else 0.0)


def race_wall_s(race_seconds: float, ar_s: float, speedup: float | None) -> float:
    """How long a race lasts on screen (s): the lanes take turns on one device, so the wall time is at least both
    lanes' engine time, AR's (``ar_s``, ``race_predicted_s``) and the method's (AR's over ``speedup``, the
    visitor's last measured speedup on this prompt; as long as AR's where none is known), and at least
    ``race_seconds`` (0: real time)."""
    method_s = ar_s / speedup if speedup and speedup > 1 else ar_s
    return max(float(race_seconds or 0), ar_s + method_s)
