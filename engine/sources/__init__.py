"""Draft sources: one small protocol (``base.DraftSource``), one module per source, and the registry.

Everything that names sources (metrics, figures and their legend, explanations, the page's toggles,
the trace schema, the bench) reads ``REGISTRY`` instead of naming them, so adding a source is its
module plus one line here.
"""
from __future__ import annotations

from ..tree import SPINE_SOURCES, Source
from .base import Candidates, DraftSource, Request, Role, SourceInfo, SourceMemory, Verified

PLD = SourceInfo(Source.PLD, "PLD spine", "PLD", "#2563eb", Role.SPINE,
                 "copied from an earlier n-gram match in the prompt or the output (prompt lookup)")
TR = SourceInfo(Source.TR, "TR branch", "TR", "#f59e0b", Role.BRANCH,
                "the target's own top-K successors of a token, recycled from earlier logits (Token Recycling)")
PTD = SourceInfo(Source.PTD, "PTD perturbation", "PTD", "#10b981", Role.POOL,
                 "a candidate from the pool progressive tree drafting grows in the forward's extra rows")
SUFFIX = SourceInfo(Source.SUFFIX, "Suffix tree", "Suffix", "#db2777", Role.SPINE,
                    "the most frequent continuations of the longest suffix match, over the prompt, the output "
                    "and this visitor's earlier outputs (SuffixDecoding)")

#: Every draft source, in the order the page, the legend and the tables list them.
REGISTRY: tuple[SourceInfo, ...] = (PLD, TR, PTD, SUFFIX)
assert {i.source for i in REGISTRY if i.role is Role.SPINE} == SPINE_SOURCES, "tree.SPINE_SOURCES is stale"


def info(source: Source | str) -> SourceInfo:
    """The ``SourceInfo`` of a source or its name. Raises KeyError for an unknown one."""
    name = source.value if isinstance(source, Source) else source
    found = next((i for i in REGISTRY if i.name == name), None)
    return found if found is not None else _unknown(name)


def _unknown(name: str):
    raise KeyError(f"unknown draft source {name!r}; known: {', '.join(i.name for i in REGISTRY)}")


def make_sources(cfg, stats, memory: SourceMemory) -> tuple[DraftSource, ...]:
    """One fresh source per active source of ``cfg`` (``DecodeConfig.active_sources``), in ``REGISTRY`` order.

    Args:
        cfg: the run's ``DecodeConfig``.  stats: the run's ``AcceptanceStats`` (each source reads its
            per-depth counter there).  memory: the user's ``SourceMemory`` (what sources keep across requests).
    """
    from .pld import PldSource
    from .ptd import PtdSource
    from .suffix import SuffixSource
    from .tr import TrSource

    classes = {"pld": PldSource, "tr": TrSource, "ptd": PtdSource, "suffix": SuffixSource}
    return tuple(classes[i.name](cfg, stats, memory) for i in REGISTRY if i.name in cfg.active_sources)


__all__ = ["REGISTRY", "Candidates", "DraftSource", "Request", "Role", "SourceInfo", "SourceMemory", "Verified",
           "info", "make_sources"]
