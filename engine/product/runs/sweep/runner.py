"""A sweep's runs: AR timed first and again after the runs, then each value of the swept parameter."""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from engine.decoding.config import DecodeConfig
from engine.decoding.cost import CostCurve
from engine.decoding.trace import CycleTrace
from engine.product.runs.decoder import make_decoder
from engine.product.runs.lossless import first_difference
from engine.product.runs.metrics import summarize
from engine.product.runs.run import ArTiming, Speedup, decode_phase
from engine.product.runs.sweep.records import Sweep, SweepRun
from engine.product.runs.sweep.spec import SweepSpec


def run_sweep(lm, prompt_ids: list[int], base_config: DecodeConfig, spec: SweepSpec, cost_curve: CostCurve | None,
              should_stop: Callable[[], bool] | None = None) -> Iterator[Sweep]:
    """Time AR on the prompt, then decode it once per value, then time AR again (the reference: the faster timing,
    ``_ar_again``); yield the ``Sweep`` after AR and after each run (the last one after AR's second timing).

    Every run is made comparable with the others: each gets the same ``cost_curve`` object (GT "auto" sizes
    trees from it and "chord" reads its c from it, so one curve per run would make a curve's noise look like
    the parameter's effect; resolve it once, e.g. ``CurveOwner.shared``; None: the first run that needs
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
