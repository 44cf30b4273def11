"""One recorded run: what the page streams, scrubs, exports and replays (trace files: ``engine/product/io/traces.py``).

A run recorded on the page and a run imported from a trace file are the same type; an imported run
carries its own token texts (``token_text``), so it replays with no model loaded.

Also what a run's speed is worth against AR's on the same prompt (``ArTiming``, ``Speedup``) and what its
forwards cost in AR steps on a cost curve (``ar_steps_per_forward``): a big τ is not a speedup when a forward
over many rows costs several one-token forwards (a CPU).
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from engine.decoding.config import DecodeConfig
from engine.decoding.trace import CycleTrace
from engine.product.io.traces import RunHeader, export_run, load_run


@dataclass
class Run:
    """A run's record.

    Attributes:
        model: model id (never a machine path).
        prompt: the prompt text.
        prompt_format: "chat" or "raw", what the prompt went through; None when unknown (older trace files).
        config: ``DecodeConfig.to_dict()`` as used; an imported run's may not make a valid config on this
            version (``decode_config`` says why).
        traces: every cycle, prefill first (``traces[k].index == k``).
        token_text: token id -> text of an imported run; None: the loaded tokenizer decodes.
        segments: (text, label) of every output token, as the page colours it (filled by the page:
            labels are the figures' business).
        token_cycles: the cycle that committed each output token.
        cost_curve: the spec of the cost curve the run's GT rule read (``CostCurve.spec``), so its command
            reproduces its trees; None when it read none (or an older trace file did not say).
        ar_timing: AR's speed on the same prompt that the run's speedup was measured against (``ArTiming``), kept
            so that an imported run shows the speedup it showed; None: not measured.
        shown_curve: the spec of the cost curve the page's cost sentence read ("τ … at … AR steps per forward"):
            ``cost_curve``, or the device's cached curve where the run's GT rule read none; None: no sentence.
        runs: what ran its forwards ({"dtype", "forward_path", "weights"}: ``LoadedModel.runs.to_dict()``); None:
            not said (an older trace file).
    """

    model: str
    prompt: str
    prompt_format: str | None
    config: dict
    traces: list[CycleTrace] = field(default_factory=list)
    token_text: dict[int, str] | None = None
    segments: list[tuple[str, str]] = field(default_factory=list)
    token_cycles: list[int] = field(default_factory=list)
    cost_curve: str | None = None
    ar_timing: ArTiming | None = None
    shown_curve: str | None = None
    runs: dict | None = None

    def record(self, trace: CycleTrace, segments: list[tuple[str, str]]) -> None:
        """Append one cycle and the (text, label) segments of the tokens it committed."""
        self.traces.append(trace)
        self.segments.extend(segments)
        self.token_cycles.extend([trace.index] * len(trace.new_tokens))

    def text_of(self, decode: Callable[[int], str] | None) -> Callable[[int], str]:
        """Token id -> text: the run's own table when it has one (imported), else ``decode`` (the tokenizer)."""
        if self.token_text is not None:
            table = self.token_text
            return lambda i: table.get(i, f"<{i}>")
        if decode is None:
            raise ValueError("a recorded run needs the tokenizer to show its tokens")
        return decode

    def decode_config(self) -> DecodeConfig:
        """``config`` as a ``DecodeConfig`` (JSON lists made tuples; fields this version lacks are dropped).

        Raises:
            ConfigError / TypeError: the record does not make a valid config here.
        """
        return DecodeConfig.from_dict(self.config)

    def to_trace_file(self, token_text: Callable[[int], str]) -> str:
        """The run as a trace file's JSON text (``engine.product.io.traces.export_run``); ``token_text`` decodes its
        ids."""
        header = RunHeader(model=self.model, prompt=self.prompt, config=self.config, prompt_format=self.prompt_format,
                           cost_curve=self.cost_curve, shown_curve=self.shown_curve, runs=self.runs,
                           ar_timing=self.ar_timing.to_dict() if self.ar_timing is not None else None)
        return export_run(header=header, traces=self.traces, token_text=token_text)

    @classmethod
    def from_trace_file(cls, data: bytes | str) -> Run:
        """A run read back from a trace file (``engine.product.io.traces.load_run``; ``segments`` left for the page).

        Raises:
            TraceFormatError: too large, not JSON, another schema or version, or a malformed field.
        """
        doc = load_run(data)
        ar = doc["ar_timing"]
        run = cls(model=doc["model"], prompt=doc["prompt"], prompt_format=doc["prompt_format"], config=doc["config"],
                  token_text=doc["token_text"], cost_curve=doc["cost_curve"], shown_curve=doc["shown_curve"],
                  runs=doc["runs"],
                  ar_timing=ArTiming.from_dict(ar) if ar is not None else None)
        for trace in doc["traces"]:
            run.record(trace, [])
        return run


#: The page's one speedup over AR, in the words every place that shows one uses (Generate's big number, the Race's
#: board, the Sweep's table and figure, the bench's summary and report): tokens/s over AR's on the same prompt, in
#: the decode phase (every cycle after the prefill, which is the same for every method), on the engine's clock
#: (forwards and drafting; not drawing, not waiting).  ``speedup_over_ar`` computes it.
SPEEDUP_PHASE = "decode phase"
SPEEDUP_WORDS = f"{SPEEDUP_PHASE}, engine time"


def speedup_over_ar(tokens: int, seconds: float, ar_tokens: int, ar_seconds: float) -> float | None:
    """The one speedup (``SPEEDUP_WORDS``): a run's decode-phase tokens/s (``tokens`` in ``seconds`` after the
    prefill, engine time) over AR's (``ar_tokens`` in ``ar_seconds``, the same phase and clock).  None where
    either decoded nothing."""
    if not tokens or seconds <= 0 or not ar_tokens or ar_seconds <= 0:
        return None
    return (tokens / seconds) / (ar_tokens / ar_seconds)


def decode_phase(traces: Sequence[CycleTrace]) -> tuple[int, float]:
    """(tokens, engine seconds) of a run's decode phase: every cycle after the prefill.  The prefill (one
    forward over the prompt, giving the first token) is the same for every method on a prompt, so speeds
    compared over the decode phase compare only what the methods do differently."""
    if len(traces) < 2:
        return 0, 0.0
    tokens = sum(len(t.new_tokens) for t in traces[1:])
    return tokens, max(0.0, traces[-1].elapsed_s - traces[0].elapsed_s)


def decode_rel_err(traces: Sequence[CycleTrace]) -> float | None:
    """The relative standard error of a run's decode-phase tokens/s from the clock's jitter.  A greedy run's tokens
    are fixed by its text, so only the forwards' times vary: each cycle's time d_i is compared with the median time
    of the cycles that verified as many rows (groups of two or more), their pooled relative spread σ taken as every
    forward's, and the error of Σ d_i is σ sqrt(Σ d_i²) / Σ d_i.  It covers jitter within the run, not drift
    between two runs (another process, the CPU's clock).  None when no two decode cycles verified as many rows."""
    cycles = list(traces[1:])
    times = [t.elapsed_s - prev.elapsed_s for prev, t in zip(traces, cycles)]  # (k,) s per decode cycle
    groups: dict[int, list[float]] = {}
    for t, d in zip(cycles, times):
        groups.setdefault(len(t.tree) + t.ptd_rows, []).append(d)
    medians = {rows: statistics.median(ds) for rows, ds in groups.items() if len(ds) > 1}
    deviations = [d / medians[rows] - 1.0 for rows, ds in groups.items() if medians.get(rows, 0) > 0 for d in ds]
    if not deviations or sum(times) <= 0:
        return None
    sigma = math.sqrt(sum(x * x for x in deviations) / len(deviations))
    return sigma * math.sqrt(sum(d * d for d in times)) / sum(times)


@dataclass(frozen=True)
class ArTiming:
    """AR's decode-phase speed on one prompt, model, dtype and max new tokens, in engine time.

    Attributes:
        tokens: AR's tokens after the prefill.
        seconds: their engine seconds (s).
        source: where it was timed: "ar" (an AR run on this device, right after the run) or "race" (the
            race's AR lane, on the race's shared clock).
        rel_err: the relative standard error of its tokens/s (``decode_rel_err``); None: unknown.
    """

    tokens: int
    seconds: float
    source: str = "ar"
    rel_err: float | None = None

    @property
    def tok_per_s(self) -> float:
        """AR's decode-phase tokens/s (0 when nothing was decoded)."""
        return self.tokens / self.seconds if self.tokens and self.seconds > 0 else 0.0

    @classmethod
    def of(cls, traces: Sequence[CycleTrace], source: str = "ar") -> ArTiming:
        """The decode phase of an AR run's cycles (``decode_phase``, ``decode_rel_err``)."""
        return cls(*decode_phase(traces), source, decode_rel_err(traces))

    def to_dict(self) -> dict:
        """JSON-ready (a trace file's ``ar_timing``)."""
        return {"tokens": self.tokens, "seconds": self.seconds, "source": self.source, "rel_err": self.rel_err}

    @classmethod
    def from_dict(cls, d: dict) -> ArTiming:
        """The inverse of ``to_dict``.

        Raises:
            KeyError / TypeError / ValueError: not an ``ArTiming``'s fields."""
        rel = d.get("rel_err")
        return cls(int(d["tokens"]), float(d["seconds"]), str(d.get("source", "ar")),
                   None if rel is None else float(rel))


SOURCE_WORDS = {"ar": "AR timed on this device", "race": "AR's lane of the race, on its clock",
                "beside": "AR timed step for step beside this run (the same load on the machine)"}
SHORT_WORDS = {"ar": "AR timed here", "race": "race's AR lane", "beside": "AR timed beside the run"}


#: decode-phase τ (tokens per verification forward after the prefill) below which a run can have no speedup: each
#: forward wrote about one token, as an AR step does, and costs at least one AR step, so any measured gain is the
#: clock's noise (at most 1 %, below what two runs of a few seconds resolve).
NO_GAIN_TAU = 1.01
Z95 = 1.96  # a 95 % interval: ± 1.96 standard errors


@dataclass(frozen=True)
class Speedup:
    """A run's speed over AR's (decode phase, engine time), and where AR's speed comes from.

    Attributes:
        value: the run's decode-phase tokens/s ÷ AR's (``ArTiming.tok_per_s``); None = not measured, or no
            speedup possible (``none``).
        note: for people: where AR's speed comes from and what the ± covers, or why there is no value
            ("measuring…", "stopped", "τ 1.00: no draft token accepted").
        pending: AR is being timed now.
        short: ``note`` in a few words, for small print (default: ``note``).
        margin: half the 95 % interval of ``value`` (×), from the spread of both runs' forwards
            (``decode_rel_err``); None: unknown.
        none: the run could have no speedup (decode-phase τ below ``NO_GAIN_TAU``): shown as "no speedup",
            never as the clock's noise.
        cycles: the run's decode cycles it was measured over.
        ar: the AR timing it was measured against.
    """

    value: float | None = None
    note: str = "not measured"
    pending: bool = False
    short: str = ""
    margin: float | None = None
    none: bool = False
    cycles: int = 0
    ar: ArTiming | None = None

    @classmethod
    def of(cls, traces: Sequence[CycleTrace], ar: ArTiming | None) -> Speedup:
        """The speedup of a run's cycles over ``ar``, with its 95 % margin; no value when either decoded nothing,
        "no speedup" when the run's decode-phase τ is below ``NO_GAIN_TAU``."""
        tokens, seconds = decode_phase(traces)
        value = speedup_over_ar(tokens, seconds, ar.tokens, ar.seconds) if ar is not None else None
        if value is None:
            return cls(None, "not measured" if ar is None else "nothing decoded to compare")
        tau = tokens / (len(traces) - 1)
        if tau < NO_GAIN_TAU:
            return cls(None, f"no speedup: τ {tau:.2f} after the prefill, so each forward wrote one token as an AR "
                             f"step does and cost at least as much; the clocks read {value:.2f}×, which is timing "
                             f"noise", short=f"τ {tau:.2f}: nothing to gain", none=True)
        errs = [e for e in (decode_rel_err(traces), ar.rel_err) if e is not None]
        margin = Z95 * value * math.sqrt(sum(e * e for e in errs)) if errs else None
        spread = (f";{cls(value, margin=margin).spread()}: 95 % interval from the spread of the forwards' times in "
                  f"{'both runs' if len(errs) == 2 else 'the run'} (drift between the two runs not included)"
                  if margin is not None else "")
        return cls(value, f"{SPEEDUP_WORDS}; {SOURCE_WORDS.get(ar.source, ar.source)}: {ar.tok_per_s:.0f} tok/s "
                          f"over {ar.tokens} tokens{spread}",
                   short=f"{SPEEDUP_PHASE} · {SHORT_WORDS.get(ar.source, ar.source)}", margin=margin,
                   cycles=len(traces) - 1, ar=ar)

    def spread(self) -> str:
        """The 95 % interval (``bounds``) as people read it after the value: " ± 0.06", or " [0.41–8.6×]" where it
        is the logarithm's; "" without a margin."""
        bounds = self.bounds()
        if bounds is None:
            return ""
        if self.margin < self.value:
            return f" ± {self.margin:.2f}"
        low, high = bounds
        return f" [{low:.2f}–{high:.{2 if high < 10 else 1 if high < 100 else 0}f}×]"

    @property
    def undecided(self) -> bool:
        """Whether the 95 % interval (``bounds``) holds 1×: the clocks cannot tell the run from AR (the page says so
        in words and points to the Race rather than show a number that may read as "slower")."""
        bounds = self.bounds()
        return bounds is not None and bounds[0] < 1 < bounds[1]

    def bounds(self) -> tuple[float, float] | None:
        """The 95 % interval of the speedup (×): value ± margin, or, where value − margin would reach 0× (forwards
        whose times spread widely: a busy machine, e.g. a browser drawing on the same two cores), the interval of its
        logarithm, value ÷ and × exp(margin / value): the same to first order in the relative error, and never below
        0× (a browser walk-through read "1.88× ± 5.92"); None without a value or a margin."""
        if self.value is None or self.margin is None:
            return None
        if self.margin < self.value:
            return self.value - self.margin, self.value + self.margin
        factor = math.exp(self.margin / self.value)
        return self.value / factor, self.value * factor

    def words(self) -> str | None:
        """The value as people read it: "1.52× ± 0.06", "1.52×", "no speedup", "too close to call (1.01× ± 0.27)",
        "too close to call (1.88× [0.41–8.6×])" (``spread``); None when not measured."""
        if self.none:
            return "no speedup"
        if self.undecided:
            return f"too close to call ({self.value:.2f}×{self.spread()})"
        if self.value is None:
            return None
        return f"{self.value:.2f}×{self.spread()}"


MEASURING = Speedup(None, "measuring AR on this device …", pending=True, short="timing AR here …")
FEW_CYCLES = 20  # a speedup over fewer decode cycles than this rests on too few forwards to average their jitter
LOAD_SHIFT = 0.10  # AR's own tokens/s differing by more than this share between two timings: the load changed


def disagreement(now: Speedup, now_name: str, then: Speedup | None, then_name: str) -> str:
    """One sentence where two measurements of the same speedup (the same prompt, model and settings: ``now`` and an
    earlier ``then``, each named for people, e.g. "this race", "Generate") differ beyond their 95 % margins, naming
    why: the load on the machine changed while measuring (AR's own tokens/s moved by more than ``LOAD_SHIFT``), too
    few cycles (under ``FEW_CYCLES``), else drift between the runs, which neither margin covers; "" where they
    agree (or either has no value)."""
    if then is None or now.value is None or then.value is None:
        return ""
    if abs(now.value - then.value) <= math.hypot(now.margin or 0.0, then.margin or 0.0):
        return ""
    why = []
    a, b = now.ar, then.ar
    if a is not None and b is not None and a.tok_per_s and b.tok_per_s and abs(a.tok_per_s / b.tok_per_s - 1) > (
            LOAD_SHIFT):
        why.append(f"AR itself ran at {b.tok_per_s:.0f} tok/s for {then_name} and {a.tok_per_s:.0f} for {now_name}, "
                   "so the load on the machine changed while measuring")
    few = [(name, s.cycles) for name, s in ((then_name, then), (now_name, now)) if 0 < s.cycles < FEW_CYCLES]
    why += [f"{name} rests on only {n} cycles, too few to average the forwards' jitter" for name, n in few]
    if not why:
        why.append("the machine's speed drifted between the two runs (another process, the CPU's clock), which "
                   "neither margin covers")
    return (f"{then_name}'s {then.words()} and {now_name}'s {now.words()} differ by more than their margins: "
            + "; ".join(why) + ".")


def ar_steps_per_forward(traces: Sequence[CycleTrace], curve) -> float | None:
    """Mean cost of the run's verification forwards in AR steps: the mean over its cycles (prefill excluded)
    of T(rows) / T(1) on ``curve`` (``engine.decoding.cost.CostCurve``; rows = the tree's nodes + ride-along PTD rows).
    τ divided by it is the speedup the curve predicts.  None without a curve or a cycle."""
    rows = [len(t.tree) + t.ptd_rows for t in traces if t.mode != "prefill"]
    if curve is None or not rows:
        return None
    t = curve.latencies(max(rows))
    return sum(t[n - 1] for n in rows) / len(rows) / t[0]
