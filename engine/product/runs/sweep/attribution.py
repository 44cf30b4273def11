"""Each greedy run of a sweep that parted from AR, attributed as a precision tie or a bug."""
from __future__ import annotations

from engine.core.forward import ForwardPath
from engine.product.runs.lossless import Divergence, attribute, engine_ar_logits
from engine.product.runs.sweep.records import Sweep


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
