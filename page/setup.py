"""What every run handler (Generate, Race, Sweep) does first: the visitor's Stop request, model, prompt ids and
config, and the one choice of cost curve (its owner's: ``CurveOwner``)."""
from __future__ import annotations

from dataclasses import dataclass

from engine.decoding.config import DecodeConfig
from engine.decoding.cost import CostCurve
from engine.product.models.cost_cache import RunCurve
from engine.product.models.loaded import LoadedModel
from engine.product.models.registry import ModelRegistry
from page.contract import Session
from page.settings import PageSettings


@dataclass(frozen=True)
class RunSetup:
    """One run's start: the Stop request (``control``, cleared), the visitor's model, the prompt's ids, the config,
    and the visitor's own re-measured cost curve when it belongs to this model (``own_curve``, the model's owner's
    call: ``CurveOwner.own``; None: the shared one)."""

    control: dict
    lm: LoadedModel
    ids: list[int]
    config: DecodeConfig
    own_curve: CostCurve | None

    def curve(self, needed: bool = True) -> RunCurve:
        """The run's cost curve, asked of the model's owner once per run (``CurveOwner.for_run``): ``shown``, what
        the page shows (the visitor's own, else the model's shared curve on its forward path, measured here the
        first time; None when ``needed`` is False: GT's c is a number in every run), and ``read``, what the run's GT
        rule reads (hand it to ``make_decoder``, which then asks nothing)."""
        return self.lm.curves.for_run(self.own_curve, self.config, needed)


def set_up(settings: PageSettings, session: Session, models: ModelRegistry) -> RunSetup:
    """The visitor's run, ready to start: ``session``'s Stop request cleared, its model (on the forward path a
    generation of this length runs on: ``LoadedModel.for_context``), ``settings`` checked and turned into prompt ids
    and a config.

    Raises:
        ConfigError: a setting out of range or a prompt the model cannot take (the handler shows its one sentence).
    """
    control = session.start()
    lm = models.get(session.model_key)
    ids, config = settings.prepare(lm)
    lm = lm.for_context(len(ids) + config.max_new_tokens)  # the path a generation this long runs on
    return RunSetup(control, lm, ids, config, lm.curves.own(session.curve))
