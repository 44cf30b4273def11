"""The one way the page, the CLIs and the bench make a decoder: resolve the config and its cost curve, then build.

``SpecDecoder`` (engine/decoding/decode.py) neither measures nor loads a cost curve and reads one resolved config;
this factory gives it both: the curve the caller chose (a visitor's own re-measured curve, one loaded with
``--cost-curve``, the page's run curve: ``CurveOwner.for_run``), else the model's shared curve, asked of its owner
(``CurveOwner.shared``: measured once per model, device, dtype and torch version, cached on disk) when the GT rule
reads one.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable

from engine.core import compat
from engine.core.forward import PROMPT_ROOM, SPECS, ForwardPath
from engine.decoding.config import DecodeConfig, Resolved
from engine.decoding.cost import CostCurve
from engine.decoding.decode import SpecDecoder
from engine.product.models.cost_cache import CurveOwner
from engine.product.models.loaded import LoadedModel

log = logging.getLogger(__name__)
#: A path's preparation is said on the console from this long (s): a ZeroGPU call's captures, a bucket compiled late
SAID_FROM_S = 0.05


def resolve(model, config: DecodeConfig, cost_curve: CostCurve | None = None,
            forward: ForwardPath | None = None) -> tuple[Resolved, CostCurve | None]:
    """``config`` resolved (``DecodeConfig.resolved``) and the cost curve it read: ``cost_curve``, else, when the GT
    rule ("auto", "chord") reads one, the model's shared curve of the forward path that runs (``forward``; default
    the eager path), asked of its owner (``CurveOwner.shared``), measured here the first time on this machine.

    Raises:
        compat.UnsupportedModelError: a model tree verification cannot serve, before any forward (the curve's too).
        ConfigError: a setting out of range.
    """
    compat.check_model(model)
    if cost_curve is None and config.needs_cost_curve:
        cost_curve = CurveOwner(model, forward).shared()
    return config.resolved(cost_curve), cost_curve


def make_decoder(model, config: DecodeConfig, eos_token_ids: Iterable[int] = (), cost_curve: CostCurve | None = None,
                 **options) -> SpecDecoder:
    """A ``SpecDecoder`` for ``config`` (``resolve``d first); ``options``: ``SpecDecoder``'s ``memory``, ``profile``
    and ``forward`` (the model's forward path, whose cost curve GT then reads).  ``decoder.resolved`` is the resolved
    config (``decoder.config`` its ``DecodeConfig``) and ``decoder.cost_curve`` the curve it read.  ``model``: a
    transformers causal LM, or a ``LoadedModel``, whose model runs on its own forward path (``LoadedModel.forward``)
    unless ``forward`` names another.  The path is prepared here, before the run's clock, for a run of max new tokens
    after a prompt of up to ``forward.PROMPT_ROOM`` tokens (``ForwardPath.prepare``: the graphed path captures); a
    preparation of ``SAID_FROM_S`` or more is one line on the console (on ZeroGPU, each GPU call's captures).

    Raises:
        compat.UnsupportedModelError, ConfigError: as ``resolve``.
    """
    if isinstance(model, LoadedModel):
        options.setdefault("forward", model.forward)
        model = model.model
    forward = options.pop("forward", None)
    config, curve = resolve(model, config, cost_curve, forward)
    if forward is not None:  # before the run's clock: the graphed path captures here (each ZeroGPU call's first)
        took = forward.prepare(config.config.max_new_tokens + PROMPT_ROOM,
                               config.config.max_budget + config.config.extra_rows)
        if took >= SAID_FROM_S:
            spec = SPECS.get(forward.name)
            log.info("forward path %s: %s before the run in %.2f s (outside its clock)", forward.name,
                     {"capture": "CUDA graphs captured", "compile": "compiled and captured"}.get(
                         spec.prepare if spec else "", "prepared"), took)
    return SpecDecoder(forward if forward is not None else model, config, eos_token_ids, cost_curve=curve, **options)
