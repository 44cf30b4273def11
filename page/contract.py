"""The contract between the page and its handlers.

* a handler's parameters are named after the page's components (``Page``); a parameter named ``settings``,
  ``drawing`` or ``session`` takes one dataclass (``PACKS``) built from the components named like its
  fields, so no handler takes more than six named parameters (``wire`` is the one adapter gradio sees);
* a handler returns (or yields, to stream) a dict keyed by component name, holding only what it sets.

Per-user data (the recorded run, the chosen model, the Stop request, an own cost curve) lives in ``gr.State``; loaded
weights are shared read-only through ``engine.product.models.registry.ModelRegistry``.
"""
from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, fields
from types import SimpleNamespace
from typing import Any

import gradio as gr

from engine.product.runs.run import ArTiming, Speedup
from engine.sources import SourceMemory
from page.policy import AR_CLOCK_ENTRIES
from page.settings import PageSettings


@dataclass(frozen=True)
class Drawing:
    """How a run is shown: GT-pruned candidates as ghosts; every node (no +N / ⋯N folding); the visitor's own cost
    curve (a spec, e.g. "past=128;1:3.8,2:4.1,…"; "" none) on which the Theory panel prices the run's drafts too; the
    window's width, for which the tree is laid out."""

    show_ghosts: bool = True
    show_all: bool = False
    price_curve: str = ""
    screen_px: float = 0  # the visitor's window width (CSS px, read once the page loads; 0 unknown): on a phone the
    # tree's title and legend are laid out for its narrow box (``viz.tree_figure.fit_to_screen``)


@dataclass(frozen=True)
class Session:
    """One visitor's handles (each a ``gr.State``): the model (``model_key``, None = the page's default), the
    Stop request (``control``, ``{"stop": bool}``: Stop sets it while a run reads it), their own re-measured
    cost curve (``curve``, None = the shared one) and what draft sources keep across their requests
    (``memory``, e.g. the suffix source's tree of earlier outputs; None = nothing kept) and AR's timings on the
    prompts they ran (``ar_clock``, ``ar_key`` -> ``engine.product.runs.run.ArTiming``: the speedup beside τ; None =
    none), with the last speedup measured on each (``measured``: a later one that differs beyond both margins
    says why)."""

    model_key: Any = None
    control: dict | None = None
    curve: Any = None
    memory: SourceMemory | None = None
    ar_clock: dict | None = None

    def ar_timing(self, key) -> ArTiming | None:
        """AR's timing for ``key`` (``ar_key``) this visitor has, or None."""
        return (self.ar_clock or {}).get(key)

    def with_ar_timing(self, key, timing: ArTiming, clock: dict | None = None) -> dict:
        """This visitor's AR timings with ``timing`` for ``key`` (the newest; the oldest dropped beyond
        ``AR_CLOCK_ENTRIES``): the new value of their ``ar_clock`` state (``clock``: that value as already
        changed in this frame)."""
        clock = dict((self.ar_clock or {}) if clock is None else clock)
        clock.pop(key, None)
        clock[key] = timing
        while len(clock) > AR_CLOCK_ENTRIES:
            clock.pop(next(iter(clock)))
        return clock

    def measured(self, key) -> tuple[str, Speedup] | None:
        """The last speedup this visitor measured on ``key`` (``ar_key``) and what measured it ("Generate", "the
        Race"), kept beside the AR timings; None: none yet."""
        return (self.ar_clock or {}).get(("speedup", key))

    def with_measured(self, key, name: str, speedup: Speedup, clock: dict | None = None) -> dict:
        """``with_ar_timing`` for the speedup ``name`` just measured on ``key`` (``measured``)."""
        return self.with_ar_timing(("speedup", key), (name, speedup), clock)

    def start(self) -> dict:
        """The Stop request of a run starting now, cleared (a fresh one when the caller has none)."""
        control = self.control if self.control is not None else {}
        control["stop"] = False
        return control


#: handler parameters filled with a dataclass of the components named like its fields
PACKS = {"settings": PageSettings, "drawing": Drawing, "session": Session}


class Page(SimpleNamespace):
    """The page's components by name; the names are the handlers' parameter names and frame keys."""

    def __getitem__(self, name: str):
        return getattr(self, name)

    def keyed(self, frame: dict | None):
        """A handler's frame (name -> value) keyed by component, as gradio takes it (nothing set: a skip)."""
        if frame is None:
            return None
        return {self[name]: value for name, value in frame.items()} or gr.skip()


@dataclass(frozen=True)
class Endpoint:
    """A handler as the page calls it: ``inputs`` are its parameters in order, each filled from the page (a name in
    ``PACKS`` with that dataclass, built from the components named like its fields; any other name with the
    component of that name); ``outputs`` names every component a frame may set; ``fixed`` holds the arguments the
    page supplies itself (e.g. the model registry); ``around`` wraps the adapter gradio calls (e.g.
    ``RunBoard.wrap``)."""

    handler: Callable
    inputs: tuple[str, ...]
    outputs: tuple[str, ...] = ()
    fixed: dict | None = None
    around: Callable | None = None

    def parameters(self) -> tuple[str, ...]:
        """The handler's parameters the page fills: those not in ``fixed`` and not keyword-only."""
        fixed = self.fixed or {}
        return tuple(p.name for p in inspect.signature(self.handler).parameters.values()
                     if p.name not in fixed and p.kind is not p.KEYWORD_ONLY)


def wire(event, endpoint: Endpoint, page: Page, **listener):
    """Connect ``endpoint``'s handler to ``event`` (e.g. ``button.click``): the one adapter between gradio and a
    handler.

    ``endpoint.inputs`` must be exactly the handler's parameters not in ``endpoint.fixed`` (keyword-only ones must
    be there): a renamed parameter fails here, when the page is built, instead of silently reading another
    component.  Gradio passes the components as keyword arguments (``inputs_kwargs``), so the API's parameter names
    are the components' names.  The handler's frames (dicts keyed by name, see ``Page.keyed``) go back keyed by
    component; ``listener`` goes to ``event`` as it is.

    Raises:
        TypeError: ``endpoint.inputs`` is not the handler's parameter list.
    """
    handler, inputs, fixed = endpoint.handler, tuple(endpoint.inputs), endpoint.fixed or {}
    params = endpoint.parameters()
    if inputs != params:
        raise TypeError(f"{handler.__name__} takes {params} from the page, but is wired with {inputs}")
    packed = {name: [f.name for f in fields(PACKS[name])] for name in inputs if name in PACKS}
    components = {field: page[field] for name in inputs for field in packed.get(name, [name])}

    def call(values: dict):
        args = {name: PACKS[name](**{f: values[f] for f in packed[name]}) if name in packed else values[name]
                for name in inputs}
        return handler(**args, **fixed)

    if inspect.isgeneratorfunction(inspect.unwrap(handler)):
        def adapter(**values):
            for frame in call(values):
                yield page.keyed(frame)
    else:
        def adapter(**values):
            return page.keyed(call(values))
    adapter.__name__ = handler.__name__  # gradio names the API endpoint's function after it
    around = endpoint.around
    return event(around(adapter) if around else adapter, inputs=None, outputs=[page[n] for n in endpoint.outputs],
                 inputs_kwargs=components, **listener)
