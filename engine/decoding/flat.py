"""Flat names: every setting of a nested, frozen config reached by one name, found by reflection.

A config of dataclasses (top-level fields, groups that are dataclasses, and one tuple of per-source dataclasses) has
one flat name per setting: a group's or an item's field is named by its class's ``FLAT`` map, else by its own name.
``engine.decoding.config.DecodeConfig`` speaks them (``of``, ``with_``, ``get``, ``to_dict``, ``from_dict``): the CLI
flag's dest, the trace file's key.  This module knows no particular config.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields, replace
from typing import Any

#: Where a setting lives: (field,), (group, field) or (tuple field, index, field).
Path = tuple


def paths(config_type: type, top: Sequence[str], groups: Sequence[str], items: str,
          item_types: Sequence[type]) -> dict[str, Path]:
    """Every flat name of ``config_type`` and where it lives, in order: the ``top`` fields, each group's fields (the
    group's class ``FLAT`` renames them), then the fields of each item of tuple field ``items`` (``item_types[i]``'s
    ``FLAT`` too).  Raises AssertionError when two settings would share a flat name."""
    defaults = {f.name: f.default for f in fields(config_type)}
    named = [(name, (name,)) for name in top]
    for group in groups:
        kind = type(defaults[group])
        named += [(kind.FLAT.get(g.name, g.name), (group, g.name)) for g in fields(kind)]
    for i, kind in enumerate(item_types):
        named += [(kind.FLAT.get(g.name, g.name), (items, i, g.name)) for g in fields(kind)]
    assert len({name for name, _ in named}) == len(named), "two settings share a flat name"
    return dict(named)


def read(config: Any, path: Path) -> Any:
    """The value at ``path`` in ``config``."""
    value = config
    for step in path:
        value = value[step] if isinstance(step, int) else getattr(value, step)
    return value


def apply(config: Any, flat: dict[str, Path], settings: dict[str, Any]) -> Any:
    """``config`` with ``settings`` changed: a top-level field by its own name (whole: a group's dataclass too), or a
    setting by its flat name (``flat``); a group's flat settings apply on top of the group given whole in the same
    call.  Every name must be a top-level field or in ``flat`` (KeyError otherwise); values are checked where the
    dataclasses check them."""
    own = {f.name for f in fields(config)}
    top: dict[str, Any] = {}
    groups: dict[str, dict] = {}
    items: dict[str, dict[int, dict]] = {}
    for name, value in settings.items():
        if name in own:
            top[name] = value
        elif len(flat[name]) == 2:
            groups.setdefault(flat[name][0], {})[flat[name][1]] = value
        else:
            field, index, inner = flat[name]
            items.setdefault(field, {}).setdefault(index, {})[inner] = value
    for group, changes in groups.items():  # on top of a group given whole (``variant="authors"``)
        top[group] = replace(top.get(group, getattr(config, group)), **changes)
    for field, by_index in items.items():
        current = top.get(field, getattr(config, field))
        top[field] = tuple(replace(c, **by_index[i]) if i in by_index else c for i, c in enumerate(current))
    return replace(config, **top) if top else config
