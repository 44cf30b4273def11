"""A parameter sweep's model: the parameters one may sweep, the values read from text, the runs (each against AR
timed once), the sweep's sentence and table.  The command line and its files are cli/sweep.py; the
figure is viz/sweep_figure.py.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from engine.core.forward import ForwardPath
from engine.decoding.config import SOURCES, ConfigError, DecodeConfig, parse_gt_threshold
from engine.decoding.cost import CostCurve
from engine.decoding.trace import CycleTrace
from engine.product.io.settings import SETTINGS
from engine.product.runs.decoder import make_decoder
from engine.product.runs.lossless import Divergence, attribute, engine_ar_logits, first_difference
from engine.product.runs.metrics import summarize
from engine.product.runs.run import NO_GAIN_TAU, SPEEDUP_PHASE, ArTiming, Speedup, decode_phase
from engine.sources import REGISTRY

#: Most values one sweep runs: each is a whole generation, so a long list is a long wait on a page.
MAX_VALUES = 12


@dataclass(frozen=True)
class Parameter:
    """A sweepable ``DecodeConfig`` setting.

    Attributes:
        field: the setting's flat name (``config.FLAT_NAMES``: ``DecodeConfig.with_`` / ``get`` take it).
        symbol: how labels name it ("B" in "B = 16"); "" = the value alone labels a run ("goose", "pld+tr").
        what: its name for people, for axis titles ("node budget B").
        kind: how a value's text is read: "int", "ratio" (a number or auto), "threshold" (a number, auto or
            chord), "method" (a name) or "sources" (names joined by "+").
    """

    field: str
    symbol: str
    what: str
    kind: str


#: What a sweep may vary, by the setting's flat name: the settings declared sweepable (``Shown.sweep``,
#: ``engine.product.io.settings.SETTINGS``), those with a paper's symbol (B, r, D, c) first.
PARAMETERS: dict[str, Parameter] = {
    s.name: Parameter(s.name, s.shown.symbol, s.shown.words, s.shown.sweep)
    for s in sorted(SETTINGS.values(), key=lambda s: not s.shown.symbol) if s.shown.sweep is not None}
#: Other spellings people use for them: earlier names (the page's ``depth``) and the symbols.
ALIASES = {"depth": "max_depth", "b": "budget", "r": "spine_ratio", "d": "max_depth", "c": "gt_threshold"}

_KIND_WORDS = {"int": "whole numbers", "ratio": "numbers or auto", "threshold": "numbers, auto or chord"}
#: methods that mix ``DecodeConfig.sources``; the single-source methods and AR ignore the field
_MIXING = ("goose", "iso3", "iso5")


@dataclass(frozen=True)
class SweepSpec:
    """One parameter and the values a sweep runs, in order.

    Attributes:
        parameter: the setting's flat name (a key of ``PARAMETERS``).
        values: its values as the config takes them (int B / D; float r, None = adaptive; float c, "auto",
            "chord"; method name; tuple of source names in ``config.SOURCES`` order), each once.
    """

    parameter: str
    values: tuple[Any, ...]

    @classmethod
    def parse(cls, param: str, text: str) -> SweepSpec:
        """The spec of a parameter name (``PARAMETERS`` or ``ALIASES``; case, "-" and "_" alike) and a
        comma-separated list of values ("4,8,16", "0.3,auto", "goose,pld", "pld+tr,pld+tr+ptd").

        Raises:
            ConfigError: one sentence: an unknown parameter, no value, more than ``MAX_VALUES``, a value that
                does not read (not a number, an unknown source), one out of range (``DecodeConfig``'s own
                message), or one given twice.
        """
        key = param.strip().lower().replace("-", "_")
        name = ALIASES.get(key, key)
        if name not in PARAMETERS:
            raise ConfigError(f"cannot sweep {param.strip()!r}: choose one of {', '.join(PARAMETERS)}")
        items = [item.strip() for item in text.split(",") if item.strip()]
        if not items:
            raise ConfigError(f"no values to sweep {name} over: give a comma-separated list, e.g. "
                              f"{_EXAMPLES[PARAMETERS[name].kind]}")
        if len(items) > MAX_VALUES:
            raise ConfigError(f"{len(items)} values are more than a sweep runs ({MAX_VALUES}): each value is a "
                              "whole generation, so split the list")
        values = [_read(PARAMETERS[name], item) for item in items]
        for value in values:
            DecodeConfig().with_(**{name: value})  # the config's own range check and message
        spec = cls(name, tuple(values))
        seen: dict[Any, str] = {}
        for item, value in zip(items, values):
            if value in seen:
                same = "" if seen[value] == item else f" ({seen[value]!r} and {item!r} are the same value)"
                raise ConfigError(f"{name} lists {spec.text(value)} twice{same}: give each value once")
            seen[value] = item
        return spec

    @property
    def info(self) -> Parameter:
        """The swept parameter's ``Parameter`` (symbol, name for people, kind)."""
        return PARAMETERS[self.parameter]

    def text(self, value: Any) -> str:
        """A value as a sweep's list writes it: "16", "0.5", "auto" (r = None), "chord", "goose", "pld+tr"."""
        if value is None:
            return "auto"
        if isinstance(value, tuple):
            return "+".join(value) or "none"
        if isinstance(value, float):
            short = f"{value:g}"
            return short if float(short) == value else repr(value)  # short where exact: 0.123456789 stays whole
        return str(value)

    def label(self, value: Any) -> str:
        """A run's name for people: "B = 16", "r = auto", "c = 0.1"; a method or source set is its own name."""
        symbol = self.info.symbol
        return f"{symbol} = {self.text(value)}" if symbol else self.text(value)

    def configs(self, base: DecodeConfig) -> list[DecodeConfig]:
        """``base`` with the parameter set to each value, in order.

        Raises:
            ConfigError: a value out of range with ``base`` (``DecodeConfig``'s message), or a source sweep
                on a method that ignores its sources (pld, tr, ptd, suffix, ar).
        """
        if self.parameter == "sources" and base.method not in _MIXING:
            raise ConfigError(f"method {base.method} drafts with its own source only, so a sweep of the sources "
                              f"would run it {len(self.values)} times alike: use {', '.join(_MIXING)}")
        return [base.with_(**{self.parameter: value}) for value in self.values]

    def needs_cost_curve(self, base: DecodeConfig) -> bool:
        """True when some run reads a cost curve (GT threshold "auto" or "chord")."""
        return any(c.needs_cost_curve for c in self.configs(base))


