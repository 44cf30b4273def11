"""The forward paths, every one, and what each needs and costs: one explicit registry of facts (``SPECS``), so whoever
picks a path (the forward choice, the loader, ZeroGPU, the GPU check, the scripts) reads facts, never names or
classes.  A new path is its module in this package plus one ``PathSpec`` line here.
"""
from __future__ import annotations

from dataclasses import dataclass

from .eager import EagerPath
from .fused import FusedPath, GraphedFusedCompiledPath, GraphedFusedPath
from .graphs import GraphedCompiledPath, GraphedPath
from .llamacpp import GgmlNoFlashPath, GgmlPath, GgmlQ8CachePath
from .seam import ForwardPath
from .static import CompiledPath, StaticPath

#: What a path may need beyond torch: a CUDA device, a C++ compiler (torch.compile's CPU code), llama.cpp's library
NEEDS = ("cuda", "compiler", "llama.cpp")
#: How ``--forward auto`` treats a path: "measured" (timed at a model's first start where it can run, the fastest
#: kept), "asked" (timed only where an operator asks: compiling costs minutes, ``scripts/forward_paths.py --choose``),
#: "long" (run for long generations beside a path of the same weights, where measured cheaper: ``Longer``)
AUTO = ("measured", "asked", "long")
#: What preparing a path costs before a run: "none", "load" (a file's weights, about a second), "capture" (CUDA
#: graphs, milliseconds a bucket), "compile" (minutes a bucket the first time; inductor's cache keeps them)
PREPARE = ("none", "load", "capture", "compile")


@dataclass(frozen=True)
class PathSpec:
    """One forward path and the facts its callers decide by.

    Attributes:
        cls: the ``ForwardPath`` class (``make`` builds it; ``cls.problem`` says why it cannot run a model).
        needs: of ``NEEDS``.
        weights: what its forwards run: "torch" (the transformers model in its own dtype) or "gguf" (the model's own
            GGUF file, its weight types on llama.cpp's kernels: only ``dtype auto`` may be served so).
        auto: of ``AUTO``.
        prepare: of ``PREPARE``.
        warm: its buckets are compiled before a visitor's first cycle (``ForwardPath.cold_buckets``).
        baseline: the path every measurement is compared with and the one that serves when another cannot (eager).
    """

    cls: type[ForwardPath]
    needs: frozenset[str] = frozenset()
    weights: str = "torch"
    auto: str = "measured"
    prepare: str = "none"
    warm: bool = False
    baseline: bool = False

    def __post_init__(self) -> None:
        if not (self.needs <= set(NEEDS) and self.weights in ("torch", "gguf") and self.auto in AUTO
                and self.prepare in PREPARE):
            raise ValueError(f"a path spec out of its vocabulary: {self}")

    @property
    def name(self) -> str:
        return self.cls.name

    def problem(self, model, gguf=None) -> str | None:
        """Why this path cannot run ``model`` here (one sentence), or None."""
        return self.cls.problem(model, gguf)

    def make(self, model, gguf=None) -> ForwardPath:
        """This path for ``model`` (``gguf``: the file a "gguf" path runs).  Raises ValueError when it cannot serve."""
        return self.cls.for_model(model, gguf)


#: Every forward path by name, in the order the command line lists them.
SPECS: dict[str, PathSpec] = {spec.name: spec for spec in (
    PathSpec(EagerPath, baseline=True),
    PathSpec(StaticPath),
    PathSpec(FusedPath),
    PathSpec(CompiledPath, frozenset({"compiler"}), auto="asked", prepare="compile", warm=True),
    PathSpec(GgmlPath, frozenset({"llama.cpp"}), weights="gguf", prepare="load"),
    PathSpec(GgmlQ8CachePath, frozenset({"llama.cpp"}), weights="gguf", prepare="load"),
    PathSpec(GgmlNoFlashPath, frozenset({"llama.cpp"}), weights="gguf", auto="long", prepare="load"),
    PathSpec(GraphedPath, frozenset({"cuda"}), prepare="capture"),
    PathSpec(GraphedFusedPath, frozenset({"cuda"}), prepare="capture"),
    PathSpec(GraphedCompiledPath, frozenset({"cuda", "compiler"}), auto="asked", prepare="compile"),
    PathSpec(GraphedFusedCompiledPath, frozenset({"cuda", "compiler"}), auto="asked", prepare="compile"),
)}


def spec(name: str) -> PathSpec:
    """The path called ``name``.  Raises ValueError naming the paths there are."""
    if name not in SPECS:
        raise ValueError(f"unknown forward path {name!r}: one of {', '.join(SPECS)}")
    return SPECS[name]


def make_path(model, name: str = "eager", gguf=None) -> ForwardPath:
    """The ``ForwardPath`` called ``name`` for ``model``; ``gguf``: the file the model was converted from (a "gguf"
    path runs it).

    Raises:
        ValueError: an unknown name, or a model the path cannot serve (its sentence).
    """
    return spec(name).make(model, gguf)


def path_names() -> tuple[str, ...]:
    """Every path's name, in ``SPECS`` order."""
    return tuple(SPECS)


def baseline() -> PathSpec:
    """The path every other is measured against, which serves where another cannot (eager)."""
    return next(s for s in SPECS.values() if s.baseline)


def runs_file(name: str | None) -> bool:
    """Whether the path called ``name`` runs the model's own GGUF file (False for an unknown name or "auto")."""
    return name in SPECS and SPECS[name].weights == "gguf"
