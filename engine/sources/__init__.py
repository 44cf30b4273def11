"""Draft sources: one small protocol (``base.DraftSource``), one module per source, and the registry.

A source's module declares all of it: its ``SourceInfo`` (name, which is also its nodes' tag, label, colours, role,
the method that drafts with it alone), its own settings' dataclass (``config_type``, held by
``DecodeConfig.source_configs``, with the flat names the CLI and trace files use) and the source itself.
Everything that names sources (the config's sources, methods and walk priority, metrics, figures and their legend,
explanations, the page's toggles and method menu, the trace schema, the bench) reads ``REGISTRY`` instead of naming
them, so adding a source is its module plus one line in ``SOURCE_TYPES`` here.
"""
from __future__ import annotations

from ..core.tree import Source
from .base import Candidates, DraftSource, Request, Role, Rows, SourceInfo, SourceMemory, Verified
from .llamacpp_ngram import LlamacppNgramSource
from .pld import PldSource
from .ptd import PtdSource
from .sglang_ngram import SglangNgramSource
from .suffix import SuffixSource
from .tr import TrSource
from .vllm_ngram import VllmNgramSource
from .vllm_suffix import VllmSuffixSource

#: Every draft source's class, in the order the page, the legend and the tables list them.
SOURCE_TYPES = (PldSource, TrSource, PtdSource, SuffixSource,
                VllmNgramSource, VllmSuffixSource, SglangNgramSource, LlamacppNgramSource)  # the engines' drafters
#: What the page, figures and tables know of each (``SourceInfo``), same order.
REGISTRY: tuple[SourceInfo, ...] = tuple(t.info for t in SOURCE_TYPES)


def info(source: Source | str) -> SourceInfo:
    """The ``SourceInfo`` of a source or its name. Raises KeyError for an unknown one."""
    name = source.value if isinstance(source, Source) else source
    for i in REGISTRY:
        if i.name == name:
            return i
    raise KeyError(f"unknown draft source {name!r}; known: {', '.join(i.name for i in REGISTRY)}")


def tags() -> tuple[Source, ...]:
    """Every declared node tag: the anchor's, the sources' in ``REGISTRY`` order, then the others (ride-along rows)."""
    first = (Source.ROOT, *(i.source for i in REGISTRY))
    return first + tuple(t for t in Source.declared() if t not in first)


def make_sources(cfg, stats, memory: SourceMemory) -> tuple[DraftSource, ...]:
    """One fresh source per active source of ``cfg`` (``DecodeConfig.active_sources``), in ``REGISTRY`` order.

    Args:
        cfg: the run's ``DecodeConfig``.  stats: the run's ``AcceptanceStats`` (each source reads its
            per-depth counter there).  memory: the user's ``SourceMemory`` (what sources keep across requests).
    """
    return tuple(t(cfg, stats, memory) for t in SOURCE_TYPES if t.info.name in cfg.active_sources)


__all__ = ["REGISTRY", "SOURCE_TYPES", "Candidates", "DraftSource", "Request", "Role", "Rows", "SourceInfo",
           "SourceMemory", "Verified", "info", "make_sources", "tags"]