_EXAMPLES = {"int": "4,8,16,32", "ratio": "0.3,0.5,auto", "threshold": "0,0.1,auto,chord",
             "method": "goose,pld,tr", "sources": "pld+tr,pld+tr+ptd"}


def _read(param: Parameter, item: str) -> Any:
    """One value's text as ``param``'s field takes it; ``ConfigError`` when it does not read."""
    word = item.lower()
    try:
        if param.kind == "int":
            return int(item)
        if param.kind == "ratio":
            return None if word == "auto" else float(item)
        if param.kind == "threshold":
            return parse_gt_threshold(item)
    except ValueError:
        raise ConfigError(f"{param.field} values must be {_KIND_WORDS[param.kind]} (got {item!r})") from None
    if param.kind == "method":
        return word
    names = [name.strip() for name in word.split("+") if name.strip()]
    known = [i.name for i in REGISTRY]
    unknown = [name for name in names if name not in known]
    if unknown or not names:
        raise ConfigError(f"{item!r} is not a set of draft sources: join names among {', '.join(known)} with '+', "
                          "e.g. pld+tr")
    return tuple(s for s in SOURCES if s in names)


@dataclass(frozen=True)
class SweepRun:
    """One value's run.

    Attributes:
        index: the run's place in the sweep (0 = the first value); the figure's ``customdata``.
        value: the parameter's value (as ``SweepSpec.values`` holds it).
        label: its name for people ("B = 16").
        text: the value as the list writes it ("16"), the figure's x.
        config: the ``DecodeConfig`` as the decoder ran it (GT "chord" resolved to its c).
        traces: every cycle, prefill first.
        tokens: the generated token ids.
        tau: tokens per verification forward, prefill included (``metrics.summarize``).
        tok_per_s: decode-phase tokens/s, engine time (``run.decode_phase``: the prefill is the same for every run).
        speedup: decode-phase tokens/s over AR's (``run.Speedup``); None when either decoded nothing.
        mean_nodes: mean tree nodes per verification forward, root included, prefill excluded.
        first_difference: index (0 = the first new token) of the first token where ``tokens`` differ from AR's
            (over AR's first ``len(tokens)`` when the run was stopped), None when identical; always None in
            sampling mode, where nothing is compared.
        finished: False when a stop request ended the run early.
    """

    index: int
    value: Any
    label: str
    text: str = ""
    config: DecodeConfig | None = None
    traces: tuple[CycleTrace, ...] = ()
    tokens: tuple[int, ...] = ()
    tau: float = 0.0
    tok_per_s: float = 0.0
    speedup: float | None = None
    mean_nodes: float = 1.0
    first_difference: int | None = None
    finished: bool = True

    @property
    def accepted_drafts(self) -> int:
        """Draft tokens the target accepted over the run (bonus tokens excluded)."""
        return sum(len(t.accepted) for t in self.traces)

    @property
    def cycles(self) -> int:
        """Verification forwards after the prefill."""
        return max(0, len(self.traces) - 1)


