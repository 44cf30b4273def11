"""The forward paths, every one: ``make_path`` by name and ``path_names``, read from ``forward.REGISTRY`` after
importing each module that enters a path (eager, static, compiled in ``forward``; graphed in ``graphs``; llamacpp in
``ggml``), so whoever picks a path sees them all."""
from __future__ import annotations

from . import ggml, graphs  # noqa: F401 - their paths enter the registry on import
from .forward import REGISTRY, ForwardPath


def make_path(model, name: str = "eager", gguf=None) -> ForwardPath:
    """The ``ForwardPath`` called ``name`` (a ``REGISTRY`` entry: "eager", "static", "compiled", "graphed",
    "llamacpp") for ``model``; ``gguf``: the file the model was converted from (the llamacpp path runs it).

    Raises:
        ValueError: an unknown name, or a model the path cannot serve (its sentence).
    """
    if name not in REGISTRY:
        raise ValueError(f"unknown forward path {name!r}: one of {', '.join(REGISTRY)}")
    return REGISTRY[name].for_model(model, gguf)


def path_names() -> tuple[str, ...]:
    """Every registered path's name, in registration order (``REGISTRY``, whole)."""
    return tuple(REGISTRY)
