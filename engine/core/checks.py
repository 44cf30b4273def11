"""The error a bad decoding setting raises, and the one way config dataclasses check their fields."""
from __future__ import annotations

from collections.abc import Iterable


class ConfigError(ValueError):
    """A decoding parameter is out of range; the message names the parameter and the allowed range."""


def check(rules: Iterable[tuple[bool, str]]) -> None:
    """Raise ``ConfigError`` with the message of the first rule that does not hold (``(ok, message)`` pairs)."""
    for ok, message in rules:
        if not ok:
            raise ConfigError(message)


def one_of(value, allowed: tuple, name: str) -> tuple[bool, str]:
    """The rule "``value`` is one of ``allowed``", with the message naming the setting ``name``."""
    return value in allowed, f"{name} must be one of {', '.join(allowed)} (got {value!r})"