@dataclass(frozen=True)
class Sweep:
    """A sweep's state: what ``run_sweep`` yields after AR and after each run (the last one holds it all).

    Attributes:
        spec: the parameter and values.
        base: the config every run starts from (the parameter replaced per run).
        ar: AR's decode-phase timing (None until timed, or when a stop came first).
        ar_tokens: AR's token ids, the text every greedy run is compared with.
        runs: the runs so far, in value order.
        stopped: a stop request ended the sweep (the last run may be partial: ``SweepRun.finished``).
        seconds: wall seconds since the sweep started (s): AR's run and every value's, with the sweep's own
            bookkeeping; model load and cost-curve measurement are the caller's.
        cost_curve: the curve every run read (None when no run's GT rule needed one).
    """

    spec: SweepSpec
    base: DecodeConfig
    ar: ArTiming | None = None
    ar_tokens: tuple[int, ...] = ()
    runs: tuple[SweepRun, ...] = ()
    stopped: bool = False
    seconds: float = 0.0
    cost_curve: CostCurve | None = field(default=None, repr=False)

    @property
    def total(self) -> int:
        """Runs the sweep makes (AR's not counted)."""
        return len(self.spec.values)

    @property
    def done(self) -> int:
        """Runs that finished."""
        return sum(r.finished for r in self.runs)

    @property
    def fraction(self) -> float:
        """Progress in [0, 1] for a progress bar: AR's run counts as one step, each value's as one."""
        return (self.done + (self.ar is not None)) / (self.total + 1)

    @property
    def complete(self) -> bool:
        """Every value ran to its end."""
        return not self.stopped and self.done == self.total

    @property
    def sampling(self) -> bool:
        return self.base.sampling


