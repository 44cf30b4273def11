"""What a sweep holds: each run against AR (``SweepRun``) and the sweep so far (``Sweep``), frozen."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.decoding.config import DecodeConfig
from engine.decoding.cost import CostCurve
from engine.decoding.trace import CycleTrace
from engine.product.runs.run import ArTiming
from engine.product.runs.sweep.spec import SweepSpec


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
