"""The page's inputs for one run (Generate or Race) as one value, and the one place they are checked.

The range checks are ``DecodeConfig``'s (``to_config`` raises its ``ConfigError``); what a config cannot
know is checked here: an empty prompt, a value that is not a number (the API may send ``None``), and a
prompt plus new tokens beyond the model's context.  No gradio here: the page (``page/``) builds a
``PageSettings`` from its components by their names, which are these fields' names.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from engine.decoding.config import ConfigError, DecodeConfig
from engine.product.io.deploy import with_drafter
from engine.product.io.settings import SETTINGS

if TYPE_CHECKING:
    from engine.product.models.loaded import LoadedModel

_DEFAULT = DecodeConfig()
#: On the page draft sources never rest (``GtConfig.rest_after`` 0): every cycle draws what they proposed and GT's
#: ledger over it, even where GT keeps no tree (issue 73); the price is their drafting and read-back every cycle,
#: which the cycle's line states (host ms).  The command line and the bench keep the engine's default.
PAGE_REST_AFTER = 0
#: The most a drafter setting may be raised to on the page (its node budget's maximum): a visitor on a shared server
#: cannot grow a drafter's windows or depths past it, nor any memory bound past its default.
DRAFTER_CEILING = 128

#: The page's range of each number a visitor sets (its slider's minimum and maximum), and its name for people, by
#: flat name: each setting's declaration says it (``Shown.page``, ``engine.product.io.settings.SETTINGS``).  The
#: sliders are built from these; a typed value outside is brought inside by ``PageSettings.clamped``, which says so
#: in words (gradio's own check would raise a red "Error" toast while the box then shows its bound).
RANGES = {s.name: (*s.shown.page, s.shown.words) for s in SETTINGS.values() if s.shown.page is not None}


@dataclass(frozen=True)
class PageSettings:
    """What a visitor set on the page, as the components send it (sliders may send floats, the API ``None``).

    The defaults are the page's initial values (the config's own defaults where the page has the field).
    """

    prompt: str = ""
    method: str = _DEFAULT.method
    budget: Any = _DEFAULT.tree.budget  # node budget B, anchor included
    auto_r: bool = True  # adaptive spine ratio (EMA tiers); False: ``spine_ratio`` is used
    spine_ratio: Any = 0.5  # r when not adaptive
    max_depth: Any = _DEFAULT.tree.max_depth  # max depth D of the branches
    auto_c: bool = True  # GT "auto" (speedup-optimal size); False: ``gt_threshold`` is the threshold c
    gt_threshold: Any = 0.0  # c when not auto (0 = no pruning)
    max_new_tokens: Any = _DEFAULT.max_new_tokens
    bypass: bool = _DEFAULT.tree.bypass
    sources: Any = _DEFAULT.sources  # names of the sources goose / iso(k) mix
    temperature: Any = _DEFAULT.sampler.temperature  # 0 = greedy
    top_p: Any = _DEFAULT.sampler.top_p
    sample_top_k: Any = _DEFAULT.sampler.top_k  # sampling top-k (0 = off)
    seed: Any = _DEFAULT.sampler.seed
    verifier: str = _DEFAULT.sampler.verifier
    prompt_format: str = "chat"  # "chat": through the chat template when the model has one; "raw": as is
    drafter: Any = ""  # the single-source method's own settings, ``name=value, ...`` (``deploy.with_drafter``)

    def clamped(self, max_new_tokens: int | None = None) -> tuple[PageSettings, list[str]]:
        """These settings with every number brought into the page's range (``RANGES``; ``max_new_tokens`` caps
        max new tokens lower, e.g. public mode's 512), and one sentence per value that was moved, e.g. "Node
        budget B = 500 is above this page's maximum, 128: the run uses 128." (``bring_inside``: a whole-number
        setting also takes the nearest whole number).  Values that are not numbers are left
        for ``to_config`` to refuse; r and c are left as they are while adaptive / auto."""
        changes, notes = {}, []
        unused = {"spine_ratio": self.auto_r, "gt_threshold": self.auto_c}  # set aside while r / c are auto
        for name, (low, high, words) in RANGES.items():
            if unused.get(name):
                continue
            if name == "max_new_tokens" and max_new_tokens is not None:
                high = min(high, max_new_tokens)
            shown, note = bring_inside(getattr(self, name), low, high, words)
            if note:
                changes[name] = shown
                notes.append(note)
        return replace(self, **changes), notes

    def to_config(self) -> DecodeConfig:
        """The run's ``DecodeConfig``. Raises ``ConfigError`` with a message for the visitor."""
        return with_drafter(self._shared_config(), str(self.drafter or ""), ceiling=DRAFTER_CEILING)

    def _shared_config(self) -> DecodeConfig:
        """The settings every method has (the tree's shape, GT, sampling)."""
        return DecodeConfig.of(method=self.method or _DEFAULT.method, budget=_number(self.budget, "node budget B", int),
                               max_depth=_number(self.max_depth, "max depth D", int),
                               spine_ratio=None if self.auto_r else _number(self.spine_ratio, "spine ratio r", float),
                               gt_threshold="auto" if self.auto_c else _number(self.gt_threshold, "GT threshold c",
                                                                              float),
                               max_new_tokens=_number(self.max_new_tokens, "max new tokens", int),
                               bypass=bool(self.bypass), sources=tuple(self.sources or ()),
                               temperature=float(self.temperature or 0.0), top_p=float(self.top_p or 1.0),
                               sample_top_k=int(self.sample_top_k or 0), seed=int(self.seed or 0),
                               verifier=self.verifier or _DEFAULT.sampler.verifier,
                               gt_rest_after=PAGE_REST_AFTER)

    def prepare(self, lm: LoadedModel) -> tuple[list[int], DecodeConfig]:
        """(prompt token ids, config) of a run on ``lm``.

        Raises:
            ConfigError: the prompt is empty, a setting is out of range (``DecodeConfig``'s message), or the
                prompt plus the new tokens exceed the model's context (``LoadedModel.context_problem``).
        """
        if not self.prompt or not self.prompt.strip():
            raise ConfigError("The prompt is empty: type one or pick a preset.")
        config = self.to_config()
        ids = lm.encode_prompt(self.prompt, chat=self.prompt_format != "raw")
        problem = lm.context_problem(len(ids), config.max_new_tokens)
        if problem:
            raise ConfigError(problem)
        return ids, config

    def format_used(self, lm: LoadedModel) -> str:
        """'chat' or 'raw': what the prompt really goes through (a model without a chat template gets it raw)."""
        return "chat" if self.prompt_format != "raw" and lm.has_chat_template else "raw"