def run_sweep(lm, prompt_ids: list[int], base_config: DecodeConfig, spec: SweepSpec, cost_curve: CostCurve | None,
              should_stop: Callable[[], bool] | None = None) -> Iterator[Sweep]:
    """Time AR on the prompt, then decode it once per value, then time AR again (the reference: the faster timing,
    ``_ar_again``); yield the ``Sweep`` after AR and after each run (the last one after AR's second timing).

    Every run is made comparable with the others: each gets the same ``cost_curve`` object (GT "auto" sizes
    trees from it and "chord" reads its c from it, so one curve per run would make a curve's noise look like
    the parameter's effect; resolve it once, e.g. ``cost.cached_cost_curve``; None: the first run that needs
    one resolves it and the rest reuse it), and a fresh source memory (``make_decoder(memory=None)``: the suffix
    source keeps earlier outputs, so a shared memory would let each run draft from the runs before it and the
    order of the values would decide τ).  AR runs with ``base_config``'s ``max_new_tokens`` (and temperature);
    its text is the reference each greedy run is compared with, token for token.

    Args:
        lm: the model (a ``LoadedModel``: its ``model`` and ``eos_token_ids`` are read).
        prompt_ids: the prompt's token ids.
        base_config: the config each run starts from; the swept field is replaced per run.
        spec: the parameter and its values.
        cost_curve: the verification cost curve every run reads (ms per forward against tree nodes).
        should_stop: polled between cycles (``SpecDecoder.generate``); True ends the current run there and the
            sweep after it (the last yield has ``stopped`` and the partial run).

    Yields:
        ``Sweep`` snapshots: after AR (no run yet), then after each run; the last holds every run.

    Raises:
        ConfigError: a value out of range with ``base_config`` (before any forward).
        ValueError: empty prompt; compat.UnsupportedModelError: a model or prompt length the decoder refuses.
    """
    configs = spec.configs(base_config)
    started = time.perf_counter()
    ar_decoder = make_decoder(lm, base_config.with_(method="ar"), lm.eos_token_ids, cost_curve=cost_curve)
    curve = cost_curve or ar_decoder.cost_curve
    ar_traces = list(ar_decoder.generate(prompt_ids, should_stop=should_stop))
    sweep = _after_ar(spec, base_config, ar_traces, curve, time.perf_counter() - started)
    yield sweep
    if sweep.stopped:
        return
    for index, (value, config) in enumerate(zip(spec.values, configs)):
        decoder = make_decoder(lm, config, lm.eos_token_ids, cost_curve=curve)  # memory=None: a fresh one
        curve = curve or decoder.cost_curve
        traces = list(decoder.generate(prompt_ids, should_stop=should_stop))
        run = _measure(sweep, index, value, decoder.config, traces)
        sweep = replace(sweep, runs=(*sweep.runs, run), stopped=not run.finished, cost_curve=curve,
                        seconds=time.perf_counter() - started)
        if sweep.stopped or index + 1 < len(configs):
            yield sweep
        if sweep.stopped:
            return
    yield _ar_again(sweep, ar_decoder, prompt_ids, should_stop, started)


def _after_ar(spec: SweepSpec, base: DecodeConfig, traces: list[CycleTrace], curve: CostCurve | None,
              seconds: float) -> Sweep:
    """The sweep once AR was timed (``traces``, its run): stopped, with nothing to compare with, where a stop came
    before AR finished."""
    if not traces or not traces[-1].finished:
        return Sweep(spec, base, stopped=True, seconds=seconds, cost_curve=curve)
    tokens = tuple(t for tr in traces for t in tr.new_tokens)
    return Sweep(spec, base, ArTiming.of(traces, "ar"), tokens, cost_curve=curve, seconds=seconds)


def _ar_again(sweep: Sweep, ar_decoder, prompt_ids: list[int], should_stop, started: float) -> Sweep:
    """The finished sweep with AR timed once more, after the runs, its reference the faster of the two timings
    (every run's speedup over it again): the first timing is the sweep's first decode, and on the page it read
    51.6 tok/s beside AR-step runs at 67.7-70.9 (a cold start, or the browser drawing the sweep's first frame);
    the fastest AR is the one a method has to beat.  A stop during it keeps the first."""
    traces = list(ar_decoder.generate(prompt_ids, should_stop=should_stop))
    again = ArTiming.of(traces, "ar") if traces and traces[-1].finished else None
    if again is None or sweep.ar is None or again.tok_per_s <= sweep.ar.tok_per_s:
        return replace(sweep, seconds=time.perf_counter() - started)
    runs = tuple(replace(r, speedup=Speedup.of(list(r.traces), again).value) for r in sweep.runs)
    return replace(sweep, ar=again, runs=runs, seconds=time.perf_counter() - started)


def _measure(sweep: Sweep, index: int, value: Any, config: DecodeConfig, traces: list[CycleTrace]) -> SweepRun:
    """One run's record: its numbers (``metrics.summarize``, ``run.decode_phase``, ``run.Speedup`` over
    ``sweep.ar``) and its first difference from AR's tokens (``sweep.ar_tokens``)."""
    spec, ar, ar_tokens = sweep.spec, sweep.ar, sweep.ar_tokens
    summary = summarize(traces)
    tokens, seconds = decode_phase(traces)
    ids = tuple(t for tr in traces for t in tr.new_tokens)
    finished = bool(traces[-1].finished)
    reference = ar_tokens if finished else ar_tokens[: len(ids)]
    return SweepRun(index=index, value=value, label=spec.label(value), text=spec.text(value), config=config,
                    traces=tuple(traces), tokens=ids, tau=summary.tau,
                    tok_per_s=tokens / seconds if tokens and seconds > 0 else 0.0,
                    speedup=Speedup.of(traces, ar).value, mean_nodes=summary.mean_tree_nodes,
                    first_difference=None if config.sampling else first_difference(list(reference), list(ids)),
                    finished=finished)


