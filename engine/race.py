"""A race of decoders on one device and one clock (the page's "AR vs the chosen method").

The decoders run alternately, never at once: the one with the least engine time so far runs its next
forward.  So every lane is always seen as of (nearly) the same engine time, and each is charged only for
its own forwards (``CycleTrace.elapsed_s`` counts engine time; what the consumer does between cycles,
drawing or a slow-motion pause, is not counted).
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from .trace import CycleTrace


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
    """

    name: str
    tokens: list[int] = field(default_factory=list)
    elapsed_s: float = 0.0
    forwards: int = 0
    done: bool = False
    finished: bool = False
    last_forward_s: float = 0.0

    @property
    def tok_per_s(self) -> float:
        """Tokens per engine second."""
        return len(self.tokens) / max(self.elapsed_s, 1e-9)

    @property
    def tau(self) -> float:
        """Tokens per forward."""
        return len(self.tokens) / max(1, self.forwards)

    def advance(self, trace: CycleTrace) -> None:
        """Take one cycle's record."""
        self.tokens += trace.new_tokens
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

    def speedup(self) -> float:
        """Engine time of the first lane over that of the last (the baseline first)."""
        return self.lanes[0].elapsed_s / max(self.lanes[-1].elapsed_s, 1e-9)
