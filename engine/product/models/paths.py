"""The one cache root: converted models, cost curves and precision choices live under it, each in its own folder."""
from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "GOOSE_LENS_CACHE"  # the cache root when set (default ~/.cache/goose-lens)


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """``cache_dir`` when given (a test's or an operator's own folder), else ``$GOOSE_LENS_CACHE``, else
    ``~/.cache/goose-lens``."""
    return Path(cache_dir or os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "goose-lens")
