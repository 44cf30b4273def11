"""What a sweep may vary and the values it runs, read from text (``SweepSpec.parse``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.decoding.config import SOURCES, ConfigError, DecodeConfig, parse_gt_threshold
from engine.product.io.settings import SETTINGS
from engine.sources import REGISTRY

#: Most values one sweep runs: each is a whole generation, so a long list is a long wait on a page.
MAX_VALUES = 12


@dataclass(frozen=True)
class Parameter:
    """A sweepable ``DecodeConfig`` setting.

    Attributes:
        field: the setting's flat name (``config.FLAT_NAMES``: ``DecodeConfig.with_`` / ``get`` take it).
        symbol: how labels name it ("B" in "B = 16"); "" = the value alone labels a run ("goose", "pld+tr").
        what: its name for people, for axis titles ("node budget B").
        kind: how a value's text is read: "int", "ratio" (a number or auto), "threshold" (a number, auto or
            chord), "method" (a name) or "sources" (names joined by "+").
    """

    field: str
    symbol: str
    what: str
    kind: str


#: What a sweep may vary, by the setting's flat name: the settings declared sweepable (``Shown.sweep``,
#: ``engine.product.io.settings.SETTINGS``), those with a paper's symbol (B, r, D, c) first.
PARAMETERS: dict[str, Parameter] = {
    s.name: Parameter(s.name, s.shown.symbol, s.shown.words, s.shown.sweep)
    for s in sorted(SETTINGS.values(), key=lambda s: not s.shown.symbol) if s.shown.sweep is not None}
#: Other spellings people use for them: earlier names (the page's ``depth``) and the symbols.
ALIASES = {"depth": "max_depth", "b": "budget", "r": "spine_ratio", "d": "max_depth", "c": "gt_threshold"}

_KIND_WORDS = {"int": "whole numbers", "ratio": "numbers or auto", "threshold": "numbers, auto or chord"}
#: methods that mix ``DecodeConfig.sources``; the single-source methods and AR ignore the field
_MIXING = ("goose", "iso3", "iso5")


@dataclass(frozen=True)
class SweepSpec:
    """One parameter and the values a sweep runs, in order.

    Attributes:
        parameter: the setting's flat name (a key of ``PARAMETERS``).
        values: its values as the config takes them (int B / D; float r, None = adaptive; float c, "auto",
            "chord"; method name; tuple of source names in ``config.SOURCES`` order), each once.
    """

    parameter: str
    values: tuple[Any, ...]

    @classmethod
    def parse(cls, param: str, text: str) -> SweepSpec:
        """The spec of a parameter name (``PARAMETERS`` or ``ALIASES``; case, "-" and "_" alike) and a
        comma-separated list of values ("4,8,16", "0.3,auto", "goose,pld", "pld+tr,pld+tr+ptd").

        Raises:
            ConfigError: one sentence: an unknown parameter, no value, more than ``MAX_VALUES``, a value that
                does not read (not a number, an unknown source), one out of range (``DecodeConfig``'s own
                message), or one given twice.
        """
        key = param.strip().lower().replace("-", "_")
        name = ALIASES.get(key, key)
        if name not in PARAMETERS:
            raise ConfigError(f"cannot sweep {param.strip()!r}: choose one of {', '.join(PARAMETERS)}")
        items = [item.strip() for item in text.split(",") if item.strip()]
        if not items:
            raise ConfigError(f"no values to sweep {name} over: give a comma-separated list, e.g. "
                              f"{_EXAMPLES[PARAMETERS[name].kind]}")
        if len(items) > MAX_VALUES:
            raise ConfigError(f"{len(items)} values are more than a sweep runs ({MAX_VALUES}): each value is a "
                              "whole generation, so split the list")
        values = [_read(PARAMETERS[name], item) for item in items]
        for value in values:
            DecodeConfig().with_(**{name: value})  # the config's own range check and message
        spec = cls(name, tuple(values))
        seen: dict[Any, str] = {}
        for item, value in zip(items, values):
            if value in seen:
                same = "" if seen[value] == item else f" ({seen[value]!r} and {item!r} are the same value)"
                raise ConfigError(f"{name} lists {spec.text(value)} twice{same}: give each value once")
            seen[value] = item
        return spec

    @property
    def info(self) -> Parameter:
        """The swept parameter's ``Parameter`` (symbol, name for people, kind)."""
        return PARAMETERS[self.parameter]

    def text(self, value: Any) -> str:
        """A value as a sweep's list writes it: "16", "0.5", "auto" (r = None), "chord", "goose", "pld+tr"."""
        if value is None:
            return "auto"
        if isinstance(value, tuple):
            return "+".join(value) or "none"
        if isinstance(value, float):
            short = f"{value:g}"
            return short if float(short) == value else repr(value)  # short where exact: 0.123456789 stays whole
        return str(value)

    def label(self, value: Any) -> str:
        """A run's name for people: "B = 16", "r = auto", "c = 0.1"; a method or source set is its own name."""
        symbol = self.info.symbol
        return f"{symbol} = {self.text(value)}" if symbol else self.text(value)

    def configs(self, base: DecodeConfig) -> list[DecodeConfig]:
        """``base`` with the parameter set to each value, in order.

        Raises:
            ConfigError: a value out of range with ``base`` (``DecodeConfig``'s message), or a source sweep
                on a method that ignores its sources (pld, tr, ptd, suffix, ar).
        """
        if self.parameter == "sources" and base.method not in _MIXING:
            raise ConfigError(f"method {base.method} drafts with its own source only, so a sweep of the sources "
                              f"would run it {len(self.values)} times alike: use {', '.join(_MIXING)}")
        return [base.with_(**{self.parameter: value}) for value in self.values]

    def needs_cost_curve(self, base: DecodeConfig) -> bool:
        """True when some run reads a cost curve (GT threshold "auto" or "chord")."""
        return any(c.needs_cost_curve for c in self.configs(base))


_EXAMPLES = {"int": "4,8,16,32", "ratio": "0.3,0.5,auto", "threshold": "0,0.1,auto,chord",
             "method": "goose,pld,tr", "sources": "pld+tr,pld+tr+ptd"}


def _read(param: Parameter, item: str) -> Any:
    """One value's text as ``param``'s field takes it; ``ConfigError`` when it does not read."""
    word = item.lower()
    try:
        if param.kind == "int":
            return int(item)
        if param.kind == "ratio":
            return None if word == "auto" else float(item)
        if param.kind == "threshold":
            return parse_gt_threshold(item)
    except ValueError:
        raise ConfigError(f"{param.field} values must be {_KIND_WORDS[param.kind]} (got {item!r})") from None
    if param.kind == "method":
        return word
    names = [name.strip() for name in word.split("+") if name.strip()]
    known = [i.name for i in REGISTRY]
    unknown = [name for name in names if name not in known]
    if unknown or not names:
        raise ConfigError(f"{item!r} is not a set of draft sources: join names among {', '.join(known)} with '+', "
                          "e.g. pld+tr")
    return tuple(s for s in SOURCES if s in names)
