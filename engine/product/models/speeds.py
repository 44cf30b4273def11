"""What Generate's last runs on this server measured, per model: tokens/s, τ and the speedup over AR, so a page can
set one model's speed beside another's (the page's "ways to see trees": the exact mode's 2.01× at 14 tokens/s beside
the default model's 1.05× at 30).  Numbers only: no prompt, text or visitor is kept."""
from __future__ import annotations

import statistics
import threading
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class RunSpeed:
    """One finished run's speed: ``tok_per_s`` end to end (tokens/s, the page's big number), ``tau`` (tokens per
    forward) and ``speedup`` over AR (×; None: not measured)."""

    tok_per_s: float
    tau: float
    speedup: float | None = None


class RecentSpeeds:
    """The last ``KEPT`` runs' speeds of each model (by ``ModelRegistry.key_of``, with the words that name it),
    shared by the page's visitors."""

    KEPT = 5  # a median over five runs: one odd prompt does not set a model's figure

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[tuple, tuple[str, deque[RunSpeed]]] = {}

    def add(self, key: tuple, name: str, speed: RunSpeed) -> None:
        """Keep ``speed`` as the newest run of model ``key`` (``name``: the model in words, e.g. "SmolLM2-135M-Instruct
        (135M, fp32, CPU)")."""
        with self._lock:
            runs = self._runs.get(tuple(key), (name, deque(maxlen=self.KEPT)))[1]
            runs.append(speed)
            self._runs[tuple(key)] = (name, runs)

    def typical(self) -> list[tuple[str, RunSpeed, int]]:
        """Each model's median run (each figure's median over its kept runs; the speedup's over the runs that
        measured one), with its name and how many runs it is of, in the order the models first ran."""
        with self._lock:
            kept = [(name, list(runs)) for name, runs in self._runs.values()]
        return [(name, _median(runs), len(runs)) for name, runs in kept]


def _median(runs: list[RunSpeed]) -> RunSpeed:
    """Each figure's median over ``runs`` (the speedup's over those that measured one)."""
    measured = [r.speedup for r in runs if r.speedup is not None]
    return RunSpeed(statistics.median(r.tok_per_s for r in runs), statistics.median(r.tau for r in runs),
                    statistics.median(measured) if measured else None)
