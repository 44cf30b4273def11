"""A race of decoders on one device and one clock (the page's "AR vs the chosen method").

The decoders run alternately, never at once: the one with the least engine time so far runs its next
forward.  So every lane is always seen as of (nearly) the same engine time, and each is charged only for
its own forwards (``CycleTrace.elapsed_s`` counts engine time; what the consumer does between cycles,
drawing or a slow-motion pause, is not counted).
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace

from engine.decoding.trace import CycleTrace
from engine.product.runs.run import speedup_over_ar


@dataclass
class Lane:
    """One decoder's progress.

    Attributes:
        name: the lane's name ("AR", a method's label).
        tokens: tokens committed so far.
        elapsed_s: engine seconds so far.  forwards: verification forwards so far (prefill included).
        done: no more cycles: the run finished (``finished``) or its decoder ended early (stopped).
        finished: the last cycle came (EOS, max new tokens, or a stop the decoder saw on that cycle).
        last_forward_s: engine seconds of the lane's latest forward (0 when it ended without one).
        prefill_s: engine seconds of the lane's first forward (the prefill; 0 before it).
        first_tokens: tokens that first forward gave (the decode phase is what came after).
        traces: every cycle so far, prefill first (the lane's speedup and its margin: ``run.Speedup.of``).
    """

    name: str
    tokens: list[int] = field(default_factory=list)
    elapsed_s: float = 0.0
    forwards: int = 0
    done: bool = False
    finished: bool = False
    last_forward_s: float = 0.0
    prefill_s: float = 0.0
    first_tokens: int = 0
    traces: list[CycleTrace] = field(default_factory=list)

    @property
    def tok_per_s(self) -> float:
        """Tokens per engine second."""
        return len(self.tokens) / max(self.elapsed_s, 1e-9)

    @property
    def tau(self) -> float:
        """Tokens per forward."""
        return len(self.tokens) / max(1, self.forwards)

    @property
    def decode_tokens(self) -> int:
        """Tokens after the prefill."""
        return len(self.tokens) - self.first_tokens

    @property
    def decode_s(self) -> float:
        """Engine seconds after the prefill (s)."""
        return max(0.0, self.elapsed_s - self.prefill_s)

    def snapshot(self) -> Lane:
        """This lane as it is now, its lists copied: what a screen that plays the race behind its engines shows
        later."""
        return replace(self, tokens=list(self.tokens), traces=list(self.traces))

    def advance(self, trace: CycleTrace) -> None:
        """Take one cycle's record."""
        if not self.forwards:
            self.prefill_s, self.first_tokens = trace.elapsed_s, len(trace.new_tokens)
        self.tokens += trace.new_tokens
        self.traces.append(trace)
        self.last_forward_s = trace.elapsed_s - self.elapsed_s
        self.elapsed_s, self.forwards = trace.elapsed_s, self.forwards + 1
        self.done = self.finished = trace.finished


class Race:
    """Interleaves decoders' cycle streams (``SpecDecoder.generate``) by engine time.

    Args:
        runners: lane name -> that decoder's cycle iterator, in the order the lanes are shown.
    """

    def __init__(self, runners: Mapping[str, Iterator[CycleTrace]]) -> None:
        self._runners = dict(runners)
        self.lanes = [Lane(name) for name in self._runners]

    @property
    def over(self) -> bool:
        """True when every lane is done."""
        return all(lane.done for lane in self.lanes)

    def steps(self) -> Iterator[Lane]:
        """Run one forward at a time, always of the lane with the least engine time so far, and yield that
        lane after it (also when its decoder ended with no further cycle: a stopped run)."""
        while not self.over:
            lane = min((x for x in self.lanes if not x.done), key=lambda x: x.elapsed_s)
            trace = next(self._runners[lane.name], None)
            if trace is None:
                lane.done, lane.last_forward_s = True, 0.0
            else:
                lane.advance(trace)
            yield lane

    def speedup(self) -> float | None:
        """The last lane's speedup over the first (the baseline first) so far, as every speedup is measured
        (``run.speedup_over_ar``: the decode phase, engine time); None before both decoded a token after the
        prefill."""
        base, other = self.lanes[0], self.lanes[-1]
        return speedup_over_ar(other.decode_tokens, other.decode_s, base.decode_tokens, base.decode_s)

    @property
    def clock_s(self) -> float:
        """The race's clock (engine seconds): the least engine time among the lanes still running (every lane
        has run up to it), or the longest when all are done."""
        running = [x.elapsed_s for x in self.lanes if not x.done]
        return min(running) if running else max(x.elapsed_s for x in self.lanes)


class Pacer:
    """Plays a race over about ``target_s`` seconds of wall time: the race's clock (engine time) is shown at
    a fixed scale, wall seconds per engine second, chosen so the baseline lane ends at ``target_s``.

    Args:
        target_s: wall seconds the race should last (0 = real time: no pause).
        predicted_s: the baseline lane's predicted engine seconds to the end (e.g. max new tokens × an AR step
            of the cost curve, or AR's timing on this prompt); the prediction is refined from the lane's own
            pace as it runs (``refine``).
    """

    def __init__(self, target_s: float, predicted_s: float) -> None:
        self.target_s, self.predicted_s = max(0.0, float(target_s)), max(1e-6, float(predicted_s))

    @property
    def scale(self) -> float:
        """Wall seconds per engine second (at least 1: never faster than the engines ran)."""
        return max(1.0, self.target_s / self.predicted_s)

    def refine(self, lane: Lane, max_new_tokens: int) -> None:
        """Predict the baseline's end from its own decode pace once it has decoded 8 tokens."""
        if lane.decode_tokens >= 8 and not lane.done:
            per_token = lane.decode_s / lane.decode_tokens
            self.predicted_s = lane.elapsed_s + per_token * max(0, max_new_tokens - len(lane.tokens))

    def wait_s(self, clock_s: float, wall_s: float) -> float:
        """Seconds to pause now, ``wall_s`` after the race began, so that engine time ``clock_s`` is on screen
        at its scaled wall time (0 for real time, or when the engines are behind it)."""
        if not self.target_s:
            return 0.0
        return max(0.0, clock_s * self.scale - wall_s)
