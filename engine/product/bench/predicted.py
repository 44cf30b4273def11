"""Predicted decode-phase speedup: every cycle of a run priced on one fixed cost curve, a deterministic A/B of tree
policies where a 2-core machine's clock drifts more than the policies differ.

predicted speedup = Σ tokens / Σ T(rows) × T(1) over a run's decoding cycles (the prefill apart), T the "truth" curve
(ms per forward of n rows); per prompt, then the median over a set's prompts.  In fp32 every method decodes AR's
text, so the comparison is of trees alone.  The oracle prices each cycle as if the size choice had known its outcome
(``oracle_ms``): run on a wide unpruned tree it bounds what any size choice over those trees can reach on that
curve.  ``scripts/predicted_speed.py`` is its command line; ``aggregate.run_limit`` is the bench's coarser
τ·T(1)/T(n̄) of a timed run.
"""
from __future__ import annotations

import statistics
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from engine.decoding.config import DecodeConfig
from engine.decoding.cost import CostCurve
from engine.decoding.trace import CycleTrace
from engine.product.bench.methods import method_config
from engine.product.bench.prompts import DATASETS, DEFAULT_DATA, encode, load_prompts
from engine.product.runs.decoder import make_decoder


@dataclass(frozen=True)
class Pricing:
    """How runs are priced: every forward on ``truth``; the size choice reads ``curve`` (None: the truth);
    ``oracle``: each cycle at its accepted path alone (``oracle_ms``)."""

    truth: CostCurve
    curve: CostCurve | None = None
    oracle: bool = False

    @property
    def read(self) -> CostCurve:
        """The curve the size choice reads."""
        return self.curve if self.curve is not None else self.truth


@dataclass(frozen=True)
class Predicted:
    """One method on one set: the median predicted speedup over its prompts and the mean decode τ."""

    dataset: str
    method: str
    speedup: float
    tau: float


def predicted_speedup(cycles: Sequence[CycleTrace], pricing: Pricing) -> float:
    """Σ tokens / Σ T(rows) × T(1) over ``cycles`` (decoding cycles: the prefill's trace left out).

    Raises:
        ValueError: no cycle to price.
    """
    if not cycles:
        raise ValueError("no decoding cycle to price")
    truth = pricing.truth
    tokens = sum(len(c.new_tokens) for c in cycles)
    ms = sum(oracle_ms(truth, c) if pricing.oracle else truth.latency(c.forward_rows) for c in cycles)
    return tokens / ms * truth.latency(1)


def oracle_ms(truth: CostCurve, cycle: CycleTrace) -> float:
    """A cycle's verification time had the size choice known its outcome (ms): its accepted path alone, or as many
    AR steps as it committed tokens, whichever costs less."""
    rows = len(cycle.accepted) + 1
    return min(truth.latency(rows), rows * truth.latency(1))


def held_out_prompts(lm, datasets: Sequence[str], start: int, limit: int,
                     max_new_tokens: int) -> dict[str, list[list[int]]]:
    """Dataset -> the token ids of its prompts ``start`` .. ``start + limit - 1``, encoded as the bench encodes them
    (``start`` 10 keeps clear of the bench's prompts 0-9)."""
    return {dataset: [encode(lm, t, DATASETS[dataset][2], max_new_tokens)
                      for t in load_prompts(DEFAULT_DATA, dataset, start + limit)[start:]]
            for dataset in datasets}


def predict(lm, methods: Sequence[str], prompts: dict[str, list[list[int]]], pricing: Pricing,
            max_new_tokens: int) -> Iterator[Predicted]:
    """Each method (``cli.bench``'s names and variants) on each set's ``prompts``, priced (``predicted_speedup``),
    set by set as they finish."""
    for dataset, ids_list in prompts.items():
        for method in methods:
            config = DecodeConfig.of(**method_config(method), max_new_tokens=max_new_tokens)
            speedups, taus = [], []
            for ids in ids_list:
                cycles = list(make_decoder(lm, config, lm.eos_token_ids, cost_curve=pricing.read).generate(ids))[1:]
                speedups.append(predicted_speedup(cycles, pricing))
                taus.append(sum(len(c.new_tokens) for c in cycles) / len(cycles))
            yield Predicted(dataset, method, statistics.median(speedups), statistics.fmean(taus))