def bring_inside(value: Any, low: float, high: float, words: str) -> tuple[Any, str | None]:
    """``value`` brought into ``[low, high]`` (a whole number where ``low`` is an int: B = 2.5 runs as 3), and the
    sentence that says so (None: it was inside and whole, or not a number, which ``to_config`` refuses), e.g.
    "Node budget B = 500 is above this page's maximum, 128: the run uses 128." (``words``: the setting's name)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return value, None
    if number != number:  # NaN: not a number either
        return value, None
    inside = min(max(number, low), high)
    shown = type(low)(math.floor(inside + 0.5)) if isinstance(low, int) else type(low)(inside)
    if inside != number:
        why = f"is {'above' if number > high else 'below'} this page's {'maximum' if number > high else 'minimum'}, "
        why += f"{type(low)(inside):g}"
    elif shown != number:
        why = "is not a whole number"
    else:
        return value, None
    return shown, f"{words[:1].upper()}{words[1:]} = {number:g} {why}: the run uses {shown:g}."


def _number(value: Any, what: str, kind: type) -> int | float:
    """``kind(value)``; ``ConfigError`` naming ``what`` when it is not a number, or not a whole one for an int."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{what} must be a number (got {value!r})") from None
    if kind is int and not number.is_integer():
        raise ConfigError(f"{what} must be a whole number (got {value!r})")
    return kind(number)
