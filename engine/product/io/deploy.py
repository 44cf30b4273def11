"""Flags in and out: a single-source method's own settings as text (the page's "Drafter settings" box: the engine's
own names for the engines' drafters), and the serving engine's configuration that reproduces a run's drafter, or the
nearest one.

A method that drafts with one source reads its source's ``serve()`` (the engines' drafters give their own flags;
goose-lens's sources the nearest engine drafter and what differs); Goose, Iso(k) and AR are named here.  The engines'
flag names and versions are in each source's module (``engine/sources/vllm_ngram.py`` and its neighbours).
"""
from __future__ import annotations

import re
from dataclasses import fields, replace
from typing import Any

from engine.decoding.config import SOURCES, ConfigError, DecodeConfig
from engine.sources.engines import Serve

#: What goose-lens verifies otherwise than a serving engine, said of every method with a GT rule that prunes.
GT_WORDS = ("goose-lens's GT rule may verify fewer of the drafted tokens than the engine does; set c = 0 (untick "
            "auto) to verify them all.")


def serving(cfg: DecodeConfig) -> Serve:
    """The engine configuration nearest to ``cfg``'s drafter, its ``differs`` sentence(s) included."""
    if cfg.method in SOURCES:
        serve = cfg.source_config(cfg.method).serve()
    elif cfg.method == "ar":
        return Serve("vLLM", {}, differs="Plain decoding: serve without a speculative config.")
    else:  # goose, iso3, iso5: a tree of several sources; SGLang's NGRAM is the production tree drafter
        tree = cfg.source_config("sglang-ngram").serve()
        serve = Serve("SGLang", {**tree.flags, "speculative-num-draft-tokens": cfg.tree.budget},
                      differs=f"No engine ships {'Goose' if cfg.method == 'goose' else 'Iso(k)'}: it mixes "
                              f"{', '.join(cfg.sources)} drafts in one tree of up to B = {cfg.tree.budget} nodes"
                              f"{_raised_words(cfg)}, sized each cycle; "
                              "SGLang's NGRAM is the nearest, a tree of N nodes from a trie of earlier outputs.")
    deepest = cfg.source_config("sglang-ngram").speculative_num_draft_tokens - 1  # SGLang's deepest tree
    if cfg.method == "sglang-ngram" and cfg.tree.max_depth < deepest:
        serve = replace(serve, differs=f"{serve.differs} Here every tree stops at depth D = {cfg.tree.max_depth}; "
                                       f"SGLang's reach depth {deepest}: set D >= {deepest} to verify them whole.")
    if cfg.gt.threshold != 0:
        serve = replace(serve, differs=f"{serve.differs} {GT_WORDS}".strip())
    return serve


def _raised_words(cfg: DecodeConfig) -> str:
    """How far Goose §4.3's confidence schedule may raise a cycle's budget past B (and r towards 1), or ""."""
    if cfg.max_budget == cfg.tree.budget:
        return ""
    return (f" (a cycle whose spine match is confident gets up to {cfg.max_budget - cfg.tree.budget} more, "
            f"{cfg.max_budget} at full confidence, and r raised towards 1: Goose §4.3)")


def serving_dict(cfg: DecodeConfig) -> dict:
    """``serving`` as JSON: engine, flags, command and what differs ("" = the engine's own drafter, as run)."""
    serve = serving(cfg)
    command = serve.command if serve.flags or serve.engine != "vLLM" else "vllm serve MODEL"
    return {"engine": serve.engine, "flags": serve.flags, "command": command, "differs": serve.differs}


def serving_text(cfg: DecodeConfig) -> str:
    """``serving`` for people: the command, then what differs (the page's "Serve this drafter" box)."""
    found = serving_dict(cfg)
    return found["command"] + (f"\n# {found['differs']}" if found["differs"] else "")


def drafter_text(cfg: DecodeConfig) -> str:
    """The method's own source settings as ``name=value, ...`` (field names: the engine's own for its drafters); ""
    for a method of several sources (Goose, Iso(k)) or none (AR)."""
    if cfg.method not in SOURCES:
        return ""
    own = cfg.source_config(cfg.method)
    return ", ".join(f"{f.name}={_word(getattr(own, f.name))}" for f in fields(own))


def with_drafter(cfg: DecodeConfig, text: str, ceiling: float | None = None) -> DecodeConfig:
    """``cfg`` with the method's own settings from ``text`` (``drafter_text``'s form; ``--flag-name value`` pairs
    and new lines read too; names not given keep their values, except where the engine fills a setting left out from
    another one given: the config's ``UNSET``, name left out -> name it copies).  ``ceiling``: the most any number
    may be raised to (the page's bound on a shared server; a default above it, e.g. a memory bound, may only be
    lowered).

    Raises:
        ConfigError: a name the method's drafter does not have, a value of the wrong kind, above ``ceiling``, or out
            of range (one sentence naming it).
    """
    if not (text or "").strip() or cfg.method not in SOURCES:
        return cfg
    own = cfg.source_config(cfg.method)
    known = {f.name: getattr(own, f.name) for f in fields(own)}
    changes = {}
    for item in re.split(r"[,\n]|\s(?=--)", text):
        name, _, value = item.strip().lstrip("-").replace("=", " ", 1).partition(" ")
        name = name.replace("-", "_")
        if not name:
            continue
        if name not in known:
            raise ConfigError(f"Drafter settings: {name!r} is not a setting of {cfg.method}; its settings are "
                              f"{', '.join(known)}.")
        number = _value(value.strip(), known[name], name)
        if ceiling is not None and _above(number, known[name], ceiling):
            raise ConfigError(f"Drafter settings: {name} = {_word(number)} is above this page's bound, "
                              f"{max(ceiling, known[name]) if isinstance(known[name], (int, float)) else ceiling:g}.")
        changes[name] = number
    for left_out, source in getattr(type(own), "UNSET", {}).items():
        if left_out not in changes and source in changes:
            changes[left_out] = changes[source]
    return cfg.with_(**{type(own).FLAT.get(name, name): value for name, value in changes.items()})


def _above(value: Any, default: Any, ceiling: float) -> bool:
    """A number (or a tuple's number) raised above ``ceiling`` and above its default."""
    values = value if isinstance(value, tuple) else (value,)
    top = max(default) if isinstance(default, tuple) and default else default
    return any(isinstance(v, (int, float)) and not isinstance(v, bool) and v > max(ceiling, top if isinstance(
        top, (int, float)) else ceiling) for v in values)


def _word(value: Any) -> str:
    return " ".join(map(str, value)) if isinstance(value, tuple) else str(value)


def _value(text: str, default: Any, name: str) -> Any:
    """``text`` as the kind of ``default`` (a tuple: numbers separated by spaces)."""
    try:
        if isinstance(default, bool):
            if text.lower() not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
                raise ValueError
            return text.lower() in ("true", "1", "yes", "on")
        if isinstance(default, tuple):
            return tuple(int(x) for x in text.split())
        return type(default)(text)
    except ValueError:
        raise ConfigError(f"Drafter settings: {name} must be {type(default).__name__} like {_word(default)} "
                          f"(got {text!r}).") from None