def summary(sweep: Sweep, divergences: dict[int, Divergence] | None = None) -> str:
    """One sentence on the sweep's texts: "All 6 runs produced AR's text token for token.", "B = 128 parted
    from AR at token 37 (a precision tie)." (token 0 = the first new token; the verdict from ``divergences``,
    ``Attributions``, where known), a stop, or, in sampling mode, that texts differ by design and nothing was
    compared."""
    if sweep.sampling:
        return (f"Sampling (temperature {sweep.base.sampler.temperature:g}): each run draws its own text by design, "
                "so no text is compared with AR's.")
    if sweep.ar is None:
        return "Stopped while AR was timed: no run to compare." if sweep.stopped else "AR is being timed."
    runs = sweep.runs
    head = ""
    if sweep.stopped and runs:
        head = f"Stopped during run {len(runs)} of {sweep.total} ({runs[-1].label}): "
    elif sweep.stopped:
        head = f"Stopped before run 1 of {sweep.total}: "
    parted = [r for r in runs if r.first_difference is not None]
    if parted:
        first, *rest = parted
        verdict = {r.index: _verdict(divergences, r) for r in parted}
        return _sentence(head, _join([f"{first.label} parted from AR at token {first.first_difference}"
                                      f"{verdict[first.index]}",
                                      *(f"{r.label} at token {r.first_difference}{verdict[r.index]}"
                                        for r in rest)]))
    if not runs:
        return _sentence(head, "no run yet")
    so_far = " so far" if sweep.stopped else ""
    if len(runs) == 1:
        return _sentence(head, f"the run{so_far} produced AR's text token for token")
    return _sentence(head, f"{'the' if sweep.stopped else 'all'} {len(runs)} runs{so_far} produced AR's text "
                           "token for token")


def _verdict(divergences: dict[int, Divergence] | None, run: SweepRun) -> str:
    """" (a precision tie)", " (NOT a tie: a bug)", " (one output stops earlier)", or "" where not attributed."""
    found = (divergences or {}).get(run.index)
    if found is None:
        return ""
    return {"precision tie": " (a precision tie)", "bug": " (NOT a tie: a bug)"}.get(found.kind,
                                                                                  " (one output stops earlier)")


def _join(parts: list[str]) -> str:
    """'a', 'a and b', 'a, b and c'."""
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def _sentence(head: str, body: str) -> str:
    text = head + body if head else body[0].upper() + body[1:]
    return text + "."


class Attributions:
    """Each greedy run of a sweep that parted from AR, attributed as it arrives: where, and whether it is a
    precision tie or a bug (``lossless.attribute``, reading AR's own one-token steps, replayed once, at the first
    run that parts: ``len(ar_tokens)`` forwards; none while nothing parts).  The page calls ``of`` on every
    snapshot, the command line once at the end (``diagnose``).  ``path``: the forward path the sweep ran on (None:
    the eager one), on which AR's steps are replayed."""

    def __init__(self, model, prompt_ids: list[int], path: ForwardPath | None = None) -> None:
        self.model, self.prompt_ids, self.path = model, list(prompt_ids), path
        self.found: dict[int, Divergence] = {}  # by SweepRun.index
        self._seen: set[int] = set()
        self._logits = None  # AR's own logits at every step, once a run has parted

    def of(self, sweep: Sweep) -> dict[int, Divergence]:
        """The divergences of ``sweep``'s runs so far, by ``SweepRun.index`` (runs that did not part: absent)."""
        for r in sweep.runs:
            if r.first_difference is None or r.index in self._seen:
                continue
            if self._logits is None:
                _, self._logits = engine_ar_logits(self.model, self.prompt_ids, list(sweep.ar_tokens), self.path)
            want = list(sweep.ar_tokens) if r.finished else list(sweep.ar_tokens[: len(r.tokens)])
            found = attribute(self.model, self.prompt_ids, want, list(r.tokens), self._logits, self.path)
            self._seen.add(r.index)
            if found is not None:
                self.found[r.index] = found
        return dict(self.found)


