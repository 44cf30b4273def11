"""Flags out: the serving engine's configuration that reproduces the drafter of a run, or the nearest one.

A method that drafts with one source reads its source's ``serve()`` (the engines' drafters give their own flags;
goose-lens's sources the nearest engine drafter and what differs); Goose, Iso(k) and AR are named here.  The engines'
flag names and versions are in each source's module (``engine/sources/vllm_ngram.py`` and its neighbours).
"""
from __future__ import annotations

from dataclasses import replace

from ..decoding.config import SOURCES, DecodeConfig
from ..sources import Serve

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
                              f"{', '.join(cfg.sources)} drafts in one tree of up to B nodes, sized each cycle; "
                              "SGLang's NGRAM is the nearest, a tree of N nodes from a trie of earlier outputs.")
    if cfg.gt.threshold != 0:
        serve = replace(serve, differs=f"{serve.differs} {GT_WORDS}".strip())
    return serve


def serving_dict(cfg: DecodeConfig) -> dict:
    """``serving`` as JSON: engine, flags, command and what differs ("" = the engine's own drafter, as run)."""
    serve = serving(cfg)
    command = serve.command if serve.flags or serve.engine != "vLLM" else "vllm serve MODEL"
    return {"engine": serve.engine, "flags": serve.flags, "command": command, "differs": serve.differs}


def serving_text(cfg: DecodeConfig) -> str:
    """``serving`` for people: the command, then what differs (the page's "Serve this drafter" box)."""
    found = serving_dict(cfg)
    return found["command"] + (f"\n# {found['differs']}" if found["differs"] else "")