def diagnose(model, prompt_ids: list[int], sweep: Sweep, path: ForwardPath | None = None) -> dict[int, Divergence]:
    """Each greedy run that parted from AR, by ``SweepRun.index`` (``Attributions`` on ``path``); empty when nothing
    parted."""
    return Attributions(model, prompt_ids, path).of(sweep)


def same_text_cell(run: SweepRun, sampling: bool = False, divergences: dict[int, Divergence] | None = None) -> str:
    """The table's "same text as AR" cell: "yes", "no: token 37", "no: token 37 (a precision tie)" (attributed in
    ``divergences``), "not compared" (sampling); "(stopped)" after a partial run's."""
    if sampling:
        cell = "not compared (sampling)"
    else:
        cell = ("yes" if run.first_difference is None
                else f"no: token {run.first_difference}{_verdict(divergences, run)}")
    return cell if run.finished else f"{cell} (stopped)"


def speedup_cell(run: SweepRun) -> str:
    """A run's speedup over AR as the table and the figure's hover say it: "1.52×", "no speedup" where its τ could
    give none (``run.NO_GAIN_TAU``: the clocks' reading is noise there), "–" when not measured."""
    if run.speedup is not None:
        return f"{run.speedup:.2f}×"
    return "no speedup" if run.cycles > 1 and run.tau < NO_GAIN_TAU else "–"


def markdown_table(sweep: Sweep, divergences: dict[int, Divergence] | None = None) -> str:
    """The sweep as a markdown table: AR's row first, then one row per run (value, τ, decode-phase tok/s, speedup,
    nodes, same text as AR: attributed where ``divergences`` has the run)."""
    rows = [f"| {sweep.spec.info.what} | τ | tok/s ({SPEEDUP_PHASE}) | speedup over AR ({SPEEDUP_PHASE}) | mean nodes "
            "| same text as AR |",
            "|---|---|---|---|---|---|"]
    if sweep.ar is not None:
        rows.append(f"| AR (reference) | 1.00 | {sweep.ar.tok_per_s:.1f} | 1.00× | 1.0 | – |")
    for r in sweep.runs:
        rows.append(f"| {r.label} | {r.tau:.2f} | {r.tok_per_s:.1f} | {speedup_cell(r)} | {r.mean_nodes:.1f} | "
                    f"{same_text_cell(r, sweep.sampling, divergences)} |")
    return "\n".join(rows) + "\n"


def to_dict(sweep: Sweep, divergences: dict[int, Divergence] | None = None) -> dict:
    """The sweep as JSON-ready data: parameter, values, base config, cost curve, AR and one row per run (no
    traces: a run's cycles are the trace files' business)."""
    divergences = divergences or {}
    ar = sweep.ar
    return {
        "parameter": sweep.spec.parameter, "values": [sweep.spec.text(v) for v in sweep.spec.values],
        "base_config": sweep.base.to_dict(),
        "cost_curve": sweep.cost_curve.to_dict() if sweep.cost_curve is not None else None,
        "ar": None if ar is None else {"tokens": len(sweep.ar_tokens), "decode_tokens": ar.tokens,
                                       "decode_seconds": ar.seconds, "tok_per_s": ar.tok_per_s},
        "runs": [{"index": r.index, "value": r.text, "label": r.label, "tau": r.tau, "tok_per_s": r.tok_per_s,
                  "speedup": r.speedup, "mean_nodes": r.mean_nodes, "tokens": len(r.tokens), "cycles": r.cycles,
                  "accepted_drafts": r.accepted_drafts, "first_difference": r.first_difference,
                  "same_as_ar": None if sweep.sampling else r.first_difference is None, "finished": r.finished,
                  "gt_threshold": r.config.gt.threshold if r.config is not None else None,
                  "divergence": divergences[r.index].to_dict() if r.index in divergences else None}
                 for r in sweep.runs],
        "stopped": sweep.stopped, "seconds": sweep.seconds, "summary": summary(sweep, divergences),
    }
